package route

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// HeaderFunc returns the first value of the request header named name (given in
// canonical form, "X-Api-Key"), and nil when the request has none; a header present
// with an empty value is a non-nil empty slice. fasthttp's RequestHeader.Peek is one.
type HeaderFunc func(name string) []byte

// Table is a compiled Config: immutable, safe for any number of goroutines, read on
// the request path without locks. Get one from Router.Table (or Compile).
type Table struct {
	m         *metrics
	listeners map[string]*listenerTable
	pools     map[string]*Balancer
	poolList  []*Balancer
	routes    []*CompiledRoute
}

type listenerTable struct {
	name     string
	exact    map[string]*vhostTable
	wildcard map[string]*vhostTable // by suffix with its leading dot: ".example.com"
	def      *vhostTable

	pathMode  string // PathReject, PathForwardNormalized or PathForwardRaw
	strictSNI bool

	pathRefused, pathNormalized, pathForwarded, misdirected prometheus.Counter
}

// newListenerTable returns the table of listener name, with no virtual host yet.
func newListenerTable(name, pathMode string, strictSNI bool, m *metrics) *listenerTable {
	if pathMode == "" {
		pathMode = PathReject
	}
	return &listenerTable{name: name, exact: map[string]*vhostTable{}, wildcard: map[string]*vhostTable{},
		pathMode: pathMode, strictSNI: strictSNI,
		pathRefused:    m.ambiguous.WithLabelValues(name, "refused"),
		pathNormalized: m.ambiguous.WithLabelValues(name, "normalized"),
		pathForwarded:  m.ambiguous.WithLabelValues(name, "forwarded"),
		misdirected:    m.misdirected.WithLabelValues(name),
	}
}

// Screen checks a request on listener before it is routed, as the listener's
// StrictSNI and PathMode say. host is the request's host (Host, or an absolute
// target's authority; any case, port allowed), sni the TLS server name of its
// connection ("" for none), rawPath its path as sent (fasthttp's
// URI().PathOriginal()). It returns 0 and nil to route the request as it is; 0 and
// a path (appended to buf) to route and forward instead of rawPath, the normalised
// path of forward_normalized; or the status to answer: 421 (strict_sni) or 400. A
// listener the Table does not route has the defaults. It allocates nothing unless
// it normalises a path into a buf too small.
func (t *Table) Screen(listener string, host []byte, sni string, rawPath, buf []byte) (status int, path []byte) {
	lt := t.listeners[listener]
	if lt == nil {
		lt = newListenerTable(listener, "", false, t.m)
	}
	if lt.strictSNI && !sameHost(host, sni) {
		lt.misdirected.Inc()
		return 421, nil
	}
	v := CheckPath(rawPath)
	switch {
	case v == PathClean:
		return 0, nil
	case lt.pathMode == PathForwardRaw:
		lt.pathForwarded.Inc()
		return 0, nil
	case lt.pathMode == PathForwardNormalized && v == PathResolvable:
		lt.pathNormalized.Inc()
		path, _ = NormalizePath(buf[:0], rawPath)
		return 0, path
	}
	lt.pathRefused.Inc()
	return 400, nil
}

// sameHost reports whether host, without its port, is the server name sni, in any
// case and either with a trailing dot. An empty sni matches nothing.
func sameHost(host []byte, sni string) bool {
	if sni == "" {
		return false
	}
	var hb, sb [maxHostLen]byte
	h, ok := normalizeHost(hb[:0], host)
	if !ok {
		return false
	}
	s, ok := normalizeHost(sb[:0], []byte(sni))
	return ok && string(h) == string(s)
}

// vhostTable holds a virtual host's routes in order, and the indexes that find the
// first match without trying them all: routes with an exact path by path; prefix
// routes by prefix (one lookup per prefix length in use), and with them regular
// expressions whose matches all begin with a literal, by that literal; the rest
// (other regular expressions, no path condition) in a list scanned in order. Each
// index holds route numbers in ascending order, and a candidate is only taken if
// it comes before the best found so far, so the result is the first matching route
// in configuration order.
type vhostTable struct {
	routes     []*CompiledRoute
	exact      map[string][]int32
	prefix     map[string][]int32
	prefixLens []prefixLen // ascending by n
	scan       []int32
}

// prefixLen describes the prefixes of one length n, so that a path's prefix of
// that length is only looked up when it may be one: when a route with a prefix this
// long comes before the best match so far, and when the path's byte at n-1 ends
// some prefix this long (most end with '/').
type prefixLen struct {
	n     int
	first int32     // the smallest route index among them
	last  [4]uint64 // bit set of their last bytes
}

func (p *prefixLen) mayEnd(c byte) bool { return p.last[c>>6]&(1<<(c&63)) != 0 }

// Match returns the first route of the virtual host serving host on the listener
// that matches the request, and false when none does (the caller answers 404).
// host is the Host header (any case, port allowed); method and path are the
// request's, path without its query and in the form routes are written in
// (normalised: fasthttp's URI().Path()); header looks request headers up. It
// allocates nothing.
func (t *Table) Match(listener string, host, method, path []byte, header HeaderFunc) (*CompiledRoute, bool) {
	lt := t.listeners[listener]
	if lt == nil {
		return nil, false
	}
	vh := lt.vhost(host)
	if vh == nil {
		return nil, false
	}
	return vh.match(method, path, header)
}

// maxHostLen bounds the Host values looked up; longer ones go to the default host.
const maxHostLen = 255

func (lt *listenerTable) vhost(host []byte) *vhostTable {
	var buf [maxHostLen]byte
	h, ok := normalizeHost(buf[:0], host)
	if !ok {
		return lt.def
	}
	if vh := lt.exact[string(h)]; vh != nil {
		return vh
	}
	if len(lt.wildcard) > 0 {
		// The longest suffix first: "a.b.example.com" tries ".b.example.com",
		// ".example.com", ".com".
		for i := 1; i < len(h); i++ {
			if h[i] == '.' {
				if vh := lt.wildcard[string(h[i:])]; vh != nil {
					return vh
				}
			}
		}
	}
	return lt.def
}

// normalizeHost appends host to dst in lower case, without its port or a trailing
// dot. It returns false when the result would not fit in dst's capacity.
func normalizeHost(dst, host []byte) ([]byte, bool) {
	end := len(host)
	if len(host) > 0 && host[0] == '[' {
		if i := indexByte(host, ']'); i >= 0 {
			end = i + 1
		}
	} else if i := indexByte(host, ':'); i >= 0 {
		end = i
	}
	host = host[:end]
	if len(host) > 0 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	if len(host) > cap(dst)-len(dst) {
		return dst, false
	}
	for _, c := range host {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst, true
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func (v *vhostTable) match(method, path []byte, header HeaderFunc) (*CompiledRoute, bool) {
	best := int32(len(v.routes))
	if len(v.exact) > 0 {
		for _, i := range v.exact[string(path)] {
			if r := v.routes[i]; r.matchMethod(method) && r.matchHeaders(header) {
				best = i
				break
			}
		}
	}
	for k := range v.prefixLens {
		pl := &v.prefixLens[k]
		n := pl.n
		if n > len(path) {
			break
		}
		if pl.first >= best || !pl.mayEnd(path[n-1]) {
			continue
		}
		for _, i := range v.prefix[string(path[:n])] {
			if i >= best {
				break
			}
			if r := v.routes[i]; r.matchMethod(method) && r.matchPathRegex(path) && r.matchHeaders(header) {
				best = i
				break
			}
		}
	}
	for _, i := range v.scan {
		if i >= best {
			break
		}
		if r := v.routes[i]; r.matchMethod(method) && r.matchPathRegex(path) && r.matchHeaders(header) {
			best = i
			break
		}
	}
	if int(best) == len(v.routes) {
		return nil, false
	}
	return v.routes[best], true
}

func newVHostTable(routes []*CompiledRoute) *vhostTable {
	v := &vhostTable{routes: routes}
	for i, r := range routes {
		n := int32(i)
		switch {
		case r.path != "":
			if v.exact == nil {
				v.exact = map[string][]int32{}
			}
			v.exact[r.path] = append(v.exact[r.path], n)
		case r.pathPrefix != "" || r.regexLit != "":
			// A regular expression whose matches all begin with a literal is a
			// candidate for paths with that prefix only.
			p := r.pathPrefix
			if p == "" {
				p = r.regexLit
			}
			if v.prefix == nil {
				v.prefix = map[string][]int32{}
			}
			v.prefix[p] = append(v.prefix[p], n)
			k := slices.IndexFunc(v.prefixLens, func(pl prefixLen) bool { return pl.n == len(p) })
			if k < 0 {
				k = len(v.prefixLens)
				v.prefixLens = append(v.prefixLens, prefixLen{n: len(p), first: n})
			}
			c := p[len(p)-1]
			v.prefixLens[k].last[c>>6] |= 1 << (c & 63)
		default:
			v.scan = append(v.scan, n)
		}
	}
	slices.SortFunc(v.prefixLens, func(a, b prefixLen) int { return a.n - b.n })
	return v
}

// Listeners returns the names of the listeners the table routes, sorted.
func (t *Table) Listeners() []string {
	names := make([]string, 0, len(t.listeners))
	for n := range t.listeners {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Routes returns every route, by listener, virtual host and order.
func (t *Table) Routes() []*CompiledRoute { return slices.Clone(t.routes) }

// Pool returns the pool named name, or nil.
func (t *Table) Pool(name string) *Balancer { return t.pools[name] }

// Pools returns every pool, in configuration order.
func (t *Table) Pools() []*Balancer { return slices.Clone(t.poolList) }

// vhostLabel names a virtual host in logs: its first name.
func vhostLabel(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return strings.ToLower(names[0])
}
