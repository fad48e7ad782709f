//go:build linux

package tunnel

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/wire"
)

// testbed is an "ld" namespace (198.18.1.1, plus 198.18.1.2 that is not an LD) and an
// "l7" namespace (198.18.1.11) running an Endpoint for VIP 203.0.113.10, joined by a
// veth. The test plays the LD with raw sockets.
type testbed struct {
	ld, l7 *netns.NS
	ep     *Endpoint
	reg    *prometheus.Registry
	runErr chan error
	cancel context.CancelFunc
}

func newTestbed(t *testing.T, mod func(*Config)) *testbed {
	tb := &testbed{ld: netns.New(t, "ld"), l7: netns.New(t, "l7"), reg: prometheus.NewRegistry()}
	netns.Veth(t, tb.ld, "eth0", tb.l7, "eth0")
	tb.ld.Addr("eth0", "198.18.1.1/24")
	tb.ld.Addr("eth0", "198.18.1.2/24")
	tb.l7.Addr("eth0", "198.18.1.11/24")
	// Strict reverse-path filtering, as many hosts have: the device's own setting of 0
	// does not lower it (the higher of all and the device's wins); the rule from the
	// VIPs must make the check pass.
	tb.l7.Sysctl("net.ipv4.conf.all.rp_filter", "1")
	cfg := Config{
		VIPs:       []netip.Addr{vip.Addr()},
		LDs:        []netip.Addr{ld},
		Local:      local,
		Registerer: tb.reg,
		Logger:     slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&cfg)
	}
	tb.l7.MustDo(func() error {
		var err error
		tb.ep, err = New(cfg)
		return err
	})
	t.Cleanup(func() { tb.ep.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	tb.cancel = cancel
	tb.runErr = make(chan error, 1)
	go func() { tb.runErr <- tb.ep.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-tb.runErr:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return tb
}

// stats waits up to a second for the endpoint's counters to satisfy cond (a reply can
// reach the test before the packet that caused it is counted), and returns them.
func (tb *testbed) stats(cond func(Stats) bool) Stats {
	s := tb.ep.Stats()
	for deadline := time.Now().Add(time.Second); !cond(s) && time.Now().Before(deadline); s = tb.ep.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// ldSocket opens a raw socket for proto in the ld namespace, bound to src, with a
// receive timeout.
// udpEcho serves UDP on the VIP in the L7 namespace until the test ends: each
// datagram is echoed at once and, when later is not 0, again with " later" appended
// after later.
func (tb *testbed) udpEcho(t *testing.T, later time.Duration) {
	t.Helper()
	var uc *net.UDPConn
	tb.l7.MustDo(func() error {
		var err error
		uc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(vip))
		return err
	})
	t.Cleanup(func() { uc.Close() })
	go func() {
		b := make([]byte, 1500)
		for {
			n, from, err := uc.ReadFromUDPAddrPort(b)
			if err != nil {
				return
			}
			msg := bytes.Clone(b[:n])
			uc.WriteToUDPAddrPort(msg, from)
			if later != 0 {
				time.AfterFunc(later, func() { uc.WriteToUDPAddrPort(append(msg, " later"...), from) })
			}
		}
	}()
}

func (tb *testbed) ldSocket(t *testing.T, proto int, src string) int {
	t.Helper()
	var fd int
	tb.ld.MustDo(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Addr: netip.MustParseAddr(src).As4()})
	})
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func sendTo(t *testing.T, fd int, payload []byte) {
	t.Helper()
	if err := unix.Sendto(fd, payload, 0, &unix.SockaddrInet4{Addr: local.As4()}); err != nil {
		t.Fatalf("sending to the endpoint: %v", err)
	}
}

// recvInner waits up to wait for a tunnel packet to the LD (ld) on fd whose inner
// packet satisfies match, checking its outer header on the way, and returns the inner
// packet.
func recvInner(t *testing.T, fd int, wait time.Duration, match func(pi packetInfo) bool) []byte {
	t.Helper()
	_, inner := recvTunnel(t, fd, ld, wait, match)
	return inner
}

// recvTunnel waits up to wait for a tunnel packet to LD address dst on fd whose inner
// packet satisfies match, checking its outer header on the way, and returns the tunnel
// payload (GRE header or none, then the inner packet) and the inner packet.
func recvTunnel(t *testing.T, fd int, to netip.Addr, wait time.Duration, match func(pi packetInfo) bool) (payload, inner []byte) {
	t.Helper()
	buf := make([]byte, 65536)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("reading the LD's raw socket: %v", err)
		}
		src, dst, proto, pl, err := outer4(buf[:n])
		if err != nil || netip.AddrFrom4(dst) != to {
			continue
		}
		inner, _, err := decapsulate(proto, pl, 0)
		if err != nil {
			t.Fatalf("reply does not decapsulate: %v: % x", err, pl)
		}
		pi, err := parseFlow(inner)
		if err != nil {
			t.Fatalf("inner reply does not parse: %v", err)
		}
		if !match(pi) {
			continue
		}
		if netip.AddrFrom4(src) != local {
			t.Fatalf("reply from outer source %v, want %v", netip.AddrFrom4(src), local)
		}
		return bytes.Clone(pl), bytes.Clone(inner)
	}
	return nil, nil
}

// to matches packets from the VIP to client c.
func to(c netip.AddrPort, proto uint8) func(packetInfo) bool {
	return func(pi packetInfo) bool {
		k := pi.key
		return k.proto == proto && !k.v6 && [4]byte(k.src[:4]) == vip.Addr().As4() &&
			[4]byte(k.dst[:4]) == c.Addr().As4() && (proto == protoICMP || k.sport == vip.Port() && k.dport == c.Port())
	}
}

func tcpFields(inner []byte) (seq, ack uint32, flags uint8, data []byte) {
	hl := int(inner[0]&0x0f) * 4
	tcp := inner[hl:]
	return binary.BigEndian.Uint32(tcp[4:]), binary.BigEndian.Uint32(tcp[8:]), tcp[13], tcp[int(tcp[12]>>4)*4:]
}

// TestEndpointTCP plays a client behind an LD through a whole TCP exchange with a Go
// server on the VIP, over GRE, then opens a connection over IPIP.
func TestEndpointTCP(t *testing.T) {
	tb := newTestbed(t, nil)
	var ln net.Listener
	tb.l7.MustDo(func() error {
		var err error
		ln, err = net.Listen("tcp", vip.String())
		return err
	})
	defer ln.Close()
	type accepted struct {
		remote string
		got    string
		err    error
	}
	acc := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			acc <- accepted{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 5)
		_, err = io.ReadFull(c, b)
		if err == nil {
			_, err = c.Write([]byte("world"))
		}
		acc <- accepted{remote: c.RemoteAddr().String(), got: string(b), err: err}
	}()

	gre := tb.ldSocket(t, unix.IPPROTO_GRE, "198.18.1.1")
	sendTo(t, gre, greWrap(tcpPacket(client, vip, 1000, 0, tcpSYN, nil), false, false))
	synack := recvInner(t, gre, 3*time.Second, to(client, protoTCP))
	if synack == nil {
		t.Fatalf("no SYN-ACK came back over GRE; stats %+v", tb.ep.Stats())
	}
	sseq, sack, flags, _ := tcpFields(synack)
	if flags&(tcpSYN|tcpACK) != tcpSYN|tcpACK || sack != 1001 {
		t.Fatalf("reply flags %#x ack %d, want SYN-ACK acking 1001", flags, sack)
	}
	// The reply's MSS follows the TUN MTU: 1476 - 40.
	if mss := binary.BigEndian.Uint16(synack[20+22:]); synack[20+20] != 2 || mss != DefaultMTU-40 {
		t.Errorf("SYN-ACK MSS option % x, want MSS %d", synack[40:44], DefaultMTU-40)
	}
	sendTo(t, gre, greWrap(tcpPacket(client, vip, 1001, sseq+1, tcpACK, nil), false, false))
	sendTo(t, gre, greWrap(tcpPacket(client, vip, 1001, sseq+1, tcpACK|0x08, []byte("hello")), false, false))
	reply := recvInner(t, gre, 3*time.Second, func(pi packetInfo) bool {
		if !to(client, protoTCP)(pi) {
			return false
		}
		return len(pi.l4) > int(pi.l4[12]>>4)*4 // carries data
	})
	if reply == nil {
		t.Fatalf("no data came back; stats %+v", tb.ep.Stats())
	}
	if _, _, _, data := tcpFields(reply); string(data) != "world" {
		t.Fatalf("reply data %q, want world", data)
	}
	select {
	case a := <-acc:
		if a.err != nil || a.got != "hello" || a.remote != client.String() {
			t.Fatalf("server: read %q from %s, err %v; want hello from %s", a.got, a.remote, a.err, client)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the server never got the data")
	}

	// Over IPIP, a second connection: the SYN-ACK comes back over IPIP.
	ipip := tb.ldSocket(t, unix.IPPROTO_IPIP, "198.18.1.1")
	c2 := netip.AddrPortFrom(client.Addr(), 40001)
	sendTo(t, ipip, tcpPacket(c2, vip, 5000, 0, tcpSYN, nil))
	if recvInner(t, ipip, 3*time.Second, to(c2, protoTCP)) == nil {
		t.Fatalf("no SYN-ACK came back over IPIP; stats %+v", tb.ep.Stats())
	}
	s := tb.stats(func(s Stats) bool { return s.In["ok"] >= 4 && s.Out["ok"] >= 3 })
	if s.In["ok"] < 4 || s.Out["ok"] < 3 || s.Flows != 2 {
		t.Errorf("stats %+v: want at least 4 in, 3 out, 2 flows", s)
	}
	sendTo(t, gre, greWrap(tcpPacket(client, vip, 1006, 0, 0x04, nil), false, false)) // RST
}

// TestEndpointDrops checks that packets from a source that is not an LD and garbage are
// dropped and counted, and that the endpoint still works after them.
func TestEndpointDrops(t *testing.T) {
	tb := newTestbed(t, nil)
	tb.l7.MustDo(func() error {
		ln, err := net.Listen("tcp", vip.String())
		if err == nil {
			t.Cleanup(func() { ln.Close() })
		}
		return err
	})
	intruder := tb.ldSocket(t, unix.IPPROTO_GRE, "198.18.1.2")
	gre := tb.ldSocket(t, unix.IPPROTO_GRE, "198.18.1.1")
	ipip := tb.ldSocket(t, unix.IPPROTO_IPIP, "198.18.1.1")
	c := netip.AddrPortFrom(client.Addr(), 40002)
	sendTo(t, intruder, greWrap(tcpPacket(c, vip, 1, 0, tcpSYN, nil), false, false))
	if recvInner(t, gre, 500*time.Millisecond, to(c, protoTCP)) != nil {
		t.Fatal("a packet from a non-LD source was answered")
	}
	for i := range garbageRounds {
		g, p := garbage(i)
		sendTo(t, gre, g)
		sendTo(t, ipip, p)
	}
	sendTo(t, gre, append([]byte{0, 0, 0x65, 0x58}, make([]byte, 60)...)) // Ethernet over GRE
	sendTo(t, gre, greWrap(tcpPacket(c, netip.MustParseAddrPort("203.0.113.99:80"), 1, 0, tcpSYN, nil), false, false))
	// Still working.
	c2 := netip.AddrPortFrom(client.Addr(), 40003)
	sendTo(t, gre, greWrap(tcpPacket(c2, vip, 1, 0, tcpSYN, nil), false, false))
	if recvInner(t, gre, 3*time.Second, to(c2, protoTCP)) == nil {
		t.Fatalf("no SYN-ACK after the garbage; stats %+v", tb.ep.Stats())
	}
	// Every garbage packet and the Ethernet one are refused as unparsable, none as
	// anything else: the garbage is built so that no packet of it is valid.
	const wantBad = 2*garbageRounds + 1
	bad := func(s Stats) uint64 {
		return s.In["malformed"] + s.In["truncated"] + s.In["unsupported"] + s.In["bad_checksum"]
	}
	s := tb.stats(func(s Stats) bool { return s.In["ok"] == 1 && bad(s) == wantBad })
	if s.In["unknown_ld"] != 1 || bad(s) != wantBad || s.In["unsupported"] == 0 || s.In["not_vip"] != 1 || s.In["ok"] != 1 {
		t.Errorf("stats %+v: want 1 unknown_ld, 1 not_vip, %d bad, 1 ok", s, wantBad)
	}
	if got := metricValue(t, tb.reg, "tiergate_l7_tunnel_packets_total", "unknown_ld"); got != 1 {
		t.Errorf("metric unknown_ld = %v, want 1", got)
	}
	if got := metricValue(t, tb.reg, "tiergate_l7_tunnel_flows", ""); got != 1 {
		t.Errorf("metric flows = %v, want 1", got)
	}
}

// garbageRounds is the number of garbage packets TestEndpointDrops sends each way.
const garbageRounds = 200

// garbage returns round i's random garbage for the GRE socket and for the IPIP socket,
// 0 to 79 bytes, built so that neither can be a valid tunnel packet however the random
// bytes fall: the GRE payload never declares IPv4 or IPv6 inside (a protocol type that
// would is changed), and an IPIP payload that starts like IPv4 (every even round, and
// odd rounds by chance) claims a total length beyond its end. Random bytes alone made
// a valid packet to some non-VIP now and then, counted as not_vip instead of garbage.
func garbage(i int) (gre, ipip []byte) {
	gre = make([]byte, i%80)
	rand.Read(gre)
	if len(gre) >= 4 {
		if pt := binary.BigEndian.Uint16(gre[2:]); pt == wire.EtherTypeIPv4 || pt == wire.EtherTypeIPv6 {
			gre[2] ^= 0x40
		}
	}
	ipip = make([]byte, i%80)
	rand.Read(ipip)
	if len(ipip) > 0 && i%2 == 0 {
		ipip[0] = 0x45 // looks like IPv4 to IPIP
	}
	if len(ipip) >= 4 && ipip[0]>>4 == 4 {
		binary.BigEndian.PutUint16(ipip[2:], uint16(len(ipip)+1+int(ipip[3])))
	}
	return gre, ipip
}

// TestGarbageInvalid holds garbage to its promise: every packet of it is refused by
// the endpoint's parsers, over many rounds of random bytes.
func TestGarbageInvalid(t *testing.T) {
	c := testCore(t, nil)
	var n ldNoter
	for r := range 100 * garbageRounds {
		g, p := garbage(r)
		for _, tc := range []struct {
			proto uint8
			b     []byte
		}{{protoGRE, g}, {protoIPIP, p}} {
			_, res := c.inbound(false, tc.proto, outerIPv4(ld, local, tc.proto, tc.b), nil, &n)
			switch res {
			case inMalformed, inTruncated, inUnsupported, inBadChecksum:
			default:
				t.Fatalf("garbage % x over protocol %d: %s", tc.b, tc.proto, resultLabels[res][1])
			}
		}
	}
}

// TestEndpointKeyAndLDs runs an endpoint with a GRE key and two LDs (198.18.1.1 and
// .2): a packet without the key is refused, the replies carry the key, and a packet of
// a live flow from the other LD's address is delivered but does not take the flow's
// replies away from its LD. Before, the key was ignored (and not sent), and the one
// packet from .2 re-pointed the flow there.
func TestEndpointKeyAndLDs(t *testing.T) {
	const key = 0xdeadbeef // greWrap's
	tb := newTestbed(t, func(c *Config) {
		c.Key = key
		c.LDs = []netip.Addr{ld, ld2}
		c.LDDeadAfter = config.Duration(time.Minute) // both LDs live throughout
	})
	tb.udpEcho(t, 0)
	gre1 := tb.ldSocket(t, unix.IPPROTO_GRE, ld.String())
	gre2 := tb.ldSocket(t, unix.IPPROTO_GRE, ld2.String())
	ipip := tb.ldSocket(t, unix.IPPROTO_IPIP, ld.String())
	c := netip.AddrPortFrom(client.Addr(), 40030)
	echo := func(data string) func(packetInfo) bool {
		return func(pi packetInfo) bool { return to(c, protoUDP)(pi) && bytes.HasSuffix(pi.l4, []byte(data)) }
	}

	sendTo(t, gre1, greWrap(udpPacket(c, vip, []byte("no key")), false, false))
	sendTo(t, ipip, udpPacket(c, vip, []byte("ipip")))
	wrong := greWrap(udpPacket(c, vip, []byte("wrong key")), true, false)
	wrong[7]++
	sendTo(t, gre1, wrong)
	sendTo(t, gre1, greWrap(udpPacket(c, vip, []byte("keyed")), true, false))
	pl, _ := recvTunnel(t, gre1, ld, 3*time.Second, echo("keyed"))
	if pl == nil {
		t.Fatalf("no echo of the keyed packet; stats %+v", tb.ep.Stats())
	}
	if want := []byte{0x20, 0, 0x08, 0, 0xde, 0xad, 0xbe, 0xef}; !bytes.Equal(pl[:8], want) {
		t.Fatalf("reply's GRE header % x, want % x (key bit, IPv4, the key)", pl[:8], want)
	}
	if s := tb.stats(func(s Stats) bool { return s.In["bad_key"] == 3 && s.In["ok"] == 1 }); s.In["bad_key"] != 3 || s.In["ok"] != 1 {
		t.Fatalf("stats %+v: want 3 bad_key (none, IPIP, wrong), 1 ok", s)
	}

	// The same flow from the other LD's address: delivered (echoed), but the echo goes
	// to the flow's LD.
	sendTo(t, gre2, greWrap(udpPacket(c, vip, []byte("from ld2")), true, false))
	if _, in := recvTunnel(t, gre1, ld, 3*time.Second, echo("from ld2")); in == nil {
		t.Fatalf("the echo of the packet from the other LD did not go to the flow's LD; stats %+v", tb.ep.Stats())
	}
	if _, in := recvTunnel(t, gre2, ld2, 300*time.Millisecond, to(c, protoUDP)); in != nil {
		t.Fatal("a reply of the flow went to the other LD")
	}
	s := tb.stats(func(s Stats) bool { return s.MovesRefused == 1 })
	if s.MovesRefused != 1 || s.Moves != 0 {
		t.Fatalf("stats %+v: want 1 refused move", s)
	}
	if got := metricValue(t, tb.reg, "tiergate_l7_tunnel_packets_total", "bad_key"); got != 3 {
		t.Errorf("metric bad_key = %v, want 3", got)
	}
	// A new flow from the other LD is its own.
	c2 := netip.AddrPortFrom(client.Addr(), 40031)
	sendTo(t, gre2, greWrap(udpPacket(c2, vip, []byte("new")), true, false))
	if _, in := recvTunnel(t, gre2, ld2, 3*time.Second, func(pi packetInfo) bool { return to(c2, protoUDP)(pi) }); in == nil {
		t.Fatalf("no echo to the other LD of its own flow; stats %+v", tb.ep.Stats())
	}
}

// TestEndpointUDPAndICMP checks UDP replies (as QUIC's) and an ICMP error the kernel
// makes, which must find its flow through the packet it quotes.
func TestEndpointUDPAndICMP(t *testing.T) {
	tb := newTestbed(t, nil)
	tb.udpEcho(t, 0)
	gre := tb.ldSocket(t, unix.IPPROTO_GRE, "198.18.1.1")
	c := netip.AddrPortFrom(client.Addr(), 40010)
	sendTo(t, gre, greWrap(udpPacket(c, vip, []byte("ping")), false, false))
	reply := recvInner(t, gre, 3*time.Second, to(c, protoUDP))
	if reply == nil || !bytes.HasSuffix(reply, []byte("ping")) {
		t.Fatalf("UDP echo: % x; stats %+v", reply, tb.ep.Stats())
	}
	closed := netip.AddrPortFrom(vip.Addr(), 9)
	c2 := netip.AddrPortFrom(client.Addr(), 40011)
	sendTo(t, gre, greWrap(udpPacket(c2, closed, []byte("anyone?")), false, false))
	icmp := recvInner(t, gre, 3*time.Second, to(c2, protoICMP))
	if icmp == nil || icmp[20] != 3 || icmp[21] != 3 {
		t.Fatalf("no port unreachable came back: % x; stats %+v", icmp, tb.ep.Stats())
	}
	if s := tb.stats(func(s Stats) bool { return s.Out["ok"] >= 2 }); s.Out["fallback"] != 0 || s.Out["ok"] != 2 {
		t.Fatalf("stats %+v: the ICMP error should match its flow, not fall back", s)
	}
}

// TestEndpointCleanup checks that Close removes the device and the rules.
func TestEndpointCleanup(t *testing.T) {
	tb := newTestbed(t, func(c *Config) { c.Device = "tgtest0"; c.Table = 4343 })
	if out := tb.l7.MustRun("ip", "rule", "show"); !strings.Contains(out, "from 203.0.113.10 lookup 4343") {
		t.Fatalf("rule missing:\n%s", out)
	}
	if out := tb.l7.MustRun("ip", "route", "show", "table", "4343"); !strings.Contains(out, "default dev tgtest0") {
		t.Fatalf("route missing:\n%s", out)
	}
	if out := tb.l7.MustRun("ip", "addr", "show", "dev", "tgtest0"); !strings.Contains(out, "203.0.113.10/32") || !strings.Contains(out, "mtu 1476") {
		t.Fatalf("device:\n%s", out)
	}
	if err := tb.ep.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-tb.runErr:
		tb.runErr <- err // for the cleanup's check
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if out := tb.l7.MustRun("ip", "rule", "show"); strings.Contains(out, "4343") {
		t.Fatalf("rule left after Close:\n%s", out)
	}
	if out, err := tb.l7.Run("ip", "link", "show", "tgtest0"); err == nil {
		t.Fatalf("device left after Close:\n%s", out)
	}
	// A new endpoint can take the same names at once.
	tb.l7.MustDo(func() error {
		ep, err := New(Config{Device: "tgtest0", Table: 4343, VIPs: []netip.Addr{vip.Addr()},
			LDs: []netip.Addr{ld}, Registerer: tb.reg})
		if err != nil {
			return err
		}
		return ep.Close()
	})
}

// TestEndpointIPv6 checks IPv6 inside (an IPv6 VIP, over GRE from an IPv4 LD) and IPv6
// outside (IPIP from an IPv6 LD, carrying IPv4).
func TestEndpointIPv6(t *testing.T) {
	tb := newTestbed(t, func(c *Config) {
		c.VIPs = append(c.VIPs, vip6.Addr())
		c.LDs = append(c.LDs, netip.MustParseAddr("2001:db8:1::1"))
		c.Local = netip.Addr{}
	})
	tb.ld.Addr("eth0", "2001:db8:1::1/64")
	tb.l7.Addr("eth0", "2001:db8:1::11/64")
	for _, a := range []netip.AddrPort{vip, vip6} {
		tb.l7.MustDo(func() error {
			ln, err := net.Listen("tcp", a.String())
			if err == nil {
				t.Cleanup(func() { ln.Close() })
			}
			return err
		})
	}
	if out := tb.l7.MustRun("ip", "-6", "rule", "show"); !strings.Contains(out, "from 2001:db8:ff::10 lookup 4242") {
		t.Fatalf("IPv6 rule missing:\n%s", out)
	}

	// IPv6 inside GRE over IPv4.
	gre := tb.ldSocket(t, unix.IPPROTO_GRE, "198.18.1.1")
	sendTo(t, gre, greWrap(tcpPacket(cl6, vip6, 1, 0, tcpSYN, nil), false, false))
	reply := recvInner(t, gre, 3*time.Second, func(pi packetInfo) bool {
		return pi.key.v6 && pi.key.proto == protoTCP && pi.key.src == vip6.Addr().As16() && pi.key.dst == cl6.Addr().As16() &&
			pi.key.dport == cl6.Port() && pi.tcpFlags&(tcpSYN|tcpACK) == tcpSYN|tcpACK
	})
	if reply == nil {
		t.Fatalf("no IPv6 SYN-ACK over GRE; stats %+v", tb.ep.Stats())
	}
	// The MSS follows the MTU for an IPv6 LD, 1456, less 60.
	if mss := binary.BigEndian.Uint16(reply[40+22:]); mss != DefaultMTU6-60 {
		t.Errorf("IPv6 SYN-ACK MSS %d, want %d", mss, DefaultMTU6-60)
	}

	// IPv4 inside IPIP over IPv6: the LD's IPv6 raw socket gets the payload only.
	var fd int
	tb.ld.MustDo(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_IPIP); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(int64(3 * time.Second))
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	defer unix.Close(fd)
	c := netip.AddrPortFrom(client.Addr(), 40020)
	l7addr := netip.MustParseAddr("2001:db8:1::11").As16()
	if err := unix.Sendto(fd, tcpPacket(c, vip, 1, 0, tcpSYN, nil), 0, &unix.SockaddrInet6{Addr: l7addr}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	for {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("no SYN-ACK over IPIP/IPv6: %v; stats %+v", err, tb.ep.Stats())
		}
		pi, err := parseFlow(buf[:n])
		if err != nil || pi.key.dport != c.Port() {
			continue
		}
		if sa, ok := from.(*unix.SockaddrInet6); !ok || sa.Addr != l7addr {
			t.Fatalf("reply from %v, want %v", from, netip.AddrFrom16(l7addr))
		}
		break
	}
}

// TestEndpointDeadLD: a reply of a flow whose LD has gone silent while another LD
// still sends reaches that other LD too (it holds the flow from the LDs' session sync),
// besides the silent LD. Before, it went to the silent LD alone.
func TestEndpointDeadLD(t *testing.T) {
	tb := newTestbed(t, func(c *Config) {
		c.LDs = []netip.Addr{ld, ld2}
		c.LDDeadAfter = config.Duration(500 * time.Millisecond)
	})
	// The server answers each datagram at once and again 1.5 s later, when its LD has
	// been silent for longer than ld_dead_after.
	tb.udpEcho(t, 1500*time.Millisecond)
	gre1 := tb.ldSocket(t, unix.IPPROTO_GRE, ld.String())
	gre2 := tb.ldSocket(t, unix.IPPROTO_GRE, ld2.String())
	c := netip.AddrPortFrom(client.Addr(), 40040)
	other := netip.AddrPortFrom(client.Addr(), 40041)
	echo := func(data string) func(packetInfo) bool {
		return func(pi packetInfo) bool { return to(c, protoUDP)(pi) && bytes.HasSuffix(pi.l4, []byte(data)) }
	}
	sendTo(t, gre1, greWrap(udpPacket(c, vip, []byte("hello")), false, false))
	if _, in := recvTunnel(t, gre1, ld, 3*time.Second, echo("hello")); in == nil {
		t.Fatalf("no echo; stats %+v", tb.ep.Stats())
	}
	// ld2 keeps sending (another flow) while ld is silent.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				unix.Sendto(gre2, greWrap(udpPacket(other, vip, []byte("x")), false, false), 0, &unix.SockaddrInet4{Addr: local.As4()})
			}
		}
	}()
	defer func() { close(stop); <-done }()
	if _, in := recvTunnel(t, gre2, ld2, 5*time.Second, echo("hello later")); in == nil {
		t.Fatalf("the late reply of the silent LD's flow did not reach the live LD; stats %+v", tb.ep.Stats())
	}
	if _, in := recvTunnel(t, gre1, ld, 3*time.Second, echo("hello later")); in == nil {
		t.Fatalf("the late reply did not reach the flow's own LD too; stats %+v", tb.ep.Stats())
	}
	if s := tb.stats(func(s Stats) bool { return s.Out["dead_ld"] >= 1 }); s.Out["dead_ld"] < 1 || s.LDAlive[ld] || !s.LDAlive[ld2] {
		t.Fatalf("stats %+v: want a dead_ld reply, ld dead, ld2 alive", s)
	}
	mfs, err := tb.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	alive := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "tiergate_l7_tunnel_ld_alive" {
			for _, m := range mf.GetMetric() {
				alive[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if alive[ld.String()] != 0 || alive[ld2.String()] != 1 || len(alive) != 2 {
		t.Errorf("tiergate_l7_tunnel_ld_alive: %v, want %s 0, %s 1", alive, ld, ld2)
	}
}
