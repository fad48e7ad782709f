package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
)

// spreadClients are the client addresses of the in-memory and net_ring measurements:
// one per flow, all distinct, spread over the IPv4 unicast space as the Internet's
// clients are, so that a blacklist lookup per packet reads a different part of the
// list each time (clients packed in one /16 would all be served from one cached
// bucket). These frames never leave the process (a generator port, a DPDK ring into a
// null device); the veth measurement, whose frames cross interfaces, keeps its clients
// in 198.19.0.0/16.
type spreadClients []uint32

// newSpreadClients returns n distinct addresses: a bijective mix of 0, 1, 2, ...,
// skipping the reserved ranges and the benchmark's own networks.
func newSpreadClients(n int) spreadClients {
	c := make(spreadClients, 0, n)
	for j := uint32(0); len(c) < n; j++ {
		if a := mix32(j); usableClient(a) {
			c = append(c, a)
		}
	}
	return c
}

// client is the clientFunc of the spread clients: flow i comes from c[i], port
// clientPortBase + i / 65536 as in flowClient.
func (c spreadClients) client(i int) (netip.Addr, uint16) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], c[i])
	return netip.AddrFrom4(b), clientPortBase + uint16(i/65536)
}

// mix32 is a bijection of the 32-bit integers (a murmur3-style finalizer).
func mix32(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x7feb352d
	x ^= x >> 15
	x *= 0x846ca68b
	x ^= x >> 16
	return x
}

// usableClient rejects 0/8, 10/8, 127/8, 169.254/16, 198.18/15 (the LD's networks),
// 203.0.113/24 (the VIP's) and 224/3 (multicast, reserved).
func usableClient(a uint32) bool {
	switch o := a >> 24; {
	case o == 0 || o == 10 || o == 127 || o >= 224:
		return false
	case a>>16 == 169<<8|254 || a>>17 == (198<<24|18<<16)>>17 || a>>8 == 203<<16|113:
		return false
	}
	return true
}

// blacklistSets are the lists of the blacklist rows.
type blacklistSets struct {
	entries int
	none    *blacklist.Set // entries random IPv4 addresses, no client among them
	some    *blacklist.Set // the same with listed of them replaced by clients' addresses
	listed  int
	build   time.Duration
	bytes   int
}

// newBlacklistSets builds a list of entries random IPv4 addresses that are not
// clients, and the same list with the share listed of the flows' clients in place of
// as many of its entries.
func newBlacklistSets(entries int, clients spreadClients, listedShare float64) *blacklistSets {
	start := time.Now()
	isClient := make(map[uint32]struct{}, len(clients))
	for _, a := range clients {
		isClient[a] = struct{}{}
	}
	rng := rand.New(rand.NewPCG(0x626c, 4))
	seen := make(map[uint32]struct{}, entries)
	addrs := make([]uint32, 0, entries)
	for len(addrs) < entries {
		a := rng.Uint32()
		if _, ok := isClient[a]; ok {
			continue
		}
		if _, ok := seen[a]; ok {
			continue
		}
		seen[a] = struct{}{}
		addrs = append(addrs, a)
	}
	listed := min(len(clients), int(listedShare*float64(len(clients))), entries)
	b := &blacklistSets{entries: entries, listed: listed}
	b.none = buildSet(addrs)
	some := slices.Clone(addrs[listed:])
	// Clients spread over the flows: the frames are shuffled, so the listed ones come
	// at random through a pass.
	step := max(1, len(clients)/max(1, listed))
	for i := 0; i < listed; i++ {
		some = append(some, clients[i*step])
	}
	b.some = buildSet(some)
	b.build = time.Since(start)
	b.bytes = b.none.Bytes()
	return b
}

func buildSet(addrs []uint32) *blacklist.Set {
	var bld blacklist.Builder
	var b [4]byte
	for _, a := range addrs {
		binary.BigEndian.PutUint32(b[:], a)
		bld.AddAddr(netip.AddrFrom4(b), time.Time{})
	}
	return bld.Build()
}

// blacklistRound is one round of the blacklist rows, run back to back on the same
// established flows.
type blacklistRound struct {
	Without *phaseResult `json:"without"`
	With    *phaseResult `json:"with"`
	Listed  *phaseResult `json:"with_some_listed"`
	// Ratio is With ÷ Without in packets per second of worker CPU time (the rate of a
	// core the worker has to itself); ListedRatio the same for Listed, whose packets
	// are counted when handled, forwarded or dropped.
	Ratio       float64 `json:"ratio"`
	ListedRatio float64 `json:"listed_ratio"`
	// WallRatio and ListedWallRatio are the same by the wall clock.
	WallRatio       float64 `json:"wall_ratio"`
	ListedWallRatio float64 `json:"listed_wall_ratio"`
	// SweepMs and ListedSweepMs are how long after the list was put in force the
	// worker was seen to have swept its table (published every 100 ms, so an upper
	// bound; the worker is idle between rows), and FlowsRemoved what the second
	// sweep removed (the listed clients' flows).
	SweepMs       float64 `json:"sweep_ms"`
	ListedSweepMs float64 `json:"listed_sweep_ms"`
	FlowsRemoved  uint64  `json:"flows_removed"`
}

// waitSweep waits (at most 10 s) for the distributor's completed sweeps to exceed
// before, and returns how long that took in milliseconds.
func (r *rig) waitSweep(ctx context.Context, before uint64) (float64, error) {
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for r.d.Status().Blacklist.Sweeps <= before {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s: the worker did not sweep its table within 10s of a blacklist change", r.name)
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return 0, err
		}
	}
	return round(float64(time.Since(start))/1e6, 1), nil
}

// blacklistResults are the blacklist rows of one set-up.
type blacklistResults struct {
	Entries int              `json:"entries"`
	Listed  int              `json:"listed_clients"`
	Dropped uint64           `json:"blacklisted_packets"`
	Rounds  []blacklistRound `json:"rounds"`
	// SourceBound is set when the worker waited for packets more than 1% of a row:
	// the source set the pace, and the ratios say little about the worker.
	SourceBound bool `json:"source_bound"`
	// Ratio and ListedRatio are the medians of the rounds' ratios.
	Ratio       float64 `json:"ratio"`
	ListedRatio float64 `json:"listed_ratio"`
	WallRatio   float64 `json:"wall_ratio"`
}

// runBlacklist runs rounds of three rows over the rig's established flows, each
// measured for d: no list; sets.none in force (none of the clients listed);
// sets.some in force (the listed clients' flows cut, their packets dropped as
// blacklisted), the row without a list first in odd rounds and last in even ones. Then it
// checks the distributor counted every packet of the listed clients as blacklisted.
func runBlacklist(ctx context.Context, r *rig, ack *frameSet, sets *blacklistSets, rounds int, d time.Duration) (*blacklistResults, error) {
	res := &blacklistResults{Entries: sets.entries, Listed: sets.listed}
	l := blacklist.NewList(blacklist.GlobalName, blacklist.Options{})
	defer r.d.SetBlacklists()
	base := r.d.Status().Packets["in/blacklisted"]
	var dropped uint64
	for i := range rounds {
		var rd blacklistRound
		var err error
		without := func() error {
			r.d.SetBlacklists()
			if rd.Without, err = r.timed(ctx, ack, d, false); err != nil {
				return fmt.Errorf("no blacklist: %w", err)
			}
			return nil
		}
		// Odd rounds measure the row without a list first, even ones last, so that
		// a drift of the machine's load does not favour one side.
		if i%2 == 0 {
			if err := without(); err != nil {
				return res, err
			}
		}
		sw := r.d.Status().Blacklist.Sweeps
		l.Replace(sets.none)
		r.d.SetBlacklists(l)
		if rd.SweepMs, err = r.waitSweep(ctx, sw); err != nil {
			return res, err
		}
		if rd.With, err = r.timed(ctx, ack, d, false); err != nil {
			return res, fmt.Errorf("%d-entry blacklist: %w", sets.entries, err)
		}
		sw = r.d.Status().Blacklist.Sweeps
		removed := r.d.Status().Blacklist.FlowsRemoved
		l.Replace(sets.some)
		if rd.ListedSweepMs, err = r.waitSweep(ctx, sw); err != nil {
			return res, err
		}
		rd.FlowsRemoved = r.d.Status().Blacklist.FlowsRemoved - removed
		rx0, tx0 := r.ext.rx.Load(), r.int.tx.Load()
		if rd.Listed, err = r.timed(ctx, ack, d, true); err != nil {
			return res, fmt.Errorf("%d-entry blacklist with %d clients on it: %w", sets.entries, sets.listed, err)
		}
		dropped += (r.ext.rx.Load() - rx0) - (r.int.tx.Load() - tx0)
		if i%2 == 1 {
			if err := without(); err != nil {
				return res, err
			}
		}
		rd.Ratio = ratio(rd.With.MppsPerCPU, rd.Without.MppsPerCPU)
		rd.ListedRatio = ratio(rd.Listed.MppsPerCPU, rd.Without.MppsPerCPU)
		rd.WallRatio = ratio(rd.With.Mpps, rd.Without.Mpps)
		rd.ListedWallRatio = ratio(rd.Listed.Mpps, rd.Without.Mpps)
		res.Rounds = append(res.Rounds, rd)
	}
	res.Dropped = dropped
	res.Ratio = median(res.Rounds, func(rd blacklistRound) float64 { return rd.Ratio })
	res.ListedRatio = median(res.Rounds, func(rd blacklistRound) float64 { return rd.ListedRatio })
	res.WallRatio = median(res.Rounds, func(rd blacklistRound) float64 { return rd.WallRatio })
	// In the first round every listed client has an established flow; later rounds
	// cut those their packets made again since (all of them unless the source was too
	// slow to send every flow a packet).
	for i, rd := range res.Rounds {
		if i == 0 && rd.FlowsRemoved != uint64(sets.listed) || rd.FlowsRemoved > uint64(sets.listed) {
			return res, fmt.Errorf("%s: in round %d, the sweep after %d clients were listed removed %d flows", r.name, i+1, sets.listed, rd.FlowsRemoved)
		}
		res.SourceBound = res.SourceBound || rd.Without.starved() || rd.With.starved() || rd.Listed.starved()
	}
	if sets.listed > 0 && dropped == 0 {
		return res, fmt.Errorf("%s: no packet was dropped with %d clients on the blacklist", r.name, sets.listed)
	}
	// Every packet not forwarded was counted as blacklisted (the counters are
	// published every 100 ms).
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := r.d.Status().Packets["in/blacklisted"] - base
		if got == dropped {
			return res, nil
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%s: %d packets of listed clients were not forwarded, %d counted as blacklisted", r.name, dropped, got)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return res, err
		}
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round(a/b, 3)
}

// median of f over the rounds (the lower middle one for an even count).
func median(rs []blacklistRound, f func(blacklistRound) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}
