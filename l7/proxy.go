package l7

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/tiergate/tiergate/policy/route"
)

// upstream is the client of one pool member: a fasthttp.HostClient keeping
// connections alive to it, and the pool's error counters. It is shared by the
// snapshots whose routing keeps the member with the same settings.
type upstream struct {
	key            memberKey
	connectTimeout time.Duration
	maxConns       int
	hc             *fasthttp.HostClient

	errConnect, errTimeout, errBusy, errOther prometheus.Counter
}

// memberKey names a pool member across routing tables.
type memberKey struct{ pool, addr string }

// upstreams maps the members of a routing table to their clients.
type upstreams struct {
	byMember map[*route.Member]*upstream
	byKey    map[memberKey]*upstream
}

// newUpstreams makes the clients of t's members, taking over old's clients of
// members whose pool, address, connect timeout and connection bound are unchanged.
func newUpstreams(t *route.Table, m *metrics, old *upstreams) *upstreams {
	bs := &upstreams{byMember: map[*route.Member]*upstream{}, byKey: map[memberKey]*upstream{}}
	for _, p := range t.Pools() {
		for _, mb := range p.Members() {
			key := memberKey{p.Name(), mb.Addr()}
			b := bs.byKey[key]
			if b == nil && old != nil {
				if ob := old.byKey[key]; ob != nil && ob.connectTimeout == p.ConnectTimeout() && ob.maxConns == p.MaxConnsPerMember() {
					b = ob
				}
			}
			if b == nil {
				b = newUpstream(key, p.ConnectTimeout(), p.MaxConnsPerMember(), m)
			}
			bs.byKey[key] = b
			bs.byMember[mb] = b
		}
	}
	return bs
}

// closeIdle closes the idle connections of the clients that next no longer has
// (all of them when next is nil).
func (bs *upstreams) closeIdle(next *upstreams) {
	if bs == nil {
		return
	}
	for key, b := range bs.byKey {
		if next == nil || next.byKey[key] != b {
			b.hc.CloseIdleConnections()
		}
	}
}

// maxConnWait bounds the wait for a free connection to a member whose connections
// are all busy; the request's deadline bounds it first.
const maxConnWait = time.Minute

func newUpstream(key memberKey, connectTimeout time.Duration, maxConns int, m *metrics) *upstream {
	return &upstream{
		key:            key,
		connectTimeout: connectTimeout,
		maxConns:       maxConns,
		hc: &fasthttp.HostClient{
			Addr:                          key.addr,
			MaxConns:                      maxConns,
			MaxConnWaitTimeout:            maxConnWait,
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true,
			DisablePathNormalizing:        true,
			SecureErrorLogMessage:         true,
			// Responses go to the client as they arrive, never held whole; the
			// connection returns to the pool when the body has been passed on (the
			// response's Reset closes the stream, and a stream not read to its end
			// closes the connection).
			StreamResponseBody: true,
			DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
				return fasthttp.DialTimeout(addr, min(timeout, connectTimeout))
			},
			// A member that cannot be reached is left to the route's retries, on
			// another member; a kept-alive connection the backend closed is retried on
			// the same member, for idempotent requests, as fasthttp does by default.
			RetryIfErr: func(req *fasthttp.Request, _ int, err error) (bool, bool) {
				if isConnectError(err) {
					return false, false
				}
				return false, isIdempotent(&req.Header)
			},
		},
		errConnect: m.backendErrors.WithLabelValues(key.pool, "connect"),
		errTimeout: m.backendErrors.WithLabelValues(key.pool, "timeout"),
		errBusy:    m.backendErrors.WithLabelValues(key.pool, "busy"),
		errOther:   m.backendErrors.WithLabelValues(key.pool, "other"),
	}
}

func isIdempotent(h *fasthttp.RequestHeader) bool {
	return h.IsGet() || h.IsHead() || h.IsPut() || h.IsOptions() || h.IsDelete() || h.IsTrace()
}

// do sends req, whose body, when streamed, is body, to the member until deadline and
// fills resp, whose body is then a stream. It counts a failure and returns how the
// attempt went for the member's health; a failure to read the client's body is not
// the member's.
func (b *upstream) do(req *fasthttp.Request, body *clientBody, resp *fasthttp.Response, deadline time.Time) (route.Outcome, error) {
	resp.Reset()
	resp.Header.SetNoDefaultContentType(true)
	err := b.hc.DoDeadline(req, resp, deadline)
	if err != nil && body != nil && body.err != nil {
		return route.Canceled, err
	}
	if err == nil {
		if resp.StatusCode() >= 500 {
			return route.Failure, nil
		}
		return route.Success, nil
	}
	_, reason := backendStatus(err)
	switch reason {
	case "connect":
		b.errConnect.Inc()
		return route.ConnectFailure, err
	case "timeout":
		b.errTimeout.Inc()
	case "busy":
		b.errBusy.Inc()
		// Every connection to it is in use: that says nothing against the member.
		return route.Canceled, err
	default:
		b.errOther.Inc()
	}
	return route.Failure, err
}

// backendStatus maps a backend failure to the status answered and the reason counted.
func backendStatus(err error) (int, string) {
	var ne net.Error
	switch {
	case isConnectError(err):
		return fasthttp.StatusBadGateway, "connect"
	case errors.Is(err, fasthttp.ErrTimeout), errors.As(err, &ne) && ne.Timeout():
		return fasthttp.StatusGatewayTimeout, "timeout"
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return fasthttp.StatusServiceUnavailable, "busy"
	}
	return fasthttp.StatusBadGateway, "other"
}

func isConnectError(err error) bool {
	var de *fasthttp.ErrDialWithUpstream
	var oe *net.OpError
	return errors.Is(err, fasthttp.ErrDialTimeout) || errors.As(err, &de) ||
		(errors.As(err, &oe) && oe.Op == "dial")
}

// hopHeaders are the hop-by-hop headers of RFC 9110 section 7.6.1, and the older ones
// proxies still meet: they describe one connection and are not forwarded.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// listElements calls f with each element of a comma-separated header value (the
// "#rule" lists of RFC 9110 section 5.6.1: Connection, X-Forwarded-For), without the
// whitespace around it; empty elements are skipped.
func listElements(v []byte, f func(elem []byte)) {
	for len(v) > 0 {
		var tok []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			tok, v = v, nil
		}
		tok = trimOWS(tok)
		if len(tok) > 0 {
			f(tok)
		}
	}
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// isProtected reports headers a Connection header may not remove from a forwarded
// request: the proxy needs them to forward it at all.
func isProtected(name []byte) bool {
	return equalFoldASCII(name, "Host") || equalFoldASCII(name, "Content-Length")
}

func equalFoldASCII(b []byte, s string) bool {
	return bytes.EqualFold(b, []byte(s))
}

// isHopHeader reports a name among hopHeaders, which are removed whether a
// Connection header names them or not: such a token ("keep-alive", the common one)
// needs no copy to be removed by.
func isHopHeader(name []byte) bool {
	for _, h := range hopHeaders {
		if equalFoldASCII(name, h) {
			return true
		}
	}
	return false
}

// removeRequestHopHeaders removes the hop-by-hop headers of a request, those its
// Connection header names included.
func removeRequestHopHeaders(h *fasthttp.RequestHeader) {
	var named [][]byte
	for _, v := range h.PeekAll("Connection") {
		listElements(v, func(tok []byte) {
			if !isProtected(tok) && !isHopHeader(tok) {
				named = append(named, append([]byte(nil), tok...))
			}
		})
	}
	for _, n := range named {
		h.DelBytes(n)
	}
	for _, n := range hopHeaders {
		h.Del(n)
	}
}

// removeResponseHopHeaders does the same for a response.
func removeResponseHopHeaders(h *fasthttp.ResponseHeader) {
	var named [][]byte
	for _, v := range h.PeekAll("Connection") {
		listElements(v, func(tok []byte) {
			if !equalFoldASCII(tok, "Content-Length") && !isHopHeader(tok) {
				named = append(named, append([]byte(nil), tok...))
			}
		})
	}
	for _, n := range named {
		h.DelBytes(n)
	}
	for _, n := range hopHeaders {
		h.Del(n)
	}
}

// prepareUpstream turns a client's request into the one sent to the backend:
// origin-form over HTTP/1.1, without hop-by-hop headers and with the forwarding
// headers of decision d; peer is the packet source, sni the TLS server name, which
// stands for a missing Host. It returns false for a request that names no host at all
// (no Host, no SNI; or an absolute-form target with an empty authority), which is
// answered 400.
func prepareUpstream(req *fasthttp.Request, d *Decision, peer netip.Addr, sni string) bool {
	h := &req.Header
	if len(h.Host()) == 0 {
		if sni == "" {
			return false
		}
		h.SetHost(sni)
	}
	// An absolute-form target's authority replaces Host (RFC 9112 section 3.2.2).
	if len(req.URI().Host()) == 0 {
		return false
	}
	h.SetProtocol("HTTP/1.1")
	removeRequestHopHeaders(h)
	// The whole body has been read: the backend has nothing to wait for.
	h.Del("Expect")
	req.URI().SetScheme("http")

	var buf [128]byte
	xff := buf[:0]
	if d.TrustedPeer {
		for _, v := range h.PeekAll("X-Forwarded-For") {
			listElements(v, func(e []byte) {
				if len(xff) > 0 {
					xff = append(xff, ", "...)
				}
				xff = append(xff, e...)
			})
		}
		if len(xff) > 0 {
			xff = append(xff, ", "...)
		}
		xff = peer.AppendTo(xff)
	} else {
		xff = d.ClientIP.AppendTo(xff)
	}
	h.Del("X-Forwarded-For")
	h.SetBytesV("X-Forwarded-For", xff)
	var ipBuf [48]byte
	h.SetBytesV("X-Real-IP", d.ClientIP.AppendTo(ipBuf[:0]))
	h.Set("X-Forwarded-Proto", "https")
	return true
}

// answer replaces resp with a short plain-text answer of the given status.
func answer(resp *fasthttp.Response, status int) {
	resp.Reset()
	resp.Header.SetNoDefaultContentType(true)
	resp.SetStatusCode(status)
	resp.Header.SetContentType("text/plain; charset=utf-8")
	body := resp.BodyWriter()
	_, _ = body.Write([]byte(strconv.Itoa(status)))
	_, _ = body.Write([]byte{' '})
	_, _ = body.Write([]byte(fasthttp.StatusMessage(status)))
	_, _ = body.Write([]byte{'\n'})
}
