package clientip

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseAddr(t *testing.T) {
	good := []struct{ in, want string }{
		{"1.2.3.4", "1.2.3.4"},
		{"0.0.0.0", "0.0.0.0"},
		{"255.255.255.255", "255.255.255.255"},
		{"  203.0.113.7\t", "203.0.113.7"},
		{"1.2.3.4:80", "1.2.3.4"},
		{"1.2.3.4:0", "1.2.3.4"},
		{"1.2.3.4:65535", "1.2.3.4"},
		{" 1.2.3.4:443 ", "1.2.3.4"},
		{"2001:db8::1", "2001:db8::1"},
		{"2001:DB8::A", "2001:db8::a"},
		{"::", "::"},
		{"::1", "::1"},
		{"1::", "1::"},
		{"2001:db8:0:0:0:0:0:1", "2001:db8::1"},
		{"1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"[2001:db8::1]:443", "2001:db8::1"},
		{" [2001:db8::1]:443 ", "2001:db8::1"},
		{"fe80::1%eth0", "fe80::1"},
		{"fe80::1%25", "fe80::1"},
		{"[fe80::1%eth0]:8080", "fe80::1"},
		{"[fe80::1%25eth0]", "fe80::1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},           // mapped: unmapped
		{"[::ffff:192.0.2.1]:80", "192.0.2.1"},      // likewise
		{"64:ff9b::192.0.2.1", "64:ff9b::c000:201"}, // NAT64: stays IPv6
		{"1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:102:304"},
	}
	for _, tc := range good {
		got, ok := ParseAddr([]byte(tc.in))
		if !ok || got != netip.MustParseAddr(tc.want) {
			t.Errorf("ParseAddr(%q) = %v, %v; want %s", tc.in, got, ok, tc.want)
		}
		if got.Zone() != "" || got.Is4In6() {
			t.Errorf("ParseAddr(%q) = %v: zone or mapped address left", tc.in, got)
		}
	}

	bad := []string{
		"", " ", "\t",
		"unknown", "UNKNOWN", "_hidden", "localhost", "example.com",
		"1.2.3", "1.2.3.4.5", "1.2.3.256", "1.2.3.-1", "01.2.3.4", "1.2.3.04", "1..2.3", ".1.2.3", "1.2.3.",
		"1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:-1", "1.2.3.4:8o", "1.2.3.4 :80", "1.2.3.4: 80",
		"1.2.3.4%eth0", "1.2.3.4/24", "1.2.3.4 5.6.7.8",
		"[1.2.3.4]", "[1.2.3.4]:80", "[2001:db8::1", "2001:db8::1]", "[2001:db8::1]:", "[2001:db8::1]:x",
		"[2001:db8::1]80", "[2001:db8::1]:65536", "[[::1]]",
		"2001:db8::1:80:", ":::", "1:::2", "1::2::3", "12345::", "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7",
		"1:2:3:4:5:6:7:8::", "::1.2.3", "::1.2.3.4.5", "1.2.3.4::", "g::1",
		"fe80::1%", "[fe80::1%]", "%eth0",
		"\"1.2.3.4\"", "for=1.2.3.4", "1.2.3.4,5.6.7.8",
	}
	for _, in := range bad {
		if got, ok := ParseAddr([]byte(in)); ok {
			t.Errorf("ParseAddr(%q) = %v, want refusal", in, got)
		}
	}
}

// TestParseAddrMatchesNetip checks the hand-written address parsers against
// net/netip on the inputs of both tables, in every form ParseAddr accepts.
func TestParseAddrMatchesNetip(t *testing.T) {
	for _, s := range []string{
		"1.2.3.4", "01.2.3.4", "1.2.3.256", "::", "::1", "1::", "::ffff:1.2.3.4", "1:2:3:4:5:6:7:8",
		"1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:1.2.3.4",
		"1:2:3:4:5:6:7:1.2.3.4", "::1.2.3.4", "1::1.2.3.4", "0:0:0:0:0:0:0:0", "00000::",
		"fe80::1%x", "fe80::1%", "a:b:c:d:e:f:0:1", "A:B:C:D:E:F:0:1", "1:2::3:4::", "::ffff:1.2.3.04",
	} {
		want, ok := refParseAddr(s)
		got, gotOK := ParseAddr([]byte(s))
		if ok != gotOK || got != want {
			t.Errorf("ParseAddr(%q) = %v, %v; netip says %v, %v", s, got, gotOK, want, ok)
		}
	}
}

func TestParseAddrAllocs(t *testing.T) {
	inputs := [][]byte{[]byte("203.0.113.7"), []byte("[2001:db8::1]:443"), []byte("fe80::1%eth0"), []byte("unknown")}
	n := testing.AllocsPerRun(100, func() {
		for _, in := range inputs {
			ParseAddr(in)
		}
	})
	if n != 0 {
		t.Errorf("ParseAddr allocates %v times per run", n)
	}
}

// refParseAddr is ParseAddr written the obvious way over net/netip, for
// differential tests.
func refParseAddr(s string) (netip.Addr, bool) {
	s = strings.Trim(s, " \t")
	check := func(host string, v6 bool) (netip.Addr, bool) {
		a, err := netip.ParseAddr(host)
		if err != nil || a.Is6() != v6 {
			return netip.Addr{}, false
		}
		return a.WithZone("").Unmap(), true
	}
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		if rest := s[end+1:]; rest != "" && (rest[0] != ':' || !refPort(rest[1:])) {
			return netip.Addr{}, false
		}
		return check(s[1:end], true)
	}
	switch strings.Count(s, ":") {
	case 0:
		return check(s, false)
	case 1:
		host, port, _ := strings.Cut(s, ":")
		if !refPort(port) {
			return netip.Addr{}, false
		}
		return check(host, false)
	}
	return check(s, true)
}

func refPort(p string) bool {
	if p == "" {
		return false
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
	}
	n := 0
	for _, c := range p {
		n = n*10 + int(c-'0')
		if n > 65535 {
			return false
		}
	}
	return true
}
