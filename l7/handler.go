package l7

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/net/http/httpguts"

	"github.com/tiergate/tiergate/policy/route"
)

// routeNone is the route label of requests refused before routing (malformed,
// headers or body too large) or matching no route.
const routeNone = "-"

// codeClosed is the code label of requests answered by closing (Decision.Drop).
const codeClosed = "closed"

// after is what becomes of a connection once a request is answered.
type after uint8

const (
	keepConn  after = iota
	closeConn       // close after the answer
	dropConn        // answer nothing: close (HTTP/1.1) or reset the stream
)

// serve is the one request handler every protocol reaches: it asks the Decider,
// then the routing table, what to do, answers or proxies, and leaves the response in
// resp.
func (l *listener) serve(r *Request, resp *fasthttp.Response, start time.Time) after {
	snap := l.s.state.Load()
	var d Decision
	if snap.decider != nil {
		d = snap.decider.Decide(r)
	}
	peer := r.Conn.Remote.Addr()
	if !d.ClientIP.IsValid() {
		d.ClientIP, d.ClientSource = peer, r.Conn.Source
	}
	var sni string
	if r.Conn.TLS != nil {
		sni = r.Conn.TLS.ServerName
	}
	if d.Drop {
		l.count(routeNone, codeClosed, r.Conn.Proto, start)
		return dropConn
	}

	// The host the backend will see: an absolute-form target's authority, else
	// Host, else the TLS server name.
	var hostBuf [256]byte
	host := r.URI().Host()
	if len(host) == 0 {
		host = append(hostBuf[:0], sni...)
	}
	var cr *route.CompiledRoute
	matched := false
	screened := 0 // 421 or 400: the listener's strict_sni or path_mode refuses the request
	if snap.table != nil {
		var pathBuf [256]byte
		var norm []byte
		screened, norm = snap.table.Screen(l.cfg.Name, host, sni, r.URI().PathOriginal(), pathBuf[:0])
		if norm != nil {
			r.URI().SetPathBytes(norm) // routed on, and sent to the backend
		}
		if screened == 0 {
			cr, matched = snap.table.Match(l.cfg.Name, host, r.Header.Method(), r.URI().Path(), r.Header.Peek)
		}
	}
	label := routeNone
	if matched {
		label = cr.Name()
	}

	switch {
	case d.Status != 0:
		answer(resp, d.Status)
	case screened != 0:
		answer(resp, screened)
	case r.Header.IsConnect():
		answer(resp, fasthttp.StatusMethodNotAllowed)
	case d.Pool != "":
		label = d.Pool
		b := snap.table.Pool(d.Pool)
		if b == nil {
			l.log.Warn("decider chose an unknown pool", "pool", d.Pool)
			answer(resp, fasthttp.StatusBadGateway)
			break
		}
		timeout, retries := route.DefaultTimeout, 0
		if pc, ok := snap.cfg.Backends[d.Pool]; ok {
			timeout, retries = pc.Timeout.D(), simpleRetries(len(b.Members()))
		} else if matched && cr.Kind() == route.ActionProxy {
			timeout, retries = cr.Timeout(), cr.Retries()
		}
		l.proxy(snap, r, resp, &d, peer, sni, start.Add(timeout), picker{pool: b, retries: retries})
	case !matched:
		answer(resp, fasthttp.StatusNotFound)
	case !cr.Allow(d.ClientIP, start):
		answer(resp, fasthttp.StatusTooManyRequests)
		cr.ResponseHeaders().Apply(&resp.Header)
	default:
		switch cr.Kind() {
		case route.ActionRespond:
			rs := cr.Respond()
			resp.Reset()
			resp.Header.SetNoDefaultContentType(true)
			resp.SetStatusCode(rs.Status())
			if ct := rs.ContentType(); ct != "" {
				resp.Header.SetContentType(ct)
			}
			resp.SetBodyRaw(rs.Body())
		case route.ActionRedirect:
			var buf [512]byte
			loc := cr.AppendLocation(buf[:0], "https", host, r.URI().RequestURI())
			resp.Reset()
			resp.Header.SetNoDefaultContentType(true)
			resp.SetStatusCode(cr.RedirectCode())
			resp.Header.SetBytesV("Location", loc)
		case route.ActionProxy:
			l.proxy(snap, r, resp, &d, peer, sni, start.Add(cr.Timeout()), picker{route: cr})
		}
		cr.ResponseHeaders().Apply(&resp.Header)
	}
	l.finish(resp, label, r.Conn.Proto, start)
	if d.Close {
		return closeConn
	}
	return keepConn
}

// picker says which members a proxied request goes to: those of a proxy route,
// after its request header edits, or those of a pool the Decider chose, with as many
// retries.
type picker struct {
	route   *route.CompiledRoute
	pool    *route.Balancer
	retries int
}

// do runs attempt on the members of p for r, as CompiledRoute.Do does. A method
// rather than a closure given to proxy: the compiler sees where attempt goes, and
// keeps it, and what it captures, off the heap.
func (p picker) do(r *Request, clientIP netip.Addr, attempt func(*route.Member) route.Outcome) (route.Outcome, error) {
	if p.route != nil {
		p.route.RequestHeaders().Apply(&r.Header)
		return p.route.Do(clientIP, r.Header.Peek, r.Header.Method(), attempt)
	}
	return doPool(p.pool, p.retries, clientIP, r.Header.Peek, r.Header.Method(), attempt)
}

// proxy sends r to the members p picks, each attempt bounded by deadline, and
// leaves the backend's response, or the answer to its failure, in resp.
func (l *listener) proxy(snap *snapshot, r *Request, resp *fasthttp.Response, d *Decision, peer netip.Addr, sni string,
	deadline time.Time, p picker) {
	if !prepareUpstream(r.Request, d, peer, sni) {
		answer(resp, fasthttp.StatusBadRequest)
		return
	}
	var st struct {
		last       error
		lastMember *route.Member
	}
	_, err := p.do(r, d.ClientIP, func(m *route.Member) route.Outcome {
		st.lastMember = m
		b := snap.upstreams.byMember[m]
		if b == nil {
			st.last = errNoBackend
			return route.Canceled
		}
		if !time.Now().Before(deadline) {
			st.last = fasthttp.ErrTimeout
			return route.Canceled
		}
		var o route.Outcome
		o, st.last = b.do(r.Request, r.body, resp, deadline)
		return o
	})
	last, lastMember := st.last, st.lastMember
	switch {
	case r.body != nil && r.body.err != nil:
		l.log.Debug("reading the request body failed", "client", d.ClientIP, "client_source", d.ClientSource, "err", r.body.err)
		answer(resp, r.body.status())
	case err != nil:
		l.log.Debug("no backend to take the request", "client", d.ClientIP, "client_source", d.ClientSource, "err", err)
		answer(resp, fasthttp.StatusServiceUnavailable)
	case last != nil:
		status, _ := backendStatus(last)
		l.log.Debug("backend request failed", "pool", lastMember.Pool(), "member", lastMember.Addr(),
			"client", d.ClientIP, "client_source", d.ClientSource, "status", status, "err", last)
		answer(resp, status)
	default:
		removeResponseHopHeaders(&resp.Header)
		if resp.BodyStream() == nil {
			break
		}
		if resp.Header.ContentLength() < -1 {
			// Delimited by the backend closing its connection: chunked to the client.
			resp.Header.SetContentLength(-1)
		}
		if r.chunk != nil && r.chunk.buf == nil {
			// An HTTP/2 or HTTP/3 client: the body is copied through a buffer.
			c, ok := l.s.bodies.chunk()
			if !ok {
				answer(resp, fasthttp.StatusServiceUnavailable)
				break
			}
			*r.chunk = c
		}
	}
}

var errNoBackend = errors.New("l7: no client for the pool member")

// doPool is CompiledRoute.Do for a pool the Decider chose: it picks a member of b,
// runs attempt on it, and tries another one, at most retries times, after a
// connection failure of an idempotent request.
func doPool(b *route.Balancer, retries int, clientIP netip.Addr, header route.HeaderFunc, method []byte,
	attempt func(*route.Member) route.Outcome) (route.Outcome, error) {
	var triedBuf [4]*route.Member
	tried := triedBuf[:0]
	exclude := func(m *route.Member) bool { return slices.Contains(tried, m) }
	o := route.Failure
	for {
		m, err := b.Pick(clientIP, header, exclude)
		if err != nil {
			if len(tried) == 0 {
				return o, err
			}
			return o, nil
		}
		tried = append(tried, m)
		o = attempt(m)
		m.Done(o)
		if o != route.ConnectFailure || len(tried) > retries || !idempotentMethod(method) {
			return o, nil
		}
	}
}

func idempotentMethod(m []byte) bool {
	switch string(m) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

// refuse answers a request that never reached the decision.
func (l *listener) refuse(resp *fasthttp.Response, status int, proto string, start time.Time) {
	answer(resp, status)
	l.finish(resp, routeNone, proto, start)
}

// finish adds the headers every response carries and counts the request.
func (l *listener) finish(resp *fasthttp.Response, route, proto string, start time.Time) {
	if l.altSvc != nil {
		resp.Header.SetCanonical(keyAltSvc, l.altSvc) // SetBytesV, the name canonical already
	}
	l.count(route, codeLabel(resp.StatusCode()), proto, start)
}

var keyAltSvc = []byte("Alt-Svc")

// count counts a request answered with code.
func (l *listener) count(route, code, proto string, start time.Time) {
	c := l.s.m.requestChild(route, code)
	c.requests.Inc()
	c.seconds.Observe(time.Since(start).Seconds())
	switch proto {
	case ProtoHTTP1:
		l.reqH1.Inc()
	case ProtoHTTP2:
		l.reqH2.Inc()
	case ProtoHTTP3:
		l.reqH3.Inc()
	}
}

// requestChildren keeps the children of tiergate_http_requests_total and
// tiergate_http_request_seconds once found, by their labels: WithLabelValues hashes
// the values and takes a read lock, which every core writes to, on each call, where
// this is a map read. The map is replaced, never written to, when a new pair of
// labels comes.
type requestChildren struct {
	mu       sync.Mutex // held to add to byLabels
	byLabels atomic.Pointer[map[requestLabels]*requestChild]
}

type requestLabels struct{ route, code string }

type requestChild struct {
	requests prometheus.Counter
	seconds  prometheus.Observer
}

// requestChild returns the children of m's requests and requestSeconds for route
// and code.
func (m *metrics) requestChild(route, code string) *requestChild {
	c := &m.requestChildren
	key := requestLabels{route, code}
	if p := c.byLabels.Load(); p != nil {
		if ch := (*p)[key]; ch != nil {
			return ch
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.byLabels.Load()
	if old != nil {
		if ch := (*old)[key]; ch != nil {
			return ch
		}
	}
	next := make(map[requestLabels]*requestChild)
	if old != nil {
		maps.Copy(next, *old)
	}
	ch := &requestChild{requests: m.requests.WithLabelValues(route, code), seconds: m.requestSeconds.WithLabelValues(route)}
	next[key] = ch
	c.byLabels.Store(&next)
	return ch
}

// serveH1 is the fasthttp handler of HTTP/1.1 connections.
func (l *listener) serveH1(ctx *fasthttp.RequestCtx) {
	// The server read the clock just before calling the handler.
	start := ctx.Time()
	if start.IsZero() {
		start = time.Now()
	}
	hc, ok := ctx.Conn().(*h1Conn)
	if !ok {
		l.refuse(&ctx.Response, fasthttp.StatusInternalServerError, ProtoHTTP1, start)
		ctx.SetConnectionClose()
		return
	}
	// The Decider is given r, so it would be allocated for each request; it is
	// reused instead, the Decider keeping no Request.
	r := h1Requests.Get().(*Request)
	defer putH1Request(r)
	*r = Request{Request: &ctx.Request, Conn: hc.c.info}
	clientClose := ctx.Request.Header.ConnectionClose()
	if ctx.Request.IsBodyStream() {
		// fasthttp read the headers and at most 8 KiB of the body; the rest is
		// forwarded as it arrives, within MaxRequestBody.
		n := ctx.Request.Header.ContentLength()
		if n > l.cfg.MaxRequestBody {
			l.refuse(&ctx.Response, fasthttp.StatusRequestEntityTooLarge, ProtoHTTP1, start)
			ctx.SetConnectionClose()
			return
		}
		r.body = &clientBody{r: ctx.Request.BodyStream(), left: int64(l.cfg.MaxRequestBody)}
		ctx.Request.SetBodyStream(r.body, n)
	}
	next := l.serve(r, &ctx.Response, start)
	if r.body != nil && r.body.err != nil {
		clientClose = true // what is left of the body is not worth reading
	}
	switch next {
	case dropConn:
		// fasthttp closes a hijacked connection once the hijack handler returns; with
		// no response, nothing is written first.
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(net.Conn) {})
		return
	case closeConn:
		clientClose = true
	}
	if clientClose || l.s.draining.Load() {
		ctx.SetConnectionClose()
		if !ctx.Response.IsBodyStream() {
			// Written whole, then close_notify: in one write.
			hc.c.hsc.holdNext()
		}
	}
}

// h1Requests are the Requests of serveH1.
var h1Requests = sync.Pool{New: func() any { return new(Request) }}

// putH1Request returns r to h1Requests, holding on to nothing of its request.
func putH1Request(r *Request) {
	*r = Request{}
	h1Requests.Put(r)
}

// h1Error answers HTTP/1.1 requests fasthttp could not read.
func (l *listener) h1Error(ctx *fasthttp.RequestCtx, err error) {
	status := fasthttp.StatusBadRequest
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &small):
		status = fasthttp.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status = fasthttp.StatusRequestEntityTooLarge
	case errors.As(err, &ne) && ne.Timeout():
		status = fasthttp.StatusRequestTimeout
	}
	l.refuse(&ctx.Response, status, ProtoHTTP1, time.Now())
	ctx.SetConnectionClose()
}

type connInfoKey struct{}

// ServeHTTP is the handler of HTTP/2 and HTTP/3 requests: it converts the request to
// a fasthttp.Request, serves it, and writes the fasthttp.Response back. Over HTTP/3
// it applies ReadTimeout (from the request's start, to its body's end) and
// WriteTimeout (for each part of the response written) to the request's stream,
// which a QUIC connection's PINGs would otherwise keep forever; a stream whose
// response cannot be written in time is reset.
func (l *listener) ServeHTTP(w http.ResponseWriter, hr *http.Request) {
	start := time.Now()
	info, _ := hr.Context().Value(connInfoKey{}).(*ConnInfo)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp) // closes a streamed response, freeing its backend connection
	var ch chunk
	defer ch.put()

	if info == nil {
		l.refuse(resp, http.StatusInternalServerError, "", start)
		l.writeResponse(w, resp, hr.Method == http.MethodHead, false, nil, nil)
		return
	}
	var dl deadliner
	if info.Proto == ProtoHTTP3 {
		dl, _ = w.(deadliner)
		if dl != nil {
			_ = dl.SetReadDeadline(start.Add(l.cfg.ReadTimeout.D()))
		}
	}
	next := keepConn
	r := Request{Request: req, Conn: *info, chunk: &ch}
	status := fromHTTP(req, hr)
	if status == 0 {
		r.body, status = l.bodyFrom(req, hr, &ch)
	}
	if status != 0 {
		l.refuse(resp, status, info.Proto, start)
	} else {
		next = l.serve(&r, resp, start)
	}
	if next == dropConn {
		// Both servers reset the stream and leave the connection's other streams be.
		panic(http.ErrAbortHandler)
	}
	l.writeResponse(w, resp, hr.Method == http.MethodHead, next == closeConn && info.Proto == ProtoHTTP2, &ch, dl)
}

// deadliner is the HTTP/3 response writer's hold on its stream's deadlines.
type deadliner interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// fromHTTP fills req from hr, but for its body. It returns 0, or the status to refuse
// the request with.
func fromHTTP(req *fasthttp.Request, hr *http.Request) int {
	req.Header.SetMethod(hr.Method)
	uri := hr.RequestURI
	if uri == "" {
		uri = hr.URL.RequestURI()
	}
	// The HTTP/2 and HTTP/3 servers check these already; what is written to the
	// backend's connection must never depend on that.
	if !validRequestTarget(uri) || !httpguts.ValidHostHeader(hr.Host) || !httpguts.ValidHeaderFieldName(hr.Method) {
		return http.StatusBadRequest
	}
	req.SetRequestURI(uri)
	req.Header.SetHost(hr.Host)
	req.URI().SetScheme("https") // as fasthttp has it for HTTP/1.1 over TLS
	for k, vs := range hr.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return http.StatusBadRequest
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return http.StatusBadRequest
			}
			req.Header.Add(k, v)
		}
	}
	return 0
}

// bodyFrom sets req's body from hr's, within MaxRequestBody. A body of at most
// bodyChunk bytes is read whole into a buffer from the body budget (ch) and sent with
// its length; a longer one is forwarded as it arrives (with its length when the
// client gave one, else chunked), through the returned clientBody. It returns the
// status to refuse the request with, or 0.
func (l *listener) bodyFrom(req *fasthttp.Request, hr *http.Request, ch *chunk) (*clientBody, int) {
	maxBody := int64(l.cfg.MaxRequestBody)
	n := hr.ContentLength // -1: unknown
	if n > maxBody {
		return nil, http.StatusRequestEntityTooLarge
	}
	if hr.Body == nil || hr.Body == http.NoBody || n == 0 {
		if n == 0 && methodHasBody(hr.Method) {
			req.Header.SetContentLength(0)
		}
		return nil, 0
	}
	c, ok := l.s.bodies.chunk()
	if !ok {
		return nil, http.StatusServiceUnavailable
	}
	*ch = c
	body := &clientBody{r: hr.Body, left: maxBody}
	buf := c.buf[:]
	if n >= 0 && n < bodyChunk {
		buf = buf[:n]
	}
	got, err := io.ReadFull(body, buf)
	switch {
	case body.err != nil:
		return body, body.status()
	case n >= 0 && int64(got) == n, n < 0 && err != nil:
		// All of it (err is io.EOF or io.ErrUnexpectedEOF): sent from req's own buffer.
		if got > 0 || methodHasBody(hr.Method) {
			req.SetBody(buf[:got])
			req.Header.SetContentLength(got)
		}
		ch.put()
		return nil, 0
	case err != nil:
		return nil, http.StatusBadRequest // shorter than its Content-Length
	}
	body.prefix = buf[:got]
	req.SetBodyStream(body, int(n))
	return body, 0
}

// validRequestTarget reports a request target without controls, spaces or non-ASCII
// bytes, which would break the request line.
func validRequestTarget(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

func methodHasBody(m string) bool {
	return m == http.MethodPost || m == http.MethodPut || m == http.MethodPatch
}

// writeResponse writes resp to an HTTP/2 or HTTP/3 response writer. With closeConn
// the response carries Connection: close, which makes the HTTP/2 server send GOAWAY.
// A streamed body is copied through ch's buffer, each part within WriteTimeout over
// HTTP/3 (dl); when the backend or the client fails midway the stream is reset, so
// the client cannot take a cut body for a whole one.
func (l *listener) writeResponse(w http.ResponseWriter, resp *fasthttp.Response, head, closeConn bool, ch *chunk, dl deadliner) {
	h := w.Header()
	for k, v := range resp.Header.All() {
		key := textproto.CanonicalMIMEHeaderKey(string(k))
		if key == "Content-Length" || key == "Transfer-Encoding" {
			continue
		}
		h[key] = append(h[key], string(v))
	}
	status := resp.StatusCode()
	stream := resp.BodyStream()
	var body []byte
	if stream == nil {
		body = resp.Body()
	}
	switch {
	case status == http.StatusNoContent || status == http.StatusNotModified || status < 200:
	case head || stream != nil:
		if n := resp.Header.ContentLength(); n >= 0 {
			h["Content-Length"] = []string{strconv.Itoa(n)}
		}
	default:
		h["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	if closeConn {
		h["Connection"] = []string{"close"}
	}
	if dl != nil {
		_ = dl.SetWriteDeadline(time.Now().Add(l.cfg.WriteTimeout.D()))
	}
	w.WriteHeader(status)
	switch {
	case head:
	case stream != nil:
		if side, err := copyBody(w, stream, ch.buf[:], dl, l.cfg.WriteTimeout.D()); err != nil {
			l.log.Debug("streaming a response failed", "err", err)
			l.cut(side)
			panic(http.ErrAbortHandler)
		}
	case len(body) > 0:
		if _, err := w.Write(body); err != nil && dl != nil {
			l.cut(cutClient)
			panic(http.ErrAbortHandler) // the write deadline passed: reset the stream
		}
	}
}

// Reasons of tiergate_l7_responses_cut_total.
const (
	cutClient  = "client"  // not taken within write_timeout (HTTP/3), or the client went away
	cutBackend = "backend" // the backend failed midway
)

func (l *listener) cut(side string) {
	l.s.m.responsesCut.WithLabelValues(l.cfg.Name, side).Inc()
}

// copyBody copies a streamed response body to w through buf, flushing each part so
// that the client gets it as the backend sends it. With dl, each write must be done
// within timeout.
// On failure it returns the side that failed, cutClient or cutBackend.
func copyBody(w http.ResponseWriter, body io.Reader, buf []byte, dl deadliner, timeout time.Duration) (string, error) {
	f, _ := w.(http.Flusher)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if dl != nil {
				_ = dl.SetWriteDeadline(time.Now().Add(timeout))
			}
			if _, err := w.Write(buf[:n]); err != nil {
				return cutClient, fmt.Errorf("writing to the client: %w", err)
			}
			if f != nil {
				f.Flush()
			}
		}
		switch {
		case rerr == io.EOF:
			return "", nil
		case rerr != nil:
			return cutBackend, fmt.Errorf("reading from the backend: %w", rerr)
		}
	}
}
