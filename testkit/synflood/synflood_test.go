package synflood

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/testkit/netns"
)

// checkSYN parses frame with l4/packet (a parser of its own) and checks that it is a
// valid SYN from a source of src to dst, with the options of a Linux client.
func checkSYN(t *testing.T, frame []byte, src netip.Prefix, dst netip.AddrPort) packet.Packet {
	t.Helper()
	var p packet.Packet
	if err := packet.Parse(frame, &p); err != nil { // checks the IPv4 header checksum
		t.Fatalf("frame % x: %v", frame, err)
	}
	if !packet.VerifyL4Checksum(frame, &p) {
		t.Fatalf("frame % x: bad TCP checksum", frame)
	}
	if p.Proto != packet.ProtoTCP || p.TCPFlags != packet.TCPSyn || !src.Contains(p.Src) ||
		p.Dst != dst.Addr() || p.DstPort != dst.Port() || p.SrcPort < 1024 || p.End != len(frame) {
		t.Fatalf("frame % x: %+v", frame, p)
	}
	tcp := frame[p.L4:p.End]
	if tcp[12]>>4 != 10 || binary.BigEndian.Uint16(tcp[14:]) != Window {
		t.Fatalf("TCP header % x", tcp[:20])
	}
	opts := parseOptions(t, tcp[20:40])
	wantMSS := uint16(1460)
	if p.IsIPv6() {
		wantMSS = 1440
	}
	if mss, ok := opts[2]; !ok || binary.BigEndian.Uint16(mss) != wantMSS {
		t.Fatalf("MSS option %v", opts)
	}
	if _, ok := opts[4]; !ok {
		t.Fatalf("no SACK permitted: %v", opts)
	}
	if ts, ok := opts[8]; !ok || len(ts) != 8 || binary.BigEndian.Uint32(ts[4:]) != 0 {
		t.Fatalf("timestamps option %v", opts)
	}
	if ws, ok := opts[3]; !ok || ws[0] != WScale {
		t.Fatalf("window scale option %v", opts)
	}
	return p
}

// parseOptions returns the TCP options by kind (NOP and EOL left out).
func parseOptions(t *testing.T, o []byte) map[byte][]byte {
	t.Helper()
	m := map[byte][]byte{}
	for i := 0; i < len(o); {
		switch o[i] {
		case 0:
			return m
		case 1:
			i++
			continue
		}
		if i+1 >= len(o) || o[i+1] < 2 || i+int(o[i+1]) > len(o) {
			t.Fatalf("bad options % x", o)
		}
		m[o[i]] = o[i+2 : i+int(o[i+1])]
		i += int(o[i+1])
	}
	return m
}

func TestBuilderFrames(t *testing.T) {
	for _, tc := range []struct {
		src string
		dst string
	}{
		{"198.18.41.0/24", "198.18.40.2:8443"},
		{"198.19.0.0/16", "203.0.113.10:443"},
		{"198.18.41.7/32", "198.18.40.2:1"},
		{"2001:db8:41::/64", "[2001:db8:40::2]:8443"},
		{"2001:db8:41::/120", "[2001:db8:40::2]:443"},
	} {
		src, dst := netip.MustParsePrefix(tc.src), netip.MustParseAddrPort(tc.dst)
		b, err := NewBuilder(Config{Sources: src, Dst: dst, SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, DstMAC: [6]byte{2, 0, 0, 0, 0, 2}, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		want := FrameLen4
		if dst.Addr().Is6() {
			want = FrameLen6
		}
		srcs := map[netip.Addr]bool{}
		ports := map[uint16]bool{}
		buf := make([]byte, 128)
		for range 2000 {
			n := b.Next(buf)
			if n != want || n != b.FrameLen() {
				t.Fatalf("%s: frame length %d, want %d", tc.src, n, want)
			}
			p := checkSYN(t, buf[:n], src, dst)
			srcs[p.Src] = true
			ports[p.SrcPort] = true
		}
		if wantSrcs := min(1<<(src.Addr().BitLen()-src.Bits()), 1000); len(srcs) < wantSrcs || len(ports) < 1900 {
			t.Errorf("%s: %d sources, %d ports in 2000 frames", tc.src, len(srcs), len(ports))
		}
		// The same seed gives the same frames.
		b1, _ := NewBuilder(Config{Sources: src, Dst: dst, Seed: 9})
		b2, _ := NewBuilder(Config{Sources: src, Dst: dst, Seed: 9})
		f1, f2 := make([]byte, 128), make([]byte, 128)
		b1.Next(f1)
		b2.Next(f2)
		if !bytes.Equal(f1, f2) {
			t.Errorf("%s: one seed, two frames", tc.src)
		}
	}
}

func TestConfigRefused(t *testing.T) {
	good := Config{Iface: "x", DstMAC: [6]byte{2}, Sources: netip.MustParsePrefix("198.18.41.0/24"),
		Dst: netip.MustParseAddrPort("198.18.40.2:80"), Count: 10}
	if err := good.check(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"public sources":     func(c *Config) { c.Sources = netip.MustParsePrefix("8.8.8.0/24") },
		"sources wider":      func(c *Config) { c.Sources = netip.MustParsePrefix("198.16.0.0/12") },
		"private sources":    func(c *Config) { c.Sources = netip.MustParsePrefix("10.0.0.0/8") },
		"public destination": func(c *Config) { c.Dst = netip.MustParseAddrPort("1.1.1.1:80") },
		"no port":            func(c *Config) { c.Dst = netip.MustParseAddrPort("198.18.40.2:0") },
		"mixed families":     func(c *Config) { c.Sources = netip.MustParsePrefix("2001:db8::/64") },
		"IPv6 outside db8": func(c *Config) {
			c.Sources, c.Dst = netip.MustParsePrefix("2001:db9::/64"), netip.MustParseAddrPort("[2001:db8::1]:80")
		},
		"no count":              func(c *Config) { c.Count = 0 },
		"count over the bound":  func(c *Config) { c.Count = MaxCount + 1 },
		"duration over a bound": func(c *Config) { c.Duration = MaxDuration + 1 },
		"negative rate":         func(c *Config) { c.Rate = -1 },
		"no interface":          func(c *Config) { c.Iface = "" },
		"no destination MAC":    func(c *Config) { c.DstMAC = [6]byte{} },
		"no sources":            func(c *Config) { c.Sources = netip.Prefix{} },
	} {
		c := good
		mod(&c)
		if err := c.check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%s: Run accepted it", name)
		}
	}
}

// sniffer reads every frame arriving on an interface from an AF_PACKET socket.
type sniffer struct {
	fd int
}

func newSniffer(t *testing.T, ns *netns.NS, dev string) *sniffer {
	s := &sniffer{fd: -1}
	ns.MustDo(func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		s.fd = fd
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			return err
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

// collect reads frames until keep has taken want of them or the deadline passes, and
// returns the frames kept and the socket's drops.
func (s *sniffer) collect(t *testing.T, want int, d time.Duration, keep func([]byte) bool) ([][]byte, uint32) {
	t.Helper()
	var got [][]byte
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(d); len(got) < want && time.Now().Before(deadline); {
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil {
			continue // timeout: look at the deadline
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if keep(buf[:n]) {
			got = append(got, append([]byte(nil), buf[:n]...))
		}
	}
	st, err := unix.GetsockoptTpacketStats(s.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		t.Fatal(err)
	}
	return got, st.Drops
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func isTCP(frame []byte, flags uint8) bool {
	var p packet.Packet
	return packet.Parse(frame, &p) == nil && p.Proto == packet.ProtoTCP && p.TCPFlags == flags
}

// linkTxDropped reads a veth end's tx_dropped: the frames veth could not hand to its
// peer (the receiving CPU's backlog was full).
func linkTxDropped(t *testing.T, ns *netns.NS, dev string) uint64 {
	out := ns.MustRun("cat", "/sys/class/net/"+dev+"/statistics/tx_dropped")
	var n uint64
	for _, c := range strings.TrimSpace(out) {
		n = n*10 + uint64(c-'0')
	}
	return n
}

// TestFloodOverVeth floods a listening socket in another namespace over veth, IPv4 and
// IPv6: every SYN the veth delivered arrives as sent (byte for byte, from the same
// seed), and the receiver's kernel, answering every SYN with a cookie
// (tcp_syncookies=2), sends SYN-ACKs acknowledging them, with the timestamps option
// that carries the cookie's options.
func TestFloodOverVeth(t *testing.T) {
	snd := netns.New(t, "sfs")
	rcv := netns.New(t, "sfr")
	netns.Veth(t, snd, "sf0", rcv, "sf1")
	rcv.Sysctl("net.ipv4.tcp_syncookies", "2")
	sndMAC, rcvMAC := mac(t, snd, "sf0"), mac(t, rcv, "sf1")
	for _, tc := range []struct {
		name              string
		rcvAddr, gw       string
		sources           string
		dst               string
		listen            string
		neighbourFamilyV6 bool
	}{
		{"IPv4", "198.18.40.2/24", "198.18.40.1", "198.18.41.0/24", "198.18.40.2:8443", "198.18.40.2:8443", false},
		{"IPv6", "2001:db8:40::2/64", "2001:db8:40::1", "2001:db8:41::/64", "[2001:db8:40::2]:8443", "[2001:db8:40::2]:8443", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv.Addr("sf1", tc.rcvAddr)
			rcv.MustRun("ip", "neigh", "replace", tc.gw, "lladdr", sndMAC.String(), "dev", "sf1", "nud", "permanent")
			rcv.Route("add", tc.sources, "via", tc.gw, "dev", "sf1")
			var ln net.Listener
			rcv.MustDo(func() error {
				var err error
				ln, err = net.Listen("tcp", tc.listen)
				return err
			})
			defer ln.Close()
			synRx := newSniffer(t, rcv, "sf1")
			ackRx := newSniffer(t, snd, "sf0")

			const count = 1000
			cfg := Config{Iface: "sf0", Netns: snd.Path(), DstMAC: [6]byte(rcvMAC),
				Sources: netip.MustParsePrefix(tc.sources), Dst: netip.MustParseAddrPort(tc.dst),
				Count: count, Rate: 20_000, Duration: 10 * time.Second, Batch: 16, Seed: 42}
			drop0, rdrop0 := linkTxDropped(t, snd, "sf0"), linkTxDropped(t, rcv, "sf1")
			start := time.Now()
			st, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			// 1000 frames at 20,000 per second: not before 45 ms.
			if st.Sent+st.Refused != count || st.Sent == 0 || time.Since(start) < 45*time.Millisecond || st.Calls == 0 {
				t.Fatalf("stats %+v after %v", st, time.Since(start))
			}
			vethDrops := linkTxDropped(t, snd, "sf0") - drop0
			want := int(st.Sent - vethDrops)

			// Every frame the receiver got is one the builder makes from the seed.
			b, err := NewBuilder(Config{Sources: cfg.Sources, Dst: cfg.Dst, SrcMAC: [6]byte(sndMAC), DstMAC: cfg.DstMAC, Seed: 42})
			if err != nil {
				t.Fatal(err)
			}
			sent := map[string]bool{}
			for range count {
				f := make([]byte, b.FrameLen())
				b.Next(f)
				sent[string(f)] = true
			}
			syns, drops := synRx.collect(t, want, 10*time.Second, func(f []byte) bool { return isTCP(f, packet.TCPSyn) })
			if len(syns)+int(drops) < want || len(syns) == 0 {
				t.Fatalf("the receiver saw %d SYNs (its socket dropped %d), want %d (%d sent, %d dropped by veth)",
					len(syns), drops, want, st.Sent, vethDrops)
			}
			seqs := map[netip.AddrPort]uint32{}
			for _, f := range syns {
				p := checkSYN(t, f, cfg.Sources, cfg.Dst)
				if !sent[string(f)] {
					t.Fatalf("received a frame that was not sent: % x", f)
				}
				seqs[netip.AddrPortFrom(p.Src, p.SrcPort)] = binary.BigEndian.Uint32(f[p.L4+4:])
			}

			// The kernel answers each with a cookie SYN-ACK; wait for them all (bar
			// what a socket dropped) and check they acknowledge the SYNs.
			acks, drops := ackRx.collect(t, len(syns), 10*time.Second, func(f []byte) bool { return isTCP(f, packet.TCPSyn|packet.TCPAck) })
			if rdrops := linkTxDropped(t, rcv, "sf1") - rdrop0; len(acks) == 0 || len(acks)+int(drops)+int(rdrops) < len(seqs) {
				t.Fatalf("%d SYN-ACKs (socket dropped %d, veth %d) for %d SYNs", len(acks), drops, rdrops, len(seqs))
			}
			for _, f := range acks {
				// Its TCP checksum is left to the (veth) device to fill in, so it is
				// not checked here; the kernel checked the SYN's, which it received
				// from a packet socket without offload.
				var p packet.Packet
				if err := packet.Parse(f, &p); err != nil {
					t.Fatalf("SYN-ACK % x: %v", f, err)
				}
				seq, ok := seqs[netip.AddrPortFrom(p.Dst, p.DstPort)]
				if !ok || binary.BigEndian.Uint32(f[p.L4+8:]) != seq+1 {
					t.Fatalf("SYN-ACK to %v:%d acknowledges %d, the SYN's sequence was %d (known %v)", p.Dst, p.DstPort,
						binary.BigEndian.Uint32(f[p.L4+8:]), seq, ok)
				}
				if _, ok := parseOptions(t, f[p.L4+20:p.End])[8]; !ok {
					t.Fatalf("SYN-ACK without timestamps: % x", f[p.L4:p.End])
				}
			}
			t.Logf("%d SYNs sent in %d calls over %v, %d received, %d SYN-ACKs", st.Sent, st.Calls, st.Elapsed, len(syns), len(acks))
		})
	}
}

func mac(t *testing.T, ns *netns.NS, dev string) net.HardwareAddr {
	var hw net.HardwareAddr
	ns.MustDo(func() error {
		ifi, err := net.InterfaceByName(dev)
		if err == nil {
			hw = ifi.HardwareAddr
		}
		return err
	})
	return hw
}
