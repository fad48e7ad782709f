package packet

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/tiergate/tiergate/wire"
)

// EtherType values the distributor handles.
const (
	EtherTypeIPv4 = 0x0800 // Internet Protocol version 4
	EtherTypeARP  = 0x0806 // Address Resolution Protocol
	EtherTypeIPv6 = 0x86DD // Internet Protocol version 6
	EtherTypeVLAN = 0x8100 // IEEE 802.1Q tag
)

// IP protocol numbers (IPv4 protocol, IPv6 next header) the distributor handles.
const (
	ProtoICMP   = 1  // ICMP for IPv4
	ProtoIPIP   = 4  // IPv4 in IP
	ProtoTCP    = 6  // Transmission Control Protocol
	ProtoUDP    = 17 // User Datagram Protocol
	ProtoIPv6   = 41 // IPv6 in IP
	ProtoGRE    = 47 // Generic Routing Encapsulation
	ProtoICMPv6 = 58 // ICMP for IPv6
)

// IPv6 extension headers that Parse walks, and the "no next header" value.
const (
	protoHopByHop = 0
	protoRouting  = 43
	protoFragment = 44
	protoNoNext   = 59
	protoDestOpts = 60
)

// TCP flag bits as found in [Packet.TCPFlags].
const (
	TCPFin = 0x01 // no more data from sender
	TCPSyn = 0x02 // synchronise sequence numbers
	TCPRst = 0x04 // reset the connection
	TCPPsh = 0x08 // push function
	TCPAck = 0x10 // acknowledgment field is significant
)

// ICMP and ICMPv6 message types the package interprets.
const (
	ICMPEchoReply      = 0   // ICMP echo reply
	ICMPDestUnreach    = 3   // ICMP destination unreachable (code 4: fragmentation needed)
	ICMPEchoRequest    = 8   // ICMP echo request
	ICMPTimeExceeded   = 11  // ICMP time exceeded
	ICMPParamProblem   = 12  // ICMP parameter problem
	ICMPv6DestUnreach  = 1   // ICMPv6 destination unreachable
	ICMPv6PacketTooBig = 2   // ICMPv6 packet too big
	ICMPv6TimeExceeded = 3   // ICMPv6 time exceeded
	ICMPv6ParamProblem = 4   // ICMPv6 parameter problem
	ICMPv6EchoRequest  = 128 // ICMPv6 echo request
	ICMPv6EchoReply    = 129 // ICMPv6 echo reply
	ICMPv6NS           = 135 // ICMPv6 neighbour solicitation
	ICMPv6NA           = 136 // ICMPv6 neighbour advertisement
)

// Header sizes.
const (
	EthernetLen = 14 // Ethernet header without a VLAN tag
	VLANLen     = 4  // one 802.1Q tag
	IPv4Len     = 20 // IPv4 header without options
	IPv6Len     = 40 // IPv6 fixed header
	TCPLen      = 20 // TCP header without options
	UDPLen      = 8  // UDP header
	GRELen      = 4  // GRE header without checksum, key or sequence number
	ARPLen      = 28 // ARP payload for Ethernet/IPv4
)

// maxExtHeaders bounds the IPv6 extension headers Parse walks before it gives up on
// finding the transport header (L4 = -1).
const maxExtHeaders = 8

// Sentinel errors. Hot-path functions return them as they are, never wrapped, so a
// caller can compare with == and map each to a drop reason.
var (
	// ErrTruncated reports that the bytes end before a header or length says they should.
	ErrTruncated = errors.New("packet: truncated")
	// ErrMalformed reports a header whose fields contradict each other or the protocol.
	ErrMalformed = errors.New("packet: malformed")
	// ErrChecksum reports a checksum that does not verify.
	ErrChecksum = errors.New("packet: bad checksum")
	// ErrUnsupported reports a well-formed packet of a kind this package does not handle
	// (an EtherType, protocol, tunnel flavour or message type).
	ErrUnsupported = errors.New("packet: unsupported")
	// ErrNoRoom reports that a buffer has not enough headroom or a length field would
	// overflow.
	ErrNoRoom = errors.New("packet: no room")
	// ErrNotPrepared reports an [Encap] used before a successful [Encap.Prepare].
	ErrNotPrepared = errors.New("packet: encapsulation not prepared")
)

// Packet describes one parsed frame or IP packet by offsets into the caller's bytes; it
// never copies. The zero value is not meaningful; [Parse] and [ParseIP] overwrite every
// field.
type Packet struct {
	// EtherType is the type after an optional single 802.1Q tag; ParseIP sets it from
	// the IP version.
	EtherType uint16
	// VLAN is the 802.1Q tag's VLAN ID, 0 if the frame is untagged.
	VLAN uint16
	// L3 is the offset of the IP header (or of the ARP payload).
	L3 int
	// L4 is the offset of the transport header, or -1 if there is none: a non-first
	// fragment, an IPv6 extension header chain too long to walk, or ARP.
	L4 int
	// End is the offset just past the IP packet (L3 + IP total length); bytes after End,
	// such as Ethernet padding, are ignored. For ARP it is L3 + 28.
	End int
	// Proto is the transport protocol, after IPv6 extension headers (hop-by-hop,
	// routing, destination options, fragment).
	Proto uint8
	// Src and Dst are the IP addresses.
	Src, Dst netip.Addr
	// SrcPort and DstPort are the TCP or UDP ports; for an ICMP or ICMPv6 echo request
	// or reply both hold the identifier; 0 otherwise.
	SrcPort, DstPort uint16
	// TCPFlags is the TCP flags byte (FIN, SYN, RST, PSH, ACK, URG, ECE, CWR).
	TCPFlags uint8
	// TTL is the IPv4 time to live or IPv6 hop limit.
	TTL uint8
	// Fragment is set for an IPv4 packet with MF set or a non-zero fragment offset, and
	// for an IPv6 packet with a Fragment header.
	Fragment bool
	// FirstFragment is set for a fragment whose offset is 0 (L4 is then available). It
	// is false for packets that are not fragments.
	FirstFragment bool
	// ICMPType and ICMPCode are the ICMP or ICMPv6 type and code.
	ICMPType, ICMPCode uint8
}

// IsIPv6 reports whether the packet is IPv6.
func (p *Packet) IsIPv6() bool { return p.EtherType == EtherTypeIPv6 }

// Parse parses an Ethernet frame into p. It validates the IPv4 version, header length,
// total length and header checksum (ErrChecksum), the IPv6 payload length, the TCP data
// offset and the UDP length; it does not verify TCP or UDP checksums. For ARP it sets
// EtherType, VLAN, L3 and End, with L4 = -1. Other EtherTypes give ErrUnsupported with
// EtherType and L3 set.
func Parse(frame []byte, p *Packet) error {
	*p = Packet{L4: -1}
	if len(frame) < EthernetLen {
		return ErrTruncated
	}
	et := be16(frame[12:])
	off := EthernetLen
	if et == EtherTypeVLAN {
		if len(frame) < EthernetLen+VLANLen {
			return ErrTruncated
		}
		p.VLAN = be16(frame[14:]) & 0x0fff
		et = be16(frame[16:])
		off += VLANLen
	}
	p.EtherType = et
	p.L3 = off
	switch et {
	case EtherTypeIPv4:
		return parseIPv4(frame, off, len(frame), p, false)
	case EtherTypeIPv6:
		return parseIPv6(frame, off, len(frame), p, false)
	case EtherTypeARP:
		if len(frame)-off < ARPLen {
			return ErrTruncated
		}
		p.End = off + ARPLen
		return nil
	}
	return ErrUnsupported
}

// ParseIP parses the IP packet starting at b[off] (no Ethernet header), such as the
// inner packet of a tunnel, with the same validation as [Parse]. It sets EtherType from
// the IP version and VLAN to 0.
func ParseIP(b []byte, off int, p *Packet) error {
	*p = Packet{L4: -1, L3: off}
	if off < 0 || off >= len(b) {
		return ErrTruncated
	}
	switch b[off] >> 4 {
	case 4:
		p.EtherType = EtherTypeIPv4
		return parseIPv4(b, off, len(b), p, false)
	case 6:
		p.EtherType = EtherTypeIPv6
		return parseIPv6(b, off, len(b), p, false)
	}
	return ErrMalformed
}

// parseIPv4 parses the IPv4 header at b[off] with the packet bounded by lim. quoted
// relaxes validation for a header quoted in an ICMP error: the total length may exceed
// what is present (End is clipped to lim), the checksum is not verified and only the
// first 8 transport bytes are required.
func parseIPv4(b []byte, off, lim int, p *Packet, quoted bool) error {
	if lim-off < IPv4Len {
		return ErrTruncated
	}
	h := b[off:lim]
	if h[0]>>4 != 4 {
		return ErrMalformed
	}
	ihl := int(h[0]&0x0f) * 4
	if ihl < IPv4Len {
		return ErrMalformed
	}
	if len(h) < ihl {
		return ErrTruncated
	}
	total := int(be16(h[2:]))
	if total < ihl {
		return ErrMalformed
	}
	if total > len(h) {
		if !quoted {
			return ErrTruncated
		}
		total = len(h)
	}
	if !quoted && wire.Checksum(h[:ihl], 0) != 0 {
		return ErrChecksum
	}
	p.End = off + total
	p.TTL = h[8]
	p.Proto = h[9]
	p.Src = netip.AddrFrom4([4]byte(h[12:16]))
	p.Dst = netip.AddrFrom4([4]byte(h[16:20]))
	frag := be16(h[6:])
	if frag&0x3fff != 0 {
		p.Fragment = true
		if frag&0x1fff != 0 {
			return nil
		}
		p.FirstFragment = true
	}
	return parseL4(b, off+ihl, p, false, quoted)
}

// parseIPv6 parses the IPv6 header at b[off] and walks its extension headers; see
// parseIPv4 for lim and quoted.
func parseIPv6(b []byte, off, lim int, p *Packet, quoted bool) error {
	if lim-off < IPv6Len {
		return ErrTruncated
	}
	h := b[off:lim]
	if h[0]>>4 != 6 {
		return ErrMalformed
	}
	end := off + IPv6Len + int(be16(h[4:]))
	if end > lim {
		if !quoted {
			return ErrTruncated
		}
		end = lim
	}
	p.End = end
	p.TTL = h[7]
	p.Src = netip.AddrFrom16([16]byte(h[8:24]))
	p.Dst = netip.AddrFrom16([16]byte(h[24:40]))
	nh := h[6]
	x := off + IPv6Len
	for i := 0; ; i++ {
		switch nh {
		case protoHopByHop, protoRouting, protoDestOpts, protoFragment:
			if i == maxExtHeaders {
				// A chain longer than any real stack sends: leave the transport
				// unknown, with Proto the first header not walked.
				p.Proto = nh
				return nil
			}
		case protoNoNext:
			p.Proto = nh
			return nil
		default:
			p.Proto = nh
			return parseL4(b, x, p, true, quoted)
		}
		if end-x < 8 {
			return ErrTruncated
		}
		if nh == protoFragment {
			nh = b[x]
			fo := be16(b[x+2:])
			x += 8
			p.Fragment = true
			if fo&0xfff8 != 0 {
				p.Proto = nh
				return nil
			}
			p.FirstFragment = true
			continue
		}
		n := (int(b[x+1]) + 1) * 8
		if end-x < n {
			return ErrTruncated
		}
		nh = b[x]
		x += n
	}
}

// parseL4 parses the transport header at b[x], bounded by p.End, setting p.L4 and the
// per-protocol fields. p.Proto must be set.
func parseL4(b []byte, x int, p *Packet, v6, quoted bool) error {
	avail := p.End - x
	switch p.Proto {
	case ProtoTCP:
		if quoted {
			if avail < 8 {
				return ErrTruncated
			}
			p.L4 = x
			p.SrcPort = be16(b[x:])
			p.DstPort = be16(b[x+2:])
			if avail >= 14 {
				p.TCPFlags = b[x+13]
			}
			return nil
		}
		if avail < TCPLen {
			return ErrTruncated
		}
		doff := int(b[x+12]>>4) * 4
		if doff < TCPLen {
			return ErrMalformed
		}
		if avail < doff {
			return ErrTruncated
		}
		p.L4 = x
		p.SrcPort = be16(b[x:])
		p.DstPort = be16(b[x+2:])
		p.TCPFlags = b[x+13]
	case ProtoUDP:
		if avail < UDPLen {
			return ErrTruncated
		}
		if !quoted {
			ulen := int(be16(b[x+4:]))
			if ulen < UDPLen || ulen > avail {
				return ErrMalformed
			}
		}
		p.L4 = x
		p.SrcPort = be16(b[x:])
		p.DstPort = be16(b[x+2:])
	case ProtoICMP, ProtoICMPv6:
		if (p.Proto == ProtoICMPv6) != v6 {
			// ICMP over IPv6 or ICMPv6 over IPv4: an opaque protocol.
			p.L4 = x
			return nil
		}
		if avail < 8 {
			return ErrTruncated
		}
		p.L4 = x
		p.ICMPType = b[x]
		p.ICMPCode = b[x+1]
		if isEcho(p.ICMPType, v6) {
			id := be16(b[x+4:])
			p.SrcPort, p.DstPort = id, id
		}
	default:
		p.L4 = x
	}
	return nil
}

func isEcho(t uint8, v6 bool) bool {
	if v6 {
		return t == ICMPv6EchoRequest || t == ICMPv6EchoReply
	}
	return t == ICMPEchoRequest || t == ICMPEchoReply
}

// l4Span checks that p's transport header offsets are consistent with b and that at
// least n transport bytes are present, so functions taking a (b, p) pair never index
// out of range even when p did not come from b.
func l4Span(b []byte, p *Packet, n int) bool {
	return p.L3 >= 0 && p.L4 > p.L3 && p.End <= len(b) && p.End-p.L4 >= n
}

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }

func put16(b []byte, v uint16) { binary.BigEndian.PutUint16(b, v) }
