package blacklist

import (
	"unsafe"
)

// A delta applied to a large Set does not rebuild its tables: the new Set shares
// them (its base) and carries an overlay, a small Set (the patch) holding the
// entries of some address windows, with the windows themselves. A lookup inside a
// window is answered by the patch, one outside by the base. Applying a delta makes
// a new overlay: the windows grow by what the delta touches, widened to the whole
// entries of the base they meet, and the patch is what the list holds in them
// after the delta. So a 10k delta on a 10M list costs some 10k searches in the base
// and the building of a patch of about its own size, not a 10M rebuild; the List
// folds the overlay into a new base in the background once it is large (fold).
//
// The windows never cut an entry: every entry of the base and of the patch, and
// every span of the merged list the Set stands for, lies either wholly inside a
// window or wholly outside all of them, and no span outside touches one inside
// with the same expiry. So the list outside the windows is the base's, inside them
// the patch's, and Len, Stats, All and WriteBinary give what a rebuild would.
type overlay struct {
	has4  []uint64 // bit a>>filterShift: a window meets that block of addresses
	w4    t4       // window starts
	w4end []a4
	w6    t6
	w6end []a6
	patch *Set  // flat: without an overlay of its own
	in    Stats // the entries of the base inside the windows
	st    Stats
	n     int // entries of the whole set (Len)
	size  int // windows and patch entries: what a lookup and the next delta pay for
}

// Overlay sizing: a Set of fewer than overlayMinBase entries is rebuilt by a delta
// (which takes milliseconds); a delta making an overlay larger than a quarter of its
// base rebuilds too; a List folds an overlay past foldSize of its base.
const overlayMinBase = 1 << 16

func overlayMax(base int) int { return base / 4 }

func foldSize(base int) int { return max(1<<12, base/64) }

// baseLen is the number of entries of s's own tables, without its overlay.
func (s *Set) baseLen() int {
	return s.p4.t.n + s.pr4.start.n + s.e4.t.n + s.er4.start.n +
		s.p6.t.n + s.pr6.start.n + s.e6.t.n + s.er6.start.n
}

func (s *Set) baseStats() Stats {
	return Stats{
		V4Addrs:  s.p4.t.n + s.e4.t.n,
		V4Ranges: s.pr4.start.n + s.er4.start.n,
		V6Addrs:  s.p6.t.n + s.e6.t.n,
		V6Ranges: s.pr6.start.n + s.er6.start.n,
		Expiring: s.e4.t.n + s.er4.start.n + s.e6.t.n + s.er6.start.n,
	}
}

// overlaySize is the size of s's overlay, 0 without one.
func (s *Set) overlaySize() int {
	if s.ov == nil {
		return 0
	}
	return s.ov.size
}

func (o *overlay) in4(a a4) bool {
	if b := a >> filterShift; o.has4[b>>6]&(1<<(b&63)) == 0 {
		return false
	}
	i := o.w4.pred(a)
	return i >= 0 && a <= o.w4end[i]
}

func (o *overlay) in6(a a6) bool {
	if o.w6.n == 0 {
		return false
	}
	i := o.w6.pred(a)
	return i >= 0 && !o.w6end[i].less(a)
}

// filterShift sizes the filter of IPv4 windows: a bit per 4096 addresses, 128 KiB,
// which a lookup reads before the windows (mostly from the cache: the windows of
// 150k entries leave over 85% of the bits clear, so most lookups outside them read
// nothing else of the overlay).
const filterShift = 12

func (o *overlay) bytes() int {
	return 8*cap(o.has4) + o.w4.bytes() + 4*cap(o.w4end) + o.w6.bytes() + int(unsafe.Sizeof(a6{}))*cap(o.w6end) + o.patch.Bytes()
}

// keyTable is a sorted key table of one family (t4, t6) as the overlay reads it.
type keyTable[K any] interface {
	pred(K) int
	at(int) K
	size() int
}

func (t *t4) at(i int) a4 { return t.key(i) }
func (t *t4) size() int   { return t.n }
func (t *t6) at(i int) a6 { return t.keys[i] }
func (t *t6) size() int   { return t.n }

// famView is one family of a Set's own tables: permanent and expiring singles, then
// permanent and expiring ranges.
type famView[K key[K]] struct {
	singles [2]keyTable[K]
	sexp    [2][]uint32 // nil: permanent
	ranges  [2]keyTable[K]
	rend    [2][]K
	rexp    [2][]uint32
}

func view4(s *Set) *famView[a4] {
	return &famView[a4]{
		singles: [2]keyTable[a4]{&s.p4.t, &s.e4.t},
		sexp:    [2][]uint32{nil, s.e4.exp},
		ranges:  [2]keyTable[a4]{&s.pr4.start, &s.er4.start},
		rend:    [2][]a4{s.pr4.end, s.er4.end},
		rexp:    [2][]uint32{nil, s.er4.exp},
	}
}

func view6(s *Set) *famView[a6] {
	return &famView[a6]{
		singles: [2]keyTable[a6]{&s.p6.t, &s.e6.t},
		sexp:    [2][]uint32{nil, s.e6.exp},
		ranges:  [2]keyTable[a6]{&s.pr6.start, &s.er6.start},
		rend:    [2][]a6{s.pr6.end, s.er6.end},
		rexp:    [2][]uint32{nil, s.er6.exp},
	}
}

func isMin[K key[K]](k K) bool {
	var zero K
	return k == zero
}

// firstFrom is the position of the first key at or above lo.
func firstFrom[K key[K]](t keyTable[K], lo K) int {
	if isMin(lo) {
		return 0
	}
	return t.pred(lo.dec()) + 1
}

// entries appends the table entries meeting [lo, hi] as spans, unordered between
// tables.
func (v *famView[K]) entries(dst []span[K], lo, hi K) []span[K] {
	for k, t := range v.singles {
		if t.size() == 0 {
			continue
		}
		for i, end := firstFrom(t, lo), t.pred(hi); i <= end; i++ {
			key := t.at(i)
			sp := span[K]{key, key, expPermanent}
			if v.sexp[k] != nil {
				sp.exp = v.sexp[k][i]
			}
			dst = append(dst, sp)
		}
	}
	for k, t := range v.ranges {
		if t.size() == 0 {
			continue
		}
		i := t.pred(lo)
		if i < 0 || v.rend[k][i].less(lo) {
			i++
		}
		for end := t.pred(hi); i <= end; i++ {
			sp := span[K]{t.at(i), v.rend[k][i], expPermanent}
			if v.rexp[k] != nil {
				sp.exp = v.rexp[k][i]
			}
			dst = append(dst, sp)
		}
	}
	return dst
}

// spansIn appends the merged spans of the tables that meet [lo, hi], whole.
func (v *famView[K]) spansIn(dst []span[K], lo, hi K) []span[K] {
	// One address either side: a span of two addresses is kept as two singles,
	// which coalesce finds only if both are read.
	elo, ehi := lo, hi
	if !isMin(elo) {
		elo = elo.dec()
	}
	if !ehi.isMax() {
		ehi = ehi.inc()
	}
	start := len(dst)
	dst = v.entries(dst, elo, ehi)
	got := dst[start:]
	sortSpans(got)
	got = coalesce(got)
	w := 0
	for _, sp := range got {
		if !sp.hi.less(lo) && !hi.less(sp.lo) {
			got[w] = sp
			w++
		}
	}
	return dst[:start+w]
}

// count adds the table entries lying in [lo, hi] to st, which the windows never
// cut.
func (v *famView[K]) count(st *Stats, v4 bool, lo, hi K) {
	for k, t := range v.singles {
		if t.size() == 0 {
			continue
		}
		n := t.pred(hi) - firstFrom(t, lo) + 1
		if v4 {
			st.V4Addrs += n
		} else {
			st.V6Addrs += n
		}
		if k == 1 {
			st.Expiring += n
		}
	}
	for k, t := range v.ranges {
		if t.size() == 0 {
			continue
		}
		n := t.pred(hi) - firstFrom(t, lo) + 1
		if v4 {
			st.V4Ranges += n
		} else {
			st.V6Ranges += n
		}
		if k == 1 {
			st.Expiring += n
		}
	}
}

func sortSpans[K key[K]](s []span[K]) {
	// Short lists of a few tables' entries: insertion sort.
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].lo.less(s[j-1].lo); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// unionWindows merges sorted windows that overlap or touch.
func unionWindows[K key[K]](w []span[K]) []span[K] {
	if len(w) == 0 {
		return w
	}
	out := w[:1]
	for _, x := range w[1:] {
		last := &out[len(out)-1]
		if !last.hi.isMax() && last.hi.inc().less(x.lo) {
			out = append(out, x)
			continue
		}
		if last.hi.less(x.hi) {
			last.hi = x.hi
		}
	}
	return out
}

// patchFam computes one family's new windows and patch: win and patch are the
// overlay's (nil for none), rm the delta's removals (normalized), add its additions
// (sorted by lo), now the time expiry is judged at. The results are taken from sc.
//
// It adds the entries of the base in the new windows but not the old to in.
func patchFam[K key[K]](sc *scratch, v *famView[K], in *Stats, v4 bool, win, patch, rm, add []span[K]) (newWin, cur []span[K]) {
	if len(rm) == 0 && len(add) == 0 {
		return win, patch
	}
	// What the delta touches, one address wider either side so that what it adds
	// meets the entries it may merge with.
	touched := merge(sc, rm, add)
	t := grab[span[K]](sc, len(touched))
	for _, sp := range touched {
		lo, hi := sp.lo, sp.hi
		if !isMin(lo) {
			lo = lo.dec()
		}
		if !hi.isMax() {
			hi = hi.inc()
		}
		t = append(t, span[K]{lo: lo, hi: hi})
	}
	t = unionWindows(t)
	// Widened to the whole entries of the base they meet.
	var buf []span[K]
	for i := range t {
		buf = v.spansIn(buf[:0], t[i].lo, t[i].hi)
		if len(buf) > 0 {
			if buf[0].lo.less(t[i].lo) {
				t[i].lo = buf[0].lo
			}
			if t[i].hi.less(buf[len(buf)-1].hi) {
				t[i].hi = buf[len(buf)-1].hi
			}
		}
	}
	newWin = unionWindows(merge(sc, win, unionWindows(t)))
	// The list inside the new windows: the patch inside the old ones, the base in
	// the rest.
	cur = grab[span[K]](sc, len(patch)+2*len(touched)+16)
	pi, wi := 0, 0
	for _, z := range newWin {
		pos := z.lo // the first address of z not yet read
		for more := true; more; {
			if wi == len(win) || z.hi.less(win[wi].lo) {
				cur = v.spansIn(cur, pos, z.hi)
				v.count(in, v4, pos, z.hi)
				break
			}
			w := win[wi] // an old window, inside z
			if pos.less(w.lo) {
				cur = v.spansIn(cur, pos, w.lo.dec())
				v.count(in, v4, pos, w.lo.dec())
			}
			for pi < len(patch) && !w.hi.less(patch[pi].lo) {
				cur = append(cur, patch[pi])
				pi++
			}
			wi++
			if more = w.hi != z.hi; more {
				pos = w.hi.inc()
			}
		}
	}
	return newWin, cur
}

// windowSpans returns windows as spans (their expiry unused), taken from sc.
func windowSpans[K key[K]](sc *scratch, starts []K, ends []K) []span[K] {
	out := grab[span[K]](sc, len(starts))
	for i, k := range starts {
		out = append(out, span[K]{lo: k, hi: ends[i]})
	}
	return out
}

func (o *overlay) windows4(sc *scratch) []span[a4] {
	if o == nil {
		return nil
	}
	return windowSpans(sc, o.w4.appendKeys(grab[a4](sc, o.w4.n)), o.w4end)
}

func (o *overlay) windows6(sc *scratch) []span[a6] {
	if o == nil {
		return nil
	}
	return windowSpans(sc, o.w6.keys, o.w6end)
}

// applyOverlay returns s changed by the removals rm (normalized) and additions add
// (sorted by lo) of each family, with expiry judged at now, as an overlay on s's
// tables. Entries expired at now are dropped inside the new windows only.
func (s *Set) applyOverlay(sc *scratch, rm4, add4 []span[a4], rm6, add6 []span[a6], now uint32) *Set {
	var win4, patch4 []span[a4]
	var win6, patch6 []span[a6]
	var in Stats
	if s.ov != nil {
		win4, win6 = s.ov.windows4(sc), s.ov.windows6(sc)
		patch4, patch6 = s.ov.patch.spans4(sc), s.ov.patch.spans6(sc)
		in = s.ov.in
	}
	v4, v6 := view4(s), view6(s)
	w4, c4 := patchFam(sc, v4, &in, true, win4, patch4, rm4, add4)
	w6, c6 := patchFam(sc, v6, &in, false, win6, patch6, rm6, add6)
	c4 = normalize(sc, merge(sc, subtract(sc, c4, rm4), add4), now)
	c6 = normalize(sc, merge(sc, subtract(sc, c6, rm6), add6), now)

	ov := &overlay{patch: newSet(sc, c4, c6)}
	starts4 := grab[a4](sc, len(w4))
	ov.w4end = make([]a4, len(w4))
	for i, w := range w4 {
		starts4 = append(starts4, w.lo)
		ov.w4end[i] = w.hi
	}
	ov.w4 = newT4(starts4)
	ov.has4 = make([]uint64, 1<<(32-filterShift)/64)
	for _, w := range w4 {
		for b := w.lo >> filterShift; b <= w.hi>>filterShift; b++ {
			ov.has4[b>>6] |= 1 << (b & 63)
		}
	}
	starts6 := make([]a6, len(w6))
	ov.w6end = make([]a6, len(w6))
	for i, w := range w6 {
		starts6[i], ov.w6end[i] = w.lo, w.hi
	}
	ov.w6 = newT6(starts6)

	ov.in = in
	base, p := s.baseStats(), ov.patch.Stats()
	ov.st = Stats{
		V4Addrs:  base.V4Addrs - in.V4Addrs + p.V4Addrs,
		V4Ranges: base.V4Ranges - in.V4Ranges + p.V4Ranges,
		V6Addrs:  base.V6Addrs - in.V6Addrs + p.V6Addrs,
		V6Ranges: base.V6Ranges - in.V6Ranges + p.V6Ranges,
		Expiring: base.Expiring - in.Expiring + p.Expiring,
	}
	ov.n = ov.st.V4Addrs + ov.st.V4Ranges + ov.st.V6Addrs + ov.st.V6Ranges
	ov.size = len(w4) + len(w6) + ov.patch.Len()

	out := *s
	out.ov = ov
	return &out
}

// flat returns a Set without an overlay holding what s holds, less the entries
// expired at now: s itself when it has no overlay. Each table is the base's less
// what lies in the windows, merged with the patch's (as WriteBinary writes them),
// with no sorting nor merging of spans: a third of the work of a rebuild.
func (s *Set) flat(now uint32) *Set {
	if s == nil || s.ov == nil {
		return s
	}
	var sc scratch
	defer sc.free()
	sec := writeSections(&sc, s)
	for i := numKinds; i < 2*numKinds; i++ { // the expiring tables
		sec[i].dropExpired(now)
	}
	out := &Set{
		p4:  singles4{t: newT4(sec[0].k4)},
		pr4: ranges4{start: newT4(sec[1].k4), end: cloneYielding(sec[1].end4)},
		p6:  singles6{t: newT6(cloneYielding(sec[2].k6))},
		pr6: ranges6{start: newT6(cloneYielding(sec[3].k6)), end: cloneYielding(sec[3].end6)},
		e4:  singles4{t: newT4(sec[4].k4), exp: cloneYielding(sec[4].exp)},
		er4: ranges4{start: newT4(sec[5].k4), end: cloneYielding(sec[5].end4), exp: cloneYielding(sec[5].exp)},
		e6:  singles6{t: newT6(cloneYielding(sec[6].k6)), exp: cloneYielding(sec[6].exp)},
		er6: ranges6{start: newT6(cloneYielding(sec[7].k6)), end: cloneYielding(sec[7].end6), exp: cloneYielding(sec[7].exp)},
	}
	out.others4 = out.pr4.start.n + out.e4.t.n + out.er4.start.n
	return out
}

// dropExpired removes the entries of an expiring section expired at now, in place;
// the expiries of an emptied section are nil, as a build leaves them.
func (sec *section) dropExpired(now uint32) {
	w := 0
	for i, e := range sec.exp {
		if e <= now {
			continue
		}
		if sec.k4 != nil {
			sec.k4[w] = sec.k4[i]
			if sec.end4 != nil {
				sec.end4[w] = sec.end4[i]
			}
		} else {
			sec.k6[w] = sec.k6[i]
			if sec.end6 != nil {
				sec.end6[w] = sec.end6[i]
			}
		}
		sec.exp[w] = e
		w++
	}
	switch {
	case sec.k4 != nil:
		sec.k4 = sec.k4[:w]
		if sec.end4 != nil {
			sec.end4 = sec.end4[:w]
		}
	case sec.k6 != nil:
		sec.k6 = sec.k6[:w]
		if sec.end6 != nil {
			sec.end6 = sec.end6[:w]
		}
	}
	sec.exp = sec.exp[:w]
	if w == 0 {
		sec.exp = nil
	}
}

// unexpired drops the spans expired at now, in place.
func unexpired[K key[K]](s []span[K], now uint32) []span[K] {
	w := 0
	for _, sp := range s {
		if sp.exp > now {
			s[w] = sp
			w++
		}
	}
	return s[:w]
}
