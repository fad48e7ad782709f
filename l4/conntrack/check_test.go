package conntrack

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// testHash is a seeded wyhash-style hash of a key, like the datapath's flow hash.
func testHash(k *Key) uint64 {
	a := binary.LittleEndian.Uint64(k.Client[:8])
	b := binary.LittleEndian.Uint64(k.Client[8:])
	c := uint64(k.ClientPort)<<16 | uint64(k.Rule)
	mum := func(x, y uint64) uint64 { hi, lo := bits.Mul64(x, y); return hi ^ lo }
	h := mum(a^0xa0761d6478bd642f, b^0xe7037ed1a0b428db)
	return mum(h^c^0x8ebc6af09c88c6e3, 0x589965cc75374cc3)
}

// testKey returns a distinct IPv4-mapped key for each i.
func testKey(i int) Key {
	var k Key
	k.Client[10], k.Client[11] = 0xff, 0xff
	binary.BigEndian.PutUint32(k.Client[12:], 0x0a000000|uint32(i>>8))
	k.ClientPort = uint16(1024 + i&0xff)
	k.Rule = uint16(i % 3)
	return k
}

// check verifies every structural invariant of the table; hash is the hash the caller
// used.
func (t *Table) check(hash func(*Key) uint64) error {
	live := map[uint32]bool{}
	// Chains: every entry reachable from its bucket, ending in the bucket's mark, each
	// link carrying its entry's tag and, exactly when the entry ends the chain, lastBit.
	for b := range t.buckets {
		v := t.buckets[b]
		if v != 0 && int32(v) < 0 && v != endMark|uint32(b) {
			return fmt.Errorf("bucket %d is empty with mark %#x", b, v)
		}
		for int32(v) > 0 {
			i := v & idxMask
			if i == 0 || i > t.used {
				return fmt.Errorf("bucket %d: chain reaches entry %d (%d used)", b, i, t.used)
			}
			if live[i] {
				return fmt.Errorf("bucket %d: entry %d chained twice (loop?)", b, i)
			}
			live[i] = true
			e := &t.entries[i]
			if e.state < StateSynRecv || e.state > StateUnconfirmed {
				return fmt.Errorf("entry %d in bucket %d has state %d", i, b, e.state)
			}
			h := hash(&e.key)
			if uint64(b) != h&t.mask {
				return fmt.Errorf("entry %d in bucket %d, hashes to %d", i, b, h&t.mask)
			}
			if v&tagMask != tagOf(h) {
				return fmt.Errorf("link to entry %d has tag %#x, want %#x", i, v&tagMask, tagOf(h))
			}
			if (v&lastBit != 0) != (int32(e.chain) <= 0) {
				return fmt.Errorf("link to entry %d: last bit %v, chain %#x", i, v&lastBit != 0, e.chain)
			}
			v = e.chain
		}
		if int32(t.buckets[b]) > 0 && v != endMark|uint32(b) {
			return fmt.Errorf("bucket %d: chain ends with %#x", b, v)
		}
	}
	if len(live) != t.n {
		return fmt.Errorf("%d entries chained, Len %d", len(live), t.n)
	}
	// Lists: every live entry on exactly one list, in the right kind of list.
	listed := map[uint32]bool{}
	// fifo is the state of the entries of list s, sorted by expiry, or 0 for a wheel
	// slot (any other state).
	walk := func(s uint32, fifo State) error {
		prev := s
		var lastExp uint32
		for i := t.entries[s].next; i != s; i = t.entries[i].next {
			if t.entries[i].prev != prev {
				return fmt.Errorf("list %d: entry %d prev %d, want %d", s, i, t.entries[i].prev, prev)
			}
			if !live[i] || listed[i] {
				return fmt.Errorf("list %d: entry %d live=%v listed=%v", s, i, live[i], listed[i])
			}
			listed[i] = true
			e := &t.entries[i]
			if fifo != 0 && e.state != fifo || fifo == 0 && (e.state == StateSynRecv || e.state == StateUnconfirmed) {
				return fmt.Errorf("list %d (FIFO of %v): entry %d in state %v", s, fifo, i, e.state)
			}
			if fifo != 0 && prev != s && int32(e.expire-lastExp) < 0 {
				return fmt.Errorf("%v FIFO not sorted by expiry at entry %d", fifo, i)
			}
			lastExp = e.expire
			prev = i
		}
		if t.entries[s].prev != prev {
			return fmt.Errorf("list %d: tail %d, want %d", s, t.entries[s].prev, prev)
		}
		return nil
	}
	if err := walk(t.synList, StateSynRecv); err != nil {
		return err
	}
	if len(listed) != t.halfOpen {
		return fmt.Errorf("%d entries in the half-open FIFO, HalfOpen %d", len(listed), t.halfOpen)
	}
	if err := walk(t.unconfList, StateUnconfirmed); err != nil {
		return err
	}
	if len(listed) != t.halfOpen+t.unconfirmed {
		return fmt.Errorf("%d entries in the unconfirmed FIFO, Unconfirmed %d", len(listed)-t.halfOpen, t.unconfirmed)
	}
	for s := t.pending; s < uint32(len(t.entries)); s++ {
		if err := walk(s, 0); err != nil {
			return err
		}
	}
	if len(listed) != t.n {
		return fmt.Errorf("%d entries listed, Len %d", len(listed), t.n)
	}
	// Free list and member counts.
	free := 0
	for i := t.free; i != 0; i = t.entries[i].next {
		if live[i] || i > t.used || t.entries[i].state != 0 {
			return fmt.Errorf("free list holds entry %d (live %v, state %d)", i, live[i], t.entries[i].state)
		}
		free++
		if free > int(t.capacity) {
			return fmt.Errorf("free list loops")
		}
	}
	if free+t.n != int(t.used) {
		return fmt.Errorf("%d free + %d live != %d used", free, t.n, t.used)
	}
	var counts [1 << 16]uint32
	for i := range live {
		counts[t.entries[i].member]++
	}
	if counts != *t.counts {
		return fmt.Errorf("member counts differ from the entries")
	}
	return nil
}
