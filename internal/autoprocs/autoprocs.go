// Package autoprocs sizes GOMAXPROCS to the load of a server process. Every idle P
// costs the Go scheduler work: a goroutine made runnable while a P is idle wakes a
// thread (futex) to run it, the thread spins looking for more, steals, and parks again,
// and sysmon keeps polling; at moderate load this costs a proxy more CPU per request
// than its own code does. A Controller keeps as few Ps as the load needs, adding Ps
// as soon as those in use are busy or goroutines wait to run, and removing one only
// after the load has fit in one fewer for a while.
//
// The signals are the process's CPU time (getrusage: user + system, all threads) and
// the scheduler's own distribution of the time runnable goroutines waited for a P
// (runtime/metrics /sched/latencies:seconds), both read once per interval.
package autoprocs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/promreg"
)

// Config tunes a Controller. The zero value is the documented defaults.
type Config struct {
	// Min is the fewest Ps kept. Default 1.
	Min int
	// Max is the most Ps used. Default: GOMAXPROCS when the Controller is made, which
	// the runtime sets from the CPUs the process may use (affinity and cgroup limit).
	Max int
	// Interval is how often the load is sampled. Default 100ms.
	Interval time.Duration
	// UpBusy: when the process used more than UpBusy CPUs per P in an interval, and
	// the machine had at least UpIdle CPUs idle, the Ps in use are saturated and their
	// number is doubled (up to Max). With the CPUs full, more Ps find no CPU to run
	// on: they take turns with the threads already running, and the scheduler's
	// wakeups and spinning cost more than they gain (bench-policy, wrk beside l7d and
	// its backend: one P served 10-25 % more requests a second than two, at 10-20 %
	// less CPU each). Default 0.95:
	// a server whose CPU is mostly the kernel's (a proxy's system calls) uses its P
	// nearly all the time before its goroutines wait, and a second P for a load one
	// serves costs the scheduler more than the requests gain (bench-policy: one P
	// at 0.77-0.91 CPUs served a proxied load at the rate and latency of two, for
	// 12-18 % less CPU per request).
	UpBusy float64
	// UpWait: when the 99th percentile of the time runnable goroutines waited for a P
	// exceeded UpWait in two intervals in a row on as many Ps (with at least MinWaits
	// waits seen in each), the Ps were busy (WaitBusy), and the machine had at least
	// UpIdle CPUs idle, one P is added; in one interval, when the percentile exceeded
	// four times UpWait. A burst of new connections lasts about an interval and
	// leaves moderate waits behind: bench-policy's 32 connections, their handshakes
	// in a row's first 100 ms, left waits of 1-2 ms with half a CPU idle, and the P
	// they added for a trial and a back trial (4 s) cost the row 38.0 µs a request
	// at 1.32 Ps on average, where a row that stayed on one P cost 33.9. Default 1ms.
	UpWait time.Duration
	// WaitBusy is the CPUs per P the process must have used in an interval for its
	// waits to count, towards adding a P or against removing one. Goroutines that
	// waited while the Ps were mostly idle waited for the thread holding their P to
	// get a CPU back from another process (a key server's signature, a load
	// generator), which one more P does not give: at one connection at a time, l7d
	// went to two Ps on such waits at 0.3 CPU and spent 40-80 % more CPU per
	// connection there (bench-handshake's sequential rows), at no gain in latency.
	// Default 0.5.
	WaitBusy float64
	// UpIdle is the idle CPUs (all processes, /proc/stat) an interval needs for its
	// load or its waits to add Ps: with the CPUs full, goroutines wait because the
	// threads running them wait for a CPU, and more Ps would only add to that.
	// Default 0.5.
	UpIdle float64
	// MinWaits is the fewest waits an interval needs for its percentile to count.
	// Default 50.
	MinWaits uint64
	// DownBusy: when, over DownAfter intervals in a row in which no goroutines waited
	// over UpWait/4 with UpIdle CPUs idle, the mean load would have kept one P fewer
	// under DownBusy CPUs per P, one P is removed. When most of those intervals had
	// fewer than UpIdle CPUs idle, under UpBusy is enough: no P is added back while
	// the CPUs are full, so the margin against flapping is not needed, and a P the
	// load does not fill costs wakeups. Default 0.8.
	DownBusy float64
	// DownAfter is how many intervals in a row a removal looks at. Default 20 (two
	// seconds at the default interval). When a removed P has to be added back within
	// that many intervals, the next removal waits twice as long, up to 30 times
	// DownAfter; a removal that holds that long puts it back to DownAfter.
	DownAfter int
	// TrialGain: the Ps added are a trial for the DownAfter intervals that follow.
	// When the process's mean load in them stayed busy (at least DownBusy CPUs per
	// P it had before) but grew by less than TrialGain CPUs per P added, the Ps
	// found no CPU to run on (the others on the machine took what looked idle) and
	// are removed at once; the next trial waits DownAfter intervals, twice as long
	// after each trial in a row that failed, up to 30 times DownAfter. In
	// bench-policy's proxy rows, with its own load generator beside l7d and the
	// backend on two CPUs, a second P added in a moment of idle CPUs kept l7d at
	// 0.96 CPU for the same requests a second, at 40.6 µs of CPU per request
	// against 36.4 on one. Default 0.25.
	TrialGain float64
	// Work, when set, counts the work the process has done since it started (l7d:
	// requests answered and TLS handshakes completed). The trial of the Ps added
	// then asks whether they did more work rather than whether they used more CPU:
	// when the work done per second over the trial grew by less than TrialWork
	// (a fraction) over the rate the Ps before served (that of the interval that
	// added them, or the mean of the last DownAfter intervals on as many Ps when it
	// is higher), the Ps are removed at once, with the same wait before the next
	// trial. A P can find CPU
	// time and still serve nothing more, when the CPU it takes is that of the
	// processes that send the requests or answer them; the CPU criterion keeps
	// it. A P kept (bench-policy, its own generator, l7d and the backend on two
	// CPUs): added at 0.81 CPU and 16,700 requests a second, it served 20,600 a
	// second on two at 1.05 CPU. An interval that added Ps with no work done, or
	// with the Ps it had less than DownBusy busy, in it and over the last
	// DownAfter intervals (a load starting up: bench-policy's wrk added a P in its
	// first interval, at 1,800 requests a second of the 12,000 it then ran at),
	// falls back to the CPU criterion.
	Work func() uint64
	// TrialWork is the gain in work done per second that keeps the Ps a trial
	// added, when Work is set. Default 0.1.
	TrialWork float64
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger logs each change at debug level; nil logs nothing.
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultInterval  = 100 * time.Millisecond
	DefaultUpBusy    = 0.95
	DefaultUpWait    = time.Millisecond
	DefaultWaitBusy  = 0.5
	DefaultUpIdle    = 0.5
	DefaultMinWaits  = 50
	DefaultDownBusy  = 0.8
	DefaultDownAfter = 20
	DefaultTrialGain = 0.25
	DefaultTrialWork = 0.1
)

// ErrConfig is wrapped by every error New returns for a bad Config.
var ErrConfig = errors.New("autoprocs: bad config")

// Sample is the load seen over one interval.
type Sample struct {
	// Busy is the CPUs the process used: CPU time over wall time.
	Busy float64
	// Idle is the machine's idle CPUs: its idle time over wall time; NaN if unknown.
	Idle float64
	// WaitP99 is the 99th percentile of the time runnable goroutines waited for a P
	// (an upper bucket bound).
	WaitP99 time.Duration
	// Waits is how many waits the percentile is over.
	Waits uint64
	// Work is the work done per second (Config.Work); 0 when there is no Work.
	Work float64
}

// Controller resizes GOMAXPROCS; see the package comment.
type Controller struct {
	cfg   Config
	quiet int // intervals in a row without waits (the down window)
	// The window's load: the sum of its Busy, and its intervals with the CPUs full.
	quietBusy, quietWork float64
	quietFull            int
	hold                 int // quiet intervals a removal needs: DownAfter, doubled by each flap
	since                int // intervals since the last removal; -1 when none is recent

	// The trial of the last Ps added (trialFrom 0: none): the Ps before, the load
	// that added them, and the load seen since.
	trialFrom, trialTo, trialN int
	trialBase, trialSum        float64
	trialBaseWork, trialWork   float64 // the work rate that added them, and the sum since
	trialBaseBusy              float64 // the load that added them, over recent too (with Work)
	// The back trial of Ps kept for their CPU alone (backFrom 0: none): the Ps to
	// return to, the Ps tried, the intervals and work seen, and the work rate on
	// backFrom Ps. noTrial: the Ps Next adds are a back trial's return.
	backFrom, backTo, backN int
	backWork, backBase      float64
	noTrial                 bool
	noBackUntil             int // no back trial of a full window before this tick
	backBackoff             int // intervals the next failed back trial holds them off
	// The samples of the last DownAfter intervals on recentN Ps, the latest last.
	recent    []Sample
	recentN   int
	tick      int // intervals seen
	noUpUntil int // no P is added before this tick: a trial failed
	backoff   int // intervals the next failed trial holds additions off
	// The last interval whose waits would add a P (UpWait), and its Ps.
	waitTick, waitN int

	procs    prometheus.Gauge
	pSeconds prometheus.Counter
	changes  *prometheus.CounterVec
	busy     prometheus.Gauge
	wait     prometheus.Gauge

	// set and read are runtime.GOMAXPROCS and readLoad outside tests.
	set  func(int) int
	read func() reading
}

// reading is the process's cumulative load at one time.
type reading struct {
	at    time.Time
	cpu   time.Duration             // user + system CPU time of all threads
	work  uint64                    // Config.Work's count; 0 without one
	idle  time.Duration             // the machine's idle time, all CPUs; -1 if unknown
	waits *metrics.Float64Histogram // runnable goroutines' waits for a P; nil if unknown
}

// New validates cfg, fills its defaults and returns a Controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Min == 0 {
		cfg.Min = 1
	}
	if cfg.Max == 0 {
		cfg.Max = runtime.GOMAXPROCS(0)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.UpBusy == 0 {
		cfg.UpBusy = DefaultUpBusy
	}
	if cfg.UpWait == 0 {
		cfg.UpWait = DefaultUpWait
	}
	if cfg.UpIdle == 0 {
		cfg.UpIdle = DefaultUpIdle
	}
	if cfg.WaitBusy == 0 {
		cfg.WaitBusy = DefaultWaitBusy
	}
	if cfg.MinWaits == 0 {
		cfg.MinWaits = DefaultMinWaits
	}
	if cfg.DownBusy == 0 {
		cfg.DownBusy = DefaultDownBusy
	}
	if cfg.DownAfter == 0 {
		cfg.DownAfter = DefaultDownAfter
	}
	if cfg.TrialGain == 0 {
		cfg.TrialGain = DefaultTrialGain
	}
	if cfg.TrialWork == 0 {
		cfg.TrialWork = DefaultTrialWork
	}
	switch {
	case cfg.Min < 1 || cfg.Max < cfg.Min:
		return nil, fmt.Errorf("%w: min %d, max %d: want 1 ≤ min ≤ max", ErrConfig, cfg.Min, cfg.Max)
	case cfg.Interval < time.Millisecond:
		return nil, fmt.Errorf("%w: interval %v: want at least 1ms", ErrConfig, cfg.Interval)
	case !(cfg.DownBusy > 0 && cfg.DownBusy < cfg.UpBusy && cfg.UpBusy <= 1):
		return nil, fmt.Errorf("%w: down busy %v, up busy %v: want 0 < down < up ≤ 1", ErrConfig, cfg.DownBusy, cfg.UpBusy)
	case cfg.UpWait <= 0 || cfg.DownAfter < 1 || cfg.UpIdle < 0 || !(cfg.WaitBusy > 0) || !(cfg.TrialGain > 0) || !(cfg.TrialWork > 0):
		return nil, fmt.Errorf("%w: up wait %v, up idle %v, wait busy %v, down after %d, trial gain %v, trial work %v: want positive figures", ErrConfig, cfg.UpWait, cfg.UpIdle, cfg.WaitBusy, cfg.DownAfter, cfg.TrialGain, cfg.TrialWork)
	}
	c := &Controller{cfg: cfg, hold: cfg.DownAfter, since: -1, backoff: cfg.DownAfter, backBackoff: cfg.DownAfter, set: runtime.GOMAXPROCS}
	c.read = func() reading { return readLoad(cfg.Work) }
	c.procs = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tiergate_runtime_gomaxprocs",
		Help: "Ps the Go scheduler runs goroutines on (GOMAXPROCS), as sized to the load.",
	})
	c.pSeconds = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tiergate_runtime_gomaxprocs_seconds_total",
		Help: "Ps in use times the seconds they were in use, counted at each sampling interval: its rate is the mean GOMAXPROCS over a window.",
	})
	c.changes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tiergate_runtime_gomaxprocs_changes_total",
		Help: "Changes of GOMAXPROCS, by direction (up, down).",
	}, []string{"direction"})
	c.busy = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tiergate_runtime_busy_cpus",
		Help: "CPUs the process used (user + system) over the last sampling interval of the GOMAXPROCS sizing.",
	})
	c.wait = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tiergate_runtime_sched_wait_p99_seconds",
		Help: "99th percentile of the time runnable goroutines waited for a P over the last sampling interval.",
	})
	if cfg.Registerer == nil {
		return c, nil
	}
	var err error
	if c.procs, err = promreg.Register(cfg.Registerer, c.procs); err != nil {
		return nil, fmt.Errorf("autoprocs: registering metrics: %w", err)
	}
	if c.pSeconds, err = promreg.Register(cfg.Registerer, c.pSeconds); err != nil {
		return nil, fmt.Errorf("autoprocs: registering metrics: %w", err)
	}
	if c.changes, err = promreg.Register(cfg.Registerer, c.changes); err != nil {
		return nil, fmt.Errorf("autoprocs: registering metrics: %w", err)
	}
	if c.busy, err = promreg.Register(cfg.Registerer, c.busy); err != nil {
		return nil, fmt.Errorf("autoprocs: registering metrics: %w", err)
	}
	if c.wait, err = promreg.Register(cfg.Registerer, c.wait); err != nil {
		return nil, fmt.Errorf("autoprocs: registering metrics: %w", err)
	}
	return c, nil
}

// Run sizes GOMAXPROCS until ctx ends, then puts back Max. It starts from Min.
func (c *Controller) Run(ctx context.Context) {
	n := c.cfg.Min
	c.set(n)
	c.procs.Set(float64(n))
	defer func() {
		c.set(c.cfg.Max)
		c.procs.Set(float64(c.cfg.Max))
	}()
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	last := c.read()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r := c.read()
			s := makeSample(last, r)
			if d := r.at.Sub(last.at); d > 0 {
				c.pSeconds.Add(float64(n) * d.Seconds())
			}
			last = r
			c.busy.Set(s.Busy)
			c.wait.Set(s.WaitP99.Seconds())
			if next := c.Next(n, s); next != n {
				c.set(next)
				c.procs.Set(float64(next))
				dir := "up"
				if next < n {
					dir = "down"
				}
				c.changes.WithLabelValues(dir).Inc()
				if c.cfg.Logger != nil {
					c.cfg.Logger.Debug("gomaxprocs", "from", n, "to", next, "busy_cpus", s.Busy, "idle_cpus", s.Idle,
						"wait_p99", s.WaitP99, "waits", s.Waits, "work_per_s", s.Work)
				}
				n = next
			}
		}
	}
}

// Next is the number of Ps to run after an interval with load s on n Ps. It counts
// the quiet intervals and flaps that the next decisions depend on, so one goroutine
// calls it, once per interval: Run, or a test in its place.
func (c *Controller) Next(n int, s Sample) int {
	if n != c.recentN {
		c.recent, c.recentN = c.recent[:0], n
	}
	if len(c.recent) == c.cfg.DownAfter {
		c.recent = append(c.recent[:0], c.recent[1:]...)
	}
	c.recent = append(c.recent, s)
	c.noTrial = false
	next := c.next(n, s)
	if next > n && !c.noTrial {
		c.trialFrom, c.trialTo, c.trialN, c.trialBase, c.trialSum = n, next, 0, s.Busy, 0
		c.trialBaseWork, c.trialWork = s.Work, 0
		c.trialBaseBusy = s.Busy
		if c.cfg.Work != nil {
			// The interval that adds Ps is picked for looking strained, and is often
			// one in which the process got less CPU than usual: its work rate
			// understates what the Ps served before it. The Ps added must beat the
			// mean rate of the intervals on n Ps before it as well (bench-policy, wrk:
			// a P added on an interval of 0.66 CPU and 21,600 requests a second, after
			// two seconds at 0.9 and 29,000, was kept for serving 29,300 on two).
			var busy, work float64
			for _, r := range c.recent {
				busy += r.Busy
				work += r.Work
			}
			c.trialBaseBusy = max(s.Busy, busy/float64(len(c.recent)))
			c.trialBaseWork = max(s.Work, work/float64(len(c.recent)))
		}
	} else if next < n {
		c.trialFrom = 0
	}
	return next
}

// trial judges the Ps last added once their trial is over: it reports whether to
// go back to the count before them.
func (c *Controller) trial(n int, s Sample) (from int, undo bool) {
	if c.trialFrom == 0 {
		return 0, false
	}
	if n != c.trialTo {
		c.trialFrom = 0 // set elsewhere: not this trial's
		return 0, false
	}
	c.trialN++
	c.trialSum += s.Busy
	c.trialWork += s.Work
	if c.trialN < c.cfg.DownAfter {
		return 0, false
	}
	from = c.trialFrom
	c.trialFrom = 0
	mean, work := c.trialSum/float64(c.trialN), c.trialWork/float64(c.trialN)
	if mean < c.cfg.DownBusy*float64(from) {
		return 0, false // the load fell: the removal rules decide
	}
	failed := mean-c.trialBase < c.cfg.TrialGain*float64(n-from)
	// The work rate the Ps before served is what the Ps added must beat only when
	// the Ps before were busy: a load starting up adds Ps in its first interval,
	// at a fraction of its rate (and mostly handshakes, each worth a request here).
	byWork := c.cfg.Work != nil && c.trialBaseWork > 0 && c.trialBaseBusy >= c.cfg.DownBusy*float64(from)
	if byWork {
		failed = work < (1+c.cfg.TrialWork)*c.trialBaseWork
	}
	if c.cfg.Logger != nil {
		c.cfg.Logger.Debug("gomaxprocs trial", "from", from, "to", n, "kept", !failed,
			"busy_cpus_before", c.trialBase, "busy_cpus_recent", c.trialBaseBusy, "busy_cpus", mean,
			"work_per_s_before", c.trialBaseWork, "work_per_s", work)
	}
	if failed {
		c.noUpUntil = c.tick + c.backoff + 1
		c.backoff = min(2*c.backoff, 30*c.cfg.DownAfter)
		return from, true
	}
	if c.cfg.Work != nil && !byWork && work > 0 {
		// Kept for the CPU they found, with no rate of the Ps before to judge them
		// by (a load starting up): the Ps before are tried again on the load now
		// running, and the Ps added come back only if the work done falls without
		// them (backTrial). At more Ps a proxy's CPU per request grows with the
		// scheduler's wakeups, which keeps its load over the removal threshold: in
		// bench-policy, l7d kept on two Ps from a row's start used 0.95 CPU and
		// 39-40 µs a request where one P served more at 0.85 and 33.
		c.startBack(n, from, work)
		return from, true
	}
	c.backoff = c.cfg.DownAfter
	return 0, false
}

// startBack starts a back trial of to Ps, from n Ps that did work a second.
func (c *Controller) startBack(n, to int, work float64) {
	c.backFrom, c.backTo, c.backN, c.backWork, c.backBase = n, to, 0, 0, work
	if c.cfg.Logger != nil {
		c.cfg.Logger.Debug("gomaxprocs trial back", "from", n, "to", to, "work_per_s", work)
	}
}

// backTrial judges the Ps a trial kept for their CPU alone, once the Ps before them
// have run the load for DownAfter intervals (see trial). room and waited are the
// interval's pressure. It returns the Ps to run, and whether that decides the
// interval: while the back trial runs, and when it ends going back up, no other
// rule runs. It ends at once, going back up, when the Ps are saturated, or
// goroutines wait long for one, while CPUs are idle.
func (c *Controller) backTrial(n int, s Sample, room, waited bool) (next int, decided bool) {
	if c.backFrom == 0 {
		return n, false
	}
	if n != c.backTo {
		c.backFrom = 0 // set elsewhere: not this trial's
		return n, false
	}
	cfg := &c.cfg
	up, work := c.backFrom, 0.0
	// Saturated, or long waits (longWaits), with CPUs idle: a dip of the CPU the
	// process got (waits of 1-2 ms at 0.66 CPU) does not count.
	starved := room && (s.Busy > cfg.UpBusy*float64(n) || waited && s.WaitP99 > longWaits*cfg.UpWait)
	if !starved {
		c.backN++
		c.backWork += s.Work
		if c.backN < cfg.DownAfter {
			return n, true
		}
		work = c.backWork / float64(c.backN)
	}
	c.backFrom = 0
	kept := !starved && work >= (1-cfg.TrialWork)*c.backBase
	if cfg.Logger != nil {
		cfg.Logger.Debug("gomaxprocs trial back over", "ps", n, "kept", kept, "starved", starved,
			"work_per_s_more_ps", c.backBase, "work_per_s", work)
	}
	if kept {
		// The Ps added served nothing the Ps before do not: as a failed trial.
		c.noUpUntil = c.tick + c.backoff + 1
		c.backoff = min(2*c.backoff, 30*cfg.DownAfter)
		c.backBackoff = cfg.DownAfter
		return n, false
	}
	c.backoff = cfg.DownAfter
	// The Ps are needed: the next back trial waits, twice as long after each
	// that failed, up to 30 times DownAfter.
	c.noBackUntil = c.tick + c.backBackoff + 1
	c.backBackoff = min(2*c.backBackoff, 30*cfg.DownAfter)
	return up, true
}

func (c *Controller) next(n int, s Sample) int {
	cfg := &c.cfg
	maxHold := 30 * cfg.DownAfter
	c.tick++
	if c.since >= 0 {
		c.since++
		if c.since >= maxHold {
			c.since, c.hold = -1, cfg.DownAfter
		}
	}
	room, waited := c.pressure(n, s)
	// Waits add a P when they last: over UpWait two intervals in a row on n Ps, or
	// long (longWaits) in one.
	waitUp := waited && s.WaitP99 > cfg.UpWait
	waitsLast := waitUp && (s.WaitP99 > longWaits*cfg.UpWait || c.waitTick == c.tick-1 && c.waitN == n)
	if waitUp {
		c.waitTick, c.waitN = c.tick, n
	}
	if next, decided := c.backTrial(n, s, room, waited); decided {
		c.resetQuiet()
		c.noTrial = next > n
		return next
	}
	if from, undo := c.trial(n, s); undo {
		c.resetQuiet()
		return from
	}
	// After a failed trial, no P is added for a while: the CPUs that looked idle
	// were not the process's to take.
	mayAdd := c.tick >= c.noUpUntil
	up := 0
	switch {
	case s.Busy > cfg.UpBusy*float64(n) && room && mayAdd:
		up = min(2*n, cfg.Max)
	case waitsLast && mayAdd:
		up = min(n+1, cfg.Max)
	case n > cfg.Min && !(waited && s.WaitP99 > cfg.UpWait/4):
		// A window of hold intervals without waits decides on its mean load: one
		// interval's CPU time swings by a tenth of a CPU and more (the threads'
		// turns on the CPUs), so a load near the threshold is rarely under it many
		// intervals in a row.
		c.quiet++
		c.quietBusy += s.Busy
		c.quietWork += s.Work
		if !room {
			c.quietFull++
		}
		if c.quiet < c.hold {
			return n
		}
		downBusy := cfg.DownBusy
		if 2*c.quietFull > c.quiet {
			// The CPUs were full: no P comes back while they are (the rules above
			// need room), so the load has only to fit in one fewer below UpBusy.
			downBusy = cfg.UpBusy
		}
		fits := c.quietBusy/float64(c.quiet) < downBusy*float64(n-1)
		full, work := 2*c.quietFull > c.quiet, c.quietWork/float64(c.quiet)
		c.resetQuiet()
		if fits {
			c.since = 0
			return n - 1
		}
		if full && cfg.Work != nil && work > 0 && c.tick >= c.noBackUntil {
			// The CPUs are full, so more Ps find none to run on, but the load does
			// not fit in fewer by its CPU: at more Ps, a proxy's CPU per request
			// grows with the scheduler's wakeups, which keeps its load over the
			// threshold (bench-policy: l7d on two Ps at 0.95-0.97 CPU and 35-41 µs
			// a request, where one P served as many at 0.85 and 29-33). One P fewer
			// is tried on the work it does.
			c.startBack(n, n-1, work)
			return n - 1
		}
		return n
	default:
		c.resetQuiet()
		return n
	}
	c.resetQuiet()
	if up > n && c.since >= 0 && c.since < c.hold {
		c.hold = min(2*c.hold, maxHold) // the last removal did not hold: wait longer
	}
	return up
}

// pressure reports whether the machine had CPUs to run more Ps on in an interval
// (room), and whether its waits for a P count (waited: enough of them, with room,
// on Ps busy enough). Busy Ps, or goroutines waiting for one, tell of too few Ps
// only when there are CPUs to run more on; with the CPUs full, they wait for a
// CPU. Waits count only when the Ps were busy: on idle Ps, they were waits for a
// CPU as well.
func (c *Controller) pressure(n int, s Sample) (room, waited bool) {
	cfg := &c.cfg
	room = !(s.Idle < cfg.UpIdle)
	waited = s.Waits >= cfg.MinWaits && room && s.Busy >= cfg.WaitBusy*float64(n)
	return room, waited
}

// longWaits: waits over longWaits × UpWait in one interval are not waited out for
// a second: they add a P at once, and end a back trial going back up.
const longWaits = 4

// resetQuiet starts a new down window.
func (c *Controller) resetQuiet() { c.quiet, c.quietBusy, c.quietWork, c.quietFull = 0, 0, 0, 0 }

// waitMetric is the scheduler's distribution of runnable goroutines' waits for a P.
const waitMetric = "/sched/latencies:seconds"

// readLoad reads the process's CPU time, the scheduler's wait distribution, and
// work's count if work is not nil.
func readLoad(work func() uint64) reading {
	r := reading{at: time.Now(), idle: machineIdle()}
	if work != nil {
		r.work = work()
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		r.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s := []metrics.Sample{{Name: waitMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindFloat64Histogram {
		r.waits = s[0].Value.Float64Histogram()
	}
	return r
}

// makeSample is the load between two readings: the CPUs the process used and the
// machine left idle, and the waits between the two reads of the cumulative wait
// distribution.
func makeSample(prev, last reading) Sample {
	s := Sample{Idle: math.NaN()}
	if wall := last.at.Sub(prev.at); wall > 0 {
		s.Busy = (last.cpu - prev.cpu).Seconds() / wall.Seconds()
		if last.work >= prev.work {
			s.Work = float64(last.work-prev.work) / wall.Seconds()
		}
		if prev.idle >= 0 && last.idle >= 0 {
			s.Idle = (last.idle - prev.idle).Seconds() / wall.Seconds()
		}
	}
	cur := last.waits
	if cur == nil {
		return s
	}
	var total uint64
	for i, c := range cur.Counts {
		total += c - prevCount(prev.waits, i)
	}
	s.Waits = total
	if total == 0 {
		return s
	}
	rank := uint64(math.Ceil(0.99 * float64(total)))
	var seen uint64
	for i, c := range cur.Counts {
		seen += c - prevCount(prev.waits, i)
		if seen >= rank {
			hi := cur.Buckets[i+1]
			if math.IsInf(hi, 1) {
				hi = cur.Buckets[i]
			}
			s.WaitP99 = time.Duration(hi * float64(time.Second))
			break
		}
	}
	return s
}

func prevCount(h *metrics.Float64Histogram, i int) uint64 {
	if h == nil || i >= len(h.Counts) {
		return 0
	}
	return h.Counts[i]
}

// procStat is /proc/stat, opened once and read from its start at each sample.
// Opening it at each sample (os.Open, which also adds the file to the runtime's
// poller and takes it out again) made eight system calls where one does, and was
// a third of an idle l7d's CPU (perf: 8.8 ms a second, with sysmon's 10 ms wakeups
// the rest).
var procStat struct {
	once sync.Once
	fd   int // -1 when it could not be opened
}

// machineIdle is the machine's idle time (idle and iowait, all CPUs) from /proc/stat,
// or -1.
func machineIdle() time.Duration {
	procStat.once.Do(func() {
		fd, err := syscall.Open("/proc/stat", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			fd = -1
		}
		procStat.fd = fd
	})
	if procStat.fd < 0 {
		return -1
	}
	var buf [256]byte
	for {
		n, err := syscall.Pread(procStat.fd, buf[:], 0)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil || n <= 0:
			return -1
		}
		return parseStatIdle(buf[:n])
	}
}

// parseStatIdle reads the idle and iowait fields of /proc/stat's first line, in
// USER_HZ (1/100 s) ticks; -1 if they are not there.
func parseStatIdle(b []byte) time.Duration {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 6 || string(f[0]) != "cpu" {
		return -1
	}
	const tick = time.Second / 100
	const maxTicks = uint64(math.MaxInt64 / tick)
	var ticks uint64
	for _, v := range f[4:6] {
		t, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil || t > maxTicks-ticks {
			return -1 // not a number, or more than a Duration holds
		}
		ticks += t
	}
	return time.Duration(ticks) * tick
}
