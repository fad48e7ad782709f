// Package clientip finds the real client address of a connection and of each
// request: from the packet (the L4 tunnel keeps the client's source), from a PROXY
// protocol header sent by a trusted load balancer, or from an HTTP header sent by a
// trusted proxy such as a CDN edge. The answer and how it was found (a Source) feed
// routing, blacklists, logs and the X-Forwarded-For/X-Real-IP headers sent to
// backends.
//
// # Trust
//
// Nothing a peer says about itself is believed unless the peer is in a configured
// set of CIDRs, compiled into sorted range tables (a lookup is a binary search):
//
//   - ProxyTrusted peers may, and on a ProxyProtocol listener must, open each
//     connection with a PROXY header (version 1 or 2); any other peer is refused at
//     accept. The header's source then replaces the packet source as the peer.
//   - TrustedProxies are the peers whose Header is read. A request whose peer is
//     elsewhere keeps the peer as its client, whatever headers it carries.
//
// # X-Forwarded-For
//
// Each proxy appends the address it received the request from, so the list reads
// right to left: the rightmost element comes from the trusted peer, and every
// element left of an untrusted one may be forged. ParseXFF walks from the right,
// skips trusted proxies and takes the first untrusted address ("rightmost
// untrusted"). Two choices matter for safety:
//
//   - An element that does not parse ("unknown", empty, garbage) ends the walk, and
//     nothing to its left is believed: a trusted proxy wrote it, meaning it did not
//     know its client, so the left part came from an unknown party.
//   - At most MaxHops elements are examined (64 by default), so a header of
//     hundreds of hops costs no more than 64.
//
// When the walk ends without meeting an untrusted address, the leftmost address it
// examined is the answer: it was reported by a trusted proxy and is the farthest
// point of the path that can be vouched for. When not even the rightmost element
// parses, the peer is the answer.
//
// A single-value header (X-Real-IP, True-Client-IP, CF-Connecting-IP) is believed
// when the trusted peer sent exactly one line holding one address.
//
// # Wiring into l7
//
// A listener whose Config has ProxyProtocol wraps its TCP listener with NewListener;
// the connections it returns report the PROXY source as RemoteAddr, which l7 puts in
// ConnInfo.Remote. Per request, a Decider asks FromHeaders:
//
//	client, src := r.FromHeaders(req.Conn.Remote.Addr(), peerSource, req.Header.PeekAll)
//	d := l7.Decision{ClientIP: client, TrustedPeer: r.Trusted(req.Conn.Remote.Addr())}
//
// where peerSource is SourceProxy on a ProxyProtocol listener (ConnPeer tells
// exactly, given the connection).
package clientip
