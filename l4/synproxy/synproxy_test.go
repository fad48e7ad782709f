package synproxy

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/wire"
)

var (
	client4 = netip.MustParseAddr("198.51.100.7")
	vip4    = netip.MustParseAddr("203.0.113.10")
	client6 = netip.MustParseAddr("2001:db8:1::7")
	vip6    = netip.MustParseAddr("2001:db8:ffff::10")
	ldMAC   = packet.MAC{0x02, 0, 0, 0, 0xe0, 0x01}
	gwMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0xe0, 0xfe}
)

func tuple(src, dst netip.Addr, sport, dport uint16) Tuple {
	return Tuple{Src: src.As16(), Dst: dst.As16(), SrcPort: sport, DstPort: dport}
}

func TestCookieRoundTrip(t *testing.T) {
	k := NewKeys([]byte("cluster secret"), time.Hour)
	now := int64(1_800_000_000)
	k.Update(now)
	count := Minute(now)
	for i, tu := range []Tuple{tuple(client4, vip4, 40000, 443), tuple(client6, vip6, 1, 65535)} {
		for idx := range MSSTable {
			isn := uint32(0xfffffff0 + i*7 + idx)
			c := k.Cookie(&tu, isn, count, idx)
			for age := range uint32(MaxAge) {
				mss, ok := k.Check(&tu, isn+1, c+1, count+age)
				if !ok || mss != MSSTable[idx] {
					t.Fatalf("tuple %d, index %d, age %d: Check = %d, %v; want %d", i, idx, age, mss, ok, MSSTable[idx])
				}
			}
			if _, ok := k.Check(&tu, isn+1, c+1, count+MaxAge); ok {
				t.Fatalf("a cookie %d minutes old checked", MaxAge)
			}
			if _, ok := k.Check(&tu, isn+1, c+1, count-1); ok {
				t.Fatal("a cookie from the next minute checked")
			}
			if _, ok := k.Check(&tu, isn+1+0x10000, c+1, count); ok {
				t.Fatal("a cookie checked with another ISN")
			}
			other := tu
			other.SrcPort++
			if _, ok := k.Check(&other, isn+1, c+1, count); ok {
				t.Fatal("a cookie checked for another port")
			}
			if _, ok := k.Check(&tu, isn+1, c+1+0x1000, count); ok {
				t.Fatal("a wrong cookie checked")
			}
		}
	}
}

func TestCookieKeysRotate(t *testing.T) {
	rot := 10 * time.Minute
	a := NewKeys([]byte("s"), rot)
	b := NewKeys([]byte("s"), rot)
	other := NewKeys([]byte("t"), rot)
	tu := tuple(client4, vip4, 40000, 443)
	now := int64(1_800_000_000)
	a.Update(now)
	c := a.Cookie(&tu, 99, Minute(now), 3)
	// Another LD with the same secret checks it, one that was started later too.
	b.Update(now + 30)
	if _, ok := b.Check(&tu, 100, c+1, Minute(now+30)); !ok {
		t.Fatal("an LD with the same secret refused the cookie")
	}
	other.Update(now)
	if _, ok := other.Check(&tu, 100, c+1, Minute(now)); ok {
		t.Fatal("an LD with another secret accepted the cookie")
	}
	// After a rotation the previous key still checks; after two it does not.
	next := (now/600 + 1) * 600
	a.Update(next)
	if _, ok := a.Check(&tu, 100, c+1, Minute(next)); !ok && Minute(next)-Minute(now) < MaxAge {
		t.Fatal("a cookie of the previous epoch was refused")
	}
	a.Update(next + 600)
	if _, ok := a.Check(&tu, 100, c+1, Minute(now)); ok {
		t.Fatal("a cookie two epochs old checked")
	}
	// Random secrets differ.
	r1, r2 := NewKeys(nil, rot), NewKeys(nil, rot)
	r1.Update(now)
	r2.Update(now)
	if _, ok := r2.Check(&tu, 100, r1.Cookie(&tu, 99, Minute(now), 3)+1, Minute(now)); ok {
		t.Fatal("two random secrets accepted each other's cookie")
	}
}

func TestMSSIndex(t *testing.T) {
	for _, tc := range []struct{ mss, want uint16 }{{0, 536}, {536, 536}, {1219, 536}, {1220, 1220}, {1460, 1460}, {1500, 1460}, {9000, 8960}} {
		if got := MSSTable[MSSIndex(tc.mss)]; got != tc.want {
			t.Errorf("MSS %d encodes as %d, want %d", tc.mss, got, tc.want)
		}
	}
}

func TestCookieTimestamp(t *testing.T) {
	for _, n := range []Negotiated{
		{}, {WScale: 7, HasWScale: true}, {WScale: 0, HasWScale: true, SACK: true}, {WScale: 14, HasWScale: true, SACK: true, ECN: true}, {SACK: true},
	} {
		for _, now := range []uint32{0, 63, 64, 1_000_000, 0xffffffff} {
			ts := CookieTSval(now, n)
			if int32(now-ts) < 0 || now-ts > 63 {
				t.Fatalf("TSval %d at %d: ahead or too far behind", ts, now)
			}
			got, ok := DecodeTSecr(now+1000, ts)
			if !ok || got != n {
				t.Fatalf("decoded %+v, %v; want %+v", got, ok, n)
			}
		}
	}
	if _, ok := DecodeTSecr(1000, 5000); ok {
		t.Error("a TSecr from the future decoded")
	}
	if _, ok := DecodeTSecr(10_000_000, 10); ok {
		t.Error("a TSecr older than a cookie lives decoded")
	}
}

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []byte
		want Options
		err  error
	}{
		{"none", nil, Options{}, nil},
		{"linux syn", []byte{2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7},
			Options{MSS: 1460, HasMSS: true, SACKPerm: true, TSOff: 28, TSval: 1, WScale: 7, HasWScale: true}, nil},
		{"sack", []byte{1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2}, Options{SACKOff: 24, SACKBlocks: 1}, nil},
		{"end", []byte{0, 2, 4, 5, 0xb4}, Options{}, nil},
		{"wscale capped", []byte{3, 3, 20, 0}, Options{WScale: 14, HasWScale: true}, nil},
		{"short", []byte{2, 4, 5, 0}, Options{}, nil}, // padded to 4 below: fits
		{"bad len", []byte{2, 1, 0, 0}, Options{}, ErrOptions},
		{"past end", []byte{8, 10, 0, 0}, Options{}, ErrOptions},
		{"mss len", []byte{2, 3, 0, 0}, Options{}, ErrOptions},
		{"sack len", []byte{5, 6, 0, 0, 0, 0, 0, 0}, Options{}, ErrOptions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := make([]byte, 20, 60)
			h = append(h, tc.opts...)
			for len(h)%4 != 0 {
				h = append(h, 0)
			}
			h[12] = byte(len(h)/4) << 4
			var o Options
			err := ParseOptions(h, &o)
			if err != tc.err {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if err == nil && tc.name != "short" && o != tc.want {
				t.Fatalf("parsed %+v, want %+v", o, tc.want)
			}
		})
	}
	var o Options
	if ParseOptions(make([]byte, 19), &o) != ErrHeader {
		t.Error("19 bytes parsed")
	}
}

// synFrame is a client's SYN as it reaches the LD, with Linux's options (or only MSS).
func synFrame(t testing.TB, src, dst netip.Addr, ts bool) []byte {
	t.Helper()
	opts := []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}}}
	if ts {
		opts = append(opts,
			layers.TCPOption{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2},
			layers.TCPOption{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: []byte{0, 0, 0x12, 0x34, 0, 0, 0, 0}},
			layers.TCPOption{OptionType: layers.TCPOptionKindNop},
			layers.TCPOption{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}})
	}
	return tcpFrame(t, src, dst, &layers.TCP{SrcPort: 40000, DstPort: 443, Seq: 0xfffffffe, SYN: true, Window: 64240, Options: opts}, nil)
}

func tcpFrame(t testing.TB, src, dst netip.Addr, tcp *layers.TCP, payload []byte) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: gwMAC, DstMAC: net.HardwareAddr(ldMAC[:]), EthernetType: layers.EthernetTypeIPv4}
	var nl gopacket.SerializableLayer
	if src.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		nl = ip
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 60, NextHeader: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		nl = ip
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, nl, tcp, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// checkFrame parses f and verifies its checksums.
func checkFrame(t *testing.T, f []byte) (packet.Packet, *layers.TCP) {
	t.Helper()
	var p packet.Packet
	if err := packet.Parse(f, &p); err != nil {
		t.Fatalf("parsing the frame written: %v", err)
	}
	if !packet.VerifyL4Checksum(f, &p) {
		t.Fatal("bad TCP checksum")
	}
	pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
	tcp, _ := pk.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if tcp == nil {
		t.Fatalf("no TCP layer: %v", pk)
	}
	return p, tcp
}

func TestWriteSynAck(t *testing.T) {
	for _, fam := range []struct{ c, v netip.Addr }{{client4, vip4}, {client6, vip6}} {
		for _, ts := range []bool{true, false} {
			f := synFrame(t, fam.c, fam.v, ts)
			buf := make([]byte, 256)
			copy(buf, f)
			var p packet.Packet
			if err := packet.Parse(f, &p); err != nil {
				t.Fatal(err)
			}
			var o Options
			if err := ParseOptions(f[p.L4:p.End], &o); err != nil {
				t.Fatal(err)
			}
			n, err := WriteSynAck(buf, &p, &o, &SynAck{Cookie: 0xabcdef01, MSS: 1436, Window: 65535, WScale: 9, TSval: 0x1000, SrcMAC: ldMAC, IPID: 7})
			if err != nil {
				t.Fatal(err)
			}
			q, tcp := checkFrame(t, buf[:n])
			if q.Src != fam.v || q.Dst != fam.c || q.TTL != 64 {
				t.Errorf("SYN-ACK %s → %s ttl %d", q.Src, q.Dst, q.TTL)
			}
			if net.HardwareAddr(buf[0:6]).String() != gwMAC.String() || packet.MAC(buf[6:12]) != ldMAC {
				t.Errorf("Ethernet %x → %x", buf[6:12], buf[0:6])
			}
			if !tcp.SYN || !tcp.ACK || tcp.Seq != 0xabcdef01 || tcp.Ack != 0xffffffff || tcp.SrcPort != 443 || tcp.DstPort != 40000 || tcp.Window != 65535 {
				t.Errorf("SYN-ACK %+v", tcp)
			}
			var ro Options
			if err := ParseOptions(buf[q.L4:q.End], &ro); err != nil {
				t.Fatal(err)
			}
			want := Options{MSS: 1436, HasMSS: true}
			if ts {
				want = Options{MSS: 1436, HasMSS: true, SACKPerm: true, TSOff: 28, TSval: 0x1000, TSecr: 0x1234, WScale: 9, HasWScale: true}
			}
			if ro != want {
				t.Errorf("options %+v, want %+v", ro, want)
			}
		}
	}
}

func TestWriteSynAndAck(t *testing.T) {
	for _, fam := range []struct{ c, v netip.Addr }{{client4, vip4}, {client6, vip6}} {
		// The client's ACK (with a byte of data, which the SYN drops).
		ack := tcpFrame(t, fam.c, fam.v, &layers.TCP{SrcPort: 40000, DstPort: 443, Seq: 1001, Ack: 77, ACK: true, Window: 502,
			Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindNop},
				{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: []byte{0, 0, 0, 9, 0, 0, 0, 8}}}}, []byte{1})
		buf := make([]byte, 256)
		copy(buf, ack)
		var p packet.Packet
		if err := packet.Parse(ack, &p); err != nil {
			t.Fatal(err)
		}
		end, err := WriteSyn(buf, &p, &Syn{ISN: 1000, Window: 64240, MSS: 1400,
			Negotiated: Negotiated{WScale: 7, HasWScale: true, SACK: true}, HasTS: true, TSval: 9})
		if err != nil {
			t.Fatal(err)
		}
		q, tcp := checkFrame(t, buf[:end])
		if q.Src != fam.c || q.Dst != fam.v || !tcp.SYN || tcp.ACK || tcp.Seq != 1000 || len(tcp.Payload) != 0 || tcp.Window != 64240 {
			t.Errorf("SYN %s → %s %+v", q.Src, q.Dst, tcp)
		}
		var o Options
		_ = ParseOptions(buf[q.L4:q.End], &o)
		if want := (Options{MSS: 1400, HasMSS: true, SACKPerm: true, TSOff: o.TSOff, TSval: 9, WScale: 7, HasWScale: true}); o != want || o.TSOff == 0 {
			t.Errorf("SYN options %+v, want %+v", o, want)
		}

		// The member's SYN-ACK, as the tunnel delivers it (an IP packet), becomes the
		// ACK to the member.
		sa := tcpFrame(t, fam.v, fam.c, &layers.TCP{SrcPort: 443, DstPort: 40000, Seq: 5000, Ack: 1001, SYN: true, ACK: true, Window: 65160,
			Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{5, 0xb4}},
				{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2},
				{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: []byte{0, 0, 0, 50, 0, 0, 0, 9}},
				{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}}}}, nil)
		ipb := append([]byte(nil), sa[14:]...)
		var ip packet.Packet
		if err := packet.ParseIP(ipb, 0, &ip); err != nil {
			t.Fatal(err)
		}
		end, err = WriteAck(ipb, &ip, &Ack{Seq: 1001, Ack: 5001, Window: 502, HasTS: true, TSval: 9, TSecr: 50, IPID: 3})
		if err != nil {
			t.Fatal(err)
		}
		f := append(append([]byte(nil), sa[:14]...), ipb[:end]...)
		q, tcp = checkFrame(t, f)
		if q.Src != fam.c || q.Dst != fam.v || tcp.SYN || !tcp.ACK || tcp.Seq != 1001 || tcp.Ack != 5001 || tcp.Window != 502 ||
			tcp.SrcPort != 40000 || tcp.DstPort != 443 {
			t.Errorf("ACK %s → %s %+v", q.Src, q.Dst, tcp)
		}
		_ = ParseOptions(f[q.L4:q.End], &o)
		if !o.HasTS() || o.TSval != 9 || o.TSecr != 50 {
			t.Errorf("ACK options %+v", o)
		}
	}
}

// segment builds a TCP segment (header, options, payload) with a correct checksum for
// client4 → vip4.
func segment(t testing.TB, seq, ack uint32, win uint16, opts []byte, payload []byte) []byte {
	t.Helper()
	s := make([]byte, 20)
	binary.BigEndian.PutUint16(s[0:], 443)
	binary.BigEndian.PutUint16(s[2:], 40000)
	binary.BigEndian.PutUint32(s[4:], seq)
	binary.BigEndian.PutUint32(s[8:], ack)
	s = append(s, opts...)
	for len(s)%4 != 0 {
		s = append(s, 1)
	}
	s[12] = byte(len(s)/4) << 4
	s[13] = packet.TCPAck
	binary.BigEndian.PutUint16(s[14:], win)
	s = append(s, payload...)
	fixSum(s)
	return s
}

func fixSum(s []byte) {
	s[16], s[17] = 0, 0
	binary.BigEndian.PutUint16(s[16:], wire.Checksum(s, packet.PseudoHeaderSum(client4, vip4, packet.ProtoTCP, len(s))))
}

func sumOK(s []byte) bool {
	return wire.Checksum(s, packet.PseudoHeaderSum(client4, vip4, packet.ProtoTCP, len(s))) == 0
}

func TestTranslate(t *testing.T) {
	d := Delta{SeqDelta: 0x80000005, TSDelta: 1000, WShift: -2}
	// The timestamp option at an odd offset (one NOP before it), a SACK block at an
	// even one, and an odd payload length.
	opts := []byte{1, 8, 10, 0, 0, 0, 100, 0, 0, 0, 200, 1, 5, 10, 0, 0, 0, 10, 0, 0, 0, 20}
	s := segment(t, 5000, 7000, 4000, opts, []byte{1, 2, 3})
	m := append([]byte(nil), s...)
	if err := d.ToClient(m); err != nil {
		t.Fatal(err)
	}
	if !sumOK(m) {
		t.Fatal("ToClient left a bad checksum")
	}
	var o Options
	_ = ParseOptions(m, &o)
	if got := binary.BigEndian.Uint32(m[4:]); got != uint32(5000)-d.SeqDelta || o.TSval != 1100 || o.TSecr != 200 ||
		binary.BigEndian.Uint16(m[14:]) != 1000 || binary.BigEndian.Uint32(m[8:]) != 7000 {
		t.Fatalf("ToClient: seq %d, ts %+v, win %d", got, o, binary.BigEndian.Uint16(m[14:]))
	}
	c := append([]byte(nil), s...)
	if err := d.ToMember(c); err != nil {
		t.Fatal(err)
	}
	if !sumOK(c) {
		t.Fatal("ToMember left a bad checksum")
	}
	_ = ParseOptions(c, &o)
	left := binary.BigEndian.Uint32(c[o.SACKOff:])
	right := binary.BigEndian.Uint32(c[o.SACKOff+4:])
	if got := binary.BigEndian.Uint32(c[8:]); got != 7000+0x80000005 || o.TSecr != uint32(200)-d.TSDelta || o.TSval != 100 ||
		left != 10+0x80000005 || right != 20+0x80000005 || binary.BigEndian.Uint32(c[4:]) != 5000 {
		t.Fatalf("ToMember: ack %d, ts %+v, sack %d-%d", got, o, left, right)
	}
}

func TestScaleWindow(t *testing.T) {
	for _, tc := range []struct {
		w     uint16
		shift int8
		want  uint16
	}{{100, 0, 100}, {100, 2, 400}, {0x4000, 2, 0xffff}, {0x4000, 20, 0xffff}, {400, -2, 100}, {3, -2, 0}, {5, -16, 0}} {
		if got := ScaleWindow(tc.w, tc.shift); got != tc.want {
			t.Errorf("ScaleWindow(%d, %d) = %d, want %d", tc.w, tc.shift, got, tc.want)
		}
	}
}

func TestAddSeq32(t *testing.T) {
	for _, off := range []int{8, 9, 31} {
		m := make([]byte, 40)
		for i := range m {
			m[i] = byte(i * 37)
		}
		m[2], m[3] = 0, 0
		binary.BigEndian.PutUint16(m[2:], wire.Checksum(m, 0))
		old := binary.BigEndian.Uint32(m[off:])
		AddSeq32(m, off, 2, 0x9000_0001)
		if wire.Checksum(m, 0) != 0 || binary.BigEndian.Uint32(m[off:]) != old+0x9000_0001 {
			t.Fatalf("offset %d: value %#x, checksum %#x", off, binary.BigEndian.Uint32(m[off:]), wire.Checksum(m, 0))
		}
	}
	AddSeq32(make([]byte, 5), 2, 2, 1) // overlapping, short: nothing
}
