package clientip

import (
	"bytes"
	"net/netip"
)

// DefaultMaxHops is how many X-Forwarded-For elements are examined at most when
// Config.MaxHops is zero.
const DefaultMaxHops = 64

// ParseXFF finds the client in X-Forwarded-For values by the rightmost-untrusted rule.
// values are the header's lines in the order received; they are read as one list, as
// if joined by commas. The walk starts at the rightmost element (written by the
// immediate peer, which the caller has found trusted) and goes left, one element per
// proxy:
//
//   - the first element that is not trusted is the client: the trusted proxy to its
//     right saw a connection from it, and nothing further left can be verified;
//   - an element that does not parse (empty, "unknown", garbage) ends the walk: a
//     trusted proxy wrote it, so its client is unknown, and whatever lies to its left
//     came from that unknown client;
//   - at most maxHops elements are examined (DefaultMaxHops when maxHops <= 0).
//
// When the walk ends without an untrusted element (the list ran out, a bad element,
// the hop limit), the answer is the leftmost good element examined: an address that
// a trusted proxy reported and that is itself a trusted proxy, the farthest we can
// vouch for. ok is false when not even the rightmost element is good; the caller then
// keeps the peer's address.
//
// trusted reports whether an address is a trusted proxy; nil trusts none, so the
// rightmost element is the answer. Element forms are those of ParseAddr. ParseXFF
// does not allocate, and reads only the elements it examines.
func ParseXFF(values [][]byte, trusted func(netip.Addr) bool, maxHops int) (addr netip.Addr, ok bool) {
	if maxHops <= 0 {
		maxHops = DefaultMaxHops
	}
	var last netip.Addr
	hops := 0
	for i := len(values) - 1; i >= 0; i-- {
		v := values[i]
		for {
			if hops == maxHops {
				return last, last.IsValid()
			}
			hops++
			start := bytes.LastIndexByte(v, ',') + 1
			a, good := ParseAddr(v[start:])
			if !good {
				return last, last.IsValid()
			}
			if trusted == nil || !trusted(a) {
				return a, true
			}
			last = a
			if start == 0 {
				break
			}
			v = v[:start-1]
		}
	}
	return last, last.IsValid()
}
