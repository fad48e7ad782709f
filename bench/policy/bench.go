package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

type options struct {
	bin, nginx, haproxy string
	wrk                 string
	phases              []string // of phaseNames

	blSizes    []int
	lookups    int
	updateRuns int
	// stallRounds is how many times the lookups beside the updates (and the control) are measured.
	stallRounds int
	matches     int

	servers        []string // of serverNames
	generators     []string // of generatorNames
	wrkThreads     int
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
	benchkit.Bench
	o   *options
	dir string

	bl    *blacklistResults
	route *routeResults
	proxy *proxyResults
}

func run(ctx context.Context, o *options) error {
	b := &bench{o: o, Bench: benchkit.Bench{Log: o.log, BinDir: o.bin, QuietCores: o.quietCores, QuietWait: o.quietWait}}
	if b.wants(phaseProxy) && slices.Contains(o.servers, srvL7d) && o.profileDir == "" {
		if _, err := os.Stat(b.Bin("l7d")); err != nil {
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
			b.Fail("%s: %v", p.name, err)
		}
		// Each phase leaves its garbage behind: the next starts on a small heap.
		runtime.GC()
		debug.FreeOSMemory()
	}
	b.report()
	return b.Err()
}

func (b *bench) wants(phase string) bool { return slices.Contains(b.o.phases, phase) }

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
