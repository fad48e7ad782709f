package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/prometheus/client_golang/prometheus"
)

// keyedGRE is a member's reply in GRE with a key, from member to the LD's internal
// address.
func keyedGRE(t *testing.T, member netip.Addr, key uint32, inner []byte) []byte {
	return serialize(t,
		&layers.Ethernet{SrcMAC: memberMAC[member.String()], DstMAC: intMAC[:], EthernetType: layers.EthernetTypeIPv4},
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolGRE, SrcIP: member.AsSlice(), DstIP: ldInt.AsSlice()},
		&layers.GRE{KeyPresent: true, Key: key, Protocol: layers.EthernetTypeIPv4}, gopacket.Payload(inner))
}

// asExternal is f as it would arrive on the external port: from the gateway's MAC to
// the external port's.
func asExternal(f []byte) []byte {
	out := bytes.Clone(f)
	copy(out[0:6], extMAC[:])
	copy(out[6:12], gwMAC)
	return out
}

// statusCount waits until Status counts dirResult ("out/return_no_flow") at want or
// more, and returns the count.
func (r *rig) statusCount(dirResult string, want uint64) uint64 {
	r.t.Helper()
	return r.waitStatus(fmt.Sprintf("%s ≥ %d", dirResult, want), func(st Status) bool {
		return st.Packets[dirResult] >= want
	}).Packets[dirResult]
}

// TestReturnPathOnlyForMembersFlows checks that the LD sends out of its external
// port, with a VIP as source, only what a member sends on the internal port for a
// flow the LD forwarded to it; every other tunnelled packet is dropped and counted
// by reason, and none makes the LD resolve its destination.
func TestReturnPathOnlyForMembersFlows(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve()
	r.ext.Drain()

	r.ext.Inject(tcp4(t, client, 40000, vip, 443, true, false, nil))
	member := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst
	reply := replyPacket(t, vip, client, 40000)
	r.int.Inject(gre4(t, member, reply))
	if got := waitData(t, r.ext, 1)[0]; !bytes.Equal(ipPacket(got), decTTL(reply)) {
		t.Fatal("the member's reply to a forwarded flow was not sent on")
	}

	other := netip.MustParseAddr("198.18.1.99")
	onLink := netip.MustParseAddr("198.18.0.50")
	rst := serialize(t,
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: vip.AsSlice(), DstIP: onLink.AsSlice()},
		&layers.TCP{SrcPort: 443, DstPort: 5555, RST: true, Seq: 1})
	toExtAddr := gre4(t, member, reply)
	copy(toExtAddr[14+16:14+20], ldExt.AsSlice()) // to the LD's external address
	binary.BigEndian.PutUint16(toExtAddr[14+10:], 0)
	binary.BigEndian.PutUint16(toExtAddr[14+10:], ^fold(sum16(toExtAddr[14:34], 0)))
	for _, tc := range []struct {
		name   string
		ext    bool
		frame  []byte
		reason string
	}{
		{"reply on the external port", true, asExternal(gre4(t, member, reply)), "out/return_wrong_port"},
		{"to the external address, on the external port", true, asExternal(toExtAddr), "out/return_wrong_port"},
		{"to the external address, on the internal port", false, toExtAddr, "out/return_wrong_port"},
		{"from another address", false, gre4(t, other, reply), "out/return_not_member"},
		{"for another client port", false, gre4(t, member, replyPacket(t, vip, client, 40001)), "out/return_no_flow"},
		{"a reset to an on-link host", false, gre4(t, member, rst), "out/return_no_flow"},
		{"from the external side for an on-link host", true, asExternal(gre4(t, member, rst)), "out/return_wrong_port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.d.Status().Packets[tc.reason]
			for range 20 {
				if tc.ext {
					r.ext.Inject(tc.frame)
				} else {
					r.int.Inject(tc.frame)
				}
			}
			r.statusCount(tc.reason, before+20)
			time.Sleep(2 * publishEvery)
			if fs := r.ext.Drain(); len(fs) != 0 {
				t.Fatalf("%d frames left the external port, the first % x", len(fs), fs[0][:min(len(fs[0]), 60)])
			}
		})
	}
	if st := r.d.Status(); st.Packets["out/forwarded"] != 1 {
		t.Errorf("out/forwarded = %d, want the one reply", st.Packets["out/forwarded"])
	}
}

// TestReturnPathKey checks the tunnel key: with one configured, a member's reply
// passes only when it carries that key.
func TestReturnPathKey(t *testing.T) {
	const key = 0x5eed1e55
	cfg := testConfig()
	cfg.Tunnel.Key = key
	r := newRig(t, cfg)
	r.resolve()
	r.ext.Drain()
	r.ext.Inject(tcp4(t, client, 40000, vip, 443, true, false, nil))
	member := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst
	reply := replyPacket(t, vip, client, 40000)

	r.int.Inject(gre4(t, member, reply))                             // no key
	r.int.Inject(keyedGRE(t, member, key+1, reply))                  // another key
	r.int.Inject(encapFromMember(t, ModeIPIP, member, ldInt, reply)) // IPIP has none
	r.statusCount("out/return_bad_key", 3)
	r.int.Inject(keyedGRE(t, member, key, reply))
	if got := waitData(t, r.ext, 1)[0]; !bytes.Equal(ipPacket(got), decTTL(reply)) {
		t.Fatal("the reply with the key was not sent on")
	}
	r.statusCount("out/forwarded", 1)
	if st := r.d.Status(); st.Packets["out/forwarded"] != 1 || st.Packets["out/return_bad_key"] != 3 {
		t.Errorf("out/forwarded %d, out/return_bad_key %d; want 1 and 3", st.Packets["out/forwarded"], st.Packets["out/return_bad_key"])
	}

	bad := testConfig()
	bad.Tunnel = TunnelConfig{Mode: ModeIPIP, Key: key}
	if err := bad.Validate(); err == nil || !bytes.Contains([]byte(err.Error()), []byte("tunnel.key")) {
		t.Errorf("a key with ipip: Validate = %v", err)
	}
}

// TestUnconfirmedEntriesYieldToSYN fills a table of 8 with flows picked up mid-way
// (bare ACKs, or UDP datagrams, from spoofed sources): they are forwarded, but a real
// client's SYN still finds room, because they stay unconfirmed until a member
// answers. A mid-flow flow its member answers is confirmed and kept through the next
// flood.
func TestUnconfirmedEntriesYieldToSYN(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flood func(t *testing.T, i int) []byte
	}{
		{"bare acks", func(t *testing.T, i int) []byte {
			return tcp4(t, netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + i)}), 1000, vip, 443, false, true, nil)
		}},
		{"udp datagrams", func(t *testing.T, i int) []byte {
			return udp4(t, netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + i)}), 1000, vip, 443, []byte{1})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			cfg := testConfig()
			cfg.Conntrack.Capacity = 8
			r := startRig(t, cfg, Options{Registerer: reg})
			r.resolve()
			const (
				forwarded = "tiergate_l4_packets_total{dir=in,result=forwarded}"
				conns     = "tiergate_l4_connections"
				halfOpen  = "tiergate_l4_connections_half_open"
				unconf    = "tiergate_l4_connections_unconfirmed"
				evictions = "tiergate_l4_conntrack_evictions_total"
			)
			for i := range 8 {
				r.ext.Inject(tc.flood(t, i))
			}
			waitData(t, r.int, 8) // mid-flow pick-up works
			waitMetrics(t, reg, map[string]float64{forwarded: 8, conns: 8, unconf: 8})

			r.ext.Inject(tcp4(t, client, 40000, vip, 443, true, false, nil))
			waitData(t, r.int, 1)
			waitMetrics(t, reg, map[string]float64{forwarded: 9, conns: 8, halfOpen: 1, unconf: 7, evictions: 1})
			if n := r.d.Status().Packets["in/table_full"]; n != 0 {
				t.Fatalf("in/table_full = %d", n)
			}

			// A mid-flow pick-up that its member answers is confirmed: the next
			// flood evicts unconfirmed entries only.
			r.ext.Inject(tcp4(t, client, 30000, vip, 443, false, true, nil))
			kept := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst
			r.int.Inject(gre4(t, kept, replyPacket(t, vip, client, 30000)))
			waitData(t, r.ext, 1)
			waitMetrics(t, reg, map[string]float64{forwarded: 10, halfOpen: 1, unconf: 6, evictions: 2})
			for i := range 8 {
				r.ext.Inject(tc.flood(t, 8+i))
			}
			waitData(t, r.int, 8)
			waitMetrics(t, reg, map[string]float64{forwarded: 18, conns: 8, halfOpen: 1, unconf: 6, evictions: 10})
			r.ext.Inject(tcp4(t, client, 30000, vip, 443, false, true, nil))
			if got := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst; got != kept {
				t.Fatalf("the confirmed flow went to %s, its member is %s", got, kept)
			}
			waitMetrics(t, reg, map[string]float64{forwarded: 19, evictions: 10, "tiergate_l4_rule_new_flows_total{rule=web}": 18 - 16*b2f(tc.name != "bare acks")})
			if n := r.d.Status().Packets["in/table_full"]; n != 0 {
				t.Fatalf("in/table_full = %d", n)
			}
		})
	}
}

// TestV4MappedDestinationDropped sends IPv6 packets to ::ffff:<VIP> (and from an
// IPv4-mapped source): they are dropped at the LD as v4mapped, not tunnelled.
func TestV4MappedDestinationDropped(t *testing.T) {
	r := startRig(t, tunnelConfig(false, ModeGRE), Options{})
	r.resolveNeighbours()
	mapped := netip.AddrFrom16(vip.As16())
	r.ext.Inject(tcpFrame(t, client6, 40000, mapped, 443, true, false, nil))
	r.ext.Inject(tcpFrame(t, netip.AddrFrom16(client.As16()), 40001, vip6, 443, true, false, nil))
	r.ext.Inject(tcpFrame(t, client6, 40002, vip6, 443, true, false, nil)) // a real one, last
	waitData(t, r.int, 1)
	st := r.statusCount("in/v4mapped", 2)
	if st != 2 {
		t.Errorf("in/v4mapped = %d, want 2", st)
	}
	if fs := dataFrames(r.int.Drain()); len(fs) != 0 {
		t.Errorf("%d more packets tunnelled", len(fs))
	}
}

// TestTooBigAnswered sends packets that do not fit the tunnel: one that may not be
// fragmented (IPv4 with DF, or IPv6) is answered with fragmentation needed or packet
// too big, from the LD's external address, with the MTU that fits; one that may be
// fragmented is only dropped.
func TestTooBigAnswered(t *testing.T) {
	r := startRig(t, tunnelConfig(false, ModeGRE), Options{})
	r.resolveNeighbours()
	payload := bytes.Repeat([]byte{0xab}, 1460)
	for _, tc := range []struct {
		name     string
		frame    []byte
		src      netip.Addr
		mtu      int
		quoteLen int
	}{
		{"ipv4 df", tcp4(t, client, 40000, vip, 443, false, true, payload), ldExt, 1500 - 24, 576 - 28},
		{"ipv6", tcpFrame(t, client6, 40000, vip6, 443, false, true, payload), ldExt6, 1500 - 24, 1280 - 48},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.ext.Inject(tc.frame)
			f := waitData(t, r.ext, 1)[0]
			if !bytes.Equal(f[0:6], tc.frame[6:12]) || !bytes.Equal(f[6:12], extMAC[:]) {
				t.Errorf("error %s → %s, want back to %s", net.HardwareAddr(f[6:12]), net.HardwareAddr(f[0:6]), net.HardwareAddr(tc.frame[6:12]))
			}
			ip := ipPacket(f)
			orig := ipPacket(tc.frame)
			var src, dst netip.Addr
			var icmp []byte
			if tc.src.Is4() {
				if !ipv4HeaderOK(ip) || ip[9] != 1 || ip[8] != 64 {
					t.Fatalf("IPv4 header % x: checksum, protocol ICMP, TTL 64", ip[:20])
				}
				src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
				icmp = ip[20:]
				if fold(sum16(icmp, 0)) != 0xffff {
					t.Error("ICMP checksum does not verify")
				}
				if icmp[0] != 3 || icmp[1] != 4 || int(binary.BigEndian.Uint16(icmp[6:])) != tc.mtu {
					t.Errorf("ICMP type %d code %d next-hop MTU %d, want 3, 4, %d", icmp[0], icmp[1], binary.BigEndian.Uint16(icmp[6:]), tc.mtu)
				}
				if len(ip) != 576 {
					t.Errorf("error of %d bytes, want 576", len(ip))
				}
			} else {
				if ip[6] != 58 || ip[7] != 64 {
					t.Fatalf("IPv6 next header %d hop limit %d", ip[6], ip[7])
				}
				src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
				icmp = ip[40:]
				if !l4ChecksumOK(ip) {
					t.Error("ICMPv6 checksum does not verify")
				}
				if icmp[0] != 2 || icmp[1] != 0 || int(binary.BigEndian.Uint32(icmp[4:])) != tc.mtu {
					t.Errorf("ICMPv6 type %d code %d MTU %d, want 2, 0, %d", icmp[0], icmp[1], binary.BigEndian.Uint32(icmp[4:]), tc.mtu)
				}
				if len(ip) != 1280 {
					t.Errorf("error of %d bytes, want 1280", len(ip))
				}
			}
			if want := netip.MustParseAddr(map[bool]string{true: client.String(), false: client6.String()}[tc.src.Is4()]); src != tc.src || dst != want {
				t.Errorf("error %s → %s, want %s → %s", src, dst, tc.src, want)
			}
			if !bytes.Equal(icmp[8:], orig[:tc.quoteLen]) {
				t.Errorf("quote of %d bytes is not the first %d of the packet", len(icmp)-8, tc.quoteLen)
			}
			if fs := dataFrames(r.int.Drain()); len(fs) != 0 {
				t.Error("the packet that does not fit was tunnelled")
			}
		})
	}
	// A packet without DF: too big, dropped, nothing said.
	noDF := tcp4(t, client, 40001, vip, 443, false, true, payload)
	noDF[14+6] = 0
	binary.BigEndian.PutUint16(noDF[14+10:], 0)
	binary.BigEndian.PutUint16(noDF[14+10:], ^fold(sum16(noDF[14:34], 0)))
	r.ext.Inject(noDF)
	r.statusCount("in/too_big", 3)
	time.Sleep(2 * publishEvery)
	if fs := dataFrames(r.ext.Drain()); len(fs) != 0 {
		t.Errorf("%d frames answered a packet without DF", len(fs))
	}
}

// TestTooBigRateLimited sends a burst of packets that do not fit: a worker answers
// as many as its bucket holds and counts the rest as suppressed.
func TestTooBigRateLimited(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cfg := testConfig()
	cfg.ICMP = ICMPConfig{Rate: 1, Burst: 3}
	r := startRig(t, cfg, Options{Registerer: reg})
	r.resolve()
	r.ext.Drain()
	payload := bytes.Repeat([]byte{0xab}, 1460)
	var frames [][]byte
	for i := range 10 {
		frames = append(frames, tcp4(t, client, uint16(40000+i), vip, 443, false, true, payload))
	}
	r.ext.Inject(frames...)
	r.statusCount("in/too_big", 10)
	time.Sleep(2 * publishEvery)
	got := gather(t, reg)
	sent, supp := got[`tiergate_l4_icmp_errors_total{result=sent}`], got[`tiergate_l4_icmp_errors_total{result=suppressed}`]
	// One more token may have come in while the burst was handled.
	if sent < 3 || sent > 4 || sent+supp != 10 {
		t.Fatalf("sent %v, suppressed %v: want 3 (or 4) sent, the rest of 10 suppressed", sent, supp)
	}
	if n := len(dataFrames(r.ext.Drain())); n != int(sent) {
		t.Fatalf("%d errors on the wire, %v counted as sent", n, sent)
	}

	off := testConfig()
	off.ICMP.Rate = -1
	r = startRig(t, off, Options{})
	r.resolve()
	r.ext.Drain()
	r.ext.Inject(frames[0])
	r.statusCount("in/too_big", 1)
	time.Sleep(2 * publishEvery)
	if fs := dataFrames(r.ext.Drain()); len(fs) != 0 {
		t.Fatal("an ICMP error was sent with icmp rate -1")
	}
}

// arpFrame is an ARP request or reply from sender (at mac) on the external link.
func arpFrame(t *testing.T, op uint16, mac net.HardwareAddr, sender, target netip.Addr) []byte {
	dst := layers.EthernetBroadcast
	if op == layers.ARPReply {
		dst = extMAC[:]
	}
	return serialize(t,
		&layers.Ethernet{SrcMAC: mac, DstMAC: dst, EthernetType: layers.EthernetTypeARP},
		&layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
			Operation: op, SourceHwAddress: mac, SourceProtAddress: sender.AsSlice(),
			DstHwAddress: make([]byte, 6), DstProtAddress: target.AsSlice()})
}

// TestNeighbourTableBounded floods the external link with spoofed ARP and with
// replies to many on-link clients: the neighbour table never holds more than
// MaxNeighbours; the gateway's and the members' entries stay; an on-link client in
// use keeps its entry while idle ones are evicted, least recently used first.
func TestNeighbourTableBounded(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cfg := testConfig()
	cfg.MaxNeighbours = 16
	r := startRig(t, cfg, Options{Registerer: reg})
	r.resolve()
	r.ext.Drain()
	entries := func() (n int, valid map[netip.Addr]bool) {
		valid = map[netip.Addr]bool{}
		_ = r.d.do(func(c *control) {
			n = len(c.neigh.entries)
			for a, e := range c.neigh.entries {
				valid[a] = e.valid
			}
		})
		return n, valid
	}

	// An on-link client, resolved, whose replies keep flowing.
	x := netip.MustParseAddr("198.18.0.77")
	xReply := gre4(t, memberA, replyPacket(t, vip, x, 40000))
	r.ext.Inject(tcp4(t, x, 40000, vip, 443, true, false, nil))
	if m := decodeTunnelled(t, waitSent(t, r.int, 1)[0]).outerDst; m != memberA {
		xReply = gre4(t, m, replyPacket(t, vip, x, 40000))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.int.Inject(xReply)
		time.Sleep(5 * time.Millisecond)
		answerNeighbours(t, r.ext)
		if _, ok := r.d.snap.Load().extNeigh[x]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the on-link client was not resolved")
		}
	}
	useX := func() {
		t.Helper()
		r.int.Inject(xReply)
		for _, f := range waitData(t, r.ext, 1) {
			if !bytes.Equal(f[0:6], onLinkMAC[x.String()]) {
				t.Fatalf("reply to the on-link client went to %s", net.HardwareAddr(f[0:6]))
			}
		}
	}
	useX()

	// The storm: spoofed ARP requests and replies from many addresses, and spoofed
	// SYNs from on-link addresses whose members' replies make the LD resolve them,
	// in rounds of 5 with the client in use between rounds.
	for round := range 30 {
		var syns, arps [][]byte
		for i := range 5 {
			a := netip.AddrFrom4([4]byte{198, 18, 0, byte(100 + round*5 + i)})
			mac := net.HardwareAddr{0x02, 0x66, 0, 0, byte(round), byte(i)}
			arps = append(arps,
				arpFrame(t, layers.ARPRequest, mac, a, ldExt),
				arpFrame(t, layers.ARPReply, mac, netip.AddrFrom4([4]byte{198, 18, 0, byte(250 - i)}), ldExt),
				arpFrame(t, layers.ARPReply, mac, a, ldExt))
			syns = append(syns, tcp4(t, a, 2000, vip, 443, true, false, nil))
		}
		r.ext.Inject(arps...)
		r.ext.Inject(syns...)
		var replies [][]byte
		for i, f := range waitData(t, r.int, 5) {
			a := netip.AddrFrom4([4]byte{198, 18, 0, byte(100 + round*5 + i)})
			replies = append(replies, gre4(t, decodeTunnelled(t, f).outerDst, replyPacket(t, vip, a, 2000)))
		}
		r.int.Inject(replies...)
		r.statusCount("out/no_neighbor", uint64(5*(round+1)))
		// Wait for the control goroutine to have taken the requests.
		time.Sleep(20 * time.Millisecond)
		n, valid := entries()
		if n > cfg.MaxNeighbours {
			t.Fatalf("round %d: %d neighbour entries, the limit is %d", round, n, cfg.MaxNeighbours)
		}
		for _, a := range []string{"198.18.0.1", "198.18.1.11", "198.18.1.12", x.String()} {
			if !valid[netip.MustParseAddr(a)] {
				t.Fatalf("round %d: %s's entry was pushed out (%v)", round, a, valid)
			}
		}
		r.ext.Drain() // the LD's ARP requests for the storm's addresses
		useX()
	}
	waitMetrics(t, reg, map[string]float64{"tiergate_l4_neighbours": 16})
	if ev := gather(t, reg)["tiergate_l4_neighbour_evictions_total"]; ev < 100 {
		t.Errorf("%v neighbour evictions, want the storm's addresses evicted (at least 100)", ev)
	}
}

// TestTunnelKeyMTU holds the MTU math to the GRE header the LD sends, 4 bytes, or 8
// with the tunnel key, over each outer family, for each inner family: a SYN's MSS
// is clamped so that a full segment fits tunnel.mtu once encapsulated; the largest
// inner packet that fits is forwarded and fills it exactly; one byte more is answered
// with fragmentation needed or packet too big quoting that largest size.
func TestTunnelKeyMTU(t *testing.T) {
	const mtu = 1400
	for _, tc := range []struct {
		name   string
		outer6 bool
		key    uint32
	}{
		{"ipv4 outer", false, 0},
		{"ipv4 outer with a key", false, 0x7467_0001},
		{"ipv6 outer", true, 0},
		{"ipv6 outer with a key", true, 0x7467_0001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tunnelConfig(tc.outer6, ModeGRE)
			cfg.Tunnel.Key, cfg.Tunnel.MTU = tc.key, mtu
			r := startRig(t, cfg, Options{})
			r.resolveNeighbours()
			outer := 20 + 4
			if tc.outer6 {
				outer = 40 + 4
			}
			if tc.key != 0 {
				outer += 4
			}
			fits := mtu - outer // the largest inner packet
			for i, inner6 := range []bool{false, true} {
				cl, dst, hdr := client, vip, 20
				if inner6 {
					cl, dst, hdr = client6, vip6, 40
				}
				sport := uint16(42000 + i)
				r.ext.Inject(tcpFrame(t, cl, sport, dst, 443, true, false, nil))
				o := decodeOuter(t, waitData(t, r.int, 1)[0])
				if o.greKey != tc.key {
					t.Errorf("inner IPv6 %v: GRE key %#x, want %#x", inner6, o.greKey, tc.key)
				}
				if mss := binary.BigEndian.Uint16(o.inner[hdr+22:]); int(mss) != fits-hdr-20 {
					t.Errorf("inner IPv6 %v: MSS clamped to %d, want %d", inner6, mss, fits-hdr-20)
				}

				full := tcpFrame(t, cl, sport, dst, 443, false, true, bytes.Repeat([]byte{0xab}, fits-hdr-20))
				r.ext.Inject(full)
				f := waitData(t, r.int, 1)[0]
				o = decodeOuter(t, f)
				if len(f)-14 != mtu || !bytes.Equal(o.inner, ipPacket(full)) {
					t.Errorf("inner IPv6 %v: the largest packet that fits left in an outer packet of %d bytes (want %d), inner changed: %v",
						inner6, len(f)-14, mtu, !bytes.Equal(o.inner, ipPacket(full)))
				}

				r.ext.Inject(tcpFrame(t, cl, sport, dst, 443, false, true, bytes.Repeat([]byte{0xab}, fits-hdr-20+1)))
				ip := ipPacket(waitData(t, r.ext, 1)[0])
				var got int
				switch {
				case inner6 && ip[6] == 58 && ip[40] == 2: // packet too big
					got = int(binary.BigEndian.Uint32(ip[40+4:]))
				case !inner6 && ip[9] == 1 && ip[20] == 3 && ip[21] == 4: // fragmentation needed
					got = int(binary.BigEndian.Uint16(ip[20+6:]))
				default:
					t.Fatalf("inner IPv6 %v: the answer % x is not fragmentation needed or packet too big", inner6, ip[:min(len(ip), 48)])
				}
				if got != fits {
					t.Errorf("inner IPv6 %v: the answer quotes MTU %d, want %d", inner6, got, fits)
				}
				if fs := dataFrames(r.int.Drain()); len(fs) != 0 {
					t.Errorf("inner IPv6 %v: the packet one byte too big was tunnelled", inner6)
				}
			}
			r.statusCount("in/too_big", 2)
		})
	}
}
