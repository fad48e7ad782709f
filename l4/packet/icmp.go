package packet

// ICMPEmbedded parses the IP header and first 8 transport bytes quoted in an ICMP error
// (IPv4 types 3 destination unreachable, 11 time exceeded, 12 parameter problem) or
// ICMPv6 error (types 1 destination unreachable, 2 packet too big, 3 time exceeded, 4
// parameter problem) described by p, parsed from b. It fills inner with the quoted
// packet's addresses, protocol and ports (L4 may point to only 8 bytes; End is clipped
// to p.End). The quoted IPv4 header checksum is not verified and its total length may
// exceed what was quoted. ErrUnsupported if p is not such an error; ErrTruncated or
// ErrMalformed if the quote is short or not an IP packet of p's family.
func ICMPEmbedded(b []byte, p *Packet, inner *Packet) error {
	*inner = Packet{L4: -1}
	v6 := p.EtherType == EtherTypeIPv6
	if !isICMPError(p, v6) {
		return ErrUnsupported
	}
	if !l4Span(b, p, 8) {
		return ErrTruncated
	}
	off := p.L4 + 8
	inner.L3 = off
	if v6 {
		inner.EtherType = EtherTypeIPv6
		return parseIPv6(b, off, p.End, inner, true)
	}
	inner.EtherType = EtherTypeIPv4
	return parseIPv4(b, off, p.End, inner, true)
}

func isICMPError(p *Packet, v6 bool) bool {
	if p.L4 < 0 {
		return false
	}
	if v6 {
		return p.Proto == ProtoICMPv6 && p.ICMPType >= ICMPv6DestUnreach && p.ICMPType <= ICMPv6ParamProblem
	}
	if p.Proto != ProtoICMP {
		return false
	}
	switch p.ICMPType {
	case ICMPDestUnreach, ICMPTimeExceeded, ICMPParamProblem:
		return true
	}
	return false
}

// echoTTL is the TTL or hop limit EchoReply gives a reply, as a host stack would.
const echoTTL = 64

// EchoReply turns an ICMP echo request (IPv4 type 8) or ICMPv6 echo request (type 128)
// in the frame b, parsed into p, into the reply in place: it swaps the Ethernet
// addresses and the IP addresses, sets the type to reply and the TTL or hop limit to
// 64, and fixes the checksums incrementally. It reports false, changing nothing, if p
// is not an unfragmented echo request in an Ethernet frame.
func EchoReply(b []byte, p *Packet) bool {
	v6 := p.EtherType == EtherTypeIPv6
	if p.Fragment || p.L3 < EthernetLen || !l4Span(b, p, 8) {
		return false
	}
	var reply uint8
	switch {
	case v6 && p.Proto == ProtoICMPv6 && p.ICMPType == ICMPv6EchoRequest:
		reply = ICMPv6EchoReply
		if p.L4-p.L3 < IPv6Len {
			return false
		}
	case !v6 && p.EtherType == EtherTypeIPv4 && p.Proto == ProtoICMP && p.ICMPType == ICMPEchoRequest:
		reply = ICMPEchoReply
		if p.L4-p.L3 < IPv4Len {
			return false
		}
	default:
		return false
	}
	if b[p.L4] != p.ICMPType {
		return false
	}
	for i := range 6 {
		b[i], b[6+i] = b[6+i], b[i]
	}
	ip := b[p.L3:]
	if v6 {
		// Swapping the addresses leaves the pseudo-header sum unchanged.
		for i := 8; i < 24; i++ {
			ip[i], ip[i+16] = ip[i+16], ip[i]
		}
		ip[7] = echoTTL
	} else {
		// Swapping the addresses leaves the header sum unchanged.
		for i := 12; i < 16; i++ {
			ip[i], ip[i+4] = ip[i+4], ip[i]
		}
		old := be16(ip[8:])
		ip[8] = echoTTL
		put16(ip[10:], ChecksumAdjust16(be16(ip[10:]), old, be16(ip[8:])))
	}
	p.Src, p.Dst = p.Dst, p.Src
	p.TTL = echoTTL
	t := b[p.L4:]
	old := be16(t)
	t[0] = reply
	put16(t[2:], ChecksumAdjust16(be16(t[2:]), old, be16(t)))
	p.ICMPType = reply
	return true
}
