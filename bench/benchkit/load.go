// Package benchkit is the harness shared by Tiergate's benchmark commands: a bounded
// closed-loop load generator with latency percentiles, CPU time of this process and of
// child processes, child process lifecycle, peer tools (openssl speed) and table
// output.
//
// Every load is bounded in time and in count; every child process is stopped when the
// benchmark ends, is interrupted or dies.
package benchkit

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Load is a closed-loop load: Workers goroutines each call Op back to back. Only
// operations that complete inside the measured window, which follows a warm-up, are
// counted; workers run through the warm-up into the window so that the window starts
// in a steady state.
type Load struct {
	// Workers is the number of operations in flight. Default 1.
	Workers int
	// Warmup runs before the measured window. Default 0.
	Warmup time.Duration
	// Duration is the length of the measured window. Required.
	Duration time.Duration
	// MaxOps ends the window early once this many operations completed in it.
	// Default 0: no bound but Duration.
	MaxOps int
	// MaxErrors stops the load once this many operations failed, counting the
	// warm-up. Default 1000.
	MaxErrors int
	// Op performs one operation; seq counts the worker's calls from 0.
	Op func(ctx context.Context, worker int, seq uint64) error
	// Clocks are CPU clocks read at the start and the end of the window (SelfCPU,
	// ProcessCPU); Result.CPU holds their differences in the same order.
	Clocks []CPUClock
}

// Result is what a Load measured in its window.
type Result struct {
	Ops       int           // operations completed in the window
	Errors    int           // operations that failed, warm-up included
	FirstErr  error         // the first failure
	Start     time.Time     // when the window started, after the warm-up
	Elapsed   time.Duration // length of the window
	Latencies Latencies     // of the counted operations
	CPU       []time.Duration
	CPUErr    error // reading a clock failed; CPU is then incomplete
}

// Rate returns operations per second in the window.
func (r *Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// CPUPerOp returns clock i's CPU time per counted operation, or 0 if unknown.
func (r *Result) CPUPerOp(i int) time.Duration {
	if r.CPUErr != nil || i >= len(r.CPU) || r.Ops == 0 {
		return 0
	}
	return r.CPU[i] / time.Duration(r.Ops)
}

// Run runs l until its window ends, its operation bound or error bound is reached, or
// ctx ends (then it returns ctx's error with what was measured so far). It waits for
// every operation in flight to finish before returning.
func Run(ctx context.Context, l Load) (*Result, error) {
	if l.Duration <= 0 || l.Op == nil {
		return nil, errors.New("benchkit: a load needs a Duration and an Op")
	}
	workers := max(l.Workers, 1)
	maxErrors := l.MaxErrors
	if maxErrors == 0 {
		maxErrors = 1000
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	start := time.Now()
	t0 := start.Add(l.Warmup)
	t1 := t0.Add(l.Duration)

	var (
		counted  atomic.Int64
		nerr     atomic.Int64
		stopped  = make(chan struct{})
		stopOnce sync.Once
		stopAt   atomic.Int64 // when the window ended early, unix ns
		errMu    sync.Mutex
		firstErr error
		lat      = make([][]time.Duration, workers)
		wg       sync.WaitGroup
	)
	stop := func(at time.Time) {
		stopOnce.Do(func() {
			stopAt.Store(at.UnixNano())
			close(stopped)
		})
	}
	isStopped := func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	}

	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := uint64(0); ; seq++ {
				if isStopped() || ctx.Err() != nil {
					return
				}
				s := time.Now()
				if !s.Before(t1) {
					return
				}
				err := l.Op(ctx, w, seq)
				e := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
					if nerr.Add(1) >= int64(maxErrors) {
						stop(e)
					}
					continue
				}
				if e.Before(t0) {
					continue
				}
				if e.After(t1) || isStopped() {
					return
				}
				n := counted.Add(1)
				if l.MaxOps > 0 && n > int64(l.MaxOps) {
					return
				}
				lat[w] = append(lat[w], e.Sub(s))
				if l.MaxOps > 0 && n == int64(l.MaxOps) {
					stop(e)
				}
			}
		}()
	}

	// The clocks are read at the window's edges.
	res := &Result{}
	var before []time.Duration
	var windowEnd time.Time
	readClocks := func() []time.Duration {
		out := make([]time.Duration, len(l.Clocks))
		for i, c := range l.Clocks {
			d, err := c()
			if err != nil && res.CPUErr == nil {
				res.CPUErr = err
			}
			out[i] = d
		}
		return out
	}
	timer := time.NewTimer(time.Until(t0))
	select {
	case <-timer.C:
		before = readClocks()
		timer.Reset(time.Until(t1))
		select {
		case <-timer.C:
			windowEnd = t1
		case <-stopped:
			windowEnd = time.Unix(0, stopAt.Load())
		case <-ctx.Done():
			windowEnd = time.Now()
		}
		after := readClocks()
		res.CPU = make([]time.Duration, len(after))
		for i := range after {
			res.CPU[i] = after[i] - before[i]
		}
	case <-stopped:
		windowEnd = t0 // stopped by errors during the warm-up
	case <-ctx.Done():
		windowEnd = t0
	}
	timer.Stop()
	parentErr := ctx.Err()
	wg.Wait()

	res.Start = t0
	res.Elapsed = max(windowEnd.Sub(t0), 0)
	res.Errors = int(nerr.Load())
	res.FirstErr = firstErr
	all := make([]time.Duration, 0, counted.Load())
	for _, l := range lat {
		all = append(all, l...)
	}
	res.Ops = len(all)
	res.Latencies = NewLatencies(all)
	return res, parentErr
}

// Latencies is a sorted set of latencies.
type Latencies []time.Duration

// NewLatencies sorts d in place and returns it as Latencies.
func NewLatencies(d []time.Duration) Latencies {
	slices.Sort(d)
	return Latencies(d)
}

// Percentile returns the p-th percentile (0 < p ≤ 100) by the nearest-rank method,
// or 0 for an empty set.
func (l Latencies) Percentile(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	rank := min(max(int(math.Ceil(p/100*float64(len(l)))), 1), len(l))
	return l[rank-1]
}

// Ms returns d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
