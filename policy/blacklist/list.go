package blacklist

import (
	"fmt"
	"io"
	"net/netip"
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
// in force without locks and never wait for an update. Updates take no lock either:
// Replace stores, Apply builds on the Set it read and swaps only if that is still the
// one in force (else builds again), so no update is lost whoever makes them; a caller
// that must write a change elsewhere before it swaps it in (Next, then ReplaceDelta)
// makes its updates from one goroutine. A nil *List contains nothing.
type List struct {
	name  string
	clock func() time.Time
	set   atomic.Pointer[Set]

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

// Apply changes the Set in force by d (see Delta) and swaps the result in, dropping
// expired entries. On error the Set in force is kept.
func (l *List) Apply(d *Delta) error {
	for {
		cur := l.set.Load()
		next, err := cur.apply(d, nowSeconds(l.now()))
		if err != nil {
			l.rejected(kindDelta)
			return fmt.Errorf("applying a delta to blacklist %q: %w", l.name, err)
		}
		if l.set.CompareAndSwap(cur, next) {
			l.swapped(next, kindDelta)
			return nil
		}
	}
}

// Next computes the Set that Apply(d) would put in force, without swapping it in, so
// that a caller can first make it durable; ReplaceDelta then swaps it in. A rejected
// delta is counted as Apply counts it.
func (l *List) Next(d *Delta) (*Set, error) {
	next, err := l.Snapshot().apply(d, nowSeconds(l.now()))
	if err != nil {
		l.rejected(kindDelta)
		return nil, fmt.Errorf("applying a delta to blacklist %q: %w", l.name, err)
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
	l.swap(s, kindDelta)
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
	l.set.Store(s)
	l.swapped(s, kind)
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
