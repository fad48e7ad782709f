package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tiergate/tiergate/control/ui"
	"github.com/tiergate/tiergate/testkit/cluster"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// hsLoad makes full TLS handshakes with the l7d nodes at a steady pace, and
// counts those that succeed by when they did.
type hsLoad struct {
	mu    sync.Mutex
	times []time.Time // successful handshakes
	fails atomic.Int64
	stop  context.CancelFunc
	done  sync.WaitGroup
}

// startLoad paces perSecond handshakes to each address (at most 128 in flight),
// each a new session (no resumption), until Stop; bounded by the context.
func startLoad(ctx context.Context, addrs []string, perSecond int, roots *x509.CertPool) *hsLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &hsLoad{stop: cancel}
	sem := make(chan struct{}, 128)
	for _, addr := range addrs {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			tick := time.NewTicker(time.Second / time.Duration(perSecond))
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				select {
				case sem <- struct{}{}:
				default:
					l.fails.Add(1) // too many stalled: count as a failure, keep the pace
					continue
				}
				l.done.Add(1)
				go func() {
					defer func() { <-sem; l.done.Done() }()
					d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: &tls.Config{RootCAs: roots, ServerName: controlSite, MinVersion: tls.VersionTLS13}}
					hctx, hcancel := context.WithTimeout(ctx, 8*time.Second)
					defer hcancel()
					conn, err := d.DialContext(hctx, "tcp", addr)
					if err != nil {
						l.fails.Add(1)
						return
					}
					conn.Close()
					l.mu.Lock()
					l.times = append(l.times, time.Now())
					l.mu.Unlock()
				}()
			}
		}()
	}
	return l
}

// rate is the successful handshakes per second over the span before now.
func (l *hsLoad) rate(span time.Duration) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := time.Now().Add(-span)
	n := 0
	for i := len(l.times) - 1; i >= 0 && l.times[i].After(from); i-- {
		n++
	}
	return float64(n) / span.Seconds()
}

func (l *hsLoad) Stop() { l.stop(); l.done.Wait() }

// startPrometheus runs Debian's prometheus on a loopback port, scraping every
// second the jobs given (job -> targets) and evaluating deploy/prometheus's alert
// rules, until the test ends.
func startPrometheus(t *testing.T, bin string, jobs map[string][]string) string {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs("../deploy/prometheus/tiergate.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [%q]\nscrape_configs:\n", rules)
	for job, targets := range jobs {
		q := make([]string, len(targets))
		for i, tg := range targets {
			q[i] = strconv.Quote(tg)
		}
		cfg += fmt.Sprintf("  - job_name: %s\n    static_configs: [{targets: [%s]}]\n", job, strings.Join(q, ", "))
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
	base := "http://" + addr
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return base
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("prometheus not ready after 20s: %v\n%s", err, log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// promQuery runs an instant query: an error when it does not parse or run, and
// the number of series it returns.
func promQuery(base, expr string) (int, error) {
	resp, err := http.PostForm(base+"/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	var ans struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		return 0, fmt.Errorf("%s: %s", resp.Status, body)
	}
	if ans.Status != "success" {
		return 0, fmt.Errorf("%s", ans.Error)
	}
	return len(ans.Data.Result), nil
}

// grafanaQueries returns every panel target's expression of the Grafana dashboard,
// by panel title.
func grafanaQueries(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../deploy/grafana/tiergate.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], tg.Expr)
		}
	}
	return out
}

// TestDashboard runs the control plane (controld, two keyserverd, two l7d, an l4d
// where DPDK runs) with handshake load, and checks what people look at: controld's
// /ui page in headless Chromium (a wrong token gets the login state and no figure;
// the viewer token gets the handshake rate the load made, within 20%; a stalled
// keyserver shows as failures by reason; a stopped l7d as lost; a screenshot kept
// in the test's folder), controld's figures from Prometheus instead (-prometheus's
// source), and every query of deploy/grafana/tiergate.json against Debian's
// Prometheus scraping the same daemons: each parses and returns series.
func TestDashboard(t *testing.T) {
	testenv.SkipShort(t, "starts a cluster, Prometheus and Chromium")
	chromium := testenv.RequireCommand(t, "chromium", "chromium")
	promBin := testenv.RequireCommand(t, "prometheus", "prometheus")
	// The screenshots go into the test's folder, or TIERGATE_UI_SHOTS to keep them.
	shots := t.TempDir()
	if d := os.Getenv("TIERGATE_UI_SHOTS"); d != "" {
		shots = d
	}
	c := startControlCluster(t, false)
	c.startSite()
	l4 := c.startL4()
	r := c.admin(0, "token", "create", "ui-viewer", "--role", "viewer")
	viewer := strings.TrimSpace(r.stdout)

	jobs := map[string][]string{}
	for _, l := range c.L7 {
		jobs["l7d"] = append(jobs["l7d"], l.Admin)
	}
	for _, ks := range c.Keyservers {
		jobs["keyserverd"] = append(jobs["keyserverd"], ks.Admin)
	}
	if l4 != nil {
		jobs["l4d"] = []string{l4.Admin}
	}
	prom := startPrometheus(t, promBin, jobs)

	roots := x509.NewCertPool()
	roots.AddCert(c.SiteCA.Cert)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const perNode = 15
	load := startLoad(ctx, []string{c.L7[0].Listen, c.L7[1].Listen}, perNode, roots)
	defer load.Stop()
	loadStart := time.Now()

	actx, acancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1400, 2600))
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	shot := func(name string) {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Errorf("screenshot %s: %v", name, err)
			return
		}
		p := filepath.Join(shots, name)
		if err := os.WriteFile(p, png, 0o600); err != nil {
			t.Error(err)
		}
		t.Logf("screenshot: %s (%d bytes)", p, len(png))
	}
	eval := func(js string, out any) {
		t.Helper()
		text, err := chromedp.Run(bctx, chromedp.Evaluate[string]("JSON.stringify("+js+")"))
		if err == nil {
			err = json.Unmarshal([]byte(text), out)
		}
		if err != nil {
			t.Fatalf("evaluating %s: %v", js, err)
		}
	}
	// waitFor polls js (a boolean expression) until it is true, up to d.
	waitFor := func(what, js string, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			var ok bool
			eval(js, &ok)
			if ok {
				return
			}
			if time.Now().After(deadline) {
				shot("failed.png")
				var state string
				eval(`document.body.dataset.state + " | " + document.getElementById("status").textContent`, &state)
				t.Fatalf("%s: not after %v (page: %s)", what, d, state)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	// A wrong token: the login state, an error, no figure.
	if err := chromedp.Do(bctx,
		chromedp.Navigate(c.API+"/ui"),
		chromedp.WaitVisible(chromedp.CSS("#login-form")),
		chromedp.SendKeys(chromedp.CSS("#token"), "ui-viewer."+strings.Repeat("0", 64)),
		chromedp.Click(chromedp.CSS("#login-button")),
	); err != nil {
		t.Fatal(err)
	}
	waitFor("a wrong token's error", `document.getElementById("login-error").textContent.length > 0`, 10*time.Second)
	var wrong struct {
		State  string `json:"state"`
		Charts int    `json:"charts"`
		Rows   int    `json:"rows"`
		Rate   string `json:"rate"`
		Stored bool   `json:"stored"`
	}
	eval(`({state: document.body.dataset.state, charts: document.querySelectorAll(".chart").length,
		rows: document.querySelectorAll("#nodes tbody tr").length, rate: document.getElementById("hs-rate").dataset.value,
		stored: sessionStorage.getItem("tiergate.token") !== null})`, &wrong)
	if wrong.State != "login" || wrong.Charts != 0 || wrong.Rows != 0 || wrong.Rate != "" || wrong.Stored {
		t.Errorf("a wrong token: %+v, want the login state, no chart, no node, no rate, no token kept", wrong)
	}
	shot("login.png")

	// The viewer token: the figures.
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS("#token"), viewer),
		chromedp.Click(chromedp.CSS("#login-button")),
	); err != nil {
		t.Fatal(err)
	}
	waitFor("the dashboard state", `document.body.dataset.state === "dashboard"`, 10*time.Second)
	// The page's rate is over the last 10s of scrapes (every 2s): give the load
	// 14s to be steady, then compare over the same span, up to 40s.
	if d := 14*time.Second - time.Since(loadStart); d > 0 {
		time.Sleep(d)
	}
	var pageRate, loadRate float64
	deadline := time.Now().Add(40 * time.Second)
	for {
		var v string
		eval(`document.getElementById("hs-rate").dataset.value`, &v)
		pageRate, _ = strconv.ParseFloat(v, 64)
		loadRate = load.rate(12 * time.Second)
		if loadRate > 0 && pageRate >= 0.8*loadRate && pageRate <= 1.2*loadRate {
			break
		}
		if time.Now().After(deadline) {
			shot("rate.png")
			t.Fatalf("the page shows %.1f handshakes/s, the load made %.1f/s (failures %d): not within 20%%", pageRate, loadRate, load.fails.Load())
		}
		time.Sleep(time.Second)
	}
	t.Logf("handshakes/s: the page %.1f, the load %.1f (paced at %d)", pageRate, loadRate, 2*perNode)
	waitFor("both l7d in the node table, scraped", `["l7-a","l7-b"].every(n => { const r = document.querySelector('#nodes tr[data-node="'+n+'"]'); return r && r.dataset.state === "ok" && r.cells[6].textContent === "up"; })`, 10*time.Second)
	// The keyservers scraped at the metrics address their status gives (their
	// admin endpoint's), their own operations' latency and in-flight charted.
	waitFor("both keyserverd in the node table, scraped", `["ks-1","ks-2"].every(n => { const r = document.querySelector('#nodes tr[data-node="'+n+'"]'); return r && r.cells[6].textContent === "up"; })`, 10*time.Second)
	waitFor("the keyservers' latency and in-flight charted", `["keyserver_latency", "keyserver_inflight"].every(id =>
		Array.from(document.querySelectorAll("#chart-"+id+" .u-legend .u-label")).some(e => e.textContent.includes("ks-1")))`, 15*time.Second)
	// The load is over TCP: the handshakes are there, none over QUIC.
	waitFor("the handshakes over TCP", `Number(document.getElementById("hs-tcp").textContent) > 0 && ["–", "0", "0.0"].includes(document.getElementById("hs-quic").textContent)`, 10*time.Second)
	waitFor("the certificate www in the table", `Array.from(document.querySelectorAll("#certs tbody tr")).some(r => r.cells[1].textContent === "www")`, 10*time.Second)
	shot("dashboard.png")

	// Controld's figures from Prometheus instead: the same panels, from PromQL.
	t.Run("PrometheusSource", func(t *testing.T) {
		src, err := ui.NewPrometheus(ui.PrometheusConfig{URL: prom, Step: time.Second, RateWindow: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		d, err := src.Dashboard(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var total float64
		for _, p := range d.Panels {
			if p.ID != "handshakes" {
				continue
			}
			for _, s := range p.Series {
				for i := len(s.Values) - 1; i >= 0; i-- {
					if s.Values[i] != nil {
						total += *s.Values[i]
						break
					}
				}
			}
		}
		if lr := load.rate(15 * time.Second); total < 0.7*lr || total > 1.3*lr {
			t.Errorf("handshakes/s from Prometheus %.1f, the load's %.1f", total, lr)
		}
		if len(d.Targets) < 4 || len(d.Certificates) == 0 {
			t.Errorf("targets %+v, certificates %+v: want every job's and www", d.Targets, d.Certificates)
		}
	})

	// A stalled keyserver (both, SIGSTOP): the handshakes fail, by reason.
	for _, ks := range c.Keyservers {
		if err := ks.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("failures by reason", `Number(document.getElementById("hs-failures").textContent) > 0 &&
		Array.from(document.querySelectorAll("#chart-handshake_failures .u-legend .u-label")).some(e => e.textContent.includes("keyserver_"))`, 30*time.Second)
	var reasons []string
	eval(`Array.from(document.querySelectorAll("#chart-handshake_failures .u-legend .u-label")).map(e => e.textContent)`, &reasons)
	t.Logf("failures by reason on the page: %q", reasons)
	shot("keyserver-stalled.png")
	for _, ks := range c.Keyservers {
		if err := ks.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}

	// Every query of the Grafana dashboard parses and returns series (the
	// failures by reason too, after the stall).
	t.Run("GrafanaQueries", func(t *testing.T) {
		for title, exprs := range grafanaQueries(t) {
			for _, expr := range exprs {
				if l4 == nil && strings.Contains(expr, "tiergate_l4_") {
					t.Logf("%s: %s: no l4d here (root and libdpdk needed), not checked", title, expr)
					continue
				}
				n, err := promQuery(prom, expr)
				if err != nil {
					t.Errorf("%s: %s: %v", title, expr, err)
				} else if n == 0 {
					t.Errorf("%s: %s: no series", title, expr)
				}
			}
		}
	})

	// The alert rules evaluate on the daemons' real metrics without an error.
	t.Run("AlertRules", func(t *testing.T) {
		resp, err := http.Get(prom + "/api/v1/rules")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ans struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name      string `json:"name"`
						Health    string `json:"health"`
						LastError string `json:"lastError"`
						State     string `json:"state"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, g := range ans.Data.Groups {
			for _, r := range g.Rules {
				n++
				if r.Health != "ok" {
					t.Errorf("alert %s: health %q: %s", r.Name, r.Health, r.LastError)
				}
				t.Logf("alert %s: %s", r.Name, r.State)
			}
		}
		if n < 8 {
			t.Errorf("%d alert rules loaded, want the 8 of deploy/prometheus", n)
		}
	})

	// A stopped l7d: lost.
	if err := c.L7[1].Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor("l7-b shown lost", `(() => { const r = document.querySelector('#nodes tr[data-node="l7-b"]'); return r && r.dataset.state === "lost" && r.className === "lost"; })()`, 30*time.Second)
	waitFor("the lost count", `document.getElementById("nodes-lost").textContent === "1"`, 10*time.Second)
	shot("node-lost.png")

	// What a scrape costs an l7d: its CPU time over 200 scrapes of /metrics, less
	// its CPU time over as long without them (Prometheus and controld still
	// scraping it in both). A scrape a second must cost under 1% of a core. The
	// label sets, and so the exposition, do not grow with the handshake rate.
	load.Stop()
	pid := pidOf(t, filepath.Join(c.L7[0].Dir, "l7d.yaml"))
	hc := &http.Client{Timeout: 5 * time.Second}
	const scrapes = 200
	cpu0, t0 := cpuSeconds(t, pid), time.Now()
	for range scrapes {
		resp, err := hc.Get("http://" + c.L7[0].Admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	busy, took := cpuSeconds(t, pid)-cpu0, time.Since(t0)
	cpu1 := cpuSeconds(t, pid)
	time.Sleep(took)
	idle := cpuSeconds(t, pid) - cpu1
	perScrape := max(0, busy-idle) / scrapes
	t.Logf("a scrape of l7d's /metrics costs it %.2fms of CPU (%d scrapes: %.3fs, %.3fs without them over %v): %.2f%% of a core at one a second",
		perScrape*1000, scrapes, busy, idle, took.Round(time.Millisecond), perScrape*100)
	if perScrape >= 0.01 {
		t.Errorf("a scrape a second costs l7d %.2f%% of a core, want under 1%%", perScrape*100)
	}
}

// pidOf returns the process whose command line names file (a daemon's -config).
func pidOf(t *testing.T, file string) int {
	t.Helper()
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if strings.Contains(string(cmdline), "\x00"+file) {
			return pid
		}
	}
	t.Fatalf("no process runs with %s", file)
	return 0
}

// cpuSeconds is a process's user and system CPU time (/proc/PID/stat, in clock
// ticks of 1/100s).
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100
}
