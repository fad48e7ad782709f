package sched

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// MaglevMinSize is the smallest table DefaultMaglevSize returns: the prime 65537.
const MaglevMinSize = 65537

// MaglevMaxSize bounds the table size NewMaglev accepts (2^25 slots, 64 MiB).
const MaglevMaxSize = 1 << 25

// maglevSlotsPerMember is how many slots DefaultMaglevSize gives each member at least.
const maglevSlotsPerMember = 256

// Errors returned (wrapped) by NewMaglev.
var (
	ErrLengthMismatch = errors.New("keys, weights and ids differ in length")
	ErrSizeNotPrime   = errors.New("table size is not prime")
	ErrSizeTooSmall   = errors.New("table size is smaller than the number of members")
	ErrSizeTooLarge   = errors.New("table size exceeds MaglevMaxSize")
	ErrDuplicateKey   = errors.New("duplicate member key")
)

// Maglev is an immutable Maglev lookup table (Eisenbud et al., NSDI 2016) over a pool's
// members, with weights. It is safe for concurrent Lookup from any number of goroutines.
//
// Each member's permutation of the table is seeded by its key only, and the members are
// filled in key order, so the table depends on the set of (key, weight, id) and not on
// the order the caller lists them in; two load distributors given the same pool build the
// same table. Weights follow Katran's weighted Maglev: in each filling round a member
// takes weight/maxWeight of a turn (accumulated across rounds), so the heaviest member
// takes a turn every round and each member's share of the slots is proportional to its
// weight. Removing a member moves little more than that member's share of the hash space.
type Maglev struct {
	table []uint16 // slot → member ID; nil when no member has weight > 0
	size  uint64
}

// DefaultMaglevSize returns the table size NewMaglev uses when given 0: the smallest
// prime ≥ max(65537, 256 × members). Every member then owns at least 256 slots at equal
// weights (2.5 times the Maglev paper's 100 × members floor), which keeps the rounding
// imbalance under 0.4 %, while pools of up to 256 members share the 65537-slot table
// (128 KiB, resident in L2).
func DefaultMaglevSize(members int) uint64 {
	n := uint64(MaglevMinSize)
	if members > 0 && uint64(members)*maglevSlotsPerMember > n {
		n = uint64(members) * maglevSlotsPerMember
	}
	return NextPrime(n)
}

// NewMaglev builds the lookup table. keys identify members stably (an address or a name)
// and seed their permutations; weights[i] ≥ 0 is member i's weight (0 = not scheduled:
// drained or down); ids[i] is the value Lookup returns for it. size must be prime and at
// least len(keys); 0 means DefaultMaglevSize(len(keys)). NewMaglev does not keep or
// modify the slices. Building costs O(size · log size) and allocates; do it off the
// packet path.
func NewMaglev(keys []string, weights []uint32, ids []uint16, size uint64) (*Maglev, error) {
	if len(keys) != len(weights) || len(keys) != len(ids) {
		return nil, fmt.Errorf("building maglev table: %w (%d keys, %d weights, %d ids)",
			ErrLengthMismatch, len(keys), len(weights), len(ids))
	}
	if size == 0 {
		size = DefaultMaglevSize(len(keys))
	}
	switch {
	case size > MaglevMaxSize:
		return nil, fmt.Errorf("building maglev table of %d slots: %w", size, ErrSizeTooLarge)
	case !IsPrime(size):
		return nil, fmt.Errorf("building maglev table of %d slots: %w", size, ErrSizeNotPrime)
	case size < uint64(len(keys)):
		return nil, fmt.Errorf("building maglev table of %d slots for %d members: %w",
			size, len(keys), ErrSizeTooSmall)
	}

	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(keys[a], keys[b]) })
	for i := 1; i < len(order); i++ {
		if keys[order[i]] == keys[order[i-1]] {
			return nil, fmt.Errorf("building maglev table: %w %q", ErrDuplicateKey, keys[order[i]])
		}
	}

	type member struct {
		pos, skip uint64 // next slot of the permutation, and its stride
		weight    uint64
		credit    uint64 // accumulated weight; a turn costs maxWeight
		id        uint16
	}
	ms := make([]member, 0, len(keys))
	var maxWeight uint64
	for _, i := range order {
		if weights[i] == 0 {
			continue
		}
		h := fnv1a(keys[i])
		ms = append(ms, member{
			pos:    mix64(h^0x9e3779b97f4a7c15) % size,
			skip:   1 + mix64(h^0xc2b2ae3d27d4eb4f)%(size-1),
			weight: uint64(weights[i]),
			id:     ids[i],
		})
		maxWeight = max(maxWeight, uint64(weights[i]))
	}
	m := &Maglev{size: size}
	if len(ms) == 0 {
		return m, nil
	}

	table := make([]uint16, size)
	taken := make([]bool, size)
	for filled := uint64(0); ; {
		for j := range ms {
			mb := &ms[j]
			mb.credit += mb.weight
			if mb.credit < maxWeight {
				continue
			}
			mb.credit -= maxWeight
			// Walk this member's permutation to its next free slot. The walk
			// ends: size is prime, so the permutation visits every slot.
			for taken[mb.pos] {
				mb.pos += mb.skip
				if mb.pos >= size {
					mb.pos -= size
				}
			}
			taken[mb.pos] = true
			table[mb.pos] = mb.id
			filled++
			if filled == size {
				m.table = table
				return m, nil
			}
		}
	}
}

// Lookup returns the member ID that owns hash. ok is false when no member has a weight
// above zero. hash should be uniformly distributed; Lookup reduces it modulo Size.
func (m *Maglev) Lookup(hash uint64) (id uint16, ok bool) {
	if m.table == nil {
		return 0, false
	}
	return m.table[hash%m.size], true
}

// Size returns the number of slots in the table.
func (m *Maglev) Size() uint64 { return m.size }

// fnv1a returns the 64-bit FNV-1a hash of s.
func fnv1a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is the SplitMix64 finalizer: a bijection that spreads every input bit over the
// whole word.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
