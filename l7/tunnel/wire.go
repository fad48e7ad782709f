package tunnel

import (
	"encoding/binary"
	"errors"

	"github.com/tiergate/tiergate/wire"
)

// IP protocol numbers of the tunnels (package wire's) and of what is inside them.
const (
	protoICMP   = 1
	protoIPIP   = wire.ProtoIPIP // IPv4 inside IP
	protoTCP    = 6
	protoUDP    = 17
	protoIPv6   = wire.ProtoIPv6 // IPv6 inside IP
	protoGRE    = wire.ProtoGRE
	protoICMPv6 = 58
)

// greHeaderLen is the GRE header this endpoint prepends to replies without a key,
// [wire.PutGRE]'s: no checksum, key or sequence number. With Config.Key it is
// [wire.PutGREKey]'s, [wire.GREKeyHeaderLen] bytes.
const greHeaderLen = wire.GREHeaderLen

// mode is how a packet was, or is to be, encapsulated.
type mode uint8

const (
	modeGRE mode = iota + 1
	modeIPIP
)

func (m mode) String() string {
	switch m {
	case modeGRE:
		return "gre"
	case modeIPIP:
		return "ipip"
	}
	return "none"
}

// Parse errors, wire's for the outer and inner packets alike; each maps to a result
// label of tiergate_l7_tunnel_packets_total.
var (
	errTruncated   = wire.ErrTruncated
	errMalformed   = wire.ErrMalformed
	errUnsupported = wire.ErrUnsupported
	errChecksum    = wire.ErrChecksum
	// errBadKey reports a tunnel packet without the configured GRE key.
	errBadKey = errors.New("tunnel: GRE key missing or wrong")
)

// outer4 parses the IPv4 header of a packet read from an IPv4 raw socket and returns its
// source, destination, protocol and payload (within the header's total length).
func outer4(b []byte) (src, dst [4]byte, proto uint8, payload []byte, err error) {
	if len(b) < 20 {
		return src, dst, 0, nil, errTruncated
	}
	if b[0]>>4 != 4 {
		return src, dst, 0, nil, errMalformed
	}
	hl := int(b[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(b[2:4]))
	if hl < 20 || total < hl {
		return src, dst, 0, nil, errMalformed
	}
	if total > len(b) {
		return src, dst, 0, nil, errTruncated
	}
	copy(src[:], b[12:16])
	copy(dst[:], b[16:20])
	return src, dst, b[9], b[hl:total], nil
}

// decapsulate returns the inner packet of a tunnel payload p (what follows the outer IP
// header) carried with outer protocol proto, and the mode it came in. The rules are
// [wire.Decap]'s and, with a key (not 0), [wire.GRE.KeyMatches]', the ones l4d applies
// to the same packets; the inner header past its version and fixed length is checked
// by parseFlow.
func decapsulate(proto uint8, p []byte, key uint32) (inner []byte, m mode, err error) {
	var t wire.Tunnel
	if err := wire.Decap(proto, p, &t); err != nil {
		return nil, 0, err
	}
	if !t.GRE.KeyMatches(key) {
		return nil, 0, errBadKey
	}
	m = modeIPIP
	if proto == protoGRE {
		m = modeGRE
	}
	return p[t.Inner:], m, nil
}

// flowKey identifies one direction of a flow: addresses (IPv4 in the first four bytes),
// ports (zero for protocols without them, and for fragments after the first), protocol.
type flowKey struct {
	src, dst     [16]byte
	sport, dport uint16
	proto        uint8
	v6           bool
}

// reverse is the key of the other direction.
func (k flowKey) reverse() flowKey {
	k.src, k.dst = k.dst, k.src
	k.sport, k.dport = k.dport, k.sport
	return k
}

// packetInfo is what parseFlow learns about an inner packet.
type packetInfo struct {
	key flowKey
	// tcpFlags are the TCP header's flags (0 when not TCP).
	tcpFlags uint8
	// frag is set for an IPv4 or IPv6 fragment; first for the one at offset 0.
	frag, first bool
	// fragID is the fragment's identification (IPv4's 16 bits, IPv6's 32).
	fragID uint32
	// l4 is the transport header and payload (empty for fragments after the first).
	l4 []byte
	// size is the IP packet's length from its header: bytes beyond it are padding.
	size int
}

// TCP flag bits.
const (
	tcpRST = 0x04
	tcpSYN = 0x02
	tcpACK = 0x10
)

// maxExtHeaders bounds the IPv6 extension headers parseFlow walks.
const maxExtHeaders = 8

// parseFlow parses the IP header of an inner packet and the start of its transport
// header: what the flow table needs. Trailing bytes beyond the IP total length are
// ignored.
func parseFlow(b []byte) (pi packetInfo, err error) {
	if len(b) == 0 {
		return pi, errTruncated
	}
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return pi, errTruncated
		}
		hl := int(b[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(b[2:4]))
		if hl < 20 || total < hl {
			return pi, errMalformed
		}
		if total > len(b) {
			return pi, errTruncated
		}
		copy(pi.key.src[:4], b[12:16])
		copy(pi.key.dst[:4], b[16:20])
		pi.key.proto = b[9]
		fo := binary.BigEndian.Uint16(b[6:8])
		if fo&0x3fff != 0 { // MF or an offset
			pi.frag, pi.first = true, fo&0x1fff == 0
			pi.fragID = uint32(binary.BigEndian.Uint16(b[4:6]))
		}
		l4, pi.size = b[hl:total], total
	case 6:
		if len(b) < 40 {
			return pi, errTruncated
		}
		total := 40 + int(binary.BigEndian.Uint16(b[4:6]))
		if total > len(b) {
			return pi, errTruncated
		}
		pi.key.v6, pi.size = true, total
		copy(pi.key.src[:], b[8:24])
		copy(pi.key.dst[:], b[24:40])
		next, rest := b[6], b[40:total]
	ext:
		for range maxExtHeaders {
			switch next {
			case 0, 43, 60: // hop-by-hop, routing, destination options
				if len(rest) < 8 {
					return pi, errTruncated
				}
				n := (int(rest[1]) + 1) * 8
				if len(rest) < n {
					return pi, errTruncated
				}
				next, rest = rest[0], rest[n:]
			case 44: // fragment
				if len(rest) < 8 {
					return pi, errTruncated
				}
				pi.frag, pi.first = true, binary.BigEndian.Uint16(rest[2:4])&0xfff8 == 0
				pi.fragID = binary.BigEndian.Uint32(rest[4:8])
				next, rest = rest[0], rest[8:]
			case 51: // authentication header
				if len(rest) < 8 {
					return pi, errTruncated
				}
				n := (int(rest[1]) + 2) * 4
				if len(rest) < n {
					return pi, errTruncated
				}
				next, rest = rest[0], rest[n:]
			default:
				break ext
			}
		}
		switch next {
		case 0, 43, 44, 51, 60:
			return pi, errMalformed // more extension headers than we walk
		}
		pi.key.proto = next
		l4 = rest
	default:
		return pi, errMalformed
	}
	if pi.frag && !pi.first {
		return pi, nil
	}
	pi.l4 = l4
	switch pi.key.proto {
	case protoTCP:
		if len(l4) < 20 {
			if pi.frag {
				return pi, nil // a first fragment too small for the ports: by address only
			}
			return pi, errTruncated
		}
		pi.tcpFlags = l4[13]
		fallthrough
	case protoUDP:
		if len(l4) < 8 {
			if pi.frag {
				return pi, nil
			}
			return pi, errTruncated
		}
		pi.key.sport = binary.BigEndian.Uint16(l4[0:2])
		pi.key.dport = binary.BigEndian.Uint16(l4[2:4])
	}
	return pi, nil
}

// icmpEmbedded returns the packet quoted by an ICMP or ICMPv6 error message (its IP
// header and the start of its transport header), or nil when pi is not such an error.
func icmpEmbedded(pi *packetInfo) []byte {
	if pi.frag || len(pi.l4) < 8 {
		return nil
	}
	t := pi.l4[0]
	switch {
	case pi.key.proto == protoICMP && !pi.key.v6 && (t == 3 || t == 11 || t == 12):
	case pi.key.proto == protoICMPv6 && pi.key.v6 && t >= 1 && t <= 4:
	default:
		return nil
	}
	return pi.l4[8:]
}

// parseQuoted parses the packet quoted in an ICMP error: like parseFlow, except that the
// quote is usually cut short, so the total length is not checked against it. Only the
// addresses, protocol and ports are read.
func parseQuoted(b []byte, v6 bool) (k flowKey, ok bool) {
	var l4 []byte
	if !v6 {
		if len(b) < 20 || b[0]>>4 != 4 {
			return k, false
		}
		hl := int(b[0]&0x0f) * 4
		if hl < 20 || len(b) < hl {
			return k, false
		}
		copy(k.src[:4], b[12:16])
		copy(k.dst[:4], b[16:20])
		k.proto = b[9]
		if binary.BigEndian.Uint16(b[6:8])&0x1fff != 0 {
			return k, true
		}
		l4 = b[hl:]
	} else {
		if len(b) < 40 || b[0]>>4 != 6 {
			return k, false
		}
		k.v6 = true
		copy(k.src[:], b[8:24])
		copy(k.dst[:], b[24:40])
		k.proto = b[6] // extension headers in a quote are not walked: ports stay zero
		l4 = b[40:]
	}
	if (k.proto == protoTCP || k.proto == protoUDP) && len(l4) >= 4 {
		k.sport = binary.BigEndian.Uint16(l4[0:2])
		k.dport = binary.BigEndian.Uint16(l4[2:4])
	}
	return k, true
}
