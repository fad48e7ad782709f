package route

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/tiergate/tiergate/internal/config"
)

// FieldError is a problem with one field of a Config, named by its path in the
// YAML/JSON form: "listeners[0].vhosts[2].routes[1].match.path_regex".
type FieldError = config.FieldError

// Limits of the model, beyond which a Config is refused.
const (
	maxRetries        = 10
	maxWeight         = 1000
	maxMembers        = 10000
	maxRespondBody    = 64 << 10
	maxThreshold      = 100
	maxConsecutive    = 1000
	maxRouteNameLen   = 128
	maxRateClients    = 10_000_000
	maxRatePerSecond  = 1e9
	minCheckInterval  = 10 * time.Millisecond
	maxHostNameLength = 253
)

// Validate checks the whole configuration and returns every problem found, joined
// (errors.Join), each a *FieldError naming the field; nil when c can be applied.
func (c *Config) Validate() error {
	v := &validator{}
	v.config(c)
	return errors.Join(v.errs...)
}

type validator struct {
	errs []error
}

func (v *validator) add(path string, err error) {
	v.errs = append(v.errs, &FieldError{Path: path, Err: err})
}

func (v *validator) addf(path, format string, args ...any) {
	v.add(path, fmt.Errorf(format, args...))
}

func at(base, field string) string {
	if base == "" {
		return field
	}
	return base + "." + field
}

func idx(base string, i int) string { return base + "[" + strconv.Itoa(i) + "]" }

func (v *validator) config(c *Config) {
	pools := map[string]int{}
	for i := range c.Pools {
		p := &c.Pools[i]
		path := idx("pools", i)
		if p.Name != "" {
			if j, dup := pools[p.Name]; dup {
				v.addf(at(path, "name"), "%q is already the name of pools[%d]", p.Name, j)
			} else {
				pools[p.Name] = i
			}
		}
		v.pool(path, p)
	}
	listeners := map[string]int{}
	for i := range c.Listeners {
		l := &c.Listeners[i]
		path := idx("listeners", i)
		switch {
		case l.Name == "":
			v.addf(at(path, "name"), "required")
		default:
			if j, dup := listeners[l.Name]; dup {
				v.addf(at(path, "name"), "%q is already the name of listeners[%d]", l.Name, j)
			} else {
				listeners[l.Name] = i
			}
		}
		v.listener(path, l, pools)
	}
}

func (v *validator) listener(path string, l *Listener, pools map[string]int) {
	switch l.PathMode {
	case "", PathReject, PathForwardNormalized, PathForwardRaw:
	default:
		v.addf(at(path, "path_mode"), "%q: want %q (the default), %q or %q", l.PathMode, PathReject, PathForwardNormalized, PathForwardRaw)
	}
	hosts := map[string]string{} // normalised name → path of its first use
	routeNames := map[string]string{}
	for i := range l.VHosts {
		vh := &l.VHosts[i]
		vpath := idx(at(path, "vhosts"), i)
		if len(vh.Names) == 0 {
			v.addf(at(vpath, "names"), "at least one host name is required (\"*\" for any)")
		}
		for j, name := range vh.Names {
			npath := idx(at(vpath, "names"), j)
			key, err := vhostKey(name)
			if err != nil {
				v.add(npath, err)
				continue
			}
			if first, dup := hosts[key]; dup {
				v.addf(npath, "%q is already served by %s", name, first)
				continue
			}
			hosts[key] = npath
		}
		for j := range vh.Routes {
			r := &vh.Routes[j]
			rpath := idx(at(vpath, "routes"), j)
			name := r.Name
			if name == "" {
				name = defaultRouteName(i, j)
			} else if len(name) > maxRouteNameLen || !printable(name) {
				v.addf(at(rpath, "name"), "want up to %d printable characters", maxRouteNameLen)
			}
			if first, dup := routeNames[name]; dup {
				v.addf(at(rpath, "name"), "%q is already the name of %s", name, first)
			} else {
				routeNames[name] = rpath
			}
			v.route(rpath, r, pools)
		}
	}
}

func defaultRouteName(vhost, route int) string {
	return "vhosts[" + strconv.Itoa(vhost) + "].routes[" + strconv.Itoa(route) + "]"
}

// vhostKey checks a virtual host name and returns its key in the host index: the
// lower-case name; for a wildcard, the suffix with its leading dot; "*" as is.
func vhostKey(name string) (string, error) {
	if name == "*" {
		return name, nil
	}
	lower := strings.ToLower(name)
	if suffix, ok := strings.CutPrefix(lower, "*."); ok {
		if err := checkHostName(suffix); err != nil {
			return "", fmt.Errorf("wildcard %q: %w", name, err)
		}
		return "." + suffix, nil
	}
	if strings.Contains(lower, "*") {
		return "", fmt.Errorf("%q: a wildcard is \"*\" alone or a leading \"*.\"", name)
	}
	if err := checkHostName(lower); err != nil {
		return "", fmt.Errorf("%q: %w", name, err)
	}
	return lower, nil
}

// checkHostName accepts DNS names, IPv4 addresses and bracketed IPv6 addresses,
// without a port or a trailing dot.
func checkHostName(h string) error {
	if h == "" {
		return errors.New("empty host name")
	}
	if strings.HasPrefix(h, "[") {
		if !strings.HasSuffix(h, "]") {
			return errors.New("an IPv6 address is written [addr], without a port")
		}
		a, err := netip.ParseAddr(h[1 : len(h)-1])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return errors.New("not an IPv6 address")
		}
		return nil
	}
	if strings.Contains(h, ":") {
		return errors.New("host names carry no port (the port of Host is ignored in matching)")
	}
	if len(h) > maxHostNameLength {
		return fmt.Errorf("longer than %d characters", maxHostNameLength)
	}
	if strings.HasSuffix(h, ".") {
		return errors.New("no trailing dot")
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("each label is 1 to 63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q begins or ends with '-'", label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("label %q: %q is not a letter, digit, '-' or '_'", label, c)
			}
		}
	}
	return nil
}

func (v *validator) route(path string, r *Route, pools map[string]int) {
	v.match(at(path, "match"), &r.Match)
	proxy := v.action(at(path, "action"), &r.Action, pools)
	if r.Timeout < 0 {
		v.addf(at(path, "timeout"), "must not be negative")
	} else if r.Timeout > 0 && !proxy {
		v.addf(at(path, "timeout"), "only routes that proxy to a pool have a timeout")
	}
	switch {
	case r.Retries < 0 || r.Retries > maxRetries:
		v.addf(at(path, "retries"), "want 0 to %d", maxRetries)
	case r.Retries > 0 && !proxy:
		v.addf(at(path, "retries"), "only routes that proxy to a pool retry")
	}
	v.headerEdits(at(path, "request_headers"), &r.RequestHeaders)
	v.headerEdits(at(path, "response_headers"), &r.ResponseHeaders)
	if rl := r.RateLimit; rl != nil {
		rp := at(path, "rate_limit")
		if !(rl.PerSecond > 0 && rl.PerSecond <= maxRatePerSecond) {
			v.addf(at(rp, "per_second"), "want a rate above 0 and up to %g", float64(maxRatePerSecond))
		}
		if rl.Burst < 0 || rl.Burst > maxRatePerSecond {
			v.addf(at(rp, "burst"), "want 0 (the default) to %g", float64(maxRatePerSecond))
		}
		if rl.IPv6PrefixLen < 0 || rl.IPv6PrefixLen > 128 {
			v.addf(at(rp, "ipv6_prefix_len"), "want 1 to 128, or 0 for the default 64")
		}
		if rl.MaxClients < 0 || rl.MaxClients > maxRateClients {
			v.addf(at(rp, "max_clients"), "want 1 to %d, or 0 for the default", maxRateClients)
		}
	}
}

func (v *validator) match(path string, m *Match) {
	n := 0
	for _, s := range []string{m.Path, m.PathPrefix, m.PathRegex} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		v.addf(path, "path, path_prefix and path_regex exclude each other")
	}
	if m.Path != "" {
		if err := checkPath(m.Path); err != nil {
			v.add(at(path, "path"), err)
		}
	}
	if m.PathPrefix != "" {
		if err := checkPath(m.PathPrefix); err != nil {
			v.add(at(path, "path_prefix"), err)
		}
	}
	if m.PathRegex != "" {
		if _, err := compileWhole(m.PathRegex); err != nil {
			v.add(at(path, "path_regex"), err)
		}
	}
	for i, meth := range m.Methods {
		mp := idx(at(path, "methods"), i)
		switch {
		case !httpguts.ValidHeaderFieldName(meth):
			v.addf(mp, "%q is not a method token", meth)
		case strings.ToUpper(meth) != meth:
			v.addf(mp, "%q: methods are case-sensitive; write %q", meth, strings.ToUpper(meth))
		}
	}
	for i := range m.Headers {
		h := &m.Headers[i]
		hp := idx(at(path, "headers"), i)
		if !httpguts.ValidHeaderFieldName(h.Name) {
			v.addf(at(hp, "name"), "%q is not a header name", h.Name)
		}
		n := 0
		if h.Exact != "" {
			n++
		}
		if h.Regex != "" {
			n++
			if _, err := compileWhole(h.Regex); err != nil {
				v.add(at(hp, "regex"), err)
			}
		}
		if h.Present {
			n++
		}
		if n != 1 {
			v.addf(hp, "want exactly one of exact, regex and present")
		}
	}
}

// compileWhole compiles a regular expression that must match a whole string: it
// is anchored at both ends. Errors are reported on the expression as written.
func compileWhole(re string) (*regexp.Regexp, error) {
	if _, err := regexp.Compile(re); err != nil {
		return nil, err
	}
	return regexp.Compile(`^(?:` + re + `)$`)
}

// checkPath accepts an origin-form path: "/" then visible ASCII, without '?' or '#'.
func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("%q does not begin with '/'", p)
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c >= 0x7f || c == '?' || c == '#' {
			return fmt.Errorf("%q: byte %q is not allowed in a path (percent-encode it)", p, c)
		}
	}
	return nil
}

// action checks a route's action and reports whether it proxies.
func (v *validator) action(path string, a *Action, pools map[string]int) bool {
	n := 0
	if a.Pool != "" {
		n++
		if _, ok := pools[a.Pool]; !ok {
			v.addf(at(path, "pool"), "no pool is named %q", a.Pool)
		}
	}
	if rd := a.Redirect; rd != nil {
		n++
		v.redirect(at(path, "redirect"), rd)
	}
	if rs := a.Respond; rs != nil {
		n++
		rp := at(path, "respond")
		if rs.Status < 200 || rs.Status > 599 {
			v.addf(at(rp, "status"), "want 200 to 599")
		}
		if len(rs.Body) > maxRespondBody {
			v.addf(at(rp, "body"), "longer than %d bytes", maxRespondBody)
		}
		if !httpguts.ValidHeaderFieldValue(rs.ContentType) {
			v.addf(at(rp, "content_type"), "not a valid header value")
		}
	}
	if n != 1 {
		v.addf(path, "want exactly one of pool, redirect and respond")
	}
	return a.Pool != "" && n == 1
}

func (v *validator) redirect(path string, rd *Redirect) {
	switch rd.Code {
	case 0, 301, 302, 303, 307, 308:
	default:
		v.addf(at(path, "code"), "want 301, 302, 303, 307 or 308")
	}
	if rd.URL != "" {
		if rd.Scheme != "" || rd.Host != "" || rd.Path != "" || rd.StripQuery {
			v.addf(at(path, "url"), "excludes scheme, host, path and strip_query")
		}
		u, err := url.Parse(rd.URL)
		switch {
		case err != nil:
			v.add(at(path, "url"), err)
		case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
			v.addf(at(path, "url"), "%q is not an absolute http or https URL", rd.URL)
		case !visibleASCII(rd.URL):
			v.addf(at(path, "url"), "%q: only visible ASCII (percent-encode the rest)", rd.URL)
		}
		return
	}
	if rd.Scheme == "" && rd.Host == "" && rd.Path == "" && !rd.StripQuery {
		v.addf(path, "changes nothing: set url, or scheme, host, path or strip_query")
	}
	if rd.Scheme != "" && rd.Scheme != "http" && rd.Scheme != "https" {
		v.addf(at(path, "scheme"), "want http or https")
	}
	if rd.Host != "" {
		if err := checkAuthority(rd.Host); err != nil {
			v.add(at(path, "host"), err)
		}
	}
	if rd.Path != "" {
		if err := checkPath(rd.Path); err != nil {
			v.add(at(path, "path"), err)
		}
	}
}

// checkAuthority accepts host or host:port.
func checkAuthority(a string) error {
	host := a
	if h, port, err := net.SplitHostPort(a); err == nil {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("%q: port is not a number from 1 to 65535", a)
		}
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	if err := checkHostName(strings.ToLower(host)); err != nil {
		return fmt.Errorf("%q: %w", a, err)
	}
	return nil
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

func printable(s string) bool {
	for _, r := range s {
		if r < ' ' || r == 0x7f {
			return false
		}
	}
	return true
}

// fixedHeaders are the headers HeaderEdits may not touch: they frame the message or
// describe one connection, and the proxy owns them.
var fixedHeaders = map[string]bool{
	"Connection": true, "Content-Length": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

func (v *validator) headerEdits(path string, e *HeaderEdits) {
	name := func(p, n string) {
		switch {
		case !httpguts.ValidHeaderFieldName(n):
			v.addf(p, "%q is not a header name", n)
		case fixedHeaders[canonicalHeader(n)]:
			v.addf(p, "%s cannot be edited: the proxy owns it", canonicalHeader(n))
		}
	}
	for i, n := range e.Remove {
		name(idx(at(path, "remove"), i), n)
	}
	for _, list := range []struct {
		field string
		hv    []HeaderValue
	}{{"set", e.Set}, {"add", e.Add}} {
		for i, h := range list.hv {
			p := idx(at(path, list.field), i)
			name(at(p, "name"), h.Name)
			if !httpguts.ValidHeaderFieldValue(h.Value) {
				v.addf(at(p, "value"), "not a valid header value")
			}
		}
	}
}

func (v *validator) pool(path string, p *Pool) {
	if p.Name == "" {
		v.addf(at(path, "name"), "required")
	}
	switch {
	case len(p.Members) == 0:
		v.addf(at(path, "members"), "at least one member is required")
	case len(p.Members) > maxMembers:
		v.addf(at(path, "members"), "more than %d members", maxMembers)
	}
	addrs := map[string]int{}
	for i, m := range p.Members {
		mp := idx(at(path, "members"), i)
		if err := checkMemberAddr(m.Addr); err != nil {
			v.add(at(mp, "addr"), err)
		} else if j, dup := addrs[m.Addr]; dup {
			v.addf(at(mp, "addr"), "%q is already members[%d]", m.Addr, j)
		} else {
			addrs[m.Addr] = i
		}
		if m.Weight < 0 || m.Weight > maxWeight {
			v.addf(at(mp, "weight"), "want 1 to %d, or 0 for the default 1", maxWeight)
		}
	}
	switch p.Balance {
	case "", RoundRobin, LeastRequest, HashClientIP:
		if p.HashHeader != "" {
			v.addf(at(path, "hash_header"), "only balance %q hashes a header", HashHeader)
		}
	case HashHeader:
		if !httpguts.ValidHeaderFieldName(p.HashHeader) {
			v.addf(at(path, "hash_header"), "want the header to hash, got %q", p.HashHeader)
		}
	default:
		v.addf(at(path, "balance"), "%q: want %s, %s, %s or %s", p.Balance, RoundRobin, LeastRequest, HashClientIP, HashHeader)
	}
	if p.ConnectTimeout < 0 {
		v.addf(at(path, "connect_timeout"), "must not be negative")
	}
	if p.MaxConnsPerMember < 0 {
		v.addf(at(path, "max_conns_per_member"), "must not be negative")
	}
	if hc := p.HealthCheck; hc != nil {
		v.healthCheck(at(path, "health_check"), hc)
	}
	if ej := p.PassiveEjection; ej != nil {
		ep := at(path, "passive_ejection")
		if ej.ConsecutiveFailures < 0 || ej.ConsecutiveFailures > maxConsecutive {
			v.addf(at(ep, "consecutive_failures"), "want 1 to %d, or 0 for the default 5", maxConsecutive)
		}
		if ej.EjectionTime < 0 {
			v.addf(at(ep, "ejection_time"), "must not be negative")
		}
		if ej.MaxEjectedPercent < 0 || ej.MaxEjectedPercent > 100 {
			v.addf(at(ep, "max_ejected_percent"), "want 1 to 100, or 0 for the default 50")
		}
	}
}

func checkMemberAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q: port is not a number from 1 to 65535", addr)
	}
	if host == "" {
		return fmt.Errorf("%q: the host is empty", addr)
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if err := checkHostName(strings.ToLower(host)); err != nil {
		return fmt.Errorf("%q: %w", addr, err)
	}
	return nil
}

func (v *validator) healthCheck(path string, hc *HealthCheck) {
	switch hc.Type {
	case "", CheckHTTP:
		if hc.Path != "" {
			if err := checkPath(hc.Path); err != nil {
				v.add(at(path, "path"), err)
			}
		}
		if hc.Host != "" {
			if err := checkAuthority(hc.Host); err != nil {
				v.add(at(path, "host"), err)
			}
		}
		for i, s := range hc.ExpectStatus {
			if s < 100 || s > 599 {
				v.addf(idx(at(path, "expect_status"), i), "want 100 to 599")
			}
		}
	case CheckTCP:
		if hc.Path != "" || hc.Host != "" || len(hc.ExpectStatus) > 0 {
			v.addf(at(path, "type"), "a tcp check has no path, host or expect_status")
		}
	default:
		v.addf(at(path, "type"), "%q: want http or tcp", hc.Type)
	}
	if hc.Interval != 0 && hc.Interval.D() < minCheckInterval {
		v.addf(at(path, "interval"), "want at least %v", minCheckInterval)
	}
	interval := hc.Interval.D()
	if interval == 0 {
		interval = DefaultCheckInterval
	}
	switch {
	case hc.Timeout < 0:
		v.addf(at(path, "timeout"), "must not be negative")
	case hc.Timeout.D() > interval:
		v.addf(at(path, "timeout"), "%v is longer than the interval, %v", hc.Timeout, interval)
	}
	if hc.HealthyThreshold < 0 || hc.HealthyThreshold > maxThreshold {
		v.addf(at(path, "healthy_threshold"), "want 1 to %d, or 0 for the default 2", maxThreshold)
	}
	if hc.UnhealthyThreshold < 0 || hc.UnhealthyThreshold > maxThreshold {
		v.addf(at(path, "unhealthy_threshold"), "want 1 to %d, or 0 for the default 3", maxThreshold)
	}
}
