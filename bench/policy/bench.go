package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

type options struct {
	bin, nginx, haproxy string
	phases              []string // of phaseNames

	blSizes    []int
	lookups    int
	updateRuns int
	matches    int

	servers        []string // of serverNames
	duration       time.Duration
	warmup         time.Duration
	conns          int
	rounds         int
	maxOps         int
	opTimeout      time.Duration
	workers        int
	backend        string
	backendWorkers int
	profileDir     string

	quietCores float64
	quietWait  time.Duration
	out, log   io.Writer
}

// Phases, in the order they run.
const (
	phaseBlacklist = "blacklist"
	phaseRoute     = "route"
	phaseProxy     = "proxy"
)

var phaseNames = []string{phaseBlacklist, phaseRoute, phaseProxy}

type bench struct {
	o   *options
	dir string

	bl    *blacklistResults
	route *routeResults
	proxy *proxyResults

	failures []string // what broke; any makes the exit status 1
}

func run(ctx context.Context, o *options) error {
	b := &bench{o: o}
	if b.wants(phaseProxy) && slices.Contains(o.servers, srvL7d) && o.profileDir == "" {
		if _, err := os.Stat(b.bin("l7d")); err != nil {
			return fmt.Errorf("l7d binary: %w (run `make build`, or pass -bin)", err)
		}
	}
	dir, err := os.MkdirTemp("", "tiergate-bench-policy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b.dir = dir
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}

	for _, p := range []struct {
		name string
		run  func(context.Context) error
	}{
		{phaseBlacklist, b.runBlacklist},
		{phaseRoute, b.runRoute},
		{phaseProxy, b.runProxy},
	} {
		if !b.wants(p.name) {
			continue
		}
		if err := p.run(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			b.fail("%s: %v", p.name, err)
		}
		// Each phase leaves its garbage behind: the next starts on a small heap.
		runtime.GC()
		debug.FreeOSMemory()
	}
	b.report()
	if len(b.failures) > 0 {
		return benchkit.ErrFailed
	}
	return nil
}

func (b *bench) wants(phase string) bool { return slices.Contains(b.o.phases, phase) }

func (b *bench) bin(name string) string {
	p, err := filepath.Abs(filepath.Join(b.o.bin, name))
	if err != nil {
		return filepath.Join(b.o.bin, name)
	}
	return p
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.o.log, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (b *bench) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.failures = append(b.failures, msg)
	b.progress("FAILED: %s", msg)
}

// waitQuiet waits, within -quiet-wait, for the processes other than ours to leave
// the machine alone.
func (b *bench) waitQuiet(ctx context.Context, ours ...benchkit.CPUClock) error {
	if b.o.quietWait <= 0 {
		return nil
	}
	others, quiet, err := benchkit.WaitQuiet(ctx, b.o.quietCores, b.o.quietWait, ours...)
	if err != nil {
		return err
	}
	if !quiet {
		b.progress("other processes still use %.2f cores after %v: measuring anyway", others, b.o.quietWait)
	}
	return nil
}

// othersMeter measures what the processes other than ours used over an interval, in
// cores: the machine's busy time less ours.
type othersMeter struct {
	ours    []benchkit.CPUClock
	t0      time.Time
	m0, o0  time.Duration
	readErr error
}

func startOthers(ours ...benchkit.CPUClock) *othersMeter {
	m := &othersMeter{ours: ours}
	m.t0 = time.Now()
	m.m0, m.o0 = m.read()
	return m
}

func (m *othersMeter) read() (machine, own time.Duration) {
	machine, err := benchkit.MachineBusyCPU()
	if err != nil && m.readErr == nil {
		m.readErr = err
	}
	for _, c := range m.ours {
		d, err := c()
		if err != nil && m.readErr == nil {
			m.readErr = err
		}
		own += d
	}
	return machine, own
}

// cores returns the others' use since the start, in cores; 0 if a clock failed.
func (m *othersMeter) cores() float64 {
	m1, o1 := m.read()
	el := time.Since(m.t0).Seconds()
	if m.readErr != nil || el <= 0 {
		return 0
	}
	return max(((m1-m.m0)-(o1-m.o0)).Seconds()/el, 0)
}
