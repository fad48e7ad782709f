package synproxy

import (
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/l4/packet"
)

// FuzzParseOptions feeds arbitrary TCP headers to the option parser: it must not panic,
// and the offsets it reports must lie within the header.
func FuzzParseOptions(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa0, 2, 0, 0, 0, 0, 0, 0,
		2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x10, 0, 0, 0, 0, 0, 0,
		1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2})
	f.Add(make([]byte, 20))
	f.Fuzz(func(t *testing.T, h []byte) {
		var o Options
		if ParseOptions(h, &o) != nil {
			return
		}
		doff := int(h[12]>>4) * 4
		if o.TSOff != 0 && (o.TSOff < 22 || o.TSOff+8 > doff) {
			t.Fatalf("timestamp at %d of a %d-byte header", o.TSOff, doff)
		}
		if o.SACKBlocks != 0 && (o.SACKOff < 22 || o.SACKOff+8*o.SACKBlocks > doff) {
			t.Fatalf("%d SACK blocks at %d of a %d-byte header", o.SACKBlocks, o.SACKOff, doff)
		}
		if o.WScale > MaxWScale {
			t.Fatalf("window scale %d", o.WScale)
		}
	})
}

// FuzzTranslate rewrites arbitrary segments both ways: no panic, and a segment whose
// checksum was right stays right (the incremental updates are exact).
func FuzzTranslate(f *testing.F) {
	f.Add([]byte{1, 8, 10, 0, 0, 0, 100, 0, 0, 0, 200, 1, 5, 10, 0, 0, 0, 10, 0, 0, 0, 20}, []byte{1, 2, 3}, uint32(5), uint32(7), int8(-2), uint16(9000))
	f.Add([]byte{}, []byte{}, uint32(0x80000000), uint32(0), int8(3), uint16(0xffff))
	f.Fuzz(func(t *testing.T, opts, payload []byte, seqd, tsd uint32, shift int8, win uint16) {
		if len(opts) > 40 || len(payload) > 1500 {
			return
		}
		s := segment(t, 1, 2, win, opts, payload)
		d := Delta{SeqDelta: seqd, TSDelta: tsd, WShift: shift}
		for _, fn := range []func([]byte) error{d.ToClient, d.ToMember} {
			c := append([]byte(nil), s...)
			if fn(c) == nil && !sumOK(c) {
				t.Fatalf("checksum broken by the translation of %x", s)
			}
		}
		// Garbage (not a segment whose checksum is right) must not panic either.
		_ = d.ToClient(opts)
		_ = d.ToMember(payload)
		AddSeq32(payload, int(win%64)-2, int(shift), seqd)
	})
}

// FuzzCookie checks arbitrary ACKs against the cookie: no panic, and a cookie the keys
// made checks with the MSS it encodes.
func FuzzCookie(f *testing.F) {
	f.Add([]byte("198.51.100.7...."), uint16(40000), uint32(1000), uint32(77), uint8(3), int64(1_800_000_000))
	f.Fuzz(func(t *testing.T, src []byte, port uint16, seq, ack uint32, idx uint8, now int64) {
		if now < 0 || now > 1<<40 {
			return
		}
		k := NewKeys([]byte("fuzz"), time.Hour)
		k.Update(now)
		var tu Tuple
		copy(tu.Src[:], src)
		tu.SrcPort, tu.DstPort = port, 443
		count := Minute(now)
		k.Check(&tu, seq, ack, count)
		i := int(idx % 8)
		c := k.Cookie(&tu, seq-1, count, i)
		if mss, ok := k.Check(&tu, seq, c+1, count+1); !ok || mss != MSSTable[i] {
			t.Fatalf("own cookie: %d, %v", mss, ok)
		}
		DecodeTSecr(uint32(now), ack)
	})
}

// FuzzWrite runs the three writers over arbitrary frames that parse as TCP: no panic,
// and what they write parses with correct checksums.
func FuzzWrite(f *testing.F) {
	f.Add(synFrame(f, client4, vip4, true))
	f.Add(synFrame(f, client6, vip6, false))
	f.Add(tcpFrame(f, client6, vip6, &layers.TCP{SrcPort: 1, DstPort: 2, ACK: true, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop}}}, []byte("data")))
	f.Fuzz(func(t *testing.T, frame []byte) {
		var p packet.Packet
		if len(frame) > 2000 || packet.Parse(frame, &p) != nil || p.Proto != packet.ProtoTCP || p.L4 < 0 {
			return
		}
		var o Options
		if ParseOptions(frame[p.L4:p.End], &o) != nil {
			return
		}
		buf := make([]byte, len(frame)+64)
		copy(buf, frame)
		if n, err := WriteSynAck(buf, &p, &o, &SynAck{Cookie: 1, MSS: 1400, Window: 100, WScale: 7, TSval: 9}); err == nil {
			var q packet.Packet
			if err := packet.Parse(buf[:n], &q); err != nil || !packet.VerifyL4Checksum(buf[:n], &q) {
				t.Fatalf("SYN-ACK does not parse or verify: %v", err)
			}
		}
		copy(buf, frame)
		if end, err := WriteSyn(buf, &p, &Syn{ISN: 5, MSS: 1400, HasTS: true}); err == nil {
			var q packet.Packet
			if err := packet.Parse(buf[:end], &q); err != nil || !packet.VerifyL4Checksum(buf[:end], &q) {
				t.Fatalf("SYN does not parse or verify: %v", err)
			}
		}
		copy(buf, frame)
		ip := p
		if end, err := WriteAck(buf, &ip, &Ack{Seq: 1, Ack: 2, HasTS: true}); err == nil {
			var q packet.Packet
			if err := packet.Parse(buf[:end], &q); err != nil || !packet.VerifyL4Checksum(buf[:end], &q) {
				t.Fatalf("ACK does not parse or verify: %v", err)
			}
		}
	})
}
