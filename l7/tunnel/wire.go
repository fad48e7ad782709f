package tunnel

import (
	"encoding/binary"
	"errors"
)

// IP protocol numbers of the tunnels and of what is inside them.
const (
	protoICMP   = 1
	protoIPIP   = 4 // IPv4 inside IP
	protoTCP    = 6
	protoUDP    = 17
	protoIPv6   = 41 // IPv6 inside IP
	protoGRE    = 47
	protoICMPv6 = 58
)

// GRE protocol types (EtherTypes) of the inner packet.
const (
	etherIPv4 = 0x0800
	etherIPv6 = 0x86dd
)

// GRE header flag bits (RFC 2784, RFC 2890).
const (
	greChecksum   = 0x8000
	greRouting    = 0x4000
	greKey        = 0x2000
	greSeq        = 0x1000
	greStrict     = 0x0800
	greRecursion  = 0x0700
	greReserved0  = 0x00f8
	greVersion    = 0x0007
	greHeaderBase = 4
)

// greHeaderLen is the GRE header this endpoint prepends to replies: no checksum, key or
// sequence number.
const greHeaderLen = greHeaderBase

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

// Parse errors; each maps to a result label of tiergate_l7_tunnel_packets_total.
var (
	errTruncated   = errors.New("tunnel: truncated packet")
	errMalformed   = errors.New("tunnel: malformed packet")
	errUnsupported = errors.New("tunnel: unsupported encapsulation")
	errChecksum    = errors.New("tunnel: bad GRE checksum")
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
// header) carried with outer protocol proto, and the mode it came in. The inner packet's
// IP version must agree with the tunnel's protocol type; its own header is checked by
// parseFlow.
func decapsulate(proto uint8, p []byte) (inner []byte, m mode, err error) {
	var wantVersion byte
	switch proto {
	case protoIPIP:
		inner, m, wantVersion = p, modeIPIP, 4
	case protoIPv6:
		inner, m, wantVersion = p, modeIPIP, 6
	case protoGRE:
		if len(p) < greHeaderBase {
			return nil, 0, errTruncated
		}
		flags := binary.BigEndian.Uint16(p[0:2])
		if flags&(greRouting|greStrict|greRecursion|greReserved0|greVersion) != 0 {
			return nil, 0, errUnsupported
		}
		hl := greHeaderBase
		for _, bit := range [...]uint16{greChecksum, greKey, greSeq} {
			if flags&bit != 0 {
				hl += 4
			}
		}
		if len(p) < hl {
			return nil, 0, errTruncated
		}
		if flags&greChecksum != 0 && checksum(p, 0) != 0 {
			return nil, 0, errChecksum
		}
		switch binary.BigEndian.Uint16(p[2:4]) {
		case etherIPv4:
			wantVersion = 4
		case etherIPv6:
			wantVersion = 6
		default:
			return nil, 0, errUnsupported
		}
		inner, m = p[hl:], modeGRE
	default:
		return nil, 0, errUnsupported
	}
	if len(inner) == 0 {
		return nil, 0, errTruncated
	}
	if inner[0]>>4 != wantVersion {
		return nil, 0, errMalformed
	}
	return inner, m, nil
}

// checksum is the Internet checksum (RFC 1071) of b, starting from the partial sum
// initial: 0 when b carries a correct checksum of itself.
func checksum(b []byte, initial uint32) uint16 {
	sum := initial
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
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
