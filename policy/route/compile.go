package route

import (
	"log/slog"
	"math/rand/v2"
	"regexp"
	"slices"
)

// Compile validates c and compiles it into a Table with state of its own: members
// start up and are never health-checked actively (passive ejection works), rate
// limiters start empty. It is for tools and tests; a server uses a Router, whose
// Apply keeps state across configurations and runs health checks.
func Compile(c *Config) (*Table, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rt := &env{log: slog.Default(), m: newMetrics()}
	t, _ := compile(c, rt, nil, nil)
	rt.current.Store(t)
	return t, nil
}

// memberKey names a member's runtime state: pool name and member address.
type memberKey struct{ pool, addr string }

// state is the runtime state a Table's compiled objects point to, by key, so that
// the next compilation can take over what it keeps.
type state struct {
	members  map[memberKey]*memberState
	checks   map[memberKey]*healthConfig // the active check each member wants
	pools    map[string]*poolState
	limiters map[string]*limiter // by listener "\x00" route name
}

// compile builds the Table of a valid Config. Runtime state found in prev under the
// same key is reused (a limiter only if its settings are the same); old, the Table
// compiled before, lends its Maglev tables to pools whose members did not change.
// It returns the Table and the state it uses.
func compile(c *Config, rt *env, prev *state, old *Table) (*Table, *state) {
	if prev == nil {
		prev = &state{}
	}
	next := &state{
		members:  map[memberKey]*memberState{},
		checks:   map[memberKey]*healthConfig{},
		pools:    map[string]*poolState{},
		limiters: map[string]*limiter{},
	}
	t := &Table{m: rt.m, listeners: map[string]*listenerTable{}, pools: map[string]*Balancer{}}
	for i := range c.Pools {
		b := compilePool(&c.Pools[i], rt, prev, next, old)
		t.pools[b.name] = b
		t.poolList = append(t.poolList, b)
	}
	for i := range c.Listeners {
		l := &c.Listeners[i]
		lt := newListenerTable(l.Name, l.PathMode, l.StrictSNI, rt.m)
		for j := range l.VHosts {
			vh := &l.VHosts[j]
			routes := make([]*CompiledRoute, 0, len(vh.Routes))
			for k := range vh.Routes {
				r := compileRoute(&vh.Routes[k], l.Name, vhostLabel(vh.Names), j, k, t.pools, rt, prev, next)
				routes = append(routes, r)
				t.routes = append(t.routes, r)
			}
			vt := newVHostTable(routes)
			for _, name := range vh.Names {
				key, _ := vhostKey(name)
				switch {
				case key == "*":
					lt.def = vt
				case key[0] == '.':
					lt.wildcard[key] = vt
				default:
					lt.exact[key] = vt
				}
			}
		}
		t.listeners[l.Name] = lt
	}
	return t, next
}

func compilePool(p *Pool, rt *env, prev, next *state, old *Table) *Balancer {
	ps := prev.pools[p.Name]
	if ps == nil {
		ps = &poolState{name: p.Name}
	}
	ps.mu.Lock()
	ps.size = len(p.Members)
	ps.mu.Unlock()
	next.pools[p.Name] = ps

	b := &Balancer{
		name:              p.Name,
		hashHeader:        canonicalHeader(p.HashHeader),
		connectTimeout:    p.ConnectTimeout.D(),
		maxConnsPerMember: p.MaxConnsPerMember,
		ejection:          compileEjection(p.PassiveEjection),
		rt:                rt,
		draw:              rand.IntN,
	}
	setDefault(&b.connectTimeout, DefaultConnectTimeout)
	setDefault(&b.maxConnsPerMember, DefaultMaxConnsPerMember)
	switch p.Balance {
	case LeastRequest:
		b.policy = policyLeastRequest
	case HashClientIP:
		b.policy = policyHashClientIP
	case HashHeader:
		b.policy = policyHashHeader
	default:
		b.policy = policyRoundRobin
	}
	b.rr.Store(rand.Uint64())
	hc := compileHealthCheck(p.HealthCheck)
	addrs := make([]string, len(p.Members))
	weights := make([]int, len(p.Members))
	for i, pm := range p.Members {
		key := memberKey{p.Name, pm.Addr}
		s := prev.members[key]
		if s == nil {
			s = &memberState{pool: p.Name, addr: pm.Addr, ps: ps, rt: rt}
		}
		next.members[key] = s
		next.checks[key] = hc
		m := &Member{addr: pm.Addr, weight: max(1, pm.Weight), index: i, ejection: b.ejection, s: s}
		b.members = append(b.members, m)
		addrs[i], weights[i] = m.addr, m.weight
	}
	if b.policy == policyHashClientIP || b.policy == policyHashHeader {
		if ob := old.poolOrNil(p.Name); ob != nil && ob.maglev != nil && sameMembers(ob.members, addrs, weights) {
			b.maglev = ob.maglev
		} else {
			b.maglev = buildMaglev(addrs, weights, maglevSize(len(addrs)))
		}
	}
	b.refresh()
	return b
}

func (t *Table) poolOrNil(name string) *Balancer {
	if t == nil {
		return nil
	}
	return t.pools[name]
}

func sameMembers(ms []*Member, addrs []string, weights []int) bool {
	if len(ms) != len(addrs) {
		return false
	}
	for i, m := range ms {
		if m.addr != addrs[i] || m.weight != weights[i] {
			return false
		}
	}
	return true
}

func compileRoute(r *Route, listener, vhost string, vi, ri int, pools map[string]*Balancer, rt *env, prev, next *state) *CompiledRoute {
	cr := &CompiledRoute{
		name:       r.Name,
		listener:   listener,
		vhost:      vhost,
		path:       r.Match.Path,
		pathPrefix: r.Match.PathPrefix,
		methods:    slices.Clone(r.Match.Methods),
		timeout:    r.Timeout.D(),
		retries:    r.Retries,
	}
	if cr.name == "" {
		cr.name = defaultRouteName(vi, ri)
	}
	if re := r.Match.PathRegex; re != "" {
		cr.pathRegex = mustCompileWhole(re)
		cr.regexLit, _ = regexp.MustCompile(re).LiteralPrefix()
	}
	for _, h := range r.Match.Headers {
		hm := headerMatch{name: canonicalHeader(h.Name), present: h.Present, invert: h.Invert}
		switch {
		case h.Regex != "":
			hm.regex = mustCompileWhole(h.Regex)
		case h.Exact != "":
			hm.exact = []byte(h.Exact)
		}
		cr.headers = append(cr.headers, hm)
	}
	a := &r.Action
	switch {
	case a.Pool != "":
		cr.kind = ActionProxy
		cr.pool = pools[a.Pool]
		setDefault(&cr.timeout, DefaultTimeout)
	case a.Redirect != nil:
		cr.kind = ActionRedirect
		rd := a.Redirect
		cr.redirect = redirect{code: rd.Code, url: rd.URL, scheme: rd.Scheme, host: rd.Host, path: rd.Path, stripQuery: rd.StripQuery}
		setDefault(&cr.redirect.code, DefaultRedirectCode)
	case a.Respond != nil:
		cr.kind = ActionRespond
		rs := a.Respond
		cr.respond = &Response{status: rs.Status, body: []byte(rs.Body), contentType: rs.ContentType}
		if rs.Body != "" && rs.ContentType == "" {
			cr.respond.contentType = defaultContentType
		}
	}
	cr.reqHeaders = compileHeaderEdits(&r.RequestHeaders)
	cr.respHeaders = compileHeaderEdits(&r.ResponseHeaders)
	if r.RateLimit != nil {
		key := listener + "\x00" + cr.name
		l := newLimiter(r.RateLimit)
		if pl := prev.limiters[key]; pl != nil && pl.cfg == l.cfg {
			l = pl
		}
		next.limiters[key] = l
		cr.limiter = l
		cr.rateLimited = rt.m.rateLimited.WithLabelValues(listener, cr.name)
	}
	return cr
}

// mustCompileWhole is compileWhole for expressions Validate accepted.
func mustCompileWhole(re string) *regexp.Regexp {
	r, err := compileWhole(re)
	if err != nil {
		panic("route: regular expression passed validation but does not compile: " + err.Error())
	}
	return r
}
