package main

import (
	"slices"
	"testing"
)

// A pause of the machine in one round of the updates raises that round only; the
// medians the target compares stay with the rounds that were not hit.
func TestStallRounds(t *testing.T) {
	r := &blacklistResults{
		updates: []*blUpdate{
			{Name: updText, RoundsStallUs: []float64{300, 3900, 280}},
			{Name: updDelta, RoundsStallUs: []float64{450, 200, 260}},
			{Name: updDelta10M, RoundsStallUs: []float64{120}}, // measured in fewer rounds
			{Name: updBinary}, // not measured beside lookups
		},
		swapRounds: []float64{100, 90, 610},
		control:    &blUpdate{Name: updControl, RoundsStallUs: []float64{400, 350, 500, 700}},
	}
	got := r.stallRounds()
	want := [][2]float64{{450, 400}, {3900, 350}, {610, 500}}
	if !slices.Equal(got, want) {
		t.Fatalf("stallRounds = %v, want %v", got, want)
	}
	var upd, ctl []float64
	for _, v := range got {
		upd, ctl = append(upd, v[0]), append(ctl, v[1])
	}
	if m, c := median(upd), median(ctl); m != 610 || c != 400 {
		t.Fatalf("medians = %v, %v; want 610, 400", m, c)
	}
	if (&blacklistResults{}).stallRounds() != nil {
		t.Fatal("no control: want no rounds")
	}
}
