package sched

import (
	"fmt"
	"testing"
)

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
