// Command bench-l4-cluster measures session sync between the LDs of a cluster
// (l4/sessionsync, the datapath's sync hooks), in one run:
//
//   - the established-flow rate of one datapath worker with sync on against off: two
//     distributors, each with -flows established TCP flows fed by a generator port
//     (frames written into buffers, standing for the NIC) and tunnelled to a sink; the
//     one with sync on has sent its flows to a peer LD over loopback UDP (a second
//     distributor with its syncer) before it is measured; each round measures both,
//     in alternating order, and the ratio of the medians is sync_on_off_mpps_ratio (target ≥ 0.9),
//     counted per second of the worker thread's CPU time (the machine's other load
//     disturbs it less than wall time, which is shown too);
//
//   - a full sync of -full connections (1,000,000): an LD holding them sends them all
//     to a peer, paced at full_sync_rate; the time until the peer has installed every
//     one is full_sync_1m_s (target ≤ 10 s), and the bytes on the wire (UDP payload
//     plus IP and UDP headers) per connection sync_bytes_per_conn.
//
//   - the loss of an LD (-failover-conns long connections, 200; 0 skips it): on the
//     router topology of integration's TestL4ClusterFailover, run as a child with
//     `go test` (root, bird2, DPDK): two l4d on net_af_packet peering with bird2
//     (hold time 3 s, ECMP) and syncing their sessions, three l7d, a client
//     namespace whose long connections (HTTP/1.1, HTTP/2, HTTP/3, a request every
//     200 ms each, older than sync_after) are spread over both LDs; an L7 node joins
//     the pool, then one LD is killed (-9, its kernel's BGP session gone with it)
//     and later restarted; the router and the LDs run BFD beside BGP (-bfd, 300 ms
//     x 3: the router drops the dead LD 0.9 s after its last packet, not at the
//     hold timer). failover_s is the kill to the last long connection served
//     again (target ≤ hold time + 1 s), long_conns_survived_pct those never redialled
//     nor failed (target 100), failover_requests_failed the requests that failed
//     (long connections, and new connections made all along), route_drop_s the kill
//     to the router's route via the survivor only, failover_stalled_p50_s the median
//     time to served again of the connections the loss stalled.
//
// The rate and full sync rows' addresses are from 198.18.0.0/15 and 203.0.113.0/24
// and never leave the process (loopback UDP for sync); the failover row's live in
// the test's network namespaces. It prints a table, the targets with PASS or MISS,
// and as its last line one JSON object.
//
//	go run ./bench/l4cluster [-flows 200000] [-duration 2s] [-rounds 3] [-full 1000000] [-failover-conns 200] [-bfd 300ms|off] [-failover-only]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/l4/sessionsync"
)

func main() { os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr)) }

type options struct {
	flows, rounds, full int
	duration, after     time.Duration
	rate                int
	failoverConns       int
	bfd                 string
	failoverOnly        bool
}

var (
	vip     = netip.MustParseAddr("203.0.113.10")
	extMAC  = [6]byte{2, 0, 0, 0, 0xe0, 1}
	intMAC  = [6]byte{2, 0, 0, 0, 0x10, 1}
	syncKey = []byte("bench-l4-cluster shared key, 32+ bytes")
)

// Main runs the benchmark: 0 when every measurement ran, 1 on failure, 2 for bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("bench-l4-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.flows, "flows", 200_000, "established flows of the rate rows")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "measured time of each rate round")
	fs.IntVar(&o.rounds, "rounds", 4, "rounds of the rate rows (sync off and on each round, in alternating order)")
	fs.IntVar(&o.full, "full", 1_000_000, "connections of the full sync row")
	fs.DurationVar(&o.after, "sync-after", 3*time.Second, "sync_after of the LD measured with sync on")
	fs.IntVar(&o.rate, "full-sync-rate", sessionsync.DefaultFullSyncRate, "full_sync_rate, entries a second")
	fs.IntVar(&o.failoverConns, "failover-conns", 200, "long connections of the LD-loss row (0: skip it)")
	fs.StringVar(&o.bfd, "bfd", "300ms", "BFD interval (min tx and rx, x 3) of the LD-loss row's router and LDs; off: the hold timer alone")
	fs.BoolVar(&o.failoverOnly, "failover-only", false, "run the LD-loss row alone")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if d, err := time.ParseDuration(o.bfd); o.bfd != "off" && (err != nil || d < 10*time.Millisecond) {
		fmt.Fprintln(stderr, "bench-l4-cluster: -bfd must be a duration of at least 10ms, or off")
		return 2
	}
	if o.failoverOnly && o.failoverConns == 0 {
		fmt.Fprintln(stderr, "bench-l4-cluster: -failover-only needs -failover-conns above 0")
		return 2
	}
	if o.flows < 1 || o.flows > 1<<20 || o.full < 1 || o.full > 1<<20 || o.rounds < 1 || o.duration <= 0 || o.failoverConns < 0 || o.failoverConns > 2000 {
		fmt.Fprintln(stderr, "bench-l4-cluster: -flows and -full must be in 1..1048576, -rounds ≥ 1, -duration > 0, -failover-conns in 0..2000")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	res, err := run(o, stdout, log)
	if err != nil {
		fmt.Fprintln(stderr, "bench-l4-cluster:", err)
	}
	if res != nil {
		// The figures measured, a failed LD-loss row's too.
		b, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(b))
	}
	if err != nil {
		return 1
	}
	return 0
}

type results struct {
	// The rate and full sync rows; absent with -failover-only.
	Ratio        float64 `json:"sync_on_off_mpps_ratio,omitempty"`
	OnMpps       float64 `json:"sync_on_mpps,omitempty"`
	OffMpps      float64 `json:"sync_off_mpps,omitempty"`
	OnWall       float64 `json:"sync_on_mpps_wall,omitempty"`
	OffWall      float64 `json:"sync_off_mpps_wall,omitempty"`
	Flows        int     `json:"flows,omitempty"`
	FullSyncS    float64 `json:"full_sync_1m_s,omitempty"`
	FullConns    int     `json:"full_sync_conns,omitempty"`
	FullRate     int     `json:"full_sync_rate,omitempty"`
	BytesPerConn float64 `json:"sync_bytes_per_conn,omitempty"`
	Datagrams    uint64  `json:"full_sync_datagrams,omitempty"`

	// The LD-loss row; absent when skipped.
	FailoverS        *float64 `json:"failover_s,omitempty"`
	SurvivedPct      *float64 `json:"long_conns_survived_pct,omitempty"`
	FailoverFailed   *int     `json:"failover_requests_failed,omitempty"`
	FailoverNewConns *int     `json:"failover_new_conn_requests_failed,omitempty"`
	HoldTimeS        *float64 `json:"bgp_hold_time_s,omitempty"`
	RouteDropS       *float64 `json:"route_drop_s,omitempty"`
	StalledP50S      *float64 `json:"failover_stalled_p50_s,omitempty"`
	RejoinS          *float64 `json:"rejoin_s,omitempty"`
	FailoverConns    int      `json:"failover_long_conns,omitempty"`
	// BFD's interval (ms; 0 without BFD) and multiplier in the LD-loss row.
	BFDIntervalMs *float64 `json:"bfd_interval_ms,omitempty"`
	BFDMultiplier *int     `json:"bfd_multiplier,omitempty"`
}

// ld is one distributor (one worker) over a generator and a sink, with its
// syncer when sync is on.
type ld struct {
	tid    atomic.Int64 // the worker's thread
	d      *datapath.Distributor
	gen    *genPort
	sink   *sinkPort
	syncer *sessionsync.Syncer
	cancel context.CancelFunc
	done   []chan error
}

func ldConfig(capacity int) datapath.Config {
	mk := func(name, addr string, mac byte) datapath.MemberConfig {
		return datapath.MemberConfig{Name: name, Address: netip.MustParseAddr(addr), MAC: packet.MAC{2, 0, 0, 0, 0x11, mac}}
	}
	return datapath.Config{
		External:  datapath.Interface{Addr: netip.MustParsePrefix("198.18.0.2/24")},
		Internal:  datapath.Interface{Addr: netip.MustParsePrefix("198.18.1.1/24")},
		Conntrack: conntrack.Config{Capacity: capacity},
		Rules:     []datapath.RuleConfig{{Name: "web", VIP: vip, Protocol: "tcp", Port: 443, Pool: "l7"}},
		Pools: map[string]datapath.PoolConfig{"l7": {
			Members: []datapath.MemberConfig{mk("a", "198.18.1.11", 1), mk("b", "198.18.1.12", 2), mk("c", "198.18.1.13", 3)},
			Health:  datapath.HealthConfig{Type: "none"},
		}},
	}
}

// newLD makes a distributor over its own generator and sink; with sync on (after >
// 0) also its syncer, on loopback, peers set later.
func newLD(flows, capacity int, after time.Duration, rate int, log *slog.Logger) (*ld, error) {
	p := newPool(4096)
	l := &ld{gen: newGenPort(p, extMAC, extMAC, vip.As4(), flows), sink: &sinkPort{p: p, mac: intMAC}}
	d, err := datapath.NewDistributor(ldConfig(capacity), datapath.Options{External: l.gen, Internal: l.sink, Logger: log,
		WorkerInit: func(int) (func(), error) {
			l.tid.Store(int64(syscall.Gettid()))
			return nil, nil
		}})
	if err != nil {
		return nil, err
	}
	l.d = d
	if after > 0 {
		if err := d.EnableSync(datapath.SyncOptions{After: after}); err != nil {
			return nil, err
		}
		l.syncer, err = sessionsync.New(sessionsync.Config{ClusterID: 1, Key: syncKey, Listen: "127.0.0.1:0",
			FullSyncRate: rate, SyncAfter: config.Duration(after)}, d, sessionsync.Options{Logger: log})
		if err != nil {
			return nil, err
		}
	}
	return l, nil
}

func (l *ld) run() {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	start := func(f func(context.Context) error) {
		c := make(chan error, 1)
		l.done = append(l.done, c)
		go func() { c <- f(ctx) }()
	}
	start(l.d.Run)
	if l.syncer != nil {
		start(l.syncer.Run)
	}
}

// stop stops the LD and waits for it; again, it does nothing.
func (l *ld) stop() error {
	if l.cancel == nil {
		return nil
	}
	l.cancel()
	l.cancel = nil
	var first error
	for _, c := range l.done {
		if err := <-c; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// pair connects two LDs' syncers as each other's peers.
func pair(a, b *ld) error {
	if err := a.syncer.SetPeers([]string{b.syncer.Addr().String()}); err != nil {
		return err
	}
	return b.syncer.SetPeers([]string{a.syncer.Addr().String()})
}

// feed sends count frames (SYNs or ACKs over the flows) and waits until the
// worker has handled them all.
func (l *ld) feed(syn bool, count int) error {
	l.gen.pause()
	before := l.sink.sent.Load() + l.gen.freed.Load()
	j := l.gen.start(syn, int64(count))
	deadline := time.Now().Add(time.Minute)
	for l.sink.sent.Load()+l.gen.freed.Load()-before < uint64(count) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the datapath handled %d of %d frames (%d made) in a minute", l.sink.sent.Load()+l.gen.freed.Load()-before, count, j.produced.Load())
		}
		time.Sleep(time.Millisecond)
	}
	l.gen.pause()
	if handled := l.sink.sent.Load() + l.gen.freed.Load() - before; handled != uint64(count) {
		return fmt.Errorf("the datapath handled %d frames, %d made", handled, count)
	}
	if dropped := l.gen.freed.Load(); dropped > 0 {
		return fmt.Errorf("the datapath dropped %d frames: %v", dropped, l.d.Status().Packets)
	}
	return nil
}

// establish makes the flows: a SYN, then an ACK, each.
func (l *ld) establish(flows int) error {
	if err := l.feed(true, flows); err != nil {
		return err
	}
	return l.feed(false, flows)
}

// rate feeds ACKs over the established flows for d and returns the rate in Mpps:
// by wall time, and per second of the worker thread's CPU time, which other
// programs on the machine disturb less.
func (l *ld) rate(d time.Duration) (wall, perCPU float64, err error) {
	before := l.sink.sent.Load()
	cpu0, err := threadCPU(int(l.tid.Load()))
	if err != nil {
		return 0, 0, err
	}
	l.gen.start(false, 0)
	t0 := time.Now()
	time.Sleep(d)
	n := l.sink.sent.Load() - before
	el := time.Since(t0)
	cpu1, err := threadCPU(int(l.tid.Load()))
	l.gen.pause()
	if err != nil {
		return 0, 0, err
	}
	return float64(n) / el.Seconds() / 1e6, float64(n) / (cpu1 - cpu0).Seconds() / 1e6, nil
}

// threadCPU is the CPU time thread tid of this process has run, in nanoseconds
// (/proc/self/task/TID/schedstat).
func threadCPU(tid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", tid))
	if err != nil {
		return 0, fmt.Errorf("reading the worker's CPU time: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("reading the worker's CPU time: empty schedstat")
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reading the worker's CPU time: %w", err)
	}
	return time.Duration(ns), nil
}

func waitUntil(what string, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func run(o options, out io.Writer, log *slog.Logger) (*results, error) {
	if o.failoverOnly {
		res := &results{}
		return res, runFailover(o, res, out)
	}
	res := &results{Flows: o.flows, FullConns: o.full, FullRate: o.rate}
	capacity := 2 * max(o.flows, o.full)

	// Rate rows: off and on side by side, measured in turn.
	off, err := newLD(o.flows, 2*o.flows, 0, 0, log)
	if err != nil {
		return nil, err
	}
	on, err := newLD(o.flows, 2*o.flows, o.after, o.rate, log)
	if err != nil {
		return nil, err
	}
	peer, err := newLD(o.flows, 2*o.flows, o.after, o.rate, log)
	if err != nil {
		return nil, err
	}
	if err := pair(on, peer); err != nil {
		return nil, err
	}
	for _, l := range []*ld{off, on, peer} {
		l.run()
		defer l.stop()
	}
	fmt.Fprintf(out, "establishing %d flows on each LD; sync_after %v\n", o.flows, o.after)
	if err := off.establish(o.flows); err != nil {
		return nil, fmt.Errorf("sync off: %w", err)
	}
	if err := on.establish(o.flows); err != nil {
		return nil, fmt.Errorf("sync on: %w", err)
	}
	if err := waitUntil("the peer to install the flows", o.after+time.Minute, func() bool {
		return peer.d.SyncStats().Installed >= uint64(o.flows)
	}); err != nil {
		return nil, fmt.Errorf("%w (sender's datapath %+v, syncer %+v; peer's datapath %+v, syncer %+v)", err,
			on.d.SyncStats(), on.syncer.Stats(), peer.d.SyncStats(), peer.syncer.Stats())
	}
	var offR, onR, offW, onW []float64
	type row struct {
		l        *ld
		cpu, wal *[]float64
	}
	for r := range o.rounds {
		// The order alternates, so that neither side is always measured second.
		order := []row{{off, &offR, &offW}, {on, &onR, &onW}}
		if r%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, m := range order {
			w, c, err := m.l.rate(o.duration)
			if err != nil {
				return nil, err
			}
			*m.cpu, *m.wal = append(*m.cpu, c), append(*m.wal, w)
		}
		fmt.Fprintf(out, "round %d: established flows, Mpps per worker CPU second (wall): sync off %.3f (%.3f), sync on %.3f (%.3f)\n",
			r+1, offR[r], offW[r], onR[r], onW[r])
	}
	res.OffMpps, res.OnMpps = median(offR), median(onR)
	res.OffWall, res.OnWall = median(offW), median(onW)
	res.Ratio = res.OnMpps / res.OffMpps
	for _, l := range []*ld{off, on, peer} {
		if err := l.stop(); err != nil {
			return nil, err
		}
	}

	// Full sync row: sync_after long, so that only the full sync sends.
	src, err := newLD(o.full, capacity, time.Hour, o.rate, log)
	if err != nil {
		return nil, err
	}
	dst, err := newLD(o.full, capacity, time.Hour, o.rate, log)
	if err != nil {
		return nil, err
	}
	if err := pair(src, dst); err != nil {
		return nil, err
	}
	src.run()
	defer src.stop()
	dst.run()
	defer dst.stop()
	// The peers' warm-up exchange (each asks the other for a full sync, empty
	// here) is over before the connections are made.
	if err := waitUntil("the warm-up", time.Minute, func() bool {
		return src.syncer.WarmedUp() && dst.syncer.WarmedUp() && src.syncer.Stats().FullSyncs > 0
	}); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "establishing %d connections for the full sync\n", o.full)
	if err := src.establish(o.full); err != nil {
		return nil, fmt.Errorf("full sync: %w", err)
	}
	base := src.syncer.Stats()
	installed0 := dst.d.SyncStats().Installed
	t0 := time.Now()
	src.syncer.FullSync()
	if err := waitUntil("the peer to install the full sync", time.Minute, func() bool {
		return dst.d.SyncStats().Installed-installed0 >= uint64(o.full)
	}); err != nil {
		return nil, fmt.Errorf("%w (sender's datapath %+v, syncer %+v; receiver's datapath %+v, syncer %+v)", err,
			src.d.SyncStats(), src.syncer.Stats(), dst.d.SyncStats(), dst.syncer.Stats())
	}
	res.FullSyncS = time.Since(t0).Seconds()
	st := src.syncer.Stats()
	dg, entries, bytes := st.TxDatagrams-base.TxDatagrams, st.TxEntries-base.TxEntries, st.TxBytes-base.TxBytes
	res.Datagrams = dg
	res.BytesPerConn = float64(bytes+28*dg) / float64(max(entries, 1))

	fmt.Fprintf(out, "\n%-34s %12s %8s\n", "row", "value", "target")
	fmt.Fprintf(out, "%-34s %12.3f %8s %s\n", "sync_on_off_mpps_ratio", res.Ratio, "≥ 0.9", mark(res.Ratio >= 0.9))
	fmt.Fprintf(out, "%-34s %12.3f\n", "  sync off, Mpps per CPU s", res.OffMpps)
	fmt.Fprintf(out, "%-34s %12.3f\n", "  sync on, Mpps per CPU s", res.OnMpps)
	fmt.Fprintf(out, "%-34s %12.3f\n", "  sync off, Mpps wall", res.OffWall)
	fmt.Fprintf(out, "%-34s %12.3f\n", "  sync on, Mpps wall", res.OnWall)
	fmt.Fprintf(out, "%-34s %12.2f %8s %s\n", fmt.Sprintf("full sync of %d, s", o.full), res.FullSyncS, "≤ 10", mark(res.FullSyncS <= 10))
	fmt.Fprintf(out, "%-34s %12.1f\n", "  bytes per connection (IP+UDP)", res.BytesPerConn)
	fmt.Fprintf(out, "%-34s %12d\n", "  datagrams", dg)
	fmt.Fprintf(out, "%-34s %12d\n", "  full_sync_rate, entries/s", o.rate)
	if o.failoverConns == 0 {
		return res, nil
	}

	// The LD-loss row, last: it runs processes of its own.
	for _, l := range []*ld{src, dst} {
		if err := l.stop(); err != nil {
			return nil, err
		}
	}
	return res, runFailover(o, res, out)
}

// runFailover runs the LD-loss row into res.
func runFailover(o options, res *results, out io.Writer) error {
	fmt.Fprintf(out, "\nLD loss with %d long connections, BFD %s (integration's TestL4ClusterFailover):\n", o.failoverConns, o.bfd)
	f, ferr := failover(o.failoverConns, o.bfd, out)
	if f == nil {
		return ferr
	}
	failed := f.LongReqFailed + f.NewConnFailed
	res.FailoverS, res.SurvivedPct, res.FailoverFailed, res.FailoverNewConns = &f.FailoverS, &f.SurvivedPct, &failed, &f.NewConnFailed
	res.HoldTimeS, res.RouteDropS, res.RejoinS, res.FailoverConns = &f.HoldTimeS, &f.RouteDropS, &f.RejoinS, f.Conns
	res.StalledP50S = &f.StalledP50S
	res.BFDIntervalMs, res.BFDMultiplier = &f.BFDIntervalMs, &f.BFDMultiplier
	fmt.Fprintf(out, "\n%-34s %12s %8s\n", "row", "value", "target")
	fmt.Fprintf(out, "%-34s %12.2f %8s %s\n", "failover_s", f.FailoverS, fmt.Sprintf("≤ %.0f", f.HoldTimeS+1), mark(f.FailoverS <= f.HoldTimeS+1))
	fmt.Fprintf(out, "%-34s %12.2f\n", "  BGP hold time, s", f.HoldTimeS)
	if f.BFDIntervalMs > 0 {
		fmt.Fprintf(out, "%-34s %12s\n", "  BFD interval x multiplier", fmt.Sprintf("%.0f ms x %d", f.BFDIntervalMs, f.BFDMultiplier))
	} else {
		fmt.Fprintf(out, "%-34s %12s\n", "  BFD", "off")
	}
	fmt.Fprintf(out, "%-34s %12.2f\n", "  kill to route via survivor, s", f.RouteDropS)
	fmt.Fprintf(out, "%-34s %12.2f\n", fmt.Sprintf("  median of the %d stalled, s", f.Stalled), f.StalledP50S)
	fmt.Fprintf(out, "%-34s %12.1f %8s %s\n", "long_conns_survived_pct", f.SurvivedPct, "100", mark(f.SurvivedPct == 100))
	fmt.Fprintf(out, "%-34s %12s\n", "  long connections", fmt.Sprintf("%d (%s)", f.Conns, f.ConnsByProto))
	fmt.Fprintf(out, "%-34s %12d\n", "failover_requests_failed", failed)
	fmt.Fprintf(out, "%-34s %12d\n", "  on long connections", f.LongReqFailed)
	fmt.Fprintf(out, "%-34s %12d\n", "  new connections (in the window)", f.NewConnFailed-f.NewConnFailedOut)
	fmt.Fprintf(out, "%-34s %12d %8s %s\n", "  new connections outside it", f.NewConnFailedOut, "0", mark(f.NewConnFailedOut == 0))
	fmt.Fprintf(out, "%-34s %12.2f\n", "  restart to route via both, s", f.RejoinS)
	return ferr
}

var _ port.Port = (*genPort)(nil)

// mark is a target's verdict.
func mark(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}
