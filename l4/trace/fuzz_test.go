package trace

import (
	"net/netip"
	"net/url"
	"testing"
)

// FuzzParseQuery: GET /trace's query never panics, and what it accepts has a limit
// in range and a reason of the allowed characters.
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"", "src=192.0.2.1", "src=2001:db8::/32&limit=5", "reason=no_rule&kind=drop",
		"limit=0", "src=::ffff:1.2.3.4/120", "src=1.2.3.4&src=5.6.7.8", "kind=trace&x=1", "%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := url.ParseQuery(s)
		if err != nil {
			return
		}
		fl, err := ParseQuery(q)
		if err != nil {
			return
		}
		if fl.Limit < 1 || fl.Limit > MaxLimit {
			t.Fatalf("%q: limit %d", s, fl.Limit)
		}
		for _, r := range fl.Reason {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
				t.Fatalf("%q: reason %q", s, fl.Reason)
			}
		}
		p := Point{client: netip.MustParseAddr("192.0.2.1")}
		fl.Keep(&p)
	})
}

// FuzzMatchFrame: the marker reads any frame within its bounds.
func FuzzMatchFrame(f *testing.F) {
	f.Add(ip4(46<<2, 6, "192.0.2.1", []byte{253, 2, 0, 0}))
	f.Add(ip4(0, 6, "192.0.2.1", []byte{2, 4, 5, 0xb4, 1, 0}))
	f.Add(ip6(10<<2, "2001:db8::1"))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0, 0, 1, 0x08, 0, 0x4f})
	ms := []*Marker{
		NewMarker(&Config{DSCP: 46}),
		NewMarker(&Config{TCPOption: 253}),
		NewMarker(&Config{DSCP: 46, TCPOption: 253, Sources: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}),
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		for _, m := range ms {
			m.MatchFrame(frame)
			m.Match(frame, 14, 34, 6, netip.Addr{})
		}
	})
}
