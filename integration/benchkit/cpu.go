package benchkit

import (
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
