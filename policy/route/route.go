package route

import (
	"bytes"
	"errors"
	"net/netip"
	"net/textproto"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ActionKind is what a route does with the requests it takes.
type ActionKind uint8

// Action kinds.
const (
	// ActionProxy proxies to CompiledRoute.Pool.
	ActionProxy ActionKind = iota + 1
	// ActionRedirect answers RedirectCode with CompiledRoute.AppendLocation.
	ActionRedirect
	// ActionRespond answers CompiledRoute.Respond.
	ActionRespond
)

func (k ActionKind) String() string {
	switch k {
	case ActionProxy:
		return "proxy"
	case ActionRedirect:
		return "redirect"
	case ActionRespond:
		return "respond"
	}
	return "unknown"
}

// Defaults of Route.
const (
	DefaultTimeout      = 30 * time.Second
	DefaultRedirectCode = 302
	defaultContentType  = "text/plain; charset=utf-8"
)

// CompiledRoute is a route of a Table: immutable, shared by the requests it takes.
type CompiledRoute struct {
	name     string
	listener string
	vhost    string

	// Match.
	path       string
	pathPrefix string
	pathRegex  *regexp.Regexp
	regexLit   string // a literal prefix every path pathRegex matches starts with
	methods    []string
	headers    []headerMatch

	// Action.
	kind     ActionKind
	pool     *Balancer
	redirect redirect
	respond  *Response
	timeout  time.Duration
	retries  int

	reqHeaders, respHeaders HeaderEditor

	limiter     *limiter
	rateLimited prometheus.Counter
}

type headerMatch struct {
	name    string // canonical
	exact   []byte
	regex   *regexp.Regexp
	present bool
	invert  bool
}

func (r *CompiledRoute) matchMethod(method []byte) bool {
	if len(r.methods) == 0 {
		return true
	}
	for _, m := range r.methods {
		if string(method) == m {
			return true
		}
	}
	return false
}

func (r *CompiledRoute) matchPathRegex(path []byte) bool {
	if r.pathRegex == nil {
		return true
	}
	if len(path) < len(r.regexLit) || string(path[:len(r.regexLit)]) != r.regexLit {
		return false
	}
	return r.pathRegex.Match(path)
}

func (r *CompiledRoute) matchHeaders(header HeaderFunc) bool {
	for i := range r.headers {
		h := &r.headers[i]
		var v []byte
		if header != nil {
			v = header(h.name)
		}
		var ok bool
		switch {
		case h.present:
			ok = v != nil
		case h.regex != nil:
			ok = v != nil && h.regex.Match(v)
		default:
			ok = v != nil && bytes.Equal(v, h.exact)
		}
		if ok == h.invert {
			return false
		}
	}
	return true
}

// Name is the route's name (Route.Name, or "vhosts[i].routes[j]"), unique within
// its listener: the route label of metrics.
func (r *CompiledRoute) Name() string { return r.name }

// Listener is the name of the route's listener.
func (r *CompiledRoute) Listener() string { return r.listener }

// VHost is the first name of the route's virtual host, for logs.
func (r *CompiledRoute) VHost() string { return r.vhost }

// Kind is what the route does with its requests.
func (r *CompiledRoute) Kind() ActionKind { return r.kind }

// Pool is the pool a proxy route sends its requests to; nil for other kinds.
func (r *CompiledRoute) Pool() *Balancer { return r.pool }

// Timeout bounds one proxied request, retries included.
func (r *CompiledRoute) Timeout() time.Duration { return r.timeout }

// Retries is how many other members an idempotent request may be tried on after a
// connection failure.
func (r *CompiledRoute) Retries() int { return r.retries }

// Retry reports whether a request with this method, whose attempt number attempt
// (1 for the first) ended with outcome o, should be tried again on another member:
// only after a connection failure, which guarantees the member saw nothing, only
// for idempotent methods, and at most Retries times.
func (r *CompiledRoute) Retry(attempt int, method []byte, o Outcome) bool {
	return o == ConnectFailure && attempt <= r.retries && idempotent(method)
}

// ErrNotProxy is returned by CompiledRoute.Do for a route that does not proxy.
var ErrNotProxy = errors.New("route: the route does not proxy to a pool")

// Do runs one proxied request of a proxy route: it picks a member of the route's
// pool, calls attempt with it, reports attempt's outcome with Member.Done, and
// while Retry allows, does it again on a member not tried yet. It returns the last
// attempt's outcome, or ErrNoHealthyMember when no member could be picked for the
// first attempt (the caller answers 503). A retry that finds no other member ends
// with the outcome of the attempt before. attempt bounds its own time (Timeout
// covers all attempts together). Do allocates nothing.
func (r *CompiledRoute) Do(clientIP netip.Addr, header HeaderFunc, method []byte, attempt func(*Member) Outcome) (Outcome, error) {
	if r.pool == nil {
		return Failure, ErrNotProxy
	}
	var tried [maxRetries + 1]*Member
	n := 0
	exclude := func(m *Member) bool {
		for _, t := range tried[:n] {
			if t == m {
				return true
			}
		}
		return false
	}
	o := Failure
	for {
		m, err := r.pool.Pick(clientIP, header, exclude)
		if err != nil {
			if n == 0 {
				return o, err
			}
			return o, nil
		}
		tried[n] = m
		n++
		o = attempt(m)
		m.Done(o)
		if !r.Retry(n, method, o) {
			return o, nil
		}
	}
}

func idempotent(method []byte) bool {
	switch string(method) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

// RequestHeaders are the edits to make to a request before proxying it.
func (r *CompiledRoute) RequestHeaders() *HeaderEditor { return &r.reqHeaders }

// ResponseHeaders are the edits to make to the response, whatever the action.
func (r *CompiledRoute) ResponseHeaders() *HeaderEditor { return &r.respHeaders }

// Respond is the fixed response of an ActionRespond route; nil for other kinds.
func (r *CompiledRoute) Respond() *Response { return r.respond }

// RedirectCode is the status of an ActionRedirect route; 0 for other kinds.
func (r *CompiledRoute) RedirectCode() int { return r.redirect.code }

// AppendLocation appends to dst the Location of an ActionRedirect route's answer
// to a request received over scheme ("https") for host (the Host header, port
// included) with requestURI (origin form: path and query, as received). A route
// that sets the scheme drops the port of host, which belongs to the old scheme.
func (r *CompiledRoute) AppendLocation(dst []byte, scheme string, host, requestURI []byte) []byte {
	rd := &r.redirect
	if rd.url != "" {
		return append(dst, rd.url...)
	}
	path, query := requestURI, []byte(nil)
	if i := bytes.IndexByte(requestURI, '?'); i >= 0 {
		path, query = requestURI[:i], requestURI[i+1:]
	}
	if rd.scheme != "" {
		dst = append(dst, rd.scheme...)
	} else {
		dst = append(dst, scheme...)
	}
	dst = append(dst, "://"...)
	switch {
	case rd.host != "":
		dst = append(dst, rd.host...)
	case rd.scheme != "":
		dst = append(dst, hostWithoutPort(host)...)
	default:
		dst = append(dst, host...)
	}
	if rd.path != "" {
		dst = append(dst, rd.path...)
	} else {
		if len(path) == 0 || path[0] != '/' {
			dst = append(dst, '/')
		}
		dst = append(dst, path...)
	}
	if !rd.stripQuery && len(query) > 0 {
		dst = append(dst, '?')
		dst = append(dst, query...)
	}
	return dst
}

func hostWithoutPort(host []byte) []byte {
	if len(host) > 0 && host[0] == '[' {
		if i := bytes.IndexByte(host, ']'); i >= 0 {
			return host[:i+1]
		}
		return host
	}
	if i := bytes.IndexByte(host, ':'); i >= 0 {
		return host[:i]
	}
	return host
}

type redirect struct {
	code                    int
	url, scheme, host, path string
	stripQuery              bool
}

// Allow takes a token from the bucket of clientIP (IPv6 clients grouped by their
// prefix) on this route at time now, and reports whether there was one; when it
// returns false, the caller answers 429. A route without a rate limit always
// allows. It allocates only for a client it has not seen.
func (r *CompiledRoute) Allow(clientIP netip.Addr, now time.Time) bool {
	if r.limiter == nil {
		return true
	}
	if r.limiter.allow(clientIP, now.UnixNano()) {
		return true
	}
	r.rateLimited.Inc()
	return false
}

// Response is a fixed response. Its body is shared: read only.
type Response struct {
	status      int
	body        []byte
	contentType string
}

// Status is the response's status code.
func (p *Response) Status() int { return p.status }

// Body is the response body; do not modify it.
func (p *Response) Body() []byte { return p.body }

// ContentType is the Content-Type of the body; empty when there is no body.
func (p *Response) ContentType() string { return p.contentType }

// HeaderWriter is the part of a header set HeaderEditor changes: fasthttp's
// RequestHeader and ResponseHeader, and net/http's Header, are ones.
type HeaderWriter interface {
	Del(name string)
	Set(name, value string)
	Add(name, value string)
}

// HeaderEditor is a compiled HeaderEdits.
type HeaderEditor struct {
	remove []string
	set    []HeaderValue
	add    []HeaderValue
}

// Empty reports whether the editor changes nothing.
func (e *HeaderEditor) Empty() bool {
	return len(e.remove) == 0 && len(e.set) == 0 && len(e.add) == 0
}

// Apply makes the edits to h: removals, then replacements, then additions.
func (e *HeaderEditor) Apply(h HeaderWriter) {
	for _, n := range e.remove {
		h.Del(n)
	}
	for _, hv := range e.set {
		h.Set(hv.Name, hv.Value)
	}
	for _, hv := range e.add {
		h.Add(hv.Name, hv.Value)
	}
}

func compileHeaderEdits(e *HeaderEdits) HeaderEditor {
	var out HeaderEditor
	for _, n := range e.Remove {
		out.remove = append(out.remove, canonicalHeader(n))
	}
	for _, hv := range e.Set {
		out.set = append(out.set, HeaderValue{Name: canonicalHeader(hv.Name), Value: hv.Value})
	}
	for _, hv := range e.Add {
		out.add = append(out.add, HeaderValue{Name: canonicalHeader(hv.Name), Value: hv.Value})
	}
	return out
}

func canonicalHeader(name string) string { return textproto.CanonicalMIMEHeaderKey(name) }
