package synproxy

import (
	"encoding/binary"
	"math/bits"

	"github.com/tiergate/tiergate/l4/packet"
)

// tcpCsum is the offset of the checksum in the TCP header.
const tcpCsum = 16

// Delta is what a proxied connection translates: the member's sequence numbers are
// SeqDelta above the client's view (the member's ISN less the cookie), its timestamps
// TSDelta below (the cookie's TSval less the member's), and its windows are scaled by
// WShift more than the client expects (the member's window scale less the LD's).
type Delta struct {
	SeqDelta uint32
	TSDelta  uint32
	WShift   int8
}

// csum accumulates the changes of a segment's words for one update of its checksum
// (RFC 1624, equation 3, summed over the changed words).
type csum uint64

// word adds a 16-bit value at offset off changing from old to new.
func (c *csum) word(off int, old, new uint16) {
	if off&1 != 0 {
		old, new = bits.ReverseBytes16(old), bits.ReverseBytes16(new)
	}
	*c += csum(^old) + csum(new)
}

// set32 writes v at t[off:] and adds the change.
func (c *csum) set32(t []byte, off int, v uint32) {
	old := binary.BigEndian.Uint32(t[off:])
	binary.BigEndian.PutUint32(t[off:], v)
	c.word(off, uint16(old>>16), uint16(v>>16))
	c.word(off+2, uint16(old), uint16(v))
}

// apply folds the changes into the checksum of segment t.
func (c csum) apply(t []byte) {
	s := uint64(^binary.BigEndian.Uint16(t[tcpCsum:])) + uint64(c)
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	binary.BigEndian.PutUint16(t[tcpCsum:], ^uint16(s))
}

// tsOnly reports whether t's options are Linux's for a data segment, NOP NOP and the
// timestamps, and nothing else (the TSval then at offset 24).
func tsOnly(t []byte) bool {
	return len(t) >= 32 && t[12]>>4 == 8 && binary.BigEndian.Uint32(t[20:]) == 0x0101080a
}

// ToClient rewrites a member's segment t (the TCP header and what follows, its
// checksum correct) for the client: sequence number, TSval, window; the checksum is
// updated incrementally. It reports ErrHeader or ErrOptions, having changed nothing,
// when t is not a TCP segment whose options parse.
func (d *Delta) ToClient(t []byte) error {
	ts := 24
	if !tsOnly(t) {
		var o Options
		if err := ParseOptions(t, &o); err != nil {
			return err
		}
		ts = o.TSOff
	}
	var c csum
	c.set32(t, 4, binary.BigEndian.Uint32(t[4:])-d.SeqDelta)
	if ts != 0 {
		c.set32(t, ts, binary.BigEndian.Uint32(t[ts:])+d.TSDelta)
	}
	if d.WShift != 0 {
		old := binary.BigEndian.Uint16(t[14:])
		w := ScaleWindow(old, d.WShift)
		binary.BigEndian.PutUint16(t[14:], w)
		c.word(14, old, w)
	}
	c.apply(t)
	return nil
}

// ToMember rewrites a client's segment t for the member: acknowledgment number, SACK
// blocks (which acknowledge the member's data), TSecr; the checksum is updated
// incrementally. Errors as ToClient.
func (d *Delta) ToMember(t []byte) error {
	var o Options
	if tsOnly(t) {
		o.TSOff, o.TSecr = 24, binary.BigEndian.Uint32(t[28:])
	} else if err := ParseOptions(t, &o); err != nil {
		return err
	}
	var c csum
	if t[13]&packet.TCPAck != 0 {
		c.set32(t, 8, binary.BigEndian.Uint32(t[8:])+d.SeqDelta)
	}
	for i := range o.SACKBlocks {
		off := o.SACKOff + 8*i
		c.set32(t, off, binary.BigEndian.Uint32(t[off:])+d.SeqDelta)
		c.set32(t, off+4, binary.BigEndian.Uint32(t[off+4:])+d.SeqDelta)
	}
	if o.TSOff != 0 && o.TSecr != 0 {
		c.set32(t, o.TSOff+4, o.TSecr-d.TSDelta)
	}
	c.apply(t)
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
