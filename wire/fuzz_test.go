package wire

import (
	"bytes"
	"testing"
)

// refDecap is Decap's rules written out again, field by field, as a second reading of
// the contract for the fuzz target to hold Decap to.
func refDecap(proto uint8, p []byte) (Tunnel, error) {
	t := Tunnel{Proto: proto}
	switch proto {
	case 4:
		t.Version = 4
	case 41:
		t.Version = 6
	case 47:
		if len(p) < 4 {
			return Tunnel{}, ErrTruncated
		}
		c, r, k, s, strict := p[0]&0x80 != 0, p[0]&0x40 != 0, p[0]&0x20 != 0, p[0]&0x10 != 0, p[0]&0x08 != 0
		recursion, reserved, version := p[0]&0x07, p[1]>>3, p[1]&0x07
		if r || strict || recursion != 0 || reserved != 0 || version != 0 {
			return Tunnel{}, ErrUnsupported
		}
		g := &t.GRE
		g.Flags = uint16(p[0]) << 8
		t.Inner = 4
		fields := [3]uint32{}
		for i, present := range [3]bool{c, k, s} {
			if !present {
				continue
			}
			if len(p) < t.Inner+4 {
				return Tunnel{}, ErrTruncated
			}
			fields[i] = uint32(p[t.Inner])<<24 | uint32(p[t.Inner+1])<<16 | uint32(p[t.Inner+2])<<8 | uint32(p[t.Inner+3])
			t.Inner += 4
		}
		if c && refChecksum(p, 0) != 0 {
			return Tunnel{}, ErrChecksum
		}
		g.Checksum, g.Key, g.Seq = uint16(fields[0]>>16), fields[1], fields[2]
		g.Protocol = uint16(p[2])<<8 | uint16(p[3])
		switch g.Protocol {
		case 0x0800:
			t.Version = 4
		case 0x86dd:
			t.Version = 6
		default:
			return Tunnel{}, ErrUnsupported
		}
	default:
		return Tunnel{}, ErrUnsupported
	}
	in := p[t.Inner:]
	switch {
	case len(in) == 0:
		return Tunnel{}, ErrTruncated
	case in[0]>>4 != t.Version:
		return Tunnel{}, ErrMalformed
	case t.Version == 4 && len(in) < 20, t.Version == 6 && len(in) < 40:
		return Tunnel{}, ErrTruncated
	}
	return t, nil
}

// FuzzDecode fuzzes the receiving side of the contract: Decap against refDecap, with
// the invariants of an accepted tunnel packet, and DecodeConnID on the same bytes.
func FuzzDecode(f *testing.F) {
	for _, c := range decapCases() {
		f.Add(c.proto, c.payload)
	}
	f.Add(uint8(ProtoGRE), greWrap(GREChecksum|GREKey|GRESeq, EtherTypeIPv6, inner6(0)))
	f.Add(uint8(ProtoGRE), []byte{0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(ProtoGRE), []byte{})
	f.Add(uint8(0), []byte{0x07, 0x00, 0x01, 1, 2, 3, 4, 5})
	f.Add(uint8(0), []byte{0x07, 0xff, 0xff, 1, 2, 3, 4, 5, 9, 9})
	f.Add(uint8(0), []byte{0x07, 0x00, 0x00, 1, 2, 3, 4, 5})
	f.Add(uint8(0), []byte{0x47, 0x00, 0x01})
	f.Fuzz(func(t *testing.T, proto uint8, p []byte) {
		orig := bytes.Clone(p)
		var tn Tunnel
		err := Decap(proto, p, &tn)
		if !bytes.Equal(p, orig) {
			t.Fatal("Decap changed its input")
		}
		ref, refErr := refDecap(proto, p)
		if err != refErr || err == nil && tn != ref {
			t.Fatalf("Decap(%d, % x) = %+v, %v; the rules say %+v, %v", proto, p, tn, err, ref, refErr)
		}
		if err == nil {
			in := p[tn.Inner:]
			switch {
			case tn.Proto != proto || tn.Version != 4 && tn.Version != 6 || in[0]>>4 != tn.Version:
				t.Fatalf("accepted %+v", tn)
			case len(in) < 20 || tn.Version == 6 && len(in) < 40:
				t.Fatalf("accepted a %d-byte IPv%d packet", len(in), tn.Version)
			case proto == ProtoGRE && (tn.Inner != tn.GRE.Len() || tn.GRE.Flags&^(GREChecksum|GREKey|GRESeq) != 0):
				t.Fatalf("accepted GRE %+v at %d", tn.GRE, tn.Inner)
			case proto == ProtoGRE && tn.GRE.Flags&GREChecksum != 0 && Checksum(p, 0) != 0:
				t.Fatal("accepted a bad GRE checksum")
			case proto == ProtoGRE && tn.GRE.Flags == 0:
				var h [GREHeaderLen]byte
				PutGRE(h[:], GREProtocol(tn.Version == 6))
				if !bytes.Equal(h[:], p[:GREHeaderLen]) {
					t.Fatalf("PutGRE writes % x for % x", h, p[:GREHeaderLen])
				}
			case proto != ProtoGRE && (tn.Inner != 0 || IPIPProto(tn.Version == 6) != proto):
				t.Fatalf("accepted IPIP %+v", tn)
			}
		}

		id, ok := DecodeConnID(p)
		if !ok {
			return
		}
		if id == 0 || len(p) < ConnIDLen {
			t.Fatalf("DecodeConnID(% x) = %d, true", p, id)
		}
		var b [ConnIDLen]byte
		if err := EncodeConnID(b[:], id); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b[:3], p[:3]) {
			t.Fatalf("re-encoding %d gives % x, input starts % x", id, b[:3], p[:3])
		}
		if again, ok := DecodeConnID(b[:]); !ok || again != id {
			t.Fatalf("DecodeConnID(EncodeConnID(%d)) = %d, %v", id, again, ok)
		}
	})
}
