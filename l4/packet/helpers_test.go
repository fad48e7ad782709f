package packet

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/wire"
)

// Test addresses from the documentation and benchmarking ranges.
var (
	client4 = netip.MustParseAddr("198.51.100.7")
	vip4    = netip.MustParseAddr("203.0.113.10")
	ld4     = netip.MustParseAddr("198.18.0.1")
	member4 = netip.MustParseAddr("198.18.0.20")
	client6 = netip.MustParseAddr("2001:db8:1::7")
	vip6    = netip.MustParseAddr("2001:db8:ffff::10")
	ld6     = netip.MustParseAddr("2001:db8:2::1")
	member6 = netip.MustParseAddr("2001:db8:2::20")

	macA = MAC{0x02, 0x00, 0x00, 0x00, 0x00, 0x0a}
	macB = MAC{0x02, 0x00, 0x00, 0x00, 0x00, 0x0b}
)

func mustParse(s string) netip.Addr { return netip.MustParseAddr(s) }

func ip(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }

func hw(m MAC) net.HardwareAddr { return net.HardwareAddr(m[:]) }

// serialize builds bytes with gopacket, fixing lengths and computing checksums.
func serialize(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, ls...); err != nil {
		t.Fatalf("serializing: %v", err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

func eth(et layers.EthernetType) *layers.Ethernet {
	return &layers.Ethernet{SrcMAC: hw(macA), DstMAC: hw(macB), EthernetType: et}
}

func ipv4(src, dst netip.Addr, proto layers.IPProtocol) *layers.IPv4 {
	return &layers.IPv4{Version: 4, TTL: 64, Id: 0x1234, Flags: layers.IPv4DontFragment,
		Protocol: proto, SrcIP: ip(src), DstIP: ip(dst)}
}

func ipv6(src, dst netip.Addr, nh layers.IPProtocol) *layers.IPv6 {
	return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: nh, SrcIP: ip(src), DstIP: ip(dst)}
}

// ipLayer returns the IPv4 or IPv6 layer for the address family of src.
func ipLayer(src, dst netip.Addr, proto layers.IPProtocol) gopacket.NetworkLayer {
	if src.Is4() {
		return ipv4(src, dst, proto)
	}
	return ipv6(src, dst, proto)
}

// tcpIP builds an IP packet (no Ethernet) carrying TCP.
func tcpIP(t testing.TB, src, dst netip.Addr, sport, dport uint16, syn bool, opts []layers.TCPOption, payload []byte) []byte {
	t.Helper()
	n := ipLayer(src, dst, layers.IPProtocolTCP)
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: 1000,
		SYN: syn, ACK: !syn, Window: 65535, Options: opts}
	if err := tcp.SetNetworkLayerForChecksum(n); err != nil {
		t.Fatal(err)
	}
	return serialize(t, n.(gopacket.SerializableLayer), tcp, gopacket.Payload(payload))
}

// udpIP builds an IP packet (no Ethernet) carrying UDP.
func udpIP(t testing.TB, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	t.Helper()
	n := ipLayer(src, dst, layers.IPProtocolUDP)
	udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	if err := udp.SetNetworkLayerForChecksum(n); err != nil {
		t.Fatal(err)
	}
	return serialize(t, n.(gopacket.SerializableLayer), udp, gopacket.Payload(payload))
}

// echoIP builds an ICMP or ICMPv6 echo request IP packet.
func echoIP(t testing.TB, src, dst netip.Addr, id, seq uint16, payload []byte) []byte {
	t.Helper()
	if src.Is4() {
		return serialize(t, ipv4(src, dst, layers.IPProtocolICMPv4),
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0), Id: id, Seq: seq}, gopacket.Payload(payload))
	}
	n := ipv6(src, dst, layers.IPProtocolICMPv6)
	ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(128, 0)}
	if err := ic.SetNetworkLayerForChecksum(n); err != nil {
		t.Fatal(err)
	}
	return serialize(t, n, ic, &layers.ICMPv6Echo{Identifier: id, SeqNumber: seq}, gopacket.Payload(payload))
}

// frame prepends an Ethernet header (macA → macB) to an IP packet.
func frame(ipPkt []byte) []byte {
	f := make([]byte, EthernetLen, EthernetLen+len(ipPkt))
	copy(f[0:6], macB[:])
	copy(f[6:12], macA[:])
	et := uint16(EtherTypeIPv4)
	if len(ipPkt) > 0 && ipPkt[0]>>4 == 6 {
		et = EtherTypeIPv6
	}
	binary.BigEndian.PutUint16(f[12:], et)
	return append(f, ipPkt...)
}

// vlanFrame prepends an Ethernet header with an 802.1Q tag.
func vlanFrame(ipPkt []byte, vid uint16) []byte {
	f := frame(ipPkt)
	out := make([]byte, 0, len(f)+4)
	out = append(out, f[:12]...)
	out = binary.BigEndian.AppendUint16(out, EtherTypeVLAN)
	out = binary.BigEndian.AppendUint16(out, 5<<13|vid)
	return append(out, f[12:]...)
}

// insertV6Ext splices raw IPv6 extension headers (whose own next-header bytes the
// caller has set, the last one pointing at the original next header) between the fixed
// header and the payload of an IPv6 packet, fixing the first next header and the
// payload length. The upper-layer checksum stays valid.
func insertV6Ext(p []byte, firstNH uint8, ext []byte) []byte {
	out := append([]byte(nil), p[:IPv6Len]...)
	out[6] = firstNH
	binary.BigEndian.PutUint16(out[4:], uint16(len(p)-IPv6Len+len(ext)))
	out = append(out, ext...)
	return append(out, p[IPv6Len:]...)
}

// fixIPv4Checksum recomputes the IPv4 header checksum at b[off:].
func fixIPv4Checksum(b []byte, off int) {
	ihl := int(b[off]&0x0f) * 4
	b[off+10], b[off+11] = 0, 0
	binary.BigEndian.PutUint16(b[off+10:], wire.Checksum(b[off:off+ihl], 0))
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }
