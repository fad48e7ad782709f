package wire

import (
	"encoding/binary"
	"math/bits"
)

// Checksum returns the Internet checksum (RFC 1071) of b: the one's complement sum of
// its 16-bit big-endian words, starting from initial (a partial sum such as a pseudo
// header's), folded to 16 bits and inverted. An odd final byte is padded with zero.
// Over bytes that include a correct checksum field the result is 0.
func Checksum(b []byte, initial uint32) uint16 {
	return ^Fold(Sum(b, uint64(initial)))
}

// Sum adds b, as big-endian 16-bit words, to the unfolded one's complement accumulator
// s and returns the new accumulator; an odd final byte is padded with zero. It sums 8
// bytes at a time with end-around carry: since 2^16 ≡ 1 modulo 0xffff this folds to the
// same value as word-by-word summation.
func Sum(b []byte, s uint64) uint64 {
	var c uint64
	for len(b) >= 32 {
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[0:]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[8:]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[16:]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[24:]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	if len(b) >= 4 {
		s, c = bits.Add64(s, uint64(binary.BigEndian.Uint32(b)), c)
		b = b[4:]
	}
	if len(b) >= 2 {
		s, c = bits.Add64(s, uint64(binary.BigEndian.Uint16(b)), c)
		b = b[2:]
	}
	if len(b) == 1 {
		s, c = bits.Add64(s, uint64(b[0])<<8, c)
	}
	// s ≤ 2^64-2 whenever c is 1, so this cannot overflow.
	return s + c
}

// Fold folds a 64-bit one's complement accumulator (from [Sum], or any sum of 16- and
// 32-bit words) to 16 bits, not inverted.
func Fold(s uint64) uint16 {
	s = s&0xffffffff + s>>32 // ≤ 2^33
	s = s&0xffffffff + s>>32 // ≤ 2^32
	s = s&0xffff + s>>16     // ≤ 2^17
	s = s&0xffff + s>>16
	s = s&0xffff + s>>16
	return uint16(s)
}
