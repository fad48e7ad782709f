package clientip

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/tiergate/tiergate/internal/config"
)

// prefixTable is a set of addresses given as CIDRs, compiled to sorted, disjoint
// ranges, one table per family; a lookup is a binary search. It is never modified
// after it is built.
type prefixTable struct {
	v4 []range4
	v6 []range6
}

type range4 struct{ lo, hi uint32 }

type range6 struct{ lo, hi u128 }

type u128 struct{ hi, lo uint64 }

func (a u128) cmp(b u128) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	return cmp.Compare(a.lo, b.lo)
}

func (a u128) next() (u128, bool) {
	if a.lo != ^uint64(0) {
		return u128{a.hi, a.lo + 1}, true
	}
	if a.hi != ^uint64(0) {
		return u128{a.hi + 1, 0}, true
	}
	return a, false
}

func u128Of(a netip.Addr) u128 {
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func u32Of(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// parsePrefix reads one entry of a trusted list: a CIDR with no host bits set, or a
// single address. IPv4-mapped IPv6 prefixes of /96 and longer are read as IPv4, since
// lookups unmap addresses.
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q: bad address", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q: bad CIDR", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("%q: host bits are set (the network is %s)", s, m)
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p, nil
}

// compilePrefixes builds the table for a trusted list; field names the list in errors
// ("trusted_proxies").
func compilePrefixes(field string, list []string) (*prefixTable, error) {
	t := &prefixTable{}
	for i, s := range list {
		p, err := parsePrefix(s)
		if err != nil {
			return nil, &config.FieldError{Path: config.Index(field, i), Err: err}
		}
		a := p.Addr()
		if a.Is4() {
			lo := u32Of(a)
			hi := lo | uint32(uint64(1)<<(32-p.Bits())-1)
			t.v4 = append(t.v4, range4{lo, hi})
			continue
		}
		lo := u128Of(a)
		hi := lo
		if n := 128 - p.Bits(); n <= 64 {
			hi.lo |= uint64(1)<<n - 1 // n == 64: the shift gives 0, so all ones
		} else {
			hi.lo = ^uint64(0)
			hi.hi |= uint64(1)<<(n-64) - 1
		}
		t.v6 = append(t.v6, range6{lo, hi})
	}
	t.v4 = merge4(t.v4)
	t.v6 = merge6(t.v6)
	return t, nil
}

func merge4(rs []range4) []range4 {
	slices.SortFunc(rs, func(a, b range4) int { return cmp.Compare(a.lo, b.lo) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1].hi == ^uint32(0) || r.lo <= out[n-1].hi+1) {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return slices.Clip(out)
}

func merge6(rs []range6) []range6 {
	slices.SortFunc(rs, func(a, b range6) int { return a.lo.cmp(b.lo) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 {
			next, ok := out[n-1].hi.next()
			if !ok || r.lo.cmp(next) <= 0 {
				if r.hi.cmp(out[n-1].hi) > 0 {
					out[n-1].hi = r.hi
				}
				continue
			}
		}
		out = append(out, r)
	}
	return slices.Clip(out)
}

// contains reports whether a is in the set. Zones are ignored and IPv4-mapped IPv6
// addresses match IPv4 entries.
func (t *prefixTable) contains(a netip.Addr) bool {
	if a.Is4In6() {
		a = a.Unmap()
	}
	if a.Is4() {
		x := u32Of(a)
		rs := t.v4
		// The first range that starts above x; the one before it may hold x.
		lo, hi := 0, len(rs)
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			if rs[m].lo <= x {
				lo = m + 1
			} else {
				hi = m
			}
		}
		return lo > 0 && x <= rs[lo-1].hi
	}
	if !a.Is6() {
		return false
	}
	x := u128Of(a)
	rs := t.v6
	lo, hi := 0, len(rs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rs[m].lo.cmp(x) <= 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo > 0 && x.cmp(rs[lo-1].hi) <= 0
}

// size is the number of disjoint ranges in the table.
func (t *prefixTable) size() int { return len(t.v4) + len(t.v6) }
