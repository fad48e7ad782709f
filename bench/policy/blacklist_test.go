package main

import (
	"os"
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

func TestSchedstat(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "schedstat")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("1234567 890 12\n")
	buf := make([]byte, 128)
	cpu, q, ok := schedstat(f, buf)
	if !ok || cpu != 1234567 || q != 890 {
		t.Fatalf("schedstat = %v, %v, %v; want 1.234567ms, 890ns, true", cpu, q, ok)
	}
	if _, _, ok := schedstat(nil, buf); ok {
		t.Fatal("no file: want not ok")
	}
	// The thread's own counters, where the kernel has them.
	if g, err := os.Open("/proc/thread-self/schedstat"); err == nil {
		defer g.Close()
		if _, _, ok := schedstat(g, buf); !ok {
			t.Fatal("/proc/thread-self/schedstat did not parse")
		}
	}
}

func TestStallRoundWindows(t *testing.T) {
	w1, w2, wc := stallWindow{WallUs: 5000, CPUUs: 4900}, stallWindow{WallUs: 900, OffUs: 800}, stallWindow{WallUs: 300}
	r := &blacklistResults{
		updates: []*blUpdate{
			{Name: updText, RoundsStallUs: []float64{5000, 100}, RoundsWindow: []stallWindow{w1, {}}},
			{Name: updDelta, RoundsStallUs: []float64{40, 900}, RoundsWindow: []stallWindow{{}, w2}},
		},
		swapRounds: []float64{10, 2000},
		control:    &blUpdate{Name: updControl, RoundsStallUs: []float64{300, 400}, RoundsWindow: []stallWindow{wc, {}}},
	}
	got := r.stallRoundWindows()
	if len(got) != 2 || got[0].update != "text upload" || got[0].upd != w1 || got[0].ctl != wc || got[1].update != "swap only" {
		t.Fatalf("stallRoundWindows = %+v", got)
	}
	if s := w1.String(); s != "cpu 4.9, queue 0.0, off 0.0 ms" {
		t.Fatalf("String = %q", s)
	}
}
