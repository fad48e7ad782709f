package packet

import (
	"bytes"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// icmpError builds an ICMP (v4) or ICMPv6 error from router to the VIP quoting the
// first n bytes of quoted (all if n < 0).
func icmpError(t *testing.T, typ, code uint8, quoted []byte, n int) []byte {
	t.Helper()
	if n >= 0 && n < len(quoted) {
		quoted = quoted[:n]
	}
	router4, router6 := ld4, ld6
	if quoted[0]>>4 == 4 {
		// Id and Seq are the "rest of header": unused, next-hop MTU 1500.
		return frame(serialize(t, ipv4(router4, vip4, layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code), Seq: 1500}, gopacket.Payload(quoted)))
	}
	n6 := ipv6(router6, vip6, layers.IPProtocolICMPv6)
	ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)}
	_ = ic.SetNetworkLayerForChecksum(n6)
	body := append([]byte{0, 0, 0x05, 0x00}, quoted...) // MTU 1280
	return frame(serialize(t, n6, ic, gopacket.Payload(body)))
}

func TestICMPEmbedded(t *testing.T) {
	big := bytes.Repeat([]byte{0xaa}, 1400)
	tcp4 := tcpIP(t, vip4, client4, 443, 40000, false, nil, big) // the VIP's reply
	udp6 := udpIP(t, vip6, client6, 443, 50000, big)
	echo4 := echoIP(t, vip4, client4, 77, 1, nil)
	tcp6ext := insertV6Ext(tcpIP(t, vip6, client6, 443, 40001, false, nil, big), protoDestOpts, []byte{ProtoTCP, 0, 1, 4, 0, 0, 0, 0})
	cases := []struct {
		name  string
		frame []byte
		err   error
		want  Packet // checked fields: EtherType, Src, Dst, Proto, ports, L4 (relative to L3)
		l4rel int
	}{
		{"frag needed tcp4 28 bytes", icmpError(t, 3, 4, tcp4, 28), nil,
			Packet{EtherType: EtherTypeIPv4, Src: vip4, Dst: client4, Proto: ProtoTCP, SrcPort: 443, DstPort: 40000}, 20},
		{"frag needed tcp4 576 bytes", icmpError(t, 3, 4, tcp4, 548), nil,
			Packet{EtherType: EtherTypeIPv4, Src: vip4, Dst: client4, Proto: ProtoTCP, SrcPort: 443, DstPort: 40000, TCPFlags: TCPAck}, 20},
		{"time exceeded echo4", icmpError(t, 11, 0, echo4, -1), nil,
			Packet{EtherType: EtherTypeIPv4, Src: vip4, Dst: client4, Proto: ProtoICMP, SrcPort: 77, DstPort: 77, ICMPType: 8}, 20},
		{"param problem tcp4", icmpError(t, 12, 0, tcp4, 40), nil,
			Packet{EtherType: EtherTypeIPv4, Src: vip4, Dst: client4, Proto: ProtoTCP, SrcPort: 443, DstPort: 40000, TCPFlags: TCPAck}, 20},
		{"packet too big udp6", icmpError(t, 2, 0, udp6, 1232), nil,
			Packet{EtherType: EtherTypeIPv6, Src: vip6, Dst: client6, Proto: ProtoUDP, SrcPort: 443, DstPort: 50000}, 40},
		{"dest unreachable udp6 48 bytes", icmpError(t, 1, 4, udp6, 48), nil,
			Packet{EtherType: EtherTypeIPv6, Src: vip6, Dst: client6, Proto: ProtoUDP, SrcPort: 443, DstPort: 50000}, 40},
		{"packet too big tcp6 ext", icmpError(t, 2, 0, tcp6ext, 56), nil,
			Packet{EtherType: EtherTypeIPv6, Src: vip6, Dst: client6, Proto: ProtoTCP, SrcPort: 443, DstPort: 40001}, 48},
		{"quote 27 bytes", icmpError(t, 3, 4, tcp4, 27), ErrTruncated, Packet{}, 0},
		{"quote 19 bytes", icmpError(t, 3, 4, tcp4, 19), ErrTruncated, Packet{}, 0},
		{"quote v6 47 bytes", icmpError(t, 2, 0, udp6, 47), ErrTruncated, Packet{}, 0},
		{"echo request is no error", frame(echoIP(t, client4, vip4, 1, 1, nil)), ErrUnsupported, Packet{}, 0},
		{"echo6 is no error", frame(echoIP(t, client6, vip6, 1, 1, nil)), ErrUnsupported, Packet{}, 0},
		{"tcp is no error", frame(tcp4), ErrUnsupported, Packet{}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p, in Packet
			if err := Parse(c.frame, &p); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			err := ICMPEmbedded(c.frame, &p, &in)
			if err != c.err {
				t.Fatalf("ICMPEmbedded = %v, want %v", err, c.err)
			}
			if err != nil {
				return
			}
			if in.EtherType != c.want.EtherType || in.Src != c.want.Src || in.Dst != c.want.Dst || in.Proto != c.want.Proto ||
				in.SrcPort != c.want.SrcPort || in.DstPort != c.want.DstPort || in.TCPFlags != c.want.TCPFlags || in.ICMPType != c.want.ICMPType {
				t.Errorf("inner %+v, want %+v", in, c.want)
			}
			if in.L3 != p.L4+8 || in.L4 != in.L3+c.l4rel || in.End != p.End {
				t.Errorf("inner offsets L3 %d L4 %d End %d; outer L4 %d End %d", in.L3, in.L4, in.End, p.L4, p.End)
			}
		})
	}
}

func TestICMPEmbeddedWrongFamily(t *testing.T) {
	// An ICMPv4 error quoting an IPv6 header.
	udp6 := udpIP(t, vip6, client6, 443, 50000, nil)
	f := frame(serialize(t, ipv4(ld4, vip4, layers.IPProtocolICMPv4),
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4)}, gopacket.Payload(udp6)))
	var p, in Packet
	if err := Parse(f, &p); err != nil {
		t.Fatal(err)
	}
	if err := ICMPEmbedded(f, &p, &in); err != ErrMalformed {
		t.Errorf("v6 quoted in ICMPv4: %v, want ErrMalformed", err)
	}
}

func TestEchoReply(t *testing.T) {
	for _, c := range []struct {
		name     string
		src, dst string
	}{{"v4", "198.51.100.7", "203.0.113.10"}, {"v6", "2001:db8:1::7", "2001:db8:ffff::10"}} {
		t.Run(c.name, func(t *testing.T) {
			src, dst := mustParse(c.src), mustParse(c.dst)
			f := frame(echoIP(t, src, dst, 0x1234, 9, []byte("0123456789abcdef!")))
			var p Packet
			if err := Parse(f, &p); err != nil {
				t.Fatal(err)
			}
			if !EchoReply(f, &p) {
				t.Fatal("EchoReply = false")
			}
			var q Packet
			if err := Parse(f, &q); err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			if q != p {
				t.Errorf("EchoReply left p %+v, reply parses as %+v", p, q)
			}
			wantType := uint8(ICMPEchoReply)
			if src.Is6() {
				wantType = ICMPv6EchoReply
			}
			if q.Src != dst || q.Dst != src || q.ICMPType != wantType || q.TTL != 64 || q.SrcPort != 0x1234 {
				t.Errorf("reply %+v", q)
			}
			if MAC(f[0:6]) != macA || MAC(f[6:12]) != macB {
				t.Errorf("MACs not swapped: %x", f[:12])
			}
			if !VerifyL4Checksum(f, &q) {
				t.Error("reply ICMP checksum wrong")
			}
			// gopacket agrees it is an echo reply.
			g := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
			if src.Is4() {
				ic := g.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
				if ic.TypeCode.Type() != layers.ICMPv4TypeEchoReply || ic.Id != 0x1234 || ic.Seq != 9 {
					t.Errorf("gopacket: %v", ic.TypeCode)
				}
			} else if ic := g.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ic.TypeCode.Type() != layers.ICMPv6TypeEchoReply {
				t.Errorf("gopacket: %v", ic.TypeCode)
			}
			// A reply is not a request: a second call changes nothing.
			before := clone(f)
			if EchoReply(f, &q) || !bytes.Equal(f, before) {
				t.Error("EchoReply answered a reply")
			}
		})
	}
	var p Packet
	for name, f := range map[string][]byte{
		"tcp":       frame(tcpIP(t, client4, vip4, 1, 2, true, nil, nil)),
		"dest unr.": icmpError(t, 3, 1, tcpIP(t, vip4, client4, 1, 2, false, nil, nil), -1),
	} {
		if err := Parse(f, &p); err != nil {
			t.Fatal(err)
		}
		before := clone(f)
		if EchoReply(f, &p) || !bytes.Equal(f, before) {
			t.Errorf("%s: EchoReply changed it", name)
		}
	}
	// A fragmented echo request is not answered in place.
	f := frame(echoIP(t, client4, vip4, 1, 1, []byte("x")))
	f[20] = 0x20
	fixIPv4Checksum(f, 14)
	if err := Parse(f, &p); err != nil {
		t.Fatal(err)
	}
	if EchoReply(f, &p) {
		t.Error("answered a fragment")
	}
}
