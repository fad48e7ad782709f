package demo

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	promrules "github.com/tiergate/tiergate/deploy/prometheus"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestPrometheusConfig checks the demo's generated prometheus.yml with Debian's
// promtool: it parses, loads the alert rules, and names every target.
func TestPrometheusConfig(t *testing.T) {
	promtool := testenv.RequireCommand(t, "promtool", "prometheus")
	dir := t.TempDir()
	rules := filepath.Join(dir, "tiergate.rules.yml")
	if err := os.WriteFile(rules, promrules.Rules, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := prometheusConfig([]promJob{
		{"l7d", []string{"198.18.1.11:9241", "198.18.1.12:9241"}},
		{"keyserverd", []string{"127.0.0.1:9240"}},
		{"l4d", []string{"127.0.0.1:9180"}},
	}, rules)
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s\n%s", err, out, cfg)
	}
	if !strings.Contains(string(out), "SUCCESS: 1 rule files found") || !strings.Contains(string(out), "rules found") {
		t.Errorf("the alert rules were not loaded:\n%s", out)
	}
	for _, want := range []string{`"198.18.1.12:9241"`, "job_name: keyserverd", `"127.0.0.1:9180"`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("prometheus.yml has no %s:\n%s", want, cfg)
		}
	}
}
