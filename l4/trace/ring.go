package trace

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"
)

// Kind is what a record is.
type Kind uint8

const (
	KindTrace Kind = iota + 1 // a trace point: the packet went on (or was answered)
	KindDrop                  // a drop point: the packet was dropped
)

func (k Kind) String() string {
	switch k {
	case KindTrace:
		return "trace"
	case KindDrop:
		return "drop"
	}
	return "unknown"
}

// Entry is one record as a worker writes it and a reader gets it back. Dir, Result
// and Hop are the caller's codes (the datapath's direction, result and member ID); LD
// and HopName point at strings that must not change (the reader gets the same
// pointers back).
type Entry struct {
	Time    int64 // Unix nanoseconds
	Kind    Kind
	Dir     uint8
	Result  uint8
	Proto   uint8
	Hop     uint16 // member ID, when HopName is set
	SrcPort uint16
	DstPort uint16
	Len     uint16 // the packet's length in bytes
	Src     netip.Addr
	Dst     netip.Addr
	HopAddr netip.Addr // the member's tunnel address
	LD      *string
	HopName *string
	// Sample is (the first bytes of) the packet; Put copies at most the ring's
	// sample size of it.
	Sample []byte
}

// Ring is one worker's records: a fixed ring of slots that the worker overwrites,
// oldest first. Put (the worker's only) takes no lock and allocates nothing; Read
// (any goroutine) copies the records under each slot's sequence number, skipping a
// slot the worker is rewriting. Every word is an atomic, so readers and the writer
// never race (and the race detector agrees).
type Ring struct {
	slots  int
	stride int // words per slot: the sequence, the header, the sample
	sample int // bytes of sample kept
	words  []atomic.Uint64
	ptrs   []atomic.Pointer[string] // 2 per slot: LD, HopName
	next   atomic.Uint64            // records written so far
}

// hdrWords is the fixed part of a slot after its sequence word.
const hdrWords = 9

// NewRing makes a ring of records slots keeping sample bytes of each packet.
func NewRing(records, sample int) *Ring {
	records = max(1, records)
	sample = max(0, min(sample, MaxSampleBytes))
	r := &Ring{slots: records, sample: sample, stride: 1 + hdrWords + (sample+7)/8}
	r.words = make([]atomic.Uint64, records*r.stride)
	r.ptrs = make([]atomic.Pointer[string], 2*records)
	return r
}

// Size is how many records the ring keeps, SampleBytes how much of each packet.
func (r *Ring) Size() int        { return r.slots }
func (r *Ring) SampleBytes() int { return r.sample }

// Bytes is the ring's memory, for documentation and tests.
func (r *Ring) Bytes() int { return len(r.words)*8 + len(r.ptrs)*8 }

// Written is how many records were put so far (older ones are overwritten).
func (r *Ring) Written() uint64 { return r.next.Load() }

func family(a netip.Addr) uint64 {
	switch {
	case a.Is4():
		return 1
	case a.IsValid():
		return 2
	}
	return 0
}

func putAddr(w []atomic.Uint64, a netip.Addr) {
	b := a.As16()
	if !a.IsValid() {
		b = [16]byte{}
	}
	w[0].Store(binary.BigEndian.Uint64(b[:8]))
	w[1].Store(binary.BigEndian.Uint64(b[8:]))
}

func getAddr(w []atomic.Uint64, fam uint64) netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], w[0].Load())
	binary.BigEndian.PutUint64(b[8:], w[1].Load())
	a := netip.AddrFrom16(b)
	switch fam {
	case 1:
		return a.Unmap()
	case 2:
		return a
	}
	return netip.Addr{}
}

// Put writes e over the oldest record. Only one goroutine (the worker) may call it.
func (r *Ring) Put(e *Entry) {
	n := r.next.Load()
	i := int(n % uint64(r.slots))
	w := r.words[i*r.stride : (i+1)*r.stride]
	// Odd while being written; 2(n+1) once record n is whole.
	w[0].Store(2*n + 1)
	hasHop := uint64(0)
	if e.HopName != nil {
		hasHop = 1
	}
	w[1].Store(uint64(e.Time))
	w[2].Store(uint64(e.Kind) | uint64(e.Dir)<<8 | uint64(e.Result)<<16 | uint64(e.Proto)<<24 |
		uint64(e.Hop)<<32 | (hasHop|family(e.Src)<<1|family(e.Dst)<<3|family(e.HopAddr)<<5)<<48)
	sn := min(len(e.Sample), r.sample)
	w[3].Store(uint64(e.SrcPort) | uint64(e.DstPort)<<16 | uint64(e.Len)<<32 | uint64(sn)<<48)
	putAddr(w[4:6], e.Src)
	putAddr(w[6:8], e.Dst)
	putAddr(w[8:10], e.HopAddr)
	s := w[1+hdrWords:]
	for j := 0; j < sn; j += 8 {
		var b [8]byte
		copy(b[:], e.Sample[j:sn])
		s[j/8].Store(binary.BigEndian.Uint64(b[:]))
	}
	r.ptrs[2*i].Store(e.LD)
	r.ptrs[2*i+1].Store(e.HopName)
	w[0].Store(2*n + 2)
	r.next.Store(n + 1)
}

// Read appends the records in the ring to dst, newest first, at most limit of
// them (limit ≤ 0: all). A record being overwritten while it is read is left out.
// Each Entry's Sample is a new slice.
func (r *Ring) Read(dst []Entry, limit int) []Entry {
	n := r.next.Load()
	if limit <= 0 || limit > r.slots {
		limit = r.slots
	}
	for k := uint64(0); k < uint64(limit) && k < n; k++ {
		idx := n - 1 - k
		if e, ok := r.read(idx); ok {
			dst = append(dst, e)
		}
	}
	return dst
}

// read copies record idx, reporting false when its slot no longer (or not yet)
// holds it whole.
func (r *Ring) read(idx uint64) (Entry, bool) {
	i := int(idx % uint64(r.slots))
	w := r.words[i*r.stride : (i+1)*r.stride]
	want := 2*idx + 2
	if w[0].Load() != want {
		return Entry{}, false
	}
	var e Entry
	e.Time = int64(w[1].Load())
	h := w[2].Load()
	e.Kind, e.Dir, e.Result, e.Proto = Kind(h), uint8(h>>8), uint8(h>>16), uint8(h>>24)
	e.Hop = uint16(h >> 32)
	flags := h >> 48
	p := w[3].Load()
	e.SrcPort, e.DstPort, e.Len = uint16(p), uint16(p>>16), uint16(p>>32)
	sn := min(int(p>>48), r.sample)
	e.Src = getAddr(w[4:6], flags>>1&3)
	e.Dst = getAddr(w[6:8], flags>>3&3)
	e.HopAddr = getAddr(w[8:10], flags>>5&3)
	if sn > 0 {
		buf := make([]byte, (sn+7)/8*8)
		s := w[1+hdrWords:]
		for j := 0; j < sn; j += 8 {
			binary.BigEndian.PutUint64(buf[j:], s[j/8].Load())
		}
		e.Sample = buf[:sn]
	}
	e.LD = r.ptrs[2*i].Load()
	if flags&1 != 0 {
		e.HopName = r.ptrs[2*i+1].Load()
	}
	if w[0].Load() != want {
		return Entry{}, false
	}
	return e, true
}
