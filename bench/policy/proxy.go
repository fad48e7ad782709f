package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/internal/promtext"
)

// defaultConns is the load's concurrency: enough requests in flight to keep two
// cores busy through the proxies' round trips to the backend, few enough that
// every proxy keeps all of them on one backend connection pool.
const defaultConns = 32

// The CPU clocks of every proxy row, in this order.
const (
	clockSelf    = iota // the load generator (this process)
	clockMachine        // every process on the machine
	clockServer         // the proxy under test
	clockBackend        // the backend
	clockUser           // the proxy's user-mode CPU: the rest of clockServer is the kernel's
)

type proxyResults struct {
	fx      *fixture
	backend *endpoint
	servers []*endpoint
	rows    []*proxyRow
}

// proxyRow is one proxy measured in one round.
type proxyRow struct {
	srv      *endpoint
	gen      string // the load generator: genOwn or genWrk
	round    int
	res      *benchkit.Result
	p50, p99 time.Duration // request latency percentiles

	dialsInWindow, dials int // connections established: in the window, and in all
	serverClosed         int64
	backendRequests      float64     // counted by the backend over the row, warm-up included
	l7                   *l7Counters // l7d's own counters over the row, warm-up included
}

func (b *bench) runProxy(ctx context.Context) error {
	res := &proxyResults{}
	b.proxy = res
	var err error
	if res.fx, err = newFixture(b.dir); err != nil {
		return err
	}
	b.Progress("proxies: starting the %s backend and %s", b.o.backend, strings.Join(b.o.servers, ", "))
	fl, err := b.startFleet(ctx, res.fx)
	defer b.stopFleet(fl)
	if err != nil {
		return err
	}
	res.backend, res.servers = fl.backend, fl.servers
	for _, s := range append([]*endpoint{fl.backend}, fl.servers...) {
		b.Progress("  %s on %s, pid %d", s.label, s.addr, s.proc.PID())
	}
	for round := range b.o.rounds {
		order := slices.Clone(fl.servers)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			for _, gen := range b.o.generators {
				if err := b.measureProxy(ctx, res, s, gen, round); err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					b.Fail("%s by %s, round %d: %v", s.label, gen, round+1, err)
				}
			}
		}
	}
	return nil
}

// measureProxy runs one row: it waits for a quiet machine, checks the proxy and the
// backend still run, then runs the load of generator gen and checks what the backend
// and l7d counted.
func (b *bench) measureProxy(ctx context.Context, res *proxyResults, s *endpoint, gen string, round int) error {
	label := fmt.Sprintf("%s by %s, round %d", s.label, gen, round+1)
	for _, e := range []*endpoint{s, res.backend} {
		if err := e.exited(); err != nil {
			return err
		}
	}
	clocks := []benchkit.CPUClock{clockSelf: benchkit.SelfCPU, clockMachine: benchkit.MachineBusyCPU,
		clockServer: s.clock, clockBackend: res.backend.clock, clockUser: s.user}
	if err := b.WaitQuiet(ctx, benchkit.SelfCPU, s.clock, res.backend.clock); err != nil {
		return err
	}
	beBefore, err := backendRequests(res.backend)
	if err != nil {
		return err
	}
	l7Before, err := scrapeL7(s)
	if err != nil {
		return err
	}

	b.Progress("%s: %d keep-alive connections, %v warm-up, %v measured", label, b.o.conns, b.o.warmup, b.o.duration)
	var r *proxyRow
	var cl *client
	stopProfile := b.startProfile(ctx, s, gen, round)
	switch gen {
	case genWrk:
		lr, w, err := b.runWrk(ctx, s, clocks)
		stopProfile()
		if err != nil {
			return err
		}
		r = &proxyRow{srv: s, gen: gen, round: round, res: lr, p50: w.p50, p99: w.p99}
	default:
		cl = newClient(s.addr, res.fx, b.o.conns, b.o.opTimeout)
		lr, err := benchkit.Run(ctx, benchkit.Load{
			Workers:  b.o.conns,
			Warmup:   b.o.warmup,
			Duration: b.o.duration,
			MaxOps:   b.o.maxOps,
			Op:       cl.op,
			Clocks:   clocks,
		})
		cl.close()
		stopProfile()
		if err != nil {
			return err
		}
		r = &proxyRow{srv: s, gen: gen, round: round, res: lr, serverClosed: cl.closed.Load(),
			p50: lr.Latencies.Percentile(50), p99: lr.Latencies.Percentile(99)}
		r.dialsInWindow, r.dials = cl.dialsBetween(lr.Start, lr.Start.Add(lr.Elapsed))
	}
	lr := r.res
	res.rows = append(res.rows, r)

	if beAfter, err := backendRequests(res.backend); err != nil {
		b.Fail("%s: %v", label, err)
	} else {
		r.backendRequests = beAfter - beBefore
	}
	if l7After, err := scrapeL7(s); err != nil {
		b.Fail("%s: %v", label, err)
	} else if l7Before != nil {
		r.l7 = l7After.minus(l7Before)
	}

	b.Progress("  %.0f requests/s, server %.1f µs CPU per request, p50 %.3f ms, p99 %.3f ms, %d errors, others %.2f cores",
		lr.Rate(), us(r.cpuPerReq(clockServer)), ms(r.p50), ms(r.p99), lr.Errors, r.otherCores())
	switch {
	case cl != nil && cl.bad.Load() > 0:
		b.Fail("%s: %d answers or connections were not as they must be; the first error: %v", label, cl.bad.Load(), lr.FirstErr)
	case lr.Errors > 0:
		b.Fail("%s: %d errors, the first: %v", label, lr.Errors, lr.FirstErr)
	case lr.Ops == 0:
		b.Fail("%s: no request completed in the window", label)
	}
	if lr.CPUErr != nil {
		b.Fail("%s: reading CPU time: %v", label, lr.CPUErr)
	}
	// The backend counts the warm-up too (and nginx its stub_status requests).
	if r.backendRequests < float64(lr.Ops) {
		b.Fail("%s: the backend counted %.0f requests during the row, fewer than the %d answered in the window", label, r.backendRequests, lr.Ops)
	}
	if d := r.l7; d != nil {
		if d.other > 0 {
			b.Fail("%s: l7d answered %.0f requests with another status than 200", label, d.other)
		}
		if d.ok < float64(lr.Ops) {
			b.Fail("%s: l7d counted %.0f requests answered 200, fewer than the %d answered in the window", label, d.ok, lr.Ops)
		}
	}
	return nil
}

// cpuPerReq is a clock's CPU time per request completed in the window.
func (r *proxyRow) cpuPerReq(clock int) time.Duration { return r.res.CPUPerOp(clock) }

// cores is a clock's CPU in cores over the window.
func (r *proxyRow) cores(clock int) float64 {
	if r.res.Elapsed <= 0 || clock >= len(r.res.CPU) {
		return 0
	}
	return r.res.CPU[clock].Seconds() / r.res.Elapsed.Seconds()
}

// otherCores is what every process but the load generator, the proxy and the
// backend used, in cores.
func (r *proxyRow) otherCores() float64 {
	return max(r.cores(clockMachine)-r.cores(clockSelf)-r.cores(clockServer)-r.cores(clockBackend), 0)
}

// startProfile collects a CPU profile and an allocation profile of s over the
// measured window of a row, when s is the profiling variant of l7d, into -profile's
// directory. The returned function waits for them.
func (b *bench) startProfile(ctx context.Context, s *endpoint, gen string, round int) (wait func()) {
	if s.pprofURL == "" {
		return func() {}
	}
	seconds := int((b.o.duration + time.Second - 1) / time.Second)
	base := fmt.Sprintf("%s/%s-%s-round%d", b.o.profileDir, s.id, gen, round+1)
	return benchkit.FetchProfiles(ctx, s.pprofURL, base, b.o.warmup, seconds, func(what, path string, err error) {
		if err != nil {
			b.Progress("  %s profile of %s: %v", what, s.id, err)
			return
		}
		b.Progress("  %s profile of %s written to %s", what, s.id, path)
	})
}

// backendRequests reads the backend's count of requests: nginx's stub_status
// ("server accepts handled requests" and the numbers under it) or the Go backend's
// /stats.
func backendRequests(e *endpoint) (float64, error) {
	text, err := httpGet(e.statsURL)
	if err != nil {
		return 0, fmt.Errorf("backend request count: %w", err)
	}
	if e.nginx {
		return parseStubStatus(text)
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
	if err != nil {
		return 0, fmt.Errorf("backend /stats %q: %w", text, err)
	}
	return v, nil
}

// parseStubStatus returns the requests nginx's stub_status counted:
//
//	Active connections: 3
//	server accepts handled requests
//	 10 10 123
//	Reading: 0 Writing: 1 Waiting: 2
func parseStubStatus(text string) (float64, error) {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "server accepts handled requests" || i+1 == len(lines) {
			continue
		}
		f := strings.Fields(lines[i+1])
		if len(f) != 3 {
			break
		}
		return strconv.ParseFloat(f[2], 64)
	}
	return 0, fmt.Errorf("stub_status: no request count in %q", text)
}

// l7Counters is what l7d's own metrics counted: requests answered 200 and
// otherwise, the Go runtime's allocation and garbage collections, and its GOMAXPROCS
// sizing.
type l7Counters struct {
	ok, other            float64
	allocBytes, gcCycles float64
	procs                benchkit.Procs
}

func (c *l7Counters) minus(o *l7Counters) *l7Counters {
	return &l7Counters{c.ok - o.ok, c.other - o.other, c.allocBytes - o.allocBytes, c.gcCycles - o.gcCycles,
		c.procs.Since(o.procs)}
}

// perRequest returns l7d's bytes allocated per request and GC cycles per 1000
// requests, by its own count of requests.
func (c *l7Counters) perRequest() (allocKB, gcPer1000 float64, ok bool) {
	if c == nil || c.ok <= 0 {
		return 0, 0, false
	}
	return c.allocBytes / 1024 / c.ok, 1000 * c.gcCycles / c.ok, true
}

// scrapeL7 reads l7d's counters; nil for the other servers.
func scrapeL7(s *endpoint) (*l7Counters, error) {
	if s.metricsURL == "" {
		return nil, nil
	}
	ss, err := promtext.Get(context.Background(), nil, s.metricsURL)
	if err != nil {
		return nil, fmt.Errorf("l7d metrics: %w", err)
	}
	return l7CountersOf(ss), nil
}

// parseL7Metrics reads l7d's counters from the Prometheus text format.
func parseL7Metrics(r io.Reader) (*l7Counters, error) {
	ss, err := promtext.Parse(r)
	if err != nil {
		return nil, err
	}
	return l7CountersOf(ss), nil
}

// l7CountersOf sums tiergate_http_requests_total by code (200 or not) and reads
// go_memstats_alloc_bytes_total, go_gc_duration_seconds_count and the GOMAXPROCS
// sizing.
func l7CountersOf(ss promtext.Samples) *l7Counters {
	return &l7Counters{
		ok:         ss.Sum("tiergate_http_requests_total", `code="200"`),
		other:      ss.Sum("tiergate_http_requests_total", `!code="200"`),
		allocBytes: ss.Sum("go_memstats_alloc_bytes_total"),
		gcCycles:   ss.Sum("go_gc_duration_seconds_count"),
		procs:      benchkit.ProcsOf(ss),
	}
}

func httpGet(url string) (string, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}
