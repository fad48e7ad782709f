package packet

import (
	"encoding/binary"
	"net/netip"

	"github.com/tiergate/tiergate/wire"
)

// The Internet checksum itself (RFC 1071) is [wire.Checksum]; this file holds what the
// distributor adds to it: incremental updates, pseudo headers, transport checksums.

// ChecksumAdjust16 returns checksum sum updated for one 16-bit word of the covered data
// changing from old to new, without touching the rest (RFC 1624, equation 3). A field
// at an odd offset from the start of the checksummed data contributes its bytes
// swapped; pass bits.ReverseBytes16 of both values for it.
func ChecksumAdjust16(sum uint16, old, new uint16) uint16 {
	s := uint32(^sum) + uint32(^old) + uint32(new)
	s = s&0xffff + s>>16
	s = s&0xffff + s>>16
	return ^uint16(s)
}

// PseudoHeaderSum returns the unfolded one's complement sum of the TCP/UDP/ICMPv6
// pseudo header: source and destination address, protocol and upper-layer length (RFC
// 768/9293 for IPv4, RFC 8200 section 8.1 for IPv6). src and dst must be of one family;
// an IPv4 address is summed as 4 bytes.
func PseudoHeaderSum(src, dst netip.Addr, proto uint8, length int) uint32 {
	s := addrSum(src) + addrSum(dst) + uint64(proto) + uint64(uint32(length))
	return uint32(wire.Fold(s))
}

// addrSum returns the unfolded sum of a's bytes as 32-bit words: 4 bytes for IPv4, 16
// otherwise (the zero Addr sums to 0).
func addrSum(a netip.Addr) uint64 {
	if a.Is4() {
		v := a.As4()
		return uint64(binary.BigEndian.Uint32(v[:]))
	}
	var buf [16]byte
	b := addrBytes(a, &buf)
	if len(b) != 16 {
		return 0 // the zero Addr
	}
	return uint64(binary.BigEndian.Uint32(b[0:])) + uint64(binary.BigEndian.Uint32(b[4:])) +
		uint64(binary.BigEndian.Uint32(b[8:])) + uint64(binary.BigEndian.Uint32(b[12:]))
}

// addrBytes returns a's address bytes (4 for IPv4, 16 for IPv6, none for the zero
// Addr) in buf, without a zone. For IPv6 it is what As16 does, minus the 16-byte array
// return value, whose copy defeats store forwarding and costs several nanoseconds on
// the hot path.
func addrBytes(a netip.Addr, buf *[16]byte) []byte {
	if a.Is6() && a.Zone() != "" {
		a = a.WithZone("")
	}
	b, _ := a.AppendBinary(buf[:0])
	return b
}

// VerifyL4Checksum reports whether the TCP, UDP, ICMP or ICMPv6 checksum of the packet
// p (parsed from b) is correct, pseudo header included. It is false for fragments, for
// other protocols and for an IPv6 UDP checksum of 0; an IPv4 UDP checksum of 0 (none)
// is accepted. With an IPv6 routing header the pseudo header should carry the final
// destination; this uses Dst, which suits the distributor (it never sees such packets
// on a rule).
func VerifyL4Checksum(b []byte, p *Packet) bool {
	if p.Fragment || !l4Span(b, p, 0) {
		return false
	}
	n := p.End - p.L4
	v6 := p.Src.Is6()
	var init uint32
	switch p.Proto {
	case ProtoTCP:
		if n < TCPLen {
			return false
		}
	case ProtoUDP:
		if n < UDPLen {
			return false
		}
		ulen := int(be16(b[p.L4+4:]))
		if ulen < UDPLen || ulen > n {
			return false
		}
		n = ulen
		if be16(b[p.L4+6:]) == 0 {
			return !v6
		}
	case ProtoICMP:
		if v6 || n < 4 {
			return false
		}
		return wire.Checksum(b[p.L4:p.L4+n], 0) == 0
	case ProtoICMPv6:
		if !v6 || n < 4 {
			return false
		}
	default:
		return false
	}
	if p.Src.Is4() != p.Dst.Is4() || !p.Src.IsValid() {
		return false
	}
	init = PseudoHeaderSum(p.Src, p.Dst, p.Proto, n)
	return wire.Checksum(b[p.L4:p.L4+n], init) == 0
}
