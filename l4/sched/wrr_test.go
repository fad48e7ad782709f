package sched

import (
	"fmt"
	"slices"
	"testing"
)

func TestWRRSequence(t *testing.T) {
	const a, b, c = 1, 2, 3
	tests := []struct {
		name    string
		ids     []uint16
		weights []uint32
		want    []uint16 // one full cycle; it must then repeat
	}{
		{"nginx 5 1 1", []uint16{a, b, c}, []uint32{5, 1, 1}, []uint16{a, a, b, a, c, a, a}},
		{"equal", []uint16{a, b, c}, []uint32{1, 1, 1}, []uint16{a, b, c}},
		{"2 1", []uint16{a, b}, []uint32{2, 1}, []uint16{a, b, a}},
		{"zero weight skipped", []uint16{a, b, c}, []uint32{1, 0, 1}, []uint16{a, c}},
		{"single", []uint16{c}, []uint32{9}, []uint16{c}},
		{"4 3 2", []uint16{a, b, c}, []uint32{4, 3, 2}, []uint16{a, b, c, a, b, a, c, b, a}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := NewWRR(tc.ids, tc.weights)
			var got []uint16
			for range 3 * len(tc.want) {
				id, ok := w.Next()
				if !ok {
					t.Fatal("Next = false")
				}
				got = append(got, id)
			}
			want := slices.Concat(tc.want, tc.want, tc.want)
			if !slices.Equal(got, want) {
				t.Fatalf("sequence %v, want %v", got, want)
			}
		})
	}
}

func TestWRRShares(t *testing.T) {
	weights := []uint32{1, 7, 13, 0, 100}
	ids := []uint16{10, 20, 30, 40, 50}
	w := NewWRR(ids, weights)
	const cycles = 50
	counts := map[uint16]int{}
	for range cycles * 121 {
		id, _ := w.Next()
		counts[id]++
	}
	for i, id := range ids {
		if counts[id] != cycles*int(weights[i]) {
			t.Errorf("member %d: %d picks, want %d", id, counts[id], cycles*int(weights[i]))
		}
	}
}

func TestWRREmpty(t *testing.T) {
	for _, w := range []*WRR{NewWRR(nil, nil), NewWRR([]uint16{1, 2}, []uint32{0, 0})} {
		if id, ok := w.Next(); ok {
			t.Errorf("Next = %d, true; want false", id)
		}
	}
}

func TestWRRLengthMismatchPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewWRR with mismatched lengths did not panic")
		}
	}()
	NewWRR([]uint16{1}, nil)
}

func TestWLCPick(t *testing.T) {
	ids := []uint16{1, 2, 3}
	tests := []struct {
		name    string
		weights []uint32
		conns   []uint32 // indexed by member ID
		want    uint16
	}{
		{"all idle: first", []uint32{1, 1, 1}, []uint32{0, 0, 0, 0}, 1},
		{"least conns", []uint32{1, 1, 1}, []uint32{0, 5, 2, 7}, 2},
		{"tie goes to first listed", []uint32{1, 1, 1}, []uint32{0, 4, 3, 3}, 2},
		{"weight scales", []uint32{1, 3, 1}, []uint32{0, 2, 5, 3}, 2}, // 2/1, 5/3, 3/1
		{"weight tie", []uint32{1, 2, 1}, []uint32{0, 3, 6, 4}, 1},    // 3/1 = 6/2
		{"zero weight skipped", []uint32{0, 1, 1}, []uint32{0, 0, 9, 8}, 3},
		{"short counts are zero", []uint32{1, 1, 1}, []uint32{0, 1, 1}, 3},
		{"nil counts", []uint32{1, 1, 1}, nil, 1},
		{"huge counts", []uint32{4_000_000_000, 1, 1}, []uint32{0, 4_000_000_000, 2, 3}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := NewWLC(ids, tc.weights).Pick(tc.conns)
			if !ok || id != tc.want {
				t.Fatalf("Pick = %d, %v; want %d", id, ok, tc.want)
			}
		})
	}
	if id, ok := NewWLC(ids, []uint32{0, 0, 0}).Pick(nil); ok {
		t.Fatalf("Pick with no weight = %d, true", id)
	}
}

// TestWLCConverges feeds picks back as connections: the counts must follow the weights.
func TestWLCConverges(t *testing.T) {
	weights := []uint32{1, 2, 5}
	ids := []uint16{4, 5, 6}
	w := NewWLC(ids, weights)
	conns := make([]uint32, 7)
	for range 8000 {
		id, _ := w.Pick(conns)
		conns[id]++
	}
	for i, id := range ids {
		if want := 1000 * weights[i]; conns[id] != want {
			t.Errorf("member %d: %d connections, want %d", id, conns[id], want)
		}
	}
}

func BenchmarkWRRNext(b *testing.B) {
	for _, n := range []int{4, 32} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			w := NewWRR(seqIDs(n), repeatWeight(n, 3))
			b.ReportAllocs()
			for b.Loop() {
				w.Next()
			}
		})
	}
}

func BenchmarkWLCPick(b *testing.B) {
	for _, n := range []int{4, 32} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			w := NewWLC(seqIDs(n), repeatWeight(n, 3))
			conns := make([]uint32, n+1)
			b.ReportAllocs()
			for b.Loop() {
				id, _ := w.Pick(conns)
				conns[id]++
			}
		})
	}
}
