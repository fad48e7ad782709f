package blacklist

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a List. The zero value means no metrics and the wall clock.
type Options struct {
	// Registerer receives the tiergate_blacklist_* metrics. Lists sharing a
	// Registerer share the metric families, told apart by the listener label.
	// Nil means none.
	Registerer prometheus.Registerer
	// Now is the clock that expiry is judged by and that ttl= is counted from.
	// Nil means time.Now. A lookup reads it only when an expiring entry matches.
	Now func() time.Time
}

// A List is a named blacklist whose Set is swapped atomically: lookups read the Set
// in force without locks and never wait for an update. Updates are made one at a
// time (a lock that lookups never take), so none is lost whoever makes them; a
// caller that must write a change elsewhere before it swaps it in (Next, then
// ReplaceDelta) makes its updates from one goroutine. A nil *List contains nothing.
//
// A delta on a large list is put in force as an overlay on the Set in force (see
// Set): in milliseconds for 10k entries on 10M, where a rebuild takes over a second.
// Once the overlay is large, the list folds it into new tables in the background
// and swaps them in, with the deltas applied meanwhile applied again on top; a
// Replace meanwhile makes the fold's work moot, and it is dropped.
type List struct {
	name  string
	clock func() time.Time
	set   atomic.Pointer[Set]

	mu       sync.Mutex // held by updates
	fold     *folding   // the fold under way, or nil
	proposed proposal   // what Next made last
	folds    atomic.Uint64

	packet, header, other atomic.Uint64

	m                *metrics
	cPacket, cHeader prometheus.Counter
	gEntries, gBytes prometheus.Gauge
	gUpdated         prometheus.Gauge
	metricsErr       error
}

// NewList returns an empty list. name is the listener it guards, or GlobalName; it is
// the listener label of the list's metrics.
func NewList(name string, opts Options) *List {
	l := &List{name: name, clock: opts.Now}
	l.set.Store(emptySet)
	if opts.Registerer != nil {
		m, err := newMetrics(opts.Registerer)
		if err != nil {
			l.metricsErr = fmt.Errorf("registering blacklist metrics of %q: %w", name, err)
		} else {
			l.m = m
			l.cPacket = m.hits.WithLabelValues(name, SourcePacket)
			l.cHeader = m.hits.WithLabelValues(name, SourceHeader)
			l.gEntries = m.entries.WithLabelValues(name)
			l.gBytes = m.bytes.WithLabelValues(name)
			l.gUpdated = m.updated.WithLabelValues(name)
		}
	}
	return l
}

// Name is the list's name.
func (l *List) Name() string { return l.name }

// MetricsError is why the list's metrics could not be registered, or nil.
func (l *List) MetricsError() error { return l.metricsErr }

// Contains reports whether a is blacklisted; see Set.Contains.
func (l *List) Contains(a netip.Addr) bool {
	if l == nil {
		return false
	}
	return l.set.Load().contains(a, l.clock)
}

// Hit counts a lookup that matched, by where the address came from (SourcePacket or
// SourceHeader; anything else is counted under its own label).
func (l *List) Hit(source string) {
	if l == nil {
		return
	}
	switch source {
	case SourcePacket:
		l.packet.Add(1)
		if l.cPacket != nil {
			l.cPacket.Inc()
		}
	case SourceHeader:
		l.header.Add(1)
		if l.cHeader != nil {
			l.cHeader.Inc()
		}
	default:
		l.other.Add(1)
		if l.m != nil {
			l.m.hits.WithLabelValues(l.name, source).Inc()
		}
	}
}

// Hits returns the hits counted for a source (any source other than SourcePacket
// and SourceHeader counts together).
func (l *List) Hits(source string) uint64 {
	if l == nil {
		return 0
	}
	switch source {
	case SourcePacket:
		return l.packet.Load()
	case SourceHeader:
		return l.header.Load()
	}
	return l.other.Load()
}

// Snapshot returns the Set in force.
func (l *List) Snapshot() *Set {
	if l == nil {
		return emptySet
	}
	return l.set.Load()
}

// Len is the number of entries in force; see Set.Len.
func (l *List) Len() int { return l.Snapshot().Len() }

// Replace swaps s in; nil means empty.
func (l *List) Replace(s *Set) {
	if s == nil {
		s = emptySet
	}
	l.swap(s, kindReplace)
}

// Apply changes the Set in force by d (see Delta) and swaps the result in. Expired
// entries are dropped by a rebuild (a large list's overlay drops those it covers,
// its fold the others). On error the Set in force is kept. The list does not keep d.
func (l *List) Apply(d *Delta) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := nowSeconds(l.now())
	next, err := l.set.Load().apply(d, now)
	if err != nil {
		l.rejected(kindDelta)
		return fmt.Errorf("applying a delta to blacklist %q: %w", l.name, err)
	}
	l.install(next, kindDelta, d, now)
	return nil
}

// Next computes the Set that Apply(d) would put in force, without swapping it in, so
// that a caller can first make it durable; ReplaceDelta then swaps it in. A rejected
// delta is counted as Apply counts it.
func (l *List) Next(d *Delta) (*Set, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur, now := l.set.Load(), nowSeconds(l.now())
	next, err := cur.apply(d, now)
	if err != nil {
		l.rejected(kindDelta)
		return nil, fmt.Errorf("applying a delta to blacklist %q: %w", l.name, err)
	}
	l.proposed = proposal{from: cur, next: next, now: now}
	if l.fold != nil {
		l.proposed.d = cloneDelta(d)
	}
	return next, nil
}

// ReplaceDelta swaps s in, as Replace does, counting the update as a delta (s being
// what Next made of one). Next and ReplaceDelta are made by one goroutine, which
// makes every update of the list between them.
func (l *List) ReplaceDelta(s *Set) {
	if s == nil {
		s = emptySet
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.proposed
	l.proposed = proposal{}
	if p.next == s && p.from == l.set.Load() {
		l.install(s, kindDelta, p.d, p.now)
		return
	}
	l.install(s, kindDelta, nil, 0)
}

// proposal is a Set that Next made, from the Set in force then, and its delta when
// a fold was under way (which must apply it again).
type proposal struct {
	from, next *Set
	d          *Delta
	now        uint32
}

// folding is a fold under way: the Set it folds, and the deltas put in force since,
// which it applies again to what it makes. lost: something else was put in force
// since, and what it makes is not used.
type folding struct {
	from *Set
	log  []logged
	lost bool
	done chan struct{}
}

type logged struct {
	d   *Delta
	now uint32
}

func cloneDelta(d *Delta) *Delta {
	if d == nil {
		return nil
	}
	return &Delta{Add: slices.Clone(d.Add), Remove: slices.Clone(d.Remove)}
}

// install puts s in force, made by an update of kind from the Set in force by d at
// now (d nil: not by a delta the list knows), and starts a fold if s needs one.
// l.mu is held.
func (l *List) install(s *Set, kind string, d *Delta, now uint32) {
	l.set.Store(s)
	if f := l.fold; f != nil {
		if d != nil && !f.lost {
			f.log = append(f.log, logged{cloneDelta(d), now})
		} else {
			f.lost, f.log = true, nil
		}
	}
	l.swapped(s, kind)
	l.startFold(s)
}

// startFold folds s's overlay into new tables in the background if it is large and
// no fold is under way. l.mu is held.
func (l *List) startFold(s *Set) {
	if l.fold != nil || s.ov == nil || s.ov.size < foldSize(s.baseLen()) {
		return
	}
	f := &folding{from: s, done: make(chan struct{})}
	l.fold = f
	go l.runFold(f)
}

func (l *List) runFold(f *folding) {
	defer close(f.done)
	next := f.from.flat(nowSeconds(l.now()))
	if foldGate != nil {
		foldGate()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fold = nil
	if f.lost {
		return
	}
	for _, e := range f.log {
		var err error
		if next, err = next.apply(e.d, e.now); err != nil {
			return // it applied before, on the same entries
		}
	}
	l.set.Store(next)
	l.folds.Add(1)
	if l.m != nil {
		l.gEntries.Set(float64(next.Len()))
		l.gBytes.Set(float64(next.Bytes()))
	}
	l.startFold(next)
}

// foldGate, when set (by tests), is called by a fold between its build and its
// swap.
var foldGate func()

// Folds is the number of folds the list has swapped in.
func (l *List) Folds() uint64 {
	if l == nil {
		return 0
	}
	return l.folds.Load()
}

// WaitFold waits until the list has no fold under way in the background (see
// List); for tests and benchmarks, which measure an update with what it sets off.
func (l *List) WaitFold() {
	if l != nil {
		l.waitFold()
	}
}

// waitFold waits for the fold under way, if any, and those it starts.
func (l *List) waitFold() {
	for {
		l.mu.Lock()
		f := l.fold
		l.mu.Unlock()
		if f == nil {
			return
		}
		<-f.done
	}
}

// Load reads a whole list (gzip, binary or text; see Read) and swaps it in. On error,
// a *ParseErrors listing bad lines among others, the list in force is kept.
func (l *List) Load(r io.Reader) error {
	s, err := read(r, l.now(), fileLimits)
	if err != nil {
		l.rejected(kindReplace)
		return fmt.Errorf("loading blacklist %q: %w", l.name, err)
	}
	l.Replace(s)
	return nil
}

// LoadDelta reads a text delta (gzip allowed; see ParseTextDelta) and applies it. On
// error the list in force is kept.
func (l *List) LoadDelta(r io.Reader) error {
	d, err := readDelta(r, l.now(), fileLimits)
	if err != nil {
		l.rejected(kindDelta)
		return fmt.Errorf("loading a delta into blacklist %q: %w", l.name, err)
	}
	return l.Apply(d)
}

func (l *List) now() time.Time {
	if l.clock == nil {
		return time.Now()
	}
	return l.clock()
}

// swap stores s.
func (l *List) swap(s *Set, kind string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.install(s, kind, nil, 0)
}

// swapped counts an update that put s in force.
func (l *List) swapped(s *Set, kind string) {
	if l.m == nil {
		return
	}
	l.m.updates.WithLabelValues(l.name, kind, resultOK).Inc()
	l.gEntries.Set(float64(s.Len()))
	l.gBytes.Set(float64(s.Bytes()))
	l.gUpdated.Set(float64(time.Now().UnixNano()) / 1e9)
}

func (l *List) rejected(kind string) {
	if l.m != nil {
		l.m.updates.WithLabelValues(l.name, kind, resultError).Inc()
	}
}
