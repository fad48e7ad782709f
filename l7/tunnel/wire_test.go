package tunnel

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/wire"
)

var (
	ld     = netip.MustParseAddr("198.18.1.1")
	ld2    = netip.MustParseAddr("198.18.1.2")
	local  = netip.MustParseAddr("198.18.1.11")
	client = netip.MustParseAddrPort("198.18.0.50:40000")
	vip    = netip.MustParseAddrPort("203.0.113.10:8443")
	ld6    = netip.MustParseAddr("2001:db8:1::1")
	cl6    = netip.MustParseAddrPort("[2001:db8:99::50]:40000")
	vip6   = netip.MustParseAddrPort("[2001:db8:ff::10]:443")
)

// TestTiersAgree runs tunnel packets through both ends of the tunnel, l4d's
// (packet.Parse and packet.Decap on the frame, as a member's reply reaches an LD) and
// l7d's (outer4 and decapsulate, or decapsulate alone for IPv6, as the raw sockets
// read them), over an IPv4 and an IPv6 outer header. Both must give the answer of
// wire's rules: the same inner packet, or a refusal of the same kind. Before the rules
// were shared, the reserved-bit and bad-checksum cases passed l4d and not l7d, the
// route and recursion cases were refused for different reasons, and a cut inner header
// was refused by l4d alone.
func TestTiersAgree(t *testing.T) {
	syn := tcpPacket(client, vip, 1, 0, tcpSYN, nil)
	syn6 := tcpPacket(cl6, vip6, 1, 0, tcpSYN, nil)
	badSum := greWrap(syn, true, true)
	badSum[len(badSum)-1] ^= 1
	gre := func(hdr []byte, inner []byte) []byte { return append(bytes.Clone(hdr), inner...) }
	allFields := []byte{0xb0, 0, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 1}
	allFields = gre(allFields, syn)
	binary.BigEndian.PutUint16(allFields[4:], wire.Checksum(allFields, 0))
	ld6 := netip.MustParseAddr("2001:db8:1::11")
	cases := []struct {
		name    string
		proto   uint8
		payload []byte
		err     error // wire's kind of refusal; nil: accepted
		mode    mode
		inner   []byte
	}{
		{"gre v4", protoGRE, greWrap(syn, false, false), nil, modeGRE, syn},
		{"gre v6", protoGRE, greWrap(syn6, false, false), nil, modeGRE, syn6},
		{"gre key", protoGRE, greWrap(syn, true, false), nil, modeGRE, syn},
		{"gre key checksum", protoGRE, greWrap(syn6, true, true), nil, modeGRE, syn6},
		{"gre checksum key seq", protoGRE, allFields, nil, modeGRE, syn},
		{"gre seq", protoGRE, gre([]byte{0x10, 0, 0x08, 0, 0, 0, 0, 1}, syn), nil, modeGRE, syn},
		{"gre bad checksum", protoGRE, badSum, wire.ErrChecksum, 0, nil},
		{"gre reserved bits", protoGRE, gre([]byte{0, 0xf8, 0x08, 0}, syn), wire.ErrUnsupported, 0, nil},
		{"gre reserved bit 0x08", protoGRE, gre([]byte{0, 0x08, 0x08, 0}, syn), wire.ErrUnsupported, 0, nil},
		{"gre strict route", protoGRE, gre([]byte{0x08, 0, 0x08, 0}, syn), wire.ErrUnsupported, 0, nil},
		{"gre recursion", protoGRE, gre([]byte{0x01, 0, 0x08, 0}, syn), wire.ErrUnsupported, 0, nil},
		{"gre routing", protoGRE, gre([]byte{0x40, 0, 0x08, 0, 0, 0, 0, 0}, syn), wire.ErrUnsupported, 0, nil},
		{"gre version 1", protoGRE, gre([]byte{0x30, 1, 0x88, 0x0b, 0, 0, 0, 0, 0, 0, 0, 0}, syn), wire.ErrUnsupported, 0, nil},
		{"gre ethernet", protoGRE, gre([]byte{0, 0, 0x65, 0x58}, syn), wire.ErrUnsupported, 0, nil},
		{"gre v4 type carries v6", protoGRE, gre([]byte{0, 0, 0x08, 0}, syn6), wire.ErrMalformed, 0, nil},
		{"gre v6 type carries v4", protoGRE, gre([]byte{0, 0, 0x86, 0xdd}, gre(syn, make([]byte, 20))), wire.ErrMalformed, 0, nil},
		{"gre header cut", protoGRE, []byte{0, 0, 8}, wire.ErrTruncated, 0, nil},
		{"gre key cut", protoGRE, []byte{0x20, 0, 8, 0, 1, 2}, wire.ErrTruncated, 0, nil},
		{"gre empty inner", protoGRE, []byte{0, 0, 8, 0}, wire.ErrTruncated, 0, nil},
		{"gre inner header cut", protoGRE, gre([]byte{0, 0, 8, 0}, syn[:12]), wire.ErrTruncated, 0, nil},
		{"gre inner v6 header cut", protoGRE, gre([]byte{0, 0, 0x86, 0xdd}, syn6[:30]), wire.ErrTruncated, 0, nil},
		{"ipip", protoIPIP, syn, nil, modeIPIP, syn},
		{"ipip v6", protoIPv6, syn6, nil, modeIPIP, syn6},
		{"ipip carries v6", protoIPIP, syn6, wire.ErrMalformed, 0, nil},
		{"ipv6-in-ip carries v4", protoIPv6, gre(syn, make([]byte, 20)), wire.ErrMalformed, 0, nil},
		{"ipip header cut", protoIPIP, syn[:19], wire.ErrTruncated, 0, nil},
		{"ipip empty", protoIPIP, nil, wire.ErrTruncated, 0, nil},
		{"udp", protoUDP, udpPacket(client, vip, nil)[20:], wire.ErrUnsupported, 0, nil},
	}
	// l4Kind is the wire error of the same kind as an error of packet.Decap.
	l4Kind := map[error]error{
		nil: nil, packet.ErrTruncated: wire.ErrTruncated, packet.ErrMalformed: wire.ErrMalformed,
		packet.ErrUnsupported: wire.ErrUnsupported, packet.ErrChecksum: wire.ErrChecksum,
	}
	for _, tc := range cases {
		for _, outerSrc := range []netip.Addr{ld, ld6} {
			name := fmt.Sprintf("%s over IPv%d", tc.name, map[bool]int{true: 4, false: 6}[outerSrc.Is4()])
			dst, et := local, []byte{0x08, 0}
			if outerSrc.Is6() {
				dst, et = netip.MustParseAddr("2001:db8:1::2"), []byte{0x86, 0xdd}
			}
			outer := ipPacket(outerSrc, dst, tc.proto, bytes.Clone(tc.payload), -1)

			// l7d: an IPv4 raw socket reads the outer header, an IPv6 one does not.
			var payload []byte
			if outerSrc.Is4() {
				_, _, proto, pl, err := outer4(outer)
				if err != nil || proto != tc.proto {
					t.Fatalf("%s: outer4: %v, protocol %d", name, err, proto)
				}
				payload = pl
			} else {
				payload = outer[40:]
			}
			inner7, m, err7 := decapsulate(tc.proto, payload, 0)

			// l4d: the frame on the internal port.
			frame := append(append(make([]byte, 12, 14+len(outer)), et...), outer...)
			var p packet.Packet
			if err := packet.Parse(frame, &p); err != nil {
				t.Fatalf("%s: packet.Parse: %v", name, err)
			}
			off, n, err4 := packet.Decap(frame, &p)
			kind4, ok := l4Kind[err4]
			if !ok {
				t.Fatalf("%s: packet.Decap: unexpected error %v", name, err4)
			}

			switch {
			case kind4 != tc.err || err7 != tc.err:
				t.Errorf("%s: l4d says %v (%v), l7d says %v; want %v", name, kind4, err4, err7, tc.err)
			case tc.err != nil:
			case !bytes.Equal(frame[off:off+n], tc.inner) || !bytes.Equal(inner7, tc.inner) || m != tc.mode:
				t.Errorf("%s: l4d inner % x, l7d inner % x (%v); want % x (%v)", name, frame[off:off+n], inner7, m, tc.inner, tc.mode)
			}
		}
	}
}

func TestOuter4(t *testing.T) {
	pkt := outerIPv4(ld, local, protoGRE, []byte{1, 2, 3, 4})
	src, dst, proto, pl, err := outer4(append(pkt, 0, 0)) // trailing padding ignored
	if err != nil || src != ld.As4() || dst != local.As4() || proto != protoGRE || !bytes.Equal(pl, []byte{1, 2, 3, 4}) {
		t.Fatalf("outer4: %v %v %d % x %v", src, dst, proto, pl, err)
	}
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
		err  error
	}{
		{"short", func(b []byte) []byte { return b[:19] }, errTruncated},
		{"v6", func(b []byte) []byte { b[0] = 0x65; return b }, errMalformed},
		{"ihl 4", func(b []byte) []byte { b[0] = 0x44; return b }, errMalformed},
		{"total < ihl", func(b []byte) []byte { b[3] = 10; return b }, errMalformed},
		{"total > len", func(b []byte) []byte { b[3] = 200; return b }, errTruncated},
	} {
		b := tc.mod(bytes.Clone(pkt))
		if _, _, _, _, err := outer4(b); err != tc.err {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
	}
}

func TestParseFlow(t *testing.T) {
	syn := tcpPacket(client, vip, 1, 0, tcpSYN, nil)
	frag := bytes.Clone(syn)
	frag[6] = 0x20 // MF, offset 0: first fragment
	later := bytes.Clone(syn)
	binary.BigEndian.PutUint16(later[6:], 0x0010) // offset 128
	hbh := ipPacket(cl6.Addr(), vip6.Addr(), 0, append([]byte{protoUDP, 0, 1, 4, 0, 0, 0, 0},
		udpPacket(cl6, vip6, []byte("x"))[40:]...), -1)
	v6frag := ipPacket(cl6.Addr(), vip6.Addr(), 44, append([]byte{protoUDP, 0, 0, 0x08, 0, 0, 0, 7},
		[]byte("abcdefgh")...), -1) // offset 1, no ports
	loop := ipPacket(cl6.Addr(), vip6.Addr(), 60, bytes.Repeat([]byte{60, 0, 1, 4, 0, 0, 0, 0}, 10), -1)
	k4 := flowKey{sport: client.Port(), dport: vip.Port(), proto: protoTCP}
	copy(k4.src[:], client.Addr().AsSlice())
	copy(k4.dst[:], vip.Addr().AsSlice())
	k6 := flowKey{src: cl6.Addr().As16(), dst: vip6.Addr().As16(), sport: cl6.Port(), dport: vip6.Port(), proto: protoUDP, v6: true}
	for _, tc := range []struct {
		name string
		b    []byte
		key  flowKey
		frag bool
		err  error
	}{
		{"tcp syn", syn, k4, false, nil},
		{"padded", append(bytes.Clone(syn), 0, 0, 0), k4, false, nil},
		{"first fragment", frag, k4, true, nil},
		{"later fragment", later, flowKey{src: k4.src, dst: k4.dst, proto: protoTCP}, true, nil},
		{"v6 udp", udpPacket(cl6, vip6, []byte("hi")), k6, false, nil},
		{"v6 hop-by-hop", hbh, k6, false, nil},
		{"v6 later fragment", v6frag, flowKey{src: k6.src, dst: k6.dst, proto: protoUDP, v6: true}, true, nil},
		{"v6 endless options", loop, flowKey{}, false, errMalformed},
		{"tcp cut", syn[:30], flowKey{}, false, errTruncated},
		{"empty", nil, flowKey{}, false, errTruncated},
		{"version 5", []byte{0x50, 0, 0, 0}, flowKey{}, false, errMalformed},
	} {
		pi, err := parseFlow(tc.b)
		if err != tc.err {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.err)
			continue
		}
		if err == nil && (pi.key != tc.key || pi.frag != tc.frag) {
			t.Errorf("%s: key %+v frag %v; want %+v %v", tc.name, pi.key, pi.frag, tc.key, tc.frag)
		}
	}
	pi, _ := parseFlow(append(bytes.Clone(syn), 9, 9))
	if pi.size != len(syn) || pi.tcpFlags != tcpSYN {
		t.Errorf("size %d flags %#x; want %d, SYN", pi.size, pi.tcpFlags, len(syn))
	}
}

func TestICMPQuote(t *testing.T) {
	orig := udpPacket(client, vip, []byte("hello"))
	msg := icmpError(vip.Addr(), client.Addr(), orig[:28])
	pi, err := parseFlow(msg)
	if err != nil {
		t.Fatal(err)
	}
	q := icmpEmbedded(&pi)
	if q == nil {
		t.Fatal("no quote found")
	}
	k, ok := parseQuoted(q, false)
	want, _ := parseFlow(orig)
	if !ok || k != want.key {
		t.Fatalf("quoted key %+v, %v; want %+v", k, ok, want.key)
	}
	echo := ipPacket(vip.Addr(), client.Addr(), protoICMP, []byte{0, 0, 0, 0, 0, 1, 0, 1}, 2)
	pi, _ = parseFlow(echo)
	if icmpEmbedded(&pi) != nil {
		t.Fatal("echo reply taken for an error")
	}
}

// FuzzInbound fuzzes l7d's parsing of what an IPv4 raw socket reads: outer header,
// decapsulation (whose rules wire.FuzzDecode covers), inner packet, ICMP quote.
func FuzzInbound(f *testing.F) {
	syn := tcpPacket(client, vip, 1, 0, tcpSYN, nil)
	f.Add(outerIPv4(ld, local, protoGRE, greWrap(syn, true, true)))
	f.Add(outerIPv4(ld, local, protoIPIP, syn))
	f.Add(outerIPv4(ld, local, protoIPv6, tcpPacket(cl6, vip6, 1, 0, tcpSYN, nil)))
	f.Add(outerIPv4(ld, local, protoGRE, greWrap(icmpError(vip.Addr(), client.Addr(), syn[:28]), false, false)))
	f.Add([]byte{0x45, 0, 0, 20})
	f.Fuzz(func(t *testing.T, b []byte) {
		src, _, proto, pl, err := outer4(b)
		if err != nil {
			return
		}
		_ = src
		keyed, _, kerr := decapsulate(proto, pl, 0xdeadbeef)
		inner, m, err := decapsulate(proto, pl, 0)
		if kerr == nil && (err != nil || !bytes.Equal(keyed, inner) || m != modeGRE) {
			t.Fatalf("taken with a key (GRE %v) but not without: %v", m == modeGRE, err)
		}
		if err != nil {
			return
		}
		if m != modeGRE && m != modeIPIP || len(inner) == 0 || len(inner) > len(pl) {
			t.Fatalf("decapsulate: mode %v, inner %d of %d", m, len(inner), len(pl))
		}
		pi, err := parseFlow(inner)
		if err != nil {
			return
		}
		if pi.size > len(inner) || len(pi.l4) > pi.size {
			t.Fatalf("parseFlow: size %d l4 %d of %d", pi.size, len(pi.l4), len(inner))
		}
		if q := icmpEmbedded(&pi); q != nil {
			parseQuoted(q, pi.key.v6)
		}
	})
}

// FuzzFlowTable drives a small flow table with learns, replies and sweeps from the
// input, two bytes per step, and checks after each what must hold: the count is the
// entries', no shard is over its limit, the queue of young flows stays bounded, and a
// new flow never evicts an established one.
func FuzzFlowTable(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 0x40, 1, 0x80, 1, 0xc0, 0, 0, 3})
	f.Add(bytes.Repeat([]byte{0, 7, 0x41, 7, 0x12, 9}, 40))
	f.Fuzz(func(t *testing.T, b []byte) {
		ft := newFlowTable(2 * numShards)
		l := limits{idle: 100, halfOpen: 30, oneWay: 10}
		now := int64(1)
		for i := 0; i+1 < len(b); i += 2 {
			op, k := b[i], flowKey{sport: uint16(b[i+1]), proto: protoUDP}
			now += int64(op & 0x0f)
			s := ft.shard(&k)
			switch op >> 6 {
			case 0, 1: // a packet from LD 0 or 1, SYN or not
				var est []flowKey
				if _, ok := s.m[k]; !ok {
					for k2, e := range s.m {
						if e.established() && now-e.seen < e.limit(l) {
							est = append(est, k2)
						}
					}
				}
				p := peer{mode: modeGRE}
				p.addr[0] = op >> 6
				ft.learn(k, p, op&0x10 != 0, now, 20, nil)
				for _, k2 := range est {
					if _, ok := s.m[k2]; !ok {
						t.Fatalf("step %d: a new flow evicted established flow %d", i/2, k2.sport)
					}
				}
			case 2:
				ft.reply(k, op&0x10 != 0)
			case 3:
				ft.sweep(now, l)
			}
			n := 0
			for j := range ft.shards {
				s := &ft.shards[j]
				n += len(s.m)
				if len(s.m) > ft.perShard || len(s.young)-s.head > 2*ft.perShard+1 || s.head > len(s.young) {
					t.Fatalf("step %d: shard %d holds %d (limit %d), queue %d from %d", i/2, j, len(s.m), ft.perShard, len(s.young), s.head)
				}
			}
			if n != ft.len() {
				t.Fatalf("step %d: count %d, entries %d", i/2, ft.len(), n)
			}
		}
	})
}

func FuzzParseFlow(f *testing.F) {
	f.Add(tcpPacket(client, vip, 1, 0, tcpSYN, nil))
	f.Add(udpPacket(cl6, vip6, []byte("x")))
	f.Add(icmpError(vip.Addr(), client.Addr(), udpPacket(client, vip, nil)))
	f.Add(ipPacket(cl6.Addr(), vip6.Addr(), 44, []byte{protoUDP, 0, 0, 0x08, 0, 0, 0, 7}, -1))
	f.Fuzz(func(t *testing.T, b []byte) {
		pi, err := parseFlow(b)
		if err != nil {
			return
		}
		if pi.size > len(b) || pi.size < 20 {
			t.Fatalf("size %d of %d", pi.size, len(b))
		}
		if q := icmpEmbedded(&pi); q != nil {
			parseQuoted(q, pi.key.v6)
			parseQuoted(q, !pi.key.v6)
		}
	})
}

func BenchmarkInboundParse(b *testing.B) {
	pkt := outerIPv4(ld, local, protoGRE, greWrap(tcpPacket(client, vip, 1, 1, tcpACK, make([]byte, 1400)), false, false))
	b.ReportAllocs()
	for b.Loop() {
		_, _, proto, pl, _ := outer4(pkt)
		inner, _, _ := decapsulate(proto, pl, 0)
		if _, err := parseFlow(inner); err != nil {
			b.Fatal(err)
		}
	}
}
