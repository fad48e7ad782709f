package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/testkit/cluster"
)

// listName is the list pushed: the one every l7d (and l4d) enforces by default.
const listName = blacklist.GlobalName

// site is the server name of the certificate the l7d nodes serve.
const site = "www.bench.test"

// report is what a run measured.
type report struct {
	opts     options
	failures []string

	// l4 phase.
	l4         map[string]any
	l4Ratio    *float64
	l4Source   string
	l4Duration time.Duration

	// push phase.
	listBytes      int
	answered       time.Duration // PUT's answer
	stored         time.Duration // the operation's version known
	l7Applied      []time.Duration
	agentsFirst    time.Duration
	agentsLast     time.Duration
	lastApplied    time.Duration
	storeInUseMiB  float64
	storeFileMiB   float64
	chunks         int
	chunkBytes     int64
	deltaLat       benchkit.Latencies
	deltaL7Lat     benchkit.Latencies
	clusterStartup time.Duration
	agentsRun      int
	memAvailable   int64 // bytes, at the start of the push phase
	agentFitNote   string
	peakRSSMiB     float64 // this process's (VmHWM), at the end
	// pushCPU is the CPU time of controld, each l7d and this process (the
	// simulated nodes) from the push sent to the last node applying it.
	pushCPU []time.Duration
}

// agentPeakBytesPerEntry bounds a simulated node's memory at its peak, per entry
// of the list: it holds no table (blsync's VerifyOnly), but the chunks the watch
// delivered (some 2.2 bytes an entry) until their manifest comes, and the store
// client's buffers.
const agentPeakBytesPerEntry = 4

// fitAgents returns how many of o.agents simulated nodes fit in o.agentMemory of
// the memory available now, less what this process takes for the list it pushes
// (some 130 bytes an entry), and notes why when it is fewer.
func fitAgents(o options, r *report) int {
	avail, err := memAvailable()
	if err != nil {
		r.agentFitNote = fmt.Sprintf("memory available unknown (%v): all run", err)
		return o.agents
	}
	r.memAvailable = avail
	budget := float64(avail)*o.agentMemory - 130*float64(o.entries)
	each := float64(agentPeakBytesPerEntry) * float64(o.entries)
	n := max(0, int(budget/each))
	if n >= o.agents {
		return o.agents
	}
	r.agentFitNote = fmt.Sprintf("%d of the %d asked: each needs some %.0f MiB at its peak, and %.0f%% of the %.1f GiB available is %.1f GiB",
		n, o.agents, each/(1<<20), o.agentMemory*100, float64(avail)/(1<<30), float64(avail)*o.agentMemory/(1<<30))
	r.progress("simulated nodes: %s", r.agentFitNote)
	return n
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() (int64, error) { return procKB("/proc/meminfo", "MemAvailable:") }

// procKB reads a field given in kB from a /proc file, in bytes.
func procKB(file, field string) (int64, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("%s: %q: %w", file, line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s has no %s", file, field)
}

func (r *report) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.failures = append(r.failures, msg)
	fmt.Fprintf(r.opts.log, "bench-blacklist: %s\n", msg)
}

func (r *report) progress(format string, args ...any) {
	fmt.Fprintf(r.opts.log, "%s bench-blacklist: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, o options) error {
	r := &report{opts: o}
	if !o.skipL4 {
		r.progress("l4: go run ./bench/l4 %s", o.l4Args)
		if err := r.runL4(ctx); err != nil {
			r.fail("l4: %v", err)
		}
	}
	if ctx.Err() == nil {
		if err := r.runCluster(ctx); err != nil {
			r.fail("push: %v", err)
		}
	}
	if peak, err := procKB("/proc/self/status", "VmHWM:"); err == nil {
		r.peakRSSMiB = float64(peak) / (1 << 20)
	}
	r.write(o.out)
	if len(r.failures) > 0 {
		return benchkit.ErrFailed
	}
	return nil
}

// runL4 runs bench-l4 as a child and keeps its JSON summary.
func (r *report) runL4(ctx context.Context) error {
	start := time.Now()
	args := append([]string{"run", "./bench/l4"}, strings.Fields(r.opts.l4Args)...)
	cmd := exec.CommandContext(ctx, "go", args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = r.opts.log
	err := cmd.Run()
	r.l4Duration = time.Since(start)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	if jerr := json.Unmarshal([]byte(last), &r.l4); jerr != nil {
		return fmt.Errorf("go run ./bench/l4: %v; its last line %q: %v", err, last, jerr)
	}
	if v, ok := r.l4["l4_mpps_with_1m_blacklist_ratio"].(float64); ok {
		r.l4Ratio = &v
	}
	switch dp, im := r.l4["l4_blacklist_ratio_dpdk"], r.l4["l4_blacklist_ratio_inmem"]; {
	case r.l4Ratio != nil && dp != nil && dp.(float64) == *r.l4Ratio:
		r.l4Source = "bench-l4, DPDK net_ring ports"
	case r.l4Ratio != nil && im != nil && im.(float64) == *r.l4Ratio:
		r.l4Source = "bench-l4, in-memory ports"
	default:
		r.l4Source = "bench-l4"
	}
	if err != nil {
		return fmt.Errorf("go run ./bench/l4 (its report is above): %w", err)
	}
	return nil
}

// agent is a simulated node: the real Follower on a store client of its own,
// fetching and checking each version as a node does (manifest, chunks and their
// SHA-256, deltas) and reporting the version it would enforce, with no table
// built (blsync.FollowerConfig.VerifyOnly): the two l7d build theirs.
type agent struct {
	f       *blsync.Follower
	list    *blacklist.List
	mu      sync.Mutex
	applied map[int64]time.Time // version → when it was put in force
}

func (a *agent) changed() {
	v := a.f.Versions()[listName]
	a.mu.Lock()
	if _, ok := a.applied[v]; !ok {
		a.applied[v] = time.Now()
	}
	a.mu.Unlock()
}

// at is when the agent put version v or later in force (zero: not yet).
func (a *agent) at(v int64) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var first time.Time
	for got, t := range a.applied {
		if got >= v && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

// runCluster starts the cluster and the agents, and runs the push and delta
// phases.
func (r *report) runCluster(ctx context.Context) error {
	o := r.opts
	dir, err := os.MkdirTemp("", "tg-bbl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	r.progress("cluster: controld, 2 keyserverd, 2 l7d from %s", o.bin)
	// At info: etcd logs each request it applies at debug, a chunk's megabyte
	// quoted, which would cost controld a fifth of its CPU during the push.
	c, err := cluster.Start(ctx, cluster.Options{Bin: o.bin, Dir: dir, EtcdListen: true, LogLevel: "info"})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Close(); err != nil {
			r.fail("stopping the cluster: %v", err)
		}
	}()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	cert, err := c.IssueSite(key, time.Time{}, time.Time{}, site)
	if err != nil {
		return err
	}
	if _, _, err := c.Upload(ctx, "www", cert); err != nil {
		return fmt.Errorf("uploading the certificate: %w", err)
	}
	if err := c.WriteSite(ctx, "www", "bench\n"); err != nil {
		return err
	}
	for _, node := range []string{"l7-a", "l7-b"} {
		if _, err := c.AddL7(ctx, node); err != nil {
			return err
		}
	}
	r.clusterStartup = time.Since(start)

	r.agentsRun = fitAgents(o, r)
	r.progress("%d simulated nodes (blsync.Follower verifying only, a store client each)", r.agentsRun)
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	agents := make([]*agent, r.agentsRun)
	for i := range agents {
		a := &agent{list: blacklist.NewList(listName, blacklist.Options{}), applied: map[int64]time.Time{}}
		a.f, err = blsync.NewFollower(blsync.FollowerConfig{
			Open: func(ctx context.Context) (*store.Store, error) {
				return store.Open(ctx, store.Config{Endpoints: []string{c.StoreEndpoint}, DialTimeout: config.Duration(2 * time.Second), Logger: quiet})
			},
			VerifyOnly: true,
			List: func(name string) *blacklist.List {
				if name == listName {
					return a.list
				}
				return nil
			},
			Changed: a.changed,
			Logger:  quiet,
		})
		if err != nil {
			return err
		}
		agents[i] = a
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.f.Run(actx)
		}()
	}

	// The list, in the binary format.
	r.progress("building a list of %d random IPv4 addresses", o.entries)
	rnd := mrand.New(mrand.NewPCG(14, 10))
	var b blacklist.Builder
	for range o.entries {
		b.AddAddr(randomV4(rnd), time.Time{})
	}
	set := b.Build()
	var body bytes.Buffer
	if err := blacklist.WriteBinary(&body, set); err != nil {
		return err
	}
	r.listBytes = body.Len()
	b = blacklist.Builder{}
	set = nil
	debug.FreeOSMemory()

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.StoreEndpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	before, err := cli.Status(ctx, c.StoreEndpoint)
	if err != nil {
		return fmt.Errorf("the store's status: %w", err)
	}

	r.progress("push: %.1f MiB to PUT /v1/blacklists/%s", float64(body.Len())/(1<<20), listName)
	procs := []*cluster.Proc{c.Controld}
	for _, l := range c.L7 {
		procs = append(procs, &l.Proc)
	}
	cpu0 := cpuTimes(procs)
	sent := time.Now()
	var ans struct {
		Operation string `json:"operation"`
		Version   int64  `json:"version"`
	}
	if err := call(ctx, c, "PUT", "/v1/blacklists/"+listName, "application/octet-stream", body.Bytes(), &ans); err != nil {
		return fmt.Errorf("the push: %w", err)
	}
	r.answered = time.Since(sent)
	version := ans.Version
	for version == 0 {
		var op struct {
			Version int64  `json:"version"`
			State   string `json:"state"`
			Error   string `json:"error"`
		}
		if err := call(ctx, c, "GET", "/v1/operations/"+ans.Operation, "", nil, &op); err != nil {
			return err
		}
		if op.State == "failed" {
			return fmt.Errorf("the push's operation failed: %s", op.Error)
		}
		version = op.Version
		if time.Since(sent) > o.timeout {
			return fmt.Errorf("the push not stored after %v", o.timeout)
		}
		if version == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	r.stored = time.Since(sent)
	r.progress("push: stored as version %d %v after it was sent; waiting for %d l7d and %d agents", version, r.stored.Round(time.Millisecond), len(c.L7), len(agents))
	l7, err := waitApplied(ctx, c, agents, version, sent, o.timeout)
	if err != nil {
		return fmt.Errorf("the push: %w", err)
	}
	r.l7Applied = l7
	r.lastApplied = slicesMax(l7)
	for i, a := range agents {
		d := a.at(version).Sub(sent)
		if i == 0 || d < r.agentsFirst {
			r.agentsFirst = d
		}
		r.agentsLast = max(r.agentsLast, d)
	}
	r.lastApplied = max(r.lastApplied, r.agentsLast)
	cpu1 := cpuTimes(procs)
	for i := range cpu1 {
		r.pushCPU = append(r.pushCPU, cpu1[i]-cpu0[i])
	}
	r.progress("push: applied everywhere %v after it was sent", r.lastApplied.Round(time.Millisecond))

	// The backend's sizes are updated on its commit interval.
	time.Sleep(2 * time.Second)
	after, err := cli.Status(ctx, c.StoreEndpoint)
	if err != nil {
		return fmt.Errorf("the store's status: %w", err)
	}
	r.storeInUseMiB = float64(after.DbSizeInUse-before.DbSizeInUse) / (1 << 20)
	r.storeFileMiB = float64(after.DbSize-before.DbSize) / (1 << 20)
	var show struct {
		Chunks int   `json:"chunks"`
		Bytes  int64 `json:"bytes"`
	}
	if err := call(ctx, c, "GET", "/v1/blacklists/"+listName, "", nil, &show); err != nil {
		return err
	}
	r.chunks, r.chunkBytes = show.Chunks, show.Bytes

	// The deltas.
	var lat, l7lat []time.Duration
	for k := range o.deltas {
		var nd bytes.Buffer
		for range o.deltaEntries {
			fmt.Fprintf(&nd, `{"ip":"%s","duration":"1h"}`+"\n", randomV4(rnd))
		}
		sent := time.Now()
		var ans struct {
			Version int64 `json:"version"`
		}
		if err := call(ctx, c, "POST", "/v1/blacklists/"+listName+"/delta", "application/x-ndjson", nd.Bytes(), &ans); err != nil {
			return fmt.Errorf("delta %d: %w", k+1, err)
		}
		if ans.Version == 0 {
			return fmt.Errorf("delta %d: answered with no version", k+1)
		}
		l7, err := waitApplied(ctx, c, agents, ans.Version, sent, o.timeout)
		if err != nil {
			return fmt.Errorf("delta %d: %w", k+1, err)
		}
		last := slicesMax(l7)
		l7lat = append(l7lat, last)
		for _, a := range agents {
			last = max(last, a.at(ans.Version).Sub(sent))
		}
		lat = append(lat, last)
		r.progress("delta %d of %d: version %d applied everywhere %v after it was sent (the l7d %v)", k+1, o.deltas, ans.Version,
			last.Round(time.Millisecond), slicesMax(l7).Round(time.Millisecond))
	}
	r.deltaLat = benchkit.NewLatencies(lat)
	r.deltaL7Lat = benchkit.NewLatencies(l7lat)
	return nil
}

// waitApplied waits until every l7d reports version v of the list (GET
// /v1/blacklists/{name}, from their statuses) and every agent enforces it, and
// returns when each l7d was first seen reporting it, since sent.
func waitApplied(ctx context.Context, c *cluster.Cluster, agents []*agent, v int64, sent time.Time, timeout time.Duration) ([]time.Duration, error) {
	l7 := make([]time.Duration, len(c.L7))
	for {
		var show struct {
			Nodes []struct {
				Node    string `json:"node"`
				Version int64  `json:"version"`
			} `json:"nodes"`
		}
		if err := call(ctx, c, "GET", "/v1/blacklists/"+listName, "", nil, &show); err != nil {
			return nil, err
		}
		now := time.Since(sent)
		done := true
		for i, l := range c.L7 {
			for _, n := range show.Nodes {
				if n.Node == l.Node && n.Version >= v && l7[i] == 0 {
					l7[i] = now
				}
			}
			done = done && l7[i] != 0
		}
		for _, a := range agents {
			done = done && !a.at(v).IsZero()
		}
		if done {
			return l7, nil
		}
		if now > timeout {
			behind := 0
			for _, a := range agents {
				if a.at(v).IsZero() {
					behind++
				}
			}
			return nil, fmt.Errorf("version %d not applied everywhere after %v: l7d at %v, %d of %d agents behind", v, timeout, l7, behind, len(agents))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// call sends a request to controld's API with the admin token and decodes a 2xx
// answer into out.
func call(ctx context.Context, c *cluster.Cluster, method, path, contentType string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.API+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
		}
	}
	return nil
}

// randomV4 is a random IPv4 address.
func randomV4(r *mrand.Rand) netip.Addr {
	v := r.Uint32()
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func slicesMax(d []time.Duration) time.Duration {
	var m time.Duration
	for _, x := range d {
		m = max(m, x)
	}
	return m
}

// cpuTimes returns the CPU time (user and system) so far of each process, then
// of this one.
func cpuTimes(procs []*cluster.Proc) []time.Duration {
	var out []time.Duration
	for _, p := range procs {
		out = append(out, procCPU(fmt.Sprintf("/proc/%d/stat", p.PID())))
	}
	return append(out, procCPU("/proc/self/stat"))
}

// procCPU reads a process's utime and stime from its /proc stat file (0 when it
// cannot), in the kernel's clock ticks of 10ms.
func procCPU(file string) time.Duration {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	// The command, in parentheses, may hold spaces: the fields follow the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return time.Duration(ut+st) * 10 * time.Millisecond
}
