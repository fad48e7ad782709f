package packet

import "math/bits"

// TCP option kinds ClampMSS walks.
const (
	tcpOptEnd = 0
	tcpOptNOP = 1
	tcpOptMSS = 2
)

// ClampMSS lowers the MSS option of a TCP SYN (or SYN-ACK) to max when it is larger,
// updating the TCP checksum incrementally, and reports whether it changed anything.
// A SYN without an MSS option is left alone (nothing is inserted), as is any segment
// that is not a SYN, a malformed option list, and max 0. b is the frame (or IP packet)
// and p its parse.
func ClampMSS(b []byte, p *Packet, max uint16) bool {
	if max == 0 || p.Proto != ProtoTCP || p.TCPFlags&TCPSyn == 0 || !l4Span(b, p, TCPLen) {
		return false
	}
	t := b[p.L4:p.End]
	doff := int(t[12]>>4) * 4
	if doff < TCPLen || doff > len(t) {
		return false
	}
	for i := TCPLen; i < doff; {
		kind := t[i]
		switch kind {
		case tcpOptEnd:
			return false
		case tcpOptNOP:
			i++
			continue
		}
		if doff-i < 2 {
			return false
		}
		n := int(t[i+1])
		if n < 2 || doff-i < n {
			return false
		}
		if kind == tcpOptMSS && n == 4 {
			old := be16(t[i+2:])
			if old <= max {
				return false
			}
			put16(t[i+2:], max)
			o, m := old, max
			if i&1 != 0 {
				// The value straddles two checksum words: its bytes count swapped.
				o, m = bits.ReverseBytes16(o), bits.ReverseBytes16(m)
			}
			put16(t[16:], ChecksumAdjust16(be16(t[16:]), o, m))
			return true
		}
		i += n
	}
	return false
}
