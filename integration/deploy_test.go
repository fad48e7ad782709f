package integration

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tiergate/tiergate/keyserver/keyserverd"
	"github.com/tiergate/tiergate/l4/l4d"
	"github.com/tiergate/tiergate/l7/l7d"
)

var metricName = regexp.MustCompile(`tiergate_[a-z0-9_]+`)

// definedMetrics returns the metric names the project's Go sources define (as
// string literals), tests and the benchmark programs (which read them) left out.
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	lit := regexp.MustCompile(`"(tiergate_[a-z0-9_]+)"`)
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "integration" || path == filepath.Join("..", "bench")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric names in the sources", len(names))
	}
	return names
}

// TestGrafanaDashboard checks that deploy/grafana/tiergate.json is a dashboard whose
// every query uses metrics the daemons define, and that it shows the ones DESIGN.md
// names for the dashboards (handshakes, keyserver, L4 packets).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../deploy/grafana/tiergate.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("deploy/grafana/tiergate.json: %v", err)
	}
	defined := definedMetrics(t)
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, m := range metricName.FindAllString(q.Expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if s, ok := strings.CutSuffix(m, suffix); ok && defined[s] {
						base = s
					}
				}
				if !defined[base] {
					t.Errorf("panel %q queries %s, which no daemon defines", p.Title, m)
				}
				used[base] = true
			}
		}
	}
	for _, m := range []string{"tiergate_tls_handshakes_total", "tiergate_tls_handshake_seconds",
		"tiergate_keyserver_ops_total", "tiergate_l4_packets_total", "tiergate_l4_connections",
		"tiergate_blacklist_hits_total", "tiergate_http_requests_total"} {
		if !used[m] {
			t.Errorf("the dashboard does not show %s", m)
		}
	}
}

// TestPrometheusScrapeConfig checks deploy/prometheus.yml scrapes every daemon at
// its default admin address.
func TestPrometheusScrapeConfig(t *testing.T) {
	b, err := os.ReadFile("../deploy/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("deploy/prometheus.yml: %v", err)
	}
	want := map[string]string{"l4d": l4d.DefaultAdminListen, "l7d": l7d.DefaultAdminListen, "keyserverd": keyserverd.DefaultMetricsListen}
	for _, sc := range cfg.ScrapeConfigs {
		var targets []string
		for _, s := range sc.StaticConfigs {
			targets = append(targets, s.Targets...)
		}
		if w, ok := want[sc.JobName]; ok && slices.Contains(targets, w) {
			delete(want, sc.JobName)
		}
	}
	if len(want) > 0 {
		t.Errorf("deploy/prometheus.yml does not scrape %v", want)
	}
}
