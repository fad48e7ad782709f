package blacklist

import (
	"net/netip"
	"slices"
)

// span is an inclusive address range with an expiry (expPermanent for never). A Set
// is built from a list of spans that is sorted, disjoint and coalesced: normalized.
type span[K key[K]] struct {
	lo, hi K
	exp    uint32
}

// normalize turns spans sorted by lo, which may overlap, into a normalized list: every
// address covered gets the latest expiry of the spans covering it, spans expired at
// now are dropped, and neighbours with equal expiry are merged. The result may reuse
// in's memory, when in has no overlaps; else it is taken from sc.
func normalize[K key[K]](sc *scratch, in []span[K], now uint32) []span[K] {
	if disjoint(in) {
		out := in[:0]
		for _, s := range in {
			if s.exp <= now {
				continue
			}
			if m := len(out) - 1; m >= 0 && out[m].exp == s.exp && out[m].hi.inc() == s.lo {
				out[m].hi = s.hi
			} else {
				out = append(out, s)
			}
		}
		return out
	}
	out := grab[span[K]](sc, len(in))
	var h expHeap[K]
	var pos K
	i, n := 0, len(in)
	for {
		if len(h) == 0 {
			for i < n && in[i].exp <= now {
				i++
			}
			if i == n {
				break
			}
			pos = in[i].lo
		}
		for i < n && !pos.less(in[i].lo) {
			if s := in[i]; s.exp > now && !s.hi.less(pos) {
				h.push(s)
			}
			i++
		}
		for len(h) > 0 && h[0].hi.less(pos) {
			h.pop()
		}
		if len(h) == 0 {
			continue
		}
		top := h[0]
		end := top.hi
		if i < n && !end.less(in[i].lo) {
			end = in[i].lo.dec()
		}
		if m := len(out) - 1; m >= 0 && out[m].exp == top.exp && out[m].hi.inc() == pos {
			out[m].hi = end
		} else {
			out = append(out, span[K]{pos, end, top.exp})
		}
		if end.isMax() {
			break
		}
		pos = end.inc()
	}
	return out
}

// disjoint reports whether spans sorted by lo do not overlap.
func disjoint[K key[K]](s []span[K]) bool {
	for i := 1; i < len(s); i++ {
		if !s[i-1].hi.less(s[i].lo) {
			return false
		}
	}
	return true
}

// expHeap is a max-heap of spans by expiry.
type expHeap[K key[K]] []span[K]

func (h *expHeap[K]) push(s span[K]) {
	*h = append(*h, s)
	q := *h
	for j := len(q) - 1; j > 0; {
		p := (j - 1) / 2
		if q[p].exp >= q[j].exp {
			break
		}
		q[p], q[j] = q[j], q[p]
		j = p
	}
}

func (h *expHeap[K]) pop() {
	q := *h
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for j := 0; ; {
		c := 2*j + 1
		if c >= len(q) {
			break
		}
		if c+1 < len(q) && q[c+1].exp > q[c].exp {
			c++
		}
		if q[j].exp >= q[c].exp {
			break
		}
		q[j], q[c] = q[c], q[j]
		j = c
	}
	*h = q
}

// subtract returns the parts of a not covered by b; both are sorted and disjoint.
// The result is a, or taken from sc.
func subtract[K key[K]](sc *scratch, a, b []span[K]) []span[K] {
	if len(b) == 0 {
		return a
	}
	out := grab[span[K]](sc, len(a)+len(b))
	j := 0
	for _, s := range a {
		for j < len(b) && b[j].hi.less(s.lo) {
			j++
		}
		cur, done := s.lo, false
		for k := j; k < len(b) && !s.hi.less(b[k].lo); k++ {
			if cur.less(b[k].lo) {
				out = append(out, span[K]{cur, b[k].lo.dec(), s.exp})
			}
			if !b[k].hi.less(s.hi) {
				done = true
				break
			}
			cur = b[k].hi.inc()
		}
		if !done {
			out = append(out, span[K]{cur, s.hi, s.exp})
		}
	}
	return out
}

// merge returns the spans of a and b, both sorted by lo, in one list sorted by lo:
// a or b if the other is empty, else taken from sc.
func merge[K key[K]](sc *scratch, a, b []span[K]) []span[K] {
	switch {
	case len(a) == 0:
		return b
	case len(b) == 0:
		return a
	}
	out := grab[span[K]](sc, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if b[j].lo.less(a[i].lo) {
			out = append(out, b[j])
			j++
		} else {
			out = append(out, a[i])
			i++
		}
	}
	out = append(out, a[i:]...)
	return append(out, b[j:]...)
}

// sort4 sorts IPv4 spans by lo: an LSD radix sort for long lists, whose buffer is
// taken from sc.
func sort4(sc *scratch, s []span[a4]) {
	if len(s) < 1<<12 {
		slices.SortFunc(s, func(x, y span[a4]) int {
			switch {
			case x.lo < y.lo:
				return -1
			case x.lo > y.lo:
				return 1
			}
			return 0
		})
		return
	}
	buf := grab[span[a4]](sc, len(s))[:len(s)]
	src, dst := s, buf
	var count [256]int
	for shift := uint(0); shift < 32; shift += 8 {
		clear(count[:])
		for i := range src {
			count[byte(src[i].lo>>shift)]++
		}
		if count[byte(src[0].lo>>shift)] == len(src) {
			continue
		}
		sum := 0
		for d, c := range count {
			count[d] = sum
			sum += c
		}
		for _, x := range src {
			d := byte(x.lo >> shift)
			dst[count[d]] = x
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &s[0] {
		copy(s, src)
	}
}

func cmp6(x, y span[a6]) int {
	switch {
	case x.lo.less(y.lo):
		return -1
	case y.lo.less(x.lo):
		return 1
	}
	return 0
}

func sort6(s []span[a6]) { slices.SortFunc(s, cmp6) }

// prefixes calls yield with the CIDR prefixes that exactly cover s, in order.
func prefixes[K key[K]](s span[K], yield func(netip.Prefix) bool) bool {
	w := s.lo.width()
	lo := s.lo
	for {
		n := lo.tz()
		for n > 0 && s.hi.less(lo.low(n)) {
			n--
		}
		if !yield(lo.prefix(w - n)) {
			return false
		}
		end := lo.low(n)
		if end == s.hi {
			return true
		}
		lo = end.inc()
	}
}

// chunks collects values in chunks of growing size, so that collecting n values
// allocates about 2n (the chunks, then one slice holding them all) where append
// would allocate about 5n for large n. The chunks are taken from sc (nil: the heap).
type chunks[T any] struct {
	sc   *scratch
	full [][]T
	cur  []T
	n    int
}

const minChunk, maxChunk = 256, 1 << 20

func (c *chunks[T]) add(v T) {
	if len(c.cur) == cap(c.cur) {
		size := minChunk
		if cap(c.cur) > 0 {
			c.full = append(c.full, c.cur)
			size = min(2*cap(c.cur), maxChunk)
		}
		c.cur = grab[T](c.sc, size)
	}
	c.cur = append(c.cur, v)
	c.n++
}

// all returns every value collected, in order, as one slice, which c keeps.
func (c *chunks[T]) all() []T {
	if len(c.full) == 0 {
		return c.cur
	}
	out := grab[T](c.sc, c.n)
	for _, ch := range c.full {
		out = append(out, ch...)
	}
	out = append(out, c.cur...)
	c.full, c.cur = nil, out
	return out
}

// reset empties c; the memory of its chunks is the caller's to free.
func (c *chunks[T]) reset() {
	c.full, c.cur, c.n = nil, nil, 0
}
