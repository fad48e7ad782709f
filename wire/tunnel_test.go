package wire

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// inner4 is a minimal IPv4 packet (header and n payload bytes); inner6 an IPv6 one.
func inner4(n int) []byte {
	b := make([]byte, 20+n)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8], b[9] = 64, 6
	copy(b[12:], []byte{198, 18, 0, 50, 203, 0, 113, 10})
	binary.BigEndian.PutUint16(b[10:], Checksum(b[:20], 0))
	return b
}

func inner6(n int) []byte {
	b := make([]byte, 40+n)
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(n))
	b[6], b[7] = 17, 64
	b[8], b[9], b[24], b[25] = 0x20, 0x01, 0x20, 0x01
	return b
}

// greWrap prepends a GRE header with the given flags (checksum, key 0xdeadbeef and
// sequence number 7 written when their bits are set) and protocol type.
func greWrap(flags, protocol uint16, inner []byte) []byte {
	g := GRE{Flags: flags}
	hl := g.Len()
	b := make([]byte, hl, hl+len(inner))
	binary.BigEndian.PutUint16(b, flags)
	binary.BigEndian.PutUint16(b[2:], protocol)
	o := GREHeaderLen
	if flags&GREChecksum != 0 {
		o += 4
	}
	if flags&GREKey != 0 {
		binary.BigEndian.PutUint32(b[o:], 0xdeadbeef)
		o += 4
	}
	if flags&GRESeq != 0 {
		binary.BigEndian.PutUint32(b[o:], 7)
	}
	b = append(b, inner...)
	if flags&GREChecksum != 0 {
		binary.BigEndian.PutUint16(b[4:], Checksum(b, 0))
	}
	return b
}

// decapCase is one tunnel payload and what Decap must say of it.
type decapCase struct {
	name    string
	proto   uint8
	payload []byte
	err     error
	inner   int   // Tunnel.Inner when err is nil
	version uint8 // Tunnel.Version when err is nil
}

// decapCases are the rules of Decap, one case per rule and per kind of header.
func decapCases() []decapCase {
	v4, v6 := inner4(8), inner6(8)
	badSum := greWrap(GREChecksum, EtherTypeIPv4, v4)
	badSum[len(badSum)-1] ^= 1
	return []decapCase{
		{"gre v4", ProtoGRE, greWrap(0, EtherTypeIPv4, v4), nil, 4, 4},
		{"gre v6", ProtoGRE, greWrap(0, EtherTypeIPv6, v6), nil, 4, 6},
		{"gre checksum", ProtoGRE, greWrap(GREChecksum, EtherTypeIPv4, v4), nil, 8, 4},
		{"gre key", ProtoGRE, greWrap(GREKey, EtherTypeIPv4, v4), nil, 8, 4},
		{"gre seq", ProtoGRE, greWrap(GRESeq, EtherTypeIPv6, v6), nil, 8, 6},
		{"gre checksum key seq", ProtoGRE, greWrap(GREChecksum|GREKey|GRESeq, EtherTypeIPv4, v4), nil, 16, 4},
		{"gre bad checksum", ProtoGRE, badSum, ErrChecksum, 0, 0},
		{"gre routing", ProtoGRE, greWrap(GRERouting, EtherTypeIPv4, v4), ErrUnsupported, 0, 0},
		{"gre strict route", ProtoGRE, greWrap(GREStrict, EtherTypeIPv4, v4), ErrUnsupported, 0, 0},
		{"gre recursion", ProtoGRE, greWrap(0x0100, EtherTypeIPv4, v4), ErrUnsupported, 0, 0},
		{"gre reserved 0x0080", ProtoGRE, greWrap(0x0080, EtherTypeIPv4, v4), ErrUnsupported, 0, 0},
		{"gre reserved 0x0008", ProtoGRE, greWrap(0x0008, EtherTypeIPv4, v4), ErrUnsupported, 0, 0},
		{"gre version 1", ProtoGRE, greWrap(GREKey|1, 0x880b, v4), ErrUnsupported, 0, 0},
		{"gre version 7", ProtoGRE, greWrap(7, EtherTypeIPv4, v4), ErrUnsupported, 0, 0},
		{"gre ethernet", ProtoGRE, greWrap(0, 0x6558, v4), ErrUnsupported, 0, 0},
		{"gre v4 type carries v6", ProtoGRE, greWrap(0, EtherTypeIPv4, v6), ErrMalformed, 0, 0},
		{"gre v6 type carries v4", ProtoGRE, greWrap(0, EtherTypeIPv6, inner4(20)), ErrMalformed, 0, 0},
		{"gre header cut", ProtoGRE, []byte{0, 0, 8}, ErrTruncated, 0, 0},
		{"gre key cut", ProtoGRE, []byte{0x20, 0, 8, 0, 1, 2}, ErrTruncated, 0, 0},
		{"gre all fields cut", ProtoGRE, greWrap(GREChecksum|GREKey|GRESeq, EtherTypeIPv4, nil)[:12], ErrTruncated, 0, 0},
		{"gre empty inner", ProtoGRE, greWrap(0, EtherTypeIPv4, nil), ErrTruncated, 0, 0},
		{"gre inner v4 cut", ProtoGRE, greWrap(0, EtherTypeIPv4, v4[:19]), ErrTruncated, 0, 0},
		{"gre inner v6 cut", ProtoGRE, greWrap(0, EtherTypeIPv6, v6[:39]), ErrTruncated, 0, 0},
		{"ipip", ProtoIPIP, v4, nil, 0, 4},
		{"ipip v6", ProtoIPv6, v6, nil, 0, 6},
		{"ipip minimal", ProtoIPIP, v4[:20], nil, 0, 4},
		{"ipip carries v6", ProtoIPIP, v6, ErrMalformed, 0, 0},
		{"ipv6-in-ip carries v4", ProtoIPv6, inner4(20), ErrMalformed, 0, 0},
		{"ipip version 5", ProtoIPIP, append([]byte{0x55}, v4[1:]...), ErrMalformed, 0, 0},
		{"ipip empty", ProtoIPIP, nil, ErrTruncated, 0, 0},
		{"ipip cut", ProtoIPIP, v4[:19], ErrTruncated, 0, 0},
		{"ipv6-in-ip cut", ProtoIPv6, v6[:39], ErrTruncated, 0, 0},
		{"udp", 17, v4, ErrUnsupported, 0, 0},
		{"tcp", 6, v4, ErrUnsupported, 0, 0},
	}
}

func TestDecap(t *testing.T) {
	for _, c := range decapCases() {
		var tn Tunnel
		err := Decap(c.proto, c.payload, &tn)
		if err != c.err {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
			continue
		}
		if err != nil {
			continue
		}
		if tn.Proto != c.proto || tn.Inner != c.inner || tn.Version != c.version {
			t.Errorf("%s: %+v, want proto %d inner %d version %d", c.name, tn, c.proto, c.inner, c.version)
		}
		if ref, refErr := refDecap(c.proto, c.payload); refErr != nil || ref != tn {
			t.Errorf("%s: reference says %+v, %v", c.name, ref, refErr)
		}
	}
}

func TestDecapFields(t *testing.T) {
	p := greWrap(GREChecksum|GREKey|GRESeq, EtherTypeIPv6, inner6(0))
	var tn Tunnel
	if err := Decap(ProtoGRE, p, &tn); err != nil {
		t.Fatal(err)
	}
	want := GRE{Flags: GREChecksum | GREKey | GRESeq, Protocol: EtherTypeIPv6, Checksum: binary.BigEndian.Uint16(p[4:]), Key: 0xdeadbeef, Seq: 7}
	if tn.GRE != want || !tn.GRE.HasKey() || tn.GRE.Len() != MaxGREHeaderLen {
		t.Fatalf("GRE %+v (key %v, len %d), want %+v", tn.GRE, tn.GRE.HasKey(), tn.GRE.Len(), want)
	}
	if err := Decap(ProtoGRE, greWrap(GRESeq, EtherTypeIPv4, inner4(0)), &tn); err != nil || tn.GRE.HasKey() || tn.GRE.Key != 0 || tn.GRE.Seq != 7 {
		t.Fatalf("sequence number only: %+v, %v", tn.GRE, err)
	}
	if err := Decap(ProtoIPIP, inner4(0), &tn); err != nil || tn.GRE != (GRE{}) {
		t.Fatalf("IPIP after GRE: %+v, %v", tn, err)
	}
}

// TestPutGRE checks that what the tiers send is what Decap accepts, for both families.
func TestPutGRE(t *testing.T) {
	for _, in := range [][]byte{inner4(3), inner6(3)} {
		v6 := in[0]>>4 == 6
		b := make([]byte, GREHeaderLen+len(in))
		for i := range GREHeaderLen {
			b[i] = 0xff // PutGRE must overwrite every header byte
		}
		PutGRE(b, GREProtocol(v6))
		copy(b[GREHeaderLen:], in)
		var tn Tunnel
		if err := Decap(ProtoGRE, b, &tn); err != nil || tn.Inner != GREHeaderLen || !bytes.Equal(b[tn.Inner:], in) {
			t.Errorf("v6 %v: GRE %x: %+v, %v", v6, b[:4], tn, err)
		}
		if err := Decap(IPIPProto(v6), in, &tn); err != nil || tn.Inner != 0 {
			t.Errorf("v6 %v: IPIP: %+v, %v", v6, tn, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("PutGRE into 3 bytes did not panic")
		}
	}()
	PutGRE(make([]byte, 3), EtherTypeIPv4)
}

// TestPutGREKey checks that the keyed header the tiers send decapsulates with its key,
// that KeyMatches holds a configured key to exactly that header, and that key 0 is the
// header without a key.
func TestPutGREKey(t *testing.T) {
	const key = 0x7467_0001
	for _, in := range [][]byte{inner4(3), inner6(3)} {
		v6 := in[0]>>4 == 6
		b := bytes.Repeat([]byte{0xff}, GREKeyHeaderLen+len(in)) // every header byte overwritten
		PutGREKey(b, GREProtocol(v6), key)
		copy(b[SendLen(key):], in)
		var tn Tunnel
		if err := Decap(ProtoGRE, b, &tn); err != nil || tn.Inner != GREKeyHeaderLen || !bytes.Equal(b[tn.Inner:], in) ||
			!tn.GRE.HasKey() || tn.GRE.Key != key || tn.GRE.Flags != GREKey {
			t.Fatalf("v6 %v: keyed GRE % x: %+v, %v", v6, b[:8], tn, err)
		}
		if !tn.GRE.KeyMatches(key) || !tn.GRE.KeyMatches(0) || tn.GRE.KeyMatches(key+1) {
			t.Errorf("v6 %v: KeyMatches of a header with key %#x: %v for it, %v for none, %v for another", v6, key,
				tn.GRE.KeyMatches(key), tn.GRE.KeyMatches(0), tn.GRE.KeyMatches(key+1))
		}
		PutGREKey(b, GREProtocol(v6), 0)
		if SendLen(0) != GREHeaderLen || binary.BigEndian.Uint16(b) != 0 {
			t.Errorf("key 0: header % x, length %d; want PutGRE's", b[:4], SendLen(0))
		}
		copy(b[GREHeaderLen:], in)
		if err := Decap(ProtoGRE, b[:GREHeaderLen+len(in)], &tn); err != nil || tn.GRE.HasKey() {
			t.Fatalf("v6 %v: GRE without a key: %+v, %v", v6, tn, err)
		}
		if tn.GRE.KeyMatches(key) || !tn.GRE.KeyMatches(0) {
			t.Errorf("v6 %v: a header without a key matches key %#x: %v, no key: %v", v6, key, tn.GRE.KeyMatches(key), tn.GRE.KeyMatches(0))
		}
		if err := Decap(IPIPProto(v6), in, &tn); err != nil || tn.GRE.KeyMatches(key) {
			t.Errorf("v6 %v: IPIP matches a configured key (%v)", v6, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("PutGREKey into 7 bytes did not panic")
		}
	}()
	PutGREKey(make([]byte, 7), EtherTypeIPv4, key)
}

func TestZeroAllocs(t *testing.T) {
	gre := greWrap(GREChecksum|GREKey, EtherTypeIPv4, inner4(100))
	cid := []byte{7, 0, 1, 2, 3, 4, 5, 6}
	var tn Tunnel
	for name, f := range map[string]func(){
		"Decap":        func() { _ = Decap(ProtoGRE, gre, &tn) },
		"Decap error":  func() { _ = Decap(ProtoGRE, gre[:3], &tn) },
		"Checksum":     func() { Checksum(gre, 0) },
		"DecodeConnID": func() { DecodeConnID(cid) },
		"PutGRE":       func() { PutGRE(cid, EtherTypeIPv6) },
		"PutGREKey":    func() { PutGREKey(cid, EtherTypeIPv6, 42) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations", name, n)
		}
	}
}

func BenchmarkDecap(b *testing.B) {
	p := greWrap(0, EtherTypeIPv4, inner4(64))
	var tn Tunnel
	b.ReportAllocs()
	for b.Loop() {
		if err := Decap(ProtoGRE, p, &tn); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecapChecksumKey(b *testing.B) {
	p := greWrap(GREChecksum|GREKey, EtherTypeIPv4, inner4(1400))
	var tn Tunnel
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Decap(ProtoGRE, p, &tn); err != nil {
			b.Fatal(err)
		}
	}
}
