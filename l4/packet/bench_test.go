package packet

import (
	"bytes"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/wire"
)

// TestZeroAllocs holds every hot-path function to zero allocations.
func TestZeroAllocs(t *testing.T) {
	syn := frame(tcpIP(t, client4, vip4, 40000, 443, true, []layers.TCPOption{optMSS(1460)}, nil))
	udp6 := frame(udpIP(t, client6, vip6, 5000, 443, []byte{0x41, 1, 2, 3, 4, 5, 6, 7, 8}))
	echo := frame(echoIP(t, client6, vip6, 1, 1, nil))
	icmpErr := icmpError(t, 3, 4, tcpIP(t, vip4, client4, 443, 1, false, nil, nil), -1)
	inner := tcpIP(t, client4, vip4, 1, 2, false, nil, bytes.Repeat([]byte{1}, 100))
	e := &Encap{Src: ld6, Dst: member6}
	ek := &Encap{Src: ld4, Dst: member4, Key: 0x7467_0001}
	for _, e := range []*Encap{e, ek} {
		if err := e.Prepare(); err != nil {
			t.Fatal(err)
		}
	}
	na := AppendNA(nil, macA, macB, vip6, member6, vip6, true)
	arpF := AppendARP(nil, Broadcast, macA, &ARP{Op: 1, SenderIP: ld4, TargetIP: member4})
	out := make([]byte, 0, 128)
	var p, in Packet
	var a ARP
	var nd ND
	cases := map[string]func(){
		"Parse tcp4":   func() { _ = Parse(syn, &p) },
		"Parse udp6":   func() { _ = Parse(udp6, &p) },
		"ParseIP":      func() { _ = ParseIP(syn, EthernetLen, &p) },
		"ICMPEmbedded": func() { _ = Parse(icmpErr, &p); _ = ICMPEmbedded(icmpErr, &p, &in) },
		"ClampMSS":     func() { _ = Parse(syn, &p); ClampMSS(syn, &p, 1400) },
		"Verify":       func() { _ = Parse(udp6, &p); VerifyL4Checksum(udp6, &p) },
		"EchoReply":    func() { _ = Parse(echo, &p); EchoReply(echo, &p); EchoReply(echo, &p) },
		"Encap+Decap": func() {
			buf := withHeadroomBuf
			copy(buf[64:], inner)
			s, _ := e.Write(buf[:64+len(inner)], 64, len(inner), 1)
			_ = Parse(buf[s:64+len(inner)], &p)
			_, _, _ = Decap(buf[s:64+len(inner)], &p)
			DecTTL(buf, 64)
			WriteEthernet(buf, 50, macA, macB, EtherTypeIPv4)
		},
		"Encap+Decap key": func() {
			buf := withHeadroomBuf
			copy(buf[64:], inner)
			s, _ := ek.Write(buf[:64+len(inner)], 64, len(inner), 1)
			_ = Parse(buf[s:64+len(inner)], &p)
			_, _, _ = Decap(buf[s:64+len(inner)], &p)
		},
		"ParseARP":  func() { _ = Parse(arpF, &p); _ = ParseARP(arpF, &p, &a) },
		"ParseND":   func() { _ = Parse(na, &p); _ = ParseND(na, &p, &nd) },
		"AppendARP": func() { out = AppendARP(out[:0], Broadcast, macA, &a) },
		"AppendNS":  func() { out = AppendNS(out[:0], macA, ld6, member6) },
		"AppendNA":  func() { out = AppendNA(out[:0], macA, macB, vip6, member6, vip6, true) },
		"QUIC":      func() { QUICDestConnID(udp6[62:], 8) },
		"FlowHash":  func() { FlowHash(1, &p); PairHash(1, p.Src, p.Dst) },
		"Checksum":  func() { wire.Checksum(syn, PseudoHeaderSum(client6, vip6, ProtoTCP, 60)) },
		"Solicited": func() { SolicitedNode(vip6) },
	}
	for name, f := range cases {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations", name, n)
		}
	}
}

var withHeadroomBuf = make([]byte, 2048)

func BenchmarkParseTCP4(b *testing.B) {
	f := frame(tcpIP(b, client4, vip4, 40000, 443, false, nil, bytes.Repeat([]byte{1}, 64)))
	var p Packet
	b.ReportAllocs()
	for b.Loop() {
		if err := Parse(f, &p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseTCP6(b *testing.B) {
	f := frame(tcpIP(b, client6, vip6, 40000, 443, false, nil, bytes.Repeat([]byte{1}, 64)))
	var p Packet
	b.ReportAllocs()
	for b.Loop() {
		if err := Parse(f, &p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncapWrite(b *testing.B) { benchEncapWrite(b, 0) }

// BenchmarkEncapWriteKey is BenchmarkEncapWrite with a tunnel key (8-byte GRE).
func BenchmarkEncapWriteKey(b *testing.B) { benchEncapWrite(b, 0x7467_0001) }

func benchEncapWrite(b *testing.B, key uint32) {
	inner := tcpIP(b, client4, vip4, 40000, 443, false, nil, bytes.Repeat([]byte{1}, 64))
	buf := withHeadroom(inner, 128)
	e := &Encap{Src: ld4, Dst: member4, SrcMAC: macA, DstMAC: macB, Key: key}
	if err := e.Prepare(); err != nil {
		b.Fatal(err)
	}
	var id uint16
	b.ReportAllocs()
	for b.Loop() {
		id++
		if _, err := e.Write(buf, 128, len(inner), id); err != nil {
			b.Fatal(err)
		}
	}
}

// returnFrame is a member's reply as the LD receives it: a TCP segment from the VIP
// to the client in GRE from the member to the LD.
func returnFrame(b *testing.B) []byte {
	b.Helper()
	inner := tcpIP(b, vip4, client4, 443, 40000, false, nil, bytes.Repeat([]byte{1}, 64))
	buf := withHeadroom(inner, 128)
	e := &Encap{Src: member4, Dst: ld4}
	if err := e.Prepare(); err != nil {
		b.Fatal(err)
	}
	start, err := e.Write(buf, 128, len(inner), 1)
	if err != nil {
		b.Fatal(err)
	}
	f := buf[start:]
	return f
}

func BenchmarkDecap(b *testing.B) {
	f := returnFrame(b)
	var p Packet
	if err := Parse(f, &p); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Decap(f, &p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReturnPath is the whole per-packet work of the return path: parse the
// outer packet, decapsulate, parse the inner one, rewrite Ethernet, decrement TTL.
func BenchmarkReturnPath(b *testing.B) {
	f := returnFrame(b)
	orig := clone(f[:38+IPv4Len]) // outer headers and inner IPv4 header
	var p, q Packet
	b.ReportAllocs()
	for b.Loop() {
		if err := Parse(f, &p); err != nil {
			b.Fatal(err)
		}
		in, _, err := Decap(f, &p)
		if err != nil {
			b.Fatal(err)
		}
		if err := ParseIP(f[:p.End], in, &q); err != nil {
			b.Fatal(err)
		}
		WriteEthernet(f, in-EthernetLen, macA, macB, EtherTypeIPv4)
		DecTTL(f, in)
		// Restore the frame for the next round.
		copy(f, orig)
	}
}

func BenchmarkFlowHash(b *testing.B) {
	p := flow(client4, vip4, 40000, 443, ProtoTCP)
	var h uint64
	b.ReportAllocs()
	for b.Loop() {
		p.SrcPort++
		h ^= FlowHash(12345, p)
	}
	_ = h
}

func BenchmarkFlowHash6(b *testing.B) {
	p := flow(client6, vip6, 40000, 443, ProtoTCP)
	var h uint64
	b.ReportAllocs()
	for b.Loop() {
		p.SrcPort++
		h ^= FlowHash(12345, p)
	}
	_ = h
}

func BenchmarkClampMSS(b *testing.B) {
	f := frame(tcpIP(b, client4, vip4, 40000, 443, true, []layers.TCPOption{optMSS(1460), optSACKOK, optTS, optNOP, optWScale}, nil))
	var p Packet
	if err := Parse(f, &p); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		f[p.L4+22], f[p.L4+23] = 0x05, 0xb4 // 1460 again; checksum drift is harmless here
		ClampMSS(f, &p, 1400)
	}
}

func BenchmarkQUICDestConnID(b *testing.B) {
	u := longHeader(0xc3, quicV1, []byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{1, 2}, make([]byte, 1200))
	b.ReportAllocs()
	for b.Loop() {
		QUICDestConnID(u, 8)
	}
}
