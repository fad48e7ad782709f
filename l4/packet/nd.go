package packet

import (
	"net/netip"
	"slices"

	"github.com/tiergate/tiergate/wire"
)

// Neighbour advertisement flags as found in [ND.Flags] (RFC 4861 section 4.4).
const (
	NDRouter    = 0x80 // R: the sender is a router
	NDSolicited = 0x40 // S: sent in response to a solicitation
	NDOverride  = 0x20 // O: override an existing cache entry
)

// Neighbour discovery option types (RFC 4861 section 4.6).
const (
	ndOptSourceLinkAddr = 1
	ndOptTargetLinkAddr = 2
)

// ndHopLimit is the hop limit every neighbour discovery message carries.
const ndHopLimit = 255

// ND is an IPv6 neighbour solicitation or advertisement (RFC 4861).
type ND struct {
	// Type is ICMPv6NS (135) or ICMPv6NA (136).
	Type uint8
	// Target is the address being resolved or advertised.
	Target netip.Addr
	// LinkAddr is the source link-layer address option of an NS, or the target
	// link-layer address option of an NA; HasLinkAddr says whether it was present.
	LinkAddr    MAC
	HasLinkAddr bool
	// Flags holds NDRouter, NDSolicited and NDOverride of an NA; 0 for an NS.
	Flags uint8
}

// NS and NA frame lengths as built by AppendNS and AppendNA (with the link-layer
// address option).
const (
	NSFrameLen = EthernetLen + IPv6Len + 32
	NAFrameLen = EthernetLen + IPv6Len + 32
)

// ParseND parses the neighbour solicitation or advertisement in the frame described by
// p into nd. It validates hop limit 255, code 0, the ICMPv6 checksum (ErrChecksum), a
// non-multicast target and the option lengths (RFC 4861 sections 7.1.1 and 7.1.2).
// ErrUnsupported if p is not an NS or NA.
func ParseND(frame []byte, p *Packet, nd *ND) error {
	*nd = ND{}
	if p.EtherType != EtherTypeIPv6 || p.Proto != ProtoICMPv6 || p.L4 < 0 ||
		(p.ICMPType != ICMPv6NS && p.ICMPType != ICMPv6NA) {
		return ErrUnsupported
	}
	if p.Fragment {
		return ErrMalformed
	}
	if !l4Span(frame, p, 24) {
		return ErrTruncated
	}
	if p.TTL != ndHopLimit || p.ICMPCode != 0 {
		return ErrMalformed
	}
	if !VerifyL4Checksum(frame, p) {
		return ErrChecksum
	}
	m := frame[p.L4:p.End]
	nd.Type = m[0]
	nd.Target = netip.AddrFrom16([16]byte(m[8:24]))
	if nd.Target.IsMulticast() {
		return ErrMalformed
	}
	want := uint8(ndOptSourceLinkAddr)
	if nd.Type == ICMPv6NA {
		nd.Flags = m[4] & (NDRouter | NDSolicited | NDOverride)
		want = ndOptTargetLinkAddr
	}
	for o := m[24:]; len(o) > 0; {
		if len(o) < 2 {
			return ErrMalformed
		}
		n := int(o[1]) * 8
		if n == 0 || n > len(o) {
			return ErrMalformed
		}
		if o[0] == want && n == 8 {
			nd.LinkAddr = MAC(o[2:8])
			nd.HasLinkAddr = true
		}
		o = o[n:]
	}
	return nil
}

// SolicitedNode returns the solicited-node multicast address ff02::1:ffXX:XXXX of an
// IPv6 address (RFC 4291 section 2.7.1) and its Ethernet group address
// 33:33:ff:XX:XX:XX (RFC 2464 section 7). For an address that is not IPv6 both are
// zero.
func SolicitedNode(a netip.Addr) (netip.Addr, MAC) {
	if !a.Is6() {
		return netip.Addr{}, MAC{}
	}
	v := a.As16()
	s := [16]byte{0: 0xff, 1: 0x02, 11: 0x01, 12: 0xff, 13: v[13], 14: v[14], 15: v[15]}
	return netip.AddrFrom16(s), multicastMAC(s)
}

// multicastMAC maps an IPv6 multicast address to its Ethernet group address.
func multicastMAC(a [16]byte) MAC {
	return MAC{0x33, 0x33, a[12], a[13], a[14], a[15]}
}

// allNodes is ff02::1.
var allNodes = [16]byte{0: 0xff, 1: 0x02, 15: 0x01}

// AppendNS appends a neighbour solicitation frame from srcMAC/src for target, sent to
// target's solicited-node multicast address, and returns the extended slice. It
// carries a source link-layer address option unless src is unspecified (duplicate
// address detection), in which case it is 8 bytes shorter. It allocates only if dst
// lacks the capacity.
func AppendNS(dst []byte, srcMAC MAC, src, target netip.Addr) []byte {
	ipDst, macDst := SolicitedNode(target)
	withOpt := !src.IsUnspecified() && src.IsValid()
	return appendND(dst, ICMPv6NS, 0, macDst, srcMAC, src.As16(), ipDst.As16(), target.As16(), ndOptSourceLinkAddr, withOpt)
}

// AppendNA appends a neighbour advertisement for target from srcMAC/src to
// dstMAC/dst, with the override flag, the solicited flag if solicited, and a target
// link-layer address option of srcMAC, and returns the extended slice. An unspecified
// (or invalid) dst answers duplicate address detection: the advertisement then goes to
// all nodes (ff02::1, 33:33:00:00:00:01) without the solicited flag (RFC 4861 section
// 7.2.4). It allocates only if b lacks the capacity.
func AppendNA(b []byte, srcMAC, dstMAC MAC, src, dst netip.Addr, target netip.Addr, solicited bool) []byte {
	d := dst.As16()
	if !dst.IsValid() || dst.IsUnspecified() {
		d, dstMAC, solicited = allNodes, multicastMAC(allNodes), false
	}
	flags := uint8(NDOverride)
	if solicited {
		flags |= NDSolicited
	}
	return appendND(b, ICMPv6NA, flags, dstMAC, srcMAC, src.As16(), d, target.As16(), ndOptTargetLinkAddr, true)
}

func appendND(b []byte, typ, flags uint8, ethDst, ethSrc MAC, src, dst, target [16]byte, opt uint8, withOpt bool) []byte {
	plen := 24
	if withOpt {
		plen += 8
	}
	n := len(b)
	b = slices.Grow(b, EthernetLen+IPv6Len+plen)[:n+EthernetLen+IPv6Len+plen]
	f := b[n:]
	clear(f)
	copy(f[0:6], ethDst[:])
	copy(f[6:12], ethSrc[:])
	put16(f[12:], EtherTypeIPv6)
	ip := f[EthernetLen:]
	ip[0] = 6 << 4
	put16(ip[4:], uint16(plen))
	ip[6] = ProtoICMPv6
	ip[7] = ndHopLimit
	copy(ip[8:24], src[:])
	copy(ip[24:40], dst[:])
	m := ip[IPv6Len:]
	m[0] = typ
	m[4] = flags
	copy(m[8:24], target[:])
	if withOpt {
		m[24] = opt
		m[25] = 1
		copy(m[26:32], ethSrc[:])
	}
	sum := PseudoHeaderSum(netip.AddrFrom16(src), netip.AddrFrom16(dst), ProtoICMPv6, plen)
	put16(m[2:], wire.Checksum(m[:plen], sum))
	return b
}
