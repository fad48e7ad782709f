package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
)

// Arguments that make the program one of its own child processes.
const (
	childStore = "-serve-store"
	childRSS   = "-rss-child"
)

// quiet is the logger of the store clients and agents: their routine logs would
// drown the report.
var quiet = slog.New(slog.DiscardHandler)

// serveStore is the store's child process: it opens the embedded store in the
// directory given, writes "ready <endpoint>" to stdout and serves until its stdin
// closes or SIGTERM.
func serveStore(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "bench-control: -serve-store DIR")
		return 2
	}
	ctx := context.Background()
	s, err := store.Open(ctx, store.Config{Dir: args[0], Logger: quiet})
	if err != nil {
		fmt.Fprintf(stderr, "bench-control store: %v\n", err)
		return 1
	}
	defer s.Close()
	fmt.Fprintf(stdout, "ready unix://%s\n", filepath.Join(args[0], "etcd.sock"))
	io.Copy(io.Discard, os.Stdin) // until the parent closes it (or dies)
	return 0
}

// storeProc is the store's child process, seen from the parent.
type storeProc struct {
	cmd      *exec.Cmd
	stdin    io.Closer
	endpoint string
}

// startStore starts the store's child process in dir.
func startStore(ctx context.Context, dir string) (*storeProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, childStore, dir)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the store: %w", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	ep, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	if err != nil || !ok {
		stdin.Close()
		cmd.Wait()
		return nil, fmt.Errorf("the store did not start (%q, %v)", line, err)
	}
	return &storeProc{cmd: cmd, stdin: stdin, endpoint: ep}, nil
}

// stop ends the store's process and waits for it.
func (p *storeProc) stop() error {
	p.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		return errors.New("the store did not stop within 30s")
	}
}

// openClient opens a store client of its own to endpoint.
func openClient(ctx context.Context, endpoint string) (*store.Store, error) {
	return store.Open(ctx, store.Config{Endpoints: []string{endpoint}, Logger: quiet})
}

// poolJSON is pool name's value, its members numbered from seq.
func poolJSON(name string, seq int) []byte {
	var ms []string
	for i := range 8 {
		n := seq*8 + i
		ms = append(ms, fmt.Sprintf(`{"addr":"198.18.%d.%d:8080"}`, n/250%250, n%250+1))
	}
	return fmt.Appendf(nil, `{"name":%q,"members":[%s],"balance":"round_robin"}`, name, strings.Join(ms, ","))
}

// run runs the phases chosen and writes the report.
func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "bench-control-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sp, err := startStore(ctx, filepath.Join(dir, "store"))
	if err != nil {
		return err
	}
	defer sp.stop()
	w, err := openClient(ctx, sp.endpoint)
	if err != nil {
		return err
	}
	defer w.Close()
	fmt.Fprintf(o.out, "bench-control: store (embedded etcd) in a child process at %s; %d cores, GOMAXPROCS %d\n",
		sp.endpoint, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	var rev int64
	for i := range o.pools {
		if rev, err = w.Put(ctx, model.KindPool, fmt.Sprintf("pool-%03d", i), poolJSON(fmt.Sprintf("pool-%03d", i), i), store.Any); err != nil {
			return fmt.Errorf("writing the configuration: %w", err)
		}
	}
	ss, err := w.Snapshot(ctx)
	if err != nil {
		return err
	}
	size := 0
	for _, obj := range ss.All() {
		size += len(obj.Value)
	}
	fmt.Fprintf(o.out, "configuration: %d pools of 8 members, %d KiB, at revision %d\n\n", o.pools, size>>10, rev)

	r := &report{opts: o, shapes: map[string]map[string]benchkit.Latencies{}}
	wr := &writer{st: w, pools: o.pools, seq: o.pools}
	for _, ph := range o.phases {
		fmt.Fprintf(o.log, "bench-control: phase %s\n", ph)
		switch ph {
		case "propagate":
			err = r.propagate(ctx, sp.endpoint, filepath.Join(dir, "agents"), wr)
		case "watch":
			err = r.watch(ctx, sp.endpoint, wr)
		case "rss":
			err = r.rss(ctx, sp.endpoint)
		case "cert":
			err = r.cert(ctx, filepath.Join(dir, "cert"))
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.failures = append(r.failures, fmt.Sprintf("phase %s: %v", ph, err))
		}
	}
	return r.write()
}

// writer makes the benchmark's writes: each replaces one pool's members.
type writer struct {
	st    *store.Store
	pools int
	seq   int
}

// write makes one write and returns its revision and when the store answered.
func (w *writer) write(ctx context.Context) (int64, time.Time, error) {
	w.seq++
	name := fmt.Sprintf("pool-%03d", w.seq%w.pools)
	rev, err := w.st.Put(ctx, model.KindPool, name, poolJSON(name, w.seq), store.Any)
	return rev, time.Now(), err
}

// tracker records, for each of n receivers (agents or watchers), when each
// revision reached it, and waits for them all to reach one.
type tracker struct {
	mu   sync.Mutex
	cond *sync.Cond
	at   [][]arrival // per receiver, in order
	last []int64
}

type arrival struct {
	rev int64
	t   time.Time
}

func newTracker(n int) *tracker {
	t := &tracker{at: make([][]arrival, n), last: make([]int64, n)}
	t.cond = sync.NewCond(&t.mu)
	return t
}

// arrived records that receiver i has reached rev.
func (t *tracker) arrived(i int, rev int64) {
	now := time.Now()
	t.mu.Lock()
	if rev > t.last[i] {
		t.last[i] = rev
		t.at[i] = append(t.at[i], arrival{rev, now})
		t.cond.Broadcast()
	}
	t.mu.Unlock()
}

// wait waits until every receiver reached rev, or timeout.
func (t *tracker) wait(rev int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { t.mu.Lock(); t.cond.Broadcast(); t.mu.Unlock() })
	defer timer.Stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		behind := 0
		for _, l := range t.last {
			if l < rev {
				behind++
			}
		}
		if behind == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d receivers had not reached revision %d within %v", behind, len(t.last), rev, timeout)
		}
		t.cond.Wait()
	}
}

// latency returns the time from accepted to the last receiver having reached rev.
func (t *tracker) latency(rev int64, accepted time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var last time.Time
	for _, arr := range t.at {
		for _, a := range arr {
			if a.rev >= rev {
				if a.t.After(last) {
					last = a.t
				}
				break
			}
		}
	}
	return last.Sub(accepted)
}

// write is one write of a shape.
type written struct {
	rev      int64
	accepted time.Time
}

// shapes runs the three load shapes against the receivers tr follows and returns
// each write's latency by shape.
func (r *report) runShapes(ctx context.Context, wr *writer, tr *tracker) (map[string]benchkit.Latencies, error) {
	o := r.opts
	out := map[string]benchkit.Latencies{}
	measure := func(ws []written) benchkit.Latencies {
		d := make([]time.Duration, len(ws))
		for i, w := range ws {
			d[i] = tr.latency(w.rev, w.accepted)
		}
		return benchkit.NewLatencies(d)
	}
	// One at a time.
	var ws []written
	for range o.writes {
		rev, at, err := wr.write(ctx)
		if err != nil {
			return out, err
		}
		ws = append(ws, written{rev, at})
		if err := tr.wait(rev, o.timeout); err != nil {
			return out, fmt.Errorf("sequential: %w", err)
		}
	}
	out["sequential"] = measure(ws)
	// Bursts.
	ws = ws[:0]
	for len(ws) < o.writes {
		var rev int64
		for range min(o.burst, o.writes-len(ws)) {
			var at time.Time
			var err error
			if rev, at, err = wr.write(ctx); err != nil {
				return out, err
			}
			ws = append(ws, written{rev, at})
		}
		if err := tr.wait(rev, o.timeout); err != nil {
			return out, fmt.Errorf("burst: %w", err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return out, err
		}
	}
	out[fmt.Sprintf("burst of %d", o.burst)] = measure(ws)
	// A Poisson arrival rate, not waiting for the receivers between writes.
	ws = ws[:0]
	rng := rand.New(rand.NewPCG(1, 2))
	next := time.Now()
	for range o.writes {
		next = next.Add(time.Duration(rng.ExpFloat64() / o.rate * float64(time.Second)))
		if err := sleep(ctx, time.Until(next)); err != nil {
			return out, err
		}
		rev, at, err := wr.write(ctx)
		if err != nil {
			return out, err
		}
		ws = append(ws, written{rev, at})
	}
	if err := tr.wait(ws[len(ws)-1].rev, o.timeout); err != nil {
		return out, fmt.Errorf("rate: %w", err)
	}
	out[fmt.Sprintf("%.0f/s Poisson", o.rate)] = measure(ws)
	return out, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startAgents starts n agents, each with a client of its own, and returns a
// function that stops them all. Agent i reports to tr as receiver i.
func startAgents(ctx context.Context, endpoint, cacheDir string, n int, tr *tracker) (stop func(), err error) {
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	for i := range n {
		node := fmt.Sprintf("bench-l7-%04d", i)
		a, err := agent.New(agent.Config{
			Open:      func(ctx context.Context) (*store.Store, error) { return openClient(ctx, endpoint) },
			Node:      node,
			Role:      "l7d",
			CacheFile: filepath.Join(cacheDir, node+".json"),
			Apply: func(_ context.Context, _ *model.Snapshot, rev int64) error {
				tr.arrived(i, rev)
				return nil
			},
			Logger: quiet,
		})
		if err != nil {
			stop()
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.Run(actx)
		}()
	}
	return stop, nil
}

// propagate measures the agents.
func (r *report) propagate(ctx context.Context, endpoint, cacheDir string, wr *writer) error {
	tr := newTracker(r.opts.agents)
	t0 := time.Now()
	stop, err := startAgents(ctx, endpoint, cacheDir, r.opts.agents, tr)
	if err != nil {
		return err
	}
	defer stop()
	cur, err := wr.st.Snapshot(ctx)
	if err != nil {
		return err
	}
	if err := tr.wait(cur.Revision, 2*r.opts.timeout); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	r.agentsStart = time.Since(t0)
	if r.opts.cpuProf != "" {
		f, err := os.Create(r.opts.cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := r.runShapes(ctx, wr, tr)
	r.shapes["agents"] = res
	return err
}

// watch measures plain etcd watchers.
func (r *report) watch(ctx context.Context, endpoint string, wr *writer) error {
	n := r.opts.agents
	tr := newTracker(n)
	cur, err := wr.st.Snapshot(ctx)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range n {
		c, err := openClient(ctx, endpoint)
		if err != nil {
			return err
		}
		ch := c.Client().Watch(clientv3.WithRequireLeader(wctx), store.Prefix, clientv3.WithPrefix(), clientv3.WithRev(cur.Revision+1))
		tr.arrived(i, cur.Revision)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			for resp := range ch {
				if n := len(resp.Events); n > 0 {
					tr.arrived(i, resp.Events[n-1].Kv.ModRevision)
				}
			}
		}()
	}
	res, err := r.runShapes(ctx, wr, tr)
	r.shapes["etcd watchers"] = res
	return err
}

// rssResult is the rss child's answer.
type rssResult struct {
	Agents    int   `json:"agents"`
	BeforeKiB int64 `json:"before_kib"`
	AfterKiB  int64 `json:"after_kib"`
	// HeapKiB is the Go heap in use after, less before.
	HeapKiB int64   `json:"heap_kib"`
	StartS  float64 `json:"start_s"`
}

// rss runs the rss child and records its answer.
func (r *report) rss(ctx context.Context, endpoint string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-control-rss-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, exe, childRSS, endpoint, fmt.Sprint(r.opts.rssAgents), dir, r.opts.memProf)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("the rss child: %w", err)
	}
	var res rssResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("the rss child's answer %q: %w", out, err)
	}
	r.rssRes = &res
	return nil
}

// rssChild starts agents and reports its resident memory before and after.
func rssChild(args []string, stdout, stderr io.Writer) int {
	var n int
	if len(args) != 4 {
		fmt.Fprintln(stderr, "bench-control: -rss-child ENDPOINT N DIR MEMPROFILE")
		return 2
	}
	if _, err := fmt.Sscan(args[1], &n); err != nil || n < 1 {
		fmt.Fprintln(stderr, "bench-control: -rss-child: N")
		return 2
	}
	ctx := context.Background()
	c, err := openClient(ctx, args[0])
	if err != nil {
		fmt.Fprintf(stderr, "bench-control rss: %v\n", err)
		return 1
	}
	cur, err := c.Snapshot(ctx)
	c.Close()
	if err != nil {
		fmt.Fprintf(stderr, "bench-control rss: %v\n", err)
		return 1
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	before, err := vmRSS()
	if err != nil {
		fmt.Fprintf(stderr, "bench-control rss: %v\n", err)
		return 1
	}
	tr := newTracker(n)
	t0 := time.Now()
	stop, err := startAgents(ctx, args[0], args[2], n, tr)
	if err != nil {
		fmt.Fprintf(stderr, "bench-control rss: %v\n", err)
		return 1
	}
	if err := tr.wait(cur.Revision, 4*time.Minute); err != nil {
		fmt.Fprintf(stderr, "bench-control rss: %v\n", err)
		return 1
	}
	start := time.Since(t0)
	// Settle: the agents' status reports are written, then one collection.
	time.Sleep(2 * time.Second)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	after, err := vmRSS()
	if err != nil {
		fmt.Fprintf(stderr, "bench-control rss: %v\n", err)
		return 1
	}
	if args[3] != "" {
		if f, err := os.Create(args[3]); err == nil {
			pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
	json.NewEncoder(stdout).Encode(rssResult{Agents: n, BeforeKiB: before, AfterKiB: after, HeapKiB: (int64(m1.HeapInuse) - int64(m0.HeapInuse)) >> 10, StartS: start.Seconds()})
	stop()
	return 0
}

// vmRSS returns the process's resident set size in KiB.
func vmRSS() (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kib int64
			if _, err := fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kib); err != nil {
				return 0, err
			}
			return kib, nil
		}
	}
	return 0, errors.New("no VmRSS in /proc/self/status")
}
