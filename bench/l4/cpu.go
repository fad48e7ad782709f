package main

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// threadCPUClock is the clock ID of thread tid's CPU time (the kernel's
// MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)), readable from any thread of the process.
func threadCPUClock(tid int) int32 { return ^int32(tid)<<3 | 6 }

// threadCPU returns the CPU time thread tid has used, in nanoseconds; 0 if it cannot
// be read.
func threadCPU(tid int) int64 {
	var ts unix.Timespec
	if tid <= 0 || unix.ClockGettime(threadCPUClock(tid), &ts) != nil {
		return 0
	}
	return ts.Nano()
}

// selfThreadCPU returns the CPU time of the calling thread, in nanoseconds.
func selfThreadCPU() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return ts.Nano()
}

// loadProbe measures what other processes use of the machine over an interval: the
// machine's busy time minus this process's CPU time.
type loadProbe struct {
	t0     time.Time
	m0, s0 time.Duration
	ok     bool
}

func startProbe() loadProbe {
	m, err1 := benchkit.MachineBusyCPU()
	s, err2 := benchkit.SelfCPU()
	return loadProbe{t0: time.Now(), m0: m, s0: s, ok: err1 == nil && err2 == nil}
}

// others returns the cores other processes used since the probe started (-1 if it
// could not be measured).
func (p loadProbe) others() float64 {
	m, err1 := benchkit.MachineBusyCPU()
	s, err2 := benchkit.SelfCPU()
	el := time.Since(p.t0)
	if !p.ok || err1 != nil || err2 != nil || el <= 0 {
		return -1
	}
	return max(0, float64((m-p.m0)-(s-p.s0))/float64(el))
}
