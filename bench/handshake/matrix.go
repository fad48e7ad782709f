package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// The load-shape matrix: every connection a full TLS 1.3 handshake (RSA-2048,
// X25519) and, in the rows with a request, one HTTPS request (GET /, answered
// `200 ok` by the server itself); the handshake-only rows beside them. Each shape is
// measured on every server back to back; the figure is the server's CPU time per
// connection completed (l7d's process; for l7d-offload keyserverd's is shown apart,
// since the L7 node's CPU is what is compared).

// Load generators.
const (
	genOwn    = "bench-handshake" // Go crypto/tls clients in this process
	genH2load = "h2load"          // nghttp2's h2load --h1 (Debian nghttp2-client)
	genSTime  = "openssl s_time"  // OpenSSL's s_time -new -tls1_3
)

// Shape kinds.
const (
	kindClosed  = "closed"  // n connections in flight, each followed by the next
	kindBurst   = "burst"   // n connections started at once, each made once
	kindPoisson = "poisson" // new connections arriving at a rate, Poisson
	kindTimed   = "timed"   // an outside generator that runs for -matrix-duration
)

// shape is one load shape of the matrix.
type shape struct {
	name    string // key of the by-shape maps
	gen     string
	kind    string
	n       int  // in flight (closed), connections (burst)
	request bool // one HTTPS request on each connection
	what    string
}

// matrixShapes are the shapes, in the order they run: the closed loops come before
// the Poisson rows, whose rate is half of nginx's best closed-loop rate.
func matrixShapes(burst int) []shape {
	var out []shape
	for _, req := range []bool{true, false} {
		suffix, what := "", "handshake + GET"
		if !req {
			suffix, what = "_hs", "handshake only"
		}
		out = append(out,
			shape{"sequential" + suffix, genOwn, kindClosed, 1, req, "one client, one connection after another; " + what},
			shape{"closed8" + suffix, genOwn, kindClosed, 8, req, "closed loop, 8 in flight; " + what},
			shape{"closed32" + suffix, genOwn, kindClosed, 32, req, "closed loop, 32 in flight; " + what},
			shape{"closed256" + suffix, genOwn, kindClosed, 256, req, "closed loop, 256 in flight; " + what},
			shape{fmt.Sprintf("burst%d", burst) + suffix, genOwn, kindBurst, burst, req, fmt.Sprintf("%d connections started at once; %s", burst, what)},
		)
	}
	out = append(out,
		shape{fmt.Sprintf("burst%d_h2load", burst), genH2load, kindBurst, burst, true, fmt.Sprintf("h2load --h1 -n %d -c %d", burst, burst)},
		shape{"sequential_s_time", genSTime, kindTimed, 1, true, "openssl s_time -new -tls1_3 -www /"},
		shape{"sequential_s_time_hs", genSTime, kindTimed, 1, false, "openssl s_time -new -tls1_3"},
	)
	for _, req := range []bool{true, false} {
		suffix, what := "", "handshake + GET"
		if !req {
			suffix, what = "_hs", "handshake only"
		}
		out = append(out, shape{"poisson" + suffix, genOwn, kindPoisson, 0, req, "open loop, Poisson arrivals at half nginx's best closed-loop rate; " + what})
	}
	return out
}

// mrow is one server in one shape.
type mrow struct {
	sh       shape
	srv      *server
	conns    int // connections completed
	errors   int
	firstErr error
	elapsed  time.Duration
	cpu      []time.Duration // by matrix clock
	ks       bool
	rate     float64         // Poisson rows: the arrival rate asked for
	dropped  int             // Poisson rows: arrivals not started, too many in flight
	l7hs     float64         // l7d's own count of handshakes in the row
	procs    *benchkit.Procs // l7d's Ps at the row's end and their changes in it
	note     string
	// The connections' times, connect to the response read (or the server's close):
	// the latency the CPU figure was bought with. This program's generator only.
	latency benchkit.Latencies
	// breakdown is perf's samples of the server in the row by part (breakdown.go);
	// nil when not sampled.
	breakdown *breakdown
}

// The matrix rows' clocks.
const (
	mclockServer = iota
	mclockKeyserver
	mclockSelf
	mclockMachine
	mclockChildren // outside generators (their process), else 0
	mclockUser     // the server's user-mode CPU
	// The server's scheduler counters (sched.go), read as clocks.
	mclockVoluntary
	mclockInvoluntary
	mclockRunqWait
	mclockSlices
	nMClocks
)

// perConnCount is a scheduler counter per connection completed.
func (r *mrow) perConnCount(clock int) float64 {
	if r.conns == 0 || clock >= len(r.cpu) {
		return 0
	}
	return float64(r.cpu[clock]) / float64(r.conns)
}

func (r *mrow) perConn(clock int) time.Duration {
	if r.conns == 0 || clock >= len(r.cpu) {
		return 0
	}
	return r.cpu[clock] / time.Duration(r.conns)
}

func (r *mrow) cores(clock int) float64 {
	if r.elapsed <= 0 || clock >= len(r.cpu) {
		return 0
	}
	return r.cpu[clock].Seconds() / r.elapsed.Seconds()
}

func (r *mrow) otherCores() float64 {
	ours := r.cores(mclockServer) + r.cores(mclockKeyserver) + r.cores(mclockSelf) + r.cores(mclockChildren)
	return max(r.cores(mclockMachine)-ours, 0)
}

// runMatrix measures every selected shape on every server.
func (b *bench) runMatrix(ctx context.Context) error {
	if len(b.o.matrix) > 0 && b.o.matrixServerWarmup > 0 {
		for _, s := range b.fl.servers {
			if s.id == srvGoTLS {
				continue
			}
			if err := b.warmServer(ctx, s); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				b.Fail("warming %s up: %v", s.id, err)
			}
		}
	}
	for _, sh := range b.o.matrix {
		if sh.kind == kindPoisson && b.poissonRate() <= 0 {
			b.Fail("%s: no arrival rate: give -poisson-rate or measure nginx in a closed loop with a request", sh.name)
			continue
		}
		for rep := 0; rep < b.o.matrixRepeat; rep++ {
			for _, s := range b.fl.servers {
				if s.id == srvGoTLS || s.floor && !floorShape(sh) {
					continue
				}
				r, err := b.measureShape(ctx, s, sh)
				if err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					b.Fail("%s, %s: %v", sh.name, s.id, err)
					continue
				}
				b.mrows = append(b.mrows, r)
			}
		}
	}
	return nil
}

// serverWarmupClients are the clients of a server's warm-up (-matrix-server-warmup).
const serverWarmupClients = 8

// warmServer gives s, before its first measured row, the work of the rows to come
// for -matrix-server-warmup, unmeasured: its heap, pools, threads and (offloaded)
// keyserver sessions grown, as they are in every later row. Without it, the first
// shape's first row carried them: l7d offloaded cost 1,320 µs a connection with
// keyserverd 4,000 in the first sequential row of a run, 905 and 3,000 in the second.
func (b *bench) warmServer(ctx context.Context, s *server) error {
	cl := newClient(s.addr, tls.VersionTLS13, false, serverWarmupClients, b.o.opTimeout, b.o.verifyEvery, b.f.siteCA.Pool())
	cl.request = true
	res, err := benchkit.Run(ctx, benchkit.Load{Workers: serverWarmupClients, Duration: b.o.matrixServerWarmup, MaxOps: b.o.maxOps, Op: cl.op})
	if err != nil {
		return err
	}
	b.Progress("warm-up of %s: %d connections in %v, not measured, %d errors", s.id, res.Ops, b.o.matrixServerWarmup, res.Errors)
	if res.Errors > 0 {
		return fmt.Errorf("%d errors, the first: %v", res.Errors, res.FirstErr)
	}
	return nil
}

// poissonRate is the Poisson rows' arrival rate: -poisson-rate, or half of nginx's
// best rate in the closed loops with a request.
func (b *bench) poissonRate() float64 {
	if b.o.poissonRate > 0 {
		return b.o.poissonRate
	}
	best := 0.0
	for _, r := range b.mrows {
		if r.srv.id == srvNginx && r.sh.kind == kindClosed && r.sh.request && r.elapsed > 0 {
			best = max(best, float64(r.conns)/r.elapsed.Seconds())
		}
	}
	return best / 2
}

func zeroClock() (time.Duration, error) { return 0, nil }

func readClocks(clocks []benchkit.CPUClock) ([]time.Duration, error) {
	out := make([]time.Duration, len(clocks))
	for i, c := range clocks {
		if c == nil {
			continue
		}
		v, err := c()
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (b *bench) measureShape(ctx context.Context, s *server, sh shape) (*mrow, error) {
	for _, p := range []*benchkit.Process{s.proc, s.ks} {
		if p == nil {
			continue
		}
		select {
		case <-p.Done():
			return nil, p.Exited()
		default:
		}
	}
	ks := s.ks != nil
	clocks := make([]benchkit.CPUClock, nMClocks)
	for i := range clocks {
		clocks[i] = zeroClock
	}
	clocks[mclockServer] = s.clock
	clocks[mclockSelf] = benchkit.SelfCPU
	clocks[mclockMachine] = benchkit.MachineBusyCPU
	if ks {
		clocks[mclockKeyserver] = s.ks.CPU()
	}
	if s.userClock != nil {
		clocks[mclockUser] = s.userClock
	}
	if len(s.schedPIDs) > 0 {
		pids := func() []int { return s.schedPIDs }
		clocks[mclockVoluntary] = schedClock(pids, schedVoluntary)
		clocks[mclockInvoluntary] = schedClock(pids, schedInvoluntary)
		clocks[mclockRunqWait] = schedClock(pids, schedRunqWait)
		clocks[mclockSlices] = schedClock(pids, schedSlices)
	}
	ours := []benchkit.CPUClock{benchkit.SelfCPU, s.clock}
	if ks {
		ours = append(ours, clocks[mclockKeyserver])
	}
	if b.o.matrixQuiet > 0 {
		if others, quiet, err := benchkit.WaitQuiet(ctx, b.o.quietCores, b.o.matrixQuiet, ours...); err != nil {
			return nil, err
		} else if !quiet {
			b.Progress("  other processes use %.2f cores: measuring anyway", others)
		}
	}
	before, _ := b.scrape(s)
	r := &mrow{sh: sh, srv: s, ks: ks}
	var prof *profiler
	if b.breakdownOK && len(s.schedPIDs) > 0 {
		var err error
		if prof, err = startProfile(b.f.dir, fmt.Sprintf("%s-%s", sh.name, s.id), s.schedPIDs); err != nil {
			b.Progress("  perf record: %v: no CPU breakdown of this row", err)
		}
	}
	var err error
	switch sh.gen {
	case genOwn:
		err = b.runOwn(ctx, r, clocks)
	case genH2load:
		err = b.runH2load(ctx, r, clocks)
	case genSTime:
		err = b.runSTime(ctx, r, clocks)
	}
	if prof != nil {
		var perr error
		if r.breakdown, perr = prof.stop(ctx); perr != nil {
			b.Progress("  %v: no CPU breakdown of this row", perr)
		}
	}
	if err != nil {
		return nil, err
	}
	if after, err := b.scrape(s); err == nil && before != nil && after != nil {
		d := after.minus(before)
		r.l7hs = d.hsOK
		r.procs = &d.procs
		if d.hsFailed > 0 {
			r.note = fmt.Sprintf("l7d counted %.0f failed handshakes", d.hsFailed)
		}
	}
	ksText := ""
	if ks {
		ksText = fmt.Sprintf(", keyserverd %.0f µs", us(r.perConn(mclockKeyserver)))
	}
	b.Progress("%-22s %-12s %s: %d conns in %.2fs (%.0f/s), server %.0f µs CPU per conn%s, %d errors, others %.2f cores%s",
		sh.name, s.id, sh.gen, r.conns, r.elapsed.Seconds(), float64(r.conns)/max(r.elapsed.Seconds(), 1e-9),
		us(r.perConn(mclockServer)), ksText, r.errors, r.otherCores(), r.procs.Note())
	if r.errors > 0 {
		b.Fail("%s, %s: %d errors, the first: %v", sh.name, s.id, r.errors, r.firstErr)
	}
	if r.conns == 0 {
		b.Fail("%s, %s: no connection completed", sh.name, s.id)
	}
	return r, nil
}

// runOwn drives a shape with this program's clients.
func (b *bench) runOwn(ctx context.Context, r *mrow, clocks []benchkit.CPUClock) error {
	sh := r.sh
	n := sh.n
	if sh.kind == kindPoisson {
		n = b.o.poissonMaxInFlight
	}
	timeout := b.o.opTimeout
	if sh.kind == kindBurst {
		timeout = max(timeout, 30*time.Second) // SYN retries past a full accept queue
	}
	cl := newClient(r.srv.addr, tls.VersionTLS13, false, n, timeout, b.o.verifyEvery, b.f.siteCA.Pool())
	cl.request = sh.request
	switch sh.kind {
	case kindClosed:
		res, err := benchkit.Run(ctx, benchkit.Load{
			Workers: n, Warmup: b.o.matrixWarmup, Duration: b.o.matrixDuration, MaxOps: b.o.maxOps,
			Op: cl.op, Clocks: clocks,
		})
		if err != nil {
			return err
		}
		if res.CPUErr != nil {
			return res.CPUErr
		}
		win := cl.window(res)
		r.conns, r.latency = win.ops, win.conns
		r.errors, r.firstErr, r.elapsed, r.cpu = res.Errors, res.FirstErr, res.Elapsed, res.CPU
	case kindBurst:
		err := b.timed(ctx, r, clocks, func() { r.conns, r.errors, r.firstErr = burst(ctx, cl, n) })
		r.latency = cl.between(0, math.MaxInt64).conns
		return err
	case kindPoisson:
		r.rate = b.poissonRate()
		err := b.timed(ctx, r, clocks, func() {
			r.conns, r.errors, r.dropped, r.firstErr = poisson(ctx, cl, r.rate, b.o.matrixDuration, n)
		})
		r.latency = cl.between(0, math.MaxInt64).conns
		return err
	}
	if bad := cl.bad.Load(); bad > 0 {
		return fmt.Errorf("%d handshakes negotiated other parameters or failed verification", bad)
	}
	return nil
}

// timed reads the clocks around run.
func (b *bench) timed(ctx context.Context, r *mrow, clocks []benchkit.CPUClock, run func()) error {
	c0, err := readClocks(clocks)
	if err != nil {
		return err
	}
	t0 := time.Now()
	run()
	r.elapsed = time.Since(t0)
	c1, err := readClocks(clocks)
	if err != nil {
		return err
	}
	r.cpu = make([]time.Duration, len(clocks))
	for i := range clocks {
		r.cpu[i] = c1[i] - c0[i]
	}
	return ctx.Err()
}

// burst makes n connections at once, each once.
func burst(ctx context.Context, cl *client, n int) (ok, errs int, firstErr error) {
	var (
		wg    sync.WaitGroup
		nok   atomic.Int64
		nerr  atomic.Int64
		once  sync.Once
		start = make(chan struct{})
	)
	for i := range n {
		wg.Go(func() {
			<-start
			if err := cl.op(ctx, i, uint64(i)); err != nil {
				nerr.Add(1)
				once.Do(func() { firstErr = err })
				return
			}
			nok.Add(1)
		})
	}
	time.Sleep(10 * time.Millisecond) // every goroutine parked on start
	close(start)
	wg.Wait()
	return int(nok.Load()), int(nerr.Load()), firstErr
}

// poisson starts connections at exponentially distributed intervals of mean 1/rate
// for d, with at most maxInFlight of them in flight (an arrival finding that many is
// dropped and counted), and waits for them all.
func poisson(ctx context.Context, cl *client, rate float64, d time.Duration, maxInFlight int) (ok, errs, dropped int, firstErr error) {
	var (
		wg   sync.WaitGroup
		nok  atomic.Int64
		nerr atomic.Int64
		once sync.Once
		free = make(chan int, maxInFlight) // client slots (each has its config)
	)
	for i := range maxInFlight {
		free <- i
	}
	rng := rand.New(rand.NewPCG(1, 2)) // the same arrivals for every server
	start := time.Now()
	next := start
	var seq uint64
	for ctx.Err() == nil {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		if next.Sub(start) > d {
			break
		}
		if w := time.Until(next); w > 0 {
			time.Sleep(w)
		}
		var slot int
		select {
		case slot = <-free:
		default:
			dropped++
			continue
		}
		seq++
		opSeq := seq
		wg.Go(func() {
			defer func() { free <- slot }()
			if err := cl.op(ctx, slot, opSeq); err != nil {
				nerr.Add(1)
				once.Do(func() { firstErr = err })
				return
			}
			nok.Add(1)
		})
	}
	wg.Wait()
	return int(nok.Load()), int(nerr.Load()), dropped, firstErr
}

var (
	h2loadRequestsRE = regexp.MustCompile(`requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2loadStatusRE   = regexp.MustCompile(`status codes: (\d+) 2xx`)
	h2loadTLSRE      = regexp.MustCompile(`TLS Protocol: (\S+)`)
	h2loadKeyRE      = regexp.MustCompile(`Server Temp Key: (\S+)`)
	sTimeRE          = regexp.MustCompile(`(\d+) connections in (\d+) real seconds`)
)

// parseH2load reads the requests that succeeded with a 2xx answer from h2load's
// output, and checks it made TLS 1.3 over X25519.
func parseH2load(out string) (ok, failed int, err error) {
	m := h2loadRequestsRE.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, errors.New("no request counts in h2load's output")
	}
	total, _ := strconv.Atoi(m[1])
	succeeded, _ := strconv.Atoi(m[4])
	s2 := h2loadStatusRE.FindStringSubmatch(out)
	if s2 == nil {
		return 0, 0, errors.New("no status codes in h2load's output")
	}
	ok2xx, _ := strconv.Atoi(s2[1])
	if p := h2loadTLSRE.FindStringSubmatch(out); p == nil || p[1] != "TLSv1.3" {
		return 0, 0, fmt.Errorf("h2load did not report TLSv1.3: %v", p)
	}
	if k := h2loadKeyRE.FindStringSubmatch(out); k == nil || k[1] != "X25519" {
		return 0, 0, fmt.Errorf("h2load did not report an X25519 key exchange: %v", k)
	}
	ok = min(succeeded, ok2xx)
	return ok, total - ok, nil
}

// parseSTime reads the connections s_time made and the seconds it took.
func parseSTime(out string) (conns int, secs int, err error) {
	m := sTimeRE.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, errors.New("no connection count in s_time's output")
	}
	conns, _ = strconv.Atoi(m[1])
	secs, _ = strconv.Atoi(m[2])
	return conns, secs, nil
}

// runExternal runs an outside generator, reading the clocks around it (its own CPU
// through its process), and returns its output.
func (b *bench) runExternal(ctx context.Context, r *mrow, clocks []benchkit.CPUClock, name string, args ...string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found (make deps installs it): %w", name, err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	var runErr error
	if err := b.timed(ctx, r, clocks, func() { runErr = cmd.Run() }); err != nil {
		return out.String(), err
	}
	if cmd.ProcessState != nil {
		r.cpu[mclockChildren] = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	if err := runErr; err != nil {
		return out.String(), fmt.Errorf("%s %s: %w; output:\n%s", name, strings.Join(args, " "), err, tail(out.String(), 20))
	}
	return out.String(), nil
}

func (b *bench) runH2load(ctx context.Context, r *mrow, clocks []benchkit.CPUClock) error {
	n := r.sh.n
	out, err := b.runExternal(ctx, r, clocks, "h2load", "--h1", "-n", strconv.Itoa(n), "-c", strconv.Itoa(n),
		"--tls13-ciphers", "TLS_AES_128_GCM_SHA256", "https://"+r.srv.addr+"/")
	if err != nil {
		return err
	}
	ok, failed, err := parseH2load(out)
	if err != nil {
		return fmt.Errorf("%w; output:\n%s", err, tail(out, 20))
	}
	r.conns, r.errors = ok, failed
	if failed > 0 {
		// h2load names no error per connection: its count of them says what kind.
		r.firstErr = fmt.Errorf("h2load: %s", h2loadRequestsRE.FindString(out))
	}
	return nil
}

func (b *bench) runSTime(ctx context.Context, r *mrow, clocks []benchkit.CPUClock) error {
	secs := max(int(b.o.matrixDuration.Seconds()+0.5), 1)
	args := []string{"s_time", "-connect", r.srv.addr, "-new", "-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256", "-time", strconv.Itoa(secs)}
	if r.sh.request {
		args = append(args, "-www", "/")
	}
	out, err := b.runExternal(ctx, r, clocks, "openssl", args...)
	if err != nil {
		return err
	}
	conns, _, err := parseSTime(out)
	if err != nil {
		return fmt.Errorf("%w; output:\n%s", err, tail(out, 20))
	}
	r.conns = conns
	if strings.Contains(out, "ERROR") || strings.Contains(out, "error") {
		r.errors = 1
		r.firstErr = fmt.Errorf("s_time: %s", tail(out, 8))
	}
	return nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// matrixSummary is the matrix part of the last line.
type matrixSummary struct {
	VsNginxMin         *float64            `json:"vs_nginx_min"`
	OffloadGainMin     *float64            `json:"offload_gain_min"`
	VsNginxMinShape    string              `json:"vs_nginx_min_shape"`
	OffloadGainMinShp  string              `json:"offload_gain_min_shape"`
	VsNginxMinMet      *bool               `json:"vs_nginx_min_target_met"`
	OffloadGainMinMet  *bool               `json:"offload_gain_min_target_met"`
	VsNginxByShape     map[string]float64  `json:"vs_nginx_by_shape"`
	OffloadGainByShape map[string]float64  `json:"offload_gain_by_shape"`
	CPUUsByShape       map[string]shapeCPU `json:"cpu_us_per_conn_by_shape"`
	PoissonRate        float64             `json:"poisson_rate_per_s"`
	// FloorByShape is the floor of each sequential shape (floor.go); absent without.
	FloorByShape map[string]floorSum `json:"floor_by_shape,omitempty"`
	// Crypto is the public-key operations' cost the floor is read with.
	Crypto *cryptoCosts `json:"public_key_crypto,omitempty"`
	// CPUBreakdown is where each server's CPU goes in each shape, µs per connection
	// by part (breakdown.go); absent without -breakdown.
	CPUBreakdown map[string]map[string]breakdownSum `json:"cpu_breakdown_by_shape,omitempty"`
	MatrixRows   []mrowSum                          `json:"matrix_rows"`
}

// shapeCPU is the CPU per connection of each server in one shape, in µs (the
// median of the repeats).
type shapeCPU struct {
	Generator         string   `json:"generator"`
	Request           bool     `json:"request"`
	L7Local           *float64 `json:"l7d_local"`
	L7Offload         *float64 `json:"l7d_offload"`
	KeyserverdOffload *float64 `json:"keyserverd"`
	Nginx             *float64 `json:"nginx"`
}

type mrowSum struct {
	Shape           string   `json:"shape"`
	Generator       string   `json:"generator"`
	Request         bool     `json:"request"`
	Server          string   `json:"server"`
	Conns           int      `json:"conns"`
	ConnsPerS       float64  `json:"conns_per_s"`
	CPUUs           float64  `json:"server_cpu_us_per_conn"`
	KeyserverUs     *float64 `json:"keyserverd_cpu_us_per_conn,omitempty"`
	GenUs           float64  `json:"generator_cpu_us_per_conn"`
	L7Handshake     float64  `json:"l7d_handshakes_counted,omitempty"`
	*benchkit.Procs          // l7d's Ps at the end of the row and their changes; nil for the others
	Rate            float64  `json:"arrival_rate_per_s,omitempty"`
	Dropped         int      `json:"arrivals_dropped,omitempty"`
	Errors          int      `json:"errors"`
	OtherCores      float64  `json:"other_processes_cores"`
	// Connect to the response read (or the server's close), this program's
	// generator only.
	LatencyP50Ms *float64 `json:"conn_latency_p50_ms,omitempty"`
	LatencyP99Ms *float64 `json:"conn_latency_p99_ms,omitempty"`

	// The server's threads' scheduler counters per connection (sched.go).
	VoluntaryPerConn   float64 `json:"voluntary_switches_per_conn"`
	InvoluntaryPerConn float64 `json:"involuntary_switches_per_conn"`
	RunqWaitUsPerConn  float64 `json:"runqueue_wait_us_per_conn"`
	SlicesPerConn      float64 `json:"timeslices_per_conn"`
}

// shapeMedian is the median of the CPU per connection over a shape's repeats on one
// server, in µs, over the repeats without errors when there are any (a repeat whose
// connections timed out on an overloaded machine divides all its CPU by the few that
// completed); nil when none measured.
func (b *bench) shapeMedian(name, srv string, clock int) *float64 {
	return b.shapeMedianOf(name, srv, func(r *mrow) float64 { return us(r.perConn(clock)) })
}

// shapeMedianOf is shapeMedian of f's figure of each repeat.
func (b *bench) shapeMedianOf(name, srv string, f func(*mrow) float64) *float64 {
	var v, clean []float64
	for _, r := range b.mrows {
		if r.sh.name == name && r.srv.id == srv && r.conns > 0 {
			v = append(v, f(r))
			if r.errors == 0 {
				clean = append(clean, f(r))
			}
		}
	}
	if len(clean) > 0 {
		v = clean
	}
	if len(v) == 0 {
		return nil
	}
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return ptr(round(m, 1))
}

func (b *bench) matrixReport(w io.Writer) *matrixSummary {
	if len(b.mrows) == 0 {
		return nil
	}
	ms := &matrixSummary{VsNginxByShape: map[string]float64{}, OffloadGainByShape: map[string]float64{},
		CPUUsByShape: map[string]shapeCPU{}, PoissonRate: round(b.poissonRate(), 1)}
	if b.o.matrixServerWarmup > 0 {
		fmt.Fprintf(w, "\nbefore the matrix, each server was warmed up for %v (%d clients, full handshakes with a request), not measured\n", b.o.matrixServerWarmup, serverWarmupClients)
	}
	t := benchkit.Table{Header: []string{"shape", "generator", "server", "conns", "conns/s", "server CPU µs/conn",
		"keyserverd µs/conn", "generator µs/conn", "thread sleeps/conn", "p50 ms", "p99 ms", "errors", "others' cores"}}
	last := ""
	for _, r := range b.mrows {
		if r.sh.name != last {
			t.Separator()
			last = r.sh.name
		}
		s := mrowSum{Shape: r.sh.name, Generator: r.sh.gen, Request: r.sh.request, Server: r.srv.id, Conns: r.conns,
			ConnsPerS: round(float64(r.conns)/max(r.elapsed.Seconds(), 1e-9), 1), CPUUs: round(us(r.perConn(mclockServer)), 1),
			GenUs: round(us(r.perConn(mclockSelf)+r.perConn(mclockChildren)), 1), L7Handshake: r.l7hs,
			Procs: r.procs, Rate: round(r.rate, 1), Dropped: r.dropped, Errors: r.errors, OtherCores: round(r.otherCores(), 2),
			VoluntaryPerConn: round(r.perConnCount(mclockVoluntary), 2), InvoluntaryPerConn: round(r.perConnCount(mclockInvoluntary), 2),
			RunqWaitUsPerConn: round(r.perConnCount(mclockRunqWait)/1e3, 1), SlicesPerConn: round(r.perConnCount(mclockSlices), 2)}
		ksText := "-"
		if r.ks {
			s.KeyserverUs = ptr(round(us(r.perConn(mclockKeyserver)), 1))
			ksText = fmt.Sprintf("%.0f", *s.KeyserverUs)
		}
		if len(r.latency) > 0 {
			s.LatencyP50Ms = ptr(round(benchkit.Ms(r.latency.Percentile(50)), 2))
			s.LatencyP99Ms = ptr(round(benchkit.Ms(r.latency.Percentile(99)), 2))
		}
		ms.MatrixRows = append(ms.MatrixRows, s)
		t.Row(r.sh.name, r.sh.gen, r.srv.label, r.conns, fmt.Sprintf("%.0f", s.ConnsPerS), fmt.Sprintf("%.0f", s.CPUUs),
			ksText, fmt.Sprintf("%.0f", s.GenUs), fmt.Sprintf("%.1f", s.VoluntaryPerConn), num2(s.LatencyP50Ms), num2(s.LatencyP99Ms),
			r.errors, fmt.Sprintf("%.2f", s.OtherCores))
	}
	fmt.Fprintf(w, "\nLoad-shape matrix: TLS 1.3 full handshakes (RSA-2048, X25519, AES-128-GCM), each on a new connection, with one\n")
	fmt.Fprintf(w, "HTTPS request (GET /, answered `200 ok` by the server itself) or none (_hs); server CPU = user + sys of its\n")
	fmt.Fprintf(w, "process (nginx: master and workers; l7d-offload: l7d alone, keyserverd's beside it), over the row, ÷ connections completed\n")
	fmt.Fprintf(w, "shapes:\n")
	seen := map[string]bool{}
	for _, sh := range b.o.matrix {
		if !seen[sh.name] {
			seen[sh.name] = true
			fmt.Fprintf(w, "  %-22s %-16s %s\n", sh.name, sh.gen, sh.what)
		}
	}
	t.Fprint(w)

	var vsMin, ogMin *float64
	for _, sh := range b.o.matrix {
		if _, done := ms.CPUUsByShape[sh.name]; done {
			continue
		}
		sc := shapeCPU{Generator: sh.gen, Request: sh.request,
			L7Local: b.shapeMedian(sh.name, srvL7Local, mclockServer), L7Offload: b.shapeMedian(sh.name, srvL7Offload, mclockServer),
			KeyserverdOffload: b.shapeMedian(sh.name, srvL7Offload, mclockKeyserver), Nginx: b.shapeMedian(sh.name, srvNginx, mclockServer)}
		ms.CPUUsByShape[sh.name] = sc
		if v := ratio(sc.Nginx, sc.L7Offload); v != nil {
			ms.VsNginxByShape[sh.name] = *v
			if sh.request && (vsMin == nil || *v < *vsMin) {
				vsMin, ms.VsNginxMinShape = v, sh.name
			}
		}
		if v := ratio(sc.L7Local, sc.L7Offload); v != nil {
			ms.OffloadGainByShape[sh.name] = *v
			if sh.request && (ogMin == nil || *v < *ogMin) {
				ogMin, ms.OffloadGainMinShp = v, sh.name
			}
		}
	}
	ms.VsNginxMin, ms.OffloadGainMin = vsMin, ogMin
	ms.VsNginxMinMet, ms.OffloadGainMinMet = met(vsMin, targetVsNginx), met(ogMin, targetOffloadGain)

	st := benchkit.Table{Header: []string{"shape", "generator", "l7d local µs", "l7d offload µs", "(+ keyserverd µs)", "nginx µs", "nginx ÷ offload", "local ÷ offload"}}
	for _, sh := range b.o.matrix {
		sc, ok := ms.CPUUsByShape[sh.name]
		if !ok || seen[sh.name+"/"] {
			continue
		}
		seen[sh.name+"/"] = true
		st.Row(sh.name, sh.gen, num1(sc.L7Local), num1(sc.L7Offload), num1(sc.KeyserverdOffload), num1(sc.Nginx),
			ratioText(ratio(sc.Nginx, sc.L7Offload), nil, nil), ratioText(ratio(sc.L7Local, sc.L7Offload), nil, nil))
	}
	fmt.Fprintln(w)
	st.Fprint(w)
	fmt.Fprintf(w, "over the shapes with a request on each connection: vs_nginx_min %s (%s, target ≥ %.1f: %s), offload_gain_min %s (%s, target ≥ %.1f: %s)\n",
		ratioText(vsMin, nil, nil), ms.VsNginxMinShape, targetVsNginx, passMiss(ms.VsNginxMinMet),
		ratioText(ogMin, nil, nil), ms.OffloadGainMinShp, targetOffloadGain, passMiss(ms.OffloadGainMinMet))
	if ms.PoissonRate > 0 {
		fmt.Fprintf(w, "Poisson rows: %.0f new connections/s (half of nginx's best closed-loop rate with a request, or -poisson-rate)\n", ms.PoissonRate)
	}
	ms.FloorByShape = b.floorReport(w)
	if ms.FloorByShape != nil {
		ms.Crypto = b.crypto
	}
	ms.CPUBreakdown = b.breakdownReport(w)
	return ms
}

func num1(v *float64) string {
	if v == nil || math.IsNaN(*v) {
		return "-"
	}
	return fmt.Sprintf("%.0f", *v)
}

// parseShapes selects shapes by name ("all", "none" or a comma-separated list).
func parseShapes(s string, all []shape) ([]shape, error) {
	switch strings.TrimSpace(s) {
	case "all":
		return all, nil
	case "none", "":
		return nil, nil
	}
	var out []shape
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		i := slices.IndexFunc(all, func(sh shape) bool { return sh.name == f })
		if i < 0 {
			var names []string
			for _, sh := range all {
				names = append(names, sh.name)
			}
			return nil, fmt.Errorf("unknown shape %q (known: %s)", f, strings.Join(names, ", "))
		}
		out = append(out, all[i])
	}
	// Keep the run order: closed loops before Poisson.
	slices.SortStableFunc(out, func(a, b shape) int {
		return slices.IndexFunc(all, func(s shape) bool { return s.name == a.name }) -
			slices.IndexFunc(all, func(s shape) bool { return s.name == b.name })
	})
	return out, nil
}
