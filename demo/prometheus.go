package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	promrules "github.com/tiergate/tiergate/deploy/prometheus"
)

// promJob is a scrape job of the demo's Prometheus: the daemon's name (the job
// label) and its metrics endpoints, host:port.
type promJob struct {
	name    string
	targets []string
}

// promDir is where the demo's Prometheus keeps its configuration, the alert rules
// and its data (data/), under the state directory.
func (st *site) promDir() string { return filepath.Join(st.dir, "prometheus") }

// prometheusConfig is the demo's prometheus.yml: every 5s a scrape of each job's
// targets, and the repository's alert rules (deploy/prometheus) loaded from rules.
func prometheusConfig(jobs []promJob, rules string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by tgdemo on every run: the demo's metrics endpoints, Tiergate's alert rules.
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: [%q]
scrape_configs:
`, rules)
	for _, j := range jobs {
		q := make([]string, len(j.targets))
		for i, t := range j.targets {
			q[i] = strconv.Quote(t)
		}
		fmt.Fprintf(&b, "  - job_name: %s\n    static_configs: [{targets: [%s]}]\n", j.name, strings.Join(q, ", "))
	}
	return b.String()
}

// startPrometheus starts Debian's prometheus in ns (nil: the host), listening at
// listen, on the demo's metrics endpoints (jobs), with the alert rules and its
// data under promDir. It returns false, having said so on out, when prometheus is
// not installed (`make deps` installs it).
func (st *site) startPrometheus(ctx context.Context, s *stack, ns *netNS, listen string, jobs []promJob, out io.Writer) (bool, error) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		fmt.Fprintln(out, "tgdemo: Prometheus not started: no prometheus here (`make deps` installs Debian's)")
		return false, nil
	}
	dir := st.promDir()
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		return false, fmt.Errorf("making Prometheus's directory: %w", err)
	}
	rules := filepath.Join(dir, "tiergate.rules.yml")
	if err := os.WriteFile(rules, promrules.Rules, 0o600); err != nil {
		return false, fmt.Errorf("writing the alert rules: %w", err)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(prometheusConfig(jobs, rules)), 0o600); err != nil {
		return false, fmt.Errorf("writing prometheus.yml: %w", err)
	}
	p, err := s.start("prometheus", filepath.Join(st.dir, "prometheus.log"), nil, ns, bin,
		"--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--storage.tsdb.retention.time=2d", "--web.listen-address="+listen, "--log.level=warn")
	if err != nil {
		return false, err
	}
	return true, p.WaitHTTP(ctx, nsHTTP(ns, time.Second), "http://"+listen+"/-/ready", healthWait)
}

// relayNS relays the TCP connections made to at in from to to in ns (nil: the
// host), until the demo stops: so that Prometheus in the switch's namespace
// reaches l4d's loopback admin endpoint in the LD's.
func relayNS(s *stack, from *netNS, at string, ns *netNS, to string) error {
	var ln net.Listener
	if err := from.do(func() error {
		var err error
		ln, err = net.Listen("tcp", at)
		return err
	}); err != nil {
		return fmt.Errorf("listening at %s in %s for a relay to %s: %w", at, from, to, err)
	}
	s.onClose(func() { ln.Close() })
	dial := nsDialer(ns)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				u, err := dial(ctx, "tcp", to)
				cancel()
				if err != nil {
					return
				}
				defer u.Close()
				go func() {
					io.Copy(u, c)
					u.(*net.TCPConn).CloseWrite()
				}()
				io.Copy(c, u)
			}()
		}
	}()
	return nil
}

// dashboardText is the block printed at the start about the dashboards: controld's
// /ui page with how to get its token, and Prometheus when it runs (promURL "" when
// not).
func (st *site) dashboardText(t *tgctl, apiAt, promURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `  dashboard (/ui)     http://%s/ui   (controld scrapes the nodes itself; it runs without -prometheus)
  its token           %s token create ui-viewer --role viewer   (a viewer token; controld's admin token in %s works too)
`, apiAt, t.bin, st.tokenFile())
	if promURL != "" {
		fmt.Fprintf(&b, "  prometheus          %s   (Tiergate's alert rules at %s/alerts; config, rules and data in %s, log prometheus.log)\n", promURL, promURL, st.promDir())
	}
	return b.String()
}
