package packet

import (
	"net/netip"

	"github.com/tiergate/tiergate/wire"
)

// ICMP error sizes (RFC 1812 section 4.3.2.3, RFC 4443 section 2.4 (c)): an error
// quotes as much of the offending packet as fits in these, headers included.
const (
	maxICMPv4Error = 576  // the IPv4 minimum reassembly size
	maxICMPv6Error = 1280 // the IPv6 minimum link MTU
	icmpHeaderLen  = 8
	// tooBigTTL is the TTL or hop limit of the errors TooBig writes, as a host stack
	// sends them.
	tooBigTTL = 64
)

// ICMP and ICMPv6 codes TooBig writes.
const (
	icmpFragNeeded = 4 // code of ICMPDestUnreach: fragmentation needed and DF set
)

// TooBig turns the frame at buf[off:], parsed into p by [Parse], in place into the
// error a router returns for a packet that does not fit the next hop and may not be
// fragmented: for IPv4 an ICMP destination unreachable, fragmentation needed (type 3,
// code 4) carrying mtu as the next-hop MTU (RFC 792, RFC 1191); for IPv6 an ICMPv6
// packet too big (type 2) carrying mtu (RFC 4443). The error goes from src (the
// router's own address, of p's family) to p's source; its Ethernet header goes from
// srcMAC back to the frame's source MAC. It quotes the packet from its IP header on,
// as much as keeps the error within 576 bytes (IPv4) or 1280 (IPv6), and its
// checksums are set.
//
// The headers are written into the bytes before the IP header, so buf needs 28 (IPv4)
// or 48 (IPv6) bytes of headroom before the frame; TooBig returns the new frame's
// start and length, or ErrNoRoom. As RFC 1122 section 3.2.2 and RFC 4443 section 2.4
// require, it writes nothing and returns ErrUnsupported for a packet that is an ICMP
// error itself, an IPv4 fragment other than the first, or whose source is not a
// unicast address (unspecified, multicast, broadcast, loopback); and ErrTruncated
// when p does not describe an IP packet within buf.
func TooBig(buf []byte, off int, p *Packet, src netip.Addr, srcMAC MAC, mtu int, id uint16) (start, n int, err error) {
	v6 := p.EtherType == EtherTypeIPv6
	ipLen, maxErr := IPv4Len, maxICMPv4Error
	if v6 {
		ipLen, maxErr = IPv6Len, maxICMPv6Error
	} else if p.EtherType != EtherTypeIPv4 {
		return 0, 0, ErrUnsupported
	}
	if off < 0 || p.L3 < EthernetLen || p.End > len(buf)-off || p.End-p.L3 < ipLen {
		return 0, 0, ErrTruncated
	}
	client := p.Src
	if !client.IsValid() || client.Is4() == v6 || src.Unmap().Is4() == v6 || !tooBigTarget(client) {
		return 0, 0, ErrUnsupported
	}
	if !v6 && p.Fragment && !p.FirstFragment {
		return 0, 0, ErrUnsupported
	}
	if p.L4 >= 0 && p.L4 < p.End {
		switch t := buf[off+p.L4]; {
		case !v6 && p.Proto == ProtoICMP && (t == ICMPDestUnreach || t == 4 || t == 5 || t == ICMPTimeExceeded || t == ICMPParamProblem):
			// Destination unreachable, source quench, redirect, time exceeded,
			// parameter problem: the ICMP errors.
			return 0, 0, ErrUnsupported
		case v6 && p.Proto == ProtoICMPv6 && t < 128: // ICMPv6 errors are types 0..127
			return 0, 0, ErrUnsupported
		}
	}
	hdr := EthernetLen + ipLen + icmpHeaderLen
	quote := min(p.End-p.L3, maxErr-ipLen-icmpHeaderLen)
	start = off + p.L3 - hdr
	if start < 0 {
		return 0, 0, ErrNoRoom
	}
	var dstMAC MAC
	copy(dstMAC[:], buf[off+6:off+12])
	f := buf[start : start+hdr+quote]
	copy(f[0:6], dstMAC[:])
	copy(f[6:12], srcMAC[:])
	ip := f[EthernetLen:]
	icmp := ip[ipLen:]
	msgLen := icmpHeaderLen + quote
	if v6 {
		put16(f[12:], EtherTypeIPv6)
		ip[0], ip[1], ip[2], ip[3] = 6<<4, 0, 0, 0
		put16(ip[4:], uint16(msgLen))
		ip[6] = ProtoICMPv6
		ip[7] = tooBigTTL
		s, d := src.As16(), client.As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], d[:])
		icmp[0], icmp[1] = ICMPv6PacketTooBig, 0
		put16(icmp[2:], 0)
		put16(icmp[4:], uint16(uint32(mtu)>>16))
		put16(icmp[6:], uint16(mtu))
		sum := PseudoHeaderSum(src, client, ProtoICMPv6, msgLen)
		put16(icmp[2:], wire.Checksum(icmp[:msgLen], sum))
	} else {
		put16(f[12:], EtherTypeIPv4)
		ip[0], ip[1] = 4<<4|IPv4Len/4, 0
		put16(ip[2:], uint16(IPv4Len+msgLen))
		put16(ip[4:], id)
		put16(ip[6:], 0)
		ip[8], ip[9] = tooBigTTL, ProtoICMP
		put16(ip[10:], 0)
		s, d := src.Unmap().As4(), client.As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		put16(ip[10:], wire.Checksum(ip[:IPv4Len], 0))
		icmp[0], icmp[1] = ICMPDestUnreach, icmpFragNeeded
		put16(icmp[2:], 0)
		put16(icmp[4:], 0)
		put16(icmp[6:], uint16(min(mtu, 0xffff)))
		put16(icmp[2:], wire.Checksum(icmp[:msgLen], 0))
	}
	return start, hdr + quote, nil
}

// tooBigTarget reports whether a may be sent an ICMP error: a unicast address that is
// not unspecified, loopback or the IPv4 limited broadcast.
func tooBigTarget(a netip.Addr) bool {
	if a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() {
		return false
	}
	return !a.Is4() || a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}
