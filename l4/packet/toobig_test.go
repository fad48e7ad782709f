package packet

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// tooBig runs TooBig on frame f given 64 bytes of headroom and returns the error frame.
func tooBig(t *testing.T, f []byte, src netip.Addr, mtu int) ([]byte, error) {
	t.Helper()
	const room = 64
	buf := withHeadroom(f, room)
	var p Packet
	if err := Parse(buf[room:], &p); err != nil {
		t.Fatalf("parsing the offending frame: %v", err)
	}
	start, n, err := TooBig(buf, room, &p, src, macB, mtu, 7)
	if err != nil {
		return nil, err
	}
	return buf[start : start+n], nil
}

func TestTooBig(t *testing.T) {
	big := bytes.Repeat([]byte{0x5a}, 1450)
	for _, tc := range []struct {
		name       string
		ipPkt      []byte
		src        netip.Addr
		mtu        int
		wantQuote  int
		wantLength int
	}{
		{"udp4", udpIP(t, client4, vip4, 5000, 443, big), ld4, 1476, 576 - 28, 576},
		{"tcp4 short", tcpIP(t, client4, vip4, 5000, 443, false, nil, []byte("abc")), ld4, 1476, 43, 20 + 8 + 43},
		{"udp6", udpIP(t, client6, vip6, 5000, 443, big), ld6, 1456, 1280 - 48, 1280},
		{"udp6 short", udpIP(t, client6, vip6, 5000, 443, []byte("abc")), ld6, 1456, 51, 40 + 8 + 51},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := frame(tc.ipPkt)
			out, err := tooBig(t, f, tc.src, tc.mtu)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != EthernetLen+tc.wantLength {
				t.Fatalf("error frame of %d bytes, want %d", len(out), EthernetLen+tc.wantLength)
			}
			// Back to the sender: the Ethernet addresses are the frame's source and ours.
			if !bytes.Equal(out[0:6], f[6:12]) || !bytes.Equal(out[6:12], macB[:]) {
				t.Errorf("Ethernet %x → %x, want %x → %x", out[6:12], out[0:6], macB, f[6:12])
			}
			var p Packet
			if err := Parse(out, &p); err != nil {
				t.Fatalf("the error does not parse: %v", err) // the IPv4 header checksum included
			}
			wantDst := client4
			if tc.src.Is6() {
				wantDst = client6
			}
			if p.Src != tc.src || p.Dst != wantDst || p.TTL != 64 {
				t.Errorf("error %s → %s TTL %d", p.Src, p.Dst, p.TTL)
			}
			if !VerifyL4Checksum(out, &p) {
				t.Error("ICMP checksum does not verify")
			}
			icmp := out[p.L4:p.End]
			var mtu int
			if tc.src.Is6() {
				if p.Proto != ProtoICMPv6 || icmp[0] != ICMPv6PacketTooBig || icmp[1] != 0 {
					t.Errorf("ICMPv6 type %d code %d", icmp[0], icmp[1])
				}
				mtu = int(binary.BigEndian.Uint32(icmp[4:]))
			} else {
				if p.Proto != ProtoICMP || icmp[0] != 3 || icmp[1] != 4 || icmp[4] != 0 || icmp[5] != 0 {
					t.Errorf("ICMP type %d code %d, unused % x", icmp[0], icmp[1], icmp[4:6])
				}
				mtu = int(binary.BigEndian.Uint16(icmp[6:]))
			}
			if mtu != tc.mtu {
				t.Errorf("MTU %d, want %d", mtu, tc.mtu)
			}
			if q := icmp[8:]; !bytes.Equal(q, tc.ipPkt[:tc.wantQuote]) {
				t.Errorf("quote of %d bytes is not the first %d of the packet", len(q), tc.wantQuote)
			}
			// The quoted packet is found again, as a router on the way would.
			var in Packet
			if err := ICMPEmbedded(out, &p, &in); err != nil || in.Src.Unmap() != p.Dst.Unmap() || in.DstPort != 443 {
				t.Errorf("quoted packet %+v, %v", in, err)
			}
			// An independent decoder agrees.
			pk := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
			if el := pk.ErrorLayer(); el != nil {
				t.Errorf("gopacket: %v", el.Error())
			}
		})
	}
}

func TestTooBigRefuses(t *testing.T) {
	udp4 := frame(udpIP(t, client4, vip4, 5000, 443, make([]byte, 100)))
	icmpErr := frame(serialize(t, ipv4(client4, vip4, layers.IPProtocolICMPv4),
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4)}, gopacket.Payload(make([]byte, 28))))
	icmp6Err := frame(func() []byte {
		n := ipv6(client6, vip6, layers.IPProtocolICMPv6)
		ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(1, 0)}
		_ = ic.SetNetworkLayerForChecksum(n)
		return serialize(t, n, ic, gopacket.Payload(make([]byte, 48)))
	}())
	multicast := frame(udpIP(t, mustParse("224.0.0.5"), vip4, 5000, 443, nil))
	loop6 := frame(udpIP(t, mustParse("::1"), vip6, 5000, 443, nil))
	laterFrag := clone(udp4)
	binary.BigEndian.PutUint16(laterFrag[EthernetLen+6:], 0x4000|10) // DF, offset 80
	fixIPv4Checksum(laterFrag, EthernetLen)
	for _, tc := range []struct {
		name string
		f    []byte
		src  netip.Addr
		want error
	}{
		{"icmp error", icmpErr, ld4, ErrUnsupported},
		{"icmpv6 error", icmp6Err, ld6, ErrUnsupported},
		{"multicast source", multicast, ld4, ErrUnsupported},
		{"loopback source", loop6, ld6, ErrUnsupported},
		{"later fragment", laterFrag, ld4, ErrUnsupported},
		{"source of the other family", udp4, ld6, ErrUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tooBig(t, tc.f, tc.src, 1400); err != tc.want {
				t.Fatalf("TooBig = %v, want %v", err, tc.want)
			}
		})
	}
	// Without headroom there is no room for the headers.
	var p Packet
	if err := Parse(udp4, &p); err != nil {
		t.Fatal(err)
	}
	if _, _, err := TooBig(clone(udp4), 0, &p, ld4, macB, 1400, 1); err != ErrNoRoom {
		t.Fatalf("TooBig without headroom = %v, want ErrNoRoom", err)
	}
}

func TestTooBigAllocs(t *testing.T) {
	f := withHeadroom(frame(udpIP(t, client6, vip6, 5000, 443, make([]byte, 1400))), 64)
	orig := clone(f)
	var p Packet
	if err := Parse(f[64:], &p); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		copy(f, orig)
		if _, _, err := TooBig(f, 64, &p, ld6, macB, 1400, 1); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("TooBig allocates %v times", n)
	}
}

// FuzzTooBig turns every frame that parses into its ICMP error: TooBig never panics
// nor writes outside the frame's headroom, and what it writes parses back as an ICMP
// error from src whose checksum verifies and that quotes the frame's packet.
func FuzzTooBig(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, uint16(1400))
	}
	f.Fuzz(func(t *testing.T, b []byte, mtu uint16) {
		const room = 64
		var p Packet
		perr := Parse(b, &p)
		src := ld4
		if p.EtherType == EtherTypeIPv6 {
			src = ld6
		}
		buf := withHeadroom(b, room)
		buf = append(buf, 0xee, 0xee, 0xee, 0xee)[:len(buf)] // bytes past the frame that must not change
		start, n, err := TooBig(buf, room, &p, src, macB, int(mtu), 9)
		if !bytes.Equal(buf[:len(buf)+4][len(buf):], []byte{0xee, 0xee, 0xee, 0xee}) {
			t.Fatal("TooBig wrote past the frame")
		}
		if err != nil || perr != nil {
			return
		}
		if start < 0 || start+n > len(buf) || start+n > room+p.End {
			t.Fatalf("error frame %d+%d outside the frame (%d+%d)", start, n, room, p.End)
		}
		out := buf[start : start+n]
		var q Packet
		if err := Parse(out, &q); err != nil {
			t.Fatalf("the error frame does not parse: %v", err)
		}
		if q.Src != src || q.Dst != p.Src || !VerifyL4Checksum(out, &q) {
			t.Fatalf("error %s → %s (checksum %v) about a packet from %s", q.Src, q.Dst, VerifyL4Checksum(out, &q), p.Src)
		}
		if !bytes.Equal(out[q.L4+8:], b[p.L3:p.L3+len(out)-q.L4-8]) {
			t.Fatal("the quote is not the packet's start")
		}
	})
}
