package route

import (
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// env is what the compiled state of one Router (or one Compile) shares: a
// generation counter that every change of a member's availability raises, the
// current Table, whose pools are refreshed at once on such a change, logs and
// metrics.
type env struct {
	gen     atomic.Uint64
	current atomic.Pointer[Table]
	log     *slog.Logger
	m       *metrics
}

// changed records a change in some member's availability and recomputes the
// current pools' view of it, so that requests rarely have to.
func (rt *env) changed() {
	rt.gen.Add(1)
	if t := rt.current.Load(); t != nil {
		for _, b := range t.poolList {
			b.availability()
		}
	}
}

type metrics struct {
	healthChecks *prometheus.CounterVec
	transitions  *prometheus.CounterVec
	ejections    *prometheus.CounterVec
	rateLimited  *prometheus.CounterVec
	applies      *prometheus.CounterVec
	ambiguous    *prometheus.CounterVec
	misdirected  *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		healthChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_pool_health_checks_total",
			Help: "Active health checks of pool members, by pool and result (ok, fail).",
		}, []string{"pool", "result"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_pool_health_transitions_total",
			Help: "Pool members going down or coming back by active health checks, by pool and new state (up, down).",
		}, []string{"pool", "state"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_pool_ejections_total",
			Help: "Pool members ejected for failing requests in a row (passive health checking), by pool.",
		}, []string{"pool"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_route_rate_limited_total",
			Help: "Requests refused by a route's per-client rate limit, by listener and route.",
		}, []string{"listener", "route"}),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_route_config_applies_total",
			Help: "Routing configurations applied, by result (ok, invalid).",
		}, []string{"result"}),
		ambiguous: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_route_ambiguous_paths_total",
			Help: "Requests whose path as sent was ambiguous (route.CheckPath), by listener and what became of them: refused (400), normalized (routed and forwarded normalised) or forwarded (as sent, path_mode forward_raw).",
		}, []string{"listener", "result"}),
		misdirected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tiergate_route_misdirected_total",
			Help: "Requests answered 421 because their host was not their connection's TLS server name (strict_sni), by listener.",
		}, []string{"listener"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.healthChecks, m.transitions, m.ejections, m.rateLimited, m.applies, m.ambiguous, m.misdirected}
}

var (
	memberHealthyDesc = prometheus.NewDesc("tiergate_pool_member_healthy",
		"1 when the pool member passes its active health checks (or has none), 0 when it is down.",
		[]string{"pool", "member"}, nil)
	memberEjectedDesc = prometheus.NewDesc("tiergate_pool_member_ejected",
		"1 while the pool member is ejected for failing requests.",
		[]string{"pool", "member"}, nil)
	memberOutstandingDesc = prometheus.NewDesc("tiergate_pool_member_outstanding_requests",
		"Requests picked for the pool member and not finished.",
		[]string{"pool", "member"}, nil)
)

// memberCollector reports the state of a Router's current members at each scrape.
type memberCollector struct{ r *Router }

func (c memberCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- memberHealthyDesc
	ch <- memberEjectedDesc
	ch <- memberOutstandingDesc
}

func (c memberCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.mu.Lock()
	states := make([]*memberState, 0, len(c.r.st.members))
	for _, s := range c.r.st.members {
		states = append(states, s)
	}
	c.r.mu.Unlock()
	for _, s := range states {
		ch <- prometheus.MustNewConstMetric(memberHealthyDesc, prometheus.GaugeValue, boolFloat(!s.down.Load()), s.pool, s.addr)
		ch <- prometheus.MustNewConstMetric(memberEjectedDesc, prometheus.GaugeValue, boolFloat(s.ejected.Load()), s.pool, s.addr)
		ch <- prometheus.MustNewConstMetric(memberOutstandingDesc, prometheus.GaugeValue, float64(s.outstanding.Load()), s.pool, s.addr)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var _ prometheus.Collector = memberCollector{}
