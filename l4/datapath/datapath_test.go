package datapath

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/wire"
)

func TestValidateNamesFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"no rule name", func(c *Config) { c.Rules[0].Name = "" }, "rules[0].name: required"},
		{"dup rule", func(c *Config) { c.Rules[1].Name = "web" }, `rules[1].name: "web" is used twice`},
		{"bad proto", func(c *Config) { c.Rules[0].Protocol = "sctp" }, `rules[0].protocol: "sctp" is not tcp or udp`},
		{"quic tcp", func(c *Config) { c.Rules[0].QUIC = true }, "rules[0].quic: needs protocol udp"},
		{"no pool", func(c *Config) { c.Rules[0].Pool = "x" }, `rules[0].pool: "x" is not a pool`},
		{"same key", func(c *Config) { c.Rules[1].Protocol = "tcp"; c.Rules[1].QUIC = false }, `is also rule "web"`},
		{"bad sched", func(c *Config) { c.Rules[0].Scheduler = "rr" }, `rules[0].scheduler: "rr"`},
		{"v6 member no v6 side", func(c *Config) {
			p := c.Pools["l7"]
			p.Members[0].Address = netip.MustParseAddr("2001:db8::1")
			c.Pools["l7"] = p
		}, `pools.l7.members[0].address: 2001:db8::1 has no internal address of its family`},
		{"dup quic id", func(c *Config) {
			p := c.Pools["l7"]
			p.Members[1].QUICID = 1
			c.Pools["l7"] = p
		}, `pools.l7.members[1].quic_id: 1 is also member "a"`},
		{"gateway off link", func(c *Config) { c.External.Gateway = netip.MustParseAddr("192.0.2.1") }, "external.gateway"},
		{"mtu", func(c *Config) { c.Tunnel.MTU = 100 }, "tunnel.mtu"},
		{"mode", func(c *Config) { c.Tunnel.Mode = "vxlan" }, "tunnel.mode"},
	} {
		t.Run(tc.name, func(t *testing.T) { checkValidate(t, tc.edit, tc.want) })
	}
}

// checkValidate checks that testConfig changed by edit validates, when want is empty,
// or else is refused with an error that contains want.
func checkValidate(t *testing.T, edit func(*Config), want string) {
	t.Helper()
	c := testConfig()
	edit(&c)
	err := c.Validate()
	if want == "" {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Validate() = %v, want it to contain %q", err, want)
	}
}

func TestForwardAndReturn(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()

	syn := tcp4(t, client, 40000, vip, 443, true, false, nil)
	r.ext.Inject(syn)
	out := waitSent(t, r.int, 1)
	tu := decodeTunnelled(t, out[0])
	if tu.outerSrc != ldInt {
		t.Errorf("outer source %s, want %s", tu.outerSrc, ldInt)
	}
	want := memberMAC[tu.outerDst.String()]
	if want == nil || !bytes.Equal(tu.dstMAC, want) {
		t.Fatalf("sent to %s at %s", tu.outerDst, tu.dstMAC)
	}
	ip := tu.innerPk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if !ip.SrcIP.Equal(client.AsSlice()) || !ip.DstIP.Equal(vip.AsSlice()) {
		t.Errorf("inner %s → %s, want the client's packet untouched", ip.SrcIP, ip.DstIP)
	}
	tcp := tu.innerPk.Layer(layers.LayerTypeTCP).(*layers.TCP)
	mss := binary.BigEndian.Uint16(tcp.Options[0].OptionData)
	if mss != 1500-24-40 {
		t.Errorf("MSS %d, want clamped to %d", mss, 1500-24-40)
	}
	// Everything but the MSS option and the TCP checksum is the client's bytes.
	orig := syn[14 : 14+int(binary.BigEndian.Uint16(syn[16:18]))]
	if len(tu.inner) != len(orig) {
		t.Fatalf("inner length %d, want %d", len(tu.inner), len(orig))
	}
	if !bytes.Equal(tu.inner[:20], orig[:20]) {
		t.Error("inner IP header changed")
	}
	if err := tu.innerPk.ErrorLayer(); err != nil {
		t.Fatal(err.Error())
	}

	// The rest of the flow goes to the same member.
	member := tu.outerDst
	for i := range 5 {
		r.ext.Inject(tcp4(t, client, 40000, vip, 443, false, true, []byte{byte(i)}))
	}
	for _, f := range waitSent(t, r.int, 5) {
		if got := decodeTunnelled(t, f).outerDst; got != member {
			t.Fatalf("packet of the flow went to %s, first to %s", got, member)
		}
	}

	// The member's reply is decapsulated and sent to the gateway.
	synack := serialize(t,
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: vip.AsSlice(), DstIP: client.AsSlice()},
		&layers.TCP{SrcPort: 443, DstPort: 40000, SYN: true, ACK: true})
	fixTCPChecksum(t, synack)
	r.int.Inject(gre4(t, member, synack))
	back := waitSent(t, r.ext, 1)[0]
	pk := gopacket.NewPacket(back, layers.LayerTypeEthernet, gopacket.Default)
	eth := pk.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if !bytes.Equal(eth.DstMAC, gwMAC) || !bytes.Equal(eth.SrcMAC, extMAC[:]) {
		t.Errorf("reply from %s to %s, want %s to the gateway %s", eth.SrcMAC, eth.DstMAC, net.HardwareAddr(extMAC[:]), gwMAC)
	}
	rip := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if rip.TTL != 63 || !rip.SrcIP.Equal(vip.AsSlice()) {
		t.Errorf("reply TTL %d from %s, want 63 from the VIP", rip.TTL, rip.SrcIP)
	}
	if !bytes.Equal(back[14+20:], synack[20:]) {
		t.Error("reply transport bytes changed")
	}
	r.waitCount(dirIn, resForwarded, 6)
	r.waitCount(dirOut, resForwarded, 1)
}

func fixTCPChecksum(t *testing.T, ipPkt []byte) {
	pk := gopacket.NewPacket(ipPkt, layers.LayerTypeIPv4, gopacket.Default)
	ip := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	tcp := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
	_ = tcp.SetNetworkLayerForChecksum(ip)
	b := serialize(t, ip, tcp, gopacket.Payload(tcp.Payload))
	copy(ipPkt, b)
}

func TestFlowsSpreadAndDrain(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	const flows = 400
	first := map[uint16]netip.Addr{}
	per := map[netip.Addr]int{}
	for i := range flows {
		sport := uint16(20000 + i)
		r.ext.Inject(tcp4(t, client, sport, vip, 443, true, false, nil))
		f := waitSent(t, r.int, 1)[0]
		dst := decodeTunnelled(t, f).outerDst
		first[sport] = dst
		per[dst]++
	}
	a, b := netip.MustParseAddr("198.18.1.11"), netip.MustParseAddr("198.18.1.12")
	if per[a] < flows/4 || per[b] < flows/4 {
		t.Fatalf("flows per member %v: not spread", per)
	}
	if err := r.d.SetDrained("l7", "b", true); err != nil {
		t.Fatal(err)
	}
	// Existing flows of b stay on b; new flows all go to a.
	for sport, dst := range first {
		r.ext.Inject(tcp4(t, client, sport, vip, 443, false, true, nil))
		if got := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst; got != dst {
			t.Fatalf("flow %d moved from %s to %s after the drain", sport, dst, got)
		}
	}
	for i := range 100 {
		r.ext.Inject(tcp4(t, client, uint16(30000+i), vip, 443, true, false, nil))
		if got := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst; got != a {
			t.Fatalf("new flow went to drained member %s", got)
		}
	}
	if err := r.d.SetDrained("l7", "nope", true); err == nil {
		t.Fatal("draining an unknown member succeeded")
	}
}

func TestRemovedMemberKeepsItsFlows(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	flows := map[uint16]netip.Addr{}
	for i := range 64 {
		sport := uint16(21000 + i)
		r.ext.Inject(tcp4(t, client, sport, vip, 443, true, false, nil))
		flows[sport] = decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst
	}
	cfg := testConfig()
	p := cfg.Pools["l7"]
	p.Members = p.Members[:1] // b removed
	cfg.Pools["l7"] = p
	if err := r.d.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("198.18.1.11")
	for sport, dst := range flows {
		r.ext.Inject(tcp4(t, client, sport, vip, 443, false, true, nil))
		if got := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst; got != dst {
			t.Fatalf("flow %d on removed member moved from %s to %s", sport, dst, got)
		}
	}
	r.ext.Inject(tcp4(t, client, 50000, vip, 443, true, false, nil))
	if got := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst; got != a {
		t.Fatalf("new flow went to %s after b was removed", got)
	}
}

func TestQUICByConnectionID(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	for _, tc := range []struct {
		sid  uint16
		want string
	}{{1, "198.18.1.11"}, {2, "198.18.1.12"}} {
		cid := make([]byte, wire.ConnIDLen)
		if err := wire.EncodeConnID(cid, tc.sid); err != nil {
			t.Fatal(err)
		}
		// Short-header packets from many client addresses and ports: every one
		// goes to the member whose ID the CID carries.
		for i := range 20 {
			payload := append([]byte{0x40}, cid...)
			payload = append(payload, bytes.Repeat([]byte{0xaa}, 40)...)
			src := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})
			r.ext.Inject(udp4(t, src, uint16(5000+i*7), vip, 443, payload))
			if got := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst.String(); got != tc.want {
				t.Fatalf("QUIC packet for server ID %d went to %s, want %s", tc.sid, got, tc.want)
			}
		}
	}
}

func TestICMPErrorFollowsFlow(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	for i := range 16 {
		sport := uint16(22000 + i)
		r.ext.Inject(tcp4(t, client, sport, vip, 443, true, false, nil))
		member := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst
		// A router says the VIP's reply to the client was too big.
		quoted := serialize(t,
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: vip.AsSlice(), DstIP: client.AsSlice()},
			&layers.TCP{SrcPort: 443, DstPort: layers.TCPPort(sport), ACK: true})
		icmp := serialize(t,
			&layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4},
			&layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolICMPv4, SrcIP: net.IP{198, 51, 100, 1}, DstIP: vip.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4), Seq: 1400},
			gopacket.Payload(quoted[:28]))
		r.ext.Inject(icmp)
		if got := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst; got != member {
			t.Fatalf("ICMP error about flow %d went to %s, the flow is on %s", sport, got, member)
		}
	}
}

func TestARPForVIP(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	req := serialize(t,
		&layers.Ethernet{SrcMAC: gwMAC, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP},
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: layers.ARPRequest, SourceHwAddress: gwMAC, SourceProtAddress: []byte{198, 18, 0, 1},
			DstHwAddress: make([]byte, 6), DstProtAddress: vip.AsSlice()})
	r.ext.Inject(req)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, f := range r.ext.Drain() {
			pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
			if a, ok := pk.Layer(layers.LayerTypeARP).(*layers.ARP); ok && a.Operation == layers.ARPReply {
				if !bytes.Equal(a.SourceProtAddress, vip.AsSlice()) || !bytes.Equal(a.SourceHwAddress, extMAC[:]) {
					t.Fatalf("ARP reply says %v is at %v", net.IP(a.SourceProtAddress), net.HardwareAddr(a.SourceHwAddress))
				}
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no ARP reply for the VIP")
}

func TestDropsAreCounted(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	r.ext.Inject(tcp4(t, client, 1, vip, 80, true, false, nil))                                  // no rule
	r.ext.Inject(tcp4(t, client, 1, netip.MustParseAddr("203.0.113.99"), 443, true, false, nil)) // not local
	r.int.Inject(gre4(t, netip.MustParseAddr("198.18.1.99"), make([]byte, 40)))                  // not a member
	r.int.Inject(gre4(t, memberA, make([]byte, 40)))                                             // not IP inside
	r.ext.Inject([]byte{1, 2, 3})                                                                // truncated
	bad := tcp4(t, client, 1, vip, 443, true, false, nil)
	bad[14+10] ^= 0xff // IPv4 header checksum
	r.ext.Inject(bad)
	r.waitCount(dirIn, resNoRule, 1)
	r.waitCount(dirIn, resNotLocal, 1)
	r.waitCount(dirOut, resReturnNotMember, 1)
	r.waitCount(dirOut, resBadTunnel, 1)
	r.waitCount(dirIn, resTruncated, 1)
	r.waitCount(dirIn, resBadChecksum, 1)
	if n := len(r.int.Drain()); n != 0 {
		// ARP refreshes may appear; nothing else may.
		t.Logf("%d frames on the internal port", n)
	}
}

func TestRandomFramesDoNotCrash(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	rng := rand.New(rand.NewPCG(1, 2))
	valid := tcp4(t, client, 40000, vip, 443, true, false, nil)
	for i := range 3000 {
		var f []byte
		switch i % 3 {
		case 0:
			f = make([]byte, rng.IntN(200))
			for j := range f {
				f[j] = byte(rng.Uint32())
			}
		case 1: // a valid frame cut short
			f = append([]byte(nil), valid[:rng.IntN(len(valid))]...)
		default: // a valid frame with bytes flipped
			f = append([]byte(nil), valid...)
			for range 3 {
				f[rng.IntN(len(f))] ^= byte(rng.Uint32())
			}
		}
		if i%2 == 0 {
			r.ext.Inject(f)
		} else {
			r.int.Inject(f)
		}
		if i%64 == 0 {
			r.ext.Drain()
			r.int.Drain()
		}
	}
	// Still forwarding.
	r.ext.Drain()
	r.int.Drain()
	r.ext.Inject(tcp4(t, client, 41000, vip, 443, true, false, nil))
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, f := range r.int.Drain() {
			pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
			if pk.Layer(layers.LayerTypeGRE) != nil {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the datapath stopped forwarding after random frames")
}

func TestEchoToLDAndVIP(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	for _, dst := range []netip.Addr{ldExt, vip} {
		req := serialize(t,
			&layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4},
			&layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolICMPv4, SrcIP: client.AsSlice(), DstIP: dst.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: 7, Seq: 1},
			gopacket.Payload("ping"))
		r.ext.Inject(req)
		f := waitSent(t, r.ext, 1)[0]
		pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		icmp, ok := pk.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		ip, _ := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if !ok || icmp.TypeCode.Type() != layers.ICMPv4TypeEchoReply || !ip.SrcIP.Equal(dst.AsSlice()) || !ip.DstIP.Equal(client.AsSlice()) {
			t.Fatalf("ping %s: got %v", dst, pk)
		}
		if pk.ErrorLayer() != nil {
			t.Fatalf("ping %s: reply does not decode: %v", dst, pk.ErrorLayer().Error())
		}
	}
}

func TestTxFullIsCounted(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	r.int.SetTxLimit(1) // the internal port takes one frame per burst
	var frames [][]byte
	for i := range 8 {
		frames = append(frames, tcp4(t, client, uint16(43000+i), vip, 443, true, false, nil))
	}
	r.ext.Inject(frames...) // one burst of 8, or a few
	r.waitCount(dirIn, resTxFull, 1)
	deadline := time.Now().Add(3 * time.Second)
	var fwd, full uint64
	for time.Now().Before(deadline) {
		fwd, full = 0, 0
		for _, w := range r.d.workers {
			fwd += w.pub.packets[dirIn][resForwarded].Load()
			full += w.pub.packets[dirIn][resTxFull].Load()
		}
		if fwd+full == 8 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Each burst sends one frame; every other frame is tx_full, not forwarded.
	if fwd+full != 8 || fwd < 1 || full < 4 || uint64(len(r.int.Drain())) != fwd {
		t.Fatalf("forwarded %d, tx_full %d: want 8 in all, most of them tx_full, forwarded = frames sent", fwd, full)
	}
}
