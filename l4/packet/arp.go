package packet

import (
	"net/netip"
	"slices"
)

// ARP operations.
const (
	ARPRequest = 1 // who has TargetIP? tell SenderIP
	ARPReply   = 2 // SenderIP is at SenderMAC
)

// ARP is an Ethernet/IPv4 ARP message (RFC 826).
type ARP struct {
	// Op is ARPRequest or ARPReply.
	Op uint16
	// SenderMAC and SenderIP are the sender's hardware and protocol addresses.
	SenderMAC MAC
	SenderIP  netip.Addr
	// TargetMAC and TargetIP are the target's; TargetMAC is zero in a request.
	TargetMAC MAC
	TargetIP  netip.Addr
}

// ARPFrameLen is the length of the frame AppendARP builds; pad it to 60 bytes (the
// Ethernet minimum without FCS) for the wire.
const ARPFrameLen = EthernetLen + ARPLen

// ParseARP parses the ARP message of the frame described by p into a. It accepts only
// Ethernet/IPv4 requests and replies (ErrUnsupported otherwise).
func ParseARP(frame []byte, p *Packet, a *ARP) error {
	*a = ARP{}
	if p.EtherType != EtherTypeARP {
		return ErrUnsupported
	}
	if p.L3 < 0 || len(frame)-p.L3 < ARPLen {
		return ErrTruncated
	}
	m := frame[p.L3 : p.L3+ARPLen]
	if be16(m[0:]) != 1 || be16(m[2:]) != EtherTypeIPv4 || m[4] != 6 || m[5] != 4 {
		return ErrUnsupported
	}
	op := be16(m[6:])
	if op != ARPRequest && op != ARPReply {
		return ErrUnsupported
	}
	a.Op = op
	a.SenderMAC = MAC(m[8:14])
	a.SenderIP = netip.AddrFrom4([4]byte(m[14:18]))
	a.TargetMAC = MAC(m[18:24])
	a.TargetIP = netip.AddrFrom4([4]byte(m[24:28]))
	return nil
}

// AppendARP appends a 42-byte Ethernet frame carrying a to dst and returns the
// extended slice; it allocates only if dst lacks the capacity. Addresses of a that are
// not IPv4 are written as 0.0.0.0.
func AppendARP(dst []byte, ethDst, ethSrc MAC, a *ARP) []byte {
	n := len(dst)
	dst = slices.Grow(dst, ARPFrameLen)[:n+ARPFrameLen]
	f := dst[n:]
	copy(f[0:6], ethDst[:])
	copy(f[6:12], ethSrc[:])
	put16(f[12:], EtherTypeARP)
	m := f[EthernetLen:]
	put16(m[0:], 1)
	put16(m[2:], EtherTypeIPv4)
	m[4], m[5] = 6, 4
	put16(m[6:], a.Op)
	copy(m[8:14], a.SenderMAC[:])
	put4(m[14:18], a.SenderIP)
	copy(m[18:24], a.TargetMAC[:])
	put4(m[24:28], a.TargetIP)
	return dst
}

// put4 writes a as 4 bytes, or zeros if it is not IPv4 (or IPv4-mapped IPv6).
func put4(b []byte, a netip.Addr) {
	a = a.Unmap()
	if !a.Is4() {
		clear(b[:4])
		return
	}
	v := a.As4()
	copy(b, v[:])
}
