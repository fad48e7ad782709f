package packet

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/wire"
)

const headroom = 128

// withHeadroom copies pkt into a buffer after headroom bytes of garbage.
func withHeadroom(pkt []byte, room int) []byte {
	buf := bytes.Repeat([]byte{0xee}, room)
	return append(buf, pkt...)
}

func TestEncapRoundTrip(t *testing.T) {
	inners := map[string][]byte{
		"tcp4 df": tcpIP(t, client4, vip4, 40000, 443, true, []layers.TCPOption{optMSS(1460)}, nil),
		"udp4 no df": func() []byte {
			b := udpIP(t, client4, vip4, 1, 443, []byte("q"))
			b[6] = 0
			fixIPv4Checksum(b, 0)
			return b
		}(),
		"udp6":        udpIP(t, client6, vip6, 5000, 443, bytes.Repeat([]byte{1}, 1200)),
		"icmp6 error": icmpError(t, 2, 0, udpIP(t, vip6, client6, 443, 5000, nil), -1)[EthernetLen:],
	}
	outers := []struct {
		name     string
		mode     EncapMode
		src, dst netip.Addr
		key      uint32
		overhead int
	}{
		{"gre4", EncapGRE, ld4, member4, 0, 38},
		{"ipip4", EncapIPIP, ld4, member4, 0, 34},
		{"gre6", EncapGRE, ld6, member6, 0, 58},
		{"ipip6", EncapIPIP, ld6, member6, 0, 54},
		{"gre4 key", EncapGRE, ld4, member4, 0xfeed_0001, 42},
		{"gre6 key", EncapGRE, ld6, member6, 7, 62},
	}
	for _, o := range outers {
		e := &Encap{Mode: o.mode, Src: o.src, Dst: o.dst, SrcMAC: macA, DstMAC: macB, TTL: 0, Key: o.key}
		if got := e.Overhead(false); got != o.overhead {
			t.Errorf("%s: Overhead before Prepare %d, want %d", o.name, got, o.overhead)
		}
		if err := e.Prepare(); err != nil {
			t.Fatalf("%s: Prepare: %v", o.name, err)
		}
		if got := e.Overhead(true); got != o.overhead {
			t.Errorf("%s: Overhead %d, want %d", o.name, got, o.overhead)
		}
		for iname, inner := range inners {
			t.Run(o.name+"/"+iname, func(t *testing.T) {
				buf := withHeadroom(inner, headroom)
				start, err := e.Write(buf, headroom, len(inner), 0xbeef)
				if err != nil {
					t.Fatalf("Write: %v", err)
				}
				if start != headroom-o.overhead {
					t.Fatalf("start %d, want %d", start, headroom-o.overhead)
				}
				f := buf[start:]
				var p Packet
				if err := Parse(f, &p); err != nil {
					t.Fatalf("outer does not parse: %v", err)
				}
				innerV6 := inner[0]>>4 == 6
				wantProto := uint8(ProtoGRE)
				if o.mode == EncapIPIP {
					wantProto = ProtoIPIP
					if innerV6 {
						wantProto = ProtoIPv6
					}
				}
				if p.Src != o.src || p.Dst != o.dst || p.Proto != wantProto || p.TTL != 64 || p.End != len(f) {
					t.Errorf("outer %+v", p)
				}
				if MAC(f[0:6]) != macB || MAC(f[6:12]) != macA {
					t.Errorf("MACs %x", f[:12])
				}
				if o.src.Is4() {
					ipf := binary.BigEndian.Uint16(f[20:])
					wantDF := innerV6 || inner[6]&0x40 != 0
					if id := binary.BigEndian.Uint16(f[18:]); id != 0xbeef {
						t.Errorf("outer ID %#x", id)
					}
					if (ipf == 0x4000) != wantDF || ipf&^0x4000 != 0 {
						t.Errorf("outer flags %#04x, want DF %v", ipf, wantDF)
					}
				}
				// gopacket decodes the same structure.
				g := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
				if el := g.ErrorLayer(); el != nil {
					t.Fatalf("gopacket: %v", el.Error())
				}
				if o.mode == EncapGRE {
					gre, _ := g.Layer(layers.LayerTypeGRE).(*layers.GRE)
					wantEt := layers.EthernetTypeIPv4
					if innerV6 {
						wantEt = layers.EthernetTypeIPv6
					}
					if gre == nil || gre.Protocol != wantEt || gre.Version != 0 || gre.KeyPresent != (o.key != 0) || gre.Key != o.key ||
						gre.ChecksumPresent || gre.SeqPresent {
						t.Errorf("gopacket GRE %+v", gre)
					}
				}
				// wire's rules, which l7d applies, give the same inner packet, and
				// hold a configured key to exactly this one.
				var tn wire.Tunnel
				if err := wire.Decap(p.Proto, f[p.L4:p.End], &tn); err != nil || !bytes.Equal(f[p.L4+tn.Inner:p.End], inner) {
					t.Fatalf("wire.Decap: %v, inner at %d", err, tn.Inner)
				}
				if !tn.GRE.KeyMatches(o.key) || tn.GRE.KeyMatches(o.key+1) {
					t.Errorf("wire's key rule: key %#x matches %v, key %#x matches %v", o.key, tn.GRE.KeyMatches(o.key), o.key+1, tn.GRE.KeyMatches(o.key+1))
				}
				in, n, err := Decap(f, &p)
				if err != nil {
					t.Fatalf("Decap: %v", err)
				}
				if in != o.overhead || !bytes.Equal(f[in:in+n], inner) {
					t.Fatalf("Decap gave %d+%d, want the inner packet at %d", in, n, o.overhead)
				}
				if !bytes.Equal(buf[headroom:], inner) {
					t.Fatal("Write modified the inner packet")
				}
			})
		}
	}
}

func TestEncapTTLAndPadding(t *testing.T) {
	e := &Encap{Src: ld4, Dst: member4, TTL: 5}
	if err := e.Prepare(); err != nil {
		t.Fatal(err)
	}
	inner := udpIP(t, client4, vip4, 1, 2, nil)
	// Bytes after the inner packet (a bigger mbuf) are outside the outer packet.
	buf := append(withHeadroom(inner, 40), 1, 2, 3)
	start, err := e.Write(buf, 40, len(inner), 1)
	if err != nil {
		t.Fatal(err)
	}
	var p Packet
	if err := Parse(buf[start:], &p); err != nil {
		t.Fatal(err)
	}
	if p.TTL != 5 || p.End != len(buf)-3-start {
		t.Errorf("TTL %d End %d", p.TTL, p.End)
	}
}

func TestEncapErrors(t *testing.T) {
	inner4 := udpIP(t, client4, vip4, 1, 2, nil)
	e4 := &Encap{Src: ld4, Dst: member4}
	e6 := &Encap{Mode: EncapIPIP, Src: ld6, Dst: member6}
	k4 := &Encap{Src: ld4, Dst: member4, Key: 1}
	k6 := &Encap{Src: ld6, Dst: member6, Key: 1}
	for _, e := range []*Encap{e4, e6, k4, k6} {
		if err := e.Prepare(); err != nil {
			t.Fatal(err)
		}
	}
	var unprepared Encap
	big := make([]byte, 100+65535)
	big[100] = 0x45
	big6 := make([]byte, 100+65536)
	big6[100] = 0x60
	cases := []struct {
		name       string
		e          *Encap
		buf        []byte
		inner, len int
		err        error
	}{
		{"not prepared", &unprepared, withHeadroom(inner4, 64), 64, len(inner4), ErrNotPrepared},
		{"no headroom", e4, withHeadroom(inner4, 37), 37, len(inner4), ErrNoRoom},
		{"exact headroom", e4, withHeadroom(inner4, 38), 38, len(inner4), nil},
		{"no headroom v6", e6, withHeadroom(inner4, 53), 53, len(inner4), ErrNoRoom},
		{"no headroom key", k4, withHeadroom(inner4, 41), 41, len(inner4), ErrNoRoom},
		{"exact headroom key", k4, withHeadroom(inner4, 42), 42, len(inner4), nil},
		{"no headroom key v6", k6, withHeadroom(inner4, 61), 61, len(inner4), ErrNoRoom},
		{"exact headroom key v6", k6, withHeadroom(inner4, 62), 62, len(inner4), nil},
		{"outer v4 key over 65535", k4, big, 100, 65535 - 28 + 1, ErrNoRoom},
		{"outer v4 key at 65535", k4, big, 100, 65535 - 28, nil},
		{"outer v4 over 65535", e4, big, 100, 65535 - 24 + 1, ErrNoRoom},
		{"outer v4 at 65535", e4, big, 100, 65535 - 24, nil},
		{"outer v6 payload over 65535", e6, big6, 100, 65536, ErrNoRoom},
		{"outer v6 payload 65535", e6, big6, 100, 65535, nil},
		{"outer v6 key payload over 65535", k6, big6, 100, 65535 - 8 + 1, ErrNoRoom},
		{"outer v6 key payload 65535", k6, big6, 100, 65535 - 8, nil},
		{"inner beyond buf", e4, withHeadroom(inner4, 64), 64, len(inner4) + 1, ErrTruncated},
		{"inner negative", e4, withHeadroom(inner4, 64), -1, 20, ErrTruncated},
		{"inner too short", e4, withHeadroom(inner4, 64), 64, 19, ErrTruncated},
		{"inner not ip", e4, withHeadroom(bytes.Repeat([]byte{0x50}, 40), 64), 64, 40, ErrUnsupported},
	}
	for _, c := range cases {
		if _, err := c.e.Write(c.buf, c.inner, c.len, 0); err != c.err {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
	for _, e := range []Encap{
		{Src: ld4},
		{Src: ld4, Dst: member6},
		{Src: ld6, Dst: member4},
		{Mode: 7, Src: ld4, Dst: member4},
		{Mode: EncapIPIP, Src: ld4, Dst: member4, Key: 1},
		{Src: netip.MustParseAddr("fe80::1%eth0"), Dst: netip.MustParseAddr("fe80::2")},
	} {
		if err := e.Prepare(); err == nil {
			t.Errorf("Prepare(%+v) succeeded", e)
		}
		if _, err := e.Write(make([]byte, 100), 60, 40, 0); err != ErrNotPrepared {
			t.Errorf("Write after failed Prepare: %v", err)
		}
	}
	// IPv4-mapped outer addresses are IPv4.
	m := Encap{Src: netip.MustParseAddr("::ffff:198.18.0.1"), Dst: member4}
	if err := m.Prepare(); err != nil || m.Overhead(false) != 38 {
		t.Errorf("mapped: %v, overhead %d", err, m.Overhead(false))
	}
}

// gre builds a GRE-over-IPv4 frame with the given GRE header bytes and payload.
func greFrame(t *testing.T, greHdr, payload []byte) []byte {
	t.Helper()
	return frame(serialize(t, ipv4(member4, ld4, layers.IPProtocolGRE), gopacket.Payload(append(clone(greHdr), payload...))))
}

func TestDecap(t *testing.T) {
	in4 := udpIP(t, vip4, client4, 443, 5000, []byte("reply"))
	in6 := tcpIP(t, vip6, client6, 443, 5000, false, nil, []byte("reply"))
	ipipV6 := frame(serialize(t, ipv6(member6, ld6, layers.IPProtocolIPv4), gopacket.Payload(in4)))
	ipip := frame(serialize(t, ipv4(member4, ld4, layers.IPProtocolIPv4), gopacket.Payload(in4)))
	six4 := frame(serialize(t, ipv4(member4, ld4, layers.IPProtocolIPv6), gopacket.Payload(in6)))
	// gopacket's GRE serializer for the flags it supports.
	greKS := frame(serialize(t, ipv4(member4, ld4, layers.IPProtocolGRE),
		&layers.GRE{KeyPresent: true, SeqPresent: true, Key: 7, Seq: 9, Protocol: layers.EthernetTypeIPv6}, gopacket.Payload(in6)))
	greCsum := frame(serialize(t, ipv4(member4, ld4, layers.IPProtocolGRE),
		&layers.GRE{ChecksumPresent: true, Protocol: layers.EthernetTypeIPv4}, gopacket.Payload(in4)))
	padded := append(frame(serialize(t, ipv4(member4, ld4, layers.IPProtocolGRE), gopacket.Payload(append([]byte{0, 0, 8, 0}, in4...)))), 0, 0, 0)
	// All three optional fields, the checksum computed over header and payload.
	allFlags := append([]byte{0xb0, 0, 8, 0, 0, 0, 0, 0, 5, 6, 7, 8, 9, 10, 11, 12}, in4...)
	binary.BigEndian.PutUint16(allFlags[4:], wire.Checksum(allFlags, 0))
	badSum := clone(allFlags)
	badSum[len(badSum)-1] ^= 1
	greFrag := greFrame(t, []byte{0, 0, 8, 0}, in4)
	greFrag[20] = 0x20
	fixIPv4Checksum(greFrag, 14)

	cases := []struct {
		name   string
		frame  []byte
		inner  []byte
		offset int
		err    error
	}{
		{"gre v4", greFrame(t, []byte{0, 0, 8, 0}, in4), in4, 38, nil},
		{"gre v6", greFrame(t, []byte{0, 0, 0x86, 0xdd}, in6), in6, 38, nil},
		{"gre key seq", greKS, in6, 46, nil},
		{"gre checksum", greCsum, in4, 42, nil},
		{"gre all flags", greFrame(t, allFlags, nil), in4, 50, nil},
		{"gre bad checksum", greFrame(t, badSum, nil), nil, 0, ErrChecksum},
		{"gre reserved0", greFrame(t, []byte{0, 0xf8, 8, 0}, in4), nil, 0, ErrUnsupported},
		{"gre with padding", padded, in4, 38, nil},
		{"ipip", ipip, in4, 34, nil},
		{"ipip over v6", ipipV6, in4, 54, nil},
		{"6in4", six4, in6, 34, nil},
		{"gre routing", greFrame(t, []byte{0x40, 0, 8, 0, 0, 0, 0, 0}, in4), nil, 0, ErrUnsupported},
		{"gre version 1", greFrame(t, []byte{0x30, 1, 0x88, 0x0b, 0, 0, 0, 0, 0, 0, 0, 0}, in4), nil, 0, ErrUnsupported},
		{"gre ssr", greFrame(t, []byte{0x08, 0, 8, 0}, in4), nil, 0, ErrUnsupported},
		{"gre recursion", greFrame(t, []byte{0x01, 0, 8, 0}, in4), nil, 0, ErrUnsupported},
		{"gre teb", greFrame(t, []byte{0, 0, 0x65, 0x58}, in4), nil, 0, ErrUnsupported},
		{"gre says v4 carries v6", greFrame(t, []byte{0, 0, 8, 0}, in6), nil, 0, ErrMalformed},
		{"gre says v6 carries v4", greFrame(t, []byte{0, 0, 0x86, 0xdd}, append(clone(in4), make([]byte, 20)...)), nil, 0, ErrMalformed},
		{"gre keys past end", greFrame(t, []byte{0x30, 0, 8, 0, 0, 0}, nil), nil, 0, ErrTruncated},
		{"gre inner short", greFrame(t, []byte{0, 0, 8, 0}, in4[:19]), nil, 0, ErrTruncated},
		{"gre header short", greFrame(t, []byte{0, 0, 8}, nil), nil, 0, ErrTruncated},
		{"ipip carries v6", frame(serialize(t, ipv4(member4, ld4, layers.IPProtocolIPv4), gopacket.Payload(in6))), nil, 0, ErrMalformed},
		{"gre outer fragment", greFrag, nil, 0, ErrUnsupported},
		{"udp", frame(in4), nil, 0, ErrUnsupported},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p Packet
			if err := Parse(c.frame, &p); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			in, n, err := Decap(c.frame, &p)
			if err != c.err {
				t.Fatalf("Decap = %v, want %v", err, c.err)
			}
			if err != nil {
				return
			}
			if in != c.offset || !bytes.Equal(c.frame[in:in+n], c.inner) {
				t.Errorf("inner at %d len %d, want at %d: %x", in, n, c.offset, c.frame[in:in+n])
			}
		})
	}
}

// TestDecapForward is the return path: decapsulate, rewrite Ethernet before the inner
// packet, decrement its TTL; the result is a valid frame.
func TestDecapForward(t *testing.T) {
	for _, inner := range [][]byte{
		udpIP(t, vip4, client4, 443, 5000, []byte("reply")),
		tcpIP(t, vip6, client6, 443, 5000, false, nil, []byte("reply")),
	} {
		e := &Encap{Src: member4, Dst: ld4}
		if err := e.Prepare(); err != nil {
			t.Fatal(err)
		}
		buf := withHeadroom(inner, 64)
		start, err := e.Write(buf, 64, len(inner), 1)
		if err != nil {
			t.Fatal(err)
		}
		f := buf[start:]
		var p Packet
		if err := Parse(f, &p); err != nil {
			t.Fatal(err)
		}
		in, _, err := Decap(f, &p)
		if err != nil {
			t.Fatal(err)
		}
		et := uint16(EtherTypeIPv4)
		if inner[0]>>4 == 6 {
			et = EtherTypeIPv6
		}
		if !WriteEthernet(f, in-EthernetLen, macB, macA, et) {
			t.Fatal("WriteEthernet = false")
		}
		if !DecTTL(f, in) {
			t.Fatal("DecTTL = false")
		}
		out := f[in-EthernetLen:]
		var q Packet
		if err := Parse(out, &q); err != nil {
			t.Fatalf("forwarded frame: %v", err)
		}
		if q.TTL != 63 || q.Src != mustParse(map[bool]string{true: "203.0.113.10", false: "2001:db8:ffff::10"}[et == EtherTypeIPv4]) {
			t.Errorf("forwarded %+v", q)
		}
		if !VerifyL4Checksum(out, &q) {
			t.Error("transport checksum changed")
		}
	}
}

func TestWriteEthernet(t *testing.T) {
	buf := make([]byte, 20)
	if !WriteEthernet(buf, 6, Broadcast, macA, EtherTypeARP) {
		t.Fatal("WriteEthernet = false")
	}
	want := append(make([]byte, 6), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 0x0a, 0x08, 0x06)
	if !bytes.Equal(buf, want) {
		t.Errorf("got %x, want %x", buf, want)
	}
	for _, start := range []int{-1, 7, 100} {
		if WriteEthernet(buf, start, macA, macB, 1) {
			t.Errorf("start %d: wrote past the buffer", start)
		}
	}
}

func TestDecTTL(t *testing.T) {
	v4 := udpIP(t, client4, vip4, 1, 2, nil)
	v6 := udpIP(t, client6, vip6, 1, 2, nil)
	for _, c := range []struct {
		name string
		pkt  []byte
		ttl  uint8
		ok   bool
	}{
		{"v4 64", v4, 64, true}, {"v4 2", v4, 2, true}, {"v4 1", v4, 1, false}, {"v4 0", v4, 0, false},
		{"v4 255", v4, 255, true}, {"v4 0x80", v4, 0x80, true},
		{"v6 64", v6, 64, true}, {"v6 2", v6, 2, true}, {"v6 1", v6, 1, false}, {"v6 0", v6, 0, false},
	} {
		b := clone(c.pkt)
		if b[0]>>4 == 4 {
			b[8] = c.ttl
			fixIPv4Checksum(b, 0)
		} else {
			b[7] = c.ttl
		}
		before := clone(b)
		if got := DecTTL(b, 0); got != c.ok {
			t.Errorf("%s: DecTTL = %v", c.name, got)
		}
		var p Packet
		if err := ParseIP(b, 0, &p); err != nil {
			t.Errorf("%s: after DecTTL: %v", c.name, err)
		}
		if !c.ok && !bytes.Equal(b, before) {
			t.Errorf("%s: changed on failure", c.name)
		}
		if c.ok && p.TTL != c.ttl-1 {
			t.Errorf("%s: TTL %d", c.name, p.TTL)
		}
	}
	for _, b := range [][]byte{nil, {0x45}, v4[:19], v6[:39], {0x00, 1, 2}} {
		if DecTTL(b, 0) {
			t.Errorf("DecTTL(%x) = true", b)
		}
	}
	if DecTTL(v4, -1) || DecTTL(v4, len(v4)) {
		t.Error("out-of-range offset accepted")
	}
}
