package l7

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
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
				return dialBackend(addr, min(timeout, connectTimeout))
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
	return hopBit(name, foldCase)&hopMask != 0
}

// The bits of hopBit, one per header of hopHeaders (in its order) and the others
// prepareUpstream removes or replaces.
const (
	hopConnection = 1 << iota
	hopProxyConnection
	hopKeepAlive
	hopProxyAuthenticate
	hopProxyAuthorization
	hopTe
	hopTrailer
	hopTransferEncoding
	hopUpgrade
	hdrExpect
	hdrXForwardedFor
	hdrXRealIP
	hdrXForwardedProto

	hopMask = hdrExpect - 1 // the bits of hopHeaders
)

// Ways hopBit compares names.
const (
	exactCase = false // as Del finds headers a request parsed with normalizing holds
	foldCase  = true  // any case (RFC 9110 section 5.1)
)

// hopBit returns the bit of a name among hopHeaders, Expect and the forwarding
// headers, in their canonical spelling or in any case with fold, or 0 for another
// name. It looks at the length first, so the names of most headers cost one
// comparison.
func hopBit(name []byte, fold bool) uint16 {
	var s string
	var bit uint16
	switch len(name) {
	case 2:
		s, bit = "Te", hopTe
	case 6:
		s, bit = "Expect", hdrExpect
	case 7:
		if name[0]|0x20 == 't' {
			s, bit = "Trailer", hopTrailer
		} else {
			s, bit = "Upgrade", hopUpgrade
		}
	case 9:
		s, bit = "X-Real-Ip", hdrXRealIP
	case 10:
		if name[0]|0x20 == 'c' {
			s, bit = "Connection", hopConnection
		} else {
			s, bit = "Keep-Alive", hopKeepAlive
		}
	case 15:
		s, bit = "X-Forwarded-For", hdrXForwardedFor
	case 16:
		s, bit = "Proxy-Connection", hopProxyConnection
	case 17:
		if name[0]|0x20 == 't' {
			s, bit = "Transfer-Encoding", hopTransferEncoding
		} else {
			s, bit = "X-Forwarded-Proto", hdrXForwardedProto
		}
	case 18:
		s, bit = "Proxy-Authenticate", hopProxyAuthenticate
	case 19:
		s, bit = "Proxy-Authorization", hopProxyAuthorization
	default:
		return 0
	}
	if string(name) == s || fold && foldEqual(name, s) {
		return bit
	}
	return 0
}

// foldEqual reports whether b is s but for the case of ASCII letters. Unlike
// bytes.EqualFold it folds nothing else: no non-ASCII letter is the same name as
// an ASCII one.
func foldEqual(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if x == y {
			continue
		}
		if x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z' {
			return false
		}
	}
	return true
}

// connTokens gathers header names to remove (those a Connection header lists, or
// the spellings of hop-by-hop names a response uses): up to len(toks) of them
// without a copy (their bytes stay where the header holds them, which deletions do
// not move), the rest in more.
type connTokens struct {
	n    int
	toks [8][]byte
	more [][]byte
}

func (c *connTokens) add(tok []byte) {
	if c.n < len(c.toks) {
		c.toks[c.n] = tok
		c.n++
		return
	}
	c.more = append(c.more, tok)
}

func (c *connTokens) len() int { return c.n + len(c.more) }

func (c *connTokens) at(i int) []byte {
	if i < c.n {
		return c.toks[i]
	}
	return c.more[i-c.n]
}

// has reports whether tok is among c's names, byte for byte.
func (c *connTokens) has(tok []byte) bool {
	for i := range c.len() {
		if bytes.Equal(c.at(i), tok) {
			return true
		}
	}
	return false
}

// addList adds the elements of a Connection value that keep reports, in order.
func (c *connTokens) addList(v []byte, keep func([]byte) bool) {
	listElements(v, func(tok []byte) {
		if keep(tok) {
			c.add(tok)
		}
	})
}

// namedByRequest and namedByResponse report Connection tokens that name a header to
// remove besides hopHeaders (the cheaper test first: keep-alive is the common token).
func namedByRequest(tok []byte) bool { return !isHopHeader(tok) && !isProtected(tok) }
func namedByResponse(tok []byte) bool {
	return !isHopHeader(tok) && !equalFoldASCII(tok, "Content-Length")
}

// scratchHeaders hold copies of request headers whose Cookie fields All would
// otherwise parse in place (see removeRequestHopHeaders).
var scratchHeaders = sync.Pool{New: func() any { return new(fasthttp.RequestHeader) }}

// removeRequestHopHeaders removes the hop-by-hop headers of a request, those its
// Connection header names included, and Expect. It reports the bits of the
// forwarding headers that were there (and may still be, unless Connection named
// them), and of those that were there more than once.
//
// It looks at the headers once, and deletes only the ones it found: fasthttp's Del
// copies and normalizes its name and looks through every header, which for the
// eleven names was most of what forwarding a request cost here. It removes what
// removeRequestHopHeadersDel (in the tests) removes, in the same order, so the
// headers left are in the same order too.
func removeRequestHopHeaders(h *fasthttp.RequestHeader) (seen, twice uint16) {
	if len(h.PeekTrailerKeys()) > 0 {
		// Announced trailers keep headers in a section All does not show.
		for _, v := range h.PeekAll("Connection") {
			listElements(v, func(tok []byte) {
				if namedByRequest(tok) {
					h.DelBytes(append([]byte(nil), tok...))
				}
			})
		}
		for _, n := range hopHeaders {
			h.Del(n)
		}
		h.Del("Expect")
		seen = hdrXForwardedFor | hdrXRealIP | hdrXForwardedProto
		if len(h.PeekAll("X-Real-Ip")) > 1 {
			twice |= hdrXRealIP
		}
		if len(h.PeekAll("X-Forwarded-Proto")) > 1 {
			twice |= hdrXForwardedProto
		}
		return seen, twice
	}
	// All parses Cookie fields into cookies, which are then written as fasthttp
	// formats them; a request that has some is looked at in a copy, without them
	// (not a name this looks for, and parsing them cost more than the rest).
	src := h
	if len(h.PeekAll("Cookie")) > 0 {
		src = scratchHeaders.Get().(*fasthttp.RequestHeader)
		defer scratchHeaders.Put(src)
		h.CopyTo(src)
		src.Del("Cookie")
	}
	var found uint16
	var named connTokens
	for k, v := range src.All() {
		// Del normalizes its name and compares it with each header's as it is; the
		// server normalized the names it parsed.
		b := hopBit(k, exactCase)
		twice |= found & b
		found |= b
		if b == hopConnection {
			named.addList(v, namedByRequest)
		}
	}
	for i := range named.len() {
		h.DelBytes(named.at(i))
	}
	if h.ConnectionClose() {
		found |= hopConnection // Del clears the flag
	}
	for i, n := range hopHeaders {
		if found&(1<<i) != 0 {
			h.Del(n)
		}
	}
	if found&hdrExpect != 0 {
		h.Del("Expect")
	}
	return found &^ hopMask &^ hdrExpect, twice &^ hopMask &^ hdrExpect
}

// removeResponseHopHeaders removes the hop-by-hop headers of a response, those its
// Connection header names included, whatever the case of their names: the client
// keeps the names of backend responses as they come (DisableHeaderNamesNormalizing),
// and fasthttp's Del finds only the spelling it is given. Like
// removeRequestHopHeaders, it looks at the headers once and deletes only what it
// found.
func removeResponseHopHeaders(h *fasthttp.ResponseHeader) {
	var named connTokens
	if len(h.PeekTrailerKeys()) > 0 {
		// Del("Trailer") returns the trailer section's fields among the headers,
		// which the rest then looks through; the names Connection lists are copied
		// first, since that can reuse the memory of deleted fields.
		for k, v := range h.All() {
			if hopBit(k, foldCase) == hopConnection {
				listElements(v, func(tok []byte) {
					if namedByResponse(tok) {
						named.add(bytes.Clone(tok))
					}
				})
			}
		}
		h.Del("Trailer")
	}
	var found connTokens // each spelling found of a name to remove
	record := func(k []byte) {
		if !found.has(k) {
			found.add(k)
		}
	}
	for k, v := range h.All() {
		b := hopBit(k, foldCase)
		if b&hopMask == 0 {
			continue
		}
		record(k)
		if b == hopConnection {
			named.addList(v, namedByResponse)
		}
	}
	if named.len() > 0 {
		for k := range h.All() {
			for i := range named.len() {
				if foldEqual(k, string(named.at(i))) {
					record(k)
					break
				}
			}
		}
	}
	for i := range found.len() {
		h.DelBytes(found.at(i))
	}
	// What Del("Connection") does besides: the Connection: close flag.
	h.ResetConnectionClose()
}

// Canonical names of the forwarding headers, set without normalizing them again.
var (
	keyXForwardedFor   = []byte("X-Forwarded-For")
	keyXRealIP         = []byte("X-Real-Ip")
	keyXForwardedProto = []byte("X-Forwarded-Proto")
	valueHTTPS         = []byte("https")
)

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
	if string(h.Protocol()) != "HTTP/1.1" {
		h.SetProtocol("HTTP/1.1")
	}
	// The whole body has been read: the backend has nothing to wait for (Expect).
	seen, twice := removeRequestHopHeaders(h)
	hasXFF := seen&hdrXForwardedFor != 0
	req.URI().SetScheme("http")

	var ipBuf [48]byte
	clientIP := d.ClientIP.AppendTo(ipBuf[:0])
	var buf [128]byte
	xff := buf[:0]
	if d.TrustedPeer {
		if hasXFF {
			for _, v := range h.PeekAll("X-Forwarded-For") {
				listElements(v, func(e []byte) {
					if len(xff) > 0 {
						xff = append(xff, ", "...)
					}
					xff = append(xff, e...)
				})
			}
		}
		if len(xff) > 0 {
			xff = append(xff, ", "...)
		}
		xff = peer.AppendTo(xff)
	} else {
		xff = append(xff, clientIP...)
	}
	if hasXFF {
		h.Del("X-Forwarded-For")
	}
	// SetCanonical is SetBytesV without normalizing the name, which the server's
	// requests have on (X-Real-IP is X-Real-Ip then).
	h.SetCanonical(keyXForwardedFor, xff)
	// Set replaces the first of a client's own X-Real-IP or X-Forwarded-Proto
	// headers: when it sent several, the others go.
	if twice&hdrXRealIP != 0 {
		h.Del("X-Real-Ip")
	}
	h.SetCanonical(keyXRealIP, clientIP)
	if twice&hdrXForwardedProto != 0 {
		h.Del("X-Forwarded-Proto")
	}
	h.SetCanonical(keyXForwardedProto, valueHTTPS)
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
