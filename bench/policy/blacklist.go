package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// Kinds of blacklist measured at each size.
const (
	kindV4  = "v4"  // random IPv4 addresses
	kindV6  = "v6"  // random IPv6 addresses
	kindMix = "mix" // IPv4 and IPv6 addresses, and mixCIDRs CIDR ranges of both
)

var kindNames = []string{kindV4, kindV6, kindMix}

// The mix: of the entries that are not CIDRs, mixV4Share are IPv4 addresses and the
// rest IPv6; of its mixCIDRs ranges, mixV4Share are IPv4 prefixes from /20 to /30 and
// the rest IPv6 /48, /56 or /64.
const (
	mixCIDRs   = 100_000
	mixV4Share = 0.8
)

// probeBits sizes the arrays of probe addresses: 1<<20 hits and as many misses,
// 24 MB each, larger than the caches, cycled through by the timed loops.
const probeBits = 20

// updateSize is the size of the list the update figures are taken on.
const updateSize = 1_000_000

// Delta of the update figures: half additions (one in ten a /24), half removals.
const deltaSize = 10_000

// seed makes every run build the same lists and probe the same addresses.
const seed = 0x7469657267617465

// blSet is what one list measured.
type blSet struct {
	Kind    string  `json:"kind"`
	Size    int     `json:"size"`    // entries given to the Builder
	Entries int     `json:"entries"` // Set.Len: after merging
	V4Addrs int     `json:"v4_addrs"`
	V4Range int     `json:"v4_ranges"`
	V6Addrs int     `json:"v6_addrs"`
	V6Range int     `json:"v6_ranges"`
	BuildMs float64 `json:"build_ms"` // Builder.Add of every entry, then Build

	Bytes         int     `json:"set_bytes"`       // Set.Bytes
	BytesPerEntry float64 `json:"bytes_per_entry"` // Set.Bytes ÷ Set.Len
	HeapPerEntry  float64 `json:"heap_bytes_per_entry"`

	HitNs  float64 `json:"hit_ns"`
	MissNs float64 `json:"miss_ns"`
	MixNs  float64 `json:"lookup_ns"` // half hits, half misses, in random order

	OtherCores float64 `json:"other_processes_cores"`
}

// blUpdate is one kind of update of the 1M IPv4 list, timed -update-runs times.
type blUpdate struct {
	Name     string    `json:"name"`
	MedianMs float64   `json:"median_ms"`
	RunsMs   []float64 `json:"runs_ms"`
	// The longest single lookup a goroutine made while the update ran, and how many
	// of its lookups took over a millisecond; nil when no probe ran.
	StallUs *float64 `json:"max_stall_us,omitempty"`
	Over1ms *int     `json:"lookups_over_1ms,omitempty"`
	// The longest lookup of each round (-stall-rounds) beside the update.
	RoundsStallUs []float64 `json:"round_max_stall_us,omitempty"`
	// Where the time of the window of lookups holding each round's longest went.
	RoundsWindow []stallWindow `json:"round_max_stall_window,omitempty"`
	Probes       *int64        `json:"lookups,omitempty"`
	// Garbage collections that ran while the update ran beside the lookups.
	GCs *uint32 `json:"gc_cycles,omitempty"`
}

type blacklistResults struct {
	sets        []*blSet
	updates     []*blUpdate
	swapStallUs *float64  // blacklist.MeasureSwapStall on the 1M list
	swapRounds  []float64 // the same, per round
	control     *blUpdate // the lookup goroutine with no update beside it
	textBytes   int       // the 1M text upload
	binaryBytes int       // the 1M binary upload
	updateOther float64   // others' cores during the updates
}

func (r *blacklistResults) set(kind string, size int) *blSet {
	if r == nil {
		return nil
	}
	for _, s := range r.sets {
		if s.Kind == kind && s.Size == size {
			return s
		}
	}
	return nil
}

func (r *blacklistResults) update(name string) *blUpdate {
	if r == nil {
		return nil
	}
	for _, u := range r.updates {
		if u.Name == name {
			return u
		}
	}
	return nil
}

// blData is the content of a list: single addresses of both families and CIDRs.
type blData struct {
	kind  string
	v4    []uint32
	v6    [][2]uint64
	cidrs []netip.Prefix
}

func (d *blData) len() int { return len(d.v4) + len(d.v6) + len(d.cidrs) }

func addr4(a uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})
}

func addr6(a [2]uint64) netip.Addr {
	var b [16]byte
	for i := range 8 {
		b[i] = byte(a[0] >> (56 - 8*i))
		b[8+i] = byte(a[1] >> (56 - 8*i))
	}
	return netip.AddrFrom16(b)
}

// randomV6 returns a random global unicast address (2000::/3).
func randomV6(r *rand.Rand) [2]uint64 {
	return [2]uint64{r.Uint64()>>3 | 1<<61, r.Uint64()}
}

// genData makes n entries of a kind, the same for the same n and kind.
func genData(kind string, n int) *blData {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	d := &blData{kind: kind}
	switch kind {
	case kindV4:
		d.v4 = make([]uint32, n)
		for i := range d.v4 {
			d.v4[i] = r.Uint32()
		}
	case kindV6:
		d.v6 = make([][2]uint64, n)
		for i := range d.v6 {
			d.v6[i] = randomV6(r)
		}
	case kindMix:
		cidrs := min(mixCIDRs, n/2)
		n4 := int(float64(n-cidrs) * mixV4Share)
		d.v4 = make([]uint32, n4)
		for i := range d.v4 {
			d.v4[i] = r.Uint32()
		}
		d.v6 = make([][2]uint64, n-cidrs-n4)
		for i := range d.v6 {
			d.v6[i] = randomV6(r)
		}
		c4 := int(float64(cidrs) * mixV4Share)
		d.cidrs = make([]netip.Prefix, 0, cidrs)
		for range c4 {
			d.cidrs = append(d.cidrs, netip.PrefixFrom(addr4(r.Uint32()), 20+r.IntN(11)).Masked())
		}
		for range cidrs - c4 {
			d.cidrs = append(d.cidrs, netip.PrefixFrom(addr6(randomV6(r)), []int{48, 56, 64}[r.IntN(3)]).Masked())
		}
	}
	return d
}

// build adds every entry to a Builder and builds the Set.
func (d *blData) build() *blacklist.Set {
	var bld blacklist.Builder
	defer bld.Reset()
	for _, a := range d.v4 {
		bld.AddAddr(addr4(a), time.Time{})
	}
	for _, a := range d.v6 {
		bld.AddAddr(addr6(a), time.Time{})
	}
	for _, p := range d.cidrs {
		bld.Add(p, time.Time{})
	}
	return bld.Build()
}

// randomIn returns a random address in p.
func randomIn(r *rand.Rand, p netip.Prefix) netip.Addr {
	a := p.Addr()
	if a.Is4() {
		b := a.As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		return addr4(v | r.Uint32()&(1<<(32-p.Bits())-1))
	}
	b := a.As16()
	var v [2]uint64
	for i := range 8 {
		v[0] = v[0]<<8 | uint64(b[i])
		v[1] = v[1]<<8 | uint64(b[8+i])
	}
	host := 128 - p.Bits()
	switch {
	case host >= 64:
		v[1] = r.Uint64()
		v[0] |= r.Uint64() & (1<<(host-64) - 1)
	case host > 0:
		v[1] |= r.Uint64() & (1<<host - 1)
	}
	return addr6(v)
}

// probes are the addresses the timed loops look up.
type probes struct {
	hits, misses []netip.Addr // 1<<probeBits each
	mixed        []netip.Addr // half of each, shuffled
	mixedHits    []bool       // whether mixed[i] is a hit
}

// makeProbes picks hits among d's entries (an address inside a CIDR) and misses at
// random in the families d holds, checked against s.
func makeProbes(d *blData, s *blacklist.Set) (*probes, error) {
	const n = 1 << probeBits
	r := rand.New(rand.NewPCG(seed, uint64(d.len())+1))
	p := &probes{hits: make([]netip.Addr, n), misses: make([]netip.Addr, 0, n)}
	total := d.len()
	for i := range p.hits {
		j := r.IntN(total)
		switch {
		case j < len(d.v4):
			p.hits[i] = addr4(d.v4[j])
		case j < len(d.v4)+len(d.v6):
			p.hits[i] = addr6(d.v6[j-len(d.v4)])
		default:
			p.hits[i] = randomIn(r, d.cidrs[j-len(d.v4)-len(d.v6)])
		}
	}
	v4Share := 1.0
	switch d.kind {
	case kindV6:
		v4Share = 0
	case kindMix:
		v4Share = mixV4Share
	}
	for tries := 0; len(p.misses) < n; tries++ {
		if tries > 4*n {
			return nil, fmt.Errorf("%d of %d random addresses are in the set: too few misses", tries-len(p.misses), tries)
		}
		var a netip.Addr
		if r.Float64() < v4Share {
			a = addr4(r.Uint32())
		} else {
			a = addr6(randomV6(r))
		}
		if !s.Contains(a) {
			p.misses = append(p.misses, a)
		}
	}
	p.mixed = make([]netip.Addr, 0, n)
	p.mixed = append(append(p.mixed, p.hits[:n/2]...), p.misses[:n/2]...)
	p.mixedHits = make([]bool, n)
	for i := range n / 2 {
		p.mixedHits[i] = true
	}
	r.Shuffle(n, func(i, j int) {
		p.mixed[i], p.mixed[j] = p.mixed[j], p.mixed[i]
		p.mixedHits[i], p.mixedHits[j] = p.mixedHits[j], p.mixedHits[i]
	})
	return p, nil
}

// lookupRuns is how many runs each lookup figure is the median of.
const lookupRuns = 3

// timeLookups looks up iters addresses of addrs (whose length is a power of two),
// cycling through them, and returns the time per lookup in ns and how many were
// found.
func timeLookups(l *blacklist.List, addrs []netip.Addr, iters int) (float64, int) {
	mask := len(addrs) - 1
	found := 0
	start := time.Now()
	for i := range iters {
		if l.Contains(addrs[i&mask]) {
			found++
		}
	}
	return float64(time.Since(start).Nanoseconds()) / float64(iters), found
}

// expectedFound counts the hits among the first iters probes of a cycle over hits.
func expectedFound(hits []bool, iters int) int {
	per := 0
	for _, h := range hits {
		if h {
			per++
		}
	}
	n := iters / len(hits) * per
	for _, h := range hits[:iters%len(hits)] {
		if h {
			n++
		}
	}
	return n
}

func (b *bench) runBlacklist(ctx context.Context) error {
	res := &blacklistResults{}
	b.bl = res
	for _, size := range b.o.blSizes {
		for _, kind := range kindNames {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := b.measureSet(ctx, kind, size); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				b.Fail("blacklist %s %s: %v", kind, sizeName(size), err)
			}
		}
	}
	if !slices.Contains(b.o.blSizes, updateSize) {
		b.Progress("blacklist: no %s in -bl-sizes, so no update figures", sizeName(updateSize))
	}
	return nil
}

// measureSet builds one list and times lookups in it, and the updates when it is
// the 1M IPv4 list.
func (b *bench) measureSet(ctx context.Context, kind string, size int) error {
	b.Progress("blacklist %s %s: generating, building", kind, sizeName(size))
	d := genData(kind, size)

	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	s := d.build()
	buildTime := time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	heap := int64(m1.HeapAlloc) - int64(m0.HeapAlloc)

	st := s.Stats()
	r := &blSet{
		Kind: kind, Size: size, Entries: s.Len(),
		V4Addrs: st.V4Addrs, V4Range: st.V4Ranges, V6Addrs: st.V6Addrs, V6Range: st.V6Ranges,
		BuildMs: round(benchkit.Ms(buildTime), 1), Bytes: s.Bytes(),
	}
	if r.Entries == 0 {
		return fmt.Errorf("the set built from %d entries is empty", size)
	}
	r.BytesPerEntry = round(float64(r.Bytes)/float64(r.Entries), 2)
	r.HeapPerEntry = round(float64(heap)/float64(r.Entries), 2)

	p, err := makeProbes(d, s)
	if err != nil {
		return err
	}
	l := blacklist.NewList("bench", blacklist.Options{})
	l.Replace(s)

	if err := b.WaitQuiet(ctx, benchkit.SelfCPU); err != nil {
		return err
	}
	others := startOthers(benchkit.SelfCPU)
	// Each figure is the median of lookupRuns runs of a third of -lookups each, so
	// that a moment of interference from the rest of the machine does not make it.
	iters := max(b.o.lookups/lookupRuns, 1)
	for _, c := range []struct {
		name  string
		addrs []netip.Addr
		want  int
		dst   *float64
	}{
		{"hits", p.hits, iters, &r.HitNs},
		{"misses", p.misses, 0, &r.MissNs},
		{"half hits, half misses", p.mixed, expectedFound(p.mixedHits, iters), &r.MixNs},
	} {
		timeLookups(l, c.addrs, len(c.addrs)) // warm-up: one pass
		var runs []float64
		for range lookupRuns {
			ns, found := timeLookups(l, c.addrs, iters)
			if found != c.want {
				return fmt.Errorf("%s: %d of %d lookups found, want %d", c.name, found, iters, c.want)
			}
			runs = append(runs, ns)
		}
		*c.dst = round(median(runs), 1)
	}
	r.OtherCores = round(others.cores(), 2)
	b.bl.sets = append(b.bl.sets, r)
	b.Progress("  %d entries, %.2f B/entry (heap %.2f), built in %.0f ms; lookups: hit %.1f ns, miss %.1f ns, mixed %.1f ns; others %.2f cores",
		r.Entries, r.BytesPerEntry, r.HeapPerEntry, r.BuildMs, r.HitNs, r.MissNs, r.MixNs, r.OtherCores)
	if heap <= 0 || float64(heap) < 0.5*float64(r.Bytes) || float64(heap) > 2*float64(r.Bytes)+(1<<20) {
		b.Progress("  note: the heap grew by %d bytes for a set that counts %d", heap, r.Bytes)
	}

	if kind == kindV4 && size == updateSize {
		if err := b.measureUpdates(ctx, d, s, p); err != nil {
			return fmt.Errorf("updates: %w", err)
		}
	}
	if kind == kindV4 && size == largeLookupSize {
		if err := b.measureLargeDelta(d, s, p); err != nil {
			return fmt.Errorf("delta on %s: %w", sizeName(size), err)
		}
	}
	runtime.KeepAlive(s)
	return nil
}

// Names of the updates, as in the table.
const (
	updText     = "text upload: parse + build + swap"
	updBinary   = "binary upload: read + build + swap"
	updBuilder  = "Builder: add + build + swap"
	updDelta    = "delta of 10k: List.Apply"
	updDelta10M = "deltas of 10k on the 10M list, to a fold: List.Apply"
	updControl  = "control: no update, a busy goroutine, after each"
)

// spin keeps the goroutine busy for d without allocating.
func spin(d time.Duration) {
	end := time.Now().Add(d)
	x := uint64(1)
	for time.Now().Before(end) {
		for range 1000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	spinSink.Store(x)
}

var spinSink atomic.Uint64

// measureUpdates times replacing the 1M IPv4 list (from text, from the binary
// format, from a Builder) and applying a delta of 10k to it, first alone and then
// with a goroutine timing lookups beside them.
func (b *bench) measureUpdates(ctx context.Context, d *blData, ref *blacklist.Set, p *probes) error {
	res := b.bl
	var text bytes.Buffer
	for _, a := range d.v4 {
		text.Write(addr4(a).AppendTo(nil))
		text.WriteByte('\n')
	}
	var bin bytes.Buffer
	if err := blacklist.WriteBinary(&bin, ref); err != nil {
		return fmt.Errorf("writing the binary upload: %w", err)
	}
	res.textBytes, res.binaryBytes = text.Len(), bin.Len()
	fwd, back := makeDeltas(d)

	l := blacklist.NewList("bench", blacklist.Options{})
	check := func(s *blacklist.Set) error {
		if s.Len() != ref.Len() {
			return fmt.Errorf("built %d entries, want %d", s.Len(), ref.Len())
		}
		return nil
	}
	// Each replacement swaps out a 1M list, which then becomes garbage, as in service.
	updates := []struct {
		name string
		run  func(i int) error
	}{
		{updText, func(int) error {
			s, err := blacklist.Read(bytes.NewReader(text.Bytes()))
			if err != nil {
				return err
			}
			l.Replace(s)
			return check(s)
		}},
		{updBinary, func(int) error {
			s, err := blacklist.Read(bytes.NewReader(bin.Bytes()))
			if err != nil {
				return err
			}
			l.Replace(s)
			return check(s)
		}},
		{updBuilder, func(int) error {
			s := d.build()
			l.Replace(s)
			return check(s)
		}},
		{updDelta, func(i int) error {
			delta := fwd
			if i%2 == 1 {
				delta = back
			}
			return l.Apply(delta)
		}},
	}
	if err := b.WaitQuiet(ctx, benchkit.SelfCPU); err != nil {
		return err
	}
	b.Progress("blacklist updates of the %s IPv4 list: %d runs each, then again beside a lookup goroutine", sizeName(updateSize), b.o.updateRuns)
	others := startOthers(benchkit.SelfCPU)
	for _, u := range updates {
		r := &blUpdate{Name: u.name}
		l.Replace(ref)
		runtime.GC()
		for i := range b.o.updateRuns {
			t := time.Now()
			if err := u.run(i); err != nil {
				return fmt.Errorf("%s: %w", u.name, err)
			}
			r.RunsMs = append(r.RunsMs, round(benchkit.Ms(time.Since(t)), 2))
		}
		r.MedianMs = median(r.RunsMs)
		res.updates = append(res.updates, r)
		if u.name == updDelta {
			if err := checkDelta(l, ref, fwd, back, b.o.updateRuns); err != nil {
				return err
			}
		}
	}

	// The same updates with a goroutine timing each of its lookups meanwhile (a
	// delta's until the list has folded it in the background too), each followed
	// by the control for as long: the same lookup goroutine beside a goroutine that
	// keeps a core busy without touching the list or allocating. What the control
	// sees is the scheduler and the rest of the machine, not the list, over as much
	// time as the updates and at about the same moments, so that the longest
	// lookups of the two are drawn alike. All of it runs -stall-rounds times: a
	// stall an update causes comes back in every round, a pause of the machine
	// (a preempted vCPU) in one round of either.
	b.Progress("the same beside a lookup goroutine, each followed by the control, %d rounds", b.o.stallRounds)
	for rnd := range b.o.stallRounds {
		control := func(d time.Duration) { res.controlFor(l, ref, p, d, rnd) }
		for i, u := range updates {
			l.Replace(ref)
			runtime.GC()
			gc0 := numGC()
			pr := startProbe(l, p.mixed)
			t0 := time.Now()
			for j := range b.o.updateRuns {
				if err := u.run(j); err != nil {
					pr.stop()
					return fmt.Errorf("%s (with lookups): %w", u.name, err)
				}
			}
			l.WaitFold()
			took := time.Since(t0)
			pr.stop()
			if pr.count == 0 {
				return fmt.Errorf("%s: the lookup goroutine made no lookup", u.name)
			}
			res.updates[i].addRound(pr, numGC()-gc0)
			control(took)
		}

		l.Replace(nil)
		t0 := time.Now()
		worst := blacklist.MeasureSwapStall(l, ref, 1<<20)
		took := time.Since(t0)
		us := round(float64(worst)/float64(time.Microsecond), 1)
		res.swapRounds = append(res.swapRounds, us)
		res.swapStallUs = ptr(max(us, deref(res.swapStallUs)))
		if l.Snapshot() != ref {
			return fmt.Errorf("MeasureSwapStall left another set in force")
		}
		control(took)
	}
	res.updateOther = round(others.cores(), 2)
	for _, u := range res.updates {
		b.Progress("  %s: median %.1f ms of %v; longest lookup beside it %.1f µs (by round %v), %d collections meanwhile", u.Name, u.MedianMs, u.RunsMs, *u.StallUs, u.RoundsStallUs, *u.GCs)
	}
	b.Progress("  MeasureSwapStall: longest lookup %.1f µs (by round %v); control (no update): %.1f µs (by round %v); others %.2f cores",
		*res.swapStallUs, res.swapRounds, *res.control.StallUs, res.control.RoundsStallUs, res.updateOther)
	return nil
}

// addRound adds one round of lookups beside the update to its figures.
func (u *blUpdate) addRound(pr *stallProbe, gcs uint32) {
	us := round(float64(pr.worst)/float64(time.Microsecond), 1)
	u.StallUs = ptr(max(us, deref(u.StallUs)))
	u.Over1ms = ptr(deref(u.Over1ms) + pr.over)
	u.Probes = ptr(deref(u.Probes) + pr.count)
	u.GCs = ptr(deref(u.GCs) + gcs)
	u.RoundsStallUs = append(u.RoundsStallUs, us)
	u.RoundsWindow = append(u.RoundsWindow, pr.window)
}

func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

// controlFor runs the control (see measureUpdates) for d: the probe on l, holding
// ref, beside a busy goroutine. The control row adds up every window; its longest
// lookup is kept per round too.
func (r *blacklistResults) controlFor(l *blacklist.List, ref *blacklist.Set, p *probes, d time.Duration, rnd int) {
	if r.control == nil {
		r.control = &blUpdate{Name: updControl, StallUs: ptr(0.0), Over1ms: ptr(0), Probes: ptr(int64(0)), GCs: ptr(uint32(0))}
	}
	c := r.control
	l.Replace(ref)
	runtime.GC()
	gc0 := numGC()
	pr := startProbe(l, p.mixed)
	spin(d)
	pr.stop()
	us := round(float64(pr.worst)/float64(time.Microsecond), 1)
	c.RunsMs = append(c.RunsMs, round(benchkit.Ms(d), 2))
	c.MedianMs = round(c.MedianMs+benchkit.Ms(d), 2) // the total, shown as such
	*c.StallUs = max(*c.StallUs, us)
	*c.Over1ms += pr.over
	*c.Probes += pr.count
	*c.GCs += numGC() - gc0
	for len(c.RoundsStallUs) <= rnd {
		c.RoundsStallUs = append(c.RoundsStallUs, 0)
		c.RoundsWindow = append(c.RoundsWindow, stallWindow{})
	}
	if us >= c.RoundsStallUs[rnd] {
		c.RoundsStallUs[rnd], c.RoundsWindow[rnd] = us, pr.window
	}
}

// maxLargeDeltas bounds the deltas measureLargeDelta applies waiting for a fold;
// about 16 take the overlay past its fold size.
const maxLargeDeltas = 24

// measureLargeDelta times deltas of 10k (as in measureUpdates, each on other
// addresses) on the 10M IPv4 list s until the list has folded them into new tables
// once, alone and then beside a lookup goroutine, followed by the control for as
// long.
func (b *bench) measureLargeDelta(d *blData, s *blacklist.Set, p *probes) error {
	res := b.bl
	var deltas []*blacklist.Delta
	u := &blUpdate{Name: updDelta10M}
	run := func(l *blacklist.List, timed bool) error {
		l.Replace(s)
		for i := 0; l.Folds() == 0 && i < maxLargeDeltas; i++ {
			if i == len(deltas) {
				deltas = append(deltas, makeDelta(d, uint64(i)))
			}
			t := time.Now()
			if err := l.Apply(deltas[i]); err != nil {
				return err
			}
			if timed {
				u.RunsMs = append(u.RunsMs, round(benchkit.Ms(time.Since(t)), 2))
			}
			// As deltas come in service, not back to back: the fold runs beside them.
			time.Sleep(20 * time.Millisecond)
		}
		l.WaitFold()
		if l.Folds() == 0 {
			return fmt.Errorf("no fold after %d deltas", maxLargeDeltas)
		}
		return nil
	}
	if err := run(blacklist.NewList("bench", blacklist.Options{}), true); err != nil {
		return err
	}
	u.MedianMs = median(u.RunsMs)
	res.updates = append(res.updates, u)
	var took time.Duration
	for rnd := range b.o.stallRounds {
		l := blacklist.NewList("bench", blacklist.Options{})
		runtime.GC()
		gc0 := numGC()
		pr := startProbe(l, p.mixed)
		t0 := time.Now()
		err := run(l, false)
		took = time.Since(t0)
		pr.stop()
		if err != nil {
			return err
		}
		u.addRound(pr, numGC()-gc0)
		res.controlFor(l, s, p, took, rnd)
	}
	b.Progress("  %s: %d deltas until the list folded them, median %.1f ms, longest %.1f ms; longest lookup beside them (%.0f ms, fold included) %.1f µs (by round %v); control %.1f µs",
		u.Name, len(u.RunsMs), u.MedianMs, slices.Max(u.RunsMs), benchkit.Ms(took), *u.StallUs, u.RoundsStallUs, *res.control.StallUs)
	return nil
}

// makeDelta returns a delta of deltaSize/2 additions (random addresses, one in ten
// a /24) and deltaSize/2 removals of listed addresses, drawn by seed.
func makeDelta(d *blData, seed uint64) *blacklist.Delta {
	r := rand.New(rand.NewPCG(seed, 5))
	out := &blacklist.Delta{}
	for i := range deltaSize / 2 {
		add := netip.PrefixFrom(addr4(r.Uint32()), 32)
		if i%10 == 0 {
			add = netip.PrefixFrom(addr4(r.Uint32()), 24).Masked()
		}
		out.Add = append(out.Add, blacklist.Entry{Prefix: add})
		out.Remove = append(out.Remove, netip.PrefixFrom(addr4(d.v4[r.IntN(len(d.v4))]), 32))
	}
	return out
}

// makeDeltas returns a delta of deltaSize/2 additions (random addresses, one in ten
// a /24) and deltaSize/2 removals of listed addresses, and the delta that undoes it.
func makeDeltas(d *blData) (fwd, back *blacklist.Delta) {
	r := rand.New(rand.NewPCG(seed, 4))
	fwd, back = &blacklist.Delta{}, &blacklist.Delta{}
	for i := range deltaSize / 2 {
		add := netip.PrefixFrom(addr4(r.Uint32()), 32)
		if i%10 == 0 {
			add = netip.PrefixFrom(addr4(r.Uint32()), 24).Masked()
		}
		rm := netip.PrefixFrom(addr4(d.v4[r.IntN(len(d.v4))]), 32)
		fwd.Add = append(fwd.Add, blacklist.Entry{Prefix: add})
		fwd.Remove = append(fwd.Remove, rm)
		back.Add = append(back.Add, blacklist.Entry{Prefix: rm})
		back.Remove = append(back.Remove, add)
	}
	return fwd, back
}

// checkDelta checks what the last of runs deltas left in l: fwd after an odd number
// of them, ref again after an even number.
func checkDelta(l *blacklist.List, ref *blacklist.Set, fwd, back *blacklist.Delta, runs int) error {
	d := back
	if runs%2 == 1 {
		d = fwd
	}
	for _, e := range d.Add {
		if !l.Contains(e.Prefix.Addr()) {
			return fmt.Errorf("%s added by the last delta is not in the list", e.Prefix)
		}
	}
	for _, p := range d.Remove {
		if l.Contains(p.Addr()) {
			return fmt.Errorf("%s removed by the last delta is still in the list", p)
		}
	}
	if runs%2 == 0 && l.Len() != ref.Len() {
		return fmt.Errorf("after a delta and its inverse the list holds %d entries, want %d", l.Len(), ref.Len())
	}
	return nil
}

// numGC is the number of garbage collections completed so far.
func numGC() uint32 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.NumGC
}

// maxProbeLookups bounds a probe goroutine's loop.
const maxProbeLookups = 1 << 34

// stallProbe is a goroutine looking up addresses in a list, timing each lookup.
// It runs on a thread of its own and reads that thread's scheduler counters every
// probeWindow lookups, so that the window holding its longest lookup says where the
// time went (stallWindow).
type stallProbe struct {
	quit   atomic.Bool
	done   chan struct{}
	worst  time.Duration
	over   int         // lookups over 1 ms
	count  int64       // lookups made
	window stallWindow // the window of lookups that holds the longest
}

// stallWindow is where the time of a window of lookups went, by the lookup
// thread's scheduler counters (/proc/thread-self/schedstat): on a CPU as the guest
// kernel sees it (a lookup takes under a microsecond, so milliseconds of it are the
// virtual CPU not running: the hypervisor's steal), waiting in the guest's run
// queue, or off any CPU (asleep: Go's scheduler had given the goroutine's P to
// another goroutine and parked the thread). Zero when the counters cannot be read.
type stallWindow struct {
	WallUs  float64 `json:"wall_us"`
	CPUUs   float64 `json:"on_cpu_us"`
	QueueUs float64 `json:"run_queue_us"`
	OffUs   float64 `json:"off_cpu_us"`
}

func (w stallWindow) String() string {
	if w.WallUs == 0 {
		return "-"
	}
	return fmt.Sprintf("cpu %.1f, queue %.1f, off %.1f ms", w.CPUUs/1e3, w.QueueUs/1e3, w.OffUs/1e3)
}

// probeWindow is the lookups between two reads of the scheduler counters (tens
// to hundreds of microseconds).
const probeWindow = 256

// schedstat reads the calling thread's time on a CPU and waiting in a run queue.
func schedstat(f *os.File, buf []byte) (cpu, queue time.Duration, ok bool) {
	if f == nil {
		return 0, 0, false
	}
	n, err := f.ReadAt(buf, 0)
	if n == 0 || err != nil && err != io.EOF {
		return 0, 0, false
	}
	fs := strings.Fields(string(buf[:n]))
	if len(fs) < 2 {
		return 0, 0, false
	}
	c, err1 := strconv.ParseInt(fs[0], 10, 64)
	q, err2 := strconv.ParseInt(fs[1], 10, 64)
	return time.Duration(c), time.Duration(q), err1 == nil && err2 == nil
}

func startProbe(l *blacklist.List, addrs []netip.Addr) *stallProbe {
	p := &stallProbe{done: make(chan struct{})}
	mask := len(addrs) - 1
	go func() {
		defer close(p.done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		f, _ := os.Open("/proc/thread-self/schedstat")
		if f != nil {
			defer f.Close()
		}
		buf := make([]byte, 128)
		cpu0, q0, ok := schedstat(f, buf)
		w0 := time.Now()
		hit := false // the window under way holds the longest lookup so far
		for i := 0; i < maxProbeLookups && !p.quit.Load(); i++ {
			t := time.Now()
			l.Contains(addrs[i&mask])
			el := time.Since(t)
			if el > p.worst {
				p.worst, hit = el, true
			}
			if el > time.Millisecond {
				p.over++
			}
			p.count++
			if i%probeWindow == probeWindow-1 {
				cpu, q, ok2 := schedstat(f, buf)
				now := time.Now()
				if hit && ok && ok2 {
					wall, dc, dq := now.Sub(w0), cpu-cpu0, q-q0
					p.window = stallWindow{WallUs: us(wall), CPUUs: us(dc), QueueUs: us(dq), OffUs: us(max(0, wall-dc-dq))}
				}
				cpu0, q0, ok, w0, hit = cpu, q, ok2, now, false
			}
		}
		if cpu, q, ok2 := schedstat(f, buf); hit && ok && ok2 {
			wall, dc, dq := time.Since(w0), cpu-cpu0, q-q0
			p.window = stallWindow{WallUs: us(wall), CPUUs: us(dc), QueueUs: us(dq), OffUs: us(max(0, wall-dc-dq))}
		}
	}()
	return p
}

// stop ends the goroutine; its figures are then valid.
func (p *stallProbe) stop() {
	p.quit.Store(true)
	<-p.done
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return round((s[len(s)/2-1]+s[len(s)/2])/2, 2)
}
