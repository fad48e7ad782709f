package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// userCPU returns a clock of the user-mode CPU time of process pid (every thread)
// and, with tree, of its descendants, live or waited for: the part of a server's CPU
// spent in its own code rather than in the kernel (system calls, the TCP stack). It
// reads /proc/PID/stat, to 1/100 s.
func userCPU(pid int, tree bool) benchkit.CPUClock {
	return func() (time.Duration, error) { return userTree(pid, tree, 0) }
}

// maxUserDepth bounds how far down userCPU follows children.
const maxUserDepth = 8

func userTree(pid int, tree bool, depth int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	own, waited, err := parseStatUser(string(b))
	if err != nil || !tree {
		return own, err
	}
	total := own + waited
	if depth >= maxUserDepth {
		return total, nil
	}
	kids, err := benchkit.ChildPIDs(pid)
	if err != nil {
		return 0, err
	}
	for _, k := range kids {
		d, err := userTree(k, true, depth+1)
		if errors.Is(err, fs.ErrNotExist) {
			continue // exited since it was listed; its parent counts it once it waits
		}
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// userHZ is the unit of the times in /proc/PID/stat.
const userHZ = 100

// parseStatUser returns utime and cutime (field 14, and field 16: the user time of
// the children the process waited for) from the contents of /proc/PID/stat. The
// command name, field 2, may hold spaces and parentheses: the fields that follow are
// counted from the last ')'.
func parseStatUser(stat string) (own, waited time.Duration, err error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc stat %q: no command field", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state): utime is f[11], cutime f[13].
	if len(f) < 14 {
		return 0, 0, fmt.Errorf("/proc stat: %d fields after the command, want at least 14", len(f))
	}
	ticks := func(s string) (time.Duration, error) {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat: CPU time %q: %w", s, err)
		}
		return time.Duration(n) * time.Second / userHZ, nil
	}
	if own, err = ticks(f[11]); err != nil {
		return 0, 0, err
	}
	waited, err = ticks(f[13])
	return own, waited, err
}
