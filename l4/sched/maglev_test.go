package sched

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func memberKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
	}
	return keys
}

func seqIDs(n int) []uint16 {
	ids := make([]uint16, n)
	for i := range ids {
		ids[i] = uint16(i + 1)
	}
	return ids
}

func repeatWeight(n int, w uint32) []uint32 {
	ws := make([]uint32, n)
	for i := range ws {
		ws[i] = w
	}
	return ws
}

func mustMaglev(t testing.TB, keys []string, weights []uint32, ids []uint16, size uint64) *Maglev {
	t.Helper()
	m, err := NewMaglev(keys, weights, ids, size)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// shares looks up n random hashes and returns how many went to each ID.
func shares(m *Maglev, n int, seed uint64) map[uint16]int {
	r := rand.New(rand.NewPCG(seed, 1))
	got := map[uint16]int{}
	for range n {
		id, ok := m.Lookup(r.Uint64())
		if !ok {
			panic("lookup failed")
		}
		got[id]++
	}
	return got
}

func TestNewMaglevErrors(t *testing.T) {
	tests := []struct {
		name    string
		keys    []string
		weights []uint32
		ids     []uint16
		size    uint64
		want    error
	}{
		{"weights short", []string{"a", "b"}, []uint32{1}, []uint16{1, 2}, 0, ErrLengthMismatch},
		{"ids short", []string{"a", "b"}, []uint32{1, 1}, []uint16{1}, 0, ErrLengthMismatch},
		{"size not prime", []string{"a"}, []uint32{1}, []uint16{1}, 65536, ErrSizeNotPrime},
		{"size one", []string{"a"}, []uint32{1}, []uint16{1}, 1, ErrSizeNotPrime},
		{"size too small", []string{"a", "b", "c"}, []uint32{1, 1, 1}, []uint16{1, 2, 3}, 2, ErrSizeTooSmall},
		{"size too large", []string{"a"}, []uint32{1}, []uint16{1}, NextPrime(MaglevMaxSize), ErrSizeTooLarge},
		{"duplicate key", []string{"a", "b", "a"}, []uint32{1, 1, 1}, []uint16{1, 2, 3}, 0, ErrDuplicateKey},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMaglev(tc.keys, tc.weights, tc.ids, tc.size)
			if !errors.Is(err, tc.want) || m != nil {
				t.Fatalf("NewMaglev = %v, %v; want error %v", m, err, tc.want)
			}
		})
	}
}

func TestMaglevSmallSizes(t *testing.T) {
	for _, size := range []uint64{2, 3, 5, 7, 13} {
		n := min(int(size), 3)
		m := mustMaglev(t, memberKeys(n), repeatWeight(n, 1), seqIDs(n), size)
		if m.Size() != size {
			t.Fatalf("Size = %d, want %d", m.Size(), size)
		}
		seen := map[uint16]bool{}
		for h := range size {
			id, ok := m.Lookup(h)
			if !ok || id < 1 || int(id) > n {
				t.Fatalf("size %d: Lookup(%d) = %d, %v", size, h, id, ok)
			}
			seen[id] = true
		}
		if len(seen) != n {
			t.Fatalf("size %d: %d of %d members own slots", size, len(seen), n)
		}
	}
}

func TestMaglevNoMembers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		keys    []string
		weights []uint32
	}{
		{"empty pool", nil, nil},
		{"all drained", []string{"a", "b"}, []uint32{0, 0}},
	} {
		m := mustMaglev(t, tc.keys, tc.weights, seqIDs(len(tc.keys)), 0)
		if id, ok := m.Lookup(12345); ok {
			t.Errorf("%s: Lookup = %d, true; want false", tc.name, id)
		}
		if m.Size() != MaglevMinSize {
			t.Errorf("%s: Size = %d", tc.name, m.Size())
		}
	}
}

func TestMaglevBalanceEqualWeights(t *testing.T) {
	for _, n := range []int{2, 3, 5, 10, 33, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			// 100,000 samples per member keep the sampling error near 0.3 %, so a
			// 2 % miss is the table's fault, not the dice's.
			samples := max(2_000_000, 100_000*n)
			m := mustMaglev(t, memberKeys(n), repeatWeight(n, 1), seqIDs(n), 0)
			// The table itself: equal weights give each member ⌊M/n⌋ or ⌈M/n⌉ slots
			// up to the end of the fill, where turns go unused.
			slots := map[uint16]int{}
			for h := range m.Size() {
				id, _ := m.Lookup(h)
				slots[id]++
			}
			ideal := float64(m.Size()) / float64(n)
			for id, c := range slots {
				if math.Abs(float64(c)-ideal) > 1 {
					t.Errorf("member %d owns %d slots, ideal %.1f", id, c, ideal)
				}
			}
			got := shares(m, samples, uint64(n))
			if len(got) != n {
				t.Fatalf("%d members got traffic, want %d", len(got), n)
			}
			want := 1 / float64(n)
			for id, c := range got {
				share := float64(c) / float64(samples)
				if math.Abs(share-want) > 0.02*want {
					t.Errorf("member %d share %.5f, want %.5f ± 2%%", id, share, want)
				}
			}
		})
	}
}

func TestMaglevWeights(t *testing.T) {
	tests := []struct {
		weights []uint32
	}{
		{[]uint32{1, 2, 3}},
		{[]uint32{3, 2, 1}},
		{[]uint32{100, 200, 300}},
		{[]uint32{1, 1, 1, 5}},
		{[]uint32{10, 0, 30}},
		{[]uint32{4_000_000_000, 1_000_000_000}},
		{[]uint32{7, 7, 7, 7, 7, 7, 1}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.weights), func(t *testing.T) {
			n := len(tc.weights)
			m := mustMaglev(t, memberKeys(n), tc.weights, seqIDs(n), 0)
			var total uint64
			for _, w := range tc.weights {
				total += uint64(w)
			}
			slots := make([]int, n+1)
			for h := range m.Size() {
				id, _ := m.Lookup(h)
				slots[id]++
			}
			for i, w := range tc.weights {
				want := float64(w) / float64(total)
				got := float64(slots[i+1]) / float64(m.Size())
				if w == 0 && got != 0 {
					t.Errorf("member %d (weight 0) owns %.4f of the slots", i+1, got)
				}
				if math.Abs(got-want) > 0.03*want {
					t.Errorf("member %d (weight %d) owns %.4f of the slots, want %.4f ± 3%%",
						i+1, w, got, want)
				}
			}
		})
	}
}

func TestMaglevOrderIndependent(t *testing.T) {
	n := 20
	keys, weights, ids := memberKeys(n), make([]uint32, n), seqIDs(n)
	for i := range weights {
		weights[i] = uint32(i%4 + 1)
	}
	a := mustMaglev(t, keys, weights, ids, 0)
	r := rand.New(rand.NewPCG(7, 7))
	for range 5 {
		perm := r.Perm(n)
		k2, w2, i2 := make([]string, n), make([]uint32, n), make([]uint16, n)
		for j, p := range perm {
			k2[j], w2[j], i2[j] = keys[p], weights[p], ids[p]
		}
		b := mustMaglev(t, k2, w2, i2, 0)
		if !slices.Equal(a.table, b.table) {
			t.Fatalf("table depends on the order of members (permutation %v)", perm)
		}
	}
	// And NewMaglev leaves the caller's slices alone.
	if !slices.Equal(keys, memberKeys(n)) || !slices.Equal(ids, seqIDs(n)) {
		t.Fatal("NewMaglev modified its arguments")
	}
}

// moved counts the slots whose owner differs between a and b.
func moved(a, b *Maglev) int {
	n := 0
	for i := range a.table {
		if a.table[i] != b.table[i] {
			n++
		}
	}
	return n
}

func TestMaglevDisruption(t *testing.T) {
	for _, n := range []int{3, 5, 10, 50, 100, 300} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			keys, ids := memberKeys(n), seqIDs(n)
			full := mustMaglev(t, keys, repeatWeight(n, 1), ids, 0)
			limit := 1/float64(n) + 0.02
			for _, gone := range []int{0, n / 2, n - 1} {
				// Removing the member from the pool, and draining it (weight 0),
				// must both move only about its own share.
				k := slices.Delete(slices.Clone(keys), gone, gone+1)
				i := slices.Delete(slices.Clone(ids), gone, gone+1)
				removed := mustMaglev(t, k, repeatWeight(n-1, 1), i, full.Size())
				w := repeatWeight(n, 1)
				w[gone] = 0
				drained := mustMaglev(t, keys, w, ids, full.Size())
				if !slices.Equal(removed.table, drained.table) {
					t.Fatal("removing a member and draining it give different tables")
				}
				for h := range full.table {
					if removed.table[h] == ids[gone] {
						t.Fatalf("slot %d still maps to the removed member", h)
					}
				}
				frac := float64(moved(full, removed)) / float64(full.Size())
				t.Logf("removing member %d of %d moved %.4f of the slots (its share %.4f)",
					gone, n, frac, 1/float64(n))
				if frac > limit {
					t.Errorf("removing member %d of %d moved %.4f of the slots, limit %.4f",
						gone, n, frac, limit)
				}
				// Adding it back restores the original table exactly.
				back := mustMaglev(t, keys, repeatWeight(n, 1), ids, full.Size())
				if moved(full, back) != 0 {
					t.Error("adding the member back did not restore the table")
				}
				// Adding a new member moves about its own share.
				added := mustMaglev(t, append(slices.Clone(keys), "new-member"),
					repeatWeight(n+1, 1), append(slices.Clone(ids), 9999), full.Size())
				if frac := float64(moved(full, added)) / float64(full.Size()); frac > 1/float64(n+1)+0.02 {
					t.Errorf("adding a member to %d moved %.4f of the slots", n, frac)
				}
			}
		})
	}
}

func TestMaglevWeightChangeDisruption(t *testing.T) {
	n := 10
	keys, ids := memberKeys(n), seqIDs(n)
	a := mustMaglev(t, keys, repeatWeight(n, 2), ids, 0)
	w := repeatWeight(n, 2)
	w[3] = 1 // halve one member: it loses about half its share (1/20 of the space)
	b := mustMaglev(t, keys, w, ids, 0)
	if frac := float64(moved(a, b)) / float64(a.Size()); frac > 1.0/20+0.02 {
		t.Errorf("halving one weight of %d moved %.4f of the slots", n, frac)
	}
}

func TestMaglevDeterministic(t *testing.T) {
	keys := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	m := mustMaglev(t, keys, []uint32{1, 1, 1}, []uint16{1, 2, 3}, 0)
	// Pinned values: a change to the permutation hash or the fill order moves flows
	// between load distributors running different builds, so it must be deliberate.
	got := [8]uint16{}
	for i := range got {
		got[i], _ = m.Lookup(uint64(i) * 0x9e3779b97f4a7c15)
	}
	t.Logf("pinned lookups: %v", got)
	want := [8]uint16{1, 3, 3, 3, 3, 2, 1, 1}
	if got != want {
		t.Errorf("lookups = %v, want %v", got, want)
	}
}

func BenchmarkMaglevLookup(b *testing.B) {
	m := mustMaglev(b, memberKeys(100), repeatWeight(100, 1), seqIDs(100), 0)
	h := uint64(0x12345)
	var sink uint16
	b.ReportAllocs()
	for b.Loop() {
		h = h*6364136223846793005 + 1442695040888963407
		id, _ := m.Lookup(h)
		sink += id
	}
	_ = sink
}

func BenchmarkNewMaglev(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			keys, weights, ids := memberKeys(n), repeatWeight(n, 1), seqIDs(n)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewMaglev(keys, weights, ids, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
