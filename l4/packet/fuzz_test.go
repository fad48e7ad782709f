package packet

import (
	"bytes"
	"testing"

	"github.com/tiergate/tiergate/wire"
)

// fuzzSeeds returns every sample frame plus tunnel, ICMP error, ARP and ND frames.
func fuzzSeeds(t testing.TB) [][]byte {
	var out [][]byte
	for _, s := range samples(t) {
		out = append(out, s.frame)
	}
	inner := udpIP(t, client4, vip4, 1, 443, []byte{0xc3, 0, 0, 0, 1, 8, 7, 0, 1, 1, 2, 3, 4, 5, 0})
	for _, e := range []*Encap{
		{Src: ld4, Dst: member4},
		{Mode: EncapIPIP, Src: ld6, Dst: member6},
	} {
		if err := e.Prepare(); err != nil {
			t.Fatal(err)
		}
		buf := withHeadroom(inner, 64)
		start, err := e.Write(buf, 64, len(inner), 1)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, buf[start:])
	}
	out = append(out,
		AppendARP(nil, Broadcast, macA, &ARP{Op: 1, SenderIP: ld4, TargetIP: member4}),
		AppendNS(nil, macA, ld6, member6),
		AppendNA(nil, macA, macB, vip6, member6, vip6, true),
		frame(tcpIP(t, client4, vip4, 1, 2, true, nil, nil)),
		frame(echoIP(t, client6, vip6, 1, 2, nil)),
	)
	return out
}

// exercise runs every function that takes a parsed packet on b and p. None may
// panic, whatever Parse returned; when it succeeded (parsed), results are checked for
// consistency.
func exercise(t *testing.T, b []byte, p *Packet, parsed bool) {
	var in Packet
	if err := ICMPEmbedded(b, p, &in); err == nil && parsed {
		if in.L3 < p.L4 || in.End > p.End || (in.L4 >= 0 && (in.L4 < in.L3 || in.L4 > in.End)) {
			t.Fatalf("ICMPEmbedded offsets %+v inside %+v", in, *p)
		}
		FlowHash(1, &in)
	}
	if off, n, err := Decap(b, p); err == nil && parsed {
		if off < p.L4 || off+n != p.End || n < IPv4Len {
			t.Fatalf("Decap %d+%d for %+v", off, n, *p)
		}
		var q Packet
		_ = ParseIP(b[:off+n], off, &q)
	}
	var a ARP
	_ = ParseARP(b, p, &a)
	var nd ND
	if ParseND(b, p, &nd) == ErrChecksum && parsed {
		// Likewise past the ICMPv6 checksum.
		c := clone(b)
		c[p.L4+2], c[p.L4+3] = 0, 0
		sum := wire.Checksum(c[p.L4:p.End], PseudoHeaderSum(p.Src, p.Dst, ProtoICMPv6, p.End-p.L4))
		c[p.L4+2], c[p.L4+3] = byte(sum>>8), byte(sum)
		if err := ParseND(c, p, &nd); err == ErrChecksum {
			t.Fatal("ErrChecksum after fixing the ICMPv6 checksum")
		}
	}
	VerifyL4Checksum(b, p)
	if p.Proto == ProtoUDP && p.L4 >= 0 {
		QUICDestConnID(b[p.L4+UDPLen:p.End], 8)
	}
	FlowHash(1, p)
	PairHash(1, p.Src, p.Dst)

	c := clone(b)
	q := *p
	if ClampMSS(c, &q, 536) && parsed {
		if !mssOnly(c, b, p) {
			t.Fatal("ClampMSS changed bytes outside the TCP header")
		}
		// The checksum is still as (in)valid as before.
		if VerifyL4Checksum(b, p) != VerifyL4Checksum(c, &q) {
			t.Fatal("ClampMSS broke the checksum")
		}
	}
	c = clone(b)
	q = *p
	if EchoReply(c, &q) && parsed {
		var r Packet
		if err := Parse(c, &r); err != nil {
			t.Fatalf("EchoReply produced an unparsable frame: %v", err)
		}
		if VerifyL4Checksum(b, p) != VerifyL4Checksum(c, &r) {
			t.Fatal("EchoReply broke the checksum")
		}
	}
	c = clone(b)
	if DecTTL(c, p.L3) && parsed && p.EtherType == EtherTypeIPv4 {
		var r Packet
		if err := Parse(c, &r); err != nil {
			t.Fatalf("DecTTL produced an unparsable frame: %v", err)
		}
	}
}

// mssOnly reports whether c and b differ only within p's TCP header.
func mssOnly(c, b []byte, p *Packet) bool {
	doff := int(b[p.L4+12]>>4) * 4
	return bytes.Equal(c[:p.L4], b[:p.L4]) && bytes.Equal(c[p.L4+doff:], b[p.L4+doff:])
}

func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		err := Parse(b, &p)
		if err == nil {
			if p.L3 < EthernetLen || p.End > len(b) || p.L4 > p.End || (p.L4 >= 0 && p.L4 < p.L3) {
				t.Fatalf("offsets out of range: %+v len %d", p, len(b))
			}
		}
		switch err {
		case nil, ErrTruncated, ErrMalformed, ErrChecksum, ErrUnsupported:
		default:
			t.Fatalf("unexpected error %v", err)
		}
		// Functions taking a parsed packet must be safe after any Parse outcome.
		exercise(t, b, &p, err == nil)
		if err == ErrChecksum {
			// Let mutations get past the IPv4 header checksum: fix it and go on.
			b = clone(b)
			fixIPv4Checksum(b, p.L3)
			err = Parse(b, &p)
			if err == ErrChecksum {
				t.Fatal("ErrChecksum after fixing the checksum")
			}
			exercise(t, b, &p, err == nil)
		}
		if err == nil && p.L3 < len(b) {
			var q Packet
			if ParseIP(b, p.L3, &q) == nil && p.EtherType != EtherTypeARP && (q.Src != p.Src || q.L4 != p.L4) {
				t.Fatalf("ParseIP disagrees with Parse: %+v vs %+v", q, p)
			}
		}
	})
}

func FuzzDecap(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		if len(s) > EthernetLen {
			f.Add(s[EthernetLen:])
		}
	}
	// Fuzz the bytes after an outer IPv4 GRE header, then the whole path: decap,
	// rewrite Ethernet, decrement TTL, re-encapsulate.
	e := &Encap{Src: ld4, Dst: member4, SrcMAC: macA, DstMAC: macB}
	if err := e.Prepare(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ipPkt []byte) {
		var p Packet
		if err := ParseIP(ipPkt, 0, &p); err != nil {
			return
		}
		b := frame(ipPkt)
		if err := Parse(b, &p); err != nil {
			t.Fatalf("frame of a valid IP packet does not parse: %v", err)
		}
		off, n, err := Decap(b, &p)
		if err != nil {
			return
		}
		if !WriteEthernet(b, off-EthernetLen, macB, macA, EtherTypeIPv4) {
			t.Fatal("no room for Ethernet after Decap")
		}
		DecTTL(b, off)
		innerBytes := clone(b[off : off+n])
		start, err := e.Write(b, off, n, 7)
		if err != nil {
			return
		}
		var q Packet
		if err := Parse(b[start:], &q); err != nil {
			t.Fatalf("re-encapsulated frame does not parse: %v", err)
		}
		off2, n2, err := Decap(b[start:], &q)
		if err != nil || n2 != n || start+off2 != off {
			t.Fatalf("round trip: %d+%d, %v; want %d+%d", start+off2, n2, err, off, n)
		}
		if !bytes.Equal(b[off:off+n], innerBytes) {
			t.Fatal("encapsulation changed the inner packet")
		}
	})
}

func FuzzQUIC(f *testing.F) {
	f.Add([]byte{0xc3, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0}, 8)
	f.Add([]byte{0x41, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 8)
	f.Add([]byte{0xd0, 0x6b, 0x33, 0x43, 0xcf, 0, 0}, 0)
	f.Add([]byte{0x80, 0, 0, 0, 0, 0, 0}, 8)
	f.Fuzz(func(t *testing.T, u []byte, shortLen int) {
		cid, long, typ, ok := QUICDestConnID(u, shortLen)
		if !ok {
			return
		}
		if typ > 3 || len(u) == 0 || long != (u[0]&0x80 != 0) {
			t.Fatalf("typ %d long %v for %x", typ, long, u)
		}
		if len(cid) > 0 && !bytes.Contains(u, cid) {
			t.Fatal("cid not from u")
		}
		if !long && len(cid) != shortLen {
			t.Fatalf("short cid length %d, want %d", len(cid), shortLen)
		}
	})
}
