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
