package tgctl

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tiergate/tiergate/control/ui"
)

// TestTop runs tgctl top against the API and the /ui dashboard's figures, scraped
// from a node's real metrics registry: the handshake rates it prints are the
// node's, a node that stops answering is shown down, and a refused token exits 6.
func TestTop(t *testing.T) {
	f := newFixture(t)
	reg := prometheus.NewRegistry()
	hs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tiergate_tls_handshakes_total", Help: "h"}, []string{"listener", "transport", "version", "resumed", "sig", "result"})
	reg.MustRegister(hs)
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()
	addr := strings.TrimPrefix(metrics.URL, "http://")
	s := ui.NewScraper(ui.ScraperConfig{Interval: time.Second, RateWindow: time.Second,
		Nodes: func(context.Context) ([]ui.NodeInfo, error) {
			return []ui.NodeInfo{{Node: "l7-a", Role: "l7d", Address: addr}, {Node: "l7-b", Role: "l7d", Address: "127.0.0.1:1"}}, nil
		}})
	mux := http.NewServeMux()
	mux.Handle("/", f.srv)
	(&ui.Handler{Source: s, Authenticate: func(ctx context.Context, tok string) (bool, error) {
		_, ok, err := f.srv.Tokens().Authenticate(ctx, tok)
		return ok, err
	}}).Register(mux)
	f.hs.Config.Handler = mux

	s.Round(context.Background())
	start := time.Now()
	hs.WithLabelValues("web", "tcp", "1.3", "false", "ecdsa", "ok").Add(200)
	hs.WithLabelValues("web", "quic", "1.3", "false", "ecdsa", "ok").Add(100)
	hs.WithLabelValues("api", "tcp", "1.3", "true", "none", "ok").Add(100)
	hs.WithLabelValues("web", "quic", "1.3", "false", "ecdsa", "keyserver_error").Add(20)
	time.Sleep(time.Second)
	s.Round(context.Background())
	elapsed := time.Since(start).Seconds()

	viewer := f.token(t, "watcher", "viewer")
	env := map[string]string{EnvAPI: f.hs.URL, EnvToken: viewer, "HOME": f.dir}
	r := f.runEnv(t, env, "", "top", "--once", "-o", "json")
	if r.code != 0 {
		t.Fatalf("top --once: %d %s", r.code, r.stderr)
	}
	var got TopFigures
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	near := func(what string, v, want float64) {
		if v < want*0.7 || v > want*1.1 {
			t.Errorf("%s = %.1f/s, want about %.1f", what, v, want)
		}
	}
	near("full", got.Full, 300/elapsed)
	near("resumed", got.Resumed, 100/elapsed)
	near("keyserver_error failures", got.Failures["keyserver_error"], 20/elapsed)
	if len(got.Transports) != 2 || got.Transports[0].Name != "tcp" || got.Transports[1].Name != "quic" {
		t.Fatalf("transports %+v, want tcp then quic", got.Transports)
	}
	near("full over TCP", got.Transports[0].Full, 200/elapsed)
	near("resumed over TCP", got.Transports[0].Resumed, 100/elapsed)
	near("full over QUIC", got.Transports[1].Full, 100/elapsed)
	if len(got.Nodes) > 0 {
		near("l7-a over QUIC", got.Nodes[0].QUIC, 100/elapsed)
	}
	if len(got.Nodes) != 2 || got.Nodes[0].Name != "l7-a" || got.Nodes[0].State != "up" || got.Nodes[1].State != "down" || got.Nodes[1].Error == "" {
		t.Errorf("nodes %+v, want l7-a up then l7-b down with its error", got.Nodes)
	}
	if len(got.Listeners) != 2 || got.Listeners[0].Name != "web" {
		t.Errorf("listeners %+v, want web first (busiest), api", got.Listeners)
	}

	r = f.runEnv(t, env, "", "top", "--count", "2", "--interval", "1s")
	t.Logf("top:\n%s", r.stdout)
	if r.code != 0 || strings.Count(r.stdout, "handshakes/s:") != 2 || !strings.Contains(r.stdout, "l7-b") || !strings.Contains(r.stdout, "LISTENER") || !strings.Contains(r.stdout, "QUIC/S") {
		t.Errorf("top --count 2: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r := f.runEnv(t, env, "", "top", "--interval", "10ms", "--once"); r.code != 2 {
		t.Errorf("--interval 10ms: exit %d, want 2", r.code)
	}
	env[EnvToken] = "watcher." + strings.Repeat("0", 64)
	if r := f.runEnv(t, env, "", "top", "--once"); r.code != 6 {
		t.Errorf("a wrong token: exit %d (%s), want 6", r.code, r.stderr)
	}
}
