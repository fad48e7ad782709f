package wire

import (
	"encoding/binary"
	"errors"
)

// IP protocol numbers of the tunnel: the outer header's protocol (IPv4) or next header
// (IPv6).
const (
	ProtoIPIP = 4  // IPv4 directly inside IP (RFC 2003)
	ProtoIPv6 = 41 // IPv6 directly inside IP (RFC 2473)
	ProtoGRE  = 47 // GRE (RFC 2784)
)

// GRE protocol types (EtherTypes) of the inner packet.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86DD
)

// GRE header lengths.
const (
	// GREHeaderLen is the GRE header the tiers send without a key: flags and protocol
	// type, with no checksum, key or sequence number.
	GREHeaderLen = 4
	// GREKeyHeaderLen is the GRE header the tiers send with a tunnel key: flags,
	// protocol type and the key.
	GREKeyHeaderLen = GREHeaderLen + 4
	// MaxGREHeaderLen is the longest GRE header Decap accepts: checksum, key and
	// sequence number all present.
	MaxGREHeaderLen = GREHeaderLen + 12
)

// GRE header flag bits: the first 16 bits of the header (RFC 2784, RFC 2890, and RFC
// 1701's routing, strict source route and recursion control).
const (
	GREChecksum  = 0x8000 // C: checksum and a reserved word follow the protocol type
	GRERouting   = 0x4000 // R: RFC 1701 source routing; refused
	GREKey       = 0x2000 // K: a 32-bit key follows (RFC 2890)
	GRESeq       = 0x1000 // S: a 32-bit sequence number follows (RFC 2890)
	GREStrict    = 0x0800 // s: RFC 1701 strict source route; refused
	GRERecursion = 0x0700 // RFC 1701 recursion control; refused when not 0
	GREReserved  = 0x00F8 // reserved flags; refused when not 0
	GREVersion   = 0x0007 // version; only 0 is accepted
)

// greRefused is every flag bit that makes Decap refuse a GRE header.
const greRefused = GRERouting | GREStrict | GRERecursion | GREReserved | GREVersion

// Sentinel errors of Decap. They are returned as they are, never wrapped, so a caller
// can compare with == and count each kind.
var (
	// ErrTruncated reports that the bytes end before a header or the inner packet's
	// fixed header does.
	ErrTruncated = errors.New("wire: truncated packet")
	// ErrMalformed reports an inner packet whose IP version is not the one its tunnel
	// declares.
	ErrMalformed = errors.New("wire: malformed packet")
	// ErrUnsupported reports a tunnel this contract does not carry: another outer
	// protocol, a GRE version, routing or reserved bit, or another GRE protocol type.
	ErrUnsupported = errors.New("wire: unsupported encapsulation")
	// ErrChecksum reports a GRE header with the checksum bit whose checksum does not
	// verify.
	ErrChecksum = errors.New("wire: bad GRE checksum")
)

// GRE is a GRE header as Decap found it.
type GRE struct {
	// Flags are the header's first 16 bits. After a successful Decap only GREChecksum,
	// GREKey and GRESeq can be set.
	Flags uint16
	// Protocol is the protocol type: EtherTypeIPv4 or EtherTypeIPv6.
	Protocol uint16
	// Checksum is the checksum field (already verified); 0 without GREChecksum.
	Checksum uint16
	// Key is the key field; 0 without GREKey. Decap does not check it: whoever
	// configures a key compares it with KeyMatches.
	Key uint32
	// Seq is the sequence number; 0 without GRESeq. Decap does not check the order.
	Seq uint32
}

// HasKey reports whether the header carries a key (the K bit).
func (g *GRE) HasKey() bool { return g.Flags&GREKey != 0 }

// KeyMatches is the tunnel key rule both tiers apply when they are configured with a
// key: with key 0 (no key configured) every header passes, with or without a key;
// otherwise the header must carry the key bit and exactly key. An IPIP packet, whose
// Tunnel has the zero GRE, carries no key and so fails a configured one.
func (g *GRE) KeyMatches(key uint32) bool {
	return key == 0 || g.Flags&GREKey != 0 && g.Key == key
}

// Len is the header's length in bytes, 4 to 16, from its flags.
func (g *GRE) Len() int {
	n := GREHeaderLen
	if g.Flags&GREChecksum != 0 {
		n += 4
	}
	if g.Flags&GREKey != 0 {
		n += 4
	}
	if g.Flags&GRESeq != 0 {
		n += 4
	}
	return n
}

// Tunnel is what Decap learns about a tunnel packet.
type Tunnel struct {
	// Proto is the outer protocol: ProtoGRE, ProtoIPIP or ProtoIPv6.
	Proto uint8
	// Version is the inner packet's IP version, 4 or 6: the one the tunnel declares
	// (GRE protocol type, or IPIP protocol), which the inner header agrees with.
	Version uint8
	// Inner is the offset of the inner IP packet in the payload given to Decap: the
	// GRE header's length, or 0 for IPIP. The inner packet runs to the payload's end.
	Inner int
	// GRE is the GRE header; the zero GRE for IPIP.
	GRE GRE
}

// Decap checks payload, the bytes after the outer IP header of a packet with outer
// protocol proto up to the outer packet's length, against the rules both tiers apply
// to a tunnel packet, and fills t when it passes. On error t's contents are
// unspecified.
//
// The rules, in the order they are applied:
//
//   - proto is ProtoGRE, ProtoIPIP (inner IPv4) or ProtoIPv6 (inner IPv6); any other is
//     ErrUnsupported.
//   - GRE: the 4-byte base header is there (ErrTruncated); version 0, and no routing,
//     strict source route, recursion or reserved flag bit (ErrUnsupported: RFC 2784
//     lets a receiver ignore the reserved bits, but both ends of this tunnel send them
//     zero, so a packet with one set is not from them); the checksum, key and sequence
//     number fields its flags announce are there (ErrTruncated); with the checksum bit,
//     the checksum over the GRE header and everything after it verifies (ErrChecksum);
//     the protocol type is EtherTypeIPv4 or EtherTypeIPv6 (ErrUnsupported: no
//     Ethernet, 0x6558). The key and sequence number are parsed into t.GRE, not judged.
//   - The inner packet is not empty (ErrTruncated), its IP version is the one declared
//     (ErrMalformed), and its fixed header, 20 bytes for IPv4 and 40 for IPv6, is there
//     (ErrTruncated). The rest of the inner header is the inner parser's to check.
//
// Fragments of the outer packet are the caller's to refuse or reassemble first.
func Decap(proto uint8, payload []byte, t *Tunnel) error {
	// Fields are stored into t one by one rather than built in a local and copied:
	// a wide copy of narrow stores defeats store forwarding and costs nanoseconds.
	g := &t.GRE
	var ver uint8
	switch proto {
	case ProtoGRE:
		if len(payload) < GREHeaderLen {
			return ErrTruncated
		}
		g.Flags = binary.BigEndian.Uint16(payload)
		g.Checksum, g.Key, g.Seq = 0, 0, 0
		t.Inner = GREHeaderLen
		if g.Flags != 0 {
			if err := greFields(payload, t); err != nil {
				return err
			}
		}
		g.Protocol = binary.BigEndian.Uint16(payload[2:])
		switch g.Protocol {
		case EtherTypeIPv4:
			ver = 4
		case EtherTypeIPv6:
			ver = 6
		default:
			return ErrUnsupported
		}
	case ProtoIPIP, ProtoIPv6:
		ver = 4
		if proto == ProtoIPv6 {
			ver = 6
		}
		t.Inner = 0
		*g = GRE{}
	default:
		return ErrUnsupported
	}
	inner := payload[t.Inner:]
	if len(inner) == 0 {
		return ErrTruncated
	}
	if inner[0]>>4 != ver {
		return ErrMalformed
	}
	if len(inner) < 20 || ver == 6 && len(inner) < 40 {
		return ErrTruncated
	}
	t.Proto, t.Version = proto, ver
	return nil
}

// greFields applies Decap's rules to the flags in t.GRE.Flags of the GRE header at the
// start of p, sets t.Inner to the header's length and reads the optional fields.
func greFields(p []byte, t *Tunnel) error {
	g := &t.GRE
	if g.Flags&greRefused != 0 {
		return ErrUnsupported
	}
	n := g.Len()
	if len(p) < n {
		return ErrTruncated
	}
	o := GREHeaderLen
	if g.Flags&GREChecksum != 0 {
		if Checksum(p, 0) != 0 {
			return ErrChecksum
		}
		g.Checksum = binary.BigEndian.Uint16(p[o:])
		o += 4
	}
	if g.Flags&GREKey != 0 {
		g.Key = binary.BigEndian.Uint32(p[o:])
		o += 4
	}
	if g.Flags&GRESeq != 0 {
		g.Seq = binary.BigEndian.Uint32(p[o:])
	}
	t.Inner = n
	return nil
}

// PutGRE writes the GRE header the tiers send, GREHeaderLen bytes with no checksum,
// key or sequence number and the given protocol type, at the start of b. It panics if
// b is shorter, as binary.BigEndian's Put functions do.
func PutGRE(b []byte, protocol uint16) {
	_ = b[GREHeaderLen-1]
	b[0], b[1] = 0, 0
	binary.BigEndian.PutUint16(b[2:], protocol)
}

// PutGREKey writes the GRE header the tiers send with tunnel key key (RFC 2890),
// GREKeyHeaderLen bytes: the key bit, the protocol type and the key, with no checksum
// or sequence number. With key 0 it writes PutGRE's header instead (0 is "no key" in
// every tier's configuration), so callers size the header with SendLen. It panics if b
// is shorter than that header.
func PutGREKey(b []byte, protocol uint16, key uint32) {
	if key == 0 {
		PutGRE(b, protocol)
		return
	}
	_ = b[GREKeyHeaderLen-1]
	binary.BigEndian.PutUint16(b, GREKey)
	binary.BigEndian.PutUint16(b[2:], protocol)
	binary.BigEndian.PutUint32(b[4:], key)
}

// SendLen is the length of the GRE header the tiers send with tunnel key key:
// GREKeyHeaderLen, or GREHeaderLen for key 0 (no key).
func SendLen(key uint32) int {
	if key == 0 {
		return GREHeaderLen
	}
	return GREKeyHeaderLen
}

// GREProtocol returns the GRE protocol type of an inner packet: EtherTypeIPv6 for
// IPv6 (innerV6), EtherTypeIPv4 otherwise.
func GREProtocol(innerV6 bool) uint16 {
	if innerV6 {
		return EtherTypeIPv6
	}
	return EtherTypeIPv4
}

// IPIPProto returns the outer protocol that carries an inner packet without GRE:
// ProtoIPv6 for IPv6 (innerV6), ProtoIPIP otherwise.
func IPIPProto(innerV6 bool) uint8 {
	if innerV6 {
		return ProtoIPv6
	}
	return ProtoIPIP
}
