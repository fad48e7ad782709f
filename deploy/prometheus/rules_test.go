// Package prometheus holds Tiergate's Prometheus alert rules (tiergate.rules.yml)
// and their promtool tests (tiergate.rules.test.yml), which this package's test
// runs.
package prometheus

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// promtool runs promtool with args in dir, bounded in time.
func promtool(t *testing.T, bin, dir string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestRules checks the rules and runs their tests with Debian's promtool; then
// the same tests against the rules with each alert's threshold loosened or
// tightened, which must fail: the tests do test the thresholds.
func TestRules(t *testing.T) {
	bin := testenv.RequireCommand(t, "promtool", "prometheus")
	if out, err := promtool(t, bin, ".", "check", "rules", "tiergate.rules.yml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := promtool(t, bin, ".", "test", "rules", "tiergate.rules.test.yml"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	rules, err := os.ReadFile("tiergate.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("tiergate.rules.test.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ alert, from, to string }{
		{"TiergateHandshakeFailureRatio", `[5m])) > 0.05`, `[5m])) > 0.5`},
		// The ratio of all transports together, as before the transport label.
		{"TiergateHandshakeFailureRatio", `by (job, instance, transport) (rate(tiergate_tls_handshakes_total{result!="ok"}[5m]))
            / sum by (job, instance, transport) (rate(tiergate_tls_handshakes_total[5m])) > 0.05
          and sum by (job, instance, transport)`, `by (job, instance) (rate(tiergate_tls_handshakes_total{result!="ok"}[5m]))
            / sum by (job, instance) (rate(tiergate_tls_handshakes_total[5m])) > 0.05
          and sum by (job, instance)`},
		{"TiergateKeyserverLatency", `> 0.05`, `> 0.5`},
		{"TiergateKeyserverErrors", `> 0.01`, `> 0.1`},
		{"TiergateCertificateExpiringSoon", `< 14 * 86400`, `< 7 * 86400`},
		{"TiergateNodeLost", `== 0`, `== 2`},
		{"TiergateNodeLagging", `tiergate_agent_applied_revision > 0`, `tiergate_agent_applied_revision > 5`},
		{"TiergateL4Drops", `[5m])) > 0.01`, `[5m])) > 0.1`},
		{"TiergateL4BGPSessionDown", `for: 2m`, `for: 5m`},
		// Any LD's withdrawal, not every LD's.
		{"TiergateL4VIPWithdrawnEverywhere", `max by (vip)`, `min by (vip)`},
	} {
		t.Run(m.alert, func(t *testing.T) {
			// Change the threshold within this alert's rule only.
			at := strings.Index(string(rules), "alert: "+m.alert)
			if at < 0 {
				t.Fatalf("no alert %s", m.alert)
			}
			rest := string(rules[at:])
			end := strings.Index(rest[1:], "- alert:")
			if end < 0 {
				end = len(rest) - 1
			}
			rule := rest[:end+1]
			if !strings.Contains(rule, m.from) {
				t.Fatalf("%s has no %q", m.alert, m.from)
			}
			changed := string(rules[:at]) + strings.Replace(rule, m.from, m.to, 1) + rest[end+1:]
			dir := t.TempDir()
			for name, data := range map[string][]byte{"tiergate.rules.yml": []byte(changed), "tiergate.rules.test.yml": tests} {
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			out, err := promtool(t, bin, dir, "test", "rules", "tiergate.rules.test.yml")
			if err == nil || !strings.Contains(out, m.alert) {
				t.Errorf("with %s's threshold %q as %q the tests still pass: %v\n%s", m.alert, m.from, m.to, err, out)
			}
		})
	}
}
