package packet

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/wire"
)

func TestARPRoundTrip(t *testing.T) {
	for _, a := range []ARP{
		{Op: ARPRequest, SenderMAC: macA, SenderIP: ld4, TargetIP: member4},
		{Op: ARPReply, SenderMAC: macB, SenderIP: vip4, TargetMAC: macA, TargetIP: client4},
	} {
		f := AppendARP(nil, Broadcast, a.SenderMAC, &a)
		if len(f) != ARPFrameLen {
			t.Fatalf("len %d", len(f))
		}
		var p Packet
		if err := Parse(f, &p); err != nil {
			t.Fatal(err)
		}
		var got ARP
		if err := ParseARP(f, &p, &got); err != nil {
			t.Fatal(err)
		}
		if got != a {
			t.Errorf("round trip %+v, want %+v", got, a)
		}
		g := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		ga, _ := g.Layer(layers.LayerTypeARP).(*layers.ARP)
		if ga == nil || ga.Operation != a.Op || !bytes.Equal(ga.SourceProtAddress, a.SenderIP.AsSlice()) ||
			!bytes.Equal(ga.DstHwAddress, a.TargetMAC[:]) || !bytes.Equal(ga.DstProtAddress, a.TargetIP.AsSlice()) {
			t.Errorf("gopacket decodes %+v", ga)
		}
	}
	// Appending reuses capacity and keeps the prefix.
	buf := make([]byte, 3, 64)
	out := AppendARP(buf, Broadcast, macA, &ARP{Op: 1, SenderIP: ld4, TargetIP: netip.MustParseAddr("2001:db8::1")})
	if &out[0] != &buf[0] || len(out) != 3+ARPFrameLen || !bytes.Equal(out[3+38:], []byte{0, 0, 0, 0}) {
		t.Errorf("append: len %d, target %x", len(out), out[3+38:])
	}
}

func TestParseARPErrors(t *testing.T) {
	good := AppendARP(nil, Broadcast, macA, &ARP{Op: 1, SenderIP: ld4, TargetIP: member4})
	vlan := append(append(clone(good[:12]), 0x81, 0, 0, 7), good[12:]...)
	var p Packet
	var a ARP
	if err := Parse(vlan, &p); err != nil || p.VLAN != 7 {
		t.Fatalf("vlan arp: %v %+v", err, p)
	}
	if err := ParseARP(vlan, &p, &a); err != nil || a.TargetIP != member4 {
		t.Errorf("vlan arp: %v %+v", err, a)
	}
	for _, c := range []struct {
		name string
		edit func(b []byte)
		err  error
	}{
		{"op 3", func(b []byte) { b[21] = 3 }, ErrUnsupported},
		{"htype 6", func(b []byte) { b[15] = 6 }, ErrUnsupported},
		{"ptype ipv6", func(b []byte) { b[16], b[17] = 0x86, 0xdd }, ErrUnsupported},
		{"hlen 8", func(b []byte) { b[18] = 8 }, ErrUnsupported},
		{"plen 16", func(b []byte) { b[19] = 16 }, ErrUnsupported},
	} {
		f := clone(good)
		c.edit(f)
		if err := Parse(f, &p); err != nil {
			t.Fatal(err)
		}
		if err := ParseARP(f, &p, &a); err != c.err {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
	if err := Parse(good, &p); err != nil {
		t.Fatal(err)
	}
	if err := ParseARP(good[:41], &p, &a); err != ErrTruncated {
		t.Errorf("short: %v", err)
	}
	udp := frame(udpIP(t, client4, vip4, 1, 2, nil))
	if err := Parse(udp, &p); err != nil {
		t.Fatal(err)
	}
	if err := ParseARP(udp, &p, &a); err != ErrUnsupported {
		t.Errorf("udp: %v", err)
	}
}

func TestSolicitedNode(t *testing.T) {
	for _, c := range []struct{ in, ip, mac string }{
		{"2001:db8::1:2:3", "ff02::1:ff02:3", "33:33:ff:02:00:03"},
		{"fe80::abcd:ef01:2345:6789", "ff02::1:ff45:6789", "33:33:ff:45:67:89"},
		{"2001:db8::", "ff02::1:ff00:0", "33:33:ff:00:00:00"},
	} {
		a, m := SolicitedNode(netip.MustParseAddr(c.in))
		if a.String() != c.ip || m.String() != c.mac {
			t.Errorf("SolicitedNode(%s) = %v %v, want %s %s", c.in, a, m, c.ip, c.mac)
		}
	}
	if a, m := SolicitedNode(client4); a.IsValid() || !m.IsZero() {
		t.Errorf("IPv4: %v %v", a, m)
	}
	if a, m := SolicitedNode(netip.Addr{}); a.IsValid() || !m.IsZero() {
		t.Errorf("zero: %v %v", a, m)
	}
}

func TestNSRoundTrip(t *testing.T) {
	f := AppendNS(nil, macA, ld6, member6)
	if len(f) != NSFrameLen {
		t.Fatalf("len %d", len(f))
	}
	var p Packet
	if err := Parse(f, &p); err != nil {
		t.Fatal(err)
	}
	snIP, snMAC := SolicitedNode(member6)
	if p.Dst != snIP || MAC(f[0:6]) != snMAC || MAC(f[6:12]) != macA || p.TTL != 255 || p.Src != ld6 {
		t.Errorf("NS headers: %+v dst MAC %x", p, f[:6])
	}
	var nd ND
	if err := ParseND(f, &p, &nd); err != nil {
		t.Fatal(err)
	}
	if nd != (ND{Type: ICMPv6NS, Target: member6, LinkAddr: macA, HasLinkAddr: true}) {
		t.Errorf("ND %+v", nd)
	}
	checkICMPv6WithGopacket(t, f)

	// Duplicate address detection: unspecified source, no option.
	f = AppendNS(nil, macA, netip.IPv6Unspecified(), member6)
	if err := Parse(f, &p); err != nil {
		t.Fatal(err)
	}
	if err := ParseND(f, &p, &nd); err != nil || nd.HasLinkAddr || len(f) != NSFrameLen-8 {
		t.Errorf("DAD NS: %v %+v len %d", err, nd, len(f))
	}
	checkICMPv6WithGopacket(t, f)
}

func TestNARoundTrip(t *testing.T) {
	for _, c := range []struct {
		name      string
		dst       netip.Addr
		solicited bool
		wantDst   netip.Addr
		wantMAC   MAC
		flags     uint8
	}{
		{"solicited", member6, true, member6, macB, NDSolicited | NDOverride},
		{"unsolicited", member6, false, member6, macB, NDOverride},
		{"dad answer", netip.IPv6Unspecified(), true, netip.MustParseAddr("ff02::1"), MAC{0x33, 0x33, 0, 0, 0, 1}, NDOverride},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := AppendNA(nil, macA, macB, vip6, c.dst, vip6, c.solicited)
			var p Packet
			if err := Parse(f, &p); err != nil {
				t.Fatal(err)
			}
			if p.Dst != c.wantDst || MAC(f[0:6]) != c.wantMAC {
				t.Errorf("sent to %v %v", p.Dst, MAC(f[0:6]))
			}
			var nd ND
			if err := ParseND(f, &p, &nd); err != nil {
				t.Fatal(err)
			}
			if nd != (ND{Type: ICMPv6NA, Target: vip6, LinkAddr: macA, HasLinkAddr: true, Flags: c.flags}) {
				t.Errorf("ND %+v", nd)
			}
			checkICMPv6WithGopacket(t, f)
		})
	}
}

// checkICMPv6WithGopacket decodes f with gopacket, re-serializes the ICMPv6 message with
// checksums computed by gopacket and compares.
func checkICMPv6WithGopacket(t *testing.T, f []byte) {
	t.Helper()
	g := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
	ip6, _ := g.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
	ic, _ := g.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
	if ip6 == nil || ic == nil {
		t.Fatalf("gopacket: %v", g.ErrorLayer())
	}
	want := ic.Checksum
	_ = ic.SetNetworkLayerForChecksum(ip6)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, ic, gopacket.Payload(ic.Payload)); err != nil {
		t.Fatal(err)
	}
	if ic.Checksum != want {
		t.Errorf("ICMPv6 checksum %#04x, gopacket computes %#04x", want, ic.Checksum)
	}
}

func TestParseNDErrors(t *testing.T) {
	good := AppendNA(nil, macA, macB, vip6, member6, vip6, true)
	var p Packet
	var nd ND
	fix := func(b []byte) {
		// Recompute the ICMPv6 checksum after an edit.
		if err := Parse(b, &p); err != nil {
			t.Fatal(err)
		}
		b[p.L4+2], b[p.L4+3] = 0, 0
		c := wire.Checksum(b[p.L4:p.End], PseudoHeaderSum(p.Src, p.Dst, ProtoICMPv6, p.End-p.L4))
		b[p.L4+2], b[p.L4+3] = byte(c>>8), byte(c)
	}
	for _, c := range []struct {
		name string
		edit func(b []byte)
		err  error
	}{
		{"hop limit 64", func(b []byte) { b[21] = 64 }, ErrMalformed},
		{"code 1", func(b []byte) { b[55] = 1; fix(b) }, ErrMalformed},
		{"checksum", func(b []byte) { b[70] ^= 1 }, ErrChecksum},
		{"multicast target", func(b []byte) { b[62] = 0xff; fix(b) }, ErrMalformed},
		{"option length 0", func(b []byte) { b[79] = 0; fix(b) }, ErrMalformed},
		{"option longer than message", func(b []byte) { b[79] = 2; fix(b) }, ErrMalformed},
		{"router solicitation", func(b []byte) { b[54] = 133; fix(b) }, ErrUnsupported},
	} {
		f := clone(good)
		c.edit(f)
		if err := Parse(f, &p); err != nil {
			t.Fatalf("%s: Parse: %v", c.name, err)
		}
		if err := ParseND(f, &p, &nd); err != c.err {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
	// Unknown options are skipped; a wrong-sized link-layer option is ignored.
	f := append(clone(good), 99, 1, 0, 0, 0, 0, 0, 0, ndOptTargetLinkAddr, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	f[19] += 24
	f[80] ^= 0xff // change the real option's MAC to check it stays
	fix(f)
	if err := Parse(f, &p); err != nil {
		t.Fatal(err)
	}
	if err := ParseND(f, &p, &nd); err != nil || nd.LinkAddr != MAC(f[80:86]) {
		t.Errorf("extra options: %v %+v", err, nd)
	}
	// IPv4 packets are not ND.
	udp := frame(udpIP(t, client4, vip4, 1, 2, nil))
	if err := Parse(udp, &p); err != nil {
		t.Fatal(err)
	}
	if err := ParseND(udp, &p, &nd); err != ErrUnsupported {
		t.Errorf("udp4: %v", err)
	}
}
