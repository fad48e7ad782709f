package tunnel

import (
	"encoding/binary"
	"net/netip"

	"github.com/tiergate/tiergate/wire"
)

// Packet builders for tests: correct headers and checksums, as a real LD or client
// would send.

func pseudoSum(src, dst netip.Addr, proto uint8, length int) uint32 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	sum += uint32(proto) + uint32(length)
	return sum
}

// ipPacket wraps payload (a transport header whose checksum field is at csumOff, or -1)
// in an IPv4 or IPv6 header, filling both checksums.
func ipPacket(src, dst netip.Addr, proto uint8, payload []byte, csumOff int) []byte {
	if csumOff >= 0 {
		binary.BigEndian.PutUint16(payload[csumOff:], 0)
		var init uint32
		if proto != protoICMP {
			init = pseudoSum(src, dst, proto, len(payload))
		}
		c := wire.Checksum(payload, init)
		if c == 0 && proto == protoUDP {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(payload[csumOff:], c)
	}
	if src.Is4() {
		h := make([]byte, 20, 20+len(payload))
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
		binary.BigEndian.PutUint16(h[4:], 0x1234)
		h[6] = 0x40 // DF
		h[8] = 64
		h[9] = proto
		copy(h[12:16], src.AsSlice())
		copy(h[16:20], dst.AsSlice())
		binary.BigEndian.PutUint16(h[10:], wire.Checksum(h, 0))
		return append(h, payload...)
	}
	h := make([]byte, 40, 40+len(payload))
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
	h[6] = proto
	h[7] = 64
	copy(h[8:24], src.AsSlice())
	copy(h[24:40], dst.AsSlice())
	return append(h, payload...)
}

// tcpPacket builds a TCP segment with the given flags (SYNs carry an MSS option).
func tcpPacket(src netip.AddrPort, dst netip.AddrPort, seq, ack uint32, flags uint8, data []byte) []byte {
	hl := 20
	if flags&tcpSYN != 0 {
		hl = 24
	}
	t := make([]byte, hl, hl+len(data))
	binary.BigEndian.PutUint16(t[0:], src.Port())
	binary.BigEndian.PutUint16(t[2:], dst.Port())
	binary.BigEndian.PutUint32(t[4:], seq)
	binary.BigEndian.PutUint32(t[8:], ack)
	t[12] = byte(hl/4) << 4
	t[13] = flags
	binary.BigEndian.PutUint16(t[14:], 65535)
	if hl == 24 {
		copy(t[20:], []byte{2, 4, 0x05, 0x8c}) // MSS 1420
	}
	t = append(t, data...)
	return ipPacket(src.Addr(), dst.Addr(), protoTCP, t, 16)
}

func udpPacket(src, dst netip.AddrPort, data []byte) []byte {
	u := make([]byte, 8, 8+len(data))
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(data)))
	u = append(u, data...)
	return ipPacket(src.Addr(), dst.Addr(), protoUDP, u, 6)
}

// icmpError builds an ICMPv4 destination unreachable quoting quote.
func icmpError(src, dst netip.Addr, quote []byte) []byte {
	m := append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, quote...)
	return ipPacket(src, dst, protoICMP, m, 2)
}

// greWrap prepends a GRE header (with a key and checksum when asked).
func greWrap(inner []byte, key, csum bool) []byte {
	var flags uint16
	hl := 4
	if csum {
		flags |= wire.GREChecksum
		hl += 4
	}
	if key {
		flags |= wire.GREKey
		hl += 4
	}
	g := make([]byte, hl, hl+len(inner))
	binary.BigEndian.PutUint16(g[0:], flags)
	binary.BigEndian.PutUint16(g[2:], wire.GREProtocol(inner[0]>>4 == 6))
	if key {
		binary.BigEndian.PutUint32(g[hl-4:], 0xdeadbeef)
	}
	g = append(g, inner...)
	if csum {
		binary.BigEndian.PutUint16(g[4:], wire.Checksum(g, 0))
	}
	return g
}

// outerIPv4 wraps a tunnel payload in an outer IPv4 header, as a raw socket returns it.
func outerIPv4(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	return ipPacket(src, dst, proto, payload, -1)
}
