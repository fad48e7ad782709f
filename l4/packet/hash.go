package packet

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// Odd 64-bit constants (from wyhash) that FlowHash and PairHash mix in.
const (
	hashK0 = 0xa0761d6478bd642f
	hashK1 = 0xe7037ed1a0b428db
	hashK2 = 0x8ebc6af09c88c6e3
	hashK3 = 0x589965cc75374cc3
)

// mum multiplies a and b to 128 bits and folds the halves together (wyhash's mixer).
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// addrWords returns an address as two 64-bit words: an IPv4 address is its 4 bytes in
// the first word (and a family marker in the second), so IPv4 costs no more than it
// must and never collides with the IPv6 address ::a.b.c.d. A zone is ignored.
func addrWords(a netip.Addr) (uint64, uint64) {
	if a.Is4() {
		v := a.As4()
		return uint64(binary.BigEndian.Uint32(v[:])), 1 << 63
	}
	var buf [16]byte
	b := addrBytes(a, &buf)
	if len(b) != 16 {
		return 0, 0 // the zero Addr
	}
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}

// FlowHash returns a seeded 64-bit hash of p's (Src, Dst, SrcPort, DstPort, Proto),
// for consistent hashing and table sharding. It is not symmetric: swapping source and
// destination gives another value. It does not allocate.
func FlowHash(seed uint64, p *Packet) uint64 {
	s0, s1 := addrWords(p.Src)
	d0, d1 := addrWords(p.Dst)
	ports := uint64(p.SrcPort)<<32 | uint64(p.DstPort)<<16 | uint64(p.Proto)
	h := mum(s0^seed^hashK0, d0^hashK1)
	h ^= mum(s1^hashK2, d1^seed^hashK3)
	h = mum(h^hashK1, ports^hashK2)
	return mum(h^hashK0, seed^hashK3)
}

// PairHash returns a seeded 64-bit hash of an address pair, for traffic that has no
// ports (fragments). It is not symmetric. It does not allocate.
func PairHash(seed uint64, src, dst netip.Addr) uint64 {
	s0, s1 := addrWords(src)
	d0, d1 := addrWords(dst)
	h := mum(s0^seed^hashK0, d0^hashK1)
	h ^= mum(s1^hashK2, d1^seed^hashK3)
	return mum(h^hashK1, seed^hashK2)
}
