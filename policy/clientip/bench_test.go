package clientip

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/valyala/fasthttp"
)

// cdnRanges is the size of a large CDN's published edge list.
var cdnRanges = []string{
	"173.245.48.0/20", "103.21.244.0/22", "103.22.200.0/22", "103.31.4.0/22", "141.101.64.0/18",
	"108.162.192.0/18", "190.93.240.0/20", "188.114.96.0/20", "197.234.240.0/22", "198.41.128.0/17",
	"162.158.0.0/15", "104.16.0.0/13", "104.24.0.0/14", "172.64.0.0/13", "131.0.72.0/22",
	"2400:cb00::/32", "2606:4700::/32", "2803:f800::/32", "2405:b500::/32", "2405:8100::/32",
	"2a06:98c0::/29", "2c0f:f248::/32",
}

func BenchmarkParseAddr(b *testing.B) {
	for _, in := range []string{"203.0.113.7", "203.0.113.7:51234", "2001:db8:85a3::8a2e:370:7334", "[2001:db8::1]:443", "unknown"} {
		b.Run(in, func(b *testing.B) {
			in := []byte(in)
			b.ReportAllocs()
			for b.Loop() {
				ParseAddr(in)
			}
		})
	}
}

// BenchmarkParseAddrPeer is the peer of BenchmarkParseAddr in the same run:
// net/netip on a string, with the port split off by the caller.
func BenchmarkParseAddrPeer(b *testing.B) {
	for _, in := range []string{"203.0.113.7", "2001:db8:85a3::8a2e:370:7334"} {
		b.Run(in, func(b *testing.B) {
			in := []byte(in)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = netip.ParseAddr(string(in))
			}
		})
	}
}

func BenchmarkTrusted(b *testing.B) {
	r, err := New(Config{TrustedProxies: cdnRanges})
	if err != nil {
		b.Fatal(err)
	}
	for _, a := range []string{"162.158.1.1", "203.0.113.7", "2606:4700::1"} {
		b.Run(a, func(b *testing.B) {
			a := netip.MustParseAddr(a)
			b.ReportAllocs()
			for b.Loop() {
				r.Trusted(a)
			}
		})
	}
}

func BenchmarkParseXFF(b *testing.B) {
	r, err := New(Config{TrustedProxies: cdnRanges})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, xff string }{
		{"1 hop", "203.0.113.7"},
		{"3 hops", "198.51.100.1, 203.0.113.7, 162.158.1.1"},
		{"3 hops IPv6", "2001:db8::1, 2001:db8:1::7, 2606:4700::1"},
		{"300 hops", "203.0.113.7" + string(bytes.Repeat([]byte(", 162.158.1.1"), 299))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			values := [][]byte{[]byte(tc.xff)}
			b.ReportAllocs()
			for b.Loop() {
				ParseXFF(values, r.Trusted, 0)
			}
		})
	}
}

// BenchmarkParseXFFPeer is the peer of BenchmarkParseXFF/3_hops: the obvious
// implementation, splitting the header and parsing with net/netip.
func BenchmarkParseXFFPeer(b *testing.B) {
	r, err := New(Config{TrustedProxies: cdnRanges})
	if err != nil {
		b.Fatal(err)
	}
	values := []string{"198.51.100.1, 203.0.113.7, 162.158.1.1"}
	b.ReportAllocs()
	for b.Loop() {
		refXFF(values, r.Trusted, 0)
	}
}

// BenchmarkFromHeaders is the per-request cost: a trusted peer, X-Forwarded-For of
// three hops, read through fasthttp as l7 does.
func BenchmarkFromHeaders(b *testing.B) {
	r, err := New(Config{TrustedProxies: cdnRanges})
	if err != nil {
		b.Fatal(err)
	}
	var req fasthttp.Request
	req.Header.Set("X-Forwarded-For", "198.51.100.1, 203.0.113.7, 162.158.1.1")
	req.Header.Set("User-Agent", "bench")
	peer := netip.MustParseAddr("162.158.7.7")
	b.Run("fasthttp", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r.FromHeaders(peer, SourcePacket, req.Header.PeekAll)
		}
	})
	values := [][]byte{[]byte("198.51.100.1, 203.0.113.7, 162.158.1.1")}
	get := func(string) [][]byte { return values }
	b.Run("slice", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r.FromHeaders(peer, SourcePacket, get)
		}
	})
	untrusted := netip.MustParseAddr("203.0.113.9")
	b.Run("untrusted peer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r.FromHeaders(untrusted, SourcePacket, get)
		}
	})
}

func BenchmarkReadProxyHeader(b *testing.B) {
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"v1", []byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n")},
		{"v1 TCP6", []byte("PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n")},
		{"v2", v2(0x21, 0x11, ip("203.0.113.7"), ip("192.0.2.1"), port(51234), port(443))},
		{"v2 TLVs", v2(0x21, 0x21, ip("2001:db8::7"), ip("2001:db8::1"), port(1), port(2), tlv(TLVTypeALPN, "h2"), tlv(TLVTypeAuthority, "example.com"))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rd := bytes.NewReader(tc.in)
			br := bufio.NewReaderSize(rd, readHeaderBuffer)
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(tc.in)
				br.Reset(rd)
				if _, err := ReadProxyHeader(br); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func ExampleResolver_FromHeaders() {
	r, err := New(Config{TrustedProxies: []string{"162.158.0.0/15"}})
	if err != nil {
		panic(err)
	}
	headers := map[string][][]byte{"X-Forwarded-For": {[]byte("6.6.6.6, 203.0.113.7, 162.158.1.1")}}
	get := func(name string) [][]byte { return headers[name] }

	// A CDN edge: its header is read, right to left.
	fmt.Println(r.FromHeaders(netip.MustParseAddr("162.158.7.7"), SourcePacket, get))
	// Anyone else: the header is ignored.
	fmt.Println(r.FromHeaders(netip.MustParseAddr("198.51.100.1"), SourcePacket, get))
	// Output:
	// 203.0.113.7 header
	// 198.51.100.1 packet
}
