package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// The load generators of the proxy rows: this program's own closed loop over Go's
// crypto/tls, and wrk (Debian package wrk, OpenSSL), which the project did not write.
const (
	genOwn = "bench-policy"
	genWrk = "wrk"
)

var generatorNames = []string{genOwn, genWrk}

// runWrk runs wrk against s: a warm-up run that is not counted, then the measured
// run with the clocks read around it; wrk's own CPU takes clockSelf's place. Every
// wrk connection is one TLS 1.3 handshake (with the default certificate: wrk sends
// the URL's address as SNI) and then keep-alive requests, one in flight each.
func (b *bench) runWrk(ctx context.Context, s *endpoint, clocks []benchkit.CPUClock) (*benchkit.Result, *wrkOutput, error) {
	path, err := exec.LookPath(b.o.wrk)
	if err != nil {
		return nil, nil, fmt.Errorf("wrk not found (Debian package wrk; `make deps` installs it): %w", err)
	}
	args := func(d time.Duration) []string {
		return []string{"-t", strconv.Itoa(b.o.wrkThreads), "-c", strconv.Itoa(b.o.conns), "-d", wrkSeconds(d),
			"--latency", "--timeout", wrkSeconds(b.o.opTimeout),
			"-H", "Host: " + siteName, "-H", "User-Agent: tiergate-bench-policy-wrk", "https://" + s.addr + requestPath}
	}
	run := func(d time.Duration) (string, *exec.Cmd, error) {
		cmd := exec.CommandContext(ctx, path, args(d)...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("wrk %s: %w; output:\n%s", strings.Join(args(d), " "), err, out.String())
		}
		return out.String(), cmd, err
	}
	if b.o.warmup > 0 {
		if _, _, err := run(b.o.warmup); err != nil {
			return nil, nil, err
		}
	}
	res := &benchkit.Result{CPU: make([]time.Duration, len(clocks))}
	before := make([]time.Duration, len(clocks))
	for i, c := range clocks {
		if i == clockSelf {
			continue
		}
		if before[i], err = c(); err != nil && res.CPUErr == nil {
			res.CPUErr = err
		}
	}
	res.Start = time.Now()
	out, cmd, runErr := run(b.o.duration)
	res.Elapsed = time.Since(res.Start)
	for i, c := range clocks {
		if i == clockSelf {
			continue
		}
		after, err := c()
		if err != nil && res.CPUErr == nil {
			res.CPUErr = err
		}
		res.CPU[i] = after - before[i]
	}
	if cmd.ProcessState != nil {
		res.CPU[clockSelf] = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	if runErr != nil {
		return nil, nil, runErr
	}
	w, err := parseWrk(out)
	if err != nil {
		return nil, nil, fmt.Errorf("%w; output:\n%s", err, out)
	}
	// wrk counts every answer, non-2xx and 3xx ones among them; errors are those and
	// its socket errors.
	res.Ops = w.requests - w.non2xx
	res.Errors = w.non2xx + w.socketErrors
	if res.Errors > 0 {
		res.FirstErr = fmt.Errorf("wrk: %d answers other than 2xx or 3xx, %d socket errors", w.non2xx, w.socketErrors)
	}
	// wrk's own figure of the run's length: the rate is its requests over it.
	if w.elapsed > 0 {
		res.Elapsed = w.elapsed
	}
	return res, w, nil
}

// wrkOutput is what parseWrk reads from wrk's report.
type wrkOutput struct {
	requests     int
	elapsed      time.Duration
	non2xx       int
	socketErrors int
	p50, p99     time.Duration
}

var (
	wrkRequestsRE = regexp.MustCompile(`(\d+) requests in ([\d.]+)(us|ms|s|m|h),`)
	wrkNon2xxRE   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkSocketRE   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkPercentRE  = regexp.MustCompile(`(?m)^\s+(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m|h)\s*$`)
)

// parseWrk reads wrk 4's report (run with --latency): the requests and the run's
// length, answers other than 2xx/3xx, socket errors, and the 50th and 99th
// latency percentiles.
func parseWrk(out string) (*wrkOutput, error) {
	m := wrkRequestsRE.FindStringSubmatch(out)
	if m == nil {
		return nil, errors.New("no request count in wrk's output")
	}
	w := &wrkOutput{}
	var err error
	if w.requests, err = strconv.Atoi(m[1]); err != nil {
		return nil, fmt.Errorf("wrk's request count %q: %w", m[1], err)
	}
	if w.elapsed, err = wrkDuration(m[2], m[3]); err != nil {
		return nil, err
	}
	if m := wrkNon2xxRE.FindStringSubmatch(out); m != nil {
		w.non2xx, _ = strconv.Atoi(m[1])
	}
	if m := wrkSocketRE.FindStringSubmatch(out); m != nil {
		for _, f := range m[1:] {
			n, _ := strconv.Atoi(f)
			w.socketErrors += n
		}
	}
	for _, m := range wrkPercentRE.FindAllStringSubmatch(out, -1) {
		d, err := wrkDuration(m[2], m[3])
		if err != nil {
			return nil, err
		}
		if m[1] == "50" {
			w.p50 = d
		} else {
			w.p99 = d
		}
	}
	if w.requests > 0 && (w.p50 == 0 || w.p99 == 0) {
		return nil, errors.New("no latency distribution in wrk's output (run with --latency)")
	}
	return w, nil
}

// wrkSeconds writes d as wrk takes it: whole seconds (rounded up, at least 1).
func wrkSeconds(d time.Duration) string {
	return strconv.Itoa(max(int((d+time.Second-1)/time.Second), 1)) + "s"
}

// wrkDuration reads one of wrk's durations: a number and us, ms, s, m or h.
func wrkDuration(num, unit string) (time.Duration, error) {
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("wrk duration %q%s", num, unit)
	}
	mul := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour}[unit]
	return time.Duration(v * float64(mul)), nil
}
