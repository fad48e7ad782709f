package l7

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"time"

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
	if snap.table != nil {
		cr, matched = snap.table.Match(l.cfg.Name, host, r.Header.Method(), r.URI().Path(), r.Header.Peek)
	}
	label := routeNone
	if matched {
		label = cr.Name()
	}

	switch {
	case d.Status != 0:
		answer(resp, d.Status)
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
		l.proxy(snap, r, resp, &d, peer, sni, start.Add(timeout), func(attempt func(*route.Member) route.Outcome) (route.Outcome, error) {
			return doPool(b, retries, d.ClientIP, r.Header.Peek, r.Header.Method(), attempt)
		})
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
			l.proxy(snap, r, resp, &d, peer, sni, start.Add(cr.Timeout()), func(attempt func(*route.Member) route.Outcome) (route.Outcome, error) {
				cr.RequestHeaders().Apply(&r.Header)
				return cr.Do(d.ClientIP, r.Header.Peek, r.Header.Method(), attempt)
			})
		}
		cr.ResponseHeaders().Apply(&resp.Header)
	}
	l.finish(resp, label, r.Conn.Proto, start)
	if d.Close {
		return closeConn
	}
	return keepConn
}

// proxy sends r to the members do picks, each attempt bounded by deadline, and
// leaves the backend's response, or the answer to its failure, in resp.
func (l *listener) proxy(snap *snapshot, r *Request, resp *fasthttp.Response, d *Decision, peer netip.Addr, sni string,
	deadline time.Time, do func(attempt func(*route.Member) route.Outcome) (route.Outcome, error)) {
	if !prepareUpstream(r.Request, d, peer, sni) {
		answer(resp, fasthttp.StatusBadRequest)
		return
	}
	var last error
	var lastMember *route.Member
	_, err := do(func(m *route.Member) route.Outcome {
		lastMember = m
		b := snap.upstreams.byMember[m]
		if b == nil {
			last = errNoBackend
			return route.Canceled
		}
		if !time.Now().Before(deadline) {
			last = fasthttp.ErrTimeout
			return route.Canceled
		}
		var o route.Outcome
		o, last = b.do(r.Request, resp, deadline)
		return o
	})
	switch {
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
	}
}

var errNoBackend = errors.New("l7: no client for the pool member")

// doPool is CompiledRoute.Do for a pool the Decider chose: it picks a member of b,
// runs attempt on it, and tries another one, at most retries times, after a
// connection failure of an idempotent request.
func doPool(b *route.Balancer, retries int, clientIP netip.Addr, header route.HeaderFunc, method []byte,
	attempt func(*route.Member) route.Outcome) (route.Outcome, error) {
	var tried []*route.Member
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
		resp.Header.SetBytesV("Alt-Svc", l.altSvc)
	}
	l.count(route, codeLabel(resp.StatusCode()), proto, start)
}

// count counts a request answered with code.
func (l *listener) count(route, code, proto string, start time.Time) {
	m := l.s.m
	m.requests.WithLabelValues(route, code).Inc()
	m.requestSeconds.WithLabelValues(route).Observe(time.Since(start).Seconds())
	switch proto {
	case ProtoHTTP1:
		l.reqH1.Inc()
	case ProtoHTTP2:
		l.reqH2.Inc()
	case ProtoHTTP3:
		l.reqH3.Inc()
	}
}

// serveH1 is the fasthttp handler of HTTP/1.1 connections.
func (l *listener) serveH1(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	hc, ok := ctx.Conn().(*h1Conn)
	if !ok {
		l.refuse(&ctx.Response, fasthttp.StatusInternalServerError, ProtoHTTP1, start)
		ctx.SetConnectionClose()
		return
	}
	r := Request{Request: &ctx.Request, Conn: hc.c.info}
	clientClose := ctx.Request.Header.ConnectionClose()
	switch l.serve(&r, &ctx.Response, start) {
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
	}
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
// a fasthttp.Request, serves it, and writes the fasthttp.Response back.
func (l *listener) ServeHTTP(w http.ResponseWriter, hr *http.Request) {
	start := time.Now()
	info, _ := hr.Context().Value(connInfoKey{}).(*ConnInfo)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)

	if info == nil {
		l.refuse(resp, http.StatusInternalServerError, "", start)
		writeResponse(w, resp, hr.Method == http.MethodHead, false)
		return
	}
	next := keepConn
	if status := fromHTTP(req, hr, l.cfg.MaxRequestBody); status != 0 {
		l.refuse(resp, status, info.Proto, start)
	} else {
		r := Request{Request: req, Conn: *info}
		next = l.serve(&r, resp, start)
	}
	if next == dropConn {
		// Both servers reset the stream and leave the connection's other streams be.
		panic(http.ErrAbortHandler)
	}
	writeResponse(w, resp, hr.Method == http.MethodHead, next == closeConn && info.Proto == ProtoHTTP2)
}

// fromHTTP fills req from hr, reading at most maxBody bytes of body. It returns 0, or
// the status to refuse the request with.
func fromHTTP(req *fasthttp.Request, hr *http.Request, maxBody int) int {
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
	if hr.ContentLength > int64(maxBody) {
		return http.StatusRequestEntityTooLarge
	}
	if hr.Body != nil && hr.Body != http.NoBody {
		n, err := io.Copy(req.BodyWriter(), io.LimitReader(hr.Body, int64(maxBody)+1))
		if n > int64(maxBody) {
			return http.StatusRequestEntityTooLarge
		}
		if err != nil {
			return http.StatusBadRequest
		}
	}
	if n := len(req.Body()); n > 0 || hr.ContentLength == 0 && methodHasBody(hr.Method) {
		req.Header.SetContentLength(n)
	}
	return 0
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
func writeResponse(w http.ResponseWriter, resp *fasthttp.Response, head, closeConn bool) {
	h := w.Header()
	for k, v := range resp.Header.All() {
		key := textproto.CanonicalMIMEHeaderKey(string(k))
		if key == "Content-Length" {
			continue
		}
		h[key] = append(h[key], string(v))
	}
	status := resp.StatusCode()
	body := resp.Body()
	switch {
	case status == http.StatusNoContent || status == http.StatusNotModified || status < 200:
	case head:
		if n := resp.Header.ContentLength(); n >= 0 {
			h["Content-Length"] = []string{strconv.Itoa(n)}
		}
	default:
		h["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	if closeConn {
		h["Connection"] = []string{"close"}
	}
	w.WriteHeader(status)
	if !head && len(body) > 0 {
		_, _ = w.Write(body)
	}
}
