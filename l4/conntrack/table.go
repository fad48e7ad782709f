package conntrack

import (
	"fmt"
	"unsafe"
)

// TCP header flag bits that drive the state machine (the flags byte, offset 13).
const (
	flagFIN = 0x01
	flagSYN = 0x02
	flagRST = 0x04
	flagACK = 0x10
)

// Chain links. A link (a bucket head or an entry's chain field) either ends the chain,
// as endMark|bucket number (an empty bucket may also hold 0), or points to entry i as
// i|tag|lastBit, where tag is 3 bits of the entry's hash and lastBit says that entry is
// the last of its chain. A lookup compares tags in the links and stops at a link marked
// last, so it reads no entry whose tag differs: a miss in a one-entry chain reads only
// the bucket head.
const (
	endMark  = 1 << 31
	lastBit  = 1 << 30
	tagShift = 27
	tagMask  = 7 << tagShift
	idxMask  = 1<<tagShift - 1
)

// tagOf returns the tag bits of a link to an entry with this hash: its top 3 bits,
// which the bucket index (the low bits) never uses.
func tagOf(hash uint64) uint32 { return uint32(hash>>61) << tagShift }

const (
	wheelBits  = 10
	wheelSlots = 1 << wheelBits // one-second slots; longer timeouts take extra laps
	wheelMask  = wheelSlots - 1

	// reclaimBudget bounds the reaper work Insert does on a full table before it evicts.
	reclaimBudget = 16
)

// entry is one connection, or a list head (sentinel). 40 bytes.
type entry struct {
	key    Key    // 20 bytes
	member uint16 // member ID the flow is scheduled to
	state  State  // 0 when free
	flags  uint8  // flagSent, flagSynced (session sync)
	expire uint32 // alive while now ≤ expire (modulo 2^32)
	prev   uint32 // timeout list links (circular, through a sentinel)
	next   uint32 // also the free-list link
	chain  uint32 // link to the next entry of the chain, or endMark|bucket
}

// EntrySize returns the size of one table entry in bytes.
func EntrySize() uintptr { return unsafe.Sizeof(entry{}) }

// Table is a per-core connection table with fixed memory. It is not safe for
// concurrent use: one goroutine (one lcore) owns it. Make one with New.
type Table struct {
	// entries holds, in order: index 0 (unused, so 0 means "none"), the capacity
	// entries 1..capacity, then the list sentinels: the half-open FIFO, the unconfirmed
	// FIFO, the wheel slot being reaped, and the wheel slots.
	entries  []entry
	buckets  []uint32         // link to the first entry of each chain
	mask     uint64           // len(buckets)-1
	counts   *[1 << 16]uint32 // entries per member ID
	rules    *[1 << 16]uint32 // entries per rule ID (Key.Rule)
	timeouts [numStates]uint32

	capacity    uint32
	used        uint32 // entries[1..used] have been handed out at least once
	free        uint32 // head of the free list (through next), 0 when empty
	n           int
	halfOpen    int
	unconfirmed int

	synList    uint32 // sentinel of the half-open FIFO
	unconfList uint32 // sentinel of the unconfirmed FIFO
	pending    uint32 // sentinel of the slot being reaped
	wheel      uint32 // sentinel of wheel slot 0

	cursor  uint32 // the next wheel second to reap
	started bool   // cursor has been set from the first Insert's now

	stats Stats
	sink  uint32 // written by Prefetch so that its loads are not optimised away

	// events, when EnableEvents made it, records state changes and deletions for
	// session sync (sync.go); nil otherwise.
	events *eventRing

	// proxy, when EnableProxy made it, is the SYN proxy state of each entry, by
	// index (proxy.go); nil otherwise.
	proxy []Proxy
}

// New makes a table holding up to cfg.Capacity entries, allocating all its memory.
func New(cfg Config) (*Table, error) {
	if cfg.Capacity < 1 || cfg.Capacity > MaxCapacity {
		return nil, fmt.Errorf("making connection table of %d entries: %w (want 1..%d)",
			cfg.Capacity, ErrCapacity, MaxCapacity)
	}
	t := &Table{capacity: uint32(cfg.Capacity)}
	if err := t.SetTimeouts(cfg.Timeouts); err != nil {
		return nil, err
	}

	nb := uint64(1)
	for nb < uint64(cfg.Capacity) {
		nb <<= 1
	}
	var freeBuckets, freeEntries func()
	t.buckets, freeBuckets = hugeAlloc[uint32](int(nb))
	t.mask = nb - 1
	t.counts = new([1 << 16]uint32)
	t.rules = new([1 << 16]uint32)

	t.synList = t.capacity + 1
	t.unconfList = t.synList + 1
	t.pending = t.unconfList + 1
	t.wheel = t.pending + 1
	t.entries, freeEntries = hugeAlloc[entry](int(t.wheel + wheelSlots))
	releaseWith(t, freeBuckets, freeEntries)
	for s := t.synList; s < uint32(len(t.entries)); s++ {
		t.entries[s].prev, t.entries[s].next = s, s
	}
	return t, nil
}

// expired reports whether an entry expiring at exp is dead at now.
func expired(now, exp uint32) bool { return int32(now-exp) > 0 }

// find returns the index of k's entry (0 if absent), the link that points to it, and
// the link that points to the entry holding that link (nil when the first is a bucket).
func (t *Table) find(k *Key, hash uint64) (i uint32, link, plink *uint32) {
	tag := tagOf(hash)
	link = &t.buckets[hash&t.mask]
	for v := *link; int32(v) > 0; v = *link {
		e := &t.entries[v&idxMask]
		if v&tagMask == tag && e.key == *k {
			return v & idxMask, link, plink
		}
		if v&lastBit != 0 {
			break
		}
		plink, link = link, &e.chain
	}
	return 0, nil, nil
}

// unlink takes entry i, which link points to, out of its chain; plink points to the
// entry holding link, or is nil when link is a bucket head.
func (t *Table) unlink(i uint32, link, plink *uint32) {
	next := t.entries[i].chain
	*link = next
	if int32(next) <= 0 && plink != nil {
		*plink |= lastBit // the entry before i is now the last
	}
}

// Prefetch loads the bucket head and the first entry that a lookup of hash reads, and
// changes nothing. A packet loop that calls Prefetch for every packet of a burst before
// looking any of them up lets the CPU overlap the burst's cache misses instead of taking
// them one lookup at a time.
func (t *Table) Prefetch(hash uint64) {
	if v := t.buckets[hash&t.mask]; int32(v) > 0 {
		t.sink += t.entries[v&idxMask].expire
	}
}

// SetTimeouts changes the timeouts (zero fields mean the defaults). An entry gets the
// new timeout of its state when a packet next refreshes it or it changes state; until
// then it keeps the expiry it has. On error nothing changes.
func (t *Table) SetTimeouts(to Timeouts) error {
	next, err := to.seconds()
	if err != nil {
		return err
	}
	t.timeouts = next
	return nil
}

// Check reports whether the timeouts are usable (none negative or above MaxTimeout).
func (to Timeouts) Check() error {
	_, err := to.seconds()
	return err
}

// seconds converts the timeouts, defaults filled in, to whole seconds per state.
func (to Timeouts) seconds() ([numStates]uint32, error) {
	var out [numStates]uint32
	for _, f := range to.fields() {
		var err error
		if out[f.state], err = seconds(f.name, *f.d, f.def); err != nil {
			return out, err
		}
	}
	return out, nil
}

// PrefetchBurst does what Prefetch does for every hash of a burst (a zero hash is
// skipped), in two tight passes: first every bucket head, then every first entry, so
// that the loads of the whole burst are in flight together rather than a few at a
// time between the caller's other work. At most 256 hashes are used.
func (t *Table) PrefetchBurst(hashes []uint64) {
	var heads [256]uint32
	n := min(len(hashes), len(heads))
	for i, h := range hashes[:n] {
		if h != 0 {
			heads[i] = t.buckets[h&t.mask]
		}
	}
	// A 40-byte entry straddles two cache lines half the time: touch its first
	// byte and its last word.
	var sink uint32
	for _, v := range heads[:n] {
		if int32(v) > 0 {
			e := &t.entries[v&idxMask]
			sink += uint32(e.key.Client[0]) + e.chain
		}
	}
	// With the SYN proxy on, every packet of a proxied flow reads its proxy state
	// too, in the side array: load those lines in the same pass (a 12-byte record
	// straddles two lines one time in five: its first and its last words).
	if px := t.proxy; px != nil {
		for _, v := range heads[:n] {
			if int32(v) > 0 {
				r := &px[v&idxMask]
				sink += r.SeqDelta + uint32(r.Flags)
			}
		}
	}
	t.sink += sink
}

// Lookup returns k's member and state without refreshing the entry. An expired entry
// counts as absent, and is reclaimed.
func (t *Table) Lookup(k *Key, hash uint64, now uint32) (member uint16, state State, ok bool) {
	i, link, plink := t.find(k, hash)
	if i == 0 {
		return 0, 0, false
	}
	e := &t.entries[i]
	if expired(now, e.expire) {
		t.expireFound(i, link, plink)
		return 0, 0, false
	}
	return e.member, e.state, true
}

// LookupTCP looks k up and, on a hit, applies the TCP flags of the client's packet to the
// entry's state and refreshes its expiry for the new state, in one probe. flags is the
// TCP header's flags byte. The transitions, checked in this order, follow IPVS's:
//
//   - RST: Close.
//   - SYN: a SynRecv or Established entry keeps its state; a Fin, Close or Unconfirmed
//     entry goes back to SynRecv (the client reuses the port, or opens the connection
//     it had only sent mid-flow packets of), keeping its member.
//   - FIN: Fin, unless the entry is in Close or Unconfirmed.
//   - ACK: SynRecv becomes Established; other states stay. An Unconfirmed entry stays
//     unconfirmed whatever the client sends: only its member's reply confirms it.
//
// A UDP entry keeps its state. An expired entry counts as absent, and is reclaimed.
func (t *Table) LookupTCP(k *Key, hash uint64, flags uint8, now uint32) (member uint16, ok bool) {
	member, _, ok = t.lookupTCP(k, hash, flags, now)
	return member, ok
}

// lookupTCP is LookupTCP, returning the entry's index too. An entry of a proxied
// connection waiting for its member (ProxyPending) changes state only on a reset.
func (t *Table) lookupTCP(k *Key, hash uint64, flags uint8, now uint32) (member uint16, i uint32, ok bool) {
	i, link, plink := t.find(k, hash)
	if i == 0 {
		return 0, 0, false
	}
	e := &t.entries[i]
	if expired(now, e.expire) {
		t.expireFound(i, link, plink)
		return 0, 0, false
	}
	ns := nextState(e.state, flags)
	if t.proxy != nil && t.proxy[i].Flags&ProxyPending != 0 && flags&flagRST == 0 {
		ns = e.state
	}
	if ns != e.state {
		t.refile(i, ns, now)
		if t.events != nil {
			t.note(i, hash, false)
		}
	} else {
		t.touch(i, now)
	}
	return e.member, i, true
}

// LookupUDP looks k up and, on a hit, refreshes the entry's expiry. An expired entry
// counts as absent, and is reclaimed.
func (t *Table) LookupUDP(k *Key, hash uint64, now uint32) (member uint16, ok bool) {
	i, link, plink := t.find(k, hash)
	if i == 0 {
		return 0, false
	}
	e := &t.entries[i]
	if expired(now, e.expire) {
		t.expireFound(i, link, plink)
		return 0, false
	}
	t.touch(i, now)
	return e.member, true
}

// nextState applies a client packet's TCP flags to state s.
func nextState(s State, flags uint8) State {
	switch {
	case s == StateUDP:
		return s
	case flags&flagRST != 0:
		return StateClose
	case flags&flagSYN != 0:
		if s == StateFin || s == StateClose || s == StateUnconfirmed {
			return StateSynRecv
		}
	case flags&flagFIN != 0:
		if s != StateClose && s != StateUnconfirmed {
			return StateFin
		}
	case flags&flagACK != 0:
		if s == StateSynRecv {
			return StateEstablished
		}
	}
	return s
}

// LookupReply looks up the flow k that a reply from its member belongs to (k is the
// flow as the client sends it). On a hit it confirms an unconfirmed entry, moving it to
// state confirmed (StateEstablished for TCP, StateUDP for UDP) with that state's
// timeout, and refreshes the expiry of an entry in any other state but half-open (a
// half-open entry waits for the client's ACK, whatever its member answers). An expired
// entry counts as absent, and is reclaimed.
func (t *Table) LookupReply(k *Key, hash uint64, confirmed State, now uint32) (member uint16, ok bool) {
	member, _, ok = t.lookupReply(k, hash, confirmed, now)
	return member, ok
}

// lookupReply is LookupReply, returning the entry's index too.
func (t *Table) lookupReply(k *Key, hash uint64, confirmed State, now uint32) (member uint16, i uint32, ok bool) {
	i, link, plink := t.find(k, hash)
	if i == 0 {
		return 0, 0, false
	}
	e := &t.entries[i]
	if expired(now, e.expire) {
		t.expireFound(i, link, plink)
		return 0, 0, false
	}
	switch e.state {
	case StateSynRecv:
	case StateUnconfirmed:
		if confirmed == StateEstablished || confirmed == StateUDP {
			t.refile(i, confirmed, now)
			t.stats.Confirmed++
			if t.events != nil {
				t.note(i, hash, false)
			}
		}
	default:
		t.touch(i, now)
	}
	return e.member, i, true
}

// touch refreshes entry i's expiry in its current state. A half-open or unconfirmed
// entry moves to the tail of its FIFO (least recently used order); others stay where
// they are filed.
func (t *Table) touch(i, now uint32) {
	e := &t.entries[i]
	e.expire = now + t.timeouts[e.state]
	switch e.state {
	case StateSynRecv:
		t.unlist(i)
		t.append(t.synList, i)
	case StateUnconfirmed:
		t.unlist(i)
		t.append(t.unconfList, i)
	}
}

// refile moves entry i to state s with a fresh expiry, and files it accordingly.
func (t *Table) refile(i uint32, s State, now uint32) {
	t.unfile(i)
	e := &t.entries[i]
	e.state = s
	e.expire = now + t.timeouts[s]
	t.file(i)
}

// Insert adds k → member in state st, expiring after st's timeout from now. The caller
// has checked that k is absent (a lookup missed); inserting a present key leaves two
// entries, of which lookups find the newer. If the table is full, Insert first reclaims
// expired entries, then evicts the least recently seen unconfirmed entry, or when there
// is none the least recently seen half-open entry, and reports evicted; if the table
// holds neither it adds nothing and returns ok false (the caller drops the packet as
// table_full).
func (t *Table) Insert(k *Key, hash uint64, member uint16, st State, now uint32) (evicted, ok bool) {
	if st < StateSynRecv || st > StateUnconfirmed {
		t.stats.InsertFailures++
		return false, false
	}
	if !t.started {
		t.cursor, t.started = now, true
	}
	i := t.alloc()
	if i == 0 {
		if i = t.reclaim(now); i == 0 {
			switch {
			case t.unconfirmed > 0:
				t.remove(t.entries[t.unconfList].next)
				t.stats.EvictedUnconfirmed++
			case t.halfOpen > 0:
				t.remove(t.entries[t.synList].next)
			default:
				t.stats.InsertFailures++
				return false, false
			}
			t.stats.Evictions++
			evicted = true
			i = t.alloc()
		}
	}
	e := &t.entries[i]
	e.key = *k
	e.member = member
	e.state = st
	e.flags = 0
	e.expire = now + t.timeouts[st]
	b := hash & t.mask
	head, link := t.buckets[b], i|tagOf(hash)
	if int32(head) <= 0 {
		head = endMark | uint32(b)
		link |= lastBit
	}
	e.chain = head
	t.buckets[b] = link
	t.file(i)
	t.counts[member]++
	t.rules[k.Rule]++
	t.n++
	t.stats.Inserts++
	return evicted, true
}

// alloc takes a free entry, or returns 0 when there is none.
func (t *Table) alloc() uint32 {
	if i := t.free; i != 0 {
		t.free = t.entries[i].next
		return i
	}
	if t.used < t.capacity {
		t.used++
		return t.used
	}
	return 0
}

// reclaim frees expired entries with bounded work and returns one free entry, or 0.
func (t *Table) reclaim(now uint32) uint32 {
	if t.expire(now, reclaimBudget) == 0 {
		return 0
	}
	return t.alloc()
}

// Delete removes k's entry and reports whether there was one. Delete has no clock, so
// an entry that has expired but was not yet reclaimed is removed and reported too.
func (t *Table) Delete(k *Key, hash uint64) bool {
	i, link, plink := t.find(k, hash)
	if i == 0 {
		return false
	}
	if t.events != nil && t.entries[i].flags != 0 {
		t.note(i, hash, true)
	}
	t.unlink(i, link, plink)
	t.release(i)
	return true
}

// Expire reclaims up to max expired entries and returns how many it reclaimed. A packet
// loop calls it once per iteration with a small max (say 64), spreading the work; a
// call does at most max units of work (an entry freed or re-filed, a wheel slot taken)
// and passes at most 1024 empty one-second slots when it has fallen behind, and never
// scans the table. It never reclaims an entry before its expiry, and reclaims it within
// a second after while calls keep up with the rate at which entries expire.
func (t *Table) Expire(now uint32, max int) int {
	if !t.started || max <= 0 {
		return 0
	}
	return t.expire(now, max)
}

// expire does up to budget units of reaping work (an entry freed or re-filed, or a wheel
// slot taken) and returns the number of entries freed.
func (t *Table) expire(now uint32, budget int) int {
	freed := 0
	for _, fifo := range [2]uint32{t.unconfList, t.synList} {
		for budget > 0 {
			h := t.entries[fifo].next
			if h == fifo || !expired(now, t.entries[h].expire) {
				break
			}
			t.remove(h)
			freed++
			budget--
		}
	}
	empty := 0
	for budget > 0 {
		h := t.entries[t.pending].next
		if h == t.pending {
			// Take the next wheel slot once its second has passed: its
			// entries that have not been refreshed are expired by then.
			if !expired(now, t.cursor) {
				break
			}
			s := t.wheel + (t.cursor & wheelMask)
			if t.entries[s].next == s {
				// Passing an empty slot is cheap and costs no budget, so a
				// reaper that fell behind catches up. After a whole lap of
				// empty slots the wheel is empty: jump to now.
				if empty++; empty == wheelSlots {
					t.cursor = now
					break
				}
				t.cursor++
				continue
			}
			empty = 0
			t.splice(s, t.pending)
			t.cursor++
			budget--
			continue
		}
		if expired(now, t.entries[h].expire) {
			t.remove(h)
			freed++
		} else {
			t.unlist(h)
			t.append(t.wheel+(t.entries[h].expire&wheelMask), h)
		}
		budget--
	}
	t.stats.Expired += uint64(freed)
	return freed
}

// expireFound reclaims expired entry i, found by find.
func (t *Table) expireFound(i uint32, link, plink *uint32) {
	t.unlink(i, link, plink)
	t.release(i)
	t.stats.Expired++
}

// remove reclaims entry i, finding its bucket from the end-of-chain mark.
func (t *Table) remove(i uint32) {
	j := t.entries[i].chain
	for int32(j) > 0 {
		j = t.entries[j&idxMask].chain
	}
	var plink *uint32
	link := &t.buckets[j&^endMark]
	for *link&idxMask != i {
		plink, link = link, &t.entries[*link&idxMask].chain
	}
	t.unlink(i, link, plink)
	t.release(i)
}

// release frees entry i, already unlinked from its chain.
func (t *Table) release(i uint32) {
	t.unfile(i)
	e := &t.entries[i]
	t.counts[e.member]--
	t.rules[e.key.Rule]--
	t.n--
	if t.proxy != nil {
		t.proxy[i] = Proxy{}
	}
	e.state = 0
	e.next = t.free
	t.free = i
}

// file puts entry i on the timeout list for its state and expiry.
func (t *Table) file(i uint32) {
	e := &t.entries[i]
	switch e.state {
	case StateSynRecv:
		t.append(t.synList, i)
		t.halfOpen++
	case StateUnconfirmed:
		t.append(t.unconfList, i)
		t.unconfirmed++
	default:
		t.append(t.wheel+(e.expire&wheelMask), i)
	}
}

// unfile takes entry i off its timeout list.
func (t *Table) unfile(i uint32) {
	switch t.entries[i].state {
	case StateSynRecv:
		t.halfOpen--
	case StateUnconfirmed:
		t.unconfirmed--
	}
	t.unlist(i)
}

// append links entry i at the tail of the list with sentinel s.
func (t *Table) append(s, i uint32) {
	tail := t.entries[s].prev
	t.entries[i].prev = tail
	t.entries[i].next = s
	t.entries[tail].next = i
	t.entries[s].prev = i
}

// unlist unlinks entry i from its list.
func (t *Table) unlist(i uint32) {
	p, n := t.entries[i].prev, t.entries[i].next
	t.entries[p].next = n
	t.entries[n].prev = p
}

// splice moves every entry of list from onto the empty list to.
func (t *Table) splice(from, to uint32) {
	first := t.entries[from].next
	if first == from {
		return
	}
	last := t.entries[from].prev
	t.entries[to].next, t.entries[first].prev = first, to
	t.entries[to].prev, t.entries[last].next = last, to
	t.entries[from].next, t.entries[from].prev = from, from
}

// Len returns the number of entries in use, including expired ones not yet reclaimed.
func (t *Table) Len() int { return t.n }

// Cap returns the capacity in entries.
func (t *Table) Cap() int { return int(t.capacity) }

// HalfOpen returns the number of half-open (StateSynRecv) entries, including expired
// ones not yet reclaimed.
func (t *Table) HalfOpen() int { return t.halfOpen }

// Unconfirmed returns the number of unconfirmed (StateUnconfirmed) entries, including
// expired ones not yet reclaimed.
func (t *Table) Unconfirmed() int { return t.unconfirmed }

// MemberConns returns how many entries refer to member id, including expired ones not
// yet reclaimed.
func (t *Table) MemberConns(id uint16) uint32 { return t.counts[id] }

// RuleConns returns how many entries belong to rule id (Key.Rule), in any state,
// including expired ones not yet reclaimed: what a per-rule limit of concurrent
// connections counts.
func (t *Table) RuleConns(id uint16) uint32 { return t.rules[id] }

// MemberCounts returns the entries per member, indexed by member ID (length 65536), as
// MemberConns counts them. It is the table's own array, kept current by every insert,
// delete, expiry and eviction: read it, do not modify it, and do not hand it to another
// goroutine (copy it).
func (t *Table) MemberCounts() []uint32 { return t.counts[:] }

// MemoryBytes returns the bytes the table allocated: entries, buckets, list heads and
// the per-member and per-rule counts.
func (t *Table) MemoryBytes() int {
	return cap(t.entries)*int(EntrySize()) + cap(t.buckets)*4 + len(t.counts)*4 + len(t.rules)*4
}

// Stats returns the event counters.
func (t *Table) Stats() Stats { return t.stats }
