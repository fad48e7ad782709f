package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// The scheduler's counters of a server's threads, summed over them (every thread of
// every process: l7d's, or nginx's master and workers), from /proc/<pid>/task/<tid>/
// status (voluntary and involuntary context switches: a voluntary one is a thread
// going to sleep, so each is an idle transition and the wake-up that ends it) and
// schedstat (time spent waiting on a run queue, and timeslices run). They are read
// as CPU clocks (a count as a Duration of that many nanoseconds) so that they cover
// the same window as the CPU figures.
const (
	schedVoluntary = iota
	schedInvoluntary
	schedRunqWait
	schedSlices
	nSched
)

// schedClock returns a clock reading counter what of the threads of pids().
func schedClock(pids func() []int, what int) benchkit.CPUClock {
	return func() (time.Duration, error) {
		c, err := readSched(pids())
		if err != nil {
			return 0, err
		}
		return time.Duration(c[what]), nil
	}
}

// readSched sums the counters over every thread of pids.
func readSched(pids []int) ([nSched]int64, error) {
	var out [nSched]int64
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/task", pid)
		tids, err := os.ReadDir(dir)
		if err != nil {
			return out, err
		}
		for _, t := range tids {
			status, err := os.ReadFile(filepath.Join(dir, t.Name(), "status"))
			if err != nil {
				continue // the thread ended
			}
			stat, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
			if err != nil {
				continue
			}
			v, iv := parseSwitches(status)
			wait, slices := parseSchedstat(stat)
			out[schedVoluntary] += v
			out[schedInvoluntary] += iv
			out[schedRunqWait] += wait
			out[schedSlices] += slices
		}
	}
	return out, nil
}

// parseSwitches reads voluntary_ctxt_switches and nonvoluntary_ctxt_switches from a
// status file.
func parseSwitches(status []byte) (voluntary, involuntary int64) {
	for line := range bytes.Lines(status) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			continue
		}
		switch string(k) {
		case "voluntary_ctxt_switches":
			voluntary = n
		case "nonvoluntary_ctxt_switches":
			involuntary = n
		}
	}
	return voluntary, involuntary
}

// parseSchedstat reads a schedstat file: time on the CPU (ns), time waiting on a run
// queue (ns), timeslices run.
func parseSchedstat(stat []byte) (waitNs, slices int64) {
	f := bytes.Fields(stat)
	if len(f) < 3 {
		return 0, 0
	}
	waitNs, _ = strconv.ParseInt(string(f[1]), 10, 64)
	slices, _ = strconv.ParseInt(string(f[2]), 10, 64)
	return waitNs, slices
}
