package packet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// sample is a named frame with the Packet Parse must produce.
type sample struct {
	name  string
	frame []byte
	want  Packet
	err   error
}

// samples returns well-formed frames of every kind Parse handles.
func samples(t testing.TB) []sample {
	t.Helper()
	mss := []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}}}
	tcp4 := tcpIP(t, client4, vip4, 40000, 443, true, mss, nil)
	tcp6 := tcpIP(t, client6, vip6, 40001, 443, false, nil, []byte("hello"))
	udp4 := udpIP(t, client4, vip4, 5353, 443, []byte("quic"))
	udp6 := udpIP(t, client6, vip6, 5354, 443, bytes.Repeat([]byte{7}, 100))
	echo4 := echoIP(t, client4, vip4, 0x4242, 1, []byte("ping"))
	echo6 := echoIP(t, client6, vip6, 0x4343, 2, []byte("ping6"))

	// IPv4 with options (record route, 8 bytes incl. padding).
	opt4 := ipv4(client4, vip4, layers.IPProtocolUDP)
	opt4.Options = []layers.IPv4Option{{OptionType: 7, OptionLength: 7, OptionData: []byte{4, 0, 0, 0, 0}}, {OptionType: 0, OptionLength: 1}}
	u := &layers.UDP{SrcPort: 1, DstPort: 2}
	_ = u.SetNetworkLayerForChecksum(opt4)
	udp4opt := serialize(t, opt4, u, gopacket.Payload("x"))

	// IPv4 fragments.
	fragFirst := clone(udp4)
	binary.BigEndian.PutUint16(fragFirst[6:], 0x2000) // MF, offset 0
	fixIPv4Checksum(fragFirst, 0)
	fragLater := clone(udp4)
	binary.BigEndian.PutUint16(fragLater[6:], 0x0003) // offset 24 bytes, last
	fixIPv4Checksum(fragLater, 0)

	// IPv6 with hop-by-hop (8) + destination options (16) before TCP.
	ext := []byte{
		protoDestOpts, 0, 1, 4, 0, 0, 0, 0, // hop-by-hop: PadN
		ProtoTCP, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // dest opts: PadN
	}
	tcp6ext := insertV6Ext(tcp6, protoHopByHop, ext)
	// IPv6 first fragment (routing header, then fragment header) and a later one.
	frag6 := []byte{
		protoFragment, 0, 0, 0, 0, 0, 0, 0, // routing type 0, segments left 0
		ProtoUDP, 0, 0x00, 0x01, 0xca, 0xfe, 0xba, 0xbe, // offset 0, M=1
	}
	udp6frag := insertV6Ext(udp6, protoRouting, frag6)
	frag6later := []byte{ProtoUDP, 0, 0x00, 0xa8, 0xca, 0xfe, 0xba, 0xbe} // offset 21*8, M=0
	udp6later := insertV6Ext(udp6, protoFragment, frag6later)
	noNext := insertV6Ext(udp6[:IPv6Len], protoDestOpts, []byte{protoNoNext, 0, 1, 4, 0, 0, 0, 0})

	arp := serialize(t, eth(layers.EthernetTypeARP), &layers.ARP{AddrType: layers.LinkTypeEthernet,
		Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4, Operation: 1,
		SourceHwAddress: hw(macA), SourceProtAddress: ip(client4), DstHwAddress: make([]byte, 6), DstProtAddress: ip(vip4)})

	// A 60-byte frame whose IP packet is shorter: Ethernet padding.
	padded := append(frame(udpIP(t, client4, vip4, 9, 10, nil)), make([]byte, 32)...)[:60]

	gre := serialize(t, ipv4(member4, ld4, layers.IPProtocolGRE), &layers.GRE{Protocol: layers.EthernetTypeIPv4}, gopacket.Payload(udp4))

	v4 := func(p Packet) Packet { p.EtherType = EtherTypeIPv4; p.L3 = 14; return p }
	v6 := func(p Packet) Packet { p.EtherType = EtherTypeIPv6; p.L3 = 14; return p }
	return []sample{
		{name: "tcp4 syn mss", frame: frame(tcp4), want: v4(Packet{L4: 34, End: 14 + len(tcp4), Proto: ProtoTCP,
			Src: client4, Dst: vip4, SrcPort: 40000, DstPort: 443, TCPFlags: TCPSyn, TTL: 64})},
		{name: "tcp6 ack", frame: frame(tcp6), want: v6(Packet{L4: 54, End: 14 + len(tcp6), Proto: ProtoTCP,
			Src: client6, Dst: vip6, SrcPort: 40001, DstPort: 443, TCPFlags: TCPAck, TTL: 64})},
		{name: "udp4", frame: frame(udp4), want: v4(Packet{L4: 34, End: 14 + len(udp4), Proto: ProtoUDP,
			Src: client4, Dst: vip4, SrcPort: 5353, DstPort: 443, TTL: 64})},
		{name: "udp6", frame: frame(udp6), want: v6(Packet{L4: 54, End: 14 + len(udp6), Proto: ProtoUDP,
			Src: client6, Dst: vip6, SrcPort: 5354, DstPort: 443, TTL: 64})},
		{name: "echo4", frame: frame(echo4), want: v4(Packet{L4: 34, End: 14 + len(echo4), Proto: ProtoICMP,
			Src: client4, Dst: vip4, SrcPort: 0x4242, DstPort: 0x4242, TTL: 64, ICMPType: 8})},
		{name: "echo6", frame: frame(echo6), want: v6(Packet{L4: 54, End: 14 + len(echo6), Proto: ProtoICMPv6,
			Src: client6, Dst: vip6, SrcPort: 0x4343, DstPort: 0x4343, TTL: 64, ICMPType: 128})},
		{name: "vlan tcp4", frame: vlanFrame(tcp4, 100), want: Packet{EtherType: EtherTypeIPv4, VLAN: 100, L3: 18, L4: 38,
			End: 18 + len(tcp4), Proto: ProtoTCP, Src: client4, Dst: vip4, SrcPort: 40000, DstPort: 443, TCPFlags: TCPSyn, TTL: 64}},
		{name: "vlan udp6", frame: vlanFrame(udp6, 4095), want: Packet{EtherType: EtherTypeIPv6, VLAN: 4095, L3: 18, L4: 58,
			End: 18 + len(udp6), Proto: ProtoUDP, Src: client6, Dst: vip6, SrcPort: 5354, DstPort: 443, TTL: 64}},
		{name: "ipv4 options", frame: frame(udp4opt), want: v4(Packet{L4: 42, End: 14 + len(udp4opt), Proto: ProtoUDP,
			Src: client4, Dst: vip4, SrcPort: 1, DstPort: 2, TTL: 64})},
		{name: "ipv4 first fragment", frame: frame(fragFirst), want: v4(Packet{L4: 34, End: 14 + len(udp4), Proto: ProtoUDP,
			Src: client4, Dst: vip4, SrcPort: 5353, DstPort: 443, TTL: 64, Fragment: true, FirstFragment: true})},
		{name: "ipv4 later fragment", frame: frame(fragLater), want: v4(Packet{L4: -1, End: 14 + len(udp4), Proto: ProtoUDP,
			Src: client4, Dst: vip4, TTL: 64, Fragment: true})},
		{name: "ipv6 hop-by-hop dest-opts", frame: frame(tcp6ext), want: v6(Packet{L4: 54 + 24, End: 14 + len(tcp6ext), Proto: ProtoTCP,
			Src: client6, Dst: vip6, SrcPort: 40001, DstPort: 443, TCPFlags: TCPAck, TTL: 64})},
		{name: "ipv6 routing first fragment", frame: frame(udp6frag), want: v6(Packet{L4: 54 + 16, End: 14 + len(udp6frag), Proto: ProtoUDP,
			Src: client6, Dst: vip6, SrcPort: 5354, DstPort: 443, TTL: 64, Fragment: true, FirstFragment: true})},
		{name: "ipv6 later fragment", frame: frame(udp6later), want: v6(Packet{L4: -1, End: 14 + len(udp6later), Proto: ProtoUDP,
			Src: client6, Dst: vip6, TTL: 64, Fragment: true})},
		{name: "ipv6 no next header", frame: frame(noNext), want: v6(Packet{L4: -1, End: 14 + len(noNext), Proto: protoNoNext,
			Src: client6, Dst: vip6, TTL: 64})},
		{name: "arp", frame: arp, want: Packet{EtherType: EtherTypeARP, L3: 14, L4: -1, End: 42}},
		{name: "ethernet padding", frame: padded, want: v4(Packet{L4: 34, End: 14 + 28, Proto: ProtoUDP,
			Src: client4, Dst: vip4, SrcPort: 9, DstPort: 10, TTL: 64})},
		{name: "gre", frame: frame(gre), want: v4(Packet{L4: 34, End: 14 + len(gre), Proto: ProtoGRE,
			Src: member4, Dst: ld4, TTL: 64})},
	}
}

func TestParse(t *testing.T) {
	for _, s := range samples(t) {
		t.Run(s.name, func(t *testing.T) {
			var p Packet
			err := Parse(s.frame, &p)
			if err != s.err {
				t.Fatalf("Parse: err %v, want %v", err, s.err)
			}
			if p != s.want {
				t.Errorf("Parse:\n got %+v\nwant %+v", p, s.want)
			}
		})
	}
}

func TestParseIP(t *testing.T) {
	for _, s := range samples(t) {
		if s.want.EtherType == EtherTypeARP {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			// Put the IP packet at offset 3 of an arbitrary buffer.
			b := append([]byte{9, 9, 9}, s.frame[s.want.L3:s.want.End]...)
			var p Packet
			if err := ParseIP(b, 3, &p); err != nil {
				t.Fatalf("ParseIP: %v", err)
			}
			want := s.want
			shift := s.want.L3 - 3
			want.VLAN, want.L3, want.End = 0, 3, s.want.End-shift
			if want.L4 >= 0 {
				want.L4 -= shift
			}
			if p != want {
				t.Errorf("ParseIP:\n got %+v\nwant %+v", p, want)
			}
		})
	}
	var p Packet
	for _, c := range []struct {
		b   []byte
		off int
		err error
	}{
		{nil, 0, ErrTruncated},
		{[]byte{0x45}, -1, ErrTruncated},
		{[]byte{0x45}, 1, ErrTruncated},
		{[]byte{0x55}, 0, ErrMalformed},
		{[]byte{0x45}, 0, ErrTruncated},
		{[]byte{0x60}, 0, ErrTruncated},
	} {
		if err := ParseIP(c.b, c.off, &p); err != c.err {
			t.Errorf("ParseIP(%x, %d) = %v, want %v", c.b, c.off, err, c.err)
		}
	}
}

// TestParseErrors corrupts well-formed frames one field at a time.
func TestParseErrors(t *testing.T) {
	tcp4 := frame(tcpIP(t, client4, vip4, 1, 2, true, nil, nil))
	udp4 := frame(udpIP(t, client4, vip4, 1, 2, []byte("abcd")))
	udp6 := frame(udpIP(t, client6, vip6, 1, 2, []byte("abcd")))
	tcp6 := frame(tcpIP(t, client6, vip6, 1, 2, true, nil, nil))
	mod := func(f []byte, fix bool, edit func(b []byte)) []byte {
		b := clone(f)
		edit(b)
		if fix && b[14]>>4 == 4 {
			fixIPv4Checksum(b, 14)
		}
		return b
	}
	cases := []struct {
		name  string
		frame []byte
		err   error
	}{
		{"empty", nil, ErrTruncated},
		{"13 bytes", tcp4[:13], ErrTruncated},
		{"vlan tag cut", vlanFrame(nil, 1)[:16], ErrTruncated},
		{"ethertype unknown", mod(tcp4, false, func(b []byte) { b[12], b[13] = 0x88, 0xcc }), ErrUnsupported},
		{"double vlan", append(clone(tcp4[:12]), append([]byte{0x81, 0, 0, 1, 0x81, 0, 0, 2, 0x08, 0}, tcp4[14:]...)...), ErrUnsupported},
		{"ipv4 version 5", mod(tcp4, true, func(b []byte) { b[14] = 0x55 }), ErrMalformed},
		{"ipv4 ihl 4", mod(tcp4, false, func(b []byte) { b[14] = 0x44 }), ErrMalformed},
		{"ipv4 ihl beyond frame", mod(tcp4, false, func(b []byte) { b[14] = 0x4f }), ErrTruncated},
		{"ipv4 total < ihl", mod(tcp4, true, func(b []byte) { b[16], b[17] = 0, 19 }), ErrMalformed},
		{"ipv4 total > frame", mod(tcp4, true, func(b []byte) { b[17]++ }), ErrTruncated},
		{"ipv4 checksum", mod(tcp4, false, func(b []byte) { b[24] ^= 1 }), ErrChecksum},
		{"ipv4 ttl changed", mod(tcp4, false, func(b []byte) { b[22]-- }), ErrChecksum},
		{"tcp data offset 4", mod(tcp4, false, func(b []byte) { b[34+12] = 4 << 4 }), ErrMalformed},
		{"tcp data offset beyond packet", mod(tcp4, false, func(b []byte) { b[34+12] = 6 << 4 }), ErrTruncated},
		{"tcp6 data offset 15", mod(tcp6, false, func(b []byte) { b[54+12] = 15 << 4 }), ErrTruncated},
		{"tcp header cut by ip length", mod(tcp4, true, func(b []byte) { b[17] -= 1 }), ErrTruncated},
		{"udp length 7", mod(udp4, false, func(b []byte) { b[34+5] = 7 }), ErrMalformed},
		{"udp length beyond ip", mod(udp4, false, func(b []byte) { b[34+5]++ }), ErrMalformed},
		{"udp6 length beyond ip", mod(udp6, false, func(b []byte) { b[54+5]++ }), ErrMalformed},
		{"ipv6 version 4 under 86dd", mod(udp6, false, func(b []byte) { b[14] = 0x40 }), ErrMalformed},
		{"ipv6 payload length beyond frame", mod(udp6, false, func(b []byte) { b[19]++ }), ErrTruncated},
		{"ipv6 ext header beyond payload", mod(udp6, false, func(b []byte) { b[20] = protoDestOpts; b[54+1] = 200 }), ErrTruncated},
		{"icmp too short", frame(serialize(t, ipv4(client4, vip4, layers.IPProtocolICMPv4), gopacket.Payload{8, 0, 0, 0})), ErrTruncated},
		{"arp too short", append(clone(tcp4[:12]), append([]byte{0x08, 0x06}, make([]byte, 27)...)...), ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p Packet
			if err := Parse(c.frame, &p); err != c.err {
				t.Fatalf("Parse = %v, want %v", err, c.err)
			}
		})
	}
}

// TestParseTruncatedEveryOffset cuts every sample at every length: each cut inside
// the IP packet is ErrTruncated, never a panic and never success.
func TestParseTruncatedEveryOffset(t *testing.T) {
	for _, s := range samples(t) {
		t.Run(s.name, func(t *testing.T) {
			var p Packet
			for n := range s.want.End {
				if err := Parse(s.frame[:n], &p); err != ErrTruncated {
					t.Fatalf("Parse(frame[:%d]) = %v, want ErrTruncated", n, err)
				}
			}
			for n := s.want.End; n <= len(s.frame); n++ {
				if err := Parse(s.frame[:n], &p); err != nil {
					t.Fatalf("Parse(frame[:%d]) = %v, want success", n, err)
				}
			}
		})
	}
}

func TestParseExtensionHeaderLimit(t *testing.T) {
	udp6 := udpIP(t, client6, vip6, 1, 2, nil)
	var ext []byte
	for i := range maxExtHeaders + 1 {
		nh := byte(protoDestOpts)
		if i == maxExtHeaders {
			nh = ProtoUDP
		}
		ext = append(ext, nh, 0, 1, 4, 0, 0, 0, 0)
	}
	var p Packet
	f := frame(insertV6Ext(udp6, protoDestOpts, ext))
	if err := Parse(f, &p); err != nil {
		t.Fatal(err)
	}
	if p.L4 != -1 || p.Proto != protoDestOpts {
		t.Errorf("chain of %d headers: L4 %d Proto %d, want -1 and %d", maxExtHeaders+1, p.L4, p.Proto, protoDestOpts)
	}
	f = frame(insertV6Ext(udp6, protoDestOpts, ext[8:]))
	if err := Parse(f, &p); err != nil || p.Proto != ProtoUDP || p.L4 != 14+40+8*maxExtHeaders {
		t.Errorf("chain of %d headers: err %v L4 %d Proto %d", maxExtHeaders, err, p.L4, p.Proto)
	}
}

// TestParseAgainstGopacket decodes every sample with gopacket too and compares the
// fields both report.
func TestParseAgainstGopacket(t *testing.T) {
	for _, s := range samples(t) {
		var p Packet
		if err := Parse(s.frame, &p); err != nil || p.L4 < 0 {
			continue
		}
		g := gopacket.NewPacket(s.frame, layers.LayerTypeEthernet, gopacket.Default)
		nl := g.NetworkLayer()
		if nl == nil {
			t.Errorf("%s: gopacket found no network layer", s.name)
			continue
		}
		src, _ := netip.AddrFromSlice(nl.NetworkFlow().Src().Raw())
		dst, _ := netip.AddrFromSlice(nl.NetworkFlow().Dst().Raw())
		if src != p.Src || dst != p.Dst {
			t.Errorf("%s: addresses %v→%v, gopacket %v→%v", s.name, p.Src, p.Dst, src, dst)
		}
		if tl := g.TransportLayer(); tl != nil && (p.Proto == ProtoTCP || p.Proto == ProtoUDP) {
			f := tl.TransportFlow()
			sp, dp := binary.BigEndian.Uint16(f.Src().Raw()), binary.BigEndian.Uint16(f.Dst().Raw())
			if sp != p.SrcPort || dp != p.DstPort {
				t.Errorf("%s: ports %d→%d, gopacket %d→%d", s.name, p.SrcPort, p.DstPort, sp, dp)
			}
		}
	}
}

func TestSentinelErrorsDistinct(t *testing.T) {
	errs := []error{ErrTruncated, ErrMalformed, ErrChecksum, ErrUnsupported, ErrNoRoom, ErrNotPrepared}
	for i, a := range errs {
		for j, b := range errs {
			if (i == j) != errors.Is(a, b) {
				t.Errorf("errors.Is(%v, %v) = %v", a, b, errors.Is(a, b))
			}
		}
	}
}
