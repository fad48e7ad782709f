package l7

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http/httpguts"
)

// routeNone is the route label of requests refused before a decision (malformed,
// headers or body too large).
const routeNone = "-"

// serve is the one request handler every protocol reaches: it asks the Decider what
// to do, answers or proxies, and leaves the response in resp. It returns whether the
// decision asked for the connection to be closed.
func (l *listener) serve(r *Request, resp *fasthttp.Response, start time.Time) (closeConn bool) {
	snap := l.s.state.Load()
	var d Decision
	if snap.decider != nil {
		d = snap.decider.Decide(r)
	}
	if d.Pool == "" {
		d.Pool = snap.listeners[l.idx].pool
	}
	peer := r.Conn.Remote.Addr()
	if !d.ClientIP.IsValid() {
		d.ClientIP = peer
	}

	switch {
	case d.Status != 0:
		answer(resp, d.Status)
	case r.Header.IsConnect():
		answer(resp, fasthttp.StatusMethodNotAllowed)
	default:
		p := snap.pools[d.Pool]
		if p == nil {
			l.log.Warn("decider chose an unknown pool", "pool", d.Pool)
			answer(resp, fasthttp.StatusBadGateway)
			break
		}
		var sni string
		if r.Conn.TLS != nil {
			sni = r.Conn.TLS.ServerName
		}
		if !prepareUpstream(r.Request, &d, peer, sni) {
			answer(resp, fasthttp.StatusBadRequest)
			break
		}
		resp.Header.SetNoDefaultContentType(true)
		if status, err := p.do(r.Request, resp); err != nil {
			l.log.Debug("backend request failed", "pool", p.name, "status", status, "err", err)
			answer(resp, status)
		}
		removeResponseHopHeaders(&resp.Header)
	}
	l.finish(resp, d.Pool, r.Conn.Proto, start)
	return d.Close
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
	m := l.s.m
	m.requests.WithLabelValues(route, codeLabel(resp.StatusCode())).Inc()
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
	closeConn := l.serve(&r, &ctx.Response, start)
	if clientClose || closeConn || l.s.draining.Load() {
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
	closeConn := false
	if status := fromHTTP(req, hr, l.cfg.MaxRequestBody); status != 0 {
		l.refuse(resp, status, info.Proto, start)
	} else {
		r := Request{Request: req, Conn: *info}
		closeConn = l.serve(&r, resp, start)
	}
	writeResponse(w, resp, hr.Method == http.MethodHead, closeConn && info.Proto == ProtoHTTP2)
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
