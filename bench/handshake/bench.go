package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

type options struct {
	bin          string
	nginx        string
	duration     time.Duration
	warmup       time.Duration
	workers      int
	maxOps       int
	opTimeout    time.Duration
	verifyEvery  int
	nginxWorkers int
	quietCores   float64
	quietWait    time.Duration
	servers      []string // of serverNames
	versions     []uint16
	modes        []string // of modeNames
	profileDir   string   // -profile: CPU profiles of the l7d rows
	out, log     io.Writer
}

// Handshake modes.
const (
	modeFull    = "full"
	modeResumed = "resumed"
)

var modeNames = []string{modeFull, modeResumed}

// The CPU clocks of every row, in this order.
const (
	clockSelf      = iota // the load generator (this process)
	clockMachine          // every process on the machine
	clockServer           // the server under test
	clockKeyserver        // keyserverd, in l7d-offload rows
)

type bench struct {
	o      *options
	f      *fixture
	fl     *fleet
	ksAddr string

	nginxVersion, nginxOpenSSL string
	rows                       []*row
	failures                   []string // what broke; any makes the exit status 1
}

// row is one server at one TLS version in one mode.
type row struct {
	srv      *server
	version  uint16
	mode     string
	res      *benchkit.Result
	win      window
	verified int64
	ks       bool // res.CPU[clockKeyserver] is keyserverd's
	scrape   *scrapeDelta
}

func run(ctx context.Context, o *options) error {
	b := &bench{o: o}
	for _, name := range []string{"keyserverd", "l7d"} {
		if _, err := os.Stat(b.bin(name)); err != nil {
			return fmt.Errorf("%s binary: %w (run `make build`, or pass -bin)", name, err)
		}
	}
	dir, err := os.MkdirTemp("", "tiergate-bench-handshake-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}

	b.progress("setting up in %s: site CA and RSA-2048 certificate, SoftHSM2 token, keyserverd import", dir)
	if b.f, err = newFixture(dir); err != nil {
		return err
	}
	if b.wanted()[srvL7Offload] {
		if err := b.f.importKey(b.bin("keyserverd")); err != nil {
			return err
		}
	}
	b.progress("starting %s", strings.Join(o.servers, ", "))
	if err := b.startFleet(ctx); err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			b.stopFleet()
		}
	}()
	for _, s := range b.fl.servers {
		b.progress("  %s on %s, pid %d", s.label, s.addr, s.proc.PID())
	}

	for _, mode := range o.modes {
		for _, v := range o.versions {
			for _, s := range b.fl.servers {
				if err := b.measure(ctx, s, v, mode); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					b.fail("%s, %s %s: %v", s.label, tls.VersionName(v), mode, err)
				}
			}
		}
	}
	if n := b.fl.hits.Load(); n != 0 {
		b.fail("the backend answered %d requests; the handshake load must make none", n)
	}
	stopped = true
	b.stopFleet()
	b.report()
	if len(b.failures) > 0 {
		return benchkit.ErrFailed
	}
	return nil
}

func (b *bench) bin(name string) string {
	p, err := filepath.Abs(filepath.Join(b.o.bin, name))
	if err != nil {
		return filepath.Join(b.o.bin, name)
	}
	return p
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.o.log, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (b *bench) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.failures = append(b.failures, msg)
	b.progress("FAILED: %s", msg)
}

// measure runs one row: it waits for a quiet machine, checks the server still runs
// and serves a verified chain at this version, then runs the load.
func (b *bench) measure(ctx context.Context, s *server, version uint16, mode string) error {
	label := fmt.Sprintf("%s, %s %s", s.label, tls.VersionName(version), mode)
	for _, p := range []*benchkit.Process{s.proc, b.fl.ks} {
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
			return fmt.Errorf("%s exited: %v; log:\n%s", p.Name, p.ExitErr(), p.LogTail(20))
		default:
		}
	}
	if err := b.verifyOnce(ctx, s.addr, version); err != nil {
		return fmt.Errorf("verified handshake before the row: %w", err)
	}

	clocks := []benchkit.CPUClock{clockSelf: benchkit.SelfCPU, clockMachine: benchkit.MachineBusyCPU, clockServer: s.clock}
	ks := s.id == srvL7Offload && b.fl.ks != nil
	if ks {
		clocks = append(clocks, b.fl.ks.CPU())
	}
	if b.o.quietWait > 0 {
		ours := append([]benchkit.CPUClock{benchkit.SelfCPU, s.clock}, clocks[clockServer+1:]...)
		others, quiet, err := benchkit.WaitQuiet(ctx, b.o.quietCores, b.o.quietWait, ours...)
		if err != nil {
			return err
		}
		if !quiet {
			b.progress("other processes still use %.2f cores after %v: measuring anyway", others, b.o.quietWait)
		}
	}

	before, err := b.scrape(s)
	if err != nil {
		return err
	}
	b.progress("%s: %d workers, %v warm-up, %v measured", label, b.o.workers, b.o.warmup, b.o.duration)
	cl := newClient(s.addr, version, mode == modeResumed, b.o.workers, b.o.opTimeout, b.o.verifyEvery, b.f.siteCA.Pool())
	stopProfile := b.startProfile(ctx, s, version, mode)
	res, err := benchkit.Run(ctx, benchkit.Load{
		Workers:  b.o.workers,
		Warmup:   b.o.warmup,
		Duration: b.o.duration,
		MaxOps:   b.o.maxOps,
		Op:       cl.op,
		Clocks:   clocks,
	})
	stopProfile()
	if err != nil {
		return err
	}
	r := &row{srv: s, version: version, mode: mode, res: res, win: cl.window(res), verified: cl.verified.Load(), ks: ks}
	b.rows = append(b.rows, r)
	if after, err := b.scrape(s); err != nil {
		b.fail("%s: %v", label, err)
	} else if before != nil {
		r.scrape = after.minus(before)
	}

	b.progress("  %.0f handshakes/s, server %.3f ms CPU per handshake, p50 %.2f ms, p99 %.2f ms, %d errors, others %.2f cores",
		r.rate(), ms(r.serverCPUPerHS()), ms(r.win.handshakes.Percentile(50)), ms(r.win.handshakes.Percentile(99)), res.Errors, r.otherCores())
	switch {
	case cl.bad.Load() > 0:
		b.fail("%s: %d handshakes negotiated other parameters or failed verification: %v", label, cl.bad.Load(), res.FirstErr)
	case res.Errors > 0:
		b.fail("%s: %d errors, the first: %v", label, res.Errors, res.FirstErr)
	case r.win.ops == 0:
		b.fail("%s: no handshake completed in the window", label)
	case r.verified == 0:
		b.fail("%s: no certificate chain was verified", label)
	case mode == modeResumed && r.win.resumed == 0:
		b.fail("%s: no handshake resumed", label)
	}
	if res.CPUErr != nil {
		b.fail("%s: reading CPU time: %v", label, res.CPUErr)
	}
	if d := r.scrape; d != nil {
		if d.hsFailed > 0 {
			b.fail("%s: l7d counted %.0f failed handshakes", label, d.hsFailed)
		}
		// Every full handshake makes one signature on keyserverd; handshakes in flight
		// while l7d's counters were read may fall on either side.
		if ks && (d.ksFailed > 0 || mode == modeFull && math.Abs(d.ksOK-d.hsOK) > float64(b.o.workers)) {
			b.fail("%s: %.0f keyserver operations ok and %.0f failed for %.0f handshakes; want one per full handshake, none failed",
				label, d.ksOK, d.ksFailed, d.hsOK)
		}
		if !ks && d.ksOK+d.ksFailed > 0 {
			b.fail("%s: %.0f keyserver operations in a row with the key local", label, d.ksOK+d.ksFailed)
		}
	}
	return nil
}

// The row's figures. Full rows divide by every handshake in the window, resumed rows
// by the resumed ones (the first handshake of each worker, full, falls in the
// warm-up; the report shows the fraction resumed).
func (r *row) handshakes() int {
	if r.mode == modeResumed {
		return r.win.resumed
	}
	return r.win.ops
}

func (r *row) rate() float64 {
	if r.res.Elapsed <= 0 {
		return 0
	}
	return float64(r.win.ops) / r.res.Elapsed.Seconds()
}

func (r *row) cpuPerHS(clock int) time.Duration {
	n := r.handshakes()
	if n == 0 || r.res.CPUErr != nil || clock >= len(r.res.CPU) {
		return 0
	}
	return r.res.CPU[clock] / time.Duration(n)
}

func (r *row) serverCPUPerHS() time.Duration { return r.cpuPerHS(clockServer) }

func (r *row) keyserverCPUPerHS() (time.Duration, bool) {
	if !r.ks {
		return 0, false
	}
	return r.cpuPerHS(clockKeyserver), true
}

// cores is clock's CPU in cores over the window.
func (r *row) cores(clock int) float64 {
	if r.res.Elapsed <= 0 || clock >= len(r.res.CPU) {
		return 0
	}
	return r.res.CPU[clock].Seconds() / r.res.Elapsed.Seconds()
}

// otherCores is what every process but the load generator, the server and
// keyserverd used, in cores.
func (r *row) otherCores() float64 {
	ours := r.cores(clockSelf) + r.cores(clockServer)
	if r.ks {
		ours += r.cores(clockKeyserver)
	}
	return max(r.cores(clockMachine)-ours, 0)
}

func (r *row) resumedFraction() float64 {
	if r.win.ops == 0 {
		return 0
	}
	return float64(r.win.resumed) / float64(r.win.ops)
}

// scrapeDelta is what l7d's own metrics counted during a row, warm-up included:
// handshakes and keyserver operations by result, and the Go runtime's allocation and
// garbage collections, and its GOMAXPROCS sizing.
type scrapeDelta struct {
	hsOK, hsFailed, ksOK, ksFailed float64
	allocBytes, gcCycles           float64
	procs                          benchkit.Procs
}

func (d *scrapeDelta) minus(o *scrapeDelta) *scrapeDelta {
	return &scrapeDelta{d.hsOK - o.hsOK, d.hsFailed - o.hsFailed, d.ksOK - o.ksOK, d.ksFailed - o.ksFailed,
		d.allocBytes - o.allocBytes, d.gcCycles - o.gcCycles, d.procs.Since(o.procs)}
}

// perHandshake returns l7d's bytes allocated per handshake and GC cycles per 1000
// handshakes, by its own count of handshakes.
func (d *scrapeDelta) perHandshake() (allocKB, gcPer1000 float64, ok bool) {
	if d == nil || d.hsOK <= 0 {
		return 0, 0, false
	}
	return d.allocBytes / 1024 / d.hsOK, 1000 * d.gcCycles / d.hsOK, true
}

// scrape reads l7d's handshake and keyserver counters; nil for nginx.
func (b *bench) scrape(s *server) (*scrapeDelta, error) {
	if s.metricsURL == "" {
		return nil, nil
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(s.metricsURL)
	if err != nil {
		return nil, fmt.Errorf("l7d metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("l7d metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics sums tiergate_tls_handshakes_total and tiergate_keyserver_ops_total
// by result (ok or not), and reads go_memstats_alloc_bytes_total,
// go_gc_duration_seconds_count and the GOMAXPROCS sizing, from the Prometheus text
// format.
func parseMetrics(r io.Reader) (*scrapeDelta, error) {
	d := &scrapeDelta{}
	err := benchkit.ScanMetrics(r, func(name, labels string, v float64) {
		if d.procs.Scan(name, v) {
			return
		}
		var ok, failed *float64
		switch name {
		case "go_memstats_alloc_bytes_total":
			d.allocBytes = v
			return
		case "go_gc_duration_seconds_count":
			d.gcCycles = v
			return
		case "tiergate_tls_handshakes_total":
			ok, failed = &d.hsOK, &d.hsFailed
		case "tiergate_keyserver_ops_total":
			ok, failed = &d.ksOK, &d.ksFailed
		default:
			return
		}
		if strings.Contains(labels, `result="ok"`) {
			*ok += v
		} else {
			*failed += v
		}
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
