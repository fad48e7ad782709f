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

// statTimes are the CPU times in /proc/PID/stat: the process's own in user and in
// kernel mode (utime, stime), and those of the children it has waited for (cutime,
// cstime).
type statTimes struct {
	utime, stime, cutime, cstime time.Duration
}

// own is the process's own CPU time, user mode only with user.
func (t statTimes) own(user bool) time.Duration {
	if user {
		return t.utime
	}
	return t.utime + t.stime
}

// waited is the CPU time of the children the process waited for, user mode only
// with user.
func (t statTimes) waited(user bool) time.Duration {
	if user {
		return t.cutime
	}
	return t.cutime + t.cstime
}

// parseStat reads the CPU times from the contents of /proc/PID/stat (fields 14 to
// 17). The command name, field 2, is in parentheses and may hold spaces and
// parentheses: the fields that follow are counted from the last ')'.
func parseStat(stat string) (statTimes, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return statTimes{}, fmt.Errorf("/proc stat %q: no command field", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime, stime, cutime and cstime are f[11] to f[14].
	if len(f) < 15 {
		return statTimes{}, fmt.Errorf("/proc stat: %d fields after the command, want at least 15", len(f))
	}
	var d [4]time.Duration
	for k, s := range f[11:15] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return statTimes{}, fmt.Errorf("/proc stat: CPU time %q: %w", s, err)
		}
		d[k] = time.Duration(n) * time.Second / userHZ
	}
	return statTimes{d[0], d[1], d[2], d[3]}, nil
}

func readStat(pid int) (statTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return statTimes{}, err
	}
	return parseStat(string(b))
}

// ProcessCPU returns a clock reading the CPU time of process pid (every thread)
// from /proc/PID/stat, to 1/100 s.
func ProcessCPU(pid int) CPUClock {
	return func() (time.Duration, error) {
		t, err := readStat(pid)
		return t.own(false), err
	}
}

// ProcessUserCPU returns a clock of the user-mode CPU time of process pid (every
// thread) and, with tree, of its descendants as ProcessTreeCPU counts them: the part
// of a server's CPU spent in its own code rather than in the kernel (system calls,
// the TCP stack).
func ProcessUserCPU(pid int, tree bool) CPUClock {
	if !tree {
		return func() (time.Duration, error) {
			t, err := readStat(pid)
			return t.utime, err
		}
	}
	return func() (time.Duration, error) { return treeCPU(pid, 0, true) }
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
		return treeCPU(pid, 0, false)
	}
}

// treeCPU is the CPU time (user mode only with user) of pid, of the children it
// waited for, and of its live descendants.
func treeCPU(pid, depth int, user bool) (time.Duration, error) {
	t, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	total := t.own(user) + t.waited(user)
	if depth >= maxTreeDepth {
		return total, nil
	}
	kids, err := ChildPIDs(pid)
	if err != nil {
		return 0, err
	}
	for _, k := range kids {
		d, err := treeCPU(k, depth+1, user)
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
