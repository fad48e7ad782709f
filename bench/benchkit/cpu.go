package benchkit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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

// parseStatCPU returns utime + stime from the contents of /proc/PID/stat.
func parseStatCPU(stat string) (time.Duration, error) {
	own, _, err := parseStatTimes(stat, false)
	return own, err
}

// parseStatTimes returns utime + stime and, with waited, cutime + cstime (the time
// of the children the process has waited for) from the contents of /proc/PID/stat.
// The command name, field 2, is in parentheses and may hold spaces and parentheses:
// the fields that follow are counted from the last ')'.
func parseStatTimes(stat string, waited bool) (own, children time.Duration, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc stat %q: no command field", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime, stime, cutime and cstime are fields 14 to 17.
	want := 13
	if waited {
		want = 15
	}
	if len(f) < want {
		return 0, 0, fmt.Errorf("/proc stat: %d fields after the command, want at least %d", len(f), want)
	}
	sum := func(fields []string) (time.Duration, error) {
		var ticks uint64
		for _, s := range fields {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc stat: CPU time %q: %w", s, err)
			}
			ticks += n
		}
		return time.Duration(ticks) * time.Second / userHZ, nil
	}
	if own, err = sum(f[11:13]); err != nil || !waited {
		return own, 0, err
	}
	children, err = sum(f[13:15])
	return own, children, err
}

// maxTreeDepth bounds how far down ProcessTreeCPU follows children.
const maxTreeDepth = 8

// ProcessTreeCPU returns a clock of the CPU time of process pid, of its descendants
// alive at each reading (a master process and its workers), and of the descendants
// it has waited for (cutime and cstime in /proc/PID/stat), so that a worker that is
// replaced between two readings still counts. Children are found through
// /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN) or, without it, by scanning
// /proc for their parent ID.
func ProcessTreeCPU(pid int) CPUClock {
	return func() (time.Duration, error) {
		return treeCPU(pid, 0)
	}
}

func treeCPU(pid, depth int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	own, waited, err := parseStatTimes(string(b), true)
	if err != nil {
		return 0, err
	}
	total := own + waited
	if depth >= maxTreeDepth {
		return total, nil
	}
	kids, err := ChildPIDs(pid)
	if err != nil {
		return 0, err
	}
	for _, k := range kids {
		d, err := treeCPU(k, depth+1)
		if errors.Is(err, fs.ErrNotExist) {
			continue // exited since it was listed; its parent will count it once it waits
		}
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// ChildPIDs returns the IDs of the live children of process pid.
func ChildPIDs(pid int) ([]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(fmt.Sprintf("/proc/%d/task/%s", pid, t.Name())); serr == nil {
				return childPIDsByScan(pid) // a kernel without CONFIG_PROC_CHILDREN
			}
			continue // the thread exited
		}
		if err != nil {
			return nil, err
		}
		for _, s := range strings.Fields(string(b)) {
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/task/%s/children: %q: %w", pid, t.Name(), s, err)
			}
			out = append(out, n)
		}
	}
	return out, nil
}

// childPIDsByScan finds the children of pid by reading every /proc/N/stat.
func childPIDsByScan(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		if ppid, err := parseStatPPID(string(b)); err == nil && ppid == pid {
			out = append(out, n)
		}
	}
	return out, nil
}

// parseStatPPID returns field 4 of /proc/PID/stat, the parent's process ID.
func parseStatPPID(stat string) (int, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat %q: no command field", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command, want at least 2", len(f))
	}
	return strconv.Atoi(f[1])
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
