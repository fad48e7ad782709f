package trace

import (
	"bytes"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// ip4 is an Ethernet frame with an IPv4 header (TOS tos, protocol proto, source
// src) and a transport header of 20 bytes plus opts.
func ip4(tos byte, proto byte, src string, opts []byte) []byte {
	f := make([]byte, 14+20+20+len(opts))
	f[12], f[13] = 0x08, 0x00
	ip := f[14:]
	ip[0], ip[1], ip[9] = 0x45, tos, proto
	a := netip.MustParseAddr(src).As4()
	copy(ip[12:16], a[:])
	copy(ip[16:20], []byte{203, 0, 113, 10})
	tcp := ip[20:]
	tcp[12] = byte((20+len(opts))/4) << 4
	copy(tcp[20:], opts)
	return f
}

func ip6(tc byte, src string) []byte {
	f := make([]byte, 14+40+20)
	f[12], f[13] = 0x86, 0xdd
	ip := f[14:]
	ip[0], ip[1], ip[6] = 0x60|tc>>4, tc<<4, 17
	a := netip.MustParseAddr(src).As16()
	copy(ip[8:24], a[:])
	return f
}

func TestMarker(t *testing.T) {
	probe := netip.MustParsePrefix("192.0.2.0/28")
	for _, tc := range []struct {
		name  string
		cfg   Config
		frame []byte
		want  bool
	}{
		{"dscp", Config{DSCP: 46}, ip4(46<<2, 6, "198.51.100.1", nil), true},
		{"dscp with ECN bits", Config{DSCP: 46}, ip4(46<<2|3, 6, "198.51.100.1", nil), true},
		{"other dscp", Config{DSCP: 46}, ip4(45<<2, 6, "198.51.100.1", nil), false},
		{"unmarked", Config{DSCP: 46}, ip4(0, 6, "198.51.100.1", nil), false},
		{"ipv6 traffic class", Config{DSCP: 10}, ip6(10<<2, "2001:db8::1"), true},
		{"ipv6 other class", Config{DSCP: 10}, ip6(11<<2, "2001:db8::1"), false},
		{"source", Config{Sources: []netip.Prefix{probe}}, ip4(0, 17, "192.0.2.9", nil), true},
		{"other source", Config{Sources: []netip.Prefix{probe}}, ip4(0, 17, "192.0.2.19", nil), false},
		{"dscp and source", Config{DSCP: 8, Sources: []netip.Prefix{probe}}, ip4(8<<2, 6, "192.0.2.9", nil), true},
		{"dscp, not source", Config{DSCP: 8, Sources: []netip.Prefix{probe}}, ip4(8<<2, 6, "192.0.2.99", nil), false},
		{"source, not dscp", Config{DSCP: 8, Sources: []netip.Prefix{probe}}, ip4(0, 6, "192.0.2.9", nil), false},
		{"tcp option", Config{TCPOption: 253}, ip4(0, 6, "198.51.100.1", []byte{1, 1, 253, 4, 0, 0}), true},
		{"tcp option after mss", Config{TCPOption: 253}, ip4(0, 6, "198.51.100.1", []byte{2, 4, 5, 0xb4, 253, 2, 0, 0}), true},
		{"tcp option after end", Config{TCPOption: 253}, ip4(0, 6, "198.51.100.1", []byte{0, 0, 253, 2}), false},
		{"no tcp option", Config{TCPOption: 253}, ip4(0, 6, "198.51.100.1", []byte{2, 4, 5, 0xb4}), false},
		{"bad option length", Config{TCPOption: 253}, ip4(0, 6, "198.51.100.1", []byte{2, 0, 253, 2}), false},
		{"option on udp", Config{TCPOption: 253}, ip4(0, 17, "198.51.100.1", []byte{253, 2, 0, 0}), false},
		{"truncated", Config{DSCP: 46}, ip4(46<<2, 6, "198.51.100.1", nil)[:15], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMarker(&tc.cfg)
			if got := m.MatchFrame(tc.frame); got != tc.want {
				t.Errorf("MatchFrame = %v, want %v", got, tc.want)
			}
		})
	}
	if NewMarker(&Config{}) != nil {
		t.Error("a config with no criterion made a marker")
	}
}

func TestMarkerPeer(t *testing.T) {
	m := NewMarker(&Config{Sources: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}})
	f := ip4(0, 6, "203.0.113.10", nil)
	if m.Match(f, 14, 34, 6, netip.MustParseAddr("203.0.113.10")) {
		t.Error("a reply matched on its own source")
	}
	if !m.Match(f, 14, 34, 6, netip.MustParseAddr("192.0.2.5")) {
		t.Error("a reply to a probe server was not marked")
	}
	if !m.Match(f, 14, 34, 6, netip.MustParseAddr("::ffff:192.0.2.5")) {
		t.Error("an IPv4-mapped peer was not unmapped")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string // "" for valid
	}{
		{Config{}, ""},
		{Config{DSCP: 46}, ""},
		{Config{DSCP: 64}, "dscp: 64 is outside"},
		{Config{TCPOption: 1}, "tcp_option"},
		{Config{DSCP: 1, Records: 8}, "records: 8 is outside"},
		{Config{DSCP: 1, Records: 1 << 20}, "records"},
		{Config{DSCP: 1, SampleBytes: 257}, "sample_bytes"},
		{Config{DSCP: 1, Sources: []netip.Prefix{{}}}, "sources[0]: not a prefix"},
		{Config{Records: 64}, "no criterion"},
		{Config{DSCP: 1, LD: strings.Repeat("x", 65)}, "ld:"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
	d := Config{DSCP: 1}.WithDefaults(netip.MustParseAddr("198.18.0.2"))
	if d.LD == "" || d.Records != DefaultRecords || d.SampleBytes != DefaultSampleBytes {
		t.Errorf("defaults: %+v", d)
	}
	if z := (Config{}).WithDefaults(netip.MustParseAddr("198.18.0.2")); z.LD != "" || z.Records != 0 {
		t.Errorf("a config that traces nothing got defaults: %+v", z)
	}
}

func entry(i int) Entry {
	ld := "ld1"
	return Entry{
		Time: int64(i), Kind: KindDrop, Dir: 1, Result: 7, Proto: 6, SrcPort: uint16(i), DstPort: 443,
		Len: 60, Src: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), Dst: netip.MustParseAddr("2001:db8::10"),
		LD: &ld, Sample: bytes.Repeat([]byte{byte(i)}, 200),
	}
}

func TestRingBounds(t *testing.T) {
	r := NewRing(16, 20)
	if got := r.Read(nil, 0); len(got) != 0 {
		t.Fatalf("empty ring read %d records", len(got))
	}
	for i := range 40 {
		e := entry(i)
		r.Put(&e)
	}
	got := r.Read(nil, 0)
	if len(got) != 16 {
		t.Fatalf("read %d records from a ring of 16, want 16", len(got))
	}
	for k, e := range got {
		i := 39 - k // newest first
		if e.Time != int64(i) || e.SrcPort != uint16(i) || e.Src != netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}) {
			t.Fatalf("record %d: %+v, want record %d", k, e, i)
		}
		if e.Dst != netip.MustParseAddr("2001:db8::10") || e.HopAddr.IsValid() || e.HopName != nil {
			t.Fatalf("record %d: dst %v hop %v %v", k, e.Dst, e.HopAddr, e.HopName)
		}
		if !bytes.Equal(e.Sample, bytes.Repeat([]byte{byte(i)}, 20)) {
			t.Fatalf("record %d: sample %x, want 20 bytes of %02x", k, e.Sample, i)
		}
		if e.LD == nil || *e.LD != "ld1" || e.Kind != KindDrop || e.Result != 7 || e.Dir != 1 || e.Proto != 6 || e.Len != 60 {
			t.Fatalf("record %d: %+v", k, e)
		}
	}
	if got := r.Read(nil, 5); len(got) != 5 || got[0].Time != 39 {
		t.Fatalf("limit 5: %d records, first %v", len(got), got)
	}
	// Memory is what the documentation says: 80 bytes plus the sample (rounded up
	// to 8) per record.
	if got, want := r.Bytes(), 16*(80+24+16); got != want {
		t.Errorf("ring of 16 with 20-byte samples uses %d bytes, want %d", got, want)
	}
	if d := NewRing(DefaultRecords, DefaultSampleBytes).Bytes(); d > 224<<10 {
		t.Errorf("the default ring uses %d bytes", d)
	}
}

func TestRingShortSample(t *testing.T) {
	r := NewRing(16, 128)
	e := entry(3)
	e.Sample = []byte{1, 2, 3}
	hop := "l7/a"
	e.HopName, e.Hop, e.HopAddr = &hop, 9, netip.MustParseAddr("198.18.1.11")
	r.Put(&e)
	got := r.Read(nil, 0)
	if len(got) != 1 || !bytes.Equal(got[0].Sample, []byte{1, 2, 3}) {
		t.Fatalf("got %+v", got)
	}
	if got[0].HopName == nil || *got[0].HopName != "l7/a" || got[0].Hop != 9 || got[0].HopAddr != e.HopAddr {
		t.Fatalf("hop: %+v", got[0])
	}
}

// TestRingConcurrent reads while the writer overwrites: every record read is whole
// (its fields agree with each other), and the race detector sees no race.
func TestRingConcurrent(t *testing.T) {
	r := NewRing(16, 64)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			e := entry(i % 250)
			e.Time = int64(i)
			r.Put(&e)
		}
	}()
	deadline := time.Now().Add(300 * time.Millisecond)
	reads := 0
	for time.Now().Before(deadline) {
		for _, e := range r.Read(nil, 0) {
			i := byte(e.SrcPort)
			if e.Src != netip.AddrFrom4([4]byte{192, 0, 2, i}) || !bytes.Equal(e.Sample, bytes.Repeat([]byte{i}, 64)) {
				t.Fatalf("torn record: %+v", e)
			}
			reads++
		}
	}
	close(stop)
	wg.Wait()
	if reads == 0 {
		t.Fatal("no record read")
	}
}

func names() *Names {
	return &Names{
		Dir:    func(d uint8) string { return []string{"in", "out", "local"}[d] },
		Result: func(r uint8) string { return []string{"forwarded", "local", "no_rule", "blacklisted"}[r] },
		Action: func(d uint8) string { return []string{"tunnel", "reply", "local"}[d] },
		Out:    1,
	}
}

func TestSelect(t *testing.T) {
	ld := "ld1"
	mk := func(ts int64, kind Kind, dir, res uint8, src, dst string) Point {
		e := Entry{Time: ts, Kind: kind, Dir: dir, Result: res, Proto: 6, LD: &ld,
			Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Sample: []byte{0x45, 0}}
		return PointOf(&e, 0, names())
	}
	pts := []Point{
		mk(1, KindTrace, 0, 0, "192.0.2.1", "203.0.113.10"),
		mk(4, KindDrop, 0, 2, "192.0.2.1", "203.0.113.10"),
		mk(3, KindTrace, 1, 0, "203.0.113.10", "192.0.2.1"),
		mk(2, KindDrop, 0, 3, "198.51.100.7", "203.0.113.10"),
		mk(5, KindDrop, 0, 2, "198.51.100.7", "203.0.113.10"),
	}
	if pts[0].Action != "tunnel" || pts[1].Reason != "no_rule" || pts[1].Action != "" || pts[1].Sample != "4500" || pts[0].LD != "ld1" {
		t.Fatalf("points: %+v", pts[:2])
	}
	times := func(ps []Point) (s []int64) {
		for _, p := range ps {
			s = append(s, p.Time.UnixNano())
		}
		return s
	}
	for _, tc := range []struct {
		query string
		want  []int64
	}{
		{"", []int64{5, 4, 3, 2, 1}},
		{"limit=2", []int64{5, 4}},
		{"src=192.0.2.1", []int64{4, 3, 1}}, // the reply (3) is to the probe
		{"src=198.51.100.0/24", []int64{5, 2}},
		{"reason=no_rule", []int64{5, 4}},
		{"reason=no_rule&src=192.0.2.1", []int64{4}},
		{"kind=trace", []int64{3, 1}},
		{"kind=drop&limit=1", []int64{5}},
		{"src=::ffff:192.0.2.1", []int64{4, 3, 1}},
	} {
		q, _ := url.ParseQuery(tc.query)
		f, err := ParseQuery(q)
		if err != nil {
			t.Fatalf("%q: %v", tc.query, err)
		}
		got := times(Select(append([]Point(nil), pts...), f))
		if !slicesEqual(got, tc.want) {
			t.Errorf("%q: %v, want %v", tc.query, got, tc.want)
		}
	}
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParseQueryErrors(t *testing.T) {
	for _, q := range []string{
		"src=nonsense", "src=192.0.2.0/33", "src=fe80::1%25eth0", "kind=all", "reason=No-Rule",
		"reason=", "limit=0", "limit=x", "limit=99999999999", "other=1", "src=1.2.3.4&src=1.2.3.5",
	} {
		v, _ := url.ParseQuery(q)
		if _, err := ParseQuery(v); err == nil {
			t.Errorf("%q was accepted", q)
		}
	}
}
