package benchkit

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUClock returns the CPU time (user + system) a process has used so far.
type CPUClock func() (time.Duration, error)

// SelfCPU is the CPU time of this process, every thread included.
func SelfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// userHZ is the unit of the times in /proc/PID/stat: USER_HZ, 100 on every
// architecture Linux and Go share.
const userHZ = 100

// ProcessCPU returns a clock reading the CPU time of process pid (every thread)
// from /proc/PID/stat, to 1/100 s.
func ProcessCPU(pid int) CPUClock {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	return func() (time.Duration, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		return parseStatCPU(string(b))
	}
}

// parseStatCPU returns utime + stime from the contents of /proc/PID/stat. The
// command name, field 2, is in parentheses and may hold spaces and parentheses: the
// fields that follow are counted from the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat %q: no command field", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command, want at least 13", len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat: CPU time %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// MachineBusyCPU is the CPU time all processors spent outside their idle and I/O wait
// states, from the first line of /proc/stat: what every process on the machine used,
// to compare with what the benchmark's own processes used.
func MachineBusyCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseMachineBusy(string(b))
}

// parseMachineBusy reads "cpu  user nice system idle iowait irq softirq steal guest
// guest_nice" and returns user+nice+system+irq+softirq+steal (guest time is already
// in user).
func parseMachineBusy(stat string) (time.Duration, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var ticks uint64
	for i, s := range f[1:9] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %q: %w", s, err)
		}
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// WaitQuiet waits until the processes other than those measured by ours (typically
// SelfCPU) used less than maxCores over a one-second interval, or until timeout
// passes or ctx ends. It returns the other processes' use in the last interval, in
// cores, and whether it was below maxCores.
func WaitQuiet(ctx context.Context, maxCores float64, timeout time.Duration, ours ...CPUClock) (float64, bool, error) {
	read := func() (machine, own time.Duration, err error) {
		if machine, err = MachineBusyCPU(); err != nil {
			return 0, 0, err
		}
		for _, c := range ours {
			d, err := c()
			if err != nil {
				return 0, 0, err
			}
			own += d
		}
		return machine, own, nil
	}
	deadline := time.Now().Add(timeout)
	for {
		t0 := time.Now()
		m0, o0, err := read()
		if err != nil {
			return 0, false, err
		}
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-time.After(time.Second):
		}
		m1, o1, err := read()
		if err != nil {
			return 0, false, err
		}
		others := max((m1-m0-(o1-o0)).Seconds()/time.Since(t0).Seconds(), 0)
		if others < maxCores || time.Now().After(deadline) {
			return others, others < maxCores, nil
		}
	}
}
