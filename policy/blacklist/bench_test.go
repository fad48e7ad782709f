package blacklist

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchData is a set and the addresses to look up in it, built once per run.
type benchData struct {
	list     *List
	n        int // entries added
	hit      []netip.Addr
	miss     []netip.Addr
	prefixes []netip.Prefix
}

var (
	benchMu    sync.Mutex
	benchCache = map[string]*benchData{}
)

const probeMask = 1<<16 - 1

func randV4(r *rand.Rand) netip.Addr { return a4(r.Uint32()).addr() }
func randV6(r *rand.Rand) netip.Addr { return a6{r.Uint64(), r.Uint64()}.addr() }

// loadBench returns the named data, making it on first use.
func loadBench(b *testing.B, name string, make func() *benchData) *benchData {
	b.Helper()
	benchMu.Lock()
	defer benchMu.Unlock()
	if d := benchCache[name]; d != nil {
		return d
	}
	d := make()
	benchCache[name] = d
	runtime.GC()
	return d
}

// exactData is n random addresses from gen; misses are random addresses (a random
// IPv4 address is in a 10M set one time in 430).
func exactData(n int, gen func(*rand.Rand) netip.Addr) *benchData {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	d := &benchData{n: n, prefixes: make([]netip.Prefix, n)}
	var bld Builder
	for i := range d.prefixes {
		a := gen(r)
		d.prefixes[i] = netip.PrefixFrom(a, a.BitLen())
		bld.AddAddr(a, time.Time{})
	}
	d.list = NewList("bench", Options{})
	d.list.Replace(bld.Build())
	for range probeMask + 1 {
		d.hit = append(d.hit, d.prefixes[r.IntN(n)].Addr())
		d.miss = append(d.miss, gen(r))
	}
	return d
}

func benchLookups(b *testing.B, d *benchData) {
	s := d.list.Snapshot()
	for _, c := range []struct {
		name  string
		addrs []netip.Addr
	}{{"hit", d.hit}, {"miss", d.miss}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			found := 0
			i := 0
			for b.Loop() {
				if d.list.Contains(c.addrs[i&probeMask]) {
					found++
				}
				i++
			}
			if c.name == "hit" && found != i {
				b.Fatalf("%d of %d hits found", found, i)
			}
			b.ReportMetric(float64(s.Bytes())/float64(d.n), "B/entry")
		})
	}
}

func BenchmarkContainsV4_1M(b *testing.B) {
	benchLookups(b, loadBench(b, "v4-1M", func() *benchData { return exactData(1_000_000, randV4) }))
}

func BenchmarkContainsV4_10M(b *testing.B) {
	if testing.Short() {
		b.Skip("10M entries: skipped in -short mode")
	}
	benchLookups(b, loadBench(b, "v4-10M", func() *benchData { return exactData(10_000_000, randV4) }))
}

// BenchmarkContainsV4_10MOverlay is BenchmarkContainsV4_10M with the list carrying
// the overlay of 15 deltas of 10k additions, about as large as it gets before the
// list folds it.
func BenchmarkContainsV4_10MOverlay(b *testing.B) {
	if testing.Short() {
		b.Skip("10M entries: skipped in -short mode")
	}
	d := loadBench(b, "v4-10M", func() *benchData { return exactData(10_000_000, randV4) })
	benchLookups(b, loadBench(b, "v4-10M-overlay", func() *benchData { return overlayData(d) }))
}

// overlayData is d with its list carrying the overlay of 15 deltas of 10k
// additions.
func overlayData(d *benchData) *benchData {
	r := rand.New(rand.NewPCG(5, 5))
	s := d.list.Snapshot()
	now := nowSeconds(time.Now())
	for range 15 {
		var delta Delta
		for range 10_000 {
			delta.Add = append(delta.Add, Entry{Prefix: netip.PrefixFrom(randV4(r), 32)})
		}
		var err error
		if s, err = s.applyHow(&delta, now, applyOverlay); err != nil {
			panic(err)
		}
	}
	o := *d
	o.list = NewList("bench", Options{})
	o.list.set.Store(s) // not Replace: that would fold it
	return &o
}

func BenchmarkContainsV6_1M(b *testing.B) {
	benchLookups(b, loadBench(b, "v6-1M", func() *benchData { return exactData(1_000_000, randV6) }))
}

// BenchmarkContainsMixed looks up IPv4 and IPv6 addresses, hits and misses, in a set
// of 1M IPv4 addresses, 100k IPv4 CIDRs (/16 to /30) and 100k IPv6 addresses and /64s.
func BenchmarkContainsMixed(b *testing.B) {
	d := loadBench(b, "mixed", func() *benchData {
		r := rand.New(rand.NewPCG(3, 3))
		d := &benchData{}
		var bld Builder
		for range 1_000_000 {
			a := randV4(r)
			bld.AddAddr(a, time.Time{})
			d.prefixes = append(d.prefixes, netip.PrefixFrom(a, 32))
		}
		for range 100_000 {
			p := netip.PrefixFrom(randV4(r), 16+r.IntN(15)).Masked()
			bld.Add(p, time.Time{})
			d.prefixes = append(d.prefixes, p)
		}
		for i := range 100_000 {
			a := randV6(r)
			p := netip.PrefixFrom(a, 128)
			if i%2 == 0 {
				p = netip.PrefixFrom(a, 64).Masked()
			}
			bld.Add(p, time.Time{})
			d.prefixes = append(d.prefixes, p)
		}
		d.n = len(d.prefixes)
		d.list = NewList("bench", Options{})
		d.list.Replace(bld.Build())
		for range probeMask + 1 {
			d.hit = append(d.hit, d.prefixes[r.IntN(d.n)].Addr())
			if r.IntN(4) == 0 {
				d.miss = append(d.miss, randV6(r))
			} else {
				d.miss = append(d.miss, randV4(r))
			}
		}
		return d
	})
	b.Run("hit+miss", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if i&1 == 0 {
				d.list.Contains(d.hit[i&probeMask])
			} else {
				d.list.Contains(d.miss[i&probeMask])
			}
			i++
		}
		st := d.list.Snapshot().Stats()
		b.ReportMetric(float64(d.list.Snapshot().Bytes())/float64(d.n), "B/entry")
		b.ReportMetric(float64(st.V4Ranges+st.V6Ranges), "ranges")
	})
}

// BenchmarkBuild1M builds a Set of 1M random IPv4 addresses from prefixes and swaps
// it in.
func BenchmarkBuild1M(b *testing.B) {
	d := loadBench(b, "v4-1M", func() *benchData { return exactData(1_000_000, randV4) })
	l := NewList("bench", Options{})
	b.ReportAllocs()
	for b.Loop() {
		var bld Builder
		for _, p := range d.prefixes {
			bld.Add(p, time.Time{})
		}
		l.Replace(bld.Build())
	}
	b.ReportMetric(float64(l.Snapshot().Bytes())/float64(d.n), "B/entry")
}

// stallProbe looks up addresses in a list from a goroutine, timing each lookup.
type stallProbe struct {
	quit  atomic.Bool
	done  chan struct{}
	worst time.Duration
	over  int // lookups over 1ms
	count int
}

func startProbe(l *List, addrs []netip.Addr) *stallProbe {
	p := &stallProbe{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; !p.quit.Load(); i++ {
			t := time.Now()
			l.Contains(addrs[i&probeMask])
			el := time.Since(t)
			p.worst = max(p.worst, el)
			if el > time.Millisecond {
				p.over++
			}
			p.count++
		}
	}()
	return p
}

func (p *stallProbe) stop() { p.quit.Store(true); <-p.done }

func (p *stallProbe) report(b *testing.B) {
	b.ReportMetric(float64(p.worst.Microseconds()), "max-stall-µs")
	b.ReportMetric(float64(p.over), "lookups>1ms")
	b.ReportMetric(float64(p.count)/float64(b.N), "lookups/op")
}

// BenchmarkUpdateStall times every lookup a goroutine makes while the list is
// updated: built from 1M addresses and swapped, changed by a 10k delta, or swapped
// back and forth by MeasureSwapStall. The longest lookup also measures the
// scheduler and the machine, so "baseline" probes the same way while this goroutine
// only burns CPU for 100ms per op, without allocating: the peer to compare with.
func BenchmarkUpdateStall(b *testing.B) {
	d := loadBench(b, "v4-1M", func() *benchData { return exactData(1_000_000, randV4) })
	fwd, back := benchDeltas(d)
	b.Run("baseline", func(b *testing.B) {
		l := NewList("bench", Options{})
		l.Replace(d.list.Snapshot())
		p := startProbe(l, d.hit)
		for b.Loop() {
			for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
			}
		}
		p.stop()
		p.report(b)
	})
	b.Run("build1M", func(b *testing.B) {
		l := NewList("bench", Options{})
		p := startProbe(l, d.hit)
		for b.Loop() {
			var bld Builder
			for _, pf := range d.prefixes {
				bld.Add(pf, time.Time{})
			}
			l.Replace(bld.Build())
		}
		p.stop()
		p.report(b)
	})
	b.Run("delta10k", func(b *testing.B) {
		l := NewList("bench", Options{})
		l.Replace(d.list.Snapshot())
		p := startProbe(l, d.hit)
		i := 0
		for b.Loop() {
			delta := fwd
			if i%2 == 1 {
				delta = back
			}
			if err := l.Apply(delta); err != nil {
				b.Fatal(err)
			}
			i++
		}
		p.stop()
		p.report(b)
	})
	b.Run("swap1M", func(b *testing.B) {
		l := NewList("bench", Options{})
		var worst time.Duration
		for b.Loop() {
			l.Replace(nil)
			worst = max(worst, MeasureSwapStall(l, d.list.Snapshot(), 1<<20))
		}
		b.ReportMetric(float64(worst.Microseconds()), "max-stall-µs")
	})
}

func textOf(d *benchData) []byte {
	var buf bytes.Buffer
	for _, p := range d.prefixes {
		if p.IsSingleIP() {
			buf.WriteString(p.Addr().String())
		} else {
			buf.WriteString(p.String())
		}
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

func BenchmarkParseText1M(b *testing.B) {
	d := loadBench(b, "v4-1M", func() *benchData { return exactData(1_000_000, randV4) })
	text := textOf(d)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseText(bytes.NewReader(text)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadBinary1M(b *testing.B) {
	d := loadBench(b, "v4-1M", func() *benchData { return exactData(1_000_000, randV4) })
	var bin bytes.Buffer
	if err := WriteBinary(&bin, d.list.Snapshot()); err != nil {
		b.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bin.Bytes())
	zw.Close()
	for _, c := range []struct {
		name string
		data []byte
	}{{"plain", bin.Bytes()}, {"gzip", gz.Bytes()}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Read(bytes.NewReader(c.data)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(c.data))/float64(d.n), "file-B/entry")
		})
	}
}

// benchDeltas returns a delta of 5k additions and 5k removals to the 1M set, and
// the delta that undoes it.
func benchDeltas(d *benchData) (fwd, back *Delta) {
	r := rand.New(rand.NewPCG(4, 4))
	fwd, back = &Delta{}, &Delta{}
	for i := range 5000 {
		add := netip.PrefixFrom(randV4(r), 32)
		if i%10 == 0 {
			add = netip.PrefixFrom(randV4(r), 24).Masked()
		}
		rm := d.prefixes[r.IntN(len(d.prefixes))]
		fwd.Add = append(fwd.Add, Entry{Prefix: add})
		fwd.Remove = append(fwd.Remove, rm)
		back.Add = append(back.Add, Entry{Prefix: rm})
		back.Remove = append(back.Remove, add)
	}
	return fwd, back
}

// BenchmarkApplyDelta10k applies 5k additions and 5k removals to a list of 1M IPv4
// addresses, alternating with the delta that undoes it.
func BenchmarkApplyDelta10k(b *testing.B) {
	d := loadBench(b, "v4-1M", func() *benchData { return exactData(1_000_000, randV4) })
	l := NewList("bench", Options{})
	l.Replace(d.list.Snapshot())
	fwd, back := benchDeltas(d)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		delta := fwd
		if i%2 == 1 {
			delta = back
		}
		if err := l.Apply(delta); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func ExampleLists() {
	lists := NewLists(Options{})
	lists.Global().Load(bytes.NewReader([]byte("203.0.113.0/24 # scanners\n")))
	lists.Listener("www").Load(bytes.NewReader([]byte("198.51.100.7 ttl=1h\n")))

	for _, a := range []string{"203.0.113.9", "198.51.100.7", "192.0.2.1"} {
		name, blocked := lists.Check("www", netip.MustParseAddr(a), SourcePacket)
		fmt.Println(a, blocked, name)
	}
	// Output:
	// 203.0.113.9 true global
	// 198.51.100.7 true www
	// 192.0.2.1 false
}

// BenchmarkApplyDelta10kOn10M applies deltas of 5k additions and 5k removals, each
// on other addresses, to a list of 10M IPv4 addresses: the time until a delta is in
// force, with the list folding its overlay in the background as it would in
// service.
func BenchmarkApplyDelta10kOn10M(b *testing.B) {
	d := loadBench(b, "v4-10M", func() *benchData { return exactData(10_000_000, randV4) })
	l := NewList("bench", Options{})
	l.Replace(d.list.Snapshot())
	r := rand.New(rand.NewPCG(6, 6))
	deltas := make([]*Delta, 64)
	for k := range deltas {
		deltas[k] = &Delta{}
		for i := range 5000 {
			add := netip.PrefixFrom(randV4(r), 32)
			if i%10 == 0 {
				add = netip.PrefixFrom(randV4(r), 24).Masked()
			}
			deltas[k].Add = append(deltas[k].Add, Entry{Prefix: add})
			deltas[k].Remove = append(deltas[k].Remove, d.prefixes[r.IntN(len(d.prefixes))])
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := l.Apply(deltas[i%len(deltas)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.StopTimer()
	b.ReportMetric(float64(l.Folds()), "folds")
	l.WaitFold()
	last := deltas[(i-1)%len(deltas)]
	for _, e := range last.Add {
		if !l.Contains(e.Prefix.Addr()) {
			b.Fatalf("%s, added by the last delta, is not listed", e.Prefix)
		}
	}
	for _, p := range last.Remove {
		if l.Contains(p.Addr()) && !slices.ContainsFunc(last.Add, func(e Entry) bool { return e.Prefix.Contains(p.Addr()) }) {
			b.Fatalf("%s, removed by the last delta, is listed", p)
		}
	}
}

// BenchmarkWriteBinary10M writes a list of 10M IPv4 addresses in the binary format,
// as a node's follower does to its disk after each update: without an overlay, and
// with the overlay of 15 deltas of 10k.
func BenchmarkWriteBinary10M(b *testing.B) {
	if testing.Short() {
		b.Skip("10M entries: skipped in -short mode")
	}
	d := loadBench(b, "v4-10M", func() *benchData { return exactData(10_000_000, randV4) })
	o := loadBench(b, "v4-10M-overlay", func() *benchData { return overlayData(d) })
	for _, c := range []struct {
		name string
		s    *Set
	}{{"flat", d.list.Snapshot()}, {"overlay", o.list.Snapshot()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := WriteBinary(io.Discard, c.s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFold10M folds the overlay of 15 deltas of 10k on a list of 10M IPv4
// addresses into new tables: table by table, as a List does ("merge"), and by
// taking the list apart into spans and building it again ("rebuild").
func BenchmarkFold10M(b *testing.B) {
	if testing.Short() {
		b.Skip("10M entries: skipped in -short mode")
	}
	d := loadBench(b, "v4-10M", func() *benchData { return exactData(10_000_000, randV4) })
	s := loadBench(b, "v4-10M-overlay", func() *benchData { return overlayData(d) }).list.Snapshot()
	now := nowSeconds(time.Now())
	b.Run("merge", func(b *testing.B) {
		for b.Loop() {
			s.flat(now)
		}
	})
	b.Run("rebuild", func(b *testing.B) {
		for b.Loop() {
			var sc scratch
			newSet(&sc, unexpired(s.spans4(&sc), now), unexpired(s.spans6(&sc), now))
			sc.free()
		}
	})
}
