package packet

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/wire"
)

func TestChecksumAdjust16(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		b := make([]byte, 2*(1+r.IntN(40)))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if r.IntN(8) == 0 {
			clear(b)
		}
		sum := wire.Checksum(b, 0)
		i := r.IntN(len(b) - 1)
		var old, nw uint16
		old = binary.BigEndian.Uint16(b[i:])
		nw = uint16(r.Uint32())
		if r.IntN(8) == 0 {
			nw = 0
		}
		binary.BigEndian.PutUint16(b[i:], nw)
		if i%2 == 1 {
			old, nw = bits.ReverseBytes16(old), bits.ReverseBytes16(nw)
		}
		got := ChecksumAdjust16(sum, old, nw)
		want := wire.Checksum(b, 0)
		// Incremental and full computation may differ only between the two
		// representations of zero.
		if got != want && !(got|want == 0xffff && got&want == 0) {
			t.Fatalf("adjust at %d: %#04x, full %#04x", i, got, want)
		}
	}
}

// TestVerifyL4Checksum checks gopacket-built packets (checksums computed by gopacket)
// verify, and that flipping any byte of the segment makes them fail.
func TestVerifyL4Checksum(t *testing.T) {
	frames := map[string][]byte{
		"tcp4":     frame(tcpIP(t, client4, vip4, 1, 2, true, nil, []byte("abc"))),
		"tcp6":     frame(tcpIP(t, client6, vip6, 1, 2, false, nil, []byte("abcdefgh"))),
		"udp4":     frame(udpIP(t, client4, vip4, 1, 2, []byte("odd"))),
		"udp6":     frame(udpIP(t, client6, vip6, 1, 2, []byte("even"))),
		"icmp4":    frame(echoIP(t, client4, vip4, 1, 2, []byte("x"))),
		"icmpv6":   frame(echoIP(t, client6, vip6, 1, 2, []byte("xy"))),
		"udp4 pad": append(frame(udpIP(t, client4, vip4, 1, 2, nil)), 0xde, 0xad, 0xbe, 0xef),
	}
	for name, f := range frames {
		var p Packet
		if err := Parse(f, &p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !VerifyL4Checksum(f, &p) {
			t.Errorf("%s: checksum from gopacket does not verify", name)
		}
		for i := p.L4; i < p.End; i++ {
			g := clone(f)
			g[i] ^= 0x10
			if VerifyL4Checksum(g, &p) {
				t.Errorf("%s: corrupt byte %d verifies", name, i)
			}
		}
	}
	// UDP checksum 0: none over IPv4, invalid over IPv6.
	for _, c := range []struct {
		f    []byte
		want bool
	}{
		{frame(udpIP(t, client4, vip4, 1, 2, []byte("a"))), true},
		{frame(udpIP(t, client6, vip6, 1, 2, []byte("a"))), false},
	} {
		var p Packet
		if err := Parse(c.f, &p); err != nil {
			t.Fatal(err)
		}
		c.f[p.L4+6], c.f[p.L4+7] = 0, 0
		if got := VerifyL4Checksum(c.f, &p); got != c.want {
			t.Errorf("%v UDP checksum 0: %v, want %v", p.Src, got, c.want)
		}
	}
	// Fragments and unknown protocols cannot be verified.
	gre := frame(serialize(t, ipv4(member4, ld4, layers.IPProtocolGRE), &layers.GRE{Protocol: layers.EthernetTypeIPv4}))
	var p Packet
	if err := Parse(gre, &p); err != nil {
		t.Fatal(err)
	}
	if VerifyL4Checksum(gre, &p) {
		t.Error("GRE verifies")
	}
	// A packet that does not belong to b must not panic.
	p.L4, p.End, p.Proto = 10, 1000, ProtoTCP
	if VerifyL4Checksum(gre, &p) {
		t.Error("inconsistent packet verifies")
	}
}

func TestPseudoHeaderSum(t *testing.T) {
	// Cross-check with gopacket: a TCP segment's checksum field equals
	// wire.Checksum(segment with zero checksum, PseudoHeaderSum).
	for _, pair := range [][2]string{{"198.51.100.7", "203.0.113.10"}, {"2001:db8::1", "2001:db8::ffff:2"}} {
		src, dst := netip.MustParseAddr(pair[0]), netip.MustParseAddr(pair[1])
		pkt := tcpIP(t, src, dst, 1234, 80, false, nil, []byte("payload!!"))
		var p Packet
		if err := ParseIP(pkt, 0, &p); err != nil {
			t.Fatal(err)
		}
		seg := clone(pkt[p.L4:p.End])
		want := binary.BigEndian.Uint16(seg[16:])
		seg[16], seg[17] = 0, 0
		if got := wire.Checksum(seg, PseudoHeaderSum(src, dst, ProtoTCP, len(seg))); got != want {
			t.Errorf("%v: %#04x, gopacket %#04x", src, got, want)
		}
	}
	// Mixed families and the zero Addr must not panic.
	_ = PseudoHeaderSum(client4, vip6, ProtoTCP, 20)
	_ = PseudoHeaderSum(vip6, client4, ProtoTCP, 20)
	_ = PseudoHeaderSum(netip.Addr{}, client4, 0, 0)
}
