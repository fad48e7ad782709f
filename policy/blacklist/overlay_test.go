package blacklist

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// merged is s as a Set without an overlay, holding what s holds, expired entries
// included: what Len, Stats and the binary format of s must agree with.
func merged(s *Set) *Set {
	var sc scratch
	defer sc.free()
	return newSet(&sc, s.spans4(&sc), s.spans6(&sc))
}

func binaryOf(t *testing.T, s *Set) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteBinary(&buf, s); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// randDelta draws a delta in the property tests' universes: up to 200 additions
// and 100 removals, now and then a removal of a /20 or /116.
func randDelta(r *rand.Rand, now uint32) *Delta {
	d := &Delta{}
	for range 1 + r.IntN(200) {
		d.Add = append(d.Add, Entry{Prefix: randPrefix(r), Expires: expTime(randExp(r, now))})
	}
	for range r.IntN(100) {
		d.Remove = append(d.Remove, randPrefix(r))
	}
	if r.IntN(8) == 0 {
		d.Remove = append(d.Remove, netip.PrefixFrom(a4(uint32(addr4(base4))|uint32(r.IntN(16))<<12).addr(), 20))
	}
	if r.IntN(8) == 0 {
		k := from16(base6.As16())
		k.lo |= uint64(r.IntN(16)) << 12
		d.Remove = append(d.Remove, netip.PrefixFrom(k.addr(), 116))
	}
	if r.IntN(10) == 0 {
		d.Add = append(d.Add, Entry{Prefix: netip.PrefixFrom(base4, 16)}) // all of it
	}
	return d
}

// TestOverlayMatchesRebuild applies chains of random deltas to random sets two
// ways, as overlays (folded now and then) and by the rebuild, and checks that they
// hold the same: the same answer for every address of the universes, with time
// passing and entries expiring; the same entries, Len and Stats once the expired
// ones are dropped; and that an overlay's Len, Stats and binary form are those of
// the merged list it stands for.
func TestOverlayMatchesRebuild(t *testing.T) {
	for seed := range uint64(2) {
		r := rand.New(rand.NewPCG(31, seed))
		now := nowSeconds(t0)
		var m model
		var b Builder
		for range 3000 {
			p, e := randPrefix(r), randExp(r, now)
			m.add(p, e)
			b.Add(p, expTime(e))
		}
		for range 2000 { // and addresses outside the universes
			b.AddAddr(randV4(r), time.Time{})
			b.AddAddr(randV6(r), time.Time{})
		}
		ov := b.BuildAt(t0)
		b.Reset()
		rb := ov
		for step := range 30 {
			d := randDelta(r, now)
			for _, p := range d.Remove {
				m.remove(p)
			}
			for _, e := range d.Add {
				m.add(e.Prefix, expSeconds(e.Expires))
			}
			var err error
			if ov, err = ov.applyHow(d, now, applyOverlay); err != nil {
				t.Fatal(err)
			}
			if rb, err = rb.applyHow(d, now, applyRebuild); err != nil {
				t.Fatal(err)
			}
			if ov.ov == nil {
				t.Fatalf("seed %d step %d: no overlay", seed, step)
			}
			checkOverlay(t, r, &m, ov, rb, now, step%10 == 0)
			if t.Failed() {
				t.Fatalf("seed %d, step %d", seed, step)
			}
			if step%11 == 10 {
				ov = ov.flat(now)
			}
			now += uint32(r.IntN(4))
		}
	}
}

// TestOverlayDense is TestOverlayMatchesRebuild on a crowded corner: single
// addresses and pairs in 1024 addresses of each family with three expiries, so
// that what a delta adds keeps meeting entries it merges with.
func TestOverlayDense(t *testing.T) {
	r := rand.New(rand.NewPCG(32, 32))
	now := nowSeconds(t0)
	exps := []uint32{expPermanent, now + 5, now + 10}
	dense := func() (netip.Prefix, uint32) {
		off := uint32(r.IntN(1024))
		bits := 32 - r.IntN(2)
		if r.IntN(2) == 0 {
			k := from16(base6.As16())
			k.lo |= uint64(off)
			return netip.PrefixFrom(k.addr(), bits+96).Masked(), exps[r.IntN(3)]
		}
		return netip.PrefixFrom(a4(uint32(addr4(base4))|off).addr(), bits).Masked(), exps[r.IntN(3)]
	}
	var m model
	var b Builder
	for range 600 {
		p, e := dense()
		m.add(p, e)
		b.Add(p, expTime(e))
	}
	ov := b.BuildAt(t0)
	rb := ov
	for step := range 200 {
		d := &Delta{}
		for range 1 + r.IntN(8) {
			p, e := dense()
			d.Add = append(d.Add, Entry{Prefix: p, Expires: expTime(e)})
			m.add(p, e)
		}
		if r.IntN(2) == 0 {
			p, _ := dense()
			d.Remove = []netip.Prefix{p}
			m.remove(p)
			// Remove before add, as apply does.
			for _, e := range d.Add {
				m.add(e.Prefix, expSeconds(e.Expires))
			}
		}
		var err error
		if ov, err = ov.applyHow(d, now, applyOverlay); err != nil {
			t.Fatal(err)
		}
		if rb, err = rb.applyHow(d, now, applyRebuild); err != nil {
			t.Fatal(err)
		}
		checkOverlay(t, r, &m, ov, rb, now, false)
		if t.Failed() {
			t.Fatalf("step %d", step)
		}
		if step%50 == 49 {
			ov = ov.flat(now)
		}
	}
}

func checkOverlay(t *testing.T, r *rand.Rand, m *model, ov, rb *Set, now uint32, sweep bool) {
	t.Helper()
	probe := func(a netip.Addr) {
		for _, at := range []uint32{now, now + 3, now + 9} {
			tm := time.Unix(int64(at), 0)
			got, want := ov.ContainsAt(a, tm), rb.ContainsAt(a, tm)
			if got != want || want != m.contains(a, at) {
				t.Fatalf("%s at +%ds: overlay %v, rebuild %v, model %v", a, at-nowSeconds(t0), got, want, m.contains(a, at))
			}
		}
	}
	if sweep {
		for off := range uint32(1 << 16) {
			probe(a4(uint32(addr4(base4)) | off).addr())
			k := from16(base6.As16())
			k.lo |= uint64(off)
			probe(k.addr())
		}
	}
	for range 3000 {
		probe(randAddr(r))
	}

	mg := merged(ov)
	if ov.Len() != mg.Len() || ov.Stats() != mg.Stats() {
		t.Fatalf("overlay: Len %d, Stats %+v; its merged list: %d, %+v", ov.Len(), ov.Stats(), mg.Len(), mg.Stats())
	}
	if !bytes.Equal(binaryOf(t, ov), binaryOf(t, mg)) {
		t.Fatal("the binary form of the overlay is not that of its merged list")
	}
	fl := ov.flat(now)
	if fl.Len() != rb.Len() || fl.Stats() != rb.Stats() {
		t.Fatalf("unexpired: overlay Len %d, Stats %+v; rebuild %d, %+v", fl.Len(), fl.Stats(), rb.Len(), rb.Stats())
	}
	if got, want := slices.Collect(fl.All()), slices.Collect(rb.All()); !slices.Equal(got, want) {
		t.Fatalf("unexpired: overlay has %d entries, rebuild %d, not the same", len(got), len(want))
	}
}

// foldList is a List holding 70k random IPv4 addresses, above overlayMinBase, and
// a delta of 3000 additions there, past its foldSize.
func foldList(t *testing.T, r *rand.Rand) (*List, *Set, func() *Delta) {
	t.Helper()
	var b Builder
	defer b.Reset()
	for range 70_000 {
		b.AddAddr(randV4(r), time.Time{})
	}
	base := b.Build()
	if base.Len() < overlayMinBase || foldSize(base.Len()) > 5000 {
		t.Fatalf("a base of %d entries", base.Len())
	}
	l := NewList("www", Options{})
	l.Replace(base)
	delta := func() *Delta {
		d := &Delta{}
		for range 3000 {
			d.Add = append(d.Add, Entry{Prefix: netip.PrefixFrom(randV4(r), 32)})
		}
		for range 100 {
			d.Remove = append(d.Remove, netip.PrefixFrom(randV4(r), 20))
		}
		return d
	}
	return l, base, delta
}

// TestListFoldsOverlay: a list folds a large overlay in the background; the deltas
// put in force while it folds (by Apply, and by Next and ReplaceDelta) are applied
// again on what the fold made, so the list ends up without the overlay and with
// what the rebuild of every delta holds. Lookups run meanwhile (run it with -race).
func TestListFoldsOverlay(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 33))
	l, base, delta := foldList(t, r)
	release := make(chan struct{})
	foldGate = func() { <-release }
	t.Cleanup(func() { foldGate = nil })

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			l.Contains(a4(uint32(i) * 2654435761).addr())
		}
	})
	want := base
	now := nowSeconds(time.Now())
	ds := []*Delta{delta(), delta(), delta()}
	for i, d := range ds {
		var err error
		if want, err = want.applyHow(d, now, applyRebuild); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			if err := l.Apply(d); err != nil {
				t.Fatal(err)
			}
		} else {
			next, err := l.Next(d)
			if err != nil {
				t.Fatal(err)
			}
			l.ReplaceDelta(next)
		}
		if i == 0 && l.fold == nil {
			t.Fatal("no fold started past the overlay's fold size")
		}
	}
	in := l.Snapshot()
	if in.ov == nil {
		t.Fatal("the deltas were not applied as an overlay")
	}
	close(release)
	l.waitFold()
	stop.Store(true)
	wg.Wait()
	got := l.Snapshot()
	if got == in {
		t.Fatal("the fold did not swap anything in")
	}
	if got.overlaySize() >= in.overlaySize() {
		t.Errorf("overlay of %d entries after the fold, %d before", got.overlaySize(), in.overlaySize())
	}
	if got.Len() != want.Len() || got.Stats() != want.Stats() {
		t.Fatalf("folded: %d entries, %+v; rebuilt: %d, %+v", got.Len(), got.Stats(), want.Len(), want.Stats())
	}
	if !slices.Equal(slices.Collect(got.All()), slices.Collect(want.All())) {
		t.Fatal("folded and rebuilt entries differ")
	}
	for _, d := range ds {
		for _, e := range d.Add[:100] {
			if !l.Contains(e.Prefix.Addr()) {
				t.Fatalf("%s, added, not found after the fold", e.Prefix)
			}
		}
	}
}

// TestListFoldDroppedByReplace: a Replace while a fold runs wins; the fold's work
// is dropped.
func TestListFoldDroppedByReplace(t *testing.T) {
	r := rand.New(rand.NewPCG(34, 34))
	l, _, delta := foldList(t, r)
	release := make(chan struct{})
	foldGate = func() { <-release }
	t.Cleanup(func() { foldGate = nil })
	if err := l.Apply(delta()); err != nil {
		t.Fatal(err)
	}
	if l.fold == nil {
		t.Fatal("no fold started")
	}
	repl := buildAt(time.Now(), entrySpec{p: "192.0.2.1"})
	l.Replace(repl)
	close(release)
	l.waitFold()
	if l.Snapshot() != repl {
		t.Fatal("the fold swapped its Set in over a Replace made meanwhile")
	}
}
