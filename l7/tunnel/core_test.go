package tunnel

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
)

func testCore(t testing.TB, mod func(*Config)) *core {
	t.Helper()
	cfg := Config{
		VIPs: []netip.Addr{vip.Addr(), vip6.Addr()},
		LDs:  []netip.Addr{ld, ld2, ld6},
	}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return newCore(cfg)
}

// in feeds c a packet from an IPv4 LD as its raw socket would return it, and counts
// the result as the endpoint does.
func in(c *core, from netip.Addr, proto uint8, payload []byte) ([]byte, result) {
	var n ldNoter
	inner, r := c.inbound(false, proto, outerIPv4(from, local, proto, payload), nil, &n)
	c.count(r)
	return inner, r
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
	if _, r := c.inbound(true, protoIPv6, tcpPacket(cl6, vip6, 1, 0, tcpSYN, nil), &from, &n); r != inUnknownLD {
		t.Errorf("ipv6 from another address: %s", resultLabels[r][1])
	}
}

// TestLDAddresses checks that LDs are exact addresses, and that ranges are taken only
// when configured as such. Before, every address of a configured prefix passed.
func TestLDAddresses(t *testing.T) {
	syn := greWrap(tcpPacket(client, vip, 1, 0, tcpSYN, nil), false, false)
	exact := testCore(t, nil)
	ranged := testCore(t, func(c *Config) {
		c.LDs = nil
		c.LDRanges = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/29"), netip.MustParsePrefix("::ffff:198.18.2.0/120")}
	})
	for _, tc := range []struct {
		from          string
		exact, ranged result
	}{
		{"198.18.1.1", inOK, inOK},
		{"198.18.1.2", inOK, inOK},
		{"198.18.1.3", inUnknownLD, inOK},
		{"198.18.1.8", inUnknownLD, inUnknownLD},
		{"198.18.2.200", inUnknownLD, inOK},
		{"198.18.3.1", inUnknownLD, inUnknownLD},
	} {
		a := netip.MustParseAddr(tc.from)
		if _, r := in(exact, a, protoGRE, syn); r != tc.exact {
			t.Errorf("LDs only, from %s: %s, want %s", a, resultLabels[r][1], resultLabels[tc.exact][1])
		}
		if _, r := in(ranged, a, protoGRE, syn); r != tc.ranged {
			t.Errorf("LD ranges, from %s: %s, want %s", a, resultLabels[r][1], resultLabels[tc.ranged][1])
		}
	}
}

func TestReturnPath(t *testing.T) {
	c := testCore(t, nil)
	var fc fragCache
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
		{"unknown flow, two LDs", tcpPacket(vip, netip.MustParseAddrPort("198.18.0.77:1"), 1, 1, tcpACK, nil), netip.Addr{}, 0, outHashed},
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

// TestFallbacks checks the replies of unknown flows: to the only LD seen lately, else to
// an LD of Config.LDs by a hash of the flow, else (ranges only) dropped.
func TestFallbacks(t *testing.T) {
	c := testCore(t, nil)
	var fc fragCache
	stranger := tcpPacket(vip, netip.MustParseAddrPort("198.18.0.77:1"), 1, 1, tcpACK|0x04, nil)
	if p, r := c.outbound(stranger, &fc); r != outHashed || p.mode != modeGRE {
		t.Fatalf("no LD seen: %s to %s/%s, want hashed, GRE", resultLabels[r][1], p.Addr(), p.mode)
	}
	rangesOnly := testCore(t, func(c *Config) {
		c.LDs, c.LDRanges = nil, []netip.Prefix{netip.MustParsePrefix("198.18.1.0/29")}
	})
	if _, r := rangesOnly.outbound(stranger, &fc); r != outNoFlow {
		t.Fatalf("ranges only, no LD seen: %s, want no_flow", resultLabels[r][1])
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
	in(c, ld2, protoGRE, greWrap(tcpPacket(client, vip, 3, 0, tcpSYN, nil), false, false))
	p, r = c.outbound(stranger, &fc)
	// (ld6 has sent nothing: its share is dead_ld, copied to a live LD.)
	if r != outHashed && (r != outDeadLD || p.Addr() != ld6) || p.Addr() != ld && p.Addr() != ld2 && p.Addr() != ld6 {
		t.Fatalf("two LDs seen: %s to %s, want hashed to an LD", resultLabels[r][1], p.Addr())
	}
	// The hash is of the flow: the same flow, the same LD; flows spread over the LDs.
	seen := map[netip.Addr]int{}
	for port := range uint16(300) {
		pkt := tcpPacket(vip, netip.AddrPortFrom(client.Addr(), 2000+port), 1, 1, tcpACK, nil)
		p1, _ := c.outbound(pkt, &fc)
		p2, r := c.outbound(pkt, &fc)
		if r != outHashed && (r != outDeadLD || p1.Addr() != ld6) || p1 != p2 {
			t.Fatalf("flow %d: %s to %v then %v", port, resultLabels[r][1], p1.Addr(), p2.Addr())
		}
		seen[p1.Addr()]++
	}
	if len(seen) != 3 || seen[ld] < 50 || seen[ld2] < 50 || seen[ld6] < 50 {
		t.Errorf("300 flows hashed over 3 LDs: %v", seen)
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
	l := limits{idle: int64(10 * time.Second), halfOpen: int64(3 * time.Second), oneWay: int64(2 * time.Second)}
	ft := newFlowTable(1000)
	p := peer{mode: modeGRE}
	k := func(port uint16) flowKey { return flowKey{sport: port, proto: protoTCP} }
	learn := func(port uint16, halfOpen bool, now int64) learnResult {
		return ft.learn(k(port), p, halfOpen, now, -1, nil)
	}
	learn(1, true, 1)  // a SYN, answered: half-open
	learn(2, false, 1) // answered: established
	learn(3, true, 1)  // a SYN, answered, then an ACK: established
	learn(4, false, 1) // never answered: one-way
	learn(5, true, 1)  // a SYN never answered: one-way
	for _, port := range []uint16{1, 2, 3} {
		ft.reply(k(port), true)
	}
	ft.reply(k(4), false) // an ICMP error or a reset is no answer
	if r := learn(3, false, 2); r != learnUpdated {
		t.Fatalf("SYN then ACK: %v, want updated", r)
	}
	if r := learn(2, false, 2); r != learnKept {
		t.Fatalf("same within a second: %v, want kept", r)
	}
	if r := learn(2, true, 3); r != learnKept {
		t.Fatalf("a SYN on an established flow: %v, want kept (stays established)", r)
	}
	if n := ft.sweep(1+l.oneWay-1, l); n != 0 {
		t.Fatalf("swept %d before any timeout", n)
	}
	if n := ft.sweep(1+l.oneWay, l); n != 2 {
		t.Fatalf("swept %d at the one-way timeout, want 2", n)
	}
	if _, ok := ft.lookup(k(4)); ok {
		t.Fatal("one-way flow still there")
	}
	if n := ft.sweep(1+l.halfOpen, l); n != 1 {
		t.Fatalf("swept %d at the half-open timeout, want 1", n)
	}
	if _, ok := ft.lookup(k(1)); ok {
		t.Fatal("half-open flow still there")
	}
	// Refreshing keeps a flow: k(2) seen again at 8s lives until 18s.
	learn(2, false, int64(8*time.Second))
	if n := ft.sweep(2+l.idle, l); n != 1 {
		t.Fatalf("swept %d at the idle timeout, want 1 (k3)", n)
	}
	if _, ok := ft.lookup(k(2)); !ok {
		t.Fatal("refreshed flow expired")
	}
	if ft.len() != 1 {
		t.Fatalf("len %d, want 1", ft.len())
	}
	// Another encapsulation from the same LD updates at once.
	q := peer{mode: modeIPIP}
	if r := learn(2, false, int64(8*time.Second)); r != learnKept {
		t.Fatalf("same packet again: %v", r)
	}
	if r := ft.learn(k(2), q, false, int64(8*time.Second), -1, nil); r != learnUpdated {
		t.Fatalf("IPIP from the same LD: %v", r)
	}
	if got, _ := ft.lookup(k(2)); got != q {
		t.Fatalf("peer %+v after the encapsulation changed", got)
	}
}

// TestFlowMoves checks that a packet from another LD moves a flow only when the flow
// has been quiet on its own LD for the move time, and never with a negative one.
// Before, every packet re-pointed its flow at its LD: one spoofed packet from another
// LD's address redirected a live flow's replies.
func TestFlowMoves(t *testing.T) {
	const move = int64(5 * time.Second)
	c := testCore(t, func(c *Config) { c.MoveIdle = config.Duration(move) })
	p1, p2 := peerFrom(ld, modeGRE), peerFrom(ld2, modeGRE)
	k := flowKey{sport: 1, proto: protoUDP}
	c.flows.learn(k, p1, false, 1, c.move, nil)
	for _, at := range []int64{2, move / 2, move} { // p1 is heard from at move/2 again
		if r := c.flows.learn(k, p2, false, at, c.move, nil); r != learnRefused {
			t.Fatalf("from another LD at %v: %v, want refused", time.Duration(at), r)
		}
		if at == move/2 {
			c.flows.learn(k, p1, false, at, c.move, nil)
		}
	}
	if got, _ := c.flows.lookup(k); got != p1 {
		t.Fatalf("peer %v after refused moves", got.Addr())
	}
	if r := c.flows.learn(k, p2, false, move/2+move, c.move, nil); r != learnMoved {
		t.Fatalf("from another LD after the move time: %v, want moved", r)
	}
	if got, _ := c.flows.lookup(k); got != p2 {
		t.Fatalf("peer %v after the move", got.Addr())
	}
	never := testCore(t, func(c *Config) { c.MoveIdle = -1 })
	never.flows.learn(k, p1, false, 1, never.move, nil)
	if r := never.flows.learn(k, p2, false, int64(time.Hour), never.move, nil); r != learnRefused {
		t.Fatalf("move_idle never, an hour later: %v, want refused", r)
	}
}

// TestSpoofedLDKeepsFlow plays a spoofed packet from another LD's address into a live
// flow: it must not redirect the flow's replies, and it is counted.
func TestSpoofedLDKeepsFlow(t *testing.T) {
	c := testCore(t, func(c *Config) { c.LDDeadAfter = config.Duration(time.Minute) }) // both LDs live throughout
	var fc fragCache
	c1 := netip.MustParseAddrPort("198.18.0.60:41000")
	if _, r := in(c, ld, protoGRE, greWrap(udpPacket(c1, vip, []byte("hello")), false, false)); r != inOK {
		t.Fatal(resultLabels[r][1])
	}
	reply := udpPacket(vip, c1, []byte("hi"))
	if p, r := c.outbound(reply, &fc); r != outOK || p.Addr() != ld {
		t.Fatalf("reply: %s to %s", resultLabels[r][1], p.Addr())
	}
	if _, r := in(c, ld2, protoGRE, greWrap(udpPacket(c1, vip, []byte("spoofed")), false, false)); r != inOK {
		t.Fatalf("packet of the flow from another LD: %s, want delivered", resultLabels[r][1])
	}
	if p, r := c.outbound(reply, &fc); r != outOK || p.Addr() != ld {
		t.Fatalf("reply after a packet from another LD: %s to %s, want ok to %s", resultLabels[r][1], p.Addr(), ld)
	}
	if s := c.stats(); s.MovesRefused != 1 || s.Moves != 0 {
		t.Fatalf("moves %d, refused %d; want 0, 1", s.Moves, s.MovesRefused)
	}
	if m := metricValue(t, registry(t, c), "tiergate_l7_tunnel_flow_moves_total", "refused"); m != 1 {
		t.Fatalf("tiergate_l7_tunnel_flow_moves_total{result=refused} %v, want 1", m)
	}
}

// TestGREKey checks the key: with one configured, packets without it, with another or
// over IPIP are refused as bad_key and the right one is taken; without one, any is.
func TestGREKey(t *testing.T) {
	const key = 0xdeadbeef // greWrap's
	syn := tcpPacket(client, vip, 1, 0, tcpSYN, nil)
	wrongKey := greWrap(syn, true, false)
	binary.BigEndian.PutUint32(wrongKey[4:], key+1)
	for _, tc := range []struct {
		name       string
		proto      uint8
		payload    []byte
		keyed, not result
	}{
		{"right key", protoGRE, greWrap(syn, true, false), inOK, inOK},
		{"right key, checksum", protoGRE, greWrap(syn, true, true), inOK, inOK},
		{"no key", protoGRE, greWrap(syn, false, false), inBadKey, inOK},
		{"wrong key", protoGRE, wrongKey, inBadKey, inOK},
		{"ipip", protoIPIP, syn, inBadKey, inOK},
	} {
		keyed := testCore(t, func(c *Config) { c.Key = key })
		if _, r := in(keyed, ld, tc.proto, tc.payload); r != tc.keyed {
			t.Errorf("%s, key set: %s, want %s", tc.name, resultLabels[r][1], resultLabels[tc.keyed][1])
		}
		if _, r := in(testCore(t, nil), ld, tc.proto, tc.payload); r != tc.not {
			t.Errorf("%s, no key set: %s, want %s", tc.name, resultLabels[r][1], resultLabels[tc.not][1])
		}
	}
}

// TestOneWayJunkEvicted fills the table with one-way junk flows from two LDs, then
// opens a real flow: it takes a junk flow's place and its replies go to its LD. Before,
// junk held the table for flow_idle and the real flow's replies were dropped (no_flow,
// with two LDs seen).
func TestOneWayJunkEvicted(t *testing.T) {
	c := testCore(t, func(c *Config) { c.MaxFlows = 4 * numShards })
	var fc fragCache
	for i := range 20 * numShards {
		junk := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), uint16(1024+i))
		from := []netip.Addr{ld, ld2}[i%2]
		if _, r := in(c, from, protoIPIP, udpPacket(junk, vip, []byte{1})); r != inOK && r != inTableFull {
			t.Fatalf("junk %d: %s", i, resultLabels[r][1])
		}
		// The stack says so much to junk: an ICMP error, which confirms nothing.
		c.outbound(icmpError(vip.Addr(), junk.Addr(), udpPacket(junk, vip, []byte{1})), &fc)
	}
	if n := c.flows.len(); n != 4*numShards {
		t.Fatalf("%d flows after the junk, want the table full (%d)", n, 4*numShards)
	}
	for i := range 50 {
		real := netip.AddrPortFrom(client.Addr(), uint16(30000+i))
		from := []netip.Addr{ld, ld2}[i%2]
		if _, r := in(c, from, protoGRE, greWrap(udpPacket(real, vip, []byte("q")), false, false)); r != inOK {
			t.Fatalf("real flow %d: %s, want ok", i, resultLabels[r][1])
		}
		p, r := c.outbound(udpPacket(vip, real, []byte("a")), &fc)
		if r != outOK || p.Addr() != from {
			t.Fatalf("real flow %d's reply: %s to %s, want ok to %s", i, resultLabels[r][1], p.Addr(), from)
		}
	}
	if s := c.stats(); s.Evictions != 16*numShards+50 || s.In["table_full"] != 0 {
		t.Errorf("%d evictions, %d table_full; want %d, 0", s.Evictions, s.In["table_full"], 16*numShards+50)
	}
	if metric := metricValue(t, registry(t, c), "tiergate_l7_tunnel_flow_evictions_total", ""); metric != float64(16*numShards+50) {
		t.Errorf("tiergate_l7_tunnel_flow_evictions_total %v, want %d", metric, 16*numShards+50)
	}
	// Established flows are never evicted: the real ones stay when more junk comes.
	for i := range 20 * numShards {
		junk := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, 100 + byte(i>>8), byte(i)}), 1)
		in(c, ld, protoIPIP, udpPacket(junk, vip, []byte{1}))
	}
	for i := range 50 {
		real := netip.AddrPortFrom(client.Addr(), uint16(30000+i))
		if p, r := c.outbound(udpPacket(vip, real, []byte("a")), &fc); r != outOK || p.Addr() != []netip.Addr{ld, ld2}[i%2] {
			t.Fatalf("real flow %d after more junk: %s to %s", i, resultLabels[r][1], p.Addr())
		}
	}
}

// TestTableFull checks a table full of established flows: a new flow is delivered
// untracked (table_full) and its replies go to an LD chosen by hash, not dropped.
func TestTableFull(t *testing.T) {
	c := testCore(t, func(c *Config) { c.MaxFlows = numShards }) // one per shard
	var fc fragCache
	full := 0
	for port := range uint16(2000) {
		cl := netip.AddrPortFrom(client.Addr(), 1000+port)
		from := []netip.Addr{ld, ld2}[port%2]
		_, r := in(c, from, protoIPIP, tcpPacket(cl, vip, 1, 0, tcpSYN, nil))
		in(c, from, protoIPIP, tcpPacket(cl, vip, 2, 1, tcpACK, nil))
		switch r {
		case inTableFull:
			full++
			if p, r := c.outbound(tcpPacket(vip, cl, 1, 2, tcpACK, nil), &fc); r != outHashed && (r != outDeadLD || p.Addr() != ld6) || p.Addr() != ld && p.Addr() != ld2 && p.Addr() != ld6 {
				// (ld6 sends nothing here: its share is dead_ld, copied to a live LD)
				t.Fatalf("reply of an untracked flow: %s to %s, want hashed to an LD", resultLabels[r][1], p.Addr())
			}
		case inOK:
			if p, r := c.outbound(tcpPacket(vip, cl, 1, 2, tcpSYN|tcpACK, nil), &fc); r != outOK || p.Addr() != from {
				t.Fatalf("reply of a tracked flow: %s to %s", resultLabels[r][1], p.Addr())
			}
		default:
			t.Fatal(resultLabels[r])
		}
	}
	if full == 0 || c.flows.len() > numShards || c.stats().Evictions != 0 {
		t.Fatalf("%d untracked with %d flows (limit %d), %d evictions", full, c.flows.len(), numShards, c.stats().Evictions)
	}
}

// TestYoungQueueBounded checks that the queue of flows not yet established stays
// within twice the table's size however many flows come and go.
func TestYoungQueueBounded(t *testing.T) {
	ft := newFlowTable(numShards * 8)
	p := peer{mode: modeGRE}
	for i := range 200000 {
		k := flowKey{sport: uint16(i), dport: uint16(i >> 16), proto: protoUDP}
		ft.learn(k, p, false, int64(i+1), -1, nil)
		if i%3 == 0 {
			ft.reply(k, true)
		}
	}
	for i := range ft.shards {
		s := &ft.shards[i]
		if n := len(s.young) - s.head; n > 2*ft.perShard+1 || cap(s.young) > 8*ft.perShard+64 {
			t.Fatalf("shard %d: %d queued (cap %d) for %d flows", i, n, cap(s.young), len(s.m))
		}
	}
}

func TestConfigValidate(t *testing.T) {
	lds := []netip.Addr{ld}
	vips := []netip.Addr{vip.Addr()}
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{VIPs: vips, LDs: lds}, true},
		{"ranges only", Config{VIPs: vips, LDRanges: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/29")}}, true},
		{"no vips", Config{LDs: lds}, false},
		{"no lds", Config{VIPs: vips}, false},
		{"unspecified ld", Config{VIPs: vips, LDs: []netip.Addr{netip.IPv4Unspecified()}}, false},
		{"range of everything", Config{VIPs: vips, LDRanges: []netip.Prefix{netip.MustParsePrefix("::/0")}}, false},
		{"mapped range of everything", Config{VIPs: vips, LDRanges: []netip.Prefix{netip.MustParsePrefix("::ffff:0.0.0.0/96")}}, false},
		{"long device", Config{VIPs: vips, LDs: lds, Device: "tunnel-device-16"}, false},
		{"local of another family", Config{VIPs: vips, LDs: lds, Local: ld6}, false},
		{"small mtu", Config{VIPs: vips, LDs: lds, MTU: 500}, false},
		{"v6 vip, mtu under 1280", Config{VIPs: []netip.Addr{vip6.Addr()}, LDs: lds, MTU: 1200}, false},
		{"table 254", Config{VIPs: vips, LDs: lds, Table: 254}, false},
		{"unspecified vip", Config{VIPs: []netip.Addr{netip.IPv4Unspecified()}, LDs: lds}, false},
		{"negative one-way idle", Config{VIPs: vips, LDs: lds, OneWayIdle: -1}, false},
	} {
		err := tc.cfg.validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	c := Config{VIPs: vips, LDs: lds}
	c.validate()
	if c.Device != "tg0" || c.MTU != 1476 || c.Table != 4242 || c.FlowIdle.D() != 10*time.Minute || c.MaxFlows != 1<<20 ||
		c.OneWayIdle.D() != 30*time.Second || c.MoveIdle.D() != 10*time.Second || c.Key != 0 {
		t.Errorf("defaults: %+v", c)
	}
	c = Config{VIPs: vips, LDs: []netip.Addr{netip.MustParseAddr("2001:db8::1")}}
	c.validate()
	if c.MTU != 1456 {
		t.Errorf("MTU with an IPv6 LD: %d", c.MTU)
	}
	c = Config{VIPs: vips, LDs: lds, Key: 1, MoveIdle: config.Duration(-time.Second), FlowIdle: config.Duration(20 * time.Second)}
	c.validate()
	if c.MTU != 1472 || c.MoveIdle != -1 || c.OneWayIdle.D() != 20*time.Second {
		t.Errorf("MTU with a key %d (want 1472), move idle %v (want -1), one-way idle %v (want the flow idle, 20s)", c.MTU, c.MoveIdle, c.OneWayIdle)
	}
	c = Config{VIPs: vips, LDRanges: []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}, Key: 1}
	c.validate()
	if c.MTU != 1452 {
		t.Errorf("MTU with an IPv6 LD range and a key: %d", c.MTU)
	}
}

// metricValue returns the value of metric name in reg: the one whose result label is
// result, or with result "", the one without labels.
func metricValue(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := result == "" && len(m.GetLabel()) == 0
			for _, l := range m.GetLabel() {
				match = match || l.GetName() == "result" && l.GetValue() == result
			}
			if !match {
				continue
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s{result=%q} not found", name, result)
	return 0
}

// registry returns a registry holding c's metrics.
func registry(t *testing.T, c *core) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(newCollector(c)); err != nil {
		t.Fatal(err)
	}
	return reg
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

// TestConfigYAMLAndJSON: the model reads the same from YAML (l7d's tunnel section) and
// from JSON (the control plane's form), addresses and durations as text in both, and
// writes back what it read.
func TestConfigYAMLAndJSON(t *testing.T) {
	const doc = `
device: tg1
vips: [203.0.113.10, "2001:db8:10::1"]
lds: [198.18.1.1]
ld_ranges: [198.18.2.0/24]
key: 42
local: 198.18.0.2
flow_idle: 20m
one_way_idle: 15s
move_idle: -1s
max_flows: 1000
mtu: 1400
table: 100
`
	const js = `{"device": "tg1", "vips": ["203.0.113.10", "2001:db8:10::1"], "lds": ["198.18.1.1"],
		"ld_ranges": ["198.18.2.0/24"], "key": 42, "local": "198.18.0.2", "flow_idle": "20m",
		"one_way_idle": "15s", "move_idle": "-1s", "max_flows": 1000, "mtu": 1400, "table": 100}`
	var y, j, std Config
	if err := config.Decode([]byte(doc), "YAML", &y); err != nil {
		t.Fatal(err)
	}
	if err := config.Decode([]byte(js), "JSON", &j); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(js), &std); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(y, j) || !reflect.DeepEqual(y, std) {
		t.Fatalf("YAML %+v\nJSON %+v\nencoding/json %+v", y, j, std)
	}
	if y.OneWayIdle.D() != 15*time.Second || y.MoveIdle.D() != -time.Second || y.Local != netip.MustParseAddr("198.18.0.2") {
		t.Fatalf("decoded %+v", y)
	}
	out, err := json.Marshal(y)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, y) {
		t.Fatalf("round trip through %s: %+v, %v", out, back, err)
	}
	if out, _ := json.Marshal(Config{}); string(out) != `{"vips":null}` {
		t.Errorf("zero Config as JSON: %s", out)
	}
	if err := y.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestValidatePaths: Validate names every bad field by its path.
func TestValidatePaths(t *testing.T) {
	c := Config{
		VIPs:       []netip.Addr{vip.Addr(), netip.IPv4Unspecified()},
		LDs:        []netip.Addr{ld, netip.MustParseAddr("224.0.0.1")},
		LDRanges:   []netip.Prefix{netip.MustParsePrefix("::ffff:0.0.0.0/96")},
		Local:      ld6,
		OneWayIdle: config.Duration(-time.Second),
		MTU:        100,
		Table:      255,
	}
	want := []string{
		`vips[1]: "0.0.0.0" is not a usable address`,
		`lds[1]: "224.0.0.1" is not a usable address`,
		`ld_ranges[0]: ::ffff:0.0.0.0/96 would take packets from anywhere`,
		`local: ` + ld6.String() + ` is of a family no LD uses`,
		`one_way_idle: -1s is negative`,
		`mtu: 100 is out of range`,
		`table: 255 is reserved or invalid`,
	}
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in\n%v", w, err)
		}
	}
	if err := (&Config{}).Validate(); err == nil || !strings.Contains(err.Error(), "vips: required") ||
		!strings.Contains(err.Error(), "lds: required unless ld_ranges") {
		t.Errorf("empty config: %v", err)
	}
}

// TestDeadLDReplies: the replies of a flow whose LD has gone silent (an LD killed:
// the routers have not yet dropped it, or the client has nothing to send) reach a
// live LD, which holds the flow from the LDs' session sync; while the flow's LD lives
// they go to it alone. Before, they went to the dead LD until a packet of the flow
// came from another LD and the flow had been quiet for move_idle, and a client waiting
// for an answer sent nothing until its keepalive.
func TestDeadLDReplies(t *testing.T) {
	ld3 := netip.MustParseAddr("198.18.1.3")
	c := testCore(t, func(c *Config) { c.LDs = append(c.LDs, ld3) })
	c.start = c.start.Add(-time.Hour) // room on the clock before the first packet
	var fc fragCache
	silence := func(a netip.Addr) { c.ldSeen[c.lds[a]].Store(1) }
	cl := netip.MustParseAddrPort("198.18.0.61:41000")
	other := netip.MustParseAddrPort("198.18.0.62:41000")
	if _, r := in(c, ld, protoGRE, greWrap(udpPacket(cl, vip, []byte("hello")), false, false)); r != inOK {
		t.Fatal(resultLabels[r][1])
	}
	reply := udpPacket(vip, cl, []byte("hi"))
	alive := func() {
		t.Helper()
		for _, a := range []netip.Addr{ld2, ld3} {
			if _, r := in(c, a, protoGRE, greWrap(udpPacket(other, vip, []byte("x")), false, false)); r != inOK {
				t.Fatal(resultLabels[r][1])
			}
		}
	}
	alive()
	if p, alt, r := c.route(reply, &fc); r != outOK || p.Addr() != ld || alt != (peer{}) {
		t.Fatalf("reply while its LD lives: %s to %s (copy %v)", resultLabels[r][1], p.Addr(), alt.Addr())
	}

	silence(ld)
	p, alt, r := c.route(reply, &fc)
	if r != outDeadLD || p.Addr() != ld || alt.Addr() != ld2 && alt.Addr() != ld3 {
		t.Fatalf("reply after its LD went silent: %s to %s, copy to %v; want dead_ld to %s, copy to %s or %s",
			resultLabels[r][1], p.Addr(), alt.Addr(), ld, ld2, ld3)
	}
	if s := c.stats(); s.LDAlive[ld] || !s.LDAlive[ld2] || !s.LDAlive[ld3] {
		t.Fatalf("alive: %v", s.LDAlive)
	}
	// The pick is the flow's, and stays while that LD lives, whichever other dies.
	picked := alt.Addr()
	rest := ld2
	if picked == ld2 {
		rest = ld3
	}
	for range 3 {
		if _, alt, _ := c.route(reply, &fc); alt.Addr() != picked {
			t.Fatalf("copy to %s, then to %s", picked, alt.Addr())
		}
	}
	silence(rest)
	if _, alt, _ := c.route(reply, &fc); alt.Addr() != picked {
		t.Fatalf("copy to %s, then to %s after %s died", picked, alt.Addr(), rest)
	}
	// Flows spread over the live LDs.
	seen := map[netip.Addr]bool{}
	alive()
	silence(ld)
	for port := range uint16(64) {
		f := netip.AddrPortFrom(cl.Addr(), 42000+port)
		if _, r := in(c, ld, protoGRE, greWrap(udpPacket(f, vip, []byte("a")), false, false)); r != inOK {
			t.Fatal(resultLabels[r][1])
		}
		silence(ld)
		if _, alt, r := c.route(udpPacket(vip, f, []byte("b")), &fc); r != outDeadLD {
			t.Fatalf("flow %v: %s", f, resultLabels[r][1])
		} else {
			seen[alt.Addr()] = true
		}
	}
	if !seen[ld2] || !seen[ld3] || len(seen) != 2 {
		t.Fatalf("copies of 64 flows went to %v, want both live LDs", seen)
	}

	// A packet of the flow from a live LD moves it at once, not after move_idle (10s).
	if _, r := in(c, ld2, protoGRE, greWrap(udpPacket(cl, vip, []byte("again")), false, false)); r != inOK {
		t.Fatal(resultLabels[r][1])
	}
	if s := c.stats(); s.Moves != 1 {
		t.Fatalf("moves %d, want 1", s.Moves)
	}
	if p, alt, r := c.route(reply, &fc); r != outOK || p.Addr() != ld2 || alt != (peer{}) {
		t.Fatalf("reply after the move: %s to %s (copy %v)", resultLabels[r][1], p.Addr(), alt.Addr())
	}

	// The LD back: its flows' replies go to it alone again.
	if _, r := in(c, ld, protoGRE, greWrap(udpPacket(other, vip, []byte("back")), false, false)); r != inOK {
		t.Fatal(resultLabels[r][1])
	}
	if p, alt, r := c.route(udpPacket(vip, netip.AddrPortFrom(cl.Addr(), 42000), []byte("b")), &fc); r != outOK || p.Addr() != ld || alt != (peer{}) {
		t.Fatalf("reply after its LD came back: %s to %s (copy %v)", resultLabels[r][1], p.Addr(), alt.Addr())
	}

	// ld_dead_after negative: never.
	never := testCore(t, func(c *Config) { c.LDDeadAfter = -1 })
	never.start = never.start.Add(-time.Hour)
	if _, r := in(never, ld, protoGRE, greWrap(udpPacket(cl, vip, []byte("hello")), false, false)); r != inOK {
		t.Fatal(resultLabels[r][1])
	}
	if _, r := in(never, ld2, protoGRE, greWrap(udpPacket(other, vip, []byte("x")), false, false)); r != inOK {
		t.Fatal(resultLabels[r][1])
	}
	never.ldSeen[never.lds[ld]].Store(1)
	if p, alt, r := never.route(reply, &fc); r != outOK || p.Addr() != ld || alt != (peer{}) {
		t.Fatalf("ld_dead_after -1s: %s to %s (copy %v)", resultLabels[r][1], p.Addr(), alt.Addr())
	}
}
