package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"runtime/metrics"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
)

// The LD's addresses in the in-memory and net_ring measurements, and its members. The
// members' MACs are static neighbours (MemberConfig.MAC): nothing answers ARP behind a
// null device.
var (
	ldExt      = netip.MustParsePrefix("198.18.0.2/24")
	ldExtGW    = netip.MustParseAddr("198.18.0.1")
	ldInt      = netip.MustParsePrefix("198.18.1.1/24")
	gwMAC      = packet.MAC{0x02, 0, 0, 0, 0xe0, 0xfe}
	extMAC     = [6]byte{0x02, 0, 0, 0, 0xe0, 0x01}
	intMAC     = [6]byte{0x02, 0, 0, 0, 0x10, 0x01}
	memberAddr = []netip.Addr{
		netip.MustParseAddr("198.18.1.11"), netip.MustParseAddr("198.18.1.12"),
		netip.MustParseAddr("198.18.1.13"), netip.MustParseAddr("198.18.1.14"),
	}
)

// memberMACs are the in-memory and net_ring members' static MACs.
func memberMACs() []packet.MAC {
	out := make([]packet.MAC, len(memberAddr))
	for i := range out {
		out[i] = packet.MAC{0x02, 0, 0, 0, 0x11, byte(0x11 + i)}
	}
	return out
}

// ldSetup is what differs between the set-ups: addresses and neighbours.
type ldSetup struct {
	ext        netip.Prefix
	gw         netip.Addr
	gwMAC      packet.MAC
	memberMACs []packet.MAC // one per memberAddr
	capacity   int
}

// ldConfig is one TCP rule (VIP:443) to a pool of four members with GRE, no health
// checks, and static neighbours.
func ldConfig(s ldSetup) datapath.Config {
	var members []datapath.MemberConfig
	for i, a := range memberAddr {
		members = append(members, datapath.MemberConfig{
			Name: fmt.Sprintf("l7-%d", i+1), Address: a, MAC: s.memberMACs[i],
		})
	}
	cfg := datapath.Config{
		External: datapath.Interface{Addr: s.ext, Gateway: s.gw, GatewayMAC: s.gwMAC},
		Internal: datapath.Interface{Addr: ldInt},
		Rules:    []datapath.RuleConfig{{Name: "web", VIP: vip, Protocol: "tcp", Port: vipPort, Pool: "l7"}},
		Pools: map[string]datapath.PoolConfig{"l7": {
			Members: members,
			Health:  datapath.HealthConfig{Type: "none"},
		}},
	}
	cfg.Conntrack.Capacity = s.capacity
	return cfg
}

// source feeds frames into the worker's external port.
type source interface {
	// feed starts handing out count frames of set in storage order, cycling (count <
	// 0: until stopped).
	feed(set *frameSet, count int64) feeding
}

// feeding is one run of a source.
type feeding interface {
	// stop ends the run (if it has not ended) and waits for it.
	stop() feedStats
}

// feedStats describe a run of a source.
type feedStats struct {
	sent  uint64 // frames handed to the port
	calls uint64 // transmit calls (DPDK feeder)
	full  uint64 // transmit calls that found the ring full (DPDK feeder)
	noBuf uint64 // allocation calls that found the pool empty (DPDK feeder)
	err   error
}

// phaseResult is one timed phase.
type phaseResult struct {
	Packets uint64  `json:"packets"`
	Seconds float64 `json:"seconds"`
	Mpps    float64 `json:"mpps"`
	// WorkerCPU is the CPU time the worker's thread had during the phase; below
	// Seconds when other processes took the core now and then.
	WorkerCPU float64 `json:"worker_cpu_seconds"`
	// MppsPerCPU is Packets ÷ WorkerCPU: the rate of a core the worker has to itself.
	MppsPerCPU float64 `json:"mpps_per_worker_cpu_second"`
	// OtherCores is what other processes used of the machine during the phase.
	OtherCores float64 `json:"other_processes_cores"`
	// Allocs is the heap allocations the whole process made per packet (established
	// phase only); the datapath is meant to make none.
	Allocs *float64 `json:"allocs_per_packet,omitempty"`
	// Polls and EmptyPolls count the worker's receive calls on the external port, and
	// those that found nothing: the worker waited for packets.
	Polls      uint64 `json:"polls"`
	EmptyPolls uint64 `json:"empty_polls"`
	// Idle is the share of the phase the worker spent waiting for packets (from an
	// empty poll to the next poll that found some).
	Idle float64 `json:"worker_idle_share"`
	// DPDK feeder: transmit calls, how many found the ring full, and how many
	// allocations found the pool empty.
	FeederCalls uint64 `json:"feeder_calls,omitempty"`
	FeederFull  uint64 `json:"feeder_ring_full,omitempty"`
	FeederNoBuf uint64 `json:"feeder_no_mbuf,omitempty"`
}

// starved reports whether the worker waited for packets more than 1% of the phase:
// then the source, not the worker, set the pace.
func (p *phaseResult) starved() bool { return p.Idle > 0.01 }

// forwardResults are the phases of one set-up.
type forwardResults struct {
	NewFlows    *phaseResult `json:"new_flows"`
	FirstACK    *phaseResult `json:"first_ack_pass"`
	Established *phaseResult `json:"established"`
	// SourceBound is set when the worker waited for packets more than 1% of the
	// established phase: the source (the DPDK feeder), not the worker, set the pace,
	// and the figure is a lower bound.
	SourceBound bool `json:"source_bound"`
	// Blacklist is the established-flow rate with and without a blacklist in force.
	Blacklist *blacklistResults `json:"blacklist,omitempty"`
}

// rig is a distributor with metered ports, running.
type rig struct {
	name     string
	d        *datapath.Distributor
	ext, int *meter
	src      source
	flows    int
	cancel   context.CancelFunc
	runErr   chan error
	tid      atomic.Int64 // the worker's thread
}

// startRig starts a distributor (one worker, busy poll) over ext and int.
func startRig(name string, cfg datapath.Config, ext, in port.Port, src source, flows int,
	init func(int) (func(), error), log *slog.Logger) (*rig, error) {
	return startRigIdle(name, cfg, ext, in, src, flows, init, -1, log)
}

// startRigIdle is startRig whose worker sleeps idleSleep when it has found nothing
// to do for a while (-1: it never sleeps), so that a rig not being fed leaves the
// cores to another.
func startRigIdle(name string, cfg datapath.Config, ext, in port.Port, src source, flows int,
	init func(int) (func(), error), idleSleep time.Duration, log *slog.Logger) (*rig, error) {
	r := &rig{name: name, ext: newMeter(ext), int: newMeter(in), src: src, flows: flows, runErr: make(chan error, 1)}
	d, err := datapath.NewDistributor(cfg, datapath.Options{
		External:  r.ext,
		Internal:  r.int,
		Workers:   1,
		IdleSleep: idleSleep,
		WorkerInit: func(w int) (func(), error) {
			r.tid.Store(int64(unix.Gettid()))
			if init == nil {
				return nil, nil
			}
			return init(w)
		},
		Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: making the distributor: %w", name, err)
	}
	r.d = d
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.runErr <- d.Run(ctx) }()
	// Members have static neighbours: they are resolved in the first snapshot.
	deadline := time.Now().Add(3 * time.Second)
	for {
		st := d.Status()
		unresolved := 0
		for _, m := range st.Members {
			if !m.Resolved {
				unresolved++
			}
		}
		if unresolved == 0 && len(st.Members) == len(memberAddr) {
			return r, nil
		}
		if time.Now().After(deadline) {
			return nil, errors.Join(fmt.Errorf("%s: %d of %d members still unresolved after 3s (static MACs are configured)",
				name, unresolved, len(st.Members)), r.stop())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop shuts the distributor down and returns Run's error.
func (r *rig) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.d.Shutdown(ctx)
	r.cancel()
	if err != nil {
		return fmt.Errorf("%s: shutting down: %w", r.name, err)
	}
	select {
	case err := <-r.runErr:
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
	case <-ctx.Done():
		return fmt.Errorf("%s: the distributor did not stop within 5s", r.name)
	}
	return nil
}

// errRunEnded reports that the distributor stopped in the middle of a phase.
var errRunEnded = errors.New("the distributor stopped")

// counted sends count frames of set and times them from the first burst the worker
// receives to the burst that completes count forwarded frames.
func (r *rig) counted(ctx context.Context, set *frameSet, count int) (*phaseResult, error) {
	r.ext.arm(0)
	tx0, rx0 := r.int.tx.Load(), r.ext.rx.Load()
	r.int.arm(uint64(count))
	r.int.takeSample()
	probe := startProbe()
	polls0, empty0, idle0 := r.ext.polls.Load(), r.ext.empty.Load(), r.ext.idle.Load()
	f := r.src.feed(set, int64(count))
	timeout := 10*time.Second + time.Duration(count)*5*time.Microsecond // ≥ 0.2 Mpps
	deadline := time.Now().Add(timeout)
	var err error
	for r.int.doneAt.Load() == 0 {
		if err = r.wait(ctx, deadline); err != nil {
			break
		}
	}
	st := f.stop()
	if err == nil {
		err = st.err
	}
	if err != nil {
		return nil, fmt.Errorf("%s, %s phase: %d of %d frames forwarded (%d received): %w",
			r.name, set.kind, r.int.tx.Load()-tx0, count, r.ext.rx.Load()-rx0, err)
	}
	others := probe.others()
	el := time.Duration(r.int.doneAt.Load() - r.ext.firstRx.Load())
	cpu := time.Duration(r.int.doneCPU.Load() - r.ext.firstRxCPU.Load())
	if err := r.checkSample(set.kind); err != nil {
		return nil, err
	}
	p := newPhaseResult(uint64(count), el, cpu, others, st)
	// Polls from the start of the feed to now: the idle polls before the first frame
	// and after the last are included, a few at most while the source keeps up.
	p.Polls, p.EmptyPolls = r.ext.polls.Load()-polls0, r.ext.empty.Load()-empty0
	p.Idle = float64(r.ext.idle.Load()-idle0) / float64(el)
	return p, nil
}

// timed sends frames of set for a settling time and then d, and counts what is
// forwarded during d; with dropsOK, what is received (handled) during d, some of it
// being dropped (blacklisted).
func (r *rig) timed(ctx context.Context, set *frameSet, d time.Duration, dropsOK bool) (*phaseResult, error) {
	r.ext.arm(0)
	r.int.arm(0)
	rx0, tx0 := r.ext.rx.Load(), r.int.tx.Load()
	r.int.takeSample()
	handled := &r.int.tx
	if dropsOK {
		handled = &r.ext.rx
	}
	f := r.src.feed(set, -1)
	err := sleepCtx(ctx, settle)
	probe := startProbe()
	t0, c0, cpu0 := nanotime(), handled.Load(), threadCPU(int(r.tid.Load()))
	polls0, empty0, idle0, allocs0 := r.ext.polls.Load(), r.ext.empty.Load(), r.ext.idle.Load(), heapAllocs()
	if err == nil {
		err = sleepCtx(ctx, d)
	}
	t1, c1, cpu1 := nanotime(), handled.Load(), threadCPU(int(r.tid.Load()))
	polls1, empty1, idle1, allocs1 := r.ext.polls.Load(), r.ext.empty.Load(), r.ext.idle.Load(), heapAllocs()
	others := probe.others()
	st := f.stop()
	if err == nil {
		err = st.err
	}
	if err == nil {
		// Once the source has stopped, the worker receives what was sent and forwards
		// all of it.
		deadline := time.Now().Add(2 * time.Second)
		for r.ext.rx.Load()-rx0 != st.sent || !dropsOK && r.int.tx.Load()-tx0 != st.sent {
			if err = r.wait(ctx, deadline); err != nil {
				err = fmt.Errorf("after the source stopped: %d frames sent, %d received, %d forwarded: %w",
					st.sent, r.ext.rx.Load()-rx0, r.int.tx.Load()-tx0, err)
				break
			}
		}
		// Packets are counted as received before they are handled: two more polls
		// and the last burst has been transmitted (or dropped).
		for p := r.ext.polls.Load(); err == nil && dropsOK && r.ext.polls.Load() < p+2; {
			err = r.wait(ctx, deadline)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s, %s phase: %w", r.name, set.kind, err)
	}
	if c1 == c0 {
		return nil, fmt.Errorf("%s, %s phase: nothing forwarded in %v", r.name, set.kind, d)
	}
	if err := r.checkSample(set.kind); err != nil {
		return nil, err
	}
	p := newPhaseResult(c1-c0, time.Duration(t1-t0), time.Duration(cpu1-cpu0), others, st)
	p.Polls, p.EmptyPolls = polls1-polls0, empty1-empty0
	p.Idle = float64(idle1-idle0) / float64(t1-t0)
	p.Allocs = ptr(float64(allocs1-allocs0) / float64(c1-c0))
	return p, nil
}

func newPhaseResult(n uint64, el, cpu time.Duration, others float64, st feedStats) *phaseResult {
	p := &phaseResult{Packets: n, Seconds: el.Seconds(), Mpps: float64(n) / el.Seconds() / 1e6,
		WorkerCPU: cpu.Seconds(), OtherCores: others, FeederCalls: st.calls, FeederFull: st.full, FeederNoBuf: st.noBuf}
	if cpu > 0 {
		p.MppsPerCPU = float64(n) / cpu.Seconds() / 1e6
	}
	return p
}

// heapAllocs returns the number of heap objects the process has allocated so far.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// settle is how long the established phase runs before it is measured.
const settle = 100 * time.Millisecond

// wait sleeps a little, and fails when ctx is done, the distributor stopped, or the
// deadline passed.
func (r *rig) wait(ctx context.Context, deadline time.Time) error {
	select {
	case err := <-r.runErr:
		r.runErr <- err
		if err == nil {
			err = errRunEnded
		}
		return err
	default:
	}
	if time.Now().After(deadline) {
		return errors.New("timed out")
	}
	return sleepCtx(ctx, 200*time.Microsecond)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// checkSample checks the first frame transmitted in the phase: GRE from the LD's
// internal address to a member, carrying the client's TCP segment to the VIP.
func (r *rig) checkSample(kind string) error {
	sp := r.int.sample.Load()
	if sp == nil {
		return fmt.Errorf("%s, %s phase: no transmitted frame was sampled", r.name, kind)
	}
	if err := checkTunnelled(*sp, kind == "SYN"); err != nil {
		return fmt.Errorf("%s, %s phase: the frame sent to a member: %w", r.name, kind, err)
	}
	return nil
}

// checkTunnelled checks that frame is GRE from ldInt to a member, carrying a TCP
// segment to the VIP with SYN set or not.
func checkTunnelled(frame []byte, syn bool) error {
	var p packet.Packet
	if err := packet.Parse(frame, &p); err != nil {
		return fmt.Errorf("outer: %w", err)
	}
	if p.Proto != packet.ProtoGRE || p.Src != ldInt.Addr() || !slices.Contains(memberAddr, p.Dst) {
		return fmt.Errorf("outer header is protocol %d %v → %v, want GRE %v → a member", p.Proto, p.Src, p.Dst, ldInt.Addr())
	}
	inner, _, err := packet.Decap(frame, &p)
	if err != nil {
		return fmt.Errorf("decapsulating: %w", err)
	}
	var in packet.Packet
	if err := packet.ParseIP(frame, inner, &in); err != nil {
		return fmt.Errorf("inner: %w", err)
	}
	if in.Proto != packet.ProtoTCP || in.Dst != vip || in.DstPort != vipPort || !in.Src.IsValid() ||
		(in.TCPFlags&packet.TCPSyn != 0) != syn {
		return fmt.Errorf("inner packet is protocol %d %v:%d → %v:%d flags %#x", in.Proto, in.Src, in.SrcPort, in.Dst, in.DstPort, in.TCPFlags)
	}
	return nil
}

// checkStatus waits for the distributor's published counters (at most 100 ms old) to
// show forwarded packets in, then checks that nothing else was counted (no drop, no
// packet out or to the LD) and that the table holds conns entries.
func (r *rig) checkStatus(ctx context.Context, forwarded uint64, conns int64) error {
	deadline := time.Now().Add(2 * time.Second)
	var st datapath.Status
	for {
		st = r.d.Status()
		if st.Packets["in/forwarded"] == forwarded && st.Conns == conns || time.Now().After(deadline) {
			break
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	var bad []string
	for _, k := range slices.Sorted(maps.Keys(st.Packets)) {
		if k != "in/forwarded" && st.Packets[k] > 0 {
			bad = append(bad, fmt.Sprintf("%s=%d", k, st.Packets[k]))
		}
	}
	var problems []string
	if got := st.Packets["in/forwarded"]; got != forwarded {
		problems = append(problems, fmt.Sprintf("in/forwarded is %d, the ports forwarded %d", got, forwarded))
	}
	if len(bad) > 0 {
		problems = append(problems, "unexpected counts "+strings.Join(bad, " "))
	}
	if st.Conns != conns {
		problems = append(problems, fmt.Sprintf("the table holds %d connections, want %d", st.Conns, conns))
	}
	if n := r.ext.tx.Load(); n != 0 {
		problems = append(problems, fmt.Sprintf("%d frames were transmitted on the external port", n))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s: status: %s", r.name, strings.Join(problems, "; "))
	}
	return nil
}

// runForward runs the phases on a started rig: new flows (one SYN per flow), one ACK
// per flow (entries become established, not timed as the headline), then ACKs over the
// established flows for d. Status is checked after each phase. With bl, the
// blacklist rows follow (runBlacklist).
func runForward(ctx context.Context, r *rig, syn, ack *frameSet, d time.Duration, bl *blacklistPlan) (*forwardResults, error) {
	res := &forwardResults{}
	n := r.flows
	var err error
	if res.NewFlows, err = r.counted(ctx, syn, n); err != nil {
		return res, err
	}
	if err := r.checkStatus(ctx, r.int.tx.Load(), int64(n)); err != nil {
		return res, fmt.Errorf("after the new flows: %w", err)
	}
	if res.FirstACK, err = r.counted(ctx, ack, n); err != nil {
		return res, err
	}
	if res.Established, err = r.timed(ctx, ack, d, false); err != nil {
		return res, err
	}
	res.SourceBound = res.Established.starved()
	if err := r.checkStatus(ctx, r.int.tx.Load(), int64(n)); err != nil {
		return res, fmt.Errorf("after the established flows: %w", err)
	}
	if bl != nil && bl.sets != nil {
		if res.Blacklist, err = runBlacklist(ctx, r, ack, bl.sets, bl.rounds, bl.duration); err != nil {
			return res, fmt.Errorf("blacklist rows: %w", err)
		}
	}
	return res, nil
}

// blacklistPlan is what the blacklist rows need: the lists, how many rounds of the
// three rows, and how long each row is measured.
type blacklistPlan struct {
	sets     *blacklistSets
	rounds   int
	duration time.Duration
}
