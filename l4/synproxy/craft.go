package synproxy

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/wire"
)

// ErrNoRoom reports a buffer too short for the segment to be written.
var ErrNoRoom = errors.New("synproxy: no room in the buffer")

// ErrNotIP reports a packet description that is not a TCP segment over IPv4 or IPv6
// within the buffer.
var ErrNotIP = errors.New("synproxy: not a TCP/IP packet")

// replyTTL is the TTL or hop limit of the segments the LD writes, as a host sends.
const replyTTL = 64

// Handshake options: the longest set written is MSS (4), SACK-permitted with
// timestamps (12) and NOP + window scale (4).
const maxOptLen = 20

// synOptions are the options of a SYN or SYN-ACK the LD writes.
type synOptions struct {
	mss       uint16
	wscale    uint8
	hasWScale bool
	sack      bool
	hasTS     bool
	tsval     uint32
	tsecr     uint32
}

// put writes the options into b, padded to 4 bytes, and returns their length, in
// Linux's order: MSS, SACK-permitted with timestamps, window scale.
func (o *synOptions) put(b []byte) int {
	b[0], b[1] = optMSS, 4
	binary.BigEndian.PutUint16(b[2:], o.mss)
	n := 4
	if o.hasTS {
		if o.sack {
			b[n], b[n+1] = optSACKPerm, 2
		} else {
			b[n], b[n+1] = optNOP, optNOP
		}
		b[n+2], b[n+3] = optTS, 10
		binary.BigEndian.PutUint32(b[n+4:], o.tsval)
		binary.BigEndian.PutUint32(b[n+8:], o.tsecr)
		n += 12
	} else if o.sack {
		b[n], b[n+1], b[n+2], b[n+3] = optNOP, optNOP, optSACKPerm, 2
		n += 4
	}
	if o.hasWScale {
		b[n], b[n+1], b[n+2], b[n+3] = optNOP, optWScale, 3, o.wscale
		n += 4
	}
	return n
}

// putTCP writes a TCP header with options opts (already in place after 20 bytes) of
// optLen bytes, and its checksum for the pseudo header src → dst.
func putTCP(t []byte, sport, dport uint16, seq, ack uint32, flags uint8, win uint16, optLen int, src, dst netip.Addr) int {
	n := 20 + optLen
	binary.BigEndian.PutUint16(t[0:], sport)
	binary.BigEndian.PutUint16(t[2:], dport)
	binary.BigEndian.PutUint32(t[4:], seq)
	binary.BigEndian.PutUint32(t[8:], ack)
	t[12] = byte(n/4) << 4
	t[13] = flags
	binary.BigEndian.PutUint16(t[14:], win)
	binary.BigEndian.PutUint16(t[16:], 0)
	binary.BigEndian.PutUint16(t[18:], 0)
	binary.BigEndian.PutUint16(t[16:], wire.Checksum(t[:n], packet.PseudoHeaderSum(src, dst, packet.ProtoTCP, n)))
	return n
}

// putIP writes an IP header without options or extension headers at b (IPv4 with DF
// set) and returns its length.
func putIP(b []byte, src, dst netip.Addr, payload int, ttl uint8, id uint16) int {
	if src.Is4() {
		b[0], b[1] = 0x45, 0
		binary.BigEndian.PutUint16(b[2:], uint16(packet.IPv4Len+payload))
		binary.BigEndian.PutUint16(b[4:], id)
		binary.BigEndian.PutUint16(b[6:], 0x4000)
		b[8], b[9] = ttl, packet.ProtoTCP
		binary.BigEndian.PutUint16(b[10:], 0)
		s, d := src.As4(), dst.As4()
		copy(b[12:16], s[:])
		copy(b[16:20], d[:])
		binary.BigEndian.PutUint16(b[10:], wire.Checksum(b[:packet.IPv4Len], 0))
		return packet.IPv4Len
	}
	b[0], b[1], b[2], b[3] = 6<<4, 0, 0, 0
	binary.BigEndian.PutUint16(b[4:], uint16(payload))
	b[6], b[7] = packet.ProtoTCP, ttl
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	return packet.IPv6Len
}

func ipLen(v6 bool) int {
	if v6 {
		return packet.IPv6Len
	}
	return packet.IPv4Len
}

// tcpPacket checks that p describes an unfragmented TCP segment over IPv4 or IPv6
// within b.
func tcpPacket(b []byte, p *packet.Packet) bool {
	v6 := p.EtherType == packet.EtherTypeIPv6
	if !v6 && p.EtherType != packet.EtherTypeIPv4 || p.Proto != packet.ProtoTCP || p.Fragment {
		return false
	}
	return p.L3 >= 0 && p.L4 >= p.L3+ipLen(v6) && p.End <= len(b) && p.End-p.L4 >= 20 &&
		p.Src.Is4() != v6 && p.Dst.Is4() != v6
}

// SynAck is the LD's answer to a client's SYN.
type SynAck struct {
	// Cookie is the SYN-ACK's sequence number (Keys.Cookie).
	Cookie uint32
	// MSS is the MSS the LD advertises.
	MSS uint16
	// Window is the (unscaled) window of the SYN-ACK.
	Window uint16
	// WScale is the LD's window scale, sent when the client offered window scaling
	// and timestamps.
	WScale uint8
	// TSval is the LD's TSval (CookieTSval), sent when the client sent timestamps.
	TSval uint32
	// SrcMAC is the LD's MAC on the port the SYN came in on.
	SrcMAC packet.MAC
	// IPID is the IPv4 identification.
	IPID uint16
}

// WriteSynAck turns the client's SYN in frame (an Ethernet frame, parsed into p, whose
// options are o) into the LD's SYN-ACK in place: back to the frame's source MAC, from
// the VIP to the client, with a's sequence number and options (MSS always; window
// scale, SACK-permitted and timestamps only when the client sent timestamps, as Linux
// answers with a cookie), checksums computed. frame may extend past the SYN (the
// buffer's room): the answer can be longer. It returns the answer's length.
func WriteSynAck(frame []byte, p *packet.Packet, o *Options, a *SynAck) (int, error) {
	if !tcpPacket(frame, p) || p.L3 < packet.EthernetLen {
		return 0, ErrNotIP
	}
	v6 := p.EtherType == packet.EtherTypeIPv6
	l4 := p.L3 + ipLen(v6)
	if l4+20+maxOptLen > len(frame) {
		return 0, ErrNoRoom
	}
	t := frame[p.L4:]
	sport, dport := binary.BigEndian.Uint16(t[0:]), binary.BigEndian.Uint16(t[2:])
	isn := binary.BigEndian.Uint32(t[4:])
	so := synOptions{mss: a.MSS}
	if o.HasTS() {
		so.hasTS, so.tsval, so.tsecr = true, a.TSval, o.TSval
		so.sack = o.SACKPerm
		so.hasWScale, so.wscale = o.HasWScale, min(a.WScale, MaxWScale)
	}
	// The options are written first, where the new TCP header's end will be: the
	// client's header may overlap, and its values are read above.
	var opts [maxOptLen]byte
	n := so.put(opts[:])
	copy(frame[l4+20:], opts[:n])
	for i := range 6 {
		frame[i], frame[6+i] = frame[6+i], a.SrcMAC[i]
	}
	tl := putTCP(frame[l4:], dport, sport, a.Cookie, isn+1, packet.TCPSyn|packet.TCPAck, a.Window, n, p.Dst, p.Src)
	putIP(frame[p.L3:], p.Dst, p.Src, tl, replyTTL, a.IPID)
	return l4 + tl, nil
}

// Syn is the SYN the LD sends a member for a client whose cookie checked.
type Syn struct {
	// ISN is the client's initial sequence number.
	ISN uint32
	// Window is the SYN's window.
	Window uint16
	// MSS is the client's MSS as the cookie kept it (clamped for the tunnel).
	MSS uint16
	// Negotiated is what the client's SYN offered, from the cookie's TSval.
	Negotiated
	// HasTS, TSval: the client's timestamps, from its ACK.
	HasTS bool
	TSval uint32
}

// WriteSyn turns the client's ACK in b (an Ethernet frame or a buffer holding an IP
// packet at p.L3, parsed into p) into the SYN to the member in place: the same
// addresses, ports and IP header (options and extension headers kept), sequence
// number s.ISN, the client's options, no payload; checksums computed. b may extend
// past the packet (room for the SYN's options). It returns the offset just past the
// SYN (the packet's new End).
func WriteSyn(b []byte, p *packet.Packet, s *Syn) (int, error) {
	if !tcpPacket(b, p) {
		return 0, ErrNotIP
	}
	if p.L4+20+maxOptLen > len(b) {
		return 0, ErrNoRoom
	}
	t := b[p.L4:]
	sport, dport := binary.BigEndian.Uint16(t[0:]), binary.BigEndian.Uint16(t[2:])
	so := synOptions{mss: s.MSS, sack: s.SACK && s.HasTS}
	if s.HasTS {
		so.hasTS, so.tsval = true, s.TSval
		so.hasWScale, so.wscale = s.HasWScale, s.WScale
	}
	n := so.put(t[20:])
	tl := putTCP(t, sport, dport, s.ISN, 0, packet.TCPSyn, s.Window, n, p.Src, p.Dst)
	end := p.L4 + tl
	ip := b[p.L3:]
	if p.EtherType == packet.EtherTypeIPv6 {
		binary.BigEndian.PutUint16(ip[4:], uint16(end-p.L3-packet.IPv6Len))
	} else {
		ihl := int(ip[0]&0x0f) * 4
		binary.BigEndian.PutUint16(ip[2:], uint16(end-p.L3))
		binary.BigEndian.PutUint16(ip[10:], 0)
		binary.BigEndian.PutUint16(ip[10:], wire.Checksum(ip[:ihl], 0))
	}
	return end, nil
}

// Ack is the ACK that completes a member's handshake, in the client's name.
type Ack struct {
	Seq, Ack uint32
	Window   uint16
	HasTS    bool
	// TSval and TSecr, when HasTS: the client's last TSval, the member's TSval.
	TSval, TSecr uint32
	IPID         uint16
}

// WriteAck turns the member's SYN-ACK in b (an IP packet at ip.L3, parsed into ip,
// from the VIP to the client) into the client's ACK to the member in place: from the
// client to the VIP, a's numbers and timestamps, no payload; checksums computed. It
// returns the offset just past the ACK (its End).
func WriteAck(b []byte, ip *packet.Packet, a *Ack) (int, error) {
	if !tcpPacket(b, ip) {
		return 0, ErrNotIP
	}
	v6 := ip.EtherType == packet.EtherTypeIPv6
	l4 := ip.L3 + ipLen(v6)
	if l4+32 > len(b) {
		return 0, ErrNoRoom
	}
	t := b[ip.L4:]
	sport, dport := binary.BigEndian.Uint16(t[0:]), binary.BigEndian.Uint16(t[2:])
	n := 0
	var opts [12]byte
	if a.HasTS {
		opts[0], opts[1], opts[2], opts[3] = optNOP, optNOP, optTS, 10
		binary.BigEndian.PutUint32(opts[4:], a.TSval)
		binary.BigEndian.PutUint32(opts[8:], a.TSecr)
		n = 12
	}
	copy(b[l4+20:], opts[:n])
	tl := putTCP(b[l4:], dport, sport, a.Seq, a.Ack, packet.TCPAck, a.Window, n, ip.Dst, ip.Src)
	putIP(b[ip.L3:], ip.Dst, ip.Src, tl, replyTTL, a.IPID)
	return l4 + tl, nil
}
