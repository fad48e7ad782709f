package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/wire"
)

var (
	gw4     = netip.MustParseAddr("198.18.0.1")
	gw6     = netip.MustParseAddr("2001:db8:e::1")
	gw6MAC  = net.HardwareAddr{0x02, 0, 0, 0, 0xe6, 0xfe}
	vip6    = netip.MustParseAddr("2001:db8:cafe::10")
	client6 = netip.MustParseAddr("2001:db8:c::77")
	ldInt6  = netip.MustParseAddr("2001:db8:1::1")
	ldExt6  = netip.MustParseAddr("2001:db8:e::2")

	// onLinkMAC are clients on the external link, reached without the gateway.
	onLinkMAC = map[string]net.HardwareAddr{
		"198.18.0.77":    {0x02, 0, 0, 0, 0xc0, 0x77},
		"2001:db8:e::77": {0x02, 0, 0, 0, 0xc6, 0x77},
	}
	member6MAC = map[string]net.HardwareAddr{
		"2001:db8:1::11": {0x02, 0, 0, 0, 0x16, 0x11},
		"2001:db8:1::12": {0x02, 0, 0, 0, 0x16, 0x12},
	}
)

// neighbourMAC is the MAC the test network gives address a (members and
// gateways), or nil.
func neighbourMAC(a string) net.HardwareAddr {
	switch a {
	case gw4.String():
		return gwMAC
	case gw6.String():
		return gw6MAC
	}
	if m := onLinkMAC[a]; m != nil {
		return m
	}
	if m := memberMAC[a]; m != nil {
		return m
	}
	return member6MAC[a]
}

// tunnelConfig has a dual-stack external side with one TCP rule per VIP family
// and two members of the outer family (IPv6 when outer6) reached with mode.
func tunnelConfig(outer6 bool, mode string) Config {
	members := []MemberConfig{
		{Name: "a", Address: netip.MustParseAddr("198.18.1.11")},
		{Name: "b", Address: netip.MustParseAddr("198.18.1.12")},
	}
	internal := Interface{Addr: netip.MustParsePrefix("198.18.1.1/24")}
	if outer6 {
		members = []MemberConfig{
			{Name: "a", Address: netip.MustParseAddr("2001:db8:1::11")},
			{Name: "b", Address: netip.MustParseAddr("2001:db8:1::12")},
		}
		internal = Interface{Addr6: netip.MustParsePrefix("2001:db8:1::1/64")}
	}
	return Config{
		External: Interface{
			Addr: netip.MustParsePrefix("198.18.0.2/24"), Gateway: gw4,
			Addr6: netip.MustParsePrefix("2001:db8:e::2/64"), Gateway6: gw6,
		},
		Internal: internal,
		Tunnel:   TunnelConfig{Mode: mode},
		Rules: []RuleConfig{
			{Name: "web4", VIP: vip, Protocol: "tcp", Port: 443, Pool: "l7"},
			{Name: "web6", VIP: vip6, Protocol: "tcp", Port: 443, Pool: "l7"},
		},
		Pools: map[string]PoolConfig{"l7": {Members: members, Health: HealthConfig{Type: "none"}}},
	}
}

// startRig is newRig with options (the ports and idle sleep are filled in).
func startRig(t *testing.T, cfg Config, opts Options) *rig {
	t.Helper()
	ext := port.NewMem("ext", extMAC, 2, 1024, 2048)
	in := port.NewMem("int", intMAC, 2, 1024, 2048)
	opts.External, opts.Internal, opts.IdleSleep = ext, in, 20*time.Microsecond
	d, err := NewDistributor(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &rig{t: t, d: d, ext: ext, int: in}
}

// resolveNeighbours answers the distributor's ARP requests and neighbour
// solicitations on both ports until its gateways and members are resolved, then
// discards what else the ports sent.
func (r *rig) resolveNeighbours() {
	r.t.Helper()
	cfg := r.d.Config()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		answerNeighbours(r.t, r.int)
		answerNeighbours(r.t, r.ext)
		s := r.d.snap.Load()
		ok := (!cfg.External.Gateway.IsValid() || s.hasExtGW4) && (!cfg.External.Gateway6.IsValid() || s.hasExtGW6)
		for _, m := range s.members {
			if m != nil && !m.retired && m.encap == nil {
				ok = false
			}
		}
		if ok {
			r.int.Drain()
			r.ext.Drain()
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatal("neighbours not resolved")
}

// answerNeighbours replies to the ARP requests and neighbour solicitations p sent
// for the test network's neighbours.
func answerNeighbours(t *testing.T, p *port.Mem) {
	for _, f := range p.Drain() {
		pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		eth, _ := pk.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		if eth == nil {
			continue
		}
		if a, ok := pk.Layer(layers.LayerTypeARP).(*layers.ARP); ok {
			target := net.IP(a.DstProtAddress).String()
			mac := neighbourMAC(target)
			if a.Operation != layers.ARPRequest || mac == nil {
				continue
			}
			p.Inject(serialize(t,
				&layers.Ethernet{SrcMAC: mac, DstMAC: net.HardwareAddr(a.SourceHwAddress), EthernetType: layers.EthernetTypeARP},
				&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
					Operation: layers.ARPReply, SourceHwAddress: mac, SourceProtAddress: net.ParseIP(target).To4(),
					DstHwAddress: a.SourceHwAddress, DstProtAddress: a.SourceProtAddress}))
			continue
		}
		ns, ok := pk.Layer(layers.LayerTypeICMPv6NeighborSolicitation).(*layers.ICMPv6NeighborSolicitation)
		ip6, _ := pk.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		if !ok || ip6 == nil {
			continue
		}
		target, _ := netip.AddrFromSlice(ns.TargetAddress)
		mac := neighbourMAC(target.String())
		if mac == nil {
			continue
		}
		src, _ := netip.AddrFromSlice(ip6.SrcIP)
		p.Inject(neighbourAdvert(t, mac, eth.SrcMAC, target, src, target))
	}
}

// neighbourAdvert is a solicited neighbour advertisement for target with a
// target link-layer address option of srcMAC.
func neighbourAdvert(t testing.TB, srcMAC, dstMAC net.HardwareAddr, src, dst, target netip.Addr) []byte {
	return serialize(t,
		&layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv6},
		&layers.IPv6{Version: 6, HopLimit: 255, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()},
		&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborAdvertisement, 0)},
		&layers.ICMPv6NeighborAdvertisement{Flags: 0x60, TargetAddress: target.AsSlice(),
			Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptTargetAddress, Data: srcMAC}}})
}

// neighbourSolicit is a neighbour solicitation from srcMAC/src for target, to
// target's solicited-node multicast address.
func neighbourSolicit(t testing.TB, srcMAC net.HardwareAddr, src, target netip.Addr) []byte {
	a := target.As16()
	dst := netip.AddrFrom16([16]byte{0: 0xff, 1: 0x02, 11: 0x01, 12: 0xff, 13: a[13], 14: a[14], 15: a[15]})
	return serialize(t,
		&layers.Ethernet{SrcMAC: srcMAC, DstMAC: net.HardwareAddr{0x33, 0x33, 0xff, a[13], a[14], a[15]}, EthernetType: layers.EthernetTypeIPv6},
		&layers.IPv6{Version: 6, HopLimit: 255, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()},
		&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeNeighborSolicitation, 0)},
		&layers.ICMPv6NeighborSolicitation{TargetAddress: target.AsSlice(),
			Options: layers.ICMPv6Options{{Type: layers.ICMPv6OptSourceAddress, Data: srcMAC}}})
}

// tcpFrame is a client's TCP segment to dst as the router hands it to the LD, over
// IPv4 or IPv6 by the family of src. A SYN carries an MSS option of 1460 as its
// only option.
func tcpFrame(t *testing.T, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, syn, ack bool, payload []byte) []byte {
	if src.Is4() {
		return tcp4(t, src, sport, dst, dport, syn, ack, payload)
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 60, NextHeader: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: syn, ACK: ack, Seq: 1000, Window: 64240}
	if syn {
		tcp.Options = []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}}}
	}
	return serialize(t, &layers.Ethernet{SrcMAC: gw6MAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv6}, ip, tcp, gopacket.Payload(payload))
}

// replyPacket is a member's SYN-ACK (an IP packet) from the VIP to the client.
func replyPacket(t *testing.T, vipAddr netip.Addr, cl netip.Addr, cport uint16) []byte {
	tcp := &layers.TCP{SrcPort: 443, DstPort: layers.TCPPort(cport), SYN: true, ACK: true, Seq: 7, Ack: 1001, Window: 65535}
	payload := gopacket.Payload("reply")
	if vipAddr.Is4() {
		return serialize(t, &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: vipAddr.AsSlice(), DstIP: cl.AsSlice()}, tcp, payload)
	}
	return serialize(t, &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: vipAddr.AsSlice(), DstIP: cl.AsSlice()}, tcp, payload)
}

// encapFromMember is what a member sends back: inner in GRE or IPIP from the
// member to the LD's internal address ld.
func encapFromMember(t *testing.T, mode string, member, ld netip.Addr, inner []byte) []byte {
	return encapFromMemberKey(t, mode, member, ld, 0, inner)
}

// encapFromMemberKey is encapFromMember with GRE key key (0: none).
func encapFromMemberKey(t *testing.T, mode string, member, ld netip.Addr, key uint32, inner []byte) []byte {
	innerET := layers.EthernetTypeIPv4
	proto := layers.IPProtocolGRE
	if inner[0]>>4 == 6 {
		innerET = layers.EthernetTypeIPv6
	}
	if mode == ModeIPIP {
		proto = layers.IPProtocolIPv4
		if innerET == layers.EthernetTypeIPv6 {
			proto = layers.IPProtocolIPv6
		}
	}
	ls := []gopacket.SerializableLayer{&layers.Ethernet{SrcMAC: neighbourMAC(member.String()), DstMAC: intMAC[:], EthernetType: layers.EthernetTypeIPv4}}
	if member.Is6() {
		ls[0].(*layers.Ethernet).EthernetType = layers.EthernetTypeIPv6
		ls = append(ls, &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: member.AsSlice(), DstIP: ld.AsSlice()})
	} else {
		ls = append(ls, &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: member.AsSlice(), DstIP: ld.AsSlice()})
	}
	if proto == layers.IPProtocolGRE {
		ls = append(ls, &layers.GRE{Protocol: innerET, KeyPresent: key != 0, Key: key})
	}
	return serialize(t, append(ls, gopacket.Payload(inner))...)
}

// ipPacket is the IP packet of an Ethernet frame, without padding.
func ipPacket(f []byte) []byte {
	ip := f[14:]
	if ip[0]>>4 == 4 {
		return ip[:binary.BigEndian.Uint16(ip[2:])]
	}
	return ip[:40+int(binary.BigEndian.Uint16(ip[4:]))]
}

func sum16(b []byte, s uint32) uint32 {
	for ; len(b) > 1; b = b[2:] {
		s += uint32(b[0])<<8 | uint32(b[1])
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// ipv4HeaderOK verifies the header checksum of an IPv4 packet.
func ipv4HeaderOK(ip []byte) bool {
	return fold(sum16(ip[:int(ip[0]&0x0f)*4], 0)) == 0xffff
}

// l4ChecksumOK verifies the TCP, UDP or ICMPv6 checksum of an IP packet without
// IPv4 options or IPv6 extension headers.
func l4ChecksumOK(ip []byte) bool {
	var l4 []byte
	var s uint32
	if ip[0]>>4 == 4 {
		l4 = ip[int(ip[0]&0x0f)*4 : binary.BigEndian.Uint16(ip[2:])]
		s = sum16(ip[12:20], 0) + uint32(ip[9])
	} else {
		l4 = ip[40 : 40+int(binary.BigEndian.Uint16(ip[4:]))]
		s = sum16(ip[8:40], 0) + uint32(ip[6])
	}
	return fold(sum16(l4, s+uint32(len(l4)))) == 0xffff
}

// decTTL is ip with its TTL or hop limit one lower (and the IPv4 header checksum
// recomputed), as a router forwards it.
func decTTL(ip []byte) []byte {
	out := slices.Clone(ip)
	if out[0]>>4 == 6 {
		out[7]--
		return out
	}
	out[8]--
	out[10], out[11] = 0, 0
	binary.BigEndian.PutUint16(out[10:], ^fold(sum16(out[:int(out[0]&0x0f)*4], 0)))
	return out
}

// outerFrame is a frame the LD sent to a member, decoded without the datapath's
// own parser.
type outerFrame struct {
	dstMAC, srcMAC net.HardwareAddr
	etherType      layers.EthernetType
	src, dst       netip.Addr
	proto          layers.IPProtocol // outer protocol or next header
	ttl            uint8
	df             bool
	greProto       layers.EthernetType // GRE protocol type; 0 without GRE
	greKey         uint32              // GRE key; 0 without the K bit
	greHasKey      bool                // the GRE header has the K bit
	payload        []byte              // the outer packet's payload: GRE header (if any) and inner packet
	inner          []byte
}

func decodeOuter(t *testing.T, f []byte) outerFrame {
	t.Helper()
	var o outerFrame
	var eth layers.Ethernet
	if err := eth.DecodeFromBytes(f, gopacket.NilDecodeFeedback); err != nil {
		t.Fatalf("tunnelled frame: %v", err)
	}
	o.dstMAC, o.srcMAC, o.etherType = eth.DstMAC, eth.SrcMAC, eth.EthernetType
	b := eth.Payload
	var payload []byte
	switch eth.EthernetType {
	case layers.EthernetTypeIPv4:
		var ip layers.IPv4
		if err := ip.DecodeFromBytes(b, gopacket.NilDecodeFeedback); err != nil {
			t.Fatalf("outer IPv4: %v", err)
		}
		if int(ip.Length) != len(b) || ip.IHL != 5 {
			t.Fatalf("outer IPv4 length %d, header %d words; the frame carries %d bytes", ip.Length, ip.IHL, len(b))
		}
		if !ipv4HeaderOK(b) {
			t.Error("outer IPv4 header checksum does not verify")
		}
		o.src, _ = netip.AddrFromSlice(ip.SrcIP)
		o.dst, _ = netip.AddrFromSlice(ip.DstIP)
		o.proto, o.ttl, o.df = ip.Protocol, ip.TTL, ip.Flags&layers.IPv4DontFragment != 0
		payload = b[20:]
	case layers.EthernetTypeIPv6:
		var ip layers.IPv6
		if err := ip.DecodeFromBytes(b, gopacket.NilDecodeFeedback); err != nil {
			t.Fatalf("outer IPv6: %v", err)
		}
		if 40+int(ip.Length) != len(b) {
			t.Fatalf("outer IPv6 payload length %d; the frame carries %d bytes after the header", ip.Length, len(b)-40)
		}
		o.src, _ = netip.AddrFromSlice(ip.SrcIP)
		o.dst, _ = netip.AddrFromSlice(ip.DstIP)
		o.proto, o.ttl = ip.NextHeader, ip.HopLimit
		payload = b[40:]
	default:
		t.Fatalf("tunnelled frame of ether type %v", eth.EthernetType)
	}
	o.src, o.dst = o.src.Unmap(), o.dst.Unmap()
	o.payload, o.inner = payload, payload
	if o.proto == layers.IPProtocolGRE {
		// The LD sends flags and version 0, or only the key bit (RFC 2890).
		if len(payload) < 4 || payload[0]&^0x20 != 0 || payload[1] != 0 {
			t.Fatalf("GRE header % x: want no flags but the key, version 0", payload[:min(4, len(payload))])
		}
		o.greProto = layers.EthernetType(binary.BigEndian.Uint16(payload[2:]))
		o.inner = payload[4:]
		if payload[0] == 0x20 {
			if len(payload) < 8 {
				t.Fatalf("GRE header % x: the key bit without a key", payload)
			}
			o.greHasKey, o.greKey = true, binary.BigEndian.Uint32(payload[4:])
			o.inner = payload[8:]
		}
	}
	return o
}

// checkInnerSYN checks that inner is the client's IP packet orig (no options or
// extension headers, a SYN whose only option is an MSS) with only the MSS value
// and the TCP checksum changed, and that the checksum verifies. It returns the
// MSS.
func checkInnerSYN(t *testing.T, inner, orig []byte) uint16 {
	t.Helper()
	if len(inner) != len(orig) {
		t.Fatalf("inner packet of %d bytes, the client sent %d", len(inner), len(orig))
	}
	tcp := 20
	if orig[0]>>4 == 6 {
		tcp = 40
	}
	if orig[tcp+20] != 2 || orig[tcp+21] != 4 {
		t.Fatalf("test SYN has no MSS option first")
	}
	masked := func(b []byte) []byte {
		c := slices.Clone(b)
		clear(c[tcp+16 : tcp+18]) // checksum
		clear(c[tcp+22 : tcp+24]) // MSS value
		return c
	}
	if !bytes.Equal(masked(inner), masked(orig)) {
		t.Errorf("inner packet changed beyond the MSS:\n got % x\nwant % x", inner, orig)
	}
	if !l4ChecksumOK(inner) {
		t.Error("inner TCP checksum does not verify after the MSS clamp")
	}
	return binary.BigEndian.Uint16(inner[tcp+22:])
}

// isNeighbourFrame tells ARP and neighbour discovery frames, which the control
// goroutine may send at any time, from forwarded traffic.
func isNeighbourFrame(f []byte) bool {
	if len(f) < 14 {
		return false
	}
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0806:
		return true
	case 0x86dd:
		return len(f) > 54 && f[20] == 58 && (f[54] == 135 || f[54] == 136)
	}
	return false
}

// dataFrames is frames without ARP and neighbour discovery.
func dataFrames(frames [][]byte) [][]byte {
	var out [][]byte
	for _, f := range frames {
		if !isNeighbourFrame(f) {
			out = append(out, f)
		}
	}
	return out
}

// waitData waits for n frames other than ARP and ND on p.
func waitData(t *testing.T, p *port.Mem, n int) [][]byte {
	t.Helper()
	var got [][]byte
	deadline := time.Now().Add(3 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		got = append(got, dataFrames(p.Drain())...)
		if len(got) < n {
			time.Sleep(time.Millisecond)
		}
	}
	if len(got) != n {
		t.Fatalf("port %s sent %d frames, want %d", p.Name(), len(got), n)
	}
	return got
}

// waitStatus polls Status until ok accepts it.
func (r *rig) waitStatus(what string, ok func(Status) bool) Status {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := r.d.Status()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("waiting for %s: status %+v", what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func memberStatus(st Status, name string) (MemberStatus, bool) {
	for _, m := range st.Members {
		if m.Name == name && !m.Retired {
			return m, true
		}
	}
	return MemberStatus{}, false
}

func ruleStatus(st Status, name string) (RuleStatus, bool) {
	for _, rs := range st.Rules {
		if rs.Name == name {
			return rs, true
		}
	}
	return RuleStatus{}, false
}

// waitMember waits until member name of the rig's pool is up (or down).
func (r *rig) waitMember(name string, up bool) {
	r.t.Helper()
	r.waitStatus(fmt.Sprintf("member %s up=%v", name, up), func(st Status) bool {
		m, ok := memberStatus(st, name)
		return ok && m.Up == up
	})
}

// newFlows sends n SYNs of new flows from client ports base.. to the VIP and
// returns the members they were tunnelled to, in order.
func (r *rig) newFlows(base uint16, n int) []netip.Addr {
	r.t.Helper()
	frames := make([][]byte, n)
	for i := range frames {
		frames[i] = tcp4(r.t, client, base+uint16(i), vip, 443, true, false, nil)
	}
	if k := r.ext.Inject(frames...); k != n {
		r.t.Fatalf("injected %d of %d frames", k, n)
	}
	var out []netip.Addr
	for _, f := range waitData(r.t, r.int, n) {
		out = append(out, decodeOuter(r.t, f).dst)
	}
	return out
}

func countAddrs(as []netip.Addr) map[netip.Addr]int {
	m := map[netip.Addr]int{}
	for _, a := range as {
		m[a]++
	}
	return m
}

var (
	memberA = netip.MustParseAddr("198.18.1.11")
	memberB = netip.MustParseAddr("198.18.1.12")
)

// TestTunnelFamiliesAndModes sends a client SYN of each family through each
// encapsulation over each outer family, GRE with and without the tunnel key, and a
// member's reply back. The tunnelled packet decapsulates by wire's rules, which l7d
// applies, to the client's packet, and passes l7d's key check.
func TestTunnelFamiliesAndModes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		outer6 bool
		mode   string
		key    uint32
	}{
		{"gre over ipv4", false, ModeGRE, 0},
		{"gre over ipv6", true, ModeGRE, 0},
		{"ipip over ipv4", false, ModeIPIP, 0},
		{"ipip over ipv6", true, ModeIPIP, 0},
		{"gre with a key over ipv4", false, ModeGRE, 0x7467_0001},
		{"gre with a key over ipv6", true, ModeGRE, 0xffff_ffff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tunnelConfig(tc.outer6, tc.mode)
			cfg.Tunnel.Key = tc.key
			r := startRig(t, cfg, Options{})
			r.resolveNeighbours()
			ld, outerIP, outerET := ldInt, 20, layers.EthernetTypeIPv4
			if tc.outer6 {
				ld, outerIP, outerET = ldInt6, 40, layers.EthernetTypeIPv6
			}
			for i, inner6 := range []bool{false, true} {
				vipA, cl, gw, innerIP, innerET := vip, client, gwMAC, 20, layers.EthernetTypeIPv4
				wantProto := layers.IPProtocolIPv4
				if inner6 {
					vipA, cl, gw, innerIP, innerET = vip6, client6, gw6MAC, 40, layers.EthernetTypeIPv6
					wantProto = layers.IPProtocolIPv6
				}
				greLen := 0
				if tc.mode == ModeGRE {
					greLen, wantProto = 4, layers.IPProtocolGRE
					if tc.key != 0 {
						greLen = 8
					}
				}
				t.Logf("client %s → %s", cl, vipA)
				sport := uint16(41000 + i)
				syn := tcpFrame(t, cl, sport, vipA, 443, true, false, nil)
				r.ext.Inject(syn)
				o := decodeOuter(t, waitData(t, r.int, 1)[0])
				mac := neighbourMAC(o.dst.String())
				if mac == nil || o.dst.Is6() != tc.outer6 {
					t.Fatalf("tunnelled to %s, not a member", o.dst)
				}
				if o.etherType != outerET || o.src != ld || !bytes.Equal(o.dstMAC, mac) || !bytes.Equal(o.srcMAC, intMAC[:]) {
					t.Errorf("outer %v %s → %s, %s → %s; want %v from %s, %s → %s",
						o.etherType, o.src, o.dst, o.srcMAC, o.dstMAC, outerET, ld, net.HardwareAddr(intMAC[:]), mac)
				}
				if o.proto != wantProto || o.ttl != 64 {
					t.Errorf("outer protocol %v TTL %d, want %v TTL 64", o.proto, o.ttl, wantProto)
				}
				if tc.mode == ModeGRE && o.greProto != innerET {
					t.Errorf("GRE protocol type %v, want %v", o.greProto, innerET)
				}
				if o.greHasKey != (tc.key != 0) || o.greKey != tc.key {
					t.Errorf("GRE key %#x (key bit %v), want %#x", o.greKey, o.greHasKey, tc.key)
				}
				var tn wire.Tunnel
				if err := wire.Decap(uint8(o.proto), o.payload, &tn); err != nil || !bytes.Equal(o.payload[tn.Inner:], o.inner) {
					t.Errorf("wire.Decap: %v, inner at %d of the payload, want %d", err, tn.Inner, len(o.payload)-len(o.inner))
				} else if !tn.GRE.KeyMatches(tc.key) || tn.GRE.KeyMatches(tc.key^1) {
					t.Errorf("wire's key rule: the packet matches key %#x: %v, key %#x: %v", tc.key, tn.GRE.KeyMatches(tc.key), tc.key^1, tn.GRE.KeyMatches(tc.key^1))
				}
				if !tc.outer6 && !o.df {
					t.Error("outer IPv4 without DF, the inner packet may not be fragmented")
				}
				mss := checkInnerSYN(t, o.inner, ipPacket(syn))
				if want := 1500 - outerIP - greLen - innerIP - 20; int(mss) != want {
					t.Errorf("MSS %d, want %d", mss, want)
				}

				reply := replyPacket(t, vipA, cl, sport)
				r.int.Inject(encapFromMemberKey(t, tc.mode, o.dst, ld, tc.key, reply))
				back := waitData(t, r.ext, 1)[0]
				var eth layers.Ethernet
				if err := eth.DecodeFromBytes(back, gopacket.NilDecodeFeedback); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(eth.DstMAC, gw) || !bytes.Equal(eth.SrcMAC, extMAC[:]) || eth.EthernetType != innerET {
					t.Errorf("reply %s → %s type %v, want %s → the gateway %s type %v",
						eth.SrcMAC, eth.DstMAC, eth.EthernetType, net.HardwareAddr(extMAC[:]), gw, innerET)
				}
				if len(back) != 14+len(reply) {
					t.Errorf("reply frame of %d bytes, want %d", len(back), 14+len(reply))
				}
				if want := decTTL(reply); !bytes.Equal(ipPacket(back), want) {
					t.Errorf("reply changed beyond the TTL:\n got % x\nwant % x", ipPacket(back), want)
				}
			}
			r.waitCount(dirIn, resForwarded, 2)
			r.waitCount(dirOut, resForwarded, 2)
		})
	}
}

// TestNeighbourSolicitationAnswers checks which IPv6 addresses the LD answers
// neighbour solicitations for on each port, and the advertisements' contents.
func TestNeighbourSolicitationAnswers(t *testing.T) {
	r := startRig(t, tunnelConfig(true, ModeGRE), Options{})
	r.resolveNeighbours()
	// A second asker on each side: its solicitation for the port's own address,
	// sent after each case's, is answered after the case's answer, if any.
	markerMAC := net.HardwareAddr{0x02, 0, 0, 0, 0x99, 0x99}
	for _, tc := range []struct {
		name   string
		ext    bool
		target netip.Addr
		answer bool
	}{
		{"vip on external", true, vip6, true},
		{"own address on external", true, ldExt6, true},
		{"unknown address on external", true, netip.MustParseAddr("2001:db8:e::99"), false},
		{"internal address on external", true, ldInt6, false},
		{"own address on internal", false, ldInt6, true},
		{"vip on internal", false, vip6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, asker, askerMAC, marker, own, portMAC := r.int, netip.MustParseAddr("2001:db8:1::11"), member6MAC["2001:db8:1::11"],
				netip.MustParseAddr("2001:db8:1::99"), ldInt6, intMAC
			if tc.ext {
				p, asker, askerMAC, marker, own, portMAC = r.ext, gw6, gw6MAC, netip.MustParseAddr("2001:db8:e::98"), ldExt6, extMAC
			}
			p.Inject(neighbourSolicit(t, askerMAC, asker, tc.target))
			p.Inject(neighbourSolicit(t, markerMAC, marker, own))
			var answered bool
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				for _, f := range p.Drain() {
					pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
					na, ok := pk.Layer(layers.LayerTypeICMPv6NeighborAdvertisement).(*layers.ICMPv6NeighborAdvertisement)
					if !ok {
						continue
					}
					ip := pk.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
					eth := pk.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
					dst, _ := netip.AddrFromSlice(ip.DstIP)
					if dst == marker {
						if answered != tc.answer {
							t.Fatalf("answered %v, want %v", answered, tc.answer)
						}
						return
					}
					if dst != asker {
						t.Fatalf("advertisement to %s", dst)
					}
					answered = true
					target, _ := netip.AddrFromSlice(na.TargetAddress)
					src, _ := netip.AddrFromSlice(ip.SrcIP)
					var ll net.HardwareAddr
					for _, o := range na.Options {
						if o.Type == layers.ICMPv6OptTargetAddress {
							ll = o.Data
						}
					}
					if target != tc.target || src != tc.target || !bytes.Equal(ll, portMAC[:]) {
						t.Errorf("advertisement from %s says %s is at %s, want %s at %s", src, target, ll, tc.target, net.HardwareAddr(portMAC[:]))
					}
					if !bytes.Equal(eth.SrcMAC, portMAC[:]) || !bytes.Equal(eth.DstMAC, askerMAC) {
						t.Errorf("advertisement %s → %s, want %s → %s", eth.SrcMAC, eth.DstMAC, net.HardwareAddr(portMAC[:]), askerMAC)
					}
					if ip.HopLimit != 255 || !na.Solicited() || !na.Override() || na.Router() {
						t.Errorf("hop limit %d, flags %#x: want 255 and solicited, override, not router", ip.HopLimit, na.Flags)
					}
					if !l4ChecksumOK(ipPacket(f)) {
						t.Error("ICMPv6 checksum does not verify")
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
			t.Fatal("no advertisement for the marker's solicitation")
		})
	}
}

// fragmentedTCP is one TCP segment with 60 bytes of data from src to dst:443
// in three fragments (the first with the TCP header), as frames from the router.
func fragmentedTCP(t *testing.T, src netip.Addr, sport uint16, dst netip.Addr, id uint16) [][]byte {
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: 443, ACK: true, PSH: true, Seq: 5000, Ack: 9, Window: 1000}
	data := gopacket.Payload(bytes.Repeat([]byte{byte(id)}, 60))
	v6 := src.Is6()
	var seg []byte
	if v6 {
		seg = serialize(t, &layers.IPv6{Version: 6, HopLimit: 60, NextHeader: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}, tcp, data)[40:]
	} else {
		seg = serialize(t, &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}, tcp, data)[20:]
	}
	var out [][]byte
	for _, part := range [][2]int{{0, 32}, {32, 64}, {64, len(seg)}} {
		more := part[1] < len(seg)
		off := uint16(part[0] / 8)
		payload := gopacket.Payload(seg[part[0]:part[1]])
		if v6 {
			out = append(out, serialize(t,
				&layers.Ethernet{SrcMAC: gw6MAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv6},
				&layers.IPv6{Version: 6, HopLimit: 60, NextHeader: layers.IPProtocolIPv6Fragment, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()},
				&layers.IPv6Fragment{NextHeader: layers.IPProtocolTCP, FragmentOffset: off, MoreFragments: more, Identification: uint32(id)},
				payload))
			continue
		}
		ip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, Id: id, FragOffset: off,
			SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		if more {
			ip.Flags = layers.IPv4MoreFragments
		}
		out = append(out, serialize(t, &layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4}, ip, payload))
	}
	return out
}

// TestFragmentsStayTogetherWithoutState sends fragmented datagrams, some out of
// order, from many clients: every fragment of a datagram reaches the same member,
// unchanged, and no fragment creates a connection-table entry.
func TestFragmentsStayTogetherWithoutState(t *testing.T) {
	r := startRig(t, tunnelConfig(false, ModeGRE), Options{})
	r.resolveNeighbours()
	used := map[netip.Addr]int{}
	total := 0
	for i := range 16 {
		for _, v6 := range []bool{false, true} {
			src, dst := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}), vip
			if v6 {
				src, dst = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x0c, 15: byte(10 + i)}), vip6
			}
			frags := fragmentedTCP(t, src, uint16(50000+i), dst, uint16(100+i))
			if i%2 == 1 {
				slices.Reverse(frags)
			}
			r.ext.Inject(frags...)
			out := waitData(t, r.int, len(frags))
			first := decodeOuter(t, out[0]).dst
			used[first]++
			for j, f := range out {
				o := decodeOuter(t, f)
				if o.dst != first {
					t.Fatalf("datagram from %s: fragment %d went to %s, fragment 0 to %s", src, j, o.dst, first)
				}
				if !bytes.Equal(o.inner, ipPacket(frags[j])) {
					t.Fatalf("datagram from %s: fragment %d changed:\n got % x\nwant % x", src, j, o.inner, ipPacket(frags[j]))
				}
			}
			total += len(frags)
		}
	}
	if len(used) != 2 {
		t.Errorf("datagrams per member %v: fragments are not spread", used)
	}
	r.waitStatus("fragments counted", func(st Status) bool { return st.Packets["in/forwarded"] == uint64(total) })
	time.Sleep(2 * publishEvery) // the table's size is published with, not before, the counters
	st := r.d.Status()
	if st.Conns != 0 {
		t.Errorf("%d connection-table entries after fragments only, want 0", st.Conns)
	}
	for _, rs := range st.Rules {
		if rs.NewFlows != 0 {
			t.Errorf("rule %s: %d new flows from fragments", rs.Name, rs.NewFlows)
		}
	}
	// An unfragmented segment does make an entry (the check above can see one).
	r.ext.Inject(tcp4(t, client, 40000, vip, 443, true, false, nil))
	waitData(t, r.int, 1)
	r.waitStatus("one connection", func(st Status) bool { return st.Conns == 1 })
}

// listenTCP listens on addr (127.0.0.1:0 for any port), accepting and closing
// connections, until closed.
func listenTCP(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln
}

// fastHealth checks every 20 ms (HTTP every 50 ms). The timeout is the whole
// interval: under -race on a loaded machine a 10 ms one takes a healthy member
// down now and then.
func fastHealth(typ string) HealthConfig {
	iv := 20 * time.Millisecond
	if typ == "http" {
		iv = 50 * time.Millisecond
	}
	return HealthConfig{Type: typ, Interval: config.Duration(iv), Timeout: config.Duration(iv), Rise: 2, Fall: 2}
}

// TestHealthCheckTCP takes a member down when its health port stops accepting
// connections, moves new (and its existing) flows to the other member, and brings
// it back when the port accepts again.
func TestHealthCheckTCP(t *testing.T) {
	la, lb := listenTCP(t, "127.0.0.1:0"), listenTCP(t, "127.0.0.1:0")
	cfg := testConfig()
	p := cfg.Pools["l7"]
	p.Health = fastHealth("tcp")
	p.Members[0].HealthAddr = la.Addr().String()
	p.Members[1].HealthAddr = lb.Addr().String()
	cfg.Pools["l7"] = p
	r := newRig(t, cfg)
	r.resolve()

	time.Sleep(5 * fastHealth("tcp").Interval.D()) // both pass a few checks
	st := r.d.Status()
	for _, name := range []string{"a", "b"} {
		if m, ok := memberStatus(st, name); !ok || !m.Up {
			t.Fatalf("member %s: %+v, want up while its port accepts", name, m)
		}
	}
	before := r.newFlows(20000, 40)
	if n := countAddrs(before); n[memberA] == 0 || n[memberB] == 0 {
		t.Fatalf("flows per member %v with both up", n)
	}

	la.Close()
	r.waitMember("a", false)
	if rs, _ := ruleStatus(r.d.Status(), "web"); rs.Members != 1 {
		t.Errorf("rule web has %d schedulable members with a down, want 1", rs.Members)
	}
	if n := countAddrs(r.newFlows(21000, 40)); n[memberA] != 0 || n[memberB] != 40 {
		t.Errorf("new flows per member %v with a down, want all 40 on b", n)
	}
	// A flow a had is rescheduled to b rather than black-holed.
	i := slices.Index(before, memberA)
	r.ext.Inject(tcp4(t, client, 20000+uint16(i), vip, 443, false, true, nil))
	if got := decodeOuter(t, waitData(t, r.int, 1)[0]).dst; got != memberB {
		t.Errorf("a flow of the down member went to %s, want %s", got, memberB)
	}

	listenTCP(t, la.Addr().String())
	r.waitMember("a", true)
	if n := countAddrs(r.newFlows(22000, 40)); n[memberA] == 0 {
		t.Errorf("new flows per member %v after a came back, want some on a", n)
	}
}

// TestHealthCheckHTTP checks "http": a member whose /ready answers 500 goes down;
// when it answers 200 it comes back.
func TestHealthCheckHTTP(t *testing.T) {
	var statusA atomic.Int32
	statusA.Store(http.StatusInternalServerError)
	var pathOK atomic.Bool
	pathOK.Store(true)
	handler := func(status func() int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/ready" || req.Method != http.MethodGet {
				pathOK.Store(false)
				w.WriteHeader(http.StatusNotFound)
				return
			}
			w.WriteHeader(status())
		})
	}
	sa := httptest.NewServer(handler(func() int { return int(statusA.Load()) }))
	defer sa.Close()
	sb := httptest.NewServer(handler(func() int { return http.StatusOK }))
	defer sb.Close()

	cfg := testConfig()
	p := cfg.Pools["l7"]
	p.Health = fastHealth("http")
	p.Health.Path = "/ready"
	p.Members[0].HealthAddr = sa.Listener.Addr().String()
	p.Members[1].HealthAddr = sb.Listener.Addr().String()
	cfg.Pools["l7"] = p
	r := newRig(t, cfg)
	r.resolve()

	r.waitMember("a", false)
	if m, _ := memberStatus(r.d.Status(), "b"); !m.Up {
		t.Fatal("member b down while it answers 200")
	}
	if n := countAddrs(r.newFlows(20000, 40)); n[memberB] != 40 {
		t.Errorf("new flows per member %v with a answering 500, want all 40 on b", n)
	}
	statusA.Store(http.StatusOK)
	r.waitMember("a", true)
	if n := countAddrs(r.newFlows(21000, 40)); n[memberA] == 0 {
		t.Errorf("new flows per member %v after a answers 200, want some on a", n)
	}
	if !pathOK.Load() {
		t.Error("the health check asked for something other than GET /ready")
	}
}

// TestSchedulers checks that WRR and WLC share new flows by weight at every
// point of a run, not only at its end.
func TestSchedulers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sched  string
		wa, wb int
	}{
		{"wrr 3:1", SchedWRR, 3, 1},
		{"wrr 1:1", SchedWRR, 1, 1},
		{"wlc 1:1", SchedWLC, 1, 1},
		{"wlc 3:1", SchedWLC, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Rules[0].Scheduler = tc.sched
			p := cfg.Pools["l7"]
			p.Members[0].Weight, p.Members[1].Weight = uint32(tc.wa), uint32(tc.wb)
			cfg.Pools["l7"] = p
			r := newRig(t, cfg)
			r.resolve()
			const flows = 400
			var ca, cb int
			for i, dst := range r.newFlows(20000, flows) {
				switch dst {
				case memberA:
					ca++
				case memberB:
					cb++
				default:
					t.Fatalf("flow %d went to %s", i, dst)
				}
				// Each member's flows per unit of weight stay within one of the other's.
				if d := ca*tc.wb - cb*tc.wa; d > tc.wa*tc.wb || -d > tc.wa*tc.wb {
					t.Fatalf("after %d flows: a has %d, b has %d; weights %d:%d", i+1, ca, cb, tc.wa, tc.wb)
				}
			}
			want := float64(tc.wa) / float64(tc.wa+tc.wb)
			if got := float64(ca) / flows; got < want-0.03 || got > want+0.03 {
				t.Errorf("a has %.3f of the flows, want %.3f ± 0.03", got, want)
			}
		})
	}
}

// TestApply checks that a rejected configuration leaves the one in force, and
// that added and removed rules take effect.
func TestApply(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	withAlt := func() Config {
		c := testConfig()
		c.Rules = append(c.Rules, RuleConfig{Name: "alt", VIP: vip, Protocol: "tcp", Port: 8443, Pool: "l7"})
		return c
	}
	noRule := uint64(0)
	sport := uint16(30000)
	// expect sends a SYN to port and checks it is forwarded or dropped as no_rule.
	expect := func(dport uint16, forwarded bool) {
		t.Helper()
		sport++
		r.ext.Inject(tcp4(t, client, sport, vip, dport, true, false, nil))
		if forwarded {
			waitData(t, r.int, 1)
			return
		}
		noRule++
		r.waitCount(dirIn, resNoRule, noRule)
		if fs := dataFrames(r.int.Drain()); len(fs) != 0 {
			t.Errorf("a packet to port %d was forwarded", dport)
		}
	}
	expect(443, true)
	expect(8443, false)

	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"unknown pool", func(c *Config) { c.Rules[2].Pool = "nope" }, `rules[2].pool: "nope" is not a pool`},
		{"bad mode", func(c *Config) { c.Tunnel.Mode = "vxlan" }, "tunnel.mode"},
		{"duplicate key", func(c *Config) { c.Rules[2].Port = 443 }, `is also rule "web"`},
		{"member without address", func(c *Config) {
			p := c.Pools["l7"]
			p.Members = append(slices.Clone(p.Members), MemberConfig{Name: "c"})
			c.Pools["l7"] = p
		}, `pools.l7.members[2].address`},
		{"too many rules", func(c *Config) {
			for i := range maxRules {
				c.Rules = append(c.Rules, RuleConfig{Name: fmt.Sprintf("r%d", i), VIP: vip, Protocol: "udp", Port: uint16(10000 + i), Pool: "l7"})
			}
		}, "more than 4096 rules"},
		{"too many members", func(c *Config) {
			// Passes validation; in the pool processed first, a moves and b is
			// drained, before the member IDs run out.
			p := c.Pools["l7"]
			p.Members = slices.Clone(p.Members)
			p.Members[0].Address = netip.MustParseAddr("198.18.1.13")
			p.Members[1].Drained = true
			c.Pools["l7"] = p
			var big []MemberConfig
			for i := range maxMembers {
				big = append(big, MemberConfig{Name: fmt.Sprintf("m%d", i), Address: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})})
			}
			c.Pools["zz"] = PoolConfig{Members: big, Health: HealthConfig{Type: "none"}}
		}, "more than 4096 members"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := withAlt()
			tc.edit(&cfg)
			err := r.d.Apply(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply = %v, want an error containing %q", err, tc.want)
			}
			var names []string
			for _, rc := range r.d.Config().Rules {
				names = append(names, rc.Name)
			}
			if !slices.Equal(names, []string{"web", "quic"}) {
				t.Errorf("rules in force %v after a rejected config", names)
			}
			// A rebuild of the forwarding state (here by a drain and undrain) still
			// sees the members in force.
			for _, drained := range []bool{true, false} {
				if err := r.d.SetDrained("l7", "b", drained); err != nil {
					t.Fatal(err)
				}
			}
			st := r.d.Status()
			for name, addr := range map[string]netip.Addr{"a": memberA, "b": memberB} {
				if m, ok := memberStatus(st, name); !ok || m.Address != addr.String() || m.Drained || !m.Up {
					t.Errorf("member %s after a rejected config: %+v (found %v), want up at %s, not drained", name, m, ok, addr)
				}
			}
			if n := len(st.Members); n != 2 {
				t.Errorf("%d members after a rejected config, want 2", n)
			}
			expect(443, true)
			expect(8443, false)
		})
	}

	if err := r.d.Apply(withAlt()); err != nil {
		t.Fatal(err)
	}
	expect(8443, true)
	r.waitStatus("rule alt counted", func(st Status) bool { rs, ok := ruleStatus(st, "alt"); return ok && rs.Packets == 1 })

	// An established flow of web, then web removed: its packets and new SYNs are
	// no_rule; alt keeps forwarding.
	r.ext.Inject(tcp4(t, client, 40000, vip, 443, true, false, nil))
	waitData(t, r.int, 1)
	cfg := withAlt()
	cfg.Rules = slices.DeleteFunc(cfg.Rules, func(rc RuleConfig) bool { return rc.Name == "web" })
	if err := r.d.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	r.ext.Inject(tcp4(t, client, 40000, vip, 443, false, true, nil))
	noRule++
	r.waitCount(dirIn, resNoRule, noRule)
	expect(443, false)
	expect(8443, true)
	if _, ok := ruleStatus(r.d.Status(), "web"); ok {
		t.Error("removed rule web still in the status")
	}
}

// gather returns every sample of g by "name{label=value,...}", labels sorted.
func gather(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+"="+lp.GetValue())
			}
			sort.Strings(ls)
			k := mf.GetName()
			if len(ls) > 0 {
				k += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[k] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[k] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// waitMetrics waits until every sample in want has its value.
func waitMetrics(t *testing.T, g prometheus.Gatherer, want map[string]float64) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		got := gather(t, g)
		var bad []string
		for k, v := range want {
			if gv, ok := got[k]; !ok || gv != v {
				bad = append(bad, fmt.Sprintf("%s = %v (present %v), want %v", k, gv, ok, v))
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			sort.Strings(bad)
			t.Fatalf("metrics:\n%s", strings.Join(bad, "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTableFull fills a connection table of 8: a new SYN evicts the oldest
// half-open entry; once all 8 are established, new flows are dropped as
// table_full.
func TestTableFull(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cfg := testConfig()
	cfg.Conntrack.Capacity = 8
	r := startRig(t, cfg, Options{Registerer: reg})
	r.resolve()

	const (
		conns     = "tiergate_l4_connections"
		halfOpen  = "tiergate_l4_connections_half_open"
		evictions = "tiergate_l4_conntrack_evictions_total"
		forwarded = "tiergate_l4_packets_total{dir=in,result=forwarded}"
		tableFull = "tiergate_l4_packets_total{dir=in,result=table_full}"
	)
	r.newFlows(20000, 8) // flows 0..7, half-open
	waitMetrics(t, reg, map[string]float64{conns: 8, halfOpen: 8, evictions: 0, forwarded: 8})
	r.newFlows(20008, 1) // flow 8 evicts the oldest, flow 0
	waitMetrics(t, reg, map[string]float64{conns: 8, halfOpen: 8, evictions: 1, forwarded: 9})

	// ACKs of flows 1..8 all find their entries: had another than flow 0 been
	// evicted, its ACK would miss and evict again.
	for i := 1; i <= 8; i++ {
		r.ext.Inject(tcp4(t, client, 20000+uint16(i), vip, 443, false, true, nil))
	}
	waitData(t, r.int, 8)
	waitMetrics(t, reg, map[string]float64{forwarded: 17, halfOpen: 0})
	time.Sleep(2 * publishEvery) // evictions are published after the packet counts
	waitMetrics(t, reg, map[string]float64{conns: 8, halfOpen: 0, evictions: 1, forwarded: 17})

	// Full of established flows: a new SYN, and flow 0's ACK, have no room.
	r.ext.Inject(tcp4(t, client, 20009, vip, 443, true, false, nil))
	r.ext.Inject(tcp4(t, client, 20000, vip, 443, false, true, nil))
	waitMetrics(t, reg, map[string]float64{tableFull: 2, forwarded: 17, conns: 8, evictions: 1})
	if fs := dataFrames(r.int.Drain()); len(fs) != 0 {
		t.Errorf("%d packets forwarded with the table full", len(fs))
	}
	if st := r.d.Status(); st.Packets["in/table_full"] != 2 || st.Conns != 8 {
		t.Errorf("status: table_full %d, connections %d; want 2 and 8", st.Packets["in/table_full"], st.Conns)
	}
}

// TestMetrics checks the exported metrics after known traffic, with member b
// failing its health check.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	live := listenTCP(t, "127.0.0.1:0")
	dead := listenTCP(t, "127.0.0.1:0")
	dead.Close()
	cfg := testConfig()
	p := cfg.Pools["l7"]
	p.Health = fastHealth("tcp")
	p.Members[0].HealthAddr = live.Addr().String()
	p.Members[1].HealthAddr = dead.Addr().String()
	cfg.Pools["l7"] = p
	r := startRig(t, cfg, Options{Registerer: reg})
	r.resolve()
	r.waitMember("b", false)

	r.newFlows(20000, 5)
	for i := range 3 {
		r.ext.Inject(tcp4(t, client, 20000+uint16(i), vip, 443, false, true, nil))
	}
	for range 2 {
		r.ext.Inject(udp4(t, client, 5353, vip, 443, append([]byte{0x40}, make([]byte, 30)...)))
	}
	for _, f := range waitData(t, r.int, 5) {
		if dst := decodeOuter(t, f).dst; dst != memberA {
			t.Fatalf("packet tunnelled to %s, the member that is down", dst)
		}
	}
	r.ext.Inject(tcp4(t, client, 1, vip, 80, true, false, nil)) // no rule

	waitMetrics(t, reg, map[string]float64{
		"tiergate_l4_packets_total{dir=in,result=forwarded}":  10,
		"tiergate_l4_packets_total{dir=in,result=no_rule}":    1,
		"tiergate_l4_packets_total{dir=out,result=forwarded}": 0,
		"tiergate_l4_connections":                             6,
		"tiergate_l4_connections_half_open":                   2,
		"tiergate_l4_conntrack_evictions_total":               0,
		"tiergate_l4_rule_packets_total{rule=web}":            8,
		"tiergate_l4_rule_packets_total{rule=quic}":           2,
		"tiergate_l4_rule_new_flows_total{rule=web}":          5,
		"tiergate_l4_rule_new_flows_total{rule=quic}":         1,
		"tiergate_l4_member_up{member=a,pool=l7}":             1,
		"tiergate_l4_member_up{member=b,pool=l7}":             0,
		"tiergate_l4_member_drained{member=a,pool=l7}":        0,
		"tiergate_l4_member_packets_total{member=a,pool=l7}":  10,
		"tiergate_l4_member_packets_total{member=b,pool=l7}":  0,
		"tiergate_l4_member_connections{member=a,pool=l7}":    6,
		"tiergate_l4_member_connections{member=b,pool=l7}":    0,
	})
	// No other drop on the way in or out.
	for k, v := range gather(t, reg) {
		if strings.HasPrefix(k, "tiergate_l4_packets_total{dir=in,") || strings.HasPrefix(k, "tiergate_l4_packets_total{dir=out,") {
			if !strings.HasSuffix(k, "result=forwarded}") && !strings.HasSuffix(k, "result=no_rule}") {
				t.Errorf("%s = %v", k, v)
			}
		}
	}
}

// TestOnLinkClientResolvedOnDemand sends replies to a client on the external
// link: the first is dropped as no_neighbor while the LD asks for the client's
// MAC (ARP or NS); once answered, replies go straight to the client.
func TestOnLinkClientResolvedOnDemand(t *testing.T) {
	for _, tc := range []struct {
		name        string
		client, vip netip.Addr
	}{
		{"ipv4", netip.MustParseAddr("198.18.0.77"), vip},
		{"ipv6", netip.MustParseAddr("2001:db8:e::77"), vip6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRig(t, tunnelConfig(true, ModeGRE), Options{})
			r.resolveNeighbours()
			r.ext.Inject(tcpFrame(t, tc.client, 40000, tc.vip, 443, true, false, nil))
			member := decodeOuter(t, waitData(t, r.int, 1)[0]).dst
			reply := replyPacket(t, tc.vip, tc.client, 40000)
			r.int.Inject(encapFromMember(t, ModeGRE, member, ldInt6, reply))
			r.waitCount(dirOut, resNoNeighbor, 1)

			want := onLinkMAC[tc.client.String()]
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				answerNeighbours(t, r.ext) // also discards the ext port's frames
				if _, ok := r.d.snap.Load().extNeigh[tc.client]; ok {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			r.int.Inject(encapFromMember(t, ModeGRE, member, ldInt6, reply))
			back := waitData(t, r.ext, 1)[0]
			if !bytes.Equal(back[0:6], want) || !bytes.Equal(back[6:12], extMAC[:]) {
				t.Errorf("reply %s → %s, want to the client at %s", net.HardwareAddr(back[6:12]), net.HardwareAddr(back[0:6]), want)
			}
			if !bytes.Equal(ipPacket(back), decTTL(reply)) {
				t.Error("reply changed beyond the TTL")
			}
		})
	}
}

// TestICMPv6ErrorFollowsFlow sends a Packet Too Big about the VIP's reply to a
// client to the member of that flow.
func TestICMPv6ErrorFollowsFlow(t *testing.T) {
	r := startRig(t, tunnelConfig(true, ModeGRE), Options{})
	r.resolveNeighbours()
	router := netip.MustParseAddr("2001:db8:f::1")
	used := map[netip.Addr]bool{}
	for i := range 16 {
		sport := uint16(22000 + i)
		r.ext.Inject(tcpFrame(t, client6, sport, vip6, 443, true, false, nil))
		member := decodeOuter(t, waitData(t, r.int, 1)[0]).dst
		used[member] = true
		quoted := serialize(t,
			&layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: vip6.AsSlice(), DstIP: client6.AsSlice()},
			&layers.TCP{SrcPort: 443, DstPort: layers.TCPPort(sport), ACK: true, Seq: 1, Window: 100},
			gopacket.Payload(bytes.Repeat([]byte{0xab}, 64)))
		ptb := serialize(t,
			&layers.Ethernet{SrcMAC: gw6MAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv6},
			&layers.IPv6{Version: 6, HopLimit: 60, NextHeader: layers.IPProtocolICMPv6, SrcIP: router.AsSlice(), DstIP: vip6.AsSlice()},
			&layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypePacketTooBig, 0)},
			gopacket.Payload(append([]byte{0, 0, 0x05, 0x00}, quoted...)))
		r.ext.Inject(ptb)
		o := decodeOuter(t, waitData(t, r.int, 1)[0])
		if o.dst != member {
			t.Fatalf("Packet Too Big about flow %d went to %s, the flow is on %s", sport, o.dst, member)
		}
		if !bytes.Equal(o.inner, ipPacket(ptb)) {
			t.Fatal("Packet Too Big changed on its way to the member")
		}
	}
	if len(used) != 2 {
		t.Errorf("flows on %d members, want both used", len(used))
	}
}

// An Apply made while Run is starting runs either in place, before the control
// goroutine exists, or on it, never beside it (run with -race).
func TestApplyWhileRunStarts(t *testing.T) {
	for i := range 20 {
		cfg := testConfig()
		ext := port.NewMem("ext", extMAC, 1, 64, 2048)
		in := port.NewMem("int", intMAC, 1, 64, 2048)
		d, err := NewDistributor(cfg, Options{External: ext, Internal: in, IdleSleep: 20 * time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		cfg.ICMP.Rate = 10 + i
		if err := d.Apply(cfg); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if got := d.Config().ICMP.Rate; got != 10+i {
			t.Fatalf("after Apply the ICMP rate is %d, want %d", got, 10+i)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}
