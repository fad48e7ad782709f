package l7

import (
	"crypto/tls"
	"net/netip"

	"github.com/valyala/fasthttp"

	"github.com/tiergate/tiergate/policy/clientip"
)

// Protocol names, the values of ConnInfo.Proto.
const (
	ProtoHTTP1 = "HTTP/1.1"
	ProtoHTTP2 = "HTTP/2"
	ProtoHTTP3 = "HTTP/3"
)

// Request is a request as the one handler sees it, whatever protocol it came over:
// HTTP/1.1 requests are fasthttp's own; HTTP/2 and HTTP/3 requests are converted.
// The Request and everything it points to are valid only during the call they are
// passed to.
type Request struct {
	*fasthttp.Request
	Conn ConnInfo

	body  *clientBody // the client's body, when it is forwarded as it arrives
	chunk *chunk      // HTTP/2, HTTP/3: the request's copy buffer, if it has one
}

// ConnInfo describes the connection a request arrived on.
type ConnInfo struct {
	// Listener is the listener's name.
	Listener string
	// Proto is ProtoHTTP1, ProtoHTTP2 or ProtoHTTP3.
	Proto string
	// Remote is the connection's peer: the source of the client's packets (after
	// the tunnel, the real client or the CDN edge in front of it), or, on a listener
	// whose WrapListener reads PROXY headers, the source the header names. IPv4
	// addresses are unmapped.
	Remote netip.AddrPort
	// Source is how Remote was found: clientip.SourcePacket, or
	// clientip.SourceProxy when a PROXY header named it.
	Source clientip.Source
	// TLS is the connection's TLS state. Shared by every request on the connection:
	// read only.
	TLS *tls.ConnectionState
}

// Decision is what to do with a request. The zero Decision routes the request on
// behalf of the connection's peer (ConnInfo.Remote).
type Decision struct {
	// Pool, when set, proxies the request to this pool of the routing policy instead
	// of doing what its route says: in the simple form with the pool's Timeout and
	// retries; otherwise with the matched route's timeout and retries when it
	// proxies, else route.DefaultTimeout and no retry. It is counted under the
	// pool's name. Default: the route decides.
	Pool string

	// Status, when not zero, answers the request at once with this status (403 for a
	// blacklisted client, …) instead of routing it.
	Status int

	// Close closes the connection after the answer (HTTP/1.1: Connection: close;
	// HTTP/2: GOAWAY). HTTP/3 connections are not closed.
	Close bool

	// Drop answers nothing: an HTTP/1.1 connection is closed at once; on HTTP/2 and
	// HTTP/3 the request's stream is reset and the connection's other requests,
	// which may be other clients' behind the same proxy, go on. It is counted with
	// code "closed" in tiergate_http_requests_total.
	Drop bool

	// ClientIP is the client the request is made for: it is what routes hash and
	// rate-limit on, and is sent to the backend in X-Real-IP and X-Forwarded-For.
	// The zero value means the connection's peer, ConnInfo.Remote.
	ClientIP netip.Addr

	// ClientSource says how ClientIP was found (clientip.SourceHeader when a trusted
	// proxy's header named it), for logs. With a zero ClientIP it is ConnInfo.Source.
	ClientSource clientip.Source

	// TrustedPeer says the packet source is a proxy we trust (a CDN edge, a load
	// balancer) whose X-Forwarded-For is kept: the source is appended to it, as each
	// proxy on the way does. Otherwise X-Forwarded-For is replaced by ClientIP alone,
	// since a client can put anything there.
	TrustedPeer bool
}

// Decider takes the decision for a request. It is called once per request, from many
// goroutines at once; it must not keep the Request.
type Decider interface {
	Decide(*Request) Decision
}

// DeciderFunc adapts a function to a Decider.
type DeciderFunc func(*Request) Decision

// Decide calls f(r).
func (f DeciderFunc) Decide(r *Request) Decision { return f(r) }

var _ Decider = DeciderFunc(nil)
