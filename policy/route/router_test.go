package route

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRouterEmpty(t *testing.T) {
	r := newTestRouter(t)
	if _, ok := r.Table().Match("l", []byte("h"), []byte("GET"), []byte("/"), nil); ok {
		t.Error("an empty router matched")
	}
	if _, err := r.Pick("p", testIP, nil, nil); !errors.Is(err, ErrUnknownPool) {
		t.Errorf("Pick on an unknown pool: %v", err)
	}
}

func TestApplyInvalidChangesNothing(t *testing.T) {
	r := newTestRouter(t)
	mustApply(t, r, validConfig())
	before := r.Table()
	bad := validConfig()
	bad.Listeners[0].VHosts[0].Routes[1].Match.PathRegex = "("
	bad.Pools = append(bad.Pools, Pool{Name: "new", Members: members("192.0.2.99:80")})
	err := r.Apply(bad)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "listeners[0].vhosts[0].routes[1].match.path_regex" {
		t.Fatalf("Apply(invalid) = %v", err)
	}
	if r.Table() != before {
		t.Fatal("the table changed")
	}
	r.mu.Lock()
	_, added := r.st.members[memberKey{"new", "192.0.2.99:80"}]
	r.mu.Unlock()
	if added {
		t.Error("state was made for a member of the refused config")
	}
}

// TestApplyKeepsState: a reload keeps the state of members and rate limiters it
// keeps, and starts afresh for what is new or changed.
func TestApplyKeepsState(t *testing.T) {
	cfg := func(addrs []string, burst int) *Config {
		c := poolOnly(Pool{
			Name: "p", Members: members(addrs...),
			PassiveEjection: &Ejection{ConsecutiveFailures: 1, EjectionTime: Duration(time.Hour)},
		})
		c.Listeners[0].VHosts[0].Routes[0].RateLimit = &RateLimit{PerSecond: 1e-6, Burst: burst}
		return c
	}
	r := newTestRouter(t)
	mustApply(t, r, cfg([]string{"192.0.2.1:80", "192.0.2.2:80", "192.0.2.3:80"}, 1))
	t1 := r.Table()
	ms := t1.Pool("p").Members()
	only := func(m *Member) func(*Member) bool { return func(x *Member) bool { return x != m } }
	m, _ := t1.Pool("p").Pick(testIP, nil, only(ms[0]))
	m.Done(ConnectFailure) // members[0] ejected
	held, _ := t1.Pool("p").Pick(testIP, nil, only(ms[1]))
	route, _ := t1.Match("l", nil, []byte("GET"), []byte("/"), nil)
	now := time.Now()
	if !route.Allow(testIP, now) || route.Allow(testIP, now) {
		t.Fatal("rate limit")
	}

	// members[2] leaves, 192.0.2.4 comes.
	mustApply(t, r, cfg([]string{"192.0.2.1:80", "192.0.2.2:80", "192.0.2.4:80"}, 1))
	t2 := r.Table()
	ms2 := t2.Pool("p").Members()
	if !ms2[0].Ejected() || ms2[1].Outstanding() != 1 || ms2[0].s != ms[0].s {
		t.Errorf("kept members lost their state: ejected %v, outstanding %d", ms2[0].Ejected(), ms2[1].Outstanding())
	}
	if ms2[2].Ejected() || ms2[2].Outstanding() != 0 {
		t.Error("new member has state")
	}
	route2, _ := t2.Match("l", nil, []byte("GET"), []byte("/"), nil)
	if route2 == route || route2.Allow(testIP, now) {
		t.Error("the rate limiter of an unchanged route was reset")
	}
	// A request picked on the old table ends after the reload, on the same state.
	held.Done(Success)
	if ms2[1].Outstanding() != 0 {
		t.Errorf("outstanding %d after Done on the old table's member", ms2[1].Outstanding())
	}
	for range 20 {
		p, err := t2.Pool("p").Pick(testIP, nil, nil)
		if err != nil || p.Addr() == "192.0.2.1:80" {
			t.Fatalf("Pick after reload: %v %v (the ejected member must stay out)", p, err)
		}
		p.Done(Success)
	}

	// The ejected member leaves: its ejection ends and the pool's count with it, so
	// when it comes back it is fresh.
	mustApply(t, r, cfg([]string{"192.0.2.2:80", "192.0.2.4:80"}, 1))
	if ps := r.st.pools["p"]; ps.ejected != 0 {
		t.Errorf("pool counts %d ejected", ps.ejected)
	}
	mustApply(t, r, cfg([]string{"192.0.2.1:80", "192.0.2.2:80", "192.0.2.4:80"}, 1))
	if r.Table().Pool("p").Members()[0].Ejected() {
		t.Error("a member that left and came back is still ejected")
	}

	// A changed rate limit starts a new bucket.
	mustApply(t, r, cfg([]string{"192.0.2.1:80"}, 2))
	route3, _ := r.Table().Match("l", nil, []byte("GET"), []byte("/"), nil)
	if !route3.Allow(testIP, now) {
		t.Error("a changed rate limit kept the old bucket")
	}
}

// TestApplyHealthCheckers: checkers start with members, keep running across
// reloads that keep them, restart when the check changes, and stop when the member
// or its check goes, or the Router closes.
func TestApplyHealthCheckers(t *testing.T) {
	s := newFlakyServer(t)
	s.status.Store(500)
	check := &HealthCheck{Interval: Duration(10 * time.Millisecond), UnhealthyThreshold: 1, HealthyThreshold: 1}
	cfg := func(extra string, hc *HealthCheck) *Config {
		ms := members(s.addr())
		if extra != "" {
			ms = append(ms, PoolMember{Addr: extra})
		}
		return poolOnly(Pool{Name: "p", Members: ms, HealthCheck: hc})
	}
	r := newTestRouter(t)
	mustApply(t, r, cfg("", check))
	b := r.Table().Pool("p")
	eventually(t, 2*time.Second, "down", func() bool { return !seenUp(b, b.Members()[0]) })
	checkerOf := func() *checker {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.st.members[memberKey{"p", s.addr()}].checker
	}
	c1 := checkerOf()

	mustApply(t, r, cfg("192.0.2.50:80", check))
	b = r.Table().Pool("p")
	if checkerOf() != c1 || b.Members()[0].Healthy() {
		t.Error("an unchanged member's checker or health was not kept")
	}
	slower := *check
	slower.Interval = Duration(20 * time.Millisecond)
	mustApply(t, r, cfg("192.0.2.50:80", &slower))
	if c2 := checkerOf(); c2 == c1 || c2 == nil || c2.cfg.interval != 20*time.Millisecond {
		t.Error("a changed check did not restart the checker")
	}
	if r.Table().Pool("p").Members()[0].Healthy() {
		t.Error("restarting the checker reset the member's health")
	}
	select {
	case <-c1.done:
	default:
		t.Error("the replaced checker still runs")
	}

	// No check any more: the checker stops and the member is up, since nothing
	// would bring it back.
	mustApply(t, r, cfg("", nil))
	if checkerOf() != nil || !r.Table().Pool("p").Members()[0].Healthy() {
		t.Error("removing the check left the checker or the member down")
	}
	n := s.healthChecks.Load()
	time.Sleep(50 * time.Millisecond)
	if got := s.healthChecks.Load(); got > n+1 {
		t.Errorf("%d checks after the check was removed", got-n)
	}

	mustApply(t, r, cfg("", check))
	eventually(t, 2*time.Second, "checked again", func() bool { return s.healthChecks.Load() > n+2 })
	r.Close()
	n = s.healthChecks.Load()
	time.Sleep(50 * time.Millisecond)
	if got := s.healthChecks.Load(); got != n {
		t.Errorf("%d checks after Close", got-n)
	}
	if err := r.Apply(cfg("", nil)); err == nil {
		t.Error("Apply after Close succeeded")
	}
}

// TestApplyAtomic swaps two configurations while requests match, pick and finish
// (run it with -race). A request sees one configuration from start to end: the
// route it matches and the pool it picks from agree, and no request fails.
func TestApplyAtomic(t *testing.T) {
	cfg := func(gen string) *Config {
		var routes []Route
		for i := range 50 {
			routes = append(routes, Route{
				Name:   fmt.Sprintf("%s-%d", gen, i),
				Match:  Match{PathPrefix: fmt.Sprintf("/r%d/", i)},
				Action: Action{Pool: "pool-" + gen},
			})
		}
		routes = append(routes, Route{Name: gen + "-respond", Action: respond(gen)})
		return &Config{
			Pools: []Pool{{
				Name: "pool-" + gen, Balance: LeastRequest,
				Members:         members("192.0.2.1:80", "192.0.2.2:80", "192.0.2."+map[string]string{"a": "3", "b": "4"}[gen]+":80"),
				PassiveEjection: &Ejection{},
			}},
			Listeners: []Listener{{Name: "l", VHosts: []VHost{{Names: []string{"example.com"}, Routes: routes}}}},
		}
	}
	r := newTestRouter(t)
	mustApply(t, r, cfg("a"))

	var stop atomic.Bool
	var served atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Go(func() {
			path := []byte(fmt.Sprintf("/r%d/x", w*7))
			for i := 0; !stop.Load(); i++ {
				tab := r.Table()
				rt, ok := tab.Match("l", []byte("example.com"), []byte("GET"), path, nil)
				if !ok {
					errs <- errors.New("no route")
					return
				}
				gen := strings.SplitN(rt.Name(), "-", 2)[0]
				if rt.Kind() != ActionProxy || rt.Pool().Name() != "pool-"+gen {
					errs <- fmt.Errorf("route %s proxies to %v", rt.Name(), rt.Pool())
					return
				}
				m, err := rt.Pool().Pick(testIP, nil, nil)
				if err != nil {
					errs <- err
					return
				}
				if i%3 == 0 {
					runtime.Gosched()
				}
				m.Done(Success)
				served.Add(1)
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	applies := 0
	for ; applies < 200 && time.Now().Before(deadline); applies++ {
		mustApply(t, r, cfg([]string{"a", "b"}[applies%2]))
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, m := range r.Table().Pool("pool-" + []string{"a", "b"}[(applies-1)%2]).Members() {
		if m.Outstanding() != 0 {
			t.Errorf("%s: %d outstanding after all requests ended", m.Addr(), m.Outstanding())
		}
	}
	t.Logf("%d applies while %d requests were served", applies, served.Load())
}

func TestRouterMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRouter(Options{Registerer: reg})
	defer r.Close()
	c := poolOnly(Pool{Name: "p", Members: members("192.0.2.1:80", "192.0.2.2:80"), PassiveEjection: &Ejection{ConsecutiveFailures: 1}})
	c.Listeners[0].VHosts[0].Routes[0].RateLimit = &RateLimit{PerSecond: 1, Burst: 1}
	if err := r.Apply(c); err != nil {
		t.Fatal(err)
	}
	_ = r.Apply(&Config{Pools: []Pool{{}}})
	m, _ := r.Pick("p", testIP, nil, nil)
	m.Done(ConnectFailure)
	held, _ := r.Pick("p", testIP, nil, nil)
	defer held.Done(Success)
	route, _ := r.Table().Match("l", nil, []byte("GET"), []byte("/"), nil)
	route.Allow(testIP, time.Now())
	route.Allow(testIP, time.Now())

	const want = `
# HELP tiergate_pool_ejections_total Pool members ejected for failing requests in a row (passive health checking), by pool.
# TYPE tiergate_pool_ejections_total counter
tiergate_pool_ejections_total{pool="p"} 1
# HELP tiergate_route_config_applies_total Routing configurations applied, by result (ok, invalid).
# TYPE tiergate_route_config_applies_total counter
tiergate_route_config_applies_total{result="invalid"} 1
tiergate_route_config_applies_total{result="ok"} 1
# HELP tiergate_route_rate_limited_total Requests refused by a route's per-client rate limit, by listener and route.
# TYPE tiergate_route_rate_limited_total counter
tiergate_route_rate_limited_total{listener="l",route="all"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tiergate_pool_ejections_total", "tiergate_route_config_applies_total", "tiergate_route_rate_limited_total"); err != nil {
		t.Error(err)
	}
	wantMembers := fmt.Sprintf(`
# HELP tiergate_pool_member_ejected 1 while the pool member is ejected for failing requests.
# TYPE tiergate_pool_member_ejected gauge
tiergate_pool_member_ejected{member="192.0.2.1:80",pool="p"} %d
tiergate_pool_member_ejected{member="192.0.2.2:80",pool="p"} %d
# HELP tiergate_pool_member_outstanding_requests Requests picked for the pool member and not finished.
# TYPE tiergate_pool_member_outstanding_requests gauge
tiergate_pool_member_outstanding_requests{member="192.0.2.1:80",pool="p"} %d
tiergate_pool_member_outstanding_requests{member="192.0.2.2:80",pool="p"} %d
`, b2i(m.Addr() == "192.0.2.1:80"), b2i(m.Addr() == "192.0.2.2:80"), b2i(held.Addr() == "192.0.2.1:80"), b2i(held.Addr() == "192.0.2.2:80"))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantMembers),
		"tiergate_pool_member_ejected", "tiergate_pool_member_outstanding_requests"); err != nil {
		t.Error(err)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
