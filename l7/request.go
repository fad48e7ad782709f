package l7

import (
	"crypto/tls"
	"net/netip"

	"github.com/valyala/fasthttp"
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
}

// ConnInfo describes the connection a request arrived on.
type ConnInfo struct {
	// Listener is the listener's name.
	Listener string
	// Proto is ProtoHTTP1, ProtoHTTP2 or ProtoHTTP3.
	Proto string
	// Remote is the source of the client's packets (after the tunnel, the real
	// client or the CDN edge in front of it). IPv4 addresses are unmapped.
	Remote netip.AddrPort
	// TLS is the connection's TLS state. Shared by every request on the connection:
	// read only.
	TLS *tls.ConnectionState
}

// Decision is what to do with a request. The zero Decision proxies the request to its
// listener's pool on behalf of the packet source.
type Decision struct {
	// Pool is the backend pool to proxy to. Empty means the listener's Pool.
	Pool string

	// Status, when not zero, answers the request at once with this status (403 for a
	// blacklisted client, 429 when rate-limited, …) instead of proxying it.
	Status int

	// Close closes the connection after the answer (HTTP/1.1: Connection: close;
	// HTTP/2: GOAWAY). HTTP/3 connections are not closed.
	Close bool

	// ClientIP is the client the request is made for, sent to the backend in
	// X-Real-IP and X-Forwarded-For. The zero value means the packet source.
	ClientIP netip.Addr

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
