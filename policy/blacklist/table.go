package blacklist

import (
	"math/bits"
	"runtime"
	"slices"
	"unsafe"
)

// Index sizing: a table of n keys gets n/16 to n/8 buckets, at most 2^maxIndexBits
// (a 1 MiB index), so a lookup is one index read and a binary search over a few keys.
const (
	indexBias    = 3
	maxIndexBits = 18
)

func indexBits(n, common, width int) int {
	k := bits.Len(uint(n)) - indexBias
	k = min(k, maxIndexBits, width-common)
	return max(k, 0)
}

// t4 is a sorted set of distinct IPv4 keys answering membership and predecessor
// queries. Keys share their first c bits (the common prefix of the smallest and
// largest); the next k bits pick a bucket in idx, which holds where each bucket
// starts. When c+k >= 16 every key of a bucket has the same upper half, so only the
// lower 16 bits are stored (k16); otherwise whole keys are (k32).
type t4 struct {
	n     int
	first a4
	mask  a4    // the c highest bits
	c, ks uint8 // bucket of a: (a << c) >> ks
	idx   []uint32
	k16   []uint16
	k32   []a4
}

// newT4 indexes keys, which it copies.
func newT4(keys []a4) t4 {
	n := len(keys)
	if n == 0 {
		return t4{}
	}
	first := keys[0]
	c := bits.LeadingZeros32(uint32(first ^ keys[n-1]))
	k := indexBits(n, c, 32)
	t := t4{n: n, first: first, mask: ^a4(0) << (32 - c), c: uint8(c), ks: uint8(32 - k)}
	t.idx = make([]uint32, 1<<k+1)
	b := 0
	for i, key := range keys {
		for kb := int((key << t.c) >> t.ks); b <= kb; b++ {
			t.idx[b] = uint32(i)
		}
		yieldAt(i)
	}
	for ; b < len(t.idx); b++ {
		t.idx[b] = uint32(n)
	}
	if c+k >= 16 {
		t.k16 = make([]uint16, n)
		for i, key := range keys {
			t.k16[i] = uint16(key)
			yieldAt(i)
		}
	} else {
		t.k32 = cloneYielding(keys)
	}
	return t
}

// has reports whether a is a key, and its position.
func (t *t4) has(a a4) (int, bool) {
	if t.n == 0 || (a^t.first)&t.mask != 0 {
		return 0, false
	}
	b := (a << t.c) >> t.ks
	lo, end := int(t.idx[b]), int(t.idx[b+1])
	hi := end
	if t.k16 != nil {
		x := uint16(a)
		k := t.k16[:end]
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			if k[m] < x {
				lo = m + 1
			} else {
				hi = m
			}
		}
		return lo, lo < end && k[lo] == x
	}
	k := t.k32[:end]
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k[m] < a {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < end && k[lo] == a
}

// pred returns the position of the largest key not above a, or -1.
func (t *t4) pred(a a4) int {
	if t.n == 0 {
		return -1
	}
	if (a^t.first)&t.mask != 0 {
		if a < t.first {
			return -1
		}
		return t.n - 1
	}
	b := (a << t.c) >> t.ks
	lo, hi := int(t.idx[b]), int(t.idx[b+1])
	if t.k16 != nil {
		x := uint16(a)
		k := t.k16[:hi]
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			if k[m] <= x {
				lo = m + 1
			} else {
				hi = m
			}
		}
		return lo - 1
	}
	k := t.k32[:hi]
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k[m] <= a {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo - 1
}

// key returns the i-th key.
func (t *t4) key(i int) a4 {
	if t.k16 == nil {
		return t.k32[i]
	}
	// The bucket holding i is the last one starting at or before it.
	lo, hi := 0, len(t.idx)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if int(t.idx[m]) <= i {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return t.first&t.mask | a4(lo-1)<<t.ks>>t.c | a4(t.k16[i])
}

// appendKeys appends every key in order.
func (t *t4) appendKeys(dst []a4) []a4 {
	if t.k16 == nil {
		return appendYielding(dst, t.k32)
	}
	next := len(dst) + yieldMask
	for b := 0; b+1 < len(t.idx); b++ {
		top := t.first&t.mask | a4(b)<<t.ks>>t.c
		for _, x := range t.k16[t.idx[b]:t.idx[b+1]] {
			dst = append(dst, top|a4(x))
		}
		if len(dst) >= next {
			runtime.Gosched()
			next = len(dst) + yieldMask
		}
	}
	return dst
}

// yieldMask sets how often the loops that build or read out a whole table yield
// their P (runtime.Gosched): every 32,768 entries, some tens of microseconds. A
// build of millions of entries (a fold in the background, a list replaced) runs
// for tens to hundreds of milliseconds, and without yielding it holds its P for
// Go's whole 10 ms time slice while the goroutines serving requests, which look
// addresses up, wait for one.
const yieldMask = 1<<15 - 1

func yieldAt(i int) {
	if i&yieldMask == yieldMask {
		runtime.Gosched()
	}
}

// appendYielding is append(dst, src...) in pieces of yieldMask+1 elements with a
// yield between them: one copy of tens of megabytes holds its P as long as a loop.
func appendYielding[T any](dst, src []T) []T {
	dst = slices.Grow(dst, len(src))
	for len(src) > yieldMask+1 {
		dst = append(dst, src[:yieldMask+1]...)
		src = src[yieldMask+1:]
		runtime.Gosched()
	}
	return append(dst, src...)
}

// cloneYielding is slices.Clone with appendYielding's yields.
func cloneYielding[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return appendYielding(make([]T, 0, len(s)), s)
}

func (t *t4) bytes() int {
	return 4*cap(t.idx) + 2*cap(t.k16) + 4*cap(t.k32)
}

// t6 is t4 for IPv6 keys, which are stored whole.
type t6 struct {
	n     int
	first a6
	mask  a6
	c, ks uint8
	idx   []uint32
	keys  []a6
}

func newT6(keys []a6) t6 {
	n := len(keys)
	if n == 0 {
		return t6{}
	}
	first := keys[0]
	c := first.xor(keys[n-1]).clz()
	k := indexBits(n, c, 64)
	t := t6{n: n, first: first, mask: topMask6(c), c: uint8(c), ks: uint8(64 - k), keys: keys}
	t.idx = make([]uint32, 1<<k+1)
	b := 0
	for i, key := range keys {
		for kb := int(t.bucket(key)); b <= kb; b++ {
			t.idx[b] = uint32(i)
		}
		yieldAt(i)
	}
	for ; b < len(t.idx); b++ {
		t.idx[b] = uint32(n)
	}
	return t
}

func (t *t6) bucket(a a6) uint64 { return a.shl(uint(t.c)).hi >> t.ks }

func (t *t6) has(a a6) (int, bool) {
	if t.n == 0 || !a.xor(t.first).and(t.mask).isZero() {
		return 0, false
	}
	b := t.bucket(a)
	lo, end := int(t.idx[b]), int(t.idx[b+1])
	hi := end
	k := t.keys[:end]
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k[m].less(a) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < end && k[lo] == a
}

func (t *t6) pred(a a6) int {
	if t.n == 0 {
		return -1
	}
	if !a.xor(t.first).and(t.mask).isZero() {
		if a.less(t.first) {
			return -1
		}
		return t.n - 1
	}
	b := t.bucket(a)
	lo, hi := int(t.idx[b]), int(t.idx[b+1])
	k := t.keys[:hi]
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if a.less(k[m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo - 1
}

func (t *t6) bytes() int { return 4*cap(t.idx) + int(unsafe.Sizeof(a6{}))*cap(t.keys) }
