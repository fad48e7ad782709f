package blacklist

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// model is the naive blacklist: the expiry of every address of two small universes,
// 10.0.0.0/16 and 2001:db8::/112 (0 absent, expPermanent never expires). Every
// entry of the property tests lies inside them, as /16 to /32 (/112 to /128).
type model struct {
	v4, v6 [1 << 16]uint32
}

var (
	base4 = addr("10.0.0.0")
	base6 = addr("2001:db8::")
)

func (m *model) cells(p netip.Prefix) (tab *[1 << 16]uint32, lo, hi int) {
	p = p.Masked()
	a := p.Addr().Unmap()
	if a.Is4() {
		off := int(addr4(a) - addr4(base4))
		return &m.v4, off, off + 1<<(32-p.Bits()) - 1
	}
	k := from16(a.As16())
	return &m.v6, int(k.lo & 0xffff), int(k.lo&0xffff) + 1<<(128-p.Bits()) - 1
}

func (m *model) add(p netip.Prefix, exp uint32) {
	if p.Addr().Is4In6() {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	tab, lo, hi := m.cells(p)
	for i := lo; i <= hi; i++ {
		tab[i] = max(tab[i], exp)
	}
}

func (m *model) remove(p netip.Prefix) {
	if p.Addr().Is4In6() {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	tab, lo, hi := m.cells(p)
	for i := lo; i <= hi; i++ {
		tab[i] = 0
	}
}

func (m *model) contains(a netip.Addr, now uint32) bool {
	a = a.Unmap()
	var e uint32
	switch {
	case a.Is4() && a.As4()[0] == 10 && a.As4()[1] == 0:
		e = m.v4[addr4(a)&0xffff]
	case a.Is6() && netip.PrefixFrom(base6, 112).Contains(a):
		e = m.v6[from16(a.As16()).lo&0xffff]
	}
	return e > now
}

// randPrefix draws a prefix inside the universes: mostly single addresses, some
// ranges of up to 256 addresses, a few of up to 4096, some written as IPv4-mapped
// IPv6. A few thousand of them cover a fraction of each universe.
func randPrefix(r *rand.Rand) netip.Prefix {
	off := uint32(r.IntN(1 << 16))
	bits := 0
	switch r.IntN(10) {
	case 0, 1:
		bits = 1 + r.IntN(8)
	case 2:
		if r.IntN(10) == 0 {
			bits = 9 + r.IntN(4)
		}
	}
	if r.IntN(3) == 0 {
		k := from16(base6.As16())
		k.lo |= uint64(off)
		return netip.PrefixFrom(k.addr(), 128-bits).Masked()
	}
	a := a4(uint32(addr4(base4)) | off).addr()
	if r.IntN(8) == 0 {
		return netip.PrefixFrom(netip.AddrFrom16(a.As16()), 128-bits).Masked()
	}
	return netip.PrefixFrom(a, 32-bits).Masked()
}

func randAddr(r *rand.Rand) netip.Addr {
	switch r.IntN(8) {
	case 0:
		return randV4(r)
	case 1:
		return randV6(r)
	case 2, 3, 4:
		k := from16(base6.As16())
		k.lo |= uint64(r.IntN(1 << 16))
		return k.addr()
	case 5:
		return netip.AddrFrom16(a4(uint32(addr4(base4)) | uint32(r.IntN(1<<16))).addr().As16())
	}
	return a4(uint32(addr4(base4)) | uint32(r.IntN(1<<16))).addr()
}

func randExp(r *rand.Rand, now uint32) uint32 {
	if r.IntN(3) == 0 {
		return now - 5 + uint32(r.IntN(20))
	}
	return expPermanent
}

// TestProperty builds random sets, changes them by random deltas, and checks 100k
// random lookups against the naive model at several times.
func TestProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 21))
	now := nowSeconds(t0)
	var m model
	var b Builder
	for range 3000 {
		p, e := randPrefix(r), randExp(r, now)
		m.add(p, e)
		b.Add(p, expTime(e))
	}
	s := b.BuildAt(t0)
	if st := s.Stats(); st.V4Ranges < 100 || st.V6Ranges < 100 || st.Expiring < 100 {
		t.Fatalf("the random set is too simple: %+v", st)
	}
	check := func(step string, lookups int) {
		t.Helper()
		hits := 0
		defer func() {
			if hits < lookups/10 || hits > lookups*9/10 {
				t.Errorf("%s: %d hits in %d lookups", step, hits, lookups)
			}
		}()
		for range lookups {
			a := randAddr(r)
			at := now + uint32(r.IntN(20))
			got, want := s.ContainsAt(a, time.Unix(int64(at), 0)), m.contains(a, at)
			if got != want {
				t.Fatalf("%s: %s at +%ds: contains %v, model %v", step, a, at-now, got, want)
			}
			if got {
				hits++
			}
		}
	}
	check("built", 60_000)
	for i := range 4 {
		var d Delta
		for range 300 {
			p, e := randPrefix(r), randExp(r, now)
			d.Add = append(d.Add, Entry{Prefix: p, Expires: expTime(e)})
		}
		for range 100 {
			d.Remove = append(d.Remove, randPrefix(r))
		}
		for _, p := range d.Remove {
			m.remove(p)
		}
		for _, e := range d.Add {
			m.add(e.Prefix, expSeconds(e.Expires))
		}
		var err error
		if s, err = s.apply(&d, now); err != nil {
			t.Fatal(err)
		}
		check("after delta "+string(rune('1'+i)), 10_000)
	}
}

// TestModerateSize checks a set of 200k random IPv4 and 50k IPv6 addresses and 5k
// IPv4 ranges against maps, through a build, the binary format and a delta.
func TestModerateSize(t *testing.T) {
	r := rand.New(rand.NewPCG(22, 22))
	in := map[netip.Addr]bool{}
	var b Builder
	for range 200_000 {
		a := randV4(r)
		in[a] = true
		b.AddAddr(a, time.Time{})
	}
	for range 50_000 {
		a := randV6(r)
		in[a] = true
		b.AddAddr(a, time.Time{})
	}
	var ranges []netip.Prefix
	for range 5000 {
		p := netip.PrefixFrom(randV4(r), 20+r.IntN(9)).Masked()
		ranges = append(ranges, p)
		b.Add(p, time.Time{})
	}
	inRange := func(a netip.Addr) bool {
		for _, p := range ranges {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	s := b.BuildAt(t0)
	s2, err := decodeBinary(encode(t, s), t0)
	if err != nil {
		t.Fatal(err)
	}
	// Remove a tenth of the single addresses: removing one inside a range punches
	// a hole in the range.
	var d Delta
	removed := map[netip.Addr]bool{}
	for a := range in {
		if r.IntN(10) == 0 {
			d.Remove = append(d.Remove, netip.PrefixFrom(a, a.BitLen()))
			removed[a] = true
		}
	}
	s3, err := s.apply(&d, nowSeconds(t0))
	if err != nil {
		t.Fatal(err)
	}
	probe := func(a netip.Addr) {
		want := in[a] || inRange(a)
		if s.ContainsAt(a, t0) != want || s2.ContainsAt(a, t0) != want {
			t.Fatalf("%s: built %v, read back %v, want %v", a, s.ContainsAt(a, t0), s2.ContainsAt(a, t0), want)
		}
		if got := s3.ContainsAt(a, t0); got != (want && !removed[a]) {
			t.Fatalf("after the delta, %s: %v, want %v", a, got, want && !removed[a])
		}
	}
	n := 0
	for a := range in {
		probe(a)
		if n++; n == 20_000 {
			break
		}
	}
	for a := range removed {
		probe(a)
	}
	for range 2000 {
		probe(randV4(r))
		probe(randV6(r))
	}
	for _, p := range ranges[:500] {
		probe(p.Addr())
		probe(p.Addr().Prev())
	}
}
