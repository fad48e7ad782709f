package blacklist

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"
)

// MeasureSwapStall measures what swapping s into l costs the lookups running beside
// it: a goroutine times probes lookups one by one (addresses from s and random ones)
// while the caller's goroutine swaps s and the Set l held before, in turn, until the
// probes are done. It returns the longest single lookup seen, timer included. l holds
// s afterwards; meanwhile it alternates between the two Sets, so this is for
// benchmarks, not for a list in service. probes <= 0 means 1<<20.
func MeasureSwapStall(l *List, s *Set, probes int) time.Duration {
	if probes <= 0 {
		probes = 1 << 20
	}
	old := l.Snapshot()
	addrs := probeAddrs(s, 4096)
	var running atomic.Bool
	done := make(chan time.Duration, 1)
	go func() {
		var worst time.Duration
		for i := range probes {
			t := time.Now()
			l.Contains(addrs[i%len(addrs)])
			if d := time.Since(t); d > worst {
				worst = d
			}
			if i == 0 {
				running.Store(true)
			}
		}
		done <- worst
	}()
	for !running.Load() {
		runtime.Gosched()
	}
	for i := 0; ; i++ {
		select {
		case worst := <-done:
			l.Replace(s)
			return worst
		default:
		}
		next := s
		if i%2 == 1 {
			next = old
		}
		l.set.Store(next)
	}
}

// probeAddrs returns n addresses: about half taken evenly from s's tables, the rest
// random in the families s holds.
func probeAddrs(s *Set, n int) []netip.Addr {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]netip.Addr, 0, n)
	if total := s.Len(); total > 0 {
		stride := max(1, total/(n/2))
		for _, t := range []*t4{&s.p4.t, &s.pr4.start, &s.e4.t, &s.er4.start} {
			for i := 0; i < t.n; i += stride {
				out = append(out, t.key(i).addr())
			}
		}
		for _, t := range []*t6{&s.p6.t, &s.pr6.start, &s.e6.t, &s.er6.start} {
			for i := 0; i < t.n; i += stride {
				out = append(out, t.keys[i].addr())
			}
		}
	}
	st := s.Stats()
	v6 := st.V6Addrs+st.V6Ranges > 0
	v4 := st.V4Addrs+st.V4Ranges > 0 || !v6
	for i := 0; len(out) < n; i++ {
		if v4 && (!v6 || i%2 == 0) {
			out = append(out, a4(rng.Uint32()).addr())
		} else {
			out = append(out, a6{rng.Uint64(), rng.Uint64()}.addr())
		}
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
