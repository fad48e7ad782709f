package l7

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// pool is a compiled PoolConfig: one fasthttp.HostClient per member, taken in turn.
type pool struct {
	name    string
	cfg     PoolConfig
	members []*member
	next    atomic.Uint32

	errConnect, errTimeout, errBusy, errOther prometheus.Counter
}

type member struct {
	addr string
	hc   *fasthttp.HostClient
}

// newPool compiles cfg. Members of old (the pool of the same name before a reload)
// whose address and settings are unchanged are kept, with their idle connections.
func newPool(name string, cfg PoolConfig, m *metrics, old *pool) *pool {
	p := &pool{
		name:       name,
		cfg:        cfg,
		errConnect: m.backendErrors.WithLabelValues(name, "connect"),
		errTimeout: m.backendErrors.WithLabelValues(name, "timeout"),
		errBusy:    m.backendErrors.WithLabelValues(name, "busy"),
		errOther:   m.backendErrors.WithLabelValues(name, "other"),
	}
	kept := map[string]*member{}
	if old != nil && old.cfg.ConnsPerMember == cfg.ConnsPerMember && old.cfg.Timeout == cfg.Timeout &&
		old.cfg.ConnectTimeout == cfg.ConnectTimeout {
		for _, mb := range old.members {
			kept[mb.addr] = mb
		}
	}
	for _, addr := range cfg.Members {
		if mb := kept[addr]; mb != nil {
			p.members = append(p.members, mb)
			delete(kept, addr) // a member listed twice gets two clients
			continue
		}
		p.members = append(p.members, &member{addr: addr, hc: newHostClient(addr, cfg)})
	}
	return p
}

func newHostClient(addr string, cfg PoolConfig) *fasthttp.HostClient {
	connectTimeout := cfg.ConnectTimeout
	return &fasthttp.HostClient{
		Addr:                          addr,
		MaxConns:                      cfg.ConnsPerMember,
		MaxConnWaitTimeout:            cfg.Timeout,
		ReadTimeout:                   cfg.Timeout,
		WriteTimeout:                  cfg.Timeout,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		SecureErrorLogMessage:         true,
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			return fasthttp.DialTimeout(addr, min(timeout, connectTimeout))
		},
		// A member that cannot be reached is left for the next one (see do), not
		// retried; a kept-alive connection the backend closed is retried, for
		// idempotent requests, as fasthttp does by default.
		RetryIfErr: func(req *fasthttp.Request, _ int, err error) (bool, bool) {
			if isConnectError(err) {
				return false, false
			}
			return false, isIdempotent(&req.Header)
		},
	}
}

func isIdempotent(h *fasthttp.RequestHeader) bool {
	return h.IsGet() || h.IsHead() || h.IsPut() || h.IsOptions() || h.IsDelete() || h.IsTrace()
}

// closeIdle closes the idle connections of members that next no longer has.
func (p *pool) closeIdle(next *pool) {
	keep := map[*member]bool{}
	if next != nil {
		for _, mb := range next.members {
			keep[mb] = true
		}
	}
	for _, mb := range p.members {
		if !keep[mb] {
			mb.hc.CloseIdleConnections()
		}
	}
}

// do sends req to the pool's members in turn, starting with the next one, and
// fills resp. A member that cannot be connected to is skipped for the next; any other
// failure ends the request. It returns the status to answer with when it failed.
func (p *pool) do(req *fasthttp.Request, resp *fasthttp.Response) (int, error) {
	deadline := time.Now().Add(p.cfg.Timeout)
	n := uint32(len(p.members))
	first := p.next.Add(1)
	var err error
	for i := uint32(0); i < n; i++ {
		mb := p.members[(first+i)%n]
		err = mb.hc.DoDeadline(req, resp, deadline)
		if err == nil {
			return 0, nil
		}
		if !isConnectError(err) || !time.Now().Before(deadline) {
			break
		}
		p.errConnect.Inc()
	}
	status, reason := backendStatus(err)
	switch reason {
	case "connect":
		p.errConnect.Inc()
	case "timeout":
		p.errTimeout.Inc()
	case "busy":
		p.errBusy.Inc()
	default:
		p.errOther.Inc()
	}
	return status, err
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

// removeRequestHopHeaders removes the hop-by-hop headers of a request, those its
// Connection header names included.
func removeRequestHopHeaders(h *fasthttp.RequestHeader) {
	var named [][]byte
	for _, v := range h.PeekAll("Connection") {
		listElements(v, func(tok []byte) {
			if !isProtected(tok) {
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
			if !equalFoldASCII(tok, "Content-Length") {
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
