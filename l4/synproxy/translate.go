package synproxy

import (
	"encoding/binary"
	"math/bits"

	"github.com/tiergate/tiergate/l4/packet"
)

// tcpCsum is the offset of the checksum in the TCP header.
const tcpCsum = 16

// adjust16 updates the TCP checksum of segment t for the 16-bit value at off changing
// from old to new. A value at an odd offset straddles two checksum words and counts
// with its bytes swapped.
func adjust16(t []byte, off int, old, new uint16) {
	if old == new {
		return
	}
	if off&1 != 0 {
		old, new = bits.ReverseBytes16(old), bits.ReverseBytes16(new)
	}
	binary.BigEndian.PutUint16(t[tcpCsum:], packet.ChecksumAdjust16(binary.BigEndian.Uint16(t[tcpCsum:]), old, new))
}

// set32 writes v at t[off:] and updates the TCP checksum of segment t for it.
func set32(t []byte, off int, v uint32) {
	old := binary.BigEndian.Uint32(t[off:])
	binary.BigEndian.PutUint32(t[off:], v)
	adjust16(t, off, uint16(old>>16), uint16(v>>16))
	adjust16(t, off+2, uint16(old), uint16(v))
}

// set16 writes v at t[off:] and updates the TCP checksum of segment t for it.
func set16(t []byte, off int, v uint16) {
	old := binary.BigEndian.Uint16(t[off:])
	binary.BigEndian.PutUint16(t[off:], v)
	adjust16(t, off, old, v)
}

// Delta is what a proxied connection translates: the member's sequence numbers are
// SeqDelta above the client's view (the member's ISN less the cookie), its timestamps
// TSDelta below (the cookie's TSval less the member's), and its windows are scaled by
// WShift more than the client expects (the member's window scale less the LD's).
type Delta struct {
	SeqDelta uint32
	TSDelta  uint32
	WShift   int8
}

// ToClient rewrites a member's segment t (the TCP header and what follows, its
// checksum correct) for the client: sequence number, TSval, window; the checksum is
// updated incrementally. It reports ErrHeader or ErrOptions, having changed nothing,
// when t is not a TCP segment whose options parse.
func (d *Delta) ToClient(t []byte) error {
	var o Options
	if err := ParseOptions(t, &o); err != nil {
		return err
	}
	set32(t, 4, binary.BigEndian.Uint32(t[4:])-d.SeqDelta)
	if o.TSOff != 0 {
		set32(t, o.TSOff, o.TSval+d.TSDelta)
	}
	if d.WShift != 0 {
		set16(t, 14, ScaleWindow(binary.BigEndian.Uint16(t[14:]), d.WShift))
	}
	return nil
}

// ToMember rewrites a client's segment t for the member: acknowledgment number, SACK
// blocks (which acknowledge the member's data), TSecr; the checksum is updated
// incrementally. Errors as ToClient.
func (d *Delta) ToMember(t []byte) error {
	var o Options
	if err := ParseOptions(t, &o); err != nil {
		return err
	}
	if t[13]&packet.TCPAck != 0 {
		set32(t, 8, binary.BigEndian.Uint32(t[8:])+d.SeqDelta)
	}
	for i := range o.SACKBlocks {
		off := o.SACKOff + 8*i
		set32(t, off, binary.BigEndian.Uint32(t[off:])+d.SeqDelta)
		set32(t, off+4, binary.BigEndian.Uint32(t[off+4:])+d.SeqDelta)
	}
	if o.TSOff != 0 && o.TSecr != 0 {
		set32(t, o.TSOff+4, o.TSecr-d.TSDelta)
	}
	return nil
}

// ScaleWindow converts a window field scaled by one shift to another shift more
// (shift > 0) or fewer, rounding down and saturating at 65535.
func ScaleWindow(w uint16, shift int8) uint16 {
	switch {
	case shift > 0:
		if shift >= 16 || uint32(w)<<shift > 0xffff {
			return 0xffff
		}
		return w << shift
	case shift < 0:
		if shift <= -16 {
			return 0
		}
		return w >> -shift
	}
	return w
}

// AddSeq32 adds delta to the 32-bit number at b[off:] and updates the Internet
// checksum at b[csum:], which covers b from its start, for it (an ICMP error's
// checksum and a quoted TCP header's sequence number). Nothing is done when the
// fields are not within b or overlap.
func AddSeq32(b []byte, off, csum int, delta uint32) {
	if off < 0 || csum < 0 || off+4 > len(b) || csum+2 > len(b) || off < csum+2 && off+4 > csum {
		return
	}
	old := binary.BigEndian.Uint32(b[off:])
	v := old + delta
	binary.BigEndian.PutUint32(b[off:], v)
	for i, pair := range [2][2]uint16{{uint16(old >> 16), uint16(v >> 16)}, {uint16(old), uint16(v)}} {
		o, n := pair[0], pair[1]
		if (off+2*i)&1 != 0 {
			o, n = bits.ReverseBytes16(o), bits.ReverseBytes16(n)
		}
		binary.BigEndian.PutUint16(b[csum:], packet.ChecksumAdjust16(binary.BigEndian.Uint16(b[csum:]), o, n))
	}
}
