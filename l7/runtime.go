package l7

import (
	"os"
	"strings"
	"syscall"
)

// SysmonGODEBUG (a GODEBUG setting, without the name) keeps the Go runtime's monitor thread (sysmon) out of its deep
// sleep. sysmon polls every 20 µs, backing off to 10 ms after 1 ms with nothing to
// do; but when every P is idle it sleeps on a note instead, and the next system
// call made wakes it (a futex wake and two context switches) and puts it back to
// 20 µs polling. A TLS terminator goes idle several times per connection at low
// and moderate load (waiting for the client, the keyserver, the request, the close),
// so sysmon was woken and spun up again each time: 50 to 125 µs of CPU per
// connection (perf, one client in sequence and 32 in flight, key offloaded), up to
// a fifth of the process's CPU. Outside its deep sleep, sysmon stays backed off at
// 10 ms while the process has nothing for it (about 100 wake-ups a second,
// whatever the load). The runtime offers no other way to say so than a schedtrace
// period (GODEBUG), whose trace line is printed once that period has passed since
// the machine booted: 2^31-1 ms, so once every 24.8 days at most.
const SysmonGODEBUG = "schedtrace=2147483647"

// ExecWithRuntimeSettings re-executes the running program with GODEBUG carrying
// SysmonGODEBUG, unless GODEBUG already sets schedtrace (an operator's choice, or
// this re-execution) or TIERGATE_RUNTIME_DEFAULTS=1 asks for the runtime's own
// behaviour. It returns only when it does not re-execute or the exec failed; the
// process keeps its PID either way. Call it first thing in main, before any
// goroutine or file of the program's own exists.
func ExecWithRuntimeSettings() {
	env, ok := runtimeEnv(os.Environ())
	if !ok {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, env) // on failure, run as is
}

// runtimeEnv returns env with SysmonGODEBUG added to GODEBUG, and whether it
// should be used.
func runtimeEnv(env []string) ([]string, bool) {
	out := make([]string, 0, len(env)+1)
	found := false
	for _, kv := range env {
		switch {
		case kv == "TIERGATE_RUNTIME_DEFAULTS=1":
			return nil, false
		case strings.HasPrefix(kv, "GODEBUG="):
			v := strings.TrimPrefix(kv, "GODEBUG=")
			for _, s := range strings.Split(v, ",") {
				if strings.HasPrefix(strings.TrimSpace(s), "schedtrace=") {
					return nil, false
				}
			}
			if v != "" {
				v += ","
			}
			kv = "GODEBUG=" + v + SysmonGODEBUG
			found = true
		}
		out = append(out, kv)
	}
	if !found {
		out = append(out, "GODEBUG="+SysmonGODEBUG)
	}
	return out, true
}
