package blacklist

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
	"time"
)

// key is an address of one family as an unsigned integer: a4 for IPv4, a6 for IPv6.
// The span algebra is written once over it.
type key[K any] interface {
	comparable
	less(K) bool
	inc() K // +1; never called on the largest address
	dec() K // -1; never called on the smallest address
	isMax() bool
	// low returns k with its n lowest bits set (n at most the address width).
	low(n int) K
	// tz is the number of trailing zero bits (the address width for zero).
	tz() int
	// prefix returns the CIDR of length l whose first address is k.
	prefix(l int) netip.Prefix
	width() int
}

// a4 is an IPv4 address as a number.
type a4 uint32

func (a a4) less(b a4) bool { return a < b }
func (a a4) inc() a4        { return a + 1 }
func (a a4) dec() a4        { return a - 1 }
func (a a4) isMax() bool    { return a == math.MaxUint32 }
func (a a4) low(n int) a4   { return a | a4(uint64(1)<<n-1) }
func (a a4) tz() int        { return bits.TrailingZeros32(uint32(a)) }
func (a a4) width() int     { return 32 }
func (a a4) addr() netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(a))
	return netip.AddrFrom4(b)
}
func (a a4) prefix(l int) netip.Prefix { return netip.PrefixFrom(a.addr(), l) }

// a6 is an IPv6 address as two big-endian halves.
type a6 struct{ hi, lo uint64 }

func (a a6) less(b a6) bool { return a.hi < b.hi || a.hi == b.hi && a.lo < b.lo }

func (a a6) inc() a6 {
	lo, c := bits.Add64(a.lo, 1, 0)
	return a6{a.hi + c, lo}
}

func (a a6) dec() a6 {
	lo, b := bits.Sub64(a.lo, 1, 0)
	return a6{a.hi - b, lo}
}

func (a a6) isMax() bool { return a.hi == math.MaxUint64 && a.lo == math.MaxUint64 }

func (a a6) low(n int) a6 {
	if n <= 64 {
		return a6{a.hi, a.lo | (uint64(1)<<n - 1)}
	}
	return a6{a.hi | (uint64(1)<<(n-64) - 1), math.MaxUint64}
}

func (a a6) tz() int {
	if a.lo != 0 {
		return bits.TrailingZeros64(a.lo)
	}
	return 64 + bits.TrailingZeros64(a.hi)
}

func (a a6) width() int { return 128 }

func (a a6) addr() netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], a.hi)
	binary.BigEndian.PutUint64(b[8:], a.lo)
	return netip.AddrFrom16(b)
}

func (a a6) prefix(l int) netip.Prefix { return netip.PrefixFrom(a.addr(), l) }

func (a a6) xor(b a6) a6  { return a6{a.hi ^ b.hi, a.lo ^ b.lo} }
func (a a6) and(b a6) a6  { return a6{a.hi & b.hi, a.lo & b.lo} }
func (a a6) isZero() bool { return a.hi|a.lo == 0 }

// shl shifts a left by n (0..128) bits.
func (a a6) shl(n uint) a6 {
	if n >= 64 {
		return a6{a.lo << (n - 64), 0}
	}
	return a6{a.hi<<n | a.lo>>(64-n), a.lo << n}
}

// clz is the number of leading zero bits.
func (a a6) clz() int {
	if a.hi != 0 {
		return bits.LeadingZeros64(a.hi)
	}
	return 64 + bits.LeadingZeros64(a.lo)
}

// topMask6 has the n (0..128) highest bits set.
func topMask6(n int) a6 {
	switch {
	case n <= 0:
		return a6{}
	case n <= 64:
		return a6{^uint64(0) << (64 - n), 0}
	default:
		return a6{math.MaxUint64, ^uint64(0) << (128 - n)}
	}
}

func addr4(a netip.Addr) a4 {
	b := a.As4()
	return a4(binary.BigEndian.Uint32(b[:]))
}

func from16(b [16]byte) a6 {
	return a6{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// Expiry is kept in whole Unix seconds as a uint32: expPermanent marks an entry that
// never expires, and an entry with expiry e matches while the clock's Unix second is
// below e.
const expPermanent = math.MaxUint32

// expSeconds converts an expiry time: the zero time and times past 2106 mean never;
// a fraction of a second rounds up; times before 1970 are already past.
func expSeconds(t time.Time) uint32 {
	if t.IsZero() {
		return expPermanent
	}
	u := t.Unix()
	if t.Nanosecond() > 0 {
		u++
	}
	switch {
	case u <= 0:
		return 1
	case u >= expPermanent:
		return expPermanent
	}
	return uint32(u)
}

// nowSeconds is t in Unix seconds, clamped to what an expiry can hold.
func nowSeconds(t time.Time) uint32 {
	u := t.Unix()
	switch {
	case u < 0:
		return 0
	case u >= expPermanent:
		return expPermanent - 1
	}
	return uint32(u)
}

func expTime(e uint32) time.Time {
	if e == expPermanent {
		return time.Time{}
	}
	return time.Unix(int64(e), 0).UTC()
}
