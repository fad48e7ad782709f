package clientip

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // the whole error text
	}{
		{"bad CIDR", Config{TrustedProxies: []string{"10.0.0.0/8", "192.0.2.1", "10.0.0.0/33"}},
			`trusted_proxies[2]: "10.0.0.0/33": bad CIDR`},
		{"garbage", Config{TrustedProxies: []string{"cdn"}}, `trusted_proxies[0]: "cdn": bad address`},
		{"host bits", Config{TrustedProxies: []string{"10.0.0.1/8"}},
			`trusted_proxies[0]: "10.0.0.1/8": host bits are set (the network is 10.0.0.0/8)`},
		{"zone", Config{TrustedProxies: []string{"fe80::1%eth0"}}, `trusted_proxies[0]: "fe80::1%eth0": bad address`},
		{"spaces", Config{TrustedProxies: []string{" 10.0.0.0/8"}}, `trusted_proxies[0]: " 10.0.0.0/8": bad CIDR`},
		{"proxy_trusted", Config{ProxyProtocol: true, ProxyTrusted: []string{"198.18.0.0/15", "2001:db8::/129"}},
			`proxy_trusted[1]: "2001:db8::/129": bad CIDR`},
		{"header alone", Config{Header: "X-Real-IP"},
			`header: "X-Real-IP" is set but trusted_proxies is empty, so no peer's header would be believed`},
		{"header name", Config{TrustedProxies: []string{"10.0.0.0/8"}, Header: "X Real IP"},
			`header: "X Real IP" is not a valid header name`},
		{"forwarded", Config{TrustedProxies: []string{"10.0.0.0/8"}, Header: "forwarded"},
			`header: "Forwarded" (RFC 7239) is not supported; use X-Forwarded-For or a single-value header`},
		{"max hops", Config{TrustedProxies: []string{"10.0.0.0/8"}, MaxHops: -1}, `max_hops: -1 is negative`},
		{"proxy without trusted", Config{ProxyProtocol: true},
			`proxy_trusted: required when proxy_protocol is on (a PROXY header from anyone would let them choose their address)`},
		{"trusted without proxy", Config{ProxyTrusted: []string{"10.0.0.0/8"}}, `proxy_trusted: set but proxy_protocol is off`},
		{"timeout without proxy", Config{ProxyTimeout: config.Duration(time.Second)}, `proxy_timeout: set but proxy_protocol is off`},
		{"negative timeout", Config{ProxyProtocol: true, ProxyTrusted: []string{"10.0.0.1"}, ProxyTimeout: config.Duration(-time.Second)},
			`proxy_timeout: -1s is negative`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.cfg)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("New() = %v, %v; want error %q", r, err, tc.want)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	r, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Config(); c.Header != "" || c.MaxHops != DefaultMaxHops || c.ProxyTimeout != 0 {
		t.Errorf("zero Config populated as %+v", c)
	}
	r, err = New(Config{TrustedProxies: []string{"10.0.0.0/8"}, ProxyProtocol: true, ProxyTrusted: []string{"10.1.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Config(); c.Header != HeaderXFF || c.MaxHops != 64 || c.ProxyTimeout.D() != 5*time.Second {
		t.Errorf("Config populated as %+v", c)
	}
	r, err = New(Config{TrustedProxies: []string{"10.0.0.0/8"}, Header: "true-client-ip"})
	if err != nil {
		t.Fatal(err)
	}
	if h := r.Config().Header; h != "True-Client-Ip" {
		t.Errorf("header %q, want the canonical True-Client-Ip", h)
	}
	r, err = New(Config{TrustedProxies: []string{"10.0.0.0/8"}, Header: "x-forwarded-for"})
	if err != nil || !r.xff {
		t.Errorf("x-forwarded-for not read as X-Forwarded-For: %v", err)
	}
}

func TestTrusted(t *testing.T) {
	r, err := New(Config{TrustedProxies: []string{
		"10.0.0.0/8", "10.1.0.0/16", // nested: merged
		"192.0.2.0/25", "192.0.2.128/25", // adjacent: merged
		"198.51.100.7",
		"::ffff:203.0.113.0/120", // mapped: read as 203.0.113.0/24
		"2001:db8::/32",
		"2001:db8:ffff::/48", // nested
		"2400:cb00::/64",
		"2400:cb01::/65",
		"fe80::1",
		"255.255.255.255/32",
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.trusted.size(); got != 9 { // 5 IPv4, 4 IPv6
		t.Errorf("%d ranges after merging, want 9", got)
	}
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"10.0.0.0", true}, {"10.255.255.255", true}, {"9.255.255.255", false}, {"11.0.0.0", false},
		{"192.0.2.0", true}, {"192.0.2.127", true}, {"192.0.2.128", true}, {"192.0.2.255", true}, {"192.0.3.0", false},
		{"198.51.100.7", true}, {"198.51.100.6", false}, {"198.51.100.8", false},
		{"203.0.113.9", true}, {"::ffff:203.0.113.9", true}, {"::ffff:10.0.0.1", true}, {"203.0.114.0", false},
		{"255.255.255.255", true}, {"0.0.0.0", false},
		{"2001:db8::", true}, {"2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", true}, {"2001:db9::", false}, {"2001:db7:ffff::", false},
		{"2400:cb00::1", true}, {"2400:cb00::ffff:ffff:ffff:ffff", true}, {"2400:cb00:0:1::", false},
		{"2400:cb01::7fff:ffff:ffff:ffff", true}, {"2400:cb01::8000:0:0:0", false},
		{"fe80::1", true}, {"fe80::1%eth0", true}, {"fe80::2", false},
		{"::", false}, {"::a00:1", false}, // ::10.0.0.1 is not mapped: no IPv4 match
	} {
		if got := r.Trusted(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Trusted(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	if r.Trusted(netip.Addr{}) {
		t.Error("the zero Addr is trusted")
	}
	var nilR *Resolver
	if nilR.Trusted(netip.MustParseAddr("10.0.0.1")) {
		t.Error("a nil Resolver trusts")
	}

	all, err := New(Config{TrustedProxies: []string{"0.0.0.0/0", "::/0"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"0.0.0.0", "255.255.255.255", "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"} {
		if !all.Trusted(netip.MustParseAddr(a)) {
			t.Errorf("/0 does not hold %s", a)
		}
	}
}

func isTrusted(prefixes ...string) func(netip.Addr) bool {
	var ps []netip.Prefix
	for _, p := range prefixes {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	return func(a netip.Addr) bool {
		for _, p := range ps {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
}

// Addresses of the tables: T… are trusted proxies (a CDN's edges), C… are not.
const (
	C1 = "203.0.113.7"
	C2 = "198.51.100.9"
	C6 = "2001:db8:c::1"
	T1 = "10.0.0.1"
	T2 = "10.0.0.2"
	T6 = "2001:db8:7::1"
)

func TestParseXFF(t *testing.T) {
	trusted := isTrusted("10.0.0.0/8", "2001:db8:7::/48")
	hops300 := strings.TrimSuffix(strings.Repeat("10.0.0.9, ", 299), ", ")
	for _, tc := range []struct {
		name    string
		values  []string
		maxHops int
		want    string // "" = no answer
	}{
		{"none", nil, 0, ""},
		{"one client", []string{C1}, 0, C1},
		{"client then proxies", []string{C1 + ", " + T1 + ", " + T2}, 0, C1},
		{"rightmost untrusted wins", []string{C2 + ", " + C1 + ", " + T1}, 0, C1},
		{"forged left part ignored", []string{"1.1.1.1, 8.8.8.8, " + C1}, 0, C1},
		{"no spaces", []string{C1 + "," + T1}, 0, C1},
		{"tabs and spaces", []string{"\t" + C1 + " ,\t" + T1 + "  "}, 0, C1},
		{"lines concatenated", []string{C2, C1, T1 + ", " + T2}, 0, C1},
		{"lines, client in the last", []string{C2 + ", " + T1, C1}, 0, C1},
		{"IPv6", []string{C6 + ", " + T6}, 0, C6},
		{"IPv6 brackets and port", []string{"[" + C6 + "]:443, [" + T6 + "]:80"}, 0, C6},
		{"IPv4 with port", []string{C1 + ":51234, " + T1 + ":443"}, 0, C1},
		{"zone dropped", []string{"fe80::1%eth0, " + T1}, 0, "fe80::1"},
		{"mapped IPv4 unmapped", []string{"::ffff:" + C1 + ", ::ffff:" + T1}, 0, C1},
		{"all trusted: leftmost", []string{T2 + ", " + T1}, 0, T2},
		{"all trusted over lines", []string{T6, T2 + ", " + T1}, 0, T6},
		{"unknown stops: trusted right of it", []string{C2 + ", unknown, " + T2 + ", " + T1}, 0, T2},
		{"unknown rightmost: nothing", []string{C2 + ", unknown"}, 0, ""},
		{"unknown left of the client: irrelevant", []string{"unknown, " + C1 + ", " + T1}, 0, C1},
		{"empty element stops", []string{C2 + ",, " + T1}, 0, T1},
		{"trailing comma: nothing", []string{C1 + ", " + T1 + ","}, 0, ""},
		{"empty line: nothing", []string{C1, ""}, 0, ""},
		{"empty line left: irrelevant", []string{"", C1}, 0, C1},
		{"spaces only", []string{"   "}, 0, ""},
		{"garbage stops", []string{C2 + ", <script>, " + T1}, 0, T1},
		{"hostname stops", []string{C2 + ", proxy.example, " + T1}, 0, T1},
		{"obfuscated stops", []string{C2 + ", _gazonk, " + T1}, 0, T1},
		{"port 99999 stops", []string{C2 + ", " + C1 + ":99999, " + T1}, 0, T1},
		{"leading zero stops", []string{C2 + ", 010.0.0.1, " + T1}, 0, T1},
		{"300 hops, client left of them, limit 64", []string{C1 + ", " + hops300}, 0, "10.0.0.9"},
		{"300 hops, client left of them, limit 300", []string{C1 + ", " + hops300}, 300, C1},
		{"300 hops, client left of them, limit 299", []string{C1 + ", " + hops300}, 299, "10.0.0.9"},
		{"300 hops then client", []string{hops300 + ", " + C1}, 0, C1},
		{"limit 1: rightmost only", []string{C1 + ", " + T1}, 1, T1},
		{"limit 2", []string{C1 + ", " + T2 + ", " + T1}, 2, T2},
		{"limit 3", []string{C1 + ", " + T2 + ", " + T1}, 3, C1},
		{"limit counts across lines", []string{C1, T2, T1}, 2, T2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var values [][]byte
			for _, v := range tc.values {
				values = append(values, []byte(v))
			}
			got, ok := ParseXFF(values, trusted, tc.maxHops)
			if tc.want == "" {
				if ok || got.IsValid() {
					t.Fatalf("ParseXFF = %v, %v; want no answer", got, ok)
				}
				return
			}
			if !ok || got != netip.MustParseAddr(tc.want) {
				t.Fatalf("ParseXFF = %v, %v; want %s", got, ok, tc.want)
			}
			if ref, refOK := refXFF(tc.values, trusted, tc.maxHops); ref != got || refOK != ok {
				t.Fatalf("reference says %v, %v", ref, refOK)
			}
		})
	}
	if got, ok := ParseXFF([][]byte{[]byte(C1 + ", " + T1)}, nil, 0); !ok || got.String() != T1 {
		t.Errorf("nil trusted: %v, %v; want the rightmost", got, ok)
	}
}

// refXFF is ParseXFF written the obvious way, for differential tests.
func refXFF(values []string, trusted func(netip.Addr) bool, maxHops int) (netip.Addr, bool) {
	if maxHops <= 0 {
		maxHops = DefaultMaxHops
	}
	var elems []string
	for _, v := range values {
		elems = append(elems, strings.Split(v, ",")...)
	}
	var last netip.Addr
	for i, n := len(elems)-1, 0; i >= 0 && n < maxHops; i, n = i-1, n+1 {
		a, ok := refParseAddr(elems[i])
		if !ok {
			break
		}
		if !trusted(a) {
			return a, true
		}
		last = a
	}
	return last, last.IsValid()
}

func TestFromHeaders(t *testing.T) {
	xff, err := New(Config{TrustedProxies: []string{"10.0.0.0/8", "2001:db8:7::/48"}})
	if err != nil {
		t.Fatal(err)
	}
	single, err := New(Config{TrustedProxies: []string{"10.0.0.0/8"}, Header: "True-Client-IP"})
	if err != nil {
		t.Fatal(err)
	}
	none, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		r        *Resolver
		peer     string
		peerSrc  Source
		headers  map[string][]string
		want     string
		wantSrc  Source
		wantRead bool // whether the header getter is called
	}{
		{"no trust: packet", none, C1, SourcePacket, map[string][]string{HeaderXFF: {"1.1.1.1"}}, C1, SourcePacket, false},
		{"untrusted peer's XFF ignored", xff, C1, SourcePacket, map[string][]string{HeaderXFF: {"1.1.1.1"}}, C1, SourcePacket, false},
		{"untrusted PROXY source's XFF ignored", xff, C2, SourceProxy, map[string][]string{HeaderXFF: {"1.1.1.1"}}, C2, SourceProxy, false},
		{"trusted peer's XFF", xff, T1, SourcePacket, map[string][]string{HeaderXFF: {"1.1.1.1, " + C1}}, C1, SourceHeader, true},
		{"trusted PROXY source's XFF", xff, T1, SourceProxy, map[string][]string{HeaderXFF: {C1 + ", " + T2}}, C1, SourceHeader, true},
		{"trusted peer, no XFF", xff, T1, SourcePacket, nil, T1, SourcePacket, true},
		{"trusted peer, XFF unknown", xff, T1, SourceProxy, map[string][]string{HeaderXFF: {"unknown"}}, T1, SourceProxy, true},
		{"trusted peer, all trusted", xff, T1, SourcePacket, map[string][]string{HeaderXFF: {T6 + ", " + T2}}, T6, SourceHeader, true},
		{"mapped trusted peer", xff, "::ffff:" + T1, SourcePacket, map[string][]string{HeaderXFF: {C1}}, C1, SourceHeader, true},
		{"zoned untrusted peer unzoned", xff, "fe80::9%eth0", SourcePacket, nil, "fe80::9", SourcePacket, false},
		{"IPv6 trusted peer", xff, T6, SourcePacket, map[string][]string{HeaderXFF: {C6}}, C6, SourceHeader, true},
		{"single-value", single, T1, SourcePacket, map[string][]string{"True-Client-Ip": {" " + C6 + " "}}, C6, SourceHeader, true},
		{"single-value with port", single, T1, SourcePacket, map[string][]string{"True-Client-Ip": {C1 + ":1234"}}, C1, SourceHeader, true},
		{"single-value ignores XFF", single, T1, SourcePacket, map[string][]string{HeaderXFF: {C1}}, T1, SourcePacket, true},
		{"single-value from untrusted", single, C2, SourcePacket, map[string][]string{"True-Client-Ip": {C1}}, C2, SourcePacket, false},
		{"single-value with two lines", single, T1, SourcePacket, map[string][]string{"True-Client-Ip": {C1, C2}}, T1, SourcePacket, true},
		{"single-value list", single, T1, SourcePacket, map[string][]string{"True-Client-Ip": {C1 + ", " + C2}}, T1, SourcePacket, true},
		{"single-value garbage", single, T1, SourcePacket, map[string][]string{"True-Client-Ip": {"unknown"}}, T1, SourcePacket, true},
		{"single-value empty", single, T1, SourcePacket, map[string][]string{"True-Client-Ip": {""}}, T1, SourcePacket, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := false
			get := func(name string) [][]byte {
				if read {
					t.Error("header getter called twice")
				}
				read = true
				var out [][]byte
				for _, v := range tc.headers[name] {
					out = append(out, []byte(v))
				}
				return out
			}
			got, src := tc.r.FromHeaders(netip.MustParseAddr(tc.peer), tc.peerSrc, get)
			if got != netip.MustParseAddr(tc.want) || src != tc.wantSrc {
				t.Errorf("FromHeaders = %v, %v; want %s, %v", got, src, tc.want, tc.wantSrc)
			}
			if read != tc.wantRead {
				t.Errorf("header read: %v, want %v", read, tc.wantRead)
			}
		})
	}

	var nilR *Resolver
	if a, s := nilR.FromHeaders(netip.MustParseAddr(C1), SourceProxy, nil); a.String() != C1 || s != SourceProxy {
		t.Errorf("nil Resolver: %v, %v", a, s)
	}
}

func TestSourceString(t *testing.T) {
	for s, want := range map[Source]string{SourcePacket: "packet", SourceProxy: "proxy_protocol", SourceHeader: "header", 9: "source(9)"} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", s, got, want)
		}
		if b, _ := s.MarshalText(); string(b) != want {
			t.Errorf("%d.MarshalText() = %q", s, b)
		}
	}
	if got := fmt.Sprint(SourceHeader); got != "header" {
		t.Errorf("fmt: %q", got)
	}
}

func TestFromHeadersAllocs(t *testing.T) {
	r, err := New(Config{TrustedProxies: []string{"10.0.0.0/8", "2001:db8:7::/48"}})
	if err != nil {
		t.Fatal(err)
	}
	values := [][]byte{[]byte("198.51.100.1, " + C1 + ", " + T2 + ", [" + T6 + "]:443")}
	get := func(string) [][]byte { return values }
	peer := netip.MustParseAddr(T1)
	if n := testing.AllocsPerRun(100, func() { r.FromHeaders(peer, SourcePacket, get) }); n != 0 {
		t.Errorf("FromHeaders allocates %v times per call", n)
	}
}

// TestTrustedMatchesPrefixContains compares the range tables with
// netip.Prefix.Contains on random sets, probing every range's edges.
func TestTrustedMatchesPrefixContains(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randAddr := func(v6 bool) netip.Addr {
		if !v6 {
			// Few distinct high bits, so prefixes overlap and touch.
			return netip.AddrFrom4([4]byte{byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
		}
		var b [16]byte
		b[0] = 0x20
		b[1] = byte(rng.IntN(2))
		for i := 2; i < 16; i++ {
			b[i] = byte(rng.IntN(256))
		}
		return netip.AddrFrom16(b)
	}
	for round := range 200 {
		var list []string
		var prefixes []netip.Prefix
		for range 1 + rng.IntN(12) {
			v6 := rng.IntN(2) == 0
			bits := 8 + rng.IntN(25)
			if v6 {
				bits = 8 + rng.IntN(121)
			}
			p, _ := randAddr(v6).Prefix(bits)
			prefixes = append(prefixes, p)
			list = append(list, p.String())
		}
		r, err := New(Config{TrustedProxies: list})
		if err != nil {
			t.Fatal(err)
		}
		var probes []netip.Addr
		for _, p := range prefixes {
			first := p.Masked().Addr()
			last := lastAddr(p)
			probes = append(probes, first, last, first.Prev(), last.Next())
		}
		for range 50 {
			probes = append(probes, randAddr(rng.IntN(2) == 0))
		}
		for _, a := range probes {
			if !a.IsValid() {
				continue
			}
			want := false
			for _, p := range prefixes {
				want = want || p.Contains(a)
			}
			if got := r.Trusted(a); got != want {
				t.Fatalf("round %d, %v: Trusted(%v) = %v, want %v", round, list, a, got, want)
			}
		}
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// TestConfigYAMLAndJSON: the model reads the same from YAML and from JSON (the
// control plane's form), durations as text in both, and writes back what it read.
func TestConfigYAMLAndJSON(t *testing.T) {
	const doc = `
trusted_proxies: [173.245.48.0/20, "2400:cb00::/32"]
header: CF-Connecting-IP
proxy_protocol: true
proxy_trusted: [198.18.0.0/15]
proxy_timeout: 3s
max_hops: 8
`
	const js = `{"trusted_proxies": ["173.245.48.0/20", "2400:cb00::/32"], "header": "CF-Connecting-IP",
		"proxy_protocol": true, "proxy_trusted": ["198.18.0.0/15"], "proxy_timeout": "3s", "max_hops": 8}`
	var cfg, fromJSON, stdJSON Config
	if err := config.Decode([]byte(doc), "YAML", &cfg); err != nil {
		t.Fatal(err)
	}
	if err := config.Decode([]byte(js), "JSON", &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(js), &stdJSON); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, fromJSON) || !reflect.DeepEqual(cfg, stdJSON) {
		t.Fatalf("YAML %+v\nJSON %+v\nencoding/json %+v", cfg, fromJSON, stdJSON)
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, cfg) {
		t.Fatalf("round trip through %s: %+v, %v", out, back, err)
	}
	if !strings.Contains(string(out), `"proxy_timeout":"3s"`) {
		t.Errorf("JSON %s: proxy_timeout is not text", out)
	}
	if out, _ := json.Marshal(Config{}); string(out) != "{}" {
		t.Errorf("zero Config as JSON: %s", out)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := r.Config()
	if got.Header != "Cf-Connecting-Ip" || !got.ProxyProtocol || got.ProxyTimeout.D() != 3*time.Second || got.MaxHops != 8 ||
		len(got.TrustedProxies) != 2 || len(got.ProxyTrusted) != 1 {
		t.Errorf("decoded %+v", got)
	}
}

// TestValidateAll: Validate reports every bad field, not only the first.
func TestValidateAll(t *testing.T) {
	c := Config{TrustedProxies: []string{"x", "10.0.0.0/8", "y"}, MaxHops: -1, ProxyTimeout: config.Duration(time.Second)}
	want := "trusted_proxies[0]: \"x\": bad address\ntrusted_proxies[2]: \"y\": bad address\n" +
		"max_hops: -1 is negative\nproxy_timeout: set but proxy_protocol is off"
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Fatalf("Validate: %v\nwant %s", err, want)
	}
}
