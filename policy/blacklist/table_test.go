package blacklist

import (
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// keyGens draw IPv4 keys with different spreads, to cover every index shape.
var keyGens = map[string]func(r *rand.Rand) uint32{
	"uniform":   func(r *rand.Rand) uint32 { return r.Uint32() },
	"one /8":    func(r *rand.Rand) uint32 { return 10<<24 | r.Uint32()>>8 },
	"one /20":   func(r *rand.Rand) uint32 { return 0xc0000200 | r.Uint32()>>20 },
	"two ends":  func(r *rand.Rand) uint32 { return []uint32{r.Uint32() >> 12, ^(r.Uint32() >> 12)}[r.IntN(2)] },
	"clustered": func(r *rand.Rand) uint32 { return uint32(r.IntN(8))<<29 | uint32(r.IntN(3000)) },
}

func TestT4(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for name, gen := range keyGens {
		for _, n := range []int{1, 2, 3, 7, 64, 1000, 20000, 70000} {
			keys := make([]a4, n)
			for i := range keys {
				keys[i] = a4(gen(r))
			}
			slices.Sort(keys)
			keys = slices.Compact(keys)
			tab := newT4(slices.Clone(keys))
			if got := tab.appendKeys(nil); !slices.Equal(got, keys) {
				t.Fatalf("%s n=%d: keys do not round trip", name, n)
			}
			for i := 0; i < len(keys); i += 1 + len(keys)/50 {
				if got := tab.key(i); got != keys[i] {
					t.Fatalf("%s n=%d: key(%d) = %#x, want %#x", name, n, i, got, keys[i])
				}
			}
			probe := func(a a4) {
				i := sort.Search(len(keys), func(i int) bool { return keys[i] > a }) - 1
				if got := tab.pred(a); got != i {
					t.Fatalf("%s n=%d: pred(%#x) = %d, want %d", name, n, a, got, i)
				}
				j, ok := tab.has(a)
				want := i >= 0 && keys[i] == a
				if ok != want || ok && j != i {
					t.Fatalf("%s n=%d: has(%#x) = %d,%v, want %d,%v", name, n, a, j, ok, i, want)
				}
			}
			for _, k := range keys {
				probe(k)
				probe(k - 1)
				probe(k + 1)
			}
			for range 2000 {
				probe(a4(gen(r)))
				probe(a4(r.Uint32()))
			}
			probe(0)
			probe(^a4(0))
		}
	}
}

func TestT6(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	gens := map[string]func() a6{
		"uniform":     func() a6 { return a6{r.Uint64(), r.Uint64()} },
		"one /32":     func() a6 { return a6{0x20010db8<<32 | r.Uint64()>>32, r.Uint64()} },
		"one /64":     func() a6 { return a6{0x20010db800000001, r.Uint64()} },
		"one /120":    func() a6 { return a6{0x20010db800000001, 0xff00 | r.Uint64()>>56} },
		"hi and low":  func() a6 { return []a6{{0, r.Uint64()}, {^uint64(0), r.Uint64()}}[r.IntN(2)] },
		"v4-like low": func() a6 { return a6{0, uint64(r.Uint32())} },
	}
	for name, gen := range gens {
		for _, n := range []int{1, 2, 5, 100, 5000, 40000} {
			keys := make([]a6, n)
			for i := range keys {
				keys[i] = gen()
			}
			slices.SortFunc(keys, func(x, y a6) int { return cmp6(span[a6]{lo: x}, span[a6]{lo: y}) })
			keys = slices.Compact(keys)
			tab := newT6(keys)
			probe := func(a a6) {
				i := sort.Search(len(keys), func(i int) bool { return a.less(keys[i]) }) - 1
				if got := tab.pred(a); got != i {
					t.Fatalf("%s n=%d: pred(%x) = %d, want %d", name, n, a, got, i)
				}
				j, ok := tab.has(a)
				want := i >= 0 && keys[i] == a
				if ok != want || ok && j != i {
					t.Fatalf("%s n=%d: has(%x) = %d,%v, want %d,%v", name, n, a, j, ok, i, want)
				}
			}
			for _, k := range keys {
				probe(k)
				if k != (a6{}) {
					probe(k.dec())
				}
				if !k.isMax() {
					probe(k.inc())
				}
			}
			for range 1000 {
				probe(gen())
				probe(a6{r.Uint64(), r.Uint64()})
			}
		}
	}
}

// paint is the naive model of a span list over a small universe: the expiry of each
// address, 0 for absent.
func paint(universe int, spans []span[a4], now uint32) []uint32 {
	m := make([]uint32, universe)
	for _, s := range spans {
		if s.exp <= now {
			continue
		}
		for a := s.lo; ; a++ {
			m[a] = max(m[a], s.exp)
			if a == s.hi {
				break
			}
		}
	}
	return m
}

func TestSpanAlgebra(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	const universe = 512
	randSpans := func(n int) []span[a4] {
		s := make([]span[a4], n)
		for i := range s {
			lo := a4(r.IntN(universe))
			hi := min(lo+a4(r.IntN(40)), universe-1)
			if r.IntN(3) == 0 {
				hi = lo
			}
			exp := uint32(expPermanent)
			if r.IntN(2) == 0 {
				exp = uint32(1 + r.IntN(6))
			}
			s[i] = span[a4]{lo, hi, exp}
		}
		return s
	}
	for iter := range 500 {
		in := randSpans(r.IntN(30))
		now := uint32(r.IntN(4))
		want := paint(universe, in, now)
		sort4(nil, in)
		norm := normalize(nil, in, now)
		if got := paint(universe, norm, now); !slices.Equal(got, want) {
			t.Fatalf("iteration %d: normalize changed what is covered:\n in %v\nout %v", iter, in, norm)
		}
		for i := 1; i < len(norm); i++ {
			if norm[i].lo <= norm[i-1].hi || norm[i].lo == norm[i-1].hi+1 && norm[i].exp == norm[i-1].exp {
				t.Fatalf("iteration %d: not normalized at %d: %v", iter, i, norm)
			}
		}
		rm := randSpans(r.IntN(10))
		for i := range rm {
			rm[i].exp = expPermanent
		}
		sort4(nil, rm)
		rmn := normalize(nil, rm, 0)
		diff := subtract(nil, norm, rmn)
		gone := paint(universe, rmn, 0)
		for i := range want {
			if gone[i] != 0 {
				want[i] = 0
			}
		}
		if got := paint(universe, diff, now); !slices.Equal(got, want) {
			t.Fatalf("iteration %d: subtract is wrong:\n a %v\n b %v\n = %v", iter, norm, rmn, diff)
		}
		// A Set built from the spans gives the spans back.
		s := newSet(nil, norm, nil)
		if back := s.spans4(nil); !slices.Equal(back, norm) {
			t.Fatalf("iteration %d: spans do not round trip through a Set:\n in %v\nout %v", iter, norm, back)
		}
	}
}

func TestSort4(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	for _, n := range []int{0, 1, 100, 5000, 100000} {
		s := make([]span[a4], n)
		for i := range s {
			s[i].lo = a4(r.Uint32() >> uint(r.IntN(32)))
		}
		sort4(nil, s)
		if !slices.IsSortedFunc(s, func(x, y span[a4]) int { return int(int64(x.lo) - int64(y.lo)) }) {
			t.Fatalf("n=%d: not sorted", n)
		}
	}
}
