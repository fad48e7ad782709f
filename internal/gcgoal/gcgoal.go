// Package gcgoal keeps a server's heap goal in step with its load when the load
// falls. The Go collector sets the next heap goal from the heap it found live, times
// 1 + GOGC/100, and keeps it until the next collection. After a burst of connections
// that goal is the burst's: the live heap of a thousand handshakes, times five at
// l7d's GOGC of 400. When the burst is over, the connections that follow each
// allocate their few tens of KB of handshake garbage into the heap up to that goal,
// page after page the process has never touched or has given back to the system, and
// every such page costs a page fault, its zeroing, and cache and TLB misses on memory
// no CPU has seen. With one client at a time after a 2,000-connection burst, l7d took
// 8 to 12 minor faults per connection, grew from 180 to 270 MB, and spent 1.5 to 1.8
// times the CPU per connection it spends before the burst or after its next
// collection (bench-handshake, openssl s_time after h2load), until that collection
// came, thousands of connections later.
//
// A Governor samples the load (a count that the live heap grows with, such as the
// connections open) and the runtime's collection count, and notes the load as of
// each collection. When the load has since fallen to a fraction of it while the heap
// goal is still far above the heap in use, it starts a collection: the heap found
// live is the present load's, the goal follows it, and the connections go on
// allocating in memory the process has just used.
package gcgoal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/promreg"
)

// Defaults.
const (
	DefaultInterval = 100 * time.Millisecond
	DefaultDrop     = 4
	DefaultMinLoad  = 16
	DefaultMinSlack = 16 << 20
	DefaultMinGap   = time.Second
)

// ErrConfig is the error of a Config that cannot work.
var ErrConfig = errors.New("gcgoal: bad config")

// Config tunes a Governor. Load is required; the zero value of the rest is the
// documented defaults.
type Config struct {
	// Load is the process's load now, in a unit its live heap grows with: for a
	// TLS terminator, its client connections open and in their handshake. It is
	// called once per Interval from the Governor's goroutine.
	Load func() int64
	// Interval is how often the load and the collector are sampled. Default 100ms.
	Interval time.Duration
	// Drop: a collection is started when the load is at most 1/Drop of what it was
	// at the last collection. Default 4.
	Drop int64
	// MinLoad is the least load at the last collection for a fall from it to
	// count: below it, the heap the load holds is small beside the process's own.
	// Default 16.
	MinLoad int64
	// MinSlack is how far, in bytes, the heap goal must be above the heap in use
	// (live and not yet swept objects) for a collection to be started: with less
	// ahead, the next one comes soon anyway. Default 16 MiB.
	MinSlack uint64
	// MinGap is the least time between two collections the Governor starts.
	// Default 1s.
	MinGap time.Duration

	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Reading is one sample of the load and the collector.
type Reading struct {
	Load   int64
	Cycles uint64 // collections completed
	Goal   uint64 // heap goal, bytes
	Heap   uint64 // heap objects, live and not yet swept, bytes
	GOGC   int64  // the collector's target percentage; negative: collection is off
	At     time.Time
}

// Governor starts a collection when the load has fallen far below the load its
// heap goal was set under. Make it with New; Run it in a goroutine of its own.
type Governor struct {
	cfg Config

	cycles   uint64
	atGC     int64 // the load as of the last collection
	prevLoad int64
	last     time.Time // the last collection started
	started  bool      // the first reading has been taken

	forced  prometheus.Counter
	samples [len(sampleNames)]metrics.Sample
	read    func() Reading
	gc      func()
}

// New returns a Governor for cfg, its metric registered with cfg.Registerer if set.
func New(cfg Config) (*Governor, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Drop == 0 {
		cfg.Drop = DefaultDrop
	}
	if cfg.MinLoad == 0 {
		cfg.MinLoad = DefaultMinLoad
	}
	if cfg.MinSlack == 0 {
		cfg.MinSlack = DefaultMinSlack
	}
	if cfg.MinGap == 0 {
		cfg.MinGap = DefaultMinGap
	}
	switch {
	case cfg.Load == nil:
		return nil, fmt.Errorf("%w: no load function", ErrConfig)
	case cfg.Interval < time.Millisecond:
		return nil, fmt.Errorf("%w: interval %v: want at least 1ms", ErrConfig, cfg.Interval)
	case cfg.Drop < 2:
		return nil, fmt.Errorf("%w: drop %d: want at least 2", ErrConfig, cfg.Drop)
	case cfg.MinLoad < 1 || cfg.MinGap < 0:
		return nil, fmt.Errorf("%w: min load %d, min gap %v: want positive figures", ErrConfig, cfg.MinLoad, cfg.MinGap)
	}
	g := &Governor{cfg: cfg, gc: collectTwice}
	for i, n := range sampleNames {
		g.samples[i].Name = n
	}
	g.read = g.readRuntime
	g.forced = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tiergate_runtime_gc_load_fell_total",
		Help: "Garbage collections started because the load had fallen far below the load as of the last collection, whose heap goal was the process's (internal/gcgoal).",
	})
	if cfg.Registerer != nil {
		var err error
		if g.forced, err = promreg.Register(cfg.Registerer, g.forced); err != nil {
			return nil, fmt.Errorf("gcgoal: registering metrics: %w", err)
		}
	}
	return g, nil
}

// Run samples every Interval until ctx ends, starting collections as Next says.
func (g *Governor) Run(ctx context.Context) {
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	g.Next(g.read())
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r := g.read()
			if !g.Next(r) {
				continue
			}
			g.gc()
			g.forced.Inc()
			after := g.read()
			g.Collected(after)
			if g.cfg.Logger != nil {
				g.cfg.Logger.Debug("collection after the load fell", "load", r.Load,
					"goal_before", r.Goal, "goal_after", after.Goal, "heap_before", r.Heap, "heap_after", after.Heap)
			}
		}
	}
}

// Next takes a reading and reports whether to start a collection now. One
// goroutine calls it, once per interval: Run, or a test in its place. A caller
// that starts the collection calls Collected with a reading taken after it.
func (g *Governor) Next(r Reading) bool {
	if !g.started || r.Cycles != g.cycles {
		// A collection ended since the last reading, at a load between that
		// reading's and this one's: the higher is the one its live heap may hold.
		// (Before the first reading, prevLoad is 0: the load as of the first.)
		g.cycles, g.atGC = r.Cycles, max(r.Load, g.prevLoad)
		g.started = true
	}
	g.prevLoad = r.Load
	switch {
	case r.GOGC < 0: // collection is off: not the Governor's to start
		return false
	case g.atGC < g.cfg.MinLoad || r.Load > g.atGC/g.cfg.Drop:
		return false
	case r.Goal < r.Heap || r.Goal-r.Heap < g.cfg.MinSlack:
		return false
	case !g.last.IsZero() && r.At.Sub(g.last) < g.cfg.MinGap:
		return false
	}
	g.last = r.At
	return true
}

// Collected records a collection the caller started on Next's word, with a reading
// taken after it: the load as of that collection is the present one.
func (g *Governor) Collected(r Reading) {
	g.cycles, g.atGC, g.prevLoad = r.Cycles, r.Load, r.Load
}

// collectTwice runs two collections back to back. What the load put in sync.Pools
// (fasthttp's per-connection read buffers, of max_header_bytes each: 126 of the 141
// MB l7d held after a 2,000-connection burst) survives one collection in the pools'
// victim caches, and with it the goal set on it; the second frees it.
func collectTwice() {
	runtime.GC()
	runtime.GC()
}

// The runtime's metrics a reading takes.
var sampleNames = [...]string{
	"/gc/cycles/total:gc-cycles",
	"/gc/heap/goal:bytes",
	"/memory/classes/heap/objects:bytes",
	"/gc/gogc:percent",
}

func (g *Governor) readRuntime() Reading {
	s := &g.samples
	metrics.Read(s[:])
	r := Reading{Load: g.cfg.Load(), At: time.Now(), GOGC: 100}
	if s[0].Value.Kind() == metrics.KindUint64 {
		r.Cycles = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		r.Goal = s[1].Value.Uint64()
	}
	if s[2].Value.Kind() == metrics.KindUint64 {
		r.Heap = s[2].Value.Uint64()
	}
	if s[3].Value.Kind() == metrics.KindUint64 {
		r.GOGC = int64(s[3].Value.Uint64())
	}
	return r
}
