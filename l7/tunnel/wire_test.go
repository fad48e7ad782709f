package tunnel

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

var (
	ld     = netip.MustParseAddr("198.18.1.1")
	local  = netip.MustParseAddr("198.18.1.11")
	client = netip.MustParseAddrPort("198.18.0.50:40000")
	vip    = netip.MustParseAddrPort("203.0.113.10:8443")
	ld6    = netip.MustParseAddr("2001:db8:1::1")
	cl6    = netip.MustParseAddrPort("[2001:db8:99::50]:40000")
	vip6   = netip.MustParseAddrPort("[2001:db8:ff::10]:443")
)

func TestDecapsulate(t *testing.T) {
	syn := tcpPacket(client, vip, 1, 0, tcpSYN, nil)
	syn6 := tcpPacket(cl6, vip6, 1, 0, tcpSYN, nil)
	badSum := greWrap(syn, false, true)
	badSum[5] ^= 1
	for _, tc := range []struct {
		name  string
		proto uint8
		p     []byte
		inner []byte
		mode  mode
		err   error
	}{
		{"gre v4", protoGRE, greWrap(syn, false, false), syn, modeGRE, nil},
		{"gre v6", protoGRE, greWrap(syn6, false, false), syn6, modeGRE, nil},
		{"gre key", protoGRE, greWrap(syn, true, false), syn, modeGRE, nil},
		{"gre key checksum", protoGRE, greWrap(syn, true, true), syn, modeGRE, nil},
		{"gre bad checksum", protoGRE, badSum, nil, 0, errChecksum},
		{"gre seq", protoGRE, append([]byte{0x10, 0, 0x08, 0, 0, 0, 0, 1}, syn...), syn, modeGRE, nil},
		{"gre routing", protoGRE, append([]byte{0x40, 0, 0x08, 0}, syn...), nil, 0, errUnsupported},
		{"gre version 1", protoGRE, append([]byte{0x00, 1, 0x88, 0x0b}, syn...), nil, 0, errUnsupported},
		{"gre recursion", protoGRE, append([]byte{0x01, 0, 0x08, 0}, syn...), nil, 0, errUnsupported},
		{"gre ethernet", protoGRE, append([]byte{0, 0, 0x65, 0x58}, syn...), nil, 0, errUnsupported},
		{"gre short", protoGRE, []byte{0, 0, 8}, nil, 0, errTruncated},
		{"gre key missing", protoGRE, []byte{0x20, 0, 8, 0, 1, 2}, nil, 0, errTruncated},
		{"gre empty inner", protoGRE, []byte{0, 0, 8, 0}, nil, 0, errTruncated},
		{"gre v4 type carrying v6", protoGRE, append([]byte{0, 0, 0x08, 0}, syn6...), nil, 0, errMalformed},
		{"ipip", protoIPIP, syn, syn, modeIPIP, nil},
		{"ipip v6", protoIPv6, syn6, syn6, modeIPIP, nil},
		{"ipip wrong version", protoIPIP, syn6, nil, 0, errMalformed},
		{"ipip empty", protoIPIP, nil, nil, 0, errTruncated},
		{"udp", protoUDP, syn, nil, 0, errUnsupported},
	} {
		inner, m, err := decapsulate(tc.proto, tc.p)
		if err != tc.err || m != tc.mode || !bytes.Equal(inner, tc.inner) {
			t.Errorf("%s: got %v, %v, % x; want %v, %v", tc.name, m, err, inner, tc.mode, tc.err)
		}
	}
}

func TestOuter4(t *testing.T) {
	pkt := outerIPv4(ld, local, protoGRE, []byte{1, 2, 3, 4})
	src, dst, proto, pl, err := outer4(append(pkt, 0, 0)) // trailing padding ignored
	if err != nil || src != ld.As4() || dst != local.As4() || proto != protoGRE || !bytes.Equal(pl, []byte{1, 2, 3, 4}) {
		t.Fatalf("outer4: %v %v %d % x %v", src, dst, proto, pl, err)
	}
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
		err  error
	}{
		{"short", func(b []byte) []byte { return b[:19] }, errTruncated},
		{"v6", func(b []byte) []byte { b[0] = 0x65; return b }, errMalformed},
		{"ihl 4", func(b []byte) []byte { b[0] = 0x44; return b }, errMalformed},
		{"total < ihl", func(b []byte) []byte { b[3] = 10; return b }, errMalformed},
		{"total > len", func(b []byte) []byte { b[3] = 200; return b }, errTruncated},
	} {
		b := tc.mod(bytes.Clone(pkt))
		if _, _, _, _, err := outer4(b); err != tc.err {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
	}
}

func TestParseFlow(t *testing.T) {
	syn := tcpPacket(client, vip, 1, 0, tcpSYN, nil)
	frag := bytes.Clone(syn)
	frag[6] = 0x20 // MF, offset 0: first fragment
	later := bytes.Clone(syn)
	binary.BigEndian.PutUint16(later[6:], 0x0010) // offset 128
	hbh := ipPacket(cl6.Addr(), vip6.Addr(), 0, append([]byte{protoUDP, 0, 1, 4, 0, 0, 0, 0},
		udpPacket(cl6, vip6, []byte("x"))[40:]...), -1)
	v6frag := ipPacket(cl6.Addr(), vip6.Addr(), 44, append([]byte{protoUDP, 0, 0, 0x08, 0, 0, 0, 7},
		[]byte("abcdefgh")...), -1) // offset 1, no ports
	loop := ipPacket(cl6.Addr(), vip6.Addr(), 60, bytes.Repeat([]byte{60, 0, 1, 4, 0, 0, 0, 0}, 10), -1)
	k4 := flowKey{sport: client.Port(), dport: vip.Port(), proto: protoTCP}
	copy(k4.src[:], client.Addr().AsSlice())
	copy(k4.dst[:], vip.Addr().AsSlice())
	k6 := flowKey{src: cl6.Addr().As16(), dst: vip6.Addr().As16(), sport: cl6.Port(), dport: vip6.Port(), proto: protoUDP, v6: true}
	for _, tc := range []struct {
		name string
		b    []byte
		key  flowKey
		frag bool
		err  error
	}{
		{"tcp syn", syn, k4, false, nil},
		{"padded", append(bytes.Clone(syn), 0, 0, 0), k4, false, nil},
		{"first fragment", frag, k4, true, nil},
		{"later fragment", later, flowKey{src: k4.src, dst: k4.dst, proto: protoTCP}, true, nil},
		{"v6 udp", udpPacket(cl6, vip6, []byte("hi")), k6, false, nil},
		{"v6 hop-by-hop", hbh, k6, false, nil},
		{"v6 later fragment", v6frag, flowKey{src: k6.src, dst: k6.dst, proto: protoUDP, v6: true}, true, nil},
		{"v6 endless options", loop, flowKey{}, false, errMalformed},
		{"tcp cut", syn[:30], flowKey{}, false, errTruncated},
		{"empty", nil, flowKey{}, false, errTruncated},
		{"version 5", []byte{0x50, 0, 0, 0}, flowKey{}, false, errMalformed},
	} {
		pi, err := parseFlow(tc.b)
		if err != tc.err {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.err)
			continue
		}
		if err == nil && (pi.key != tc.key || pi.frag != tc.frag) {
			t.Errorf("%s: key %+v frag %v; want %+v %v", tc.name, pi.key, pi.frag, tc.key, tc.frag)
		}
	}
	pi, _ := parseFlow(append(bytes.Clone(syn), 9, 9))
	if pi.size != len(syn) || pi.tcpFlags != tcpSYN {
		t.Errorf("size %d flags %#x; want %d, SYN", pi.size, pi.tcpFlags, len(syn))
	}
}

func TestICMPQuote(t *testing.T) {
	orig := udpPacket(client, vip, []byte("hello"))
	msg := icmpError(vip.Addr(), client.Addr(), orig[:28])
	pi, err := parseFlow(msg)
	if err != nil {
		t.Fatal(err)
	}
	q := icmpEmbedded(&pi)
	if q == nil {
		t.Fatal("no quote found")
	}
	k, ok := parseQuoted(q, false)
	want, _ := parseFlow(orig)
	if !ok || k != want.key {
		t.Fatalf("quoted key %+v, %v; want %+v", k, ok, want.key)
	}
	echo := ipPacket(vip.Addr(), client.Addr(), protoICMP, []byte{0, 0, 0, 0, 0, 1, 0, 1}, 2)
	pi, _ = parseFlow(echo)
	if icmpEmbedded(&pi) != nil {
		t.Fatal("echo reply taken for an error")
	}
}

func FuzzDecap(f *testing.F) {
	syn := tcpPacket(client, vip, 1, 0, tcpSYN, nil)
	f.Add(outerIPv4(ld, local, protoGRE, greWrap(syn, true, true)))
	f.Add(outerIPv4(ld, local, protoIPIP, syn))
	f.Add(outerIPv4(ld, local, protoIPv6, tcpPacket(cl6, vip6, 1, 0, tcpSYN, nil)))
	f.Add(outerIPv4(ld, local, protoGRE, greWrap(icmpError(vip.Addr(), client.Addr(), syn[:28]), false, false)))
	f.Add([]byte{0x45, 0, 0, 20})
	f.Fuzz(func(t *testing.T, b []byte) {
		src, _, proto, pl, err := outer4(b)
		if err != nil {
			return
		}
		_ = src
		inner, m, err := decapsulate(proto, pl)
		if err != nil {
			return
		}
		if m != modeGRE && m != modeIPIP || len(inner) == 0 || len(inner) > len(pl) {
			t.Fatalf("decapsulate: mode %v, inner %d of %d", m, len(inner), len(pl))
		}
		pi, err := parseFlow(inner)
		if err != nil {
			return
		}
		if pi.size > len(inner) || len(pi.l4) > pi.size {
			t.Fatalf("parseFlow: size %d l4 %d of %d", pi.size, len(pi.l4), len(inner))
		}
		if q := icmpEmbedded(&pi); q != nil {
			parseQuoted(q, pi.key.v6)
		}
	})
}

func FuzzParseFlow(f *testing.F) {
	f.Add(tcpPacket(client, vip, 1, 0, tcpSYN, nil))
	f.Add(udpPacket(cl6, vip6, []byte("x")))
	f.Add(icmpError(vip.Addr(), client.Addr(), udpPacket(client, vip, nil)))
	f.Add(ipPacket(cl6.Addr(), vip6.Addr(), 44, []byte{protoUDP, 0, 0, 0x08, 0, 0, 0, 7}, -1))
	f.Fuzz(func(t *testing.T, b []byte) {
		pi, err := parseFlow(b)
		if err != nil {
			return
		}
		if pi.size > len(b) || pi.size < 20 {
			t.Fatalf("size %d of %d", pi.size, len(b))
		}
		if q := icmpEmbedded(&pi); q != nil {
			parseQuoted(q, pi.key.v6)
			parseQuoted(q, !pi.key.v6)
		}
	})
}

func BenchmarkInboundParse(b *testing.B) {
	pkt := outerIPv4(ld, local, protoGRE, greWrap(tcpPacket(client, vip, 1, 1, tcpACK, make([]byte, 1400)), false, false))
	b.ReportAllocs()
	for b.Loop() {
		_, _, proto, pl, _ := outer4(pkt)
		inner, _, _ := decapsulate(proto, pl)
		if _, err := parseFlow(inner); err != nil {
			b.Fatal(err)
		}
	}
}
