package blacklist

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"
)

// MaxEntries bounds how many entries one Set, upload or delta may hold.
const MaxEntries = 100_000_000

// ErrTooManyEntries reports an upload or delta over MaxEntries.
var ErrTooManyEntries = fmt.Errorf("blacklist: more than %d entries", MaxEntries)

// An Entry is a CIDR prefix (a single address is a /32 or /128) and when it expires;
// the zero Expires means never.
type Entry struct {
	Prefix  netip.Prefix
	Expires time.Time
}

// A Delta changes a Set: Remove takes addresses out, then Add puts entries in. An
// address added that is already present keeps the later of its two expiries (never
// being the latest), so to shorten an expiry remove and add in the same Delta.
// Removing a prefix removes every address it covers, whatever entries they came from:
// removing 10.0.0.0/24 from a set holding 10.0.0.0/8 leaves the rest of the /8.
type Delta struct {
	Add    []Entry
	Remove []netip.Prefix
}

// A Builder collects entries for a Set. The zero Builder is ready to use; it is not
// safe for concurrent use. A large Builder keeps its entries off the Go heap (about
// 12 bytes per IPv4 entry, 40 per IPv6 one); Reset releases them at once, else they
// are released when the Builder is collected.
//
// Entries are normalized as they are added: host bits are masked, a zone is dropped,
// an IPv4-mapped IPv6 prefix (::ffff:0:0/96 and longer) is taken as the IPv4 prefix
// it maps, and an IPv6 prefix covering all of ::ffff:0:0/96 also covers all of IPv4.
type Builder struct {
	mem *builderMem // nil until the first entry
	v4  chunks[span[a4]]
	v6  chunks[span[a6]]
}

// Add adds a prefix with an expiry (zero for never). An invalid prefix is ignored.
func (b *Builder) Add(p netip.Prefix, expires time.Time) { b.add(p, expSeconds(expires)) }

func (b *Builder) add(p netip.Prefix, exp uint32) bool {
	b.init()
	return addSpans(p, exp, b.v4.add, b.v6.add)
}

// init gives b its memory, before its first entry.
func (b *Builder) init() {
	if b.mem == nil {
		b.mem = newBuilderMem()
		b.v4.sc, b.v6.sc = b.mem.sc, b.mem.sc
	}
}

// AddAddr adds a single address.
func (b *Builder) AddAddr(a netip.Addr, expires time.Time) {
	b.Add(netip.PrefixFrom(a, a.BitLen()), expires)
}

// Len is the number of entries added so far; an IPv6 prefix covering all of
// ::ffff:0:0/96 counts twice.
func (b *Builder) Len() int { return b.v4.n + b.v6.n }

// Reset empties the builder and releases its memory.
func (b *Builder) Reset() {
	b.v4.reset()
	b.v6.reset()
	if b.mem != nil {
		b.mem.sc.free()
	}
}

// Build returns a Set of the entries added; entries already expired by the wall clock
// are left out. The Builder may go on being used.
func (b *Builder) Build() *Set { return b.BuildAt(time.Now()) }

// BuildAt is Build with expiry judged at t.
func (b *Builder) BuildAt(t time.Time) *Set {
	now := nowSeconds(t)
	var sc scratch
	defer sc.free()
	v4, v6 := b.v4.all(), b.v6.all()
	sort4(&sc, v4)
	sort6(v6)
	s := newSet(&sc, normalize(&sc, v4, now), normalize(&sc, v6, now))
	runtime.KeepAlive(b.mem) // its mappings hold v4 and v6
	return s
}

var mapped6 = span[a6]{lo: a6{0, 0xffff << 32}, hi: a6{0, 0xffff_ffff_ffff}}

// addSpans hands the span of p to the adder of its family, normalizing it as the
// Builder documents. It reports false for an invalid prefix.
func addSpans(p netip.Prefix, exp uint32, add4 func(span[a4]), add6 func(span[a6])) bool {
	if !p.IsValid() {
		return false
	}
	a, l := p.Addr(), p.Bits()
	if a.Is4In6() && l >= 96 {
		a, l = a.Unmap(), l-96
	}
	if a.Is4() {
		lo := addr4(a) &^ a4(uint64(1)<<(32-l)-1)
		add4(span[a4]{lo, lo.low(32 - l), exp})
		return true
	}
	lo := from16(a.As16()).and(topMask6(l))
	s := span[a6]{lo, lo.low(128 - l), exp}
	if !mapped6.lo.less(s.lo) && !s.hi.less(mapped6.hi) {
		add4(span[a4]{0, ^a4(0), exp})
	}
	add6(s)
	return true
}

// ErrInvalidPrefix reports an invalid (zero) prefix in a Delta.
var ErrInvalidPrefix = errors.New("blacklist: invalid prefix")

// How apply makes the new Set: an overlay on a large Set, else a rebuild (auto);
// always a rebuild; always an overlay (tests).
type applyMode int

const (
	applyAuto applyMode = iota
	applyRebuild
	applyOverlay
)

// apply returns s changed by d, with expiry judged at now: a Set sharing s's
// tables with an overlay when s is large and d small beside it (see overlay), else
// a rebuild, which drops every entry expired at now.
func (s *Set) apply(d *Delta, now uint32) (*Set, error) { return s.applyHow(d, now, applyAuto) }

func (s *Set) applyHow(d *Delta, now uint32, mode applyMode) (*Set, error) {
	if d == nil {
		return s, nil
	}
	if len(d.Add)+len(d.Remove) > MaxEntries || s.Len()+len(d.Add) > MaxEntries {
		return nil, ErrTooManyEntries
	}
	var rm, add Builder
	defer rm.Reset()
	defer add.Reset()
	var sc scratch
	defer sc.free()
	for i, p := range d.Remove {
		if !rm.add(p, expPermanent) {
			return nil, fmt.Errorf("removal %d: %w", i, ErrInvalidPrefix)
		}
	}
	for i, e := range d.Add {
		if !add.add(e.Prefix, expSeconds(e.Expires)) {
			return nil, fmt.Errorf("addition %d: %w", i, ErrInvalidPrefix)
		}
	}
	rm4, rm6, add4, add6 := rm.v4.all(), rm.v6.all(), add.v4.all(), add.v6.all()
	sort4(&sc, rm4)
	sort4(&sc, add4)
	sort6(rm6)
	sort6(add6)
	rm4, rm6 = normalize(&sc, rm4, 0), normalize(&sc, rm6, 0)
	base := s.baseLen()
	small := base >= overlayMinBase && s.overlaySize()+len(rm4)+len(rm6)+len(add4)+len(add6) <= overlayMax(base)
	if mode == applyOverlay || mode == applyAuto && small {
		return s.applyOverlay(&sc, rm4, add4, rm6, add6, now), nil
	}
	cur4 := subtract(&sc, s.spans4(&sc), rm4)
	cur6 := subtract(&sc, s.spans6(&sc), rm6)
	return newSet(&sc, normalize(&sc, merge(&sc, cur4, add4), now), normalize(&sc, merge(&sc, cur6, add6), now)), nil
}
