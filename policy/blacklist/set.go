package blacklist

import (
	"iter"
	"net/netip"
	"time"
	"unsafe"
)

// A Set is an immutable set of IPv4 and IPv6 addresses, some of which expire. It is
// safe for any number of concurrent readers. The zero Set and a nil *Set are empty.
//
// Inside, each family keeps four sorted tables: single addresses and address ranges,
// each either permanent or expiring. Overlapping and adjacent entries are merged when
// the Set is built, so the ranges of a table never overlap and a lookup is a bucket
// read and a short binary search per non-empty table.
type Set struct {
	others4 int // entries of pr4, e4 and er4; without them an IPv4 lookup reads p4 only

	p4  singles4 // permanent IPv4 addresses
	pr4 ranges4  // permanent IPv4 ranges
	e4  singles4 // expiring IPv4 addresses
	er4 ranges4  // expiring IPv4 ranges
	p6  singles6
	pr6 ranges6
	e6  singles6
	er6 ranges6

	ov *overlay // nil for none: see overlay
}

type singles4 struct {
	t   t4
	exp []uint32 // nil for a permanent table
}

type ranges4 struct {
	start t4
	end   []a4
	exp   []uint32
}

type singles6 struct {
	t   t6
	exp []uint32
}

type ranges6 struct {
	start t6
	end   []a6
	exp   []uint32
}

// Stats counts what a Set holds after merging.
type Stats struct {
	V4Addrs, V4Ranges int // IPv4 single addresses and ranges
	V6Addrs, V6Ranges int
	Expiring          int // how many of those expire
}

var emptySet = &Set{}

// Contains reports whether a is in the set and, if its entry expires, not expired by
// the wall clock. IPv4-mapped IPv6 addresses are looked up as IPv4; zones are ignored.
func (s *Set) Contains(a netip.Addr) bool { return s.contains(a, nil) }

// ContainsAt is Contains with expiry judged at t.
func (s *Set) ContainsAt(a netip.Addr, t time.Time) bool {
	return s.contains(a, func() time.Time { return t })
}

// contains judges expiry by clock (time.Now when nil), read only when an expiring
// entry matches.
func (s *Set) contains(a netip.Addr, clock func() time.Time) bool {
	if s == nil {
		return false
	}
	if a.Is4In6() {
		a = a.Unmap()
	}
	if a.Is4() {
		k := addr4(a)
		if s.ov != nil && s.ov.in4(k) {
			return s.ov.patch.has4(k, clock)
		}
		if s.others4 == 0 {
			// Only permanent single addresses: one table to read.
			_, ok := s.p4.t.has(k)
			return ok
		}
		return s.has4(k, clock)
	}
	if a.Is6() {
		k := from16(a.As16())
		if s.ov != nil && s.ov.in6(k) {
			return s.ov.patch.has6(k, clock)
		}
		return s.has6(k, clock)
	}
	return false
}

func (s *Set) has4(a a4, clock func() time.Time) bool {
	if _, ok := s.p4.t.has(a); ok {
		return true
	}
	if s.pr4.start.n > 0 {
		if i := s.pr4.start.pred(a); i >= 0 && a <= s.pr4.end[i] {
			return true
		}
	}
	if s.e4.t.n > 0 {
		if i, ok := s.e4.t.has(a); ok && s.e4.exp[i] > now(clock) {
			return true
		}
	}
	if s.er4.start.n > 0 {
		if i := s.er4.start.pred(a); i >= 0 && a <= s.er4.end[i] && s.er4.exp[i] > now(clock) {
			return true
		}
	}
	return false
}

func (s *Set) has6(a a6, clock func() time.Time) bool {
	if s.p6.t.n > 0 {
		if _, ok := s.p6.t.has(a); ok {
			return true
		}
	}
	if s.pr6.start.n > 0 {
		if i := s.pr6.start.pred(a); i >= 0 && !s.pr6.end[i].less(a) {
			return true
		}
	}
	if s.e6.t.n > 0 {
		if i, ok := s.e6.t.has(a); ok && s.e6.exp[i] > now(clock) {
			return true
		}
	}
	if s.er6.start.n > 0 {
		if i := s.er6.start.pred(a); i >= 0 && !s.er6.end[i].less(a) && s.er6.exp[i] > now(clock) {
			return true
		}
	}
	return false
}

func now(clock func() time.Time) uint32 {
	if clock == nil {
		return nowSeconds(time.Now())
	}
	return nowSeconds(clock())
}

// Len is the number of entries: single addresses plus address ranges, after
// overlapping and adjacent entries with the same expiry have merged.
func (s *Set) Len() int {
	switch {
	case s == nil:
		return 0
	case s.ov != nil:
		return s.ov.n
	}
	return s.baseLen()
}

// Stats counts the entries by kind.
func (s *Set) Stats() Stats {
	switch {
	case s == nil:
		return Stats{}
	case s.ov != nil:
		return s.ov.st
	}
	return s.baseStats()
}

// Bytes is the memory held by the set's arrays.
func (s *Set) Bytes() int {
	if s == nil {
		return 0
	}
	n := 0
	if s.ov != nil {
		n += s.ov.bytes()
	}
	for _, t := range []*singles4{&s.p4, &s.e4} {
		n += t.t.bytes() + 4*cap(t.exp)
	}
	for _, r := range []*ranges4{&s.pr4, &s.er4} {
		n += r.start.bytes() + 4*cap(r.end) + 4*cap(r.exp)
	}
	for _, t := range []*singles6{&s.p6, &s.e6} {
		n += t.t.bytes() + 4*cap(t.exp)
	}
	for _, r := range []*ranges6{&s.pr6, &s.er6} {
		n += r.start.bytes() + int(unsafe.Sizeof(a6{}))*cap(r.end) + 4*cap(r.exp)
	}
	return n
}

// All yields the set's entries in address order, IPv4 first, as CIDR prefixes with
// their expiry (zero for never); a merged range yields the prefixes that cover it.
// Expired entries not yet dropped by a build are included.
func (s *Set) All() iter.Seq[Entry] {
	return func(yield func(Entry) bool) {
		if s == nil {
			return
		}
		var sc scratch
		defer sc.free()
		if !yieldSpans(s.spans4(&sc), yield) {
			return
		}
		yieldSpans(s.spans6(&sc), yield)
	}
}

func yieldSpans[K key[K]](spans []span[K], yield func(Entry) bool) bool {
	for _, sp := range spans {
		exp := expTime(sp.exp)
		ok := prefixes(sp, func(p netip.Prefix) bool {
			return yield(Entry{Prefix: p, Expires: exp})
		})
		if !ok {
			return false
		}
	}
	return true
}

// newSet builds a Set from normalized spans. Its tables are allocated on the heap;
// sc holds what is needed only while building.
func newSet(sc *scratch, s4 []span[a4], s6 []span[a6]) *Set {
	s := &Set{}
	p, e, pr, er := splitTables(s4, sc, nil)
	s.p4 = singles4{t: newT4(p.keys)}
	s.e4 = singles4{t: newT4(e.keys), exp: e.exp}
	s.pr4 = ranges4{start: newT4(pr.start), end: pr.end}
	s.er4 = ranges4{start: newT4(er.start), end: er.end, exp: er.exp}
	s.others4 = s.pr4.start.n + s.e4.t.n + s.er4.start.n
	p6, e6, pr6, er6 := splitTables(s6, nil, nil)
	s.p6 = singles6{t: newT6(p6.keys)}
	s.e6 = singles6{t: newT6(e6.keys), exp: e6.exp}
	s.pr6 = ranges6{start: newT6(pr6.start), end: pr6.end}
	s.er6 = ranges6{start: newT6(er6.start), end: er6.end, exp: er6.exp}
	return s
}

// single reports how many single addresses a span is kept as: a span of one or two
// addresses is cheaper as single addresses than as a range.
func single[K key[K]](sp span[K]) int {
	switch {
	case sp.lo == sp.hi:
		return 1
	case sp.lo.inc() == sp.hi:
		return 2
	}
	return 0
}

type singlesData[K key[K]] struct {
	keys []K
	exp  []uint32
}

type rangesData[K key[K]] struct {
	start, end []K
	exp        []uint32
}

// splitTables sorts normalized spans into the four tables of a family. The arrays
// of keys (singles and range starts) are taken from keys, which is nil when they
// are the tables' own, or a scratch when the tables copy them (IPv4: newT4); the
// others from rest, nil when they are the tables' own.
func splitTables[K key[K]](spans []span[K], keys, rest *scratch) (p, e singlesData[K], pr, er rangesData[K]) {
	var np, ne, npr, ner int
	for _, sp := range spans {
		c, perm := single(sp), sp.exp == expPermanent
		switch {
		case c > 0 && perm:
			np += c
		case c > 0:
			ne += c
		case perm:
			npr++
		default:
			ner++
		}
	}
	p.keys = grab[K](keys, np)
	e.keys, e.exp = grab[K](keys, ne), grab[uint32](rest, ne)
	pr.start, pr.end = grab[K](keys, npr), grab[K](rest, npr)
	er.start, er.end, er.exp = grab[K](keys, ner), grab[K](rest, ner), grab[uint32](rest, ner)
	for _, sp := range spans {
		c, perm := single(sp), sp.exp == expPermanent
		switch {
		case c > 0 && perm:
			p.keys = append(p.keys, sp.lo)
			if c == 2 {
				p.keys = append(p.keys, sp.hi)
			}
		case c > 0:
			e.keys, e.exp = append(e.keys, sp.lo), append(e.exp, sp.exp)
			if c == 2 {
				e.keys, e.exp = append(e.keys, sp.hi), append(e.exp, sp.exp)
			}
		case perm:
			pr.start, pr.end = append(pr.start, sp.lo), append(pr.end, sp.hi)
		default:
			er.start, er.end, er.exp = append(er.start, sp.lo), append(er.end, sp.hi), append(er.exp, sp.exp)
		}
	}
	if len(e.keys) == 0 {
		e.exp = nil
	}
	if len(er.start) == 0 {
		er.exp = nil
	}
	return p, e, pr, er
}

// spans4 returns the IPv4 part of the set as normalized spans, taken from sc.
func (s *Set) spans4(sc *scratch) []span[a4] {
	if s == nil {
		return nil
	}
	b := s.baseSpans4(sc)
	if s.ov == nil {
		return b
	}
	return coalesce(merge(sc, subtract(sc, b, s.ov.windows4(sc)), s.ov.patch.baseSpans4(sc)))
}

// spans6 returns the IPv6 part of the set as normalized spans, taken from sc.
func (s *Set) spans6(sc *scratch) []span[a6] {
	if s == nil {
		return nil
	}
	b := s.baseSpans6(sc)
	if s.ov == nil {
		return b
	}
	return coalesce(merge(sc, subtract(sc, b, s.ov.windows6(sc)), s.ov.patch.baseSpans6(sc)))
}

// baseSpans4 returns the IPv4 part of s's own tables as normalized spans, taken
// from sc.
func (s *Set) baseSpans4(sc *scratch) []span[a4] {
	p := singleSpans(sc, s.p4.t.appendKeys(grab[a4](sc, s.p4.t.n)), nil)
	e := singleSpans(sc, s.e4.t.appendKeys(grab[a4](sc, s.e4.t.n)), s.e4.exp)
	pr := rangeSpans(sc, s.pr4.start.appendKeys(grab[a4](sc, s.pr4.start.n)), s.pr4.end, nil)
	er := rangeSpans(sc, s.er4.start.appendKeys(grab[a4](sc, s.er4.start.n)), s.er4.end, s.er4.exp)
	return coalesce(merge(sc, merge(sc, p, pr), merge(sc, e, er)))
}

// baseSpans6 is baseSpans4 for IPv6.
func (s *Set) baseSpans6(sc *scratch) []span[a6] {
	p := singleSpans(sc, s.p6.t.keys, nil)
	e := singleSpans(sc, s.e6.t.keys, s.e6.exp)
	pr := rangeSpans(sc, s.pr6.start.keys, s.pr6.end, nil)
	er := rangeSpans(sc, s.er6.start.keys, s.er6.end, s.er6.exp)
	return coalesce(merge(sc, merge(sc, p, pr), merge(sc, e, er)))
}

func singleSpans[K key[K]](sc *scratch, keys []K, exp []uint32) []span[K] {
	out := grab[span[K]](sc, len(keys))[:len(keys)]
	for i, k := range keys {
		out[i] = span[K]{k, k, expPermanent}
		if exp != nil {
			out[i].exp = exp[i]
		}
	}
	return out
}

func rangeSpans[K key[K]](sc *scratch, start, end []K, exp []uint32) []span[K] {
	out := grab[span[K]](sc, len(start))[:len(start)]
	for i := range start {
		out[i] = span[K]{start[i], end[i], expPermanent}
		if exp != nil {
			out[i].exp = exp[i]
		}
	}
	return out
}

// coalesce merges neighbours of sorted disjoint spans that touch and expire together.
func coalesce[K key[K]](s []span[K]) []span[K] {
	if len(s) == 0 {
		return s
	}
	w := 0
	for _, sp := range s[1:] {
		if s[w].exp == sp.exp && s[w].hi.inc() == sp.lo {
			s[w].hi = sp.hi
			continue
		}
		w++
		s[w] = sp
	}
	return s[:w+1]
}
