package ui

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestAssetsPinned(t *testing.T) {
	for name, want := range UPlotSHA256 {
		data, err := assets.ReadFile("assets/" + name)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("assets/%s: SHA-256 %s, want %s (uplot %s)", name, got, want, UPlotVersion)
		}
	}
	for _, f := range []string{"index.html", "app.js", "app.css", "uPlot.LICENSE"} {
		if _, err := assets.ReadFile("assets/" + f); err != nil {
			t.Error(err)
		}
	}
}

func TestQuantile(t *testing.T) {
	bs := []bucket{{0.1, 50}, {0.01, 0}, {1, 100}, {math.Inf(1), 100}}
	if got := quantile(0.5, bs); math.Abs(got-0.1) > 1e-9 {
		t.Errorf("p50 = %v, want 0.1", got)
	}
	if got := quantile(0.75, bs); math.Abs(got-0.55) > 1e-9 {
		t.Errorf("p75 = %v, want 0.55 (halfway through the bucket 0.1 to 1)", got)
	}
	if got := quantile(0.99, []bucket{{1, 10}, {math.Inf(1), 100}}); got != 1 {
		t.Errorf("p99 in +Inf bucket = %v, want the highest finite bound 1", got)
	}
	if got := quantile(0.5, []bucket{{math.Inf(1), 7}}); !math.IsNaN(got) {
		t.Errorf("+Inf alone: %v, want NaN", got)
	}
	if got := quantile(0.5, []bucket{{1, 0}, {math.Inf(1), 0}}); !math.IsNaN(got) {
		t.Errorf("no observations: %v, want NaN", got)
	}
}

func TestPromQL(t *testing.T) {
	q := Panels[3].Queries[0] // failures by transport and reason
	if got, want := q.PromQL("instance", 10*time.Second), `sum by (transport, result) (rate(tiergate_tls_handshakes_total{result!="ok"}[10s]))`; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	q = Panels[5].Queries[1]
	if got, want := q.PromQL("instance", 30*time.Second), `histogram_quantile(0.99, sum by (le) (rate(tiergate_tls_handshake_seconds_bucket[30s])))`; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	q = Panels[5].Queries[2]
	if got, want := q.PromQL("instance", 30*time.Second), `histogram_quantile(0.99, sum by (le, transport) (rate(tiergate_tls_handshake_seconds_bucket[30s])))`; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	q = Panels[1].Queries[0]
	if got, want := q.PromQL("instance", 10*time.Second), `sum by (instance, transport, resumed) (rate(tiergate_tls_handshakes_total{result="ok"}[10s]))`; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

// node is a node's /metrics served from a real registry.
type node struct {
	srv        *httptest.Server
	handshakes *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	inflight   prometheus.Gauge
	expiry     *prometheus.GaugeVec
}

func newNode(t *testing.T) *node {
	reg := prometheus.NewRegistry()
	n := &node{
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tiergate_tls_handshakes_total", Help: "h"}, []string{"listener", "transport", "version", "resumed", "sig", "result"}),
		latency:    prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tiergate_tls_handshake_seconds", Help: "h", Buckets: []float64{.001, .01, .1, 1}}, []string{"listener", "transport", "resumed"}),
		inflight:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "tiergate_keyserver_inflight", Help: "h"}),
		expiry:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: CertMetric, Help: "h"}, []string{"name", "subject"}),
	}
	reg.MustRegister(n.handshakes, n.latency, n.inflight, n.expiry)
	n.srv = httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *node) addr() string { return strings.TrimPrefix(n.srv.URL, "http://") }

func series(t *testing.T, d *Dashboard, panel, name string) []*float64 {
	t.Helper()
	for _, p := range d.Panels {
		if p.ID != panel {
			continue
		}
		for _, s := range p.Series {
			if s.Name == name {
				return s.Values
			}
		}
		var names []string
		for _, s := range p.Series {
			names = append(names, s.Name)
		}
		t.Fatalf("panel %s has no series %q: %q", panel, name, names)
	}
	t.Fatalf("no panel %s", panel)
	return nil
}

func val(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// TestScraperRates scrapes two real registries over rounds on a test clock and
// checks the rates, per node and cluster-wide, a counter reset, a node that
// stops answering and then is lost, the quantile and the certificates.
func TestScraperRates(t *testing.T) {
	a, b := newNode(t), newNode(t)
	var mu sync.Mutex
	nodes := []NodeInfo{{Node: "l7-a", Role: "l7d", Address: a.addr()}, {Node: "l7-b", Role: "l7d", Address: b.addr()}}
	s := NewScraper(ScraperConfig{Interval: time.Second, RateWindow: time.Second, History: 10 * time.Second,
		Nodes: func(context.Context) ([]NodeInfo, error) {
			mu.Lock()
			defer mu.Unlock()
			return append([]NodeInfo(nil), nodes...), nil
		}})
	clock := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return clock }
	ctx := context.Background()
	a.expiry.WithLabelValues("site", "CN=site").Set(float64(clock.Add(10 * 24 * time.Hour).Unix()))
	b.expiry.WithLabelValues("api", "CN=api").Set(float64(clock.Add(40 * 24 * time.Hour).Unix()))
	full := func(n *node) prometheus.Counter {
		return n.handshakes.WithLabelValues("web", "tcp", "1.3", "false", "ecdsa", "ok")
	}
	quic := func(n *node) prometheus.Counter {
		return n.handshakes.WithLabelValues("web", "quic", "1.3", "false", "ecdsa", "ok")
	}
	res := func(n *node) prometheus.Counter {
		return n.handshakes.WithLabelValues("web", "tcp", "1.3", "true", "none", "ok")
	}
	fail := func(n *node) prometheus.Counter {
		return n.handshakes.WithLabelValues("web", "quic", "1.3", "false", "ecdsa", "keyserver_timeout")
	}
	step := func() { s.Round(ctx); clock = clock.Add(time.Second) }
	step() // round 0
	for i := 0; i < 3; i++ {
		full(a).Add(100)
		res(a).Add(50)
		full(b).Add(30)
		quic(b).Add(20)
		fail(b).Add(2)
		for j := 0; j < 10; j++ {
			a.latency.WithLabelValues("web", "tcp", "false").Observe(0.005) // in (0.001, 0.01]
		}
		b.latency.WithLabelValues("web", "quic", "false").Observe(0.5) // in (0.1, 1]
		step()                                                         // rounds 1..3
	}
	d, err := s.Dashboard(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Times) != 4 {
		t.Fatalf("%d points, want 4", len(d.Times))
	}
	if v := series(t, d, "handshakes", "TCP full"); v[0] != nil || val(v[3]) != 130 {
		t.Errorf("full handshakes/s over TCP: %v…%v, want none then 130", v[0], val(v[3]))
	}
	if v := series(t, d, "handshakes", "QUIC full"); val(v[3]) != 20 {
		t.Errorf("full handshakes/s over QUIC: %v, want 20", val(v[3]))
	}
	if v := series(t, d, "handshakes", "TCP resumed"); val(v[3]) != 50 {
		t.Errorf("resumed handshakes/s %v, want 50", val(v[3]))
	}
	if v := series(t, d, "handshakes_node", "l7-b TCP full"); val(v[2]) != 30 {
		t.Errorf("l7-b full over TCP %v, want 30", val(v[2]))
	}
	if v := series(t, d, "handshakes_node", "l7-b QUIC full"); val(v[2]) != 20 {
		t.Errorf("l7-b full over QUIC %v, want 20", val(v[2]))
	}
	if v := series(t, d, "handshake_latency", "p99 QUIC"); !(val(v[3]) > 0.1 && val(v[3]) <= 1) {
		t.Errorf("p99 over QUIC %v, want within (100ms, 1s]", val(v[3]))
	}
	if v := series(t, d, "handshake_latency", "p99 TCP"); !(val(v[3]) > 0.001 && val(v[3]) <= 0.01) {
		t.Errorf("p99 over TCP %v, want within (1ms, 10ms]", val(v[3]))
	}
	if v := series(t, d, "handshake_failures", "QUIC keyserver_timeout"); val(v[3]) != 2 {
		t.Errorf("failures %v, want 2", val(v[3]))
	}
	if v := series(t, d, "handshake_failures_node", "l7-b keyserver_timeout"); val(v[3]) != 2 {
		t.Errorf("l7-b's failures %v, want 2", val(v[3]))
	}
	if v := series(t, d, "handshake_latency", "p50"); !(val(v[3]) > 0.001 && val(v[3]) <= 0.01) {
		t.Errorf("p50 %v, want within (1ms, 10ms]", val(v[3]))
	}
	if len(d.Certificates) != 2 || d.Certificates[0].Name != "site" || d.Certificates[0].DaysLeft != 10 || d.Certificates[0].Node != "l7-a" {
		t.Errorf("certificates %+v, want site (10 days, l7-a) first", d.Certificates)
	}

	// l7-b restarts: its counters start again from 0.
	b.srv.Close()
	step() // round 4: l7-b does not answer
	d, _ = s.Dashboard(ctx, time.Hour)
	if tg := d.Targets[1]; tg.Node != "l7-b" || tg.Up || tg.Error == "" {
		t.Errorf("target %+v, want l7-b down with its error", tg)
	}
	if v := series(t, d, "handshakes_node", "l7-b TCP full"); v[4] != nil {
		t.Errorf("l7-b full at a failed scrape: %v, want a gap", val(v[4]))
	}
	mu.Lock()
	nodes[1].Lost = true
	mu.Unlock()
	step()
	d, _ = s.Dashboard(ctx, time.Hour)
	if tg := d.Targets[1]; !tg.Lost || len(d.Certificates) != 1 {
		t.Errorf("target %+v, certificates %d: want l7-b lost and its certificate gone", tg, len(d.Certificates))
	}
	// History bounds the rounds kept.
	for i := 0; i < 30; i++ {
		step()
	}
	if n := len(s.rounds); n != s.maxRounds() {
		t.Errorf("%d rounds kept, want %d", n, s.maxRounds())
	}
	d, _ = s.Dashboard(ctx, 3*time.Second)
	if len(d.Times) != 4 {
		t.Errorf("a 3s window: %d points, want 4", len(d.Times))
	}
}

func TestScraperCounterReset(t *testing.T) {
	a := newNode(t)
	s := NewScraper(ScraperConfig{Interval: time.Second, RateWindow: time.Second,
		Nodes: func(context.Context) ([]NodeInfo, error) { return []NodeInfo{{Node: "a", Address: a.addr()}}, nil }})
	clock := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return clock }
	c := a.handshakes.WithLabelValues("web", "tcp", "1.3", "false", "rsa", "ok")
	c.Add(1000)
	s.Round(context.Background())
	clock = clock.Add(time.Second)
	// A new registry at the same address would be a restart; fake the reset by
	// replacing the counter's family.
	a.handshakes.Reset()
	a.handshakes.WithLabelValues("web", "tcp", "1.3", "false", "rsa", "ok").Add(7)
	s.Round(context.Background())
	d, _ := s.Dashboard(context.Background(), time.Hour)
	if v := series(t, d, "handshakes", "TCP full"); val(v[1]) != 7 {
		t.Errorf("after a reset: %v/s, want 7 (the new count), not negative", val(v[1]))
	}
	// Between two rounds the dashboard is evaluated once; a round makes a new one.
	if again, _ := s.Dashboard(context.Background(), time.Hour); again != d {
		t.Error("the same round and window evaluated again")
	}
	clock = clock.Add(time.Second)
	s.Round(context.Background())
	if next, _ := s.Dashboard(context.Background(), time.Hour); next == d || len(next.Times) != 3 {
		t.Errorf("after a round: the cached dashboard, or %d points (want 3)", len(next.Times))
	}
}

func TestDashboardAuth(t *testing.T) {
	a := newNode(t)
	s := NewScraper(ScraperConfig{Nodes: func(context.Context) ([]NodeInfo, error) { return []NodeInfo{{Node: "a", Address: a.addr()}}, nil }})
	s.Round(context.Background())
	h := &Handler{Source: s, Authenticate: func(_ context.Context, tok string) (bool, error) { return tok == "viewer.good", nil }}
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	do := func(path, tok string) *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for _, tok := range []string{"", "viewer.bad"} {
		if r := do("/v1/ui/dashboard", tok); r.StatusCode != 401 {
			t.Errorf("token %q: %s, want 401", tok, r.Status)
		}
	}
	r := do("/v1/ui/dashboard?window=60", "viewer.good")
	var d Dashboard
	if err := json.NewDecoder(r.Body).Decode(&d); err != nil || r.StatusCode != 200 || len(d.Panels) != len(Panels) || len(d.Targets) != 1 {
		t.Errorf("good token: %s %v, %d panels, targets %+v", r.Status, err, len(d.Panels), d.Targets)
	}
	if r := do("/v1/ui/dashboard?window=99999", "viewer.good"); r.StatusCode != 400 {
		t.Errorf("window over the history: %s, want 400", r.Status)
	}
	for _, p := range []string{"/ui", "/ui/", "/ui/assets/app.js", "/ui/assets/uPlot.iife.min.js"} {
		if r := do(p, ""); r.StatusCode != 200 {
			t.Errorf("%s: %s", p, r.Status)
		}
	}
	if r := do("/ui", ""); !strings.Contains(r.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Errorf("the page's CSP %q", r.Header.Get("Content-Security-Policy"))
	}
}

func TestTrim(t *testing.T) {
	var ss []Series
	for i := range MaxSeriesPerPanel + 5 {
		ss = append(ss, Series{Name: strconv.Itoa(i), Values: []*float64{ptr(float64(i)), nil}})
	}
	ss[0].Values[1] = ptr(1000) // the busiest now, though first by name
	d := &Dashboard{Panels: []PanelData{{Series: ss}}}
	d.trim()
	p := d.Panels[0]
	if len(p.Series) != MaxSeriesPerPanel || p.Omitted != 5 || p.Series[0].Name != "0" || p.Series[1].Name != "6" {
		t.Errorf("%d series kept, %d omitted, first %s %s: want %d, 5, 0 then 6", len(p.Series), p.Omitted, p.Series[0].Name, p.Series[1].Name, MaxSeriesPerPanel)
	}
}

// TestScraperMetricsAddress scrapes a node where its status says its metrics are
// (host:port or a URL), not at its service address: a keyserverd's.
func TestScraperMetricsAddress(t *testing.T) {
	a, b := newNode(t), newNode(t)
	a.inflight.Set(3)
	b.inflight.Set(5)
	s := NewScraper(ScraperConfig{Interval: time.Second,
		Nodes: func(context.Context) ([]NodeInfo, error) {
			return []NodeInfo{
				{Node: "ks-1", Role: "keyserverd", Address: "127.0.0.1:1", Metrics: a.addr()},
				{Node: "ks-2", Role: "keyserverd", Address: "127.0.0.1:1", Metrics: b.srv.URL + "/metrics"},
			}, nil
		}})
	s.Round(context.Background())
	d, _ := s.Dashboard(context.Background(), time.Hour)
	for _, tg := range d.Targets {
		if !tg.Up {
			t.Errorf("%s (%s) not scraped: %s", tg.Node, tg.URL, tg.Error)
		}
	}
	if v := series(t, d, "keyserver_inflight", "ks-1"); val(v[0]) != 3 {
		t.Errorf("ks-1 in flight %v, want 3", val(v[0]))
	}
	if v := series(t, d, "keyserver_inflight", "ks-2"); val(v[0]) != 5 {
		t.Errorf("ks-2 in flight %v, want 5", val(v[0]))
	}
}
