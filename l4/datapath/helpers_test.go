package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/l4/port"
)

var (
	extMAC    = [6]byte{0x02, 0, 0, 0, 0xe0, 0x01}
	intMAC    = [6]byte{0x02, 0, 0, 0, 0x10, 0x01}
	gwMAC     = net.HardwareAddr{0x02, 0, 0, 0, 0xe0, 0xfe}
	memberMAC = map[string]net.HardwareAddr{
		"198.18.1.11": {0x02, 0, 0, 0, 0x11, 0x11},
		"198.18.1.12": {0x02, 0, 0, 0, 0x11, 0x12},
		"198.18.1.13": {0x02, 0, 0, 0, 0x11, 0x13},
	}
	vip    = netip.MustParseAddr("203.0.113.10")
	client = netip.MustParseAddr("192.0.2.77")
	ldInt  = netip.MustParseAddr("198.18.1.1")
	ldExt  = netip.MustParseAddr("198.18.0.2")
)

func testConfig() Config {
	return Config{
		External: Interface{Addr: netip.MustParsePrefix("198.18.0.2/24"), Gateway: netip.MustParseAddr("198.18.0.1")},
		Internal: Interface{Addr: netip.MustParsePrefix("198.18.1.1/24")},
		Rules: []RuleConfig{
			{Name: "web", VIP: vip, Protocol: "tcp", Port: 443, Pool: "l7"},
			{Name: "quic", VIP: vip, Protocol: "udp", Port: 443, Pool: "l7", QUIC: true},
		},
		Pools: map[string]PoolConfig{"l7": {
			Members: []MemberConfig{
				{Name: "a", Address: netip.MustParseAddr("198.18.1.11"), QUICID: 1},
				{Name: "b", Address: netip.MustParseAddr("198.18.1.12"), QUICID: 2},
			},
			Health: HealthConfig{Type: "none"},
		}},
	}
}

// rig is a distributor running over two in-memory ports.
type rig struct {
	t        *testing.T
	d        *Distributor
	ext, int *port.Mem
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	return startRig(t, cfg, Options{})
}

// resolve answers the distributor's ARP requests on both sides until every
// neighbour in macs is resolved.
func (r *rig) resolve() {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r.answerARP(r.int, memberMAC)
		r.answerARP(r.ext, map[string]net.HardwareAddr{"198.18.0.1": gwMAC})
		s := r.d.snap.Load()
		ok := s.hasExtGW4
		for _, m := range s.members {
			if m != nil && !m.retired && m.encap == nil {
				ok = false
			}
		}
		if ok {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatal("neighbours not resolved")
}

// answerARP replies to the ARP requests p sent for addresses in macs.
func (r *rig) answerARP(p *port.Mem, macs map[string]net.HardwareAddr) {
	for _, f := range p.Drain() {
		pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		a, ok := pk.Layer(layers.LayerTypeARP).(*layers.ARP)
		if !ok || a.Operation != layers.ARPRequest {
			continue
		}
		target := net.IP(a.DstProtAddress).String()
		mac, ok := macs[target]
		if !ok {
			continue
		}
		p.Inject(serialize(r.t,
			&layers.Ethernet{SrcMAC: mac, DstMAC: net.HardwareAddr(a.SourceHwAddress), EthernetType: layers.EthernetTypeARP},
			&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
				Operation: layers.ARPReply, SourceHwAddress: mac, SourceProtAddress: net.ParseIP(target).To4(),
				DstHwAddress: a.SourceHwAddress, DstProtAddress: a.SourceProtAddress}))
	}
}

func serialize(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	for _, l := range ls {
		if n, ok := l.(interface {
			SetNetworkLayerForChecksum(gopacket.NetworkLayer) error
		}); ok {
			for _, o := range ls {
				if nl, ok := o.(gopacket.NetworkLayer); ok {
					_ = n.SetNetworkLayerForChecksum(nl)
				}
			}
		}
	}
	if err := gopacket.SerializeLayers(buf, opts, ls...); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// tcp4 is a client's TCP segment to the VIP, as the router hands it to the LD.
func tcp4(t *testing.T, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, syn, ack bool, payload []byte) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Flags: layers.IPv4DontFragment}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: syn, ACK: ack, Seq: 1000, Window: 64240}
	if syn {
		tcp.Options = []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}}}
	}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	return serialize(t, &layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4}, ip, tcp, gopacket.Payload(payload))
}

func udp4(t *testing.T, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, payload []byte) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	_ = udp.SetNetworkLayerForChecksum(ip)
	return serialize(t, &layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4}, ip, udp, gopacket.Payload(payload))
}

// tunnelled decodes a frame the LD sent to a member: outer dst and dst MAC, and
// the inner IP packet.
type tunnelled struct {
	dstMAC   net.HardwareAddr
	outerSrc netip.Addr
	outerDst netip.Addr
	inner    []byte
	innerPk  gopacket.Packet
}

func decodeTunnelled(t *testing.T, f []byte) tunnelled {
	t.Helper()
	pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
	eth, _ := pk.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip, _ := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	gre, _ := pk.Layer(layers.LayerTypeGRE).(*layers.GRE)
	if eth == nil || ip == nil || gre == nil {
		t.Fatalf("not a GRE frame: %v", pk)
	}
	src, _ := netip.AddrFromSlice(ip.SrcIP)
	dst, _ := netip.AddrFromSlice(ip.DstIP)
	inner := gre.Payload
	return tunnelled{dstMAC: eth.DstMAC, outerSrc: src, outerDst: dst, inner: inner,
		innerPk: gopacket.NewPacket(inner, layers.LayerTypeIPv4, gopacket.Default)}
}

// gre4 is a member's reply: GRE from the member to the LD around inner.
func gre4(t *testing.T, member netip.Addr, inner []byte) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolGRE, SrcIP: member.AsSlice(), DstIP: ldInt.AsSlice()}
	mac := memberMAC[member.String()]
	if mac == nil {
		mac = gwMAC
	}
	return serialize(t, &layers.Ethernet{SrcMAC: mac, DstMAC: intMAC[:], EthernetType: layers.EthernetTypeIPv4},
		ip, &layers.GRE{Protocol: layers.EthernetTypeIPv4}, gopacket.Payload(inner))
}

// waitSent waits for n frames on p.
func waitSent(t *testing.T, p *port.Mem, n int) [][]byte {
	t.Helper()
	var got [][]byte
	deadline := time.Now().Add(3 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		got = append(got, p.Drain()...)
		if len(got) < n {
			time.Sleep(time.Millisecond)
		}
	}
	if len(got) < n {
		t.Fatalf("port %s sent %d frames, want %d", p.Name(), len(got), n)
	}
	return got
}

// counter waits until the published counter dir/result reaches want.
func (r *rig) waitCount(dir direction, res result, want uint64) {
	r.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	var n uint64
	for time.Now().Before(deadline) {
		n = 0
		for _, w := range r.d.workers {
			n += w.pub.packets[dir][res].Load()
		}
		if n >= want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.t.Fatalf("counter %s/%s = %d, want ≥ %d", dirNames[dir], resultNames[res], n, want)
}
