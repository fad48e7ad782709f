package synproxy

import (
	"encoding/binary"
	"errors"
)

// TCP option kinds.
const (
	optEnd      = 0
	optNOP      = 1
	optMSS      = 2
	optWScale   = 3
	optSACKPerm = 4
	optSACK     = 5
	optTS       = 8
)

// MaxWScale is the largest window scale a TCP may use (RFC 7323 section 2.3).
const MaxWScale = 14

// ErrOptions reports a TCP option list that is not well formed: an option running
// past the header, a length below 2, or a known option of the wrong length.
var ErrOptions = errors.New("synproxy: malformed TCP options")

// ErrHeader reports bytes that are not a TCP header: shorter than 20 bytes or than its
// data offset.
var ErrHeader = errors.New("synproxy: truncated TCP header")

// Options are the TCP options of a segment the proxy reads or rewrites. Offsets are
// from the start of the TCP header, 0 when the option is absent.
type Options struct {
	MSS       uint16
	HasMSS    bool
	WScale    uint8 // as sent; a value above 14 is used as 14 (RFC 7323)
	HasWScale bool
	SACKPerm  bool
	// TSOff is the offset of the timestamp option's TSval (TSecr follows), and TSval
	// and TSecr its values.
	TSOff        int
	TSval, TSecr uint32
	// SACKOff is the offset of the first SACK block (8 bytes: left and right edge) and
	// SACKBlocks how many there are.
	SACKOff, SACKBlocks int
}

// HasTS reports whether the segment carries the timestamp option.
func (o *Options) HasTS() bool { return o.TSOff != 0 }

// ParseOptions parses the options of the TCP header at the start of tcp (the segment,
// or at least its header). A later option of a kind seen before replaces the first.
func ParseOptions(tcp []byte, o *Options) error {
	*o = Options{}
	if len(tcp) < 20 {
		return ErrHeader
	}
	doff := int(tcp[12]>>4) * 4
	if doff < 20 || doff > len(tcp) {
		return ErrHeader
	}
	for i := 20; i < doff; {
		kind := tcp[i]
		switch kind {
		case optEnd:
			return nil
		case optNOP:
			i++
			continue
		}
		if doff-i < 2 {
			return ErrOptions
		}
		n := int(tcp[i+1])
		if n < 2 || doff-i < n {
			return ErrOptions
		}
		switch kind {
		case optMSS:
			if n != 4 {
				return ErrOptions
			}
			o.MSS, o.HasMSS = binary.BigEndian.Uint16(tcp[i+2:]), true
		case optWScale:
			if n != 3 {
				return ErrOptions
			}
			o.WScale, o.HasWScale = min(tcp[i+2], MaxWScale), true
		case optSACKPerm:
			if n != 2 {
				return ErrOptions
			}
			o.SACKPerm = true
		case optTS:
			if n != 10 {
				return ErrOptions
			}
			o.TSOff = i + 2
			o.TSval = binary.BigEndian.Uint32(tcp[i+2:])
			o.TSecr = binary.BigEndian.Uint32(tcp[i+6:])
		case optSACK:
			if (n-2)%8 != 0 || n == 2 {
				return ErrOptions
			}
			o.SACKOff, o.SACKBlocks = i+2, (n-2)/8
		}
		i += n
	}
	return nil
}
