package autoprocs

import (
	"context"
	"errors"
	"math"
	"os"
	"reflect"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"max under min", Config{Min: 3, Max: 2}, "min 3, max 2"},
		{"negative min", Config{Min: -1, Max: 2}, "min -1"},
		{"tiny interval", Config{Max: 2, Interval: time.Microsecond}, "interval 1µs"},
		{"down over up", Config{Max: 2, UpBusy: 0.5, DownBusy: 0.7}, "down busy 0.7, up busy 0.5"},
		{"up over one", Config{Max: 2, UpBusy: 1.5}, "up busy 1.5"},
		{"negative wait", Config{Max: 2, UpWait: -time.Second}, "up wait -1s"},
		{"negative idle", Config{Max: 2, UpIdle: -1}, "up idle -1"},
		{"negative wait busy", Config{Max: 2, WaitBusy: -0.5}, "wait busy -0.5"},
		{"NaN wait busy", Config{Max: 2, WaitBusy: math.NaN()}, "wait busy NaN"},
		{"negative trial gain", Config{Max: 2, TrialGain: -0.1}, "trial gain -0.1"},
		{"negative trial work", Config{Max: 2, TrialWork: -0.1}, "trial work -0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New(%+v) = %v, want ErrConfig naming %q", tc.cfg, err, tc.want)
			}
		})
	}
	c, err := New(Config{Max: 4})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Min: 1, Max: 4, Interval: DefaultInterval, UpBusy: DefaultUpBusy, UpWait: DefaultUpWait, UpIdle: DefaultUpIdle,
		WaitBusy: DefaultWaitBusy, MinWaits: DefaultMinWaits, DownBusy: DefaultDownBusy, DownAfter: DefaultDownAfter,
		TrialGain: DefaultTrialGain, TrialWork: DefaultTrialWork}
	if !reflect.DeepEqual(c.cfg, want) {
		t.Fatalf("defaults %+v, want %+v", c.cfg, want)
	}
}

func TestNext(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		n    int
		s    Sample
		want int
	}
	for _, tc := range []struct {
		name  string
		work  bool // the Controller counts work: its trials ask for more of it
		steps []step
	}{
		{"saturated doubles", false, []step{
			{1, Sample{Busy: 0.98, Idle: 1}, 2},
			{2, Sample{Busy: 1.95, Idle: 0.5}, 4},
			{4, Sample{Busy: 3.9, Idle: math.NaN()}, 6}, // capped at Max; idle unknown
			{6, Sample{Busy: 5.9, Idle: 1}, 6},
		}},
		{"saturated with the CPUs full holds", false, []step{
			// wrk, l7d and its backend on two CPUs: one P at 0.91 CPU served 10-25 %
			// more requests a second than two (bench-policy's proxy rows).
			{1, Sample{Busy: 0.98, Idle: 0.2}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.2, WaitP99: 3 * time.Millisecond, Waits: 1000}, 1},
			{2, Sample{Busy: 1.95, Idle: 0}, 2},
			{1, Sample{Busy: 0.98, Idle: 0.5}, 2},
		}},
		{"waits that last add one", false, []step{
			{1, Sample{Busy: 0.5, Idle: 1, WaitP99: 2 * ms, Waits: 100}, 1},
			{1, Sample{Busy: 0.5, Idle: 1, WaitP99: 2 * ms, Waits: 100}, 2},
			{2, Sample{Busy: 1.1, Idle: 0.5, WaitP99: 2 * ms, Waits: 100}, 2}, // the last were on one P
			{2, Sample{Busy: 1.1, Idle: 0.5, WaitP99: 2 * ms, Waits: 100}, 3},
			{3, Sample{Busy: 1.5, Idle: math.NaN(), WaitP99: 2 * ms, Waits: 100}, 3}, // idle unknown
			{3, Sample{Busy: 1.5, Idle: math.NaN(), WaitP99: 2 * ms, Waits: 100}, 4},
		}},
		{"one interval's waits add one only when long", false, []step{
			// bench-policy: a row's 32 handshakes in its first 100 ms leave waits of
			// 1-2 ms with half a CPU idle, and are over.
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 1500 * time.Microsecond, Waits: 500}, 1},
			{1, Sample{Busy: 0.85, Idle: 0.1}, 1},
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 2 * ms, Waits: 500}, 1},
			{1, Sample{Busy: 0.6, Idle: 0.6, WaitP99: 200 * time.Microsecond, Waits: 500}, 1}, // a short wait between
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 2 * ms, Waits: 500}, 1},
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 5 * ms, Waits: 500}, 2}, // over 4 × UpWait
		}},
		{"waits on idle Ps do not count", false, []step{
			// One client at a time, key offloaded: l7d at 0.3 CPU, its thread
			// preempted by the key server's signatures (bench-handshake).
			{1, Sample{Busy: 0.3, Idle: 1, WaitP99: 2 * ms, Waits: 100}, 1},
			{2, Sample{Busy: 0.9, Idle: 1, WaitP99: 2 * ms, Waits: 100}, 2},
			{2, Sample{Busy: 0.3, Idle: 1, WaitP99: 2 * ms, Waits: 100}, 2},
			{2, Sample{Busy: 0.3, Idle: 1, WaitP99: 2 * ms, Waits: 100}, 1}, // the window: 0.5 < 0.8
		}},
		{"waits with the CPUs full hold", false, []step{
			{1, Sample{Busy: 0.8, Idle: 0.3, WaitP99: 3 * ms, Waits: 1000}, 1},
			{1, Sample{Busy: 0.8, Idle: 0, WaitP99: 9 * ms, Waits: 1000}, 1},
		}},
		{"too few waits do not count", false, []step{
			{1, Sample{Busy: 0.5, Idle: 1, WaitP99: 50 * ms, Waits: 10}, 1},
		}},
		{"a proxy's load within one P stays on one", false, []step{
			// A TLS proxy at 0.77-0.91 of a CPU, most of it in the kernel: one P
			// served it at the same rate and latency as two, for 15 % less CPU per
			// request (bench-policy's proxy rows).
			{2, Sample{Busy: 0.77}, 2},
			{2, Sample{Busy: 0.77}, 2},
			{2, Sample{Busy: 0.77}, 1},
			{1, Sample{Busy: 0.92}, 1},
			{1, Sample{Busy: 0.92, Idle: 0.3, WaitP99: 2 * ms, Waits: 1000}, 1},
		}},
		{"with the CPUs full, a P the load does not need goes", false, []step{
			// Two Ps from a burst of handshakes, then a proxied load of 0.9 CPU with
			// the CPUs full: one fewer at under 0.95 each. With room, 0.9 holds two.
			{2, Sample{Busy: 0.9, Idle: 1}, 2},
			{2, Sample{Busy: 0.9, Idle: 1}, 2},
			{2, Sample{Busy: 0.9, Idle: 1}, 2},
			{2, Sample{Busy: 0.9, Idle: 0.1}, 2},
			{2, Sample{Busy: 0.9, Idle: 0.1}, 2},
			{2, Sample{Busy: 0.9, Idle: 0.1}, 1},
			{3, Sample{Busy: 1.92, Idle: 0.1}, 3},
			{3, Sample{Busy: 1.92, Idle: 0.1}, 3},
			{3, Sample{Busy: 1.92, Idle: 0.1}, 3},
		}},
		{"a P that finds no CPU goes back, and the next one waits", false, []step{
			// bench-policy's own generator, l7d and the backend on two CPUs: a
			// moment of idle CPUs added a P, and l7d stayed at 0.96 CPU on two.
			{1, Sample{Busy: 0.98, Idle: 0.6}, 2},
			{2, Sample{Busy: 0.97, Idle: 0.1}, 2},
			{2, Sample{Busy: 0.95, Idle: 0.1}, 2},
			{2, Sample{Busy: 0.99, Idle: 0.1}, 1}, // the trial's mean 0.97: 0.01 below
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1}, // no P added for 3 intervals
			{1, Sample{Busy: 0.98, Idle: 0.6, WaitP99: 3 * ms, Waits: 1000}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 2}, // the next trial
			{2, Sample{Busy: 1.1, Idle: 0.1}, 2},
			{2, Sample{Busy: 1.1, Idle: 0.1}, 2},
			{2, Sample{Busy: 1.1, Idle: 0.1}, 1},  // 0.12 more: fails again
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1}, // now 6 intervals
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 2},
			// The CPUs free up: the P is used, and stays.
			{2, Sample{Busy: 1.5, Idle: 0.4}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3}, 2},
			{2, Sample{Busy: 1.5, Idle: 0.4}, 2},
			// A trial that succeeded puts the wait back to 3 intervals.
			{2, Sample{Busy: 0.9, Idle: 0.1}, 2},
			{2, Sample{Busy: 0.9, Idle: 0.1}, 2},
			{2, Sample{Busy: 0.9, Idle: 0.1}, 1}, // CPUs full, 0.9 < 0.95 (the removal rule)
			{1, Sample{Busy: 0.98, Idle: 0.6}, 2},
			{2, Sample{Busy: 0.97, Idle: 0.1}, 2},
			{2, Sample{Busy: 0.97, Idle: 0.1}, 2},
			{2, Sample{Busy: 0.97, Idle: 0.1}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.6}, 2},
		}},
		{"a P that serves no more goes back", true, []step{
			// bench-policy's own generator, l7d and the backend on two CPUs: the
			// second P finds CPU time (0.92 → 1.02) but the requests a second stay
			// where one P served them.
			{1, Sample{Busy: 0.96, Idle: 0.6, Work: 17000}, 2},
			{2, Sample{Busy: 1.02, Idle: 0.1, Work: 16000}, 2},
			{2, Sample{Busy: 1.02, Idle: 0.1, Work: 17500}, 2},
			{2, Sample{Busy: 1.02, Idle: 0.1, Work: 18000}, 1}, // mean 17170: 1 % more
			{1, Sample{Busy: 0.96, Idle: 0.6, Work: 17000}, 1}, // no P added for 3 intervals
			{1, Sample{Busy: 0.96, Idle: 0.6, Work: 17000}, 1},
			{1, Sample{Busy: 0.96, Idle: 0.6, Work: 17000}, 1},
			{1, Sample{Busy: 0.96, Idle: 0.6, Work: 17000}, 2}, // the next trial
			// The other processes quiet down: the P serves a third more, and stays.
			{2, Sample{Busy: 1.4, Idle: 0.5, Work: 22000}, 2},
			{2, Sample{Busy: 1.4, Idle: 0.5, Work: 23000}, 2},
			{2, Sample{Busy: 1.4, Idle: 0.5, Work: 23000}, 2},
			{2, Sample{Busy: 1.4, Idle: 0.5, Work: 23000}, 2},
		}},
		{"the Ps added must beat the recent rate, not only the interval's", true, []step{
			// bench-policy, wrk: l7d on one P at 0.9 CPU, then an interval in which
			// its thread got less of a CPU (0.66), whose waits (the second interval
			// of them) add a P. That interval's rate (21,600) and CPU understate what
			// one P served: the second P serves no more than the recent mean, and
			// goes back.
			{1, Sample{Busy: 0.9, Idle: 0.1, Work: 29000}, 1},
			{1, Sample{Busy: 0.9, Idle: 0.1, Work: 29000}, 1},
			{1, Sample{Busy: 0.9, Idle: 0.1, Work: 29000}, 1},
			{1, Sample{Busy: 0.9, Idle: 0.6, WaitP99: 1100 * time.Microsecond, Waits: 538, Work: 29000}, 1},
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 1100 * time.Microsecond, Waits: 538, Work: 21600}, 2},
			{2, Sample{Busy: 0.92, Idle: 0.1, Work: 28000}, 2},
			{2, Sample{Busy: 0.92, Idle: 0.1, Work: 28000}, 2},
			{2, Sample{Busy: 0.92, Idle: 0.1, Work: 28000}, 1}, // under 1.1 × 26,533
			// A failed trial: the next dip adds no P for a while. (A P kept would have
			// gone by the removal rule just as well, CPUs full, and come back at once.)
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 1100 * time.Microsecond, Waits: 538, Work: 21600}, 1},
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 1100 * time.Microsecond, Waits: 538, Work: 21600}, 1},
		}},
		{"a P kept for its CPU alone is tried back", true, []step{
			// A row of bench-policy starting: one interval adds a P at a fraction of
			// the load, which the CPU criterion keeps (0.95 - 0.6 ≥ 0.25); one P
			// serves the load as well, and stays.
			{1, Sample{Busy: 0.6, Idle: 0.8, WaitP99: 16 * ms, Waits: 51, Work: 1800}, 2},
			{2, Sample{Busy: 0.95, Idle: 0.1, Work: 26000}, 2},
			{2, Sample{Busy: 0.95, Idle: 0.1, Work: 26000}, 2},
			{2, Sample{Busy: 0.95, Idle: 0.1, Work: 26000}, 1},
			{1, Sample{Busy: 0.85, Idle: 0.1, Work: 27000}, 1},
			{1, Sample{Busy: 0.85, Idle: 0.6, WaitP99: 2 * ms, Waits: 500, Work: 25000}, 1}, // waits of a dip: not starved
			{1, Sample{Busy: 0.85, Idle: 0.1, Work: 27000}, 1},                              // mean 26,333 ≥ 0.9 × 26,000
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 2 * ms, Waits: 500, Work: 21600}, 1},
			{1, Sample{Busy: 0.66, Idle: 0.6, WaitP99: 2 * ms, Waits: 500, Work: 21600}, 1}, // as a failed trial: no P for a while
		}},
		{"the Ps a back trial misses come back, for good", true, []step{
			{1, Sample{Busy: 0.6, Idle: 0.8, WaitP99: 16 * ms, Waits: 51, Work: 1800}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.3, Work: 15000}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.3, Work: 15000}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.3, Work: 15000}, 2}, // 15,000 < 0.9 × 26,000
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},  // no new trial
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
		}},
		{"a back trial whose goroutines starve with CPUs idle ends at once", true, []step{
			{1, Sample{Busy: 0.6, Idle: 0.8, WaitP99: 16 * ms, Waits: 51, Work: 1800}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 1},
			{1, Sample{Busy: 0.98, Idle: 0.9, WaitP99: 5 * ms, Waits: 500, Work: 15000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
		}},
		{"a back trial's long waits with CPUs idle end it too", true, []step{
			{1, Sample{Busy: 0.6, Idle: 0.8, WaitP99: 16 * ms, Waits: 51, Work: 1800}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 2},
			{2, Sample{Busy: 1.6, Idle: 0.3, Work: 26000}, 1},
			{1, Sample{Busy: 0.7, Idle: 0.9, WaitP99: 8 * ms, Waits: 500, Work: 15000}, 2},
		}},
		{"with the CPUs full, one P fewer is tried on the work done", true, []step{
			// bench-policy: l7d on two Ps at 0.96 CPU, which one P would serve under
			// UpBusy only by the CPU it used on one (0.85).
			{2, Sample{Busy: 0.96, Idle: 0.1, Work: 26000}, 2},
			{2, Sample{Busy: 0.96, Idle: 0.1, Work: 26000}, 2},
			{2, Sample{Busy: 0.96, Idle: 0.1, Work: 26000}, 1},
			{1, Sample{Busy: 0.85, Idle: 0.1, Work: 27000}, 1},
			{1, Sample{Busy: 0.85, Idle: 0.1, Work: 27000}, 1},
			{1, Sample{Busy: 0.85, Idle: 0.1, Work: 27000}, 1},
			{1, Sample{Busy: 0.85, Idle: 0.1, Work: 27000}, 1},
		}},
		{"a back trial that serves less comes back, and the next waits longer", true, []step{
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 1},
			{1, Sample{Busy: 0.99, Idle: 0.1, Work: 22000}, 1},
			{1, Sample{Busy: 0.99, Idle: 0.1, Work: 22000}, 1},
			{1, Sample{Busy: 0.99, Idle: 0.1, Work: 22000}, 2}, // 22,000 < 0.9 × 40,000
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2}, // a window, but held off
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 1}, // the next try
			{1, Sample{Busy: 0.99, Idle: 0.1, Work: 22000}, 1},
			{1, Sample{Busy: 0.99, Idle: 0.1, Work: 22000}, 1},
			{1, Sample{Busy: 0.99, Idle: 0.1, Work: 22000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2}, // held off for 6 now
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 2},
			{2, Sample{Busy: 1.9, Idle: 0.1, Work: 40000}, 1},
		}},
		{"with work counted, more CPU is not enough", true, []step{
			// The CPU criterion alone would keep this P: 0.5 CPU more.
			{1, Sample{Busy: 0.98, Idle: 1, Work: 1000}, 2},
			{2, Sample{Busy: 1.5, Idle: 0.5, Work: 1050}, 2},
			{2, Sample{Busy: 1.5, Idle: 0.5, Work: 1050}, 2},
			{2, Sample{Busy: 1.5, Idle: 0.5, Work: 1050}, 1},
		}},
		{"a load starting up is judged by the CPU", true, []step{
			// wrk's first interval: waits added a P at 0.6 CPU and 1,800 requests a
			// second, a fraction of the load's rate; no measure of what one P serves.
			{1, Sample{Busy: 0.6, Idle: 0.8, WaitP99: 16 * ms, Waits: 51, Work: 1800}, 2},
			{2, Sample{Busy: 0.82, Idle: 1, Work: 12000}, 2},
			{2, Sample{Busy: 0.82, Idle: 1, Work: 12000}, 2},
			{2, Sample{Busy: 0.82, Idle: 1, Work: 12000}, 1}, // 0.22 more CPU: under 0.25
		}},
		{"an interval without work falls back to the CPU", true, []step{
			// Handshakes longer than an interval: none completed in the one that
			// added the P.
			{1, Sample{Busy: 0.98, Idle: 1}, 2},
			{2, Sample{Busy: 1.5, Idle: 0.5}, 2},
			{2, Sample{Busy: 1.5, Idle: 0.5}, 2},
			{2, Sample{Busy: 1.5, Idle: 0.5}, 2},
			{2, Sample{Busy: 1.0, Idle: 1}, 2},
		}},
		{"a trial whose load fell leaves it to the removal rules", false, []step{
			{1, Sample{Busy: 0.98, Idle: 1}, 2},
			{2, Sample{Busy: 0.3, Idle: 1}, 2},
			{2, Sample{Busy: 0.3, Idle: 1}, 2},
			{2, Sample{Busy: 0.3, Idle: 1}, 1},  // the quiet window, not the trial
			{1, Sample{Busy: 0.98, Idle: 1}, 2}, // no wait after it
		}},
		{"busy but not saturated holds", false, []step{
			{2, Sample{Busy: 1.2}, 2},
			{2, Sample{Busy: 1.7}, 2},
		}},
		{"quiet intervals remove one after DownAfter", false, []step{
			{3, Sample{Busy: 0.5}, 3},
			{3, Sample{Busy: 0.5}, 3},
			{3, Sample{Busy: 0.5}, 2},
			{2, Sample{Busy: 0.5}, 2}, // 0.5 < 0.8×1, but the count starts again
			{2, Sample{Busy: 0.5}, 2},
			{2, Sample{Busy: 0.5}, 1},
			{1, Sample{Busy: 0.1}, 1}, // at Min
		}},
		{"a busy window holds, whatever its quiet intervals", false, []step{
			{2, Sample{Busy: 0.3, Idle: 1}, 2},
			{2, Sample{Busy: 1.2, Idle: 1}, 2},
			{2, Sample{Busy: 1.2, Idle: 1}, 2}, // mean 0.9 ≥ 0.8
			{2, Sample{Busy: 0.3, Idle: 1}, 2},
			{2, Sample{Busy: 0.3, Idle: 1}, 2},
			{2, Sample{Busy: 0.3, Idle: 1}, 1},
		}},
		{"one interval over the threshold does not hold a window under it", false, []step{
			{2, Sample{Busy: 0.5, Idle: 1}, 2},
			{2, Sample{Busy: 0.95, Idle: 1}, 2},
			{2, Sample{Busy: 0.5, Idle: 1}, 1},
		}},
		{"waits over a quarter of UpWait hold", false, []step{
			// 1.5 CPUs fits in two Ps under 0.8 each, but on three it is busy enough for
			// its waits to count.
			{3, Sample{Busy: 1.5, Idle: 1, WaitP99: ms / 2, Waits: 100}, 3},
			{3, Sample{Busy: 1.5, Idle: 1, WaitP99: ms / 2, Waits: 100}, 3},
			{3, Sample{Busy: 1.5, Idle: 1, WaitP99: ms / 2, Waits: 100}, 3},
			{3, Sample{Busy: 1.5, Idle: 1, WaitP99: ms / 2, Waits: 100}, 3},
			{3, Sample{Busy: 1.5, Idle: 1}, 3},
			{3, Sample{Busy: 1.5, Idle: 1}, 3},
			{3, Sample{Busy: 1.5, Idle: 1}, 2},
		}},
		{"waits with the CPUs full do not hold", false, []step{
			{2, Sample{Busy: 0.2, Idle: 0.1, WaitP99: 5 * ms, Waits: 100}, 2},
			{2, Sample{Busy: 0.2, Idle: 0.1, WaitP99: 5 * ms, Waits: 100}, 2},
			{2, Sample{Busy: 0.2, Idle: 0.1, WaitP99: 5 * ms, Waits: 100}, 1},
		}},
		{"a removal undone at once makes the next wait twice as long", false, []step{
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 1},
			{1, Sample{Busy: 0.5, Idle: 1, WaitP99: 5 * ms, Waits: 100}, 2}, // flap: hold 3 → 6
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 1},
			{1, Sample{Busy: 0.98, Idle: 1}, 2}, // flap again: hold 6 → 12
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 2},
			{2, Sample{Busy: 0.2}, 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Max: 6, DownAfter: 3}
			if tc.work {
				cfg.Work = func() uint64 { return 0 } // Next reads the samples' Work
			}
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				if got := c.Next(st.n, st.s); got != st.want {
					t.Fatalf("step %d: Next(%d, %+v) = %d, want %d", i, st.n, st.s, got, st.want)
				}
			}
		})
	}
}

func TestMakeSample(t *testing.T) {
	buckets := []float64{0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2}
	t0 := time.Unix(1e9, 0)
	prev := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{5, 5, 5, 5, 5}}
	// 100 new waits: 98 under 1µs, one in [10µs, 100µs), one in [1ms, 10ms).
	cur := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{103, 5, 6, 5, 6}}
	s := makeSample(reading{at: t0, cpu: time.Second, idle: 0, waits: prev},
		reading{at: t0.Add(time.Second / 2), cpu: time.Second + 300*time.Millisecond, idle: 250 * time.Millisecond, waits: cur})
	if s.Busy != 0.6 || s.Idle != 0.5 {
		t.Errorf("busy %v, idle %v; want 0.6 and 0.5", s.Busy, s.Idle)
	}
	if s.Waits != 100 || s.WaitP99 != 100*time.Microsecond {
		t.Errorf("waits %d, p99 %v; want 100 and 100µs (the 99th wait's upper bound)", s.Waits, s.WaitP99)
	}
	cur.Counts[4] += 10 // now 11 of 110 waits in the last bucket
	if s := makeSample(reading{at: t0, idle: -1, waits: prev}, reading{at: t0.Add(time.Second), idle: 5, waits: cur}); s.WaitP99 != 10*time.Millisecond || s.Waits != 110 || !math.IsNaN(s.Idle) {
		t.Errorf("waits %d, p99 %v, idle %v; want 110, 10ms and unknown", s.Waits, s.WaitP99, s.Idle)
	}
	inf := &metrics.Float64Histogram{Buckets: []float64{0, 1e-3, posInf()}, Counts: []uint64{0, 4}}
	if s := makeSample(reading{at: t0}, reading{at: t0.Add(time.Second), waits: inf}); s.WaitP99 != time.Millisecond {
		t.Errorf("p99 in the open last bucket %v, want its lower bound 1ms", s.WaitP99)
	}
	if s := makeSample(reading{at: t0, work: 100}, reading{at: t0.Add(time.Second / 2), work: 600}); s.Work != 1000 {
		t.Errorf("work %v a second, want 1000", s.Work)
	}
	if s := makeSample(reading{at: t0, work: 600}, reading{at: t0.Add(time.Second), work: 100}); s.Work != 0 {
		t.Errorf("work %v a second from a count that went back, want 0", s.Work)
	}
	if s := makeSample(reading{}, reading{}); s.Busy != 0 || s.Waits != 0 || s.WaitP99 != 0 || !math.IsNaN(s.Idle) {
		t.Errorf("empty sample %+v", s)
	}
}

func posInf() float64 { return math.Inf(1) }

// TestRunFollowsLoad drives Run with a scripted load and checks what it sets, the
// metrics, and that Max is put back at the end.
func TestRunFollowsLoad(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, err := New(Config{Max: 4, Interval: time.Millisecond, DownAfter: 2, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	busy := []float64{0.95, 1.95, 3.9, 3.9, 1, 1, 1, 1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1}
	var (
		mu   sync.Mutex
		sets []int
		r    = reading{at: time.Unix(1e9, 0)}
		i    int
	)
	ctx, cancel := context.WithCancel(context.Background())
	var setAt []int // the readings made before each set
	c.set = func(n int) int {
		mu.Lock()
		sets, setAt = append(sets, n), append(setAt, i)
		mu.Unlock()
		return 0
	}
	c.read = func() reading {
		// Each reading is a second after the last, with the CPU time the script says,
		// on a machine of 8 CPUs that nothing else uses.
		if i > 0 && i <= len(busy) {
			r.at = r.at.Add(time.Second)
			r.cpu += time.Duration(busy[i-1] * float64(time.Second))
			r.idle += time.Duration((8 - busy[i-1]) * float64(time.Second))
		}
		if i == len(busy) {
			cancel()
		}
		i++
		return r
	}
	c.Run(ctx)
	mu.Lock()
	defer mu.Unlock()
	// 4 → 2: the trial of the two Ps added at 3.9 CPUs saw 3.9 and then 1, a mean
	// of 2.45, no more than the 3.9 that added them; then 2 → 1 by the removal rule.
	if want := []int{1, 2, 4, 2, 1, 4}; !slices.Equal(sets, want) {
		t.Fatalf("GOMAXPROCS set to %v, want %v", sets, want)
	}
	if v := testutil.ToFloat64(c.changes.WithLabelValues("up")); v != 2 {
		t.Errorf("up changes %v, want 2", v)
	}
	if v := testutil.ToFloat64(c.changes.WithLabelValues("down")); v != 2 {
		t.Errorf("down changes %v, want 2", v)
	}
	if v := testutil.ToFloat64(c.procs); v != 4 {
		t.Errorf("gauge after Run %v, want Max 4", v)
	}
	// Each interval is a second on the Ps set before its reading (the first reading,
	// 0, is Run's start).
	var want float64
	for k := 1; k <= len(busy); k++ {
		n := 0
		for j, at := range setAt {
			if at <= k {
				n = sets[j]
			}
		}
		want += float64(n)
	}
	if v := testutil.ToFloat64(c.pSeconds); math.Abs(v-want) > 1e-9 || want == 0 {
		t.Errorf("P-seconds %v, want %v", v, want)
	}
}

// TestRunRealLoad runs the Controller on this process: spinning goroutines make it
// add Ps, and when they stop it goes back to one. The machine's idle CPUs are
// taken as unknown: other packages' tests fill them when all run at once, and with
// the CPUs full no P is added (TestNext).
func TestRunRealLoad(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	orig := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(orig)
	c, err := New(Config{Max: 2, Interval: 20 * time.Millisecond, DownAfter: 5})
	if err != nil {
		t.Fatal(err)
	}
	c.read = func() reading {
		r := readLoad(nil)
		r.idle = -1
		return r
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { c.Run(ctx); close(stopped) }()
	waitProcs(t, 1)

	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			deadline := time.Now().Add(10 * time.Second)
			for !stop.Load() && time.Now().Before(deadline) {
				for i := 0; i < 1e5; i++ {
					_ = i * i
				}
			}
		})
	}
	waitProcs(t, 2)
	stop.Store(true)
	wg.Wait()
	waitProcs(t, 1)
	cancel()
	<-stopped
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Fatalf("GOMAXPROCS after Run %d, want Max 2", n)
	}
}

func waitProcs(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.GOMAXPROCS(0) != want {
		if time.Now().After(deadline) {
			t.Fatalf("GOMAXPROCS %d, want %d within 10s", runtime.GOMAXPROCS(0), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestParseStatIdle(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"cpu  1613985 0 564303 1397654 5165 0 48688 0 0 0\ncpu0 1 2 3 4 5\n", (1397654 + 5165) * 10 * time.Millisecond},
		{"cpu  1 2 3 4 5", 9 * 10 * time.Millisecond},
		{"cpu  1 2 3 4", -1},
		{"cpu0 1 2 3 4 5 6\n", -1},
		{"cpu  1 2 3 x 5 6\n", -1},
		{"", -1},
	} {
		if got := parseStatIdle([]byte(tc.in)); got != tc.want {
			t.Errorf("parseStatIdle(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if d := machineIdle(); d < 0 {
		t.Errorf("machineIdle() = %v on Linux, want a reading", d)
	}
}

// TestMachineIdleRereads: the file kept open is read afresh at each sample, not
// once.
func TestMachineIdleRereads(t *testing.T) {
	first := machineIdle()
	if first < 0 {
		t.Fatal("no reading")
	}
	fresh := func() time.Duration {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			t.Fatal(err)
		}
		return parseStatIdle(b)
	}
	later := fresh()
	for deadline := time.Now().Add(5 * time.Second); later <= first; later = fresh() {
		if time.Now().After(deadline) {
			t.Skip("the machine had no idle tick in 5s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := machineIdle(); got < later {
		t.Errorf("machineIdle() = %v after /proc/stat read %v (first reading %v): a stale reading", got, later, first)
	}
}

// TestHoldResets checks that a removal which holds for 30 × DownAfter intervals
// puts the wait before the next one back to DownAfter.
func TestHoldResets(t *testing.T) {
	c, err := New(Config{Max: 4, DownAfter: 2})
	if err != nil {
		t.Fatal(err)
	}
	quiet, busy := Sample{Busy: 0.1}, Sample{Busy: 0.98, Idle: 1}
	n := 2
	for range 2 {
		n = c.Next(n, quiet)
	}
	if n = c.Next(n, busy); n != 2 || c.hold != 4 {
		t.Fatalf("after a flap: %d Ps, hold %d; want 2 and 4", n, c.hold)
	}
	for range 4 {
		n = c.Next(n, quiet)
	}
	if n != 1 {
		t.Fatalf("%d Ps after 4 quiet intervals, want 1", n)
	}
	for range 60 {
		n = c.Next(n, quiet)
	}
	if n != 1 || c.hold != 2 || c.since != -1 {
		t.Fatalf("after 60 intervals: %d Ps, hold %d, since %d; want 1, 2, -1", n, c.hold, c.since)
	}
}

// FuzzParseStatIdle: any bytes give a reading or -1, never a panic or a negative
// duration other than -1.
func FuzzParseStatIdle(f *testing.F) {
	for _, s := range []string{"cpu  1 2 3 4 5 6 7\n", "cpu  1 2 3 4", "cpu0 1 2 3 4 5\n", "", "cpu  18446744073709551615 0 0 18446744073709551615 1\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if d := parseStatIdle(b); d < 0 && d != -1 {
			t.Fatalf("parseStatIdle(%q) = %v", b, d)
		}
	})
}
