package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/internal/promtext"
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
	scrapeRate   float64  // -scrape-cost-rate: the scrape-cost rows' handshakes/s; 0 for none
	scrapePairs  int      // -scrape-cost-pairs: windows without and with scrapes, each
	scrapeMode   string   // -scrape-cost-mode: modeFull or modeResumed

	classic            bool          // -classic: the handshake-only rows at -workers, by version and mode, and the scrape-cost rows
	breakdown          bool          // -breakdown: perf's samples of each matrix row's server, by part
	floor              bool          // -floor: the floor servers in the shapes with a request and the sequential ones
	matrix             []shape       // -matrix: the load shapes measured
	burst              int           // -burst: connections of a burst
	matrixDuration     time.Duration // -matrix-duration
	matrixWarmup       time.Duration // -matrix-warmup
	matrixServerWarmup time.Duration // -matrix-server-warmup
	matrixRepeat       int           // -matrix-repeat: rows per shape and server
	matrixQuiet        time.Duration // -matrix-quiet-wait
	poissonRate        float64       // -poisson-rate; 0: half of nginx's best closed-loop rate
	poissonMaxInFlight int           // -poisson-max-in-flight
	l7dEnv             []string      // -l7d-env
	out, log           io.Writer
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
	benchkit.Bench
	o      *options
	f      *fixture
	fl     *fleet
	ksAddr string

	nginxVersion, nginxOpenSSL string
	rows                       []*row
	mrows                      []*mrow      // the load-shape matrix
	crypto                     *cryptoCosts // the floor's public-key operations; nil without the floor
	scrapeCost                 *scrapeCost  // the scrape-cost rows' figures; nil when not run
	// breakdownOK: perf samples the matrix rows (-breakdown and perf usable here);
	// breakdownWhy says why not when it was asked for.
	breakdownOK  bool
	breakdownWhy string
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
	b := &bench{o: o, Bench: benchkit.Bench{Log: o.log, BinDir: o.bin, QuietCores: o.quietCores, QuietWait: o.quietWait}}
	for _, name := range []string{"keyserverd", "l7d"} {
		if _, err := os.Stat(b.Bin(name)); err != nil {
			return fmt.Errorf("%s binary: %w (run `make build`, or pass -bin)", name, err)
		}
	}
	// A burst holds thousands of sockets open, in this process, nginx and h2load:
	// the file limit raised to its hard limit here is inherited by the children (Go
	// otherwise gives them back the soft limit it started with).
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
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

	b.Progress("setting up in %s: site CA and RSA-2048 certificate, SoftHSM2 token, keyserverd import", dir)
	if b.f, err = newFixture(dir); err != nil {
		return err
	}
	if b.wanted()[srvL7Offload] {
		if err := b.f.importKey(b.Bin("keyserverd")); err != nil {
			return err
		}
	}
	if o.breakdown && len(o.matrix) > 0 {
		if b.breakdownOK, b.breakdownWhy = perfUsable(dir); !b.breakdownOK {
			b.Progress("no CPU breakdown: %s", b.breakdownWhy)
		}
	}
	b.Progress("starting %s", strings.Join(o.servers, ", "))
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
		b.Progress("  %s on %s, pid %d", s.label, s.addr, s.proc.PID())
	}

	if b.floorWanted() {
		b.Progress("the public-key operations' cost, Go here and OpenSSL (openssl speed)")
		if b.crypto, err = measureCrypto(ctx, b.f.key); err != nil {
			return fmt.Errorf("measuring the public-key operations: %w", err)
		}
	}
	if err := b.runMatrix(ctx); err != nil {
		return err
	}
	for _, mode := range o.modes {
		if !o.classic {
			break
		}
		for _, v := range o.versions {
			for _, s := range b.fl.servers {
				if s.floor {
					continue
				}
				if err := b.measure(ctx, s, v, mode); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					b.Fail("%s, %s %s: %v", s.label, tls.VersionName(v), mode, err)
				}
			}
		}
	}
	if o.scrapeRate > 0 && o.classic {
		for _, s := range b.fl.servers {
			if s.id != srvL7Local {
				continue
			}
			sc, err := b.measureScrapeCost(ctx, s)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				b.Fail("scrape cost: %v", err)
			}
			b.scrapeCost = sc
		}
	}
	stopped = true
	b.stopFleet()
	b.report()
	return b.Err()
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
			return p.Exited()
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
	if err := b.WaitQuiet(ctx, append([]benchkit.CPUClock{benchkit.SelfCPU, s.clock}, clocks[clockServer+1:]...)...); err != nil {
		return err
	}

	before, err := b.scrape(s)
	if err != nil {
		return err
	}
	b.Progress("%s: %d workers, %v warm-up, %v measured", label, b.o.workers, b.o.warmup, b.o.duration)
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
		b.Fail("%s: %v", label, err)
	} else if before != nil {
		r.scrape = after.minus(before)
	}

	b.Progress("  %.0f handshakes/s, server %.3f ms CPU per handshake, p50 %.2f ms, p99 %.2f ms, %d errors, others %.2f cores",
		r.rate(), ms(r.serverCPUPerHS()), ms(r.win.handshakes.Percentile(50)), ms(r.win.handshakes.Percentile(99)), res.Errors, r.otherCores())
	switch {
	case cl.bad.Load() > 0:
		b.Fail("%s: %d handshakes negotiated other parameters or failed verification: %v", label, cl.bad.Load(), res.FirstErr)
	case res.Errors > 0:
		b.Fail("%s: %d errors, the first: %v", label, res.Errors, res.FirstErr)
	case r.win.ops == 0:
		b.Fail("%s: no handshake completed in the window", label)
	case r.verified == 0:
		b.Fail("%s: no certificate chain was verified", label)
	case mode == modeResumed && r.win.resumed == 0:
		b.Fail("%s: no handshake resumed", label)
	}
	if res.CPUErr != nil {
		b.Fail("%s: reading CPU time: %v", label, res.CPUErr)
	}
	if d := r.scrape; d != nil {
		if d.hsFailed > 0 {
			b.Fail("%s: l7d counted %.0f failed handshakes", label, d.hsFailed)
		}
		// Every full handshake makes one signature on keyserverd; handshakes in flight
		// while l7d's counters were read may fall on either side.
		if ks && (d.ksFailed > 0 || mode == modeFull && math.Abs(d.ksOK-d.hsOK) > float64(b.o.workers)) {
			b.Fail("%s: %.0f keyserver operations ok and %.0f failed for %.0f handshakes; want one per full handshake, none failed",
				label, d.ksOK, d.ksFailed, d.hsOK)
		}
		if !ks && d.ksOK+d.ksFailed > 0 {
			b.Fail("%s: %.0f keyserver operations in a row with the key local", label, d.ksOK+d.ksFailed)
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
	ss, err := promtext.Get(context.Background(), nil, s.metricsURL)
	if err != nil {
		return nil, fmt.Errorf("l7d metrics: %w", err)
	}
	return metricsDelta(ss), nil
}

// parseMetrics reads l7d's counters from the Prometheus text format.
func parseMetrics(r io.Reader) (*scrapeDelta, error) {
	ss, err := promtext.Parse(r)
	if err != nil {
		return nil, err
	}
	return metricsDelta(ss), nil
}

// metricsDelta sums tiergate_tls_handshakes_total and tiergate_keyserver_ops_total
// by result (ok or not), and reads go_memstats_alloc_bytes_total,
// go_gc_duration_seconds_count and the GOMAXPROCS sizing.
func metricsDelta(ss promtext.Samples) *scrapeDelta {
	return &scrapeDelta{
		hsOK:       ss.Sum("tiergate_tls_handshakes_total", `result="ok"`),
		hsFailed:   ss.Sum("tiergate_tls_handshakes_total", `!result="ok"`),
		ksOK:       ss.Sum("tiergate_keyserver_ops_total", `result="ok"`),
		ksFailed:   ss.Sum("tiergate_keyserver_ops_total", `!result="ok"`),
		allocBytes: ss.Sum("go_memstats_alloc_bytes_total"),
		gcCycles:   ss.Sum("go_gc_duration_seconds_count"),
		procs:      benchkit.ProcsOf(ss),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
