package packet

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/tiergate/tiergate/wire"
)

// EncapMode selects the tunnel header [Encap] writes.
type EncapMode uint8

const (
	// EncapGRE is the 4-byte GRE header of [wire.PutGRE] (RFC 2784: no checksum, key
	// or sequence number) whose protocol type is 0x0800 or 0x86DD by the inner packet's
	// version, or with [Encap.Key] the 8-byte one of [wire.PutGREKey]. The default.
	EncapGRE EncapMode = iota
	// EncapIPIP puts the inner packet directly after the outer IP header, with
	// protocol 4 for an IPv4 inner packet and 41 for IPv6 (RFC 2003, RFC 2473).
	EncapIPIP
)

// String returns "gre" or "ipip".
func (m EncapMode) String() string {
	switch m {
	case EncapGRE:
		return "gre"
	case EncapIPIP:
		return "ipip"
	}
	return fmt.Sprintf("EncapMode(%d)", uint8(m))
}

// defaultTunnelTTL is the outer TTL or hop limit when Encap.TTL is 0.
const defaultTunnelTTL = 64

// maxEncapHeader is the largest header an Encap writes: Ethernet, IPv6, GRE.
const maxEncapHeader = EthernetLen + IPv6Len + wire.GREKeyHeaderLen

// Encap describes the tunnel to one member: Ethernet, then an outer IPv4 or IPv6
// header from Src to Dst, then GRE (or nothing, for IPIP) before the untouched inner
// packet. Set the exported fields, call [Encap.Prepare] once, then share the Encap
// read-only among workers; change it only by preparing a new one.
type Encap struct {
	// Mode is the tunnel header; the zero value is GRE.
	Mode EncapMode
	// Src and Dst are the outer addresses (the distributor's internal address and the
	// member's); both IPv4 or both IPv6. Either family carries either inner family.
	Src, Dst netip.Addr
	// SrcMAC and DstMAC are the Ethernet addresses (this port's and the next hop's).
	SrcMAC, DstMAC MAC
	// TTL is the outer TTL or hop limit; 0 means 64.
	TTL uint8
	// Key, when not 0, is the GRE key (RFC 2890) every packet carries, the tunnel key
	// the L7 nodes check (and put on their replies). Only with EncapGRE: Prepare
	// refuses a key with IPIP, which has no field for one. Default 0: no key.
	Key uint32

	ready bool
	v6    bool
	ipLen int // outer IP header plus GRE, without Ethernet
	// tmpl[0] serves IPv4 inner packets, tmpl[1] IPv6 ones.
	tmpl [2][maxEncapHeader]byte
	// base is the unfolded sum of the outer IPv4 header template with total length,
	// ID, flags and checksum zero.
	base [2]uint32
}

// Overhead returns the bytes Write adds before the inner IP packet, Ethernet
// included: 38 (IPv4 outer, GRE), 34 (IPv4, IPIP), 58 (IPv6, GRE) or 54 (IPv6, IPIP),
// and 4 more for GRE with a Key.
// The inner family does not change it today; it is a parameter so callers need not
// care if a future mode differs. It is valid before Prepare.
func (e *Encap) Overhead(innerV6 bool) int {
	if e.ready {
		return EthernetLen + e.ipLen
	}
	n := EthernetLen + IPv4Len
	if e.Src.Is6() && !e.Src.Is4In6() {
		n = EthernetLen + IPv6Len
	}
	if e.Mode == EncapGRE {
		n += wire.SendLen(e.Key)
	}
	return n
}

// Prepare checks the configuration and precomputes the header templates. Call it once
// after setting the fields (per member or configuration change); afterwards the Encap
// is read-only and safe for concurrent use.
func (e *Encap) Prepare() error {
	e.ready = false
	if e.Mode != EncapGRE && e.Mode != EncapIPIP {
		return fmt.Errorf("packet: preparing encapsulation: unknown mode %d", e.Mode)
	}
	if !e.Src.IsValid() || !e.Dst.IsValid() {
		return errors.New("packet: preparing encapsulation: source and destination addresses are required")
	}
	if e.Key != 0 && e.Mode != EncapGRE {
		return fmt.Errorf("packet: preparing encapsulation: a tunnel key needs GRE, not %s", e.Mode)
	}
	src, dst := e.Src.Unmap(), e.Dst.Unmap()
	if src.Is4() != dst.Is4() {
		return fmt.Errorf("packet: preparing encapsulation: source %s and destination %s are of different families", e.Src, e.Dst)
	}
	if src.Zone() != "" || dst.Zone() != "" {
		return fmt.Errorf("packet: preparing encapsulation: zoned address in %s -> %s", e.Src, e.Dst)
	}
	e.v6 = src.Is6()
	ttl := e.TTL
	if ttl == 0 {
		ttl = defaultTunnelTTL
	}
	for i := range e.tmpl {
		innerV6 := i == 1
		h := e.tmpl[i][:]
		clear(h)
		copy(h[0:6], e.DstMAC[:])
		copy(h[6:12], e.SrcMAC[:])
		proto := uint8(wire.ProtoGRE)
		if e.Mode == EncapIPIP {
			proto = wire.IPIPProto(innerV6)
		}
		ip := h[EthernetLen:]
		n := IPv4Len
		if e.v6 {
			put16(h[12:], EtherTypeIPv6)
			ip[0] = 6 << 4
			ip[6] = proto
			ip[7] = ttl
			s, d := src.As16(), dst.As16()
			copy(ip[8:24], s[:])
			copy(ip[24:40], d[:])
			n = IPv6Len
		} else {
			put16(h[12:], EtherTypeIPv4)
			ip[0] = 4<<4 | IPv4Len/4
			ip[8] = ttl
			ip[9] = proto
			s, d := src.As4(), dst.As4()
			copy(ip[12:16], s[:])
			copy(ip[16:20], d[:])
			e.base[i] = uint32(wire.Fold(wire.Sum(ip[:IPv4Len], 0)))
		}
		if e.Mode == EncapGRE {
			wire.PutGREKey(ip[n:], wire.GREProtocol(innerV6), e.Key)
			n += wire.SendLen(e.Key)
		}
		e.ipLen = n
	}
	e.ready = true
	return nil
}

// Write puts Ethernet + outer IP (+ GRE) immediately before the inner IP packet at
// buf[inner:inner+innerLen] and returns the new frame start, inner - Overhead. It sets
// the outer IPv4 ID to id, the total (or payload) length, the header checksum
// (incrementally from the template) and DF, copied from the inner IPv4 header (set for
// an IPv6 inner packet). It fails with ErrNotPrepared before Prepare, ErrTruncated if
// the inner packet is not within buf, ErrUnsupported if it is not IPv4 or IPv6, and
// ErrNoRoom if inner < Overhead or the outer length would exceed 65535.
func (e *Encap) Write(buf []byte, inner, innerLen int, id uint16) (start int, err error) {
	if !e.ready {
		return 0, ErrNotPrepared
	}
	if inner < 0 || innerLen < IPv4Len || innerLen > len(buf)-inner {
		return 0, ErrTruncated
	}
	var i int
	var df uint16
	switch buf[inner] >> 4 {
	case 4:
		df = be16(buf[inner+6:]) & 0x4000
	case 6:
		i, df = 1, 0x4000
	default:
		return 0, ErrUnsupported
	}
	hl := EthernetLen + e.ipLen
	start = inner - hl
	if start < 0 {
		return 0, ErrNoRoom
	}
	if e.v6 {
		plen := e.ipLen - IPv6Len + innerLen
		if plen > 0xffff {
			return 0, ErrNoRoom
		}
		h := buf[start:inner]
		copy(h, e.tmpl[i][:hl])
		put16(h[EthernetLen+4:], uint16(plen))
		return start, nil
	}
	total := e.ipLen + innerLen
	if total > 0xffff {
		return 0, ErrNoRoom
	}
	h := buf[start:inner]
	copy(h, e.tmpl[i][:hl])
	ip := h[EthernetLen:]
	put16(ip[2:], uint16(total))
	put16(ip[4:], id)
	put16(ip[6:], df)
	s := uint64(e.base[i]) + uint64(total) + uint64(id) + uint64(df)
	put16(ip[10:], ^wire.Fold(s))
	return start, nil
}

// Decap checks that p, parsed from b by [Parse], is a tunnel packet by the rules of
// [wire.Decap], which l7d's end of the tunnel applies too, and returns the offset and
// length (up to p.End) of the inner IP packet. In short: GRE version 0 with no routing,
// strict source route, recursion or reserved bit, its checksum verified when present,
// protocol type 0x0800 or 0x86DD; IPIP (protocol 4) carrying IPv4 and protocol 41 IPv6;
// the inner version matching and its fixed header present. A refusal is the sentinel
// of this package named as wire's (ErrTruncated, ErrMalformed, ErrUnsupported,
// ErrChecksum). Fragments of the outer packet are ErrUnsupported.
func Decap(b []byte, p *Packet) (inner, innerLen int, err error) {
	if p.Fragment {
		return 0, 0, ErrUnsupported
	}
	if !l4Span(b, p, 0) {
		switch p.Proto {
		case ProtoGRE, ProtoIPIP, ProtoIPv6:
			return 0, 0, ErrTruncated
		}
		return 0, 0, ErrUnsupported
	}
	var t wire.Tunnel
	if err := wire.Decap(p.Proto, b[p.L4:p.End], &t); err != nil {
		return 0, 0, decapError(err)
	}
	inner = p.L4 + t.Inner
	return inner, p.End - inner, nil
}

// decapError is this package's sentinel for an error of wire.Decap.
func decapError(err error) error {
	switch err {
	case wire.ErrTruncated:
		return ErrTruncated
	case wire.ErrUnsupported:
		return ErrUnsupported
	case wire.ErrChecksum:
		return ErrChecksum
	}
	return ErrMalformed
}

// WriteEthernet writes a 14-byte Ethernet header at buf[start:start+14] (after
// [Decap], start = inner-14). It reports false, writing nothing, if that is not
// within buf.
func WriteEthernet(buf []byte, start int, dst, src MAC, etherType uint16) bool {
	if start < 0 || len(buf)-start < EthernetLen {
		return false
	}
	h := buf[start : start+EthernetLen]
	copy(h[0:6], dst[:])
	copy(h[6:12], src[:])
	put16(h[12:], etherType)
	return true
}

// DecTTL decrements the IPv4 TTL (adjusting the header checksum incrementally) or the
// IPv6 hop limit of the IP packet at b[off:]. It returns false, changing nothing, if
// the TTL is ≤ 1 or b[off:] does not hold an IPv4 or IPv6 fixed header.
func DecTTL(b []byte, off int) bool {
	if off < 0 || off >= len(b) {
		return false
	}
	h := b[off:]
	switch h[0] >> 4 {
	case 4:
		if len(h) < IPv4Len || h[8] <= 1 {
			return false
		}
		old := be16(h[8:])
		h[8]--
		put16(h[10:], ChecksumAdjust16(be16(h[10:]), old, be16(h[8:])))
		return true
	case 6:
		if len(h) < IPv6Len || h[7] <= 1 {
			return false
		}
		h[7]--
		return true
	}
	return false
}
