package blacklist

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func pfx(s string) netip.Prefix {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p
	}
	a := netip.MustParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen())
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

type entrySpec struct {
	p   string
	ttl time.Duration // 0: permanent
}

func buildAt(now time.Time, entries ...entrySpec) *Set {
	var b Builder
	for _, e := range entries {
		var exp time.Time
		if e.ttl != 0 {
			exp = now.Add(e.ttl)
		}
		b.Add(pfx(e.p), exp)
	}
	return b.BuildAt(now)
}

func TestSetContains(t *testing.T) {
	tests := []struct {
		name    string
		entries []entrySpec
		in, out []string
	}{
		{"empty", nil, nil, []string{"0.0.0.0", "203.0.113.7", "::", "2001:db8::1"}},
		{"exact v4", []entrySpec{{p: "203.0.113.7"}, {p: "203.0.113.9/32"}},
			[]string{"203.0.113.7", "203.0.113.9"},
			[]string{"203.0.113.6", "203.0.113.8", "203.0.113.10", "2001:db8::1"}},
		{"exact v6", []entrySpec{{p: "2001:db8::1"}, {p: "2001:db8::3/128"}},
			[]string{"2001:db8::1", "2001:db8::3"},
			[]string{"2001:db8::", "2001:db8::2", "2001:db8::4", "0.0.0.1"}},
		{"cidr v4 boundaries", []entrySpec{{p: "198.51.100.0/24"}},
			[]string{"198.51.100.0", "198.51.100.128", "198.51.100.255"},
			[]string{"198.51.99.255", "198.51.101.0"}},
		{"cidr v6 boundaries", []entrySpec{{p: "2001:db8:1::/48"}},
			[]string{"2001:db8:1::", "2001:db8:1:ffff:ffff:ffff:ffff:ffff"},
			[]string{"2001:db8:0:ffff:ffff:ffff:ffff:ffff", "2001:db8:2::"}},
		{"host bits masked", []entrySpec{{p: "198.51.100.77/24"}},
			[]string{"198.51.100.0", "198.51.100.255"}, []string{"198.51.101.0"}},
		{"ends of the space", []entrySpec{{p: "0.0.0.0/8"}, {p: "255.255.255.255"}, {p: "::/100"}, {p: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
			[]string{"0.0.0.0", "0.255.255.255", "255.255.255.255", "::", "::fff:ffff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
			[]string{"1.0.0.0", "255.255.255.254", "::1000:0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"}},
		{"everything v4", []entrySpec{{p: "0.0.0.0/0"}},
			[]string{"0.0.0.0", "127.0.0.1", "255.255.255.255", "::ffff:10.0.0.1"}, []string{"::1", "2001:db8::1"}},
		{"v4-mapped lookups", []entrySpec{{p: "203.0.113.7"}, {p: "198.51.100.0/24"}},
			[]string{"::ffff:203.0.113.7", "::ffff:198.51.100.1"}, []string{"::203.0.113.7", "64:ff9b::203.0.113.7"}},
		{"v4-mapped entries", []entrySpec{{p: "::ffff:203.0.113.7"}, {p: "::ffff:198.51.100.0/120"}},
			[]string{"203.0.113.7", "198.51.100.1", "::ffff:198.51.100.255"}, []string{"198.51.101.0", "::203.0.113.7"}},
		{"v6 prefix covering the mapped block", []entrySpec{{p: "::/80"}},
			[]string{"::1", "::ffff:1.2.3.4", "1.2.3.4"}, []string{"1::"}},
		{"zones ignored", []entrySpec{{p: "fe80::1"}},
			[]string{"fe80::1%eth0", "fe80::1"}, []string{"fe80::2%eth0"}},
		{"overlapping and adjacent merge", []entrySpec{{p: "10.0.0.0/24"}, {p: "10.0.0.128/25"}, {p: "10.0.1.0/24"}, {p: "10.0.0.5"}, {p: "10.0.2.0/31"}},
			[]string{"10.0.0.0", "10.0.1.255", "10.0.2.0", "10.0.2.1"}, []string{"10.0.2.2", "9.255.255.255"}},
		{"duplicates collapse", []entrySpec{{p: "192.0.2.1"}, {p: "192.0.2.1"}, {p: "::ffff:192.0.2.1"}},
			[]string{"192.0.2.1"}, []string{"192.0.2.2"}},
		{"expiring, not yet expired", []entrySpec{{p: "192.0.2.1", ttl: time.Hour}, {p: "2001:db8::/64", ttl: time.Hour}},
			[]string{"192.0.2.1", "2001:db8::5"}, []string{"192.0.2.2"}},
		{"already expired left out", []entrySpec{{p: "192.0.2.1", ttl: -time.Second}, {p: "192.0.2.0/24", ttl: -time.Hour}},
			nil, []string{"192.0.2.1", "192.0.2.5"}},
		{"permanent wins over expiring", []entrySpec{{p: "192.0.2.0/24", ttl: time.Second}, {p: "192.0.2.0/25"}},
			[]string{"192.0.2.0", "192.0.2.127", "192.0.2.128"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := buildAt(t0, tt.entries...)
			for _, a := range tt.in {
				if !s.ContainsAt(addr(a), t0) {
					t.Errorf("%s: not contained, want contained", a)
				}
			}
			for _, a := range tt.out {
				if s.ContainsAt(addr(a), t0) {
					t.Errorf("%s: contained, want not", a)
				}
			}
		})
	}
}

func TestSetExpiry(t *testing.T) {
	s := buildAt(t0,
		entrySpec{p: "192.0.2.1", ttl: 10 * time.Second},
		entrySpec{p: "192.0.2.0/24", ttl: 20 * time.Second},
		entrySpec{p: "2001:db8::1", ttl: 10 * time.Second},
		entrySpec{p: "2001:db8::/64", ttl: 20 * time.Second},
	)
	for _, tt := range []struct {
		at       time.Duration
		a        string
		contains bool
	}{
		{0, "192.0.2.1", true},
		{9 * time.Second, "192.0.2.1", true},
		{10 * time.Second, "192.0.2.1", true}, // the /24 still covers it
		{19 * time.Second, "192.0.2.200", true},
		{20 * time.Second, "192.0.2.1", false},
		{20 * time.Second, "192.0.2.200", false},
		{9 * time.Second, "2001:db8::1", true},
		{19 * time.Second, "2001:db8::1", true},
		{20 * time.Second, "2001:db8::1", false},
		{20 * time.Second, "2001:db8::2", false},
	} {
		if got := s.ContainsAt(addr(tt.a), t0.Add(tt.at)); got != tt.contains {
			t.Errorf("%s at +%v: contains %v, want %v", tt.a, tt.at, got, tt.contains)
		}
	}
	// The single address expires before the range covering it: it lives as long
	// as the range.
	s = buildAt(t0, entrySpec{p: "192.0.2.1", ttl: 30 * time.Second}, entrySpec{p: "192.0.2.0/24", ttl: 10 * time.Second})
	if !s.ContainsAt(addr("192.0.2.1"), t0.Add(15*time.Second)) || s.ContainsAt(addr("192.0.2.2"), t0.Add(15*time.Second)) {
		t.Error("the longer expiry of an address inside a shorter range was lost")
	}
	// A fraction of a second rounds up: the entry lives to the end of its second.
	var b Builder
	b.AddAddr(addr("192.0.2.1"), t0.Add(1500*time.Millisecond))
	s = b.BuildAt(t0)
	if !s.ContainsAt(addr("192.0.2.1"), t0.Add(time.Second)) || s.ContainsAt(addr("192.0.2.1"), t0.Add(2*time.Second)) {
		t.Error("expiry at +1.5s: want contained at +1s, gone at +2s")
	}
}

func TestSetStats(t *testing.T) {
	s := buildAt(t0,
		entrySpec{p: "10.0.0.1"}, entrySpec{p: "10.0.0.1"}, // duplicate
		entrySpec{p: "10.0.1.0/31"},                              // two addresses: kept as singles
		entrySpec{p: "10.1.0.0/16"}, entrySpec{p: "10.2.0.0/16"}, // adjacent: one range
		entrySpec{p: "10.9.0.0/24", ttl: time.Hour},
		entrySpec{p: "2001:db8::1"}, entrySpec{p: "2001:db8:1::/48", ttl: time.Hour},
	)
	want := Stats{V4Addrs: 3, V4Ranges: 2, V6Addrs: 1, V6Ranges: 1, Expiring: 2}
	if got := s.Stats(); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
	if s.Len() != 7 {
		t.Errorf("Len = %d, want 7", s.Len())
	}
	if s.Bytes() <= 0 {
		t.Errorf("Bytes = %d", s.Bytes())
	}
	var nilSet *Set
	if nilSet.Len() != 0 || nilSet.Contains(addr("10.0.0.1")) || nilSet.Bytes() != 0 {
		t.Error("a nil Set is not empty")
	}
}

func TestSetAll(t *testing.T) {
	exp := t0.Add(time.Hour)
	var b Builder
	b.Add(pfx("10.0.0.0/24"), time.Time{})
	b.Add(pfx("10.0.1.0/25"), time.Time{}) // merges: 10.0.0.0-10.0.1.127
	b.AddAddr(addr("192.0.2.9"), exp)
	b.Add(pfx("2001:db8::/127"), time.Time{})
	b.Add(pfx("2001:db8:1::/64"), exp)
	var got []string
	for e := range b.BuildAt(t0).All() {
		s := e.Prefix.String()
		if !e.Expires.IsZero() {
			s += " " + e.Expires.Format(time.RFC3339)
		}
		got = append(got, s)
	}
	want := []string{
		"10.0.0.0/24", "10.0.1.0/25",
		"192.0.2.9/32 2026-05-01T13:00:00Z",
		"2001:db8::/127", // two single addresses, listed as their prefix
		"2001:db8:1::/64 2026-05-01T13:00:00Z",
	}
	if !slices.Equal(got, want) {
		t.Errorf("All:\n got %q\nwant %q", got, want)
	}
}

func TestApply(t *testing.T) {
	base := buildAt(t0,
		entrySpec{p: "10.0.0.0/8"}, entrySpec{p: "192.0.2.1"}, entrySpec{p: "192.0.2.2"},
		entrySpec{p: "2001:db8::/32"}, entrySpec{p: "2001:db9::1"},
		entrySpec{p: "198.51.100.0/24", ttl: time.Hour},
	)
	tests := []struct {
		name    string
		d       Delta
		in, out []string
	}{
		{"remove an exact", Delta{Remove: []netip.Prefix{pfx("192.0.2.1"), pfx("2001:db9::1")}},
			[]string{"192.0.2.2", "10.1.2.3"}, []string{"192.0.2.1", "2001:db9::1"}},
		{"remove a CIDR out of a larger one", Delta{Remove: []netip.Prefix{pfx("10.1.0.0/16"), pfx("2001:db8:5::/48")}},
			[]string{"10.0.255.255", "10.2.0.0", "2001:db8:4:ffff::1", "2001:db8:6::"}, []string{"10.1.0.0", "10.1.255.255", "2001:db8:5::1"}},
		{"remove an address from a range", Delta{Remove: []netip.Prefix{pfx("10.0.0.0"), pfx("10.255.255.255")}},
			[]string{"10.0.0.1", "10.255.255.254"}, []string{"10.0.0.0", "10.255.255.255"}},
		{"remove a CIDR covering exacts", Delta{Remove: []netip.Prefix{pfx("192.0.2.0/24")}},
			nil, []string{"192.0.2.1", "192.0.2.2"}},
		{"remove what is absent", Delta{Remove: []netip.Prefix{pfx("203.0.113.0/24"), pfx("::1")}},
			[]string{"10.0.0.1", "192.0.2.1"}, nil},
		{"add", Delta{Add: []Entry{{Prefix: pfx("203.0.113.7")}, {Prefix: pfx("2001:dba::/64")}, {Prefix: pfx("::ffff:203.0.113.9")}}},
			[]string{"203.0.113.7", "203.0.113.9", "2001:dba::ffff", "10.0.0.1"}, []string{"203.0.113.8"}},
		{"removes go first, then adds", Delta{Remove: []netip.Prefix{pfx("10.0.0.0/8")}, Add: []Entry{{Prefix: pfx("10.1.2.3")}}},
			[]string{"10.1.2.3"}, []string{"10.1.2.2", "10.1.2.4"}},
		{"re-adding extends an expiry", Delta{Add: []Entry{{Prefix: pfx("198.51.100.0/25"), Expires: t0.Add(2 * time.Hour)}}},
			[]string{"198.51.100.1"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := base.apply(&tt.d, nowSeconds(t0))
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range tt.in {
				if !s.ContainsAt(addr(a), t0) {
					t.Errorf("%s: not contained, want contained", a)
				}
			}
			for _, a := range tt.out {
				if s.ContainsAt(addr(a), t0) {
					t.Errorf("%s: contained, want not", a)
				}
			}
			if !base.ContainsAt(addr("192.0.2.1"), t0) || !base.ContainsAt(addr("10.1.0.0"), t0) {
				t.Error("apply changed the set it started from")
			}
		})
	}

	s, _ := base.apply(&Delta{Add: []Entry{{Prefix: pfx("198.51.100.0/25"), Expires: t0.Add(2 * time.Hour)}}}, nowSeconds(t0))
	later := t0.Add(90 * time.Minute)
	if !s.ContainsAt(addr("198.51.100.1"), later) || s.ContainsAt(addr("198.51.100.200"), later) {
		t.Error("after re-adding half the range for longer: want only that half after the first expiry")
	}
	// Shortening an expiry takes a removal and an add.
	s, _ = base.apply(&Delta{Remove: []netip.Prefix{pfx("198.51.100.0/24")}, Add: []Entry{{Prefix: pfx("198.51.100.0/24"), Expires: t0.Add(time.Minute)}}}, nowSeconds(t0))
	if s.ContainsAt(addr("198.51.100.1"), t0.Add(2*time.Minute)) {
		t.Error("remove+add did not shorten the expiry")
	}
	// Expired entries are dropped when a delta is applied.
	s, _ = base.apply(&Delta{}, nowSeconds(t0.Add(2*time.Hour)))
	if got := s.Stats().Expiring; got != 0 {
		t.Errorf("%d expiring entries kept after they expired", got)
	}
	if _, err := base.apply(&Delta{Remove: []netip.Prefix{{}}}, 0); err == nil {
		t.Error("a delta removing an invalid prefix was applied")
	}
	if _, err := base.apply(&Delta{Add: []Entry{{}}}, 0); err == nil {
		t.Error("a delta adding an invalid prefix was applied")
	}
}
