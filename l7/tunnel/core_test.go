package tunnel

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

func testCore(t testing.TB, mod func(*Config)) *core {
	t.Helper()
	cfg := Config{
		VIPs: []netip.Addr{vip.Addr(), vip6.Addr()},
		LDs:  []netip.Prefix{netip.MustParsePrefix("198.18.1.0/29"), netip.MustParsePrefix("2001:db8:1::/64")},
	}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return newCore(cfg)
}

// in feeds c a packet from an IPv4 LD as its raw socket would return it.
func in(c *core, from netip.Addr, proto uint8, payload []byte) ([]byte, result) {
	var n ldNoter
	return c.inbound(false, proto, outerIPv4(from, local, proto, payload), nil, &n)
}

func TestInboundResults(t *testing.T) {
	syn := tcpPacket(client, vip, 1, 0, tcpSYN, nil)
	c := testCore(t, func(c *Config) { c.Local = local })
	var n ldNoter
	for _, tc := range []struct {
		name string
		pkt  []byte
		want result
	}{
		{"gre", outerIPv4(ld, local, protoGRE, greWrap(syn, false, false)), inOK},
		{"ipip", outerIPv4(ld, local, protoIPIP, syn), inOK},
		{"unknown ld", outerIPv4(netip.MustParseAddr("198.18.1.9"), local, protoGRE, greWrap(syn, false, false)), inUnknownLD},
		{"not local", outerIPv4(ld, netip.MustParseAddr("198.18.1.12"), protoGRE, greWrap(syn, false, false)), inNotLocal},
		{"not vip", outerIPv4(ld, local, protoIPIP, tcpPacket(client, netip.MustParseAddrPort("203.0.113.11:8443"), 1, 0, tcpSYN, nil)), inNotVIP},
		{"bad checksum", outerIPv4(ld, local, protoGRE, func() []byte { g := greWrap(syn, false, true); g[4]++; return g }()), inBadChecksum},
		{"truncated inner", outerIPv4(ld, local, protoIPIP, syn[:25]), inTruncated},
		{"garbage", bytes.Repeat([]byte{0xff}, 40), inMalformed},
		{"gre ethernet", outerIPv4(ld, local, protoGRE, append([]byte{0, 0, 0x65, 0x58}, syn...)), inUnsupported},
	} {
		inner, r := c.inbound(false, protoGRE, tc.pkt, nil, &n)
		if r != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, resultLabels[r][1], resultLabels[tc.want][1])
		}
		if (inner != nil) != (r == inOK) || r == inOK && !bytes.Equal(inner, tc.pkt[len(tc.pkt)-len(syn):]) {
			t.Errorf("%s: inner % x", tc.name, inner)
		}
	}
	// From an IPv6 LD: payload only, source from the socket address.
	from := ld6.As16()
	if _, r := c.inbound(true, protoGRE, greWrap(tcpPacket(cl6, vip6, 1, 0, tcpSYN, nil), false, false), &from, &n); r != inOK {
		t.Errorf("gre over ipv6: %s", resultLabels[r][1])
	}
	from[15] = 0x99
	from[7] = 0x99
	if _, r := c.inbound(true, protoIPv6, tcpPacket(cl6, vip6, 1, 0, tcpSYN, nil), &from, &n); r != inUnknownLD {
		t.Errorf("ipv6 from outside the LD prefix: %s", resultLabels[r][1])
	}
}

func TestReturnPath(t *testing.T) {
	c := testCore(t, nil)
	var fc fragCache
	ld2 := netip.MustParseAddr("198.18.1.2")
	client2 := netip.MustParseAddrPort("198.18.0.51:5000")
	if _, r := in(c, ld, protoGRE, greWrap(tcpPacket(client, vip, 1, 0, tcpSYN, nil), false, false)); r != inOK {
		t.Fatal(resultLabels[r])
	}
	if _, r := in(c, ld2, protoIPIP, udpPacket(client2, vip, []byte("q"))); r != inOK {
		t.Fatal(resultLabels[r])
	}
	var n ldNoter
	from := ld6.As16()
	c.inbound(true, protoIPv6, udpPacket(cl6, vip6, nil), &from, &n)
	if c.flows.len() != 3 {
		t.Fatalf("%d flows, want 3", c.flows.len())
	}
	for _, tc := range []struct {
		name string
		pkt  []byte
		addr netip.Addr
		mode mode
		want result
	}{
		{"syn-ack", tcpPacket(vip, client, 9, 2, tcpSYN|tcpACK, nil), ld, modeGRE, outOK},
		{"udp reply", udpPacket(vip, client2, []byte("a")), ld2, modeIPIP, outOK},
		{"udp6 reply", udpPacket(vip6, cl6, nil), ld6, modeIPIP, outOK},
		{"icmp about a flow", icmpError(vip.Addr(), client2.Addr(), udpPacket(client2, vip, []byte("q"))), ld2, modeIPIP, outOK},
		{"unknown flow, two LDs", tcpPacket(vip, netip.MustParseAddrPort("198.18.0.77:1"), 1, 1, tcpACK, nil), netip.Addr{}, 0, outNoFlow},
		{"not from a vip", udpPacket(client, client2, nil), netip.Addr{}, 0, outNotVIP},
		{"garbage", []byte{0x45, 1, 2}, netip.Addr{}, 0, outMalformed},
	} {
		p, r := c.outbound(tc.pkt, &fc)
		if r != tc.want || r == outOK && (p.Addr() != tc.addr || p.mode != tc.mode) {
			t.Errorf("%s: %s to %s/%s; want %s to %s/%s", tc.name, resultLabels[r][1], p.Addr(), p.mode,
				resultLabels[tc.want][1], tc.addr, tc.mode)
		}
	}
}

func TestFallbackToOnlyLD(t *testing.T) {
	c := testCore(t, nil)
	var fc fragCache
	stranger := tcpPacket(vip, netip.MustParseAddrPort("198.18.0.77:1"), 1, 1, tcpACK|0x04, nil)
	if _, r := c.outbound(stranger, &fc); r != outNoFlow {
		t.Fatalf("no LD seen: %s", resultLabels[r][1])
	}
	in(c, ld, protoIPIP, tcpPacket(client, vip, 1, 0, tcpSYN, nil))
	p, r := c.outbound(stranger, &fc)
	if r != outFallback || p.Addr() != ld || p.mode != modeIPIP {
		t.Fatalf("one LD seen: %s to %s/%s", resultLabels[r][1], p.Addr(), p.mode)
	}
	// The LD switches to GRE: the fallback follows.
	in(c, ld, protoGRE, greWrap(tcpPacket(client, vip, 2, 0, tcpSYN, nil), false, false))
	if p, _ := c.outbound(stranger, &fc); p.mode != modeGRE {
		t.Fatalf("fallback mode %s after the LD used GRE", p.mode)
	}
	// A second LD seen lately: ambiguous.
	in(c, netip.MustParseAddr("198.18.1.2"), protoGRE, greWrap(tcpPacket(client, vip, 3, 0, tcpSYN, nil), false, false))
	if _, r := c.outbound(stranger, &fc); r != outNoFlow {
		t.Fatalf("two LDs seen: %s", resultLabels[r][1])
	}
}

func TestFragmentsFollowFirst(t *testing.T) {
	c := testCore(t, nil)
	var fc fragCache
	in(c, ld, protoGRE, greWrap(udpPacket(client, vip, nil), false, false))
	in(c, netip.MustParseAddr("198.18.1.2"), protoGRE, greWrap(tcpPacket(client, vip, 1, 0, tcpSYN, nil), false, false))
	first := udpPacket(vip, client, make([]byte, 64))
	first[6] |= 0x20 // MF
	later := ipPacket(vip.Addr(), client.Addr(), protoUDP, make([]byte, 64), -1)
	binary.BigEndian.PutUint16(later[6:], 9) // offset 72, same ID 0x1234
	if p, r := c.outbound(first, &fc); r != outOK || p.Addr() != ld {
		t.Fatalf("first fragment: %s to %s", resultLabels[r][1], p.Addr())
	}
	if p, r := c.outbound(later, &fc); r != outOK || p.Addr() != ld {
		t.Fatalf("later fragment: %s to %s", resultLabels[r][1], p.Addr())
	}
	binary.BigEndian.PutUint16(later[4:], 0x4321)
	if _, r := c.outbound(later, &fc); r != outNoFlow {
		t.Fatalf("fragment of an unknown datagram: %s", resultLabels[r][1])
	}
}

func TestFlowExpiry(t *testing.T) {
	const idle, halfIdle = int64(10 * time.Second), int64(3 * time.Second)
	ft := newFlowTable(1000)
	p := peer{mode: modeGRE}
	k := func(port uint16) flowKey { return flowKey{sport: port, proto: protoTCP} }
	ft.learn(k(1), p, true, 1)  // half-open
	ft.learn(k(2), p, false, 1) // established
	ft.learn(k(3), p, true, 1)  // half-open, then established
	if r := ft.learn(k(3), p, false, 2); r != learnUpdated {
		t.Fatalf("SYN then ACK: %v, want updated", r)
	}
	if r := ft.learn(k(2), p, false, 2); r != learnKept {
		t.Fatalf("same within a second: %v, want kept", r)
	}
	if r := ft.learn(k(2), p, true, 3); r != learnKept {
		t.Fatalf("a SYN on an established flow: %v, want kept (stays established)", r)
	}
	if n := ft.sweep(1+halfIdle-1, idle, halfIdle); n != 0 {
		t.Fatalf("swept %d before any timeout", n)
	}
	if n := ft.sweep(1+halfIdle, idle, halfIdle); n != 1 {
		t.Fatalf("swept %d at the half-open timeout, want 1", n)
	}
	if _, ok := ft.lookup(k(1)); ok {
		t.Fatal("half-open flow still there")
	}
	// Refreshing keeps a flow: k(2) seen again at 8s lives until 18s.
	ft.learn(k(2), p, false, int64(8*time.Second))
	if n := ft.sweep(2+idle, idle, halfIdle); n != 1 {
		t.Fatalf("swept %d at the idle timeout, want 1 (k3)", n)
	}
	if _, ok := ft.lookup(k(2)); !ok {
		t.Fatal("refreshed flow expired")
	}
	if ft.len() != 1 {
		t.Fatalf("len %d, want 1", ft.len())
	}
	// Moving LD updates at once.
	q := peer{mode: modeIPIP}
	if r := ft.learn(k(2), q, false, int64(8*time.Second)); r != learnUpdated {
		t.Fatalf("new LD: %v", r)
	}
	if got, _ := ft.lookup(k(2)); got != q {
		t.Fatalf("peer %+v after the LD changed", got)
	}
}

func TestTableFull(t *testing.T) {
	c := testCore(t, func(c *Config) { c.MaxFlows = numShards }) // one per shard
	full := false
	for port := range uint16(2000) {
		cl := netip.AddrPortFrom(client.Addr(), 1000+port)
		_, r := in(c, ld, protoIPIP, tcpPacket(cl, vip, 1, 0, tcpSYN, nil))
		if r == inTableFull {
			full = true
		} else if r != inOK {
			t.Fatal(resultLabels[r])
		}
	}
	if !full || c.flows.len() > numShards {
		t.Fatalf("full %v with %d flows (limit %d)", full, c.flows.len(), numShards)
	}
}

func TestConfigValidate(t *testing.T) {
	lds := []netip.Prefix{netip.MustParsePrefix("198.18.1.1/32")}
	vips := []netip.Addr{vip.Addr()}
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{VIPs: vips, LDs: lds}, true},
		{"no vips", Config{LDs: lds}, false},
		{"no lds", Config{VIPs: vips}, false},
		{"long device", Config{VIPs: vips, LDs: lds, Device: "tunnel-device-16"}, false},
		{"local of another family", Config{VIPs: vips, LDs: lds, Local: ld6}, false},
		{"small mtu", Config{VIPs: vips, LDs: lds, MTU: 500}, false},
		{"v6 vip, mtu under 1280", Config{VIPs: []netip.Addr{vip6.Addr()}, LDs: lds, MTU: 1200}, false},
		{"table 254", Config{VIPs: vips, LDs: lds, Table: 254}, false},
		{"unspecified vip", Config{VIPs: []netip.Addr{netip.IPv4Unspecified()}, LDs: lds}, false},
	} {
		err := tc.cfg.validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	c := Config{VIPs: vips, LDs: lds}
	c.validate()
	if c.Device != "tg0" || c.MTU != 1476 || c.Table != 4242 || c.FlowIdle != 10*time.Minute || c.MaxFlows != 1<<20 {
		t.Errorf("defaults: %+v", c)
	}
	c = Config{VIPs: vips, LDs: []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}}
	c.validate()
	if c.MTU != 1456 {
		t.Errorf("MTU with an IPv6 LD: %d", c.MTU)
	}
}

func BenchmarkInbound(b *testing.B) {
	c := testCore(b, nil)
	pkt := outerIPv4(ld, local, protoGRE, greWrap(tcpPacket(client, vip, 1, 1, tcpACK, make([]byte, 1400)), false, false))
	var n ldNoter
	b.ReportAllocs()
	for b.Loop() {
		if _, r := c.inbound(false, protoGRE, pkt, nil, &n); r != inOK {
			b.Fatal(resultLabels[r])
		}
	}
}

func BenchmarkOutbound(b *testing.B) {
	c := testCore(b, nil)
	in(c, ld, protoGRE, greWrap(tcpPacket(client, vip, 1, 1, tcpACK, nil), false, false))
	pkt := tcpPacket(vip, client, 1, 1, tcpACK, make([]byte, 1400))
	var fc fragCache
	b.ReportAllocs()
	for b.Loop() {
		if _, r := c.outbound(pkt, &fc); r != outOK {
			b.Fatal(resultLabels[r])
		}
	}
}

func BenchmarkInboundNewFlows(b *testing.B) {
	c := testCore(b, nil)
	pkts := make([][]byte, 4096)
	for i := range pkts {
		cl := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), uint16(i))
		pkts[i] = outerIPv4(ld, local, protoGRE, greWrap(tcpPacket(cl, vip, 1, 0, tcpSYN, nil), false, false))
	}
	var n ldNoter
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.inbound(false, protoGRE, pkts[i&4095], nil, &n)
		i++
	}
}
