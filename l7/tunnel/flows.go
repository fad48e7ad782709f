package tunnel

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// peer is where a flow's replies go: an LD's address (IPv4 in the first four bytes) and
// the encapsulation it used.
type peer struct {
	addr [16]byte
	v6   bool
	mode mode
}

func peerFrom(a netip.Addr, m mode) peer {
	p := peer{v6: a.Is6() && !a.Is4In6(), mode: m}
	if p.v6 {
		p.addr = a.As16()
	} else {
		a4 := a.Unmap().As4()
		copy(p.addr[:4], a4[:])
	}
	return p
}

// Addr returns the peer's address.
func (p peer) Addr() netip.Addr {
	if p.v6 {
		return netip.AddrFrom16(p.addr)
	}
	return netip.AddrFrom4([4]byte(p.addr[:4]))
}

// sameLD reports whether p and q are the same LD, whatever the encapsulation.
func (p peer) sameLD(q peer) bool { return p.addr == q.addr && p.v6 == q.v6 }

// flowEntry is a flow table value: no pointers, so the table costs the garbage collector
// nothing to scan.
type flowEntry struct {
	peer peer
	// seen is when the last packet of the flow arrived from its LD, in nanoseconds of
	// the table's clock; refreshed at most once per refresh.
	seen int64
	// seq is the entry's number in its shard, which its place in the shard's queue of
	// young flows carries too.
	seq uint64
	// halfOpen is set while the flow has shown only TCP SYNs.
	halfOpen bool
	// replied is set once a reply of the flow went out (an ICMP error or a TCP reset
	// does not count).
	replied bool
}

// established reports whether the flow has shown traffic both ways: a reply, and for
// TCP more than SYNs from the client. A flow not established expires sooner and may be
// evicted.
func (e *flowEntry) established() bool { return e.replied && !e.halfOpen }

// limit is how long e may be idle: the shortest of the limits that apply to it.
func (e *flowEntry) limit(l limits) int64 {
	d := l.idle
	if e.halfOpen {
		d = min(d, l.halfOpen)
	}
	if !e.replied {
		d = min(d, l.oneWay)
	}
	return d
}

// limits are the idle times of flows in nanoseconds: established ones, half-open TCP
// ones and those without a reply yet.
type limits struct {
	idle, halfOpen, oneWay int64
}

// refresh is how stale an entry's seen time may get before a packet rewrites it.
const refresh = int64(time.Second)

const numShards = 64

// flowTable maps inner flows (client to VIP) to the LD they came from. It is sharded,
// with a mutex per shard; entries expire idle, those not established sooner, and a full
// shard evicts the oldest entry not established to make room.
type flowTable struct {
	shards   [numShards]flowShard
	perShard int
	count    atomic.Int64
}

type flowShard struct {
	mu sync.Mutex
	m  map[flowKey]flowEntry
	// young is the shard's flows in the order they were created, from young[head]
	// on, as long as they may not be established: eviction takes the first one that
	// still is not. An item whose flow has since been established, expired or
	// replaced (its seq differs) stays until eviction or compaction passes it.
	young []youngFlow
	head  int
	seq   uint64
	_     [24]byte // keep shards on separate cache lines
}

// youngFlow is an item of flowShard.young.
type youngFlow struct {
	k   flowKey
	seq uint64
}

// learnResult says what learn did.
type learnResult uint8

const (
	learnKept    learnResult = iota // entry already current
	learnUpdated                    // entry refreshed, or its encapsulation changed
	learnNew                        // new entry
	learnEvicted                    // new entry, in place of an evicted one
	learnMoved                      // the flow came from another LD and moved to it
	learnRefused                    // the flow came from another LD and stays with its own
	learnFull                       // no room: the flow is not tracked
)

func newFlowTable(maxFlows int) *flowTable {
	t := &flowTable{perShard: max(1, maxFlows/numShards)}
	for i := range t.shards {
		t.shards[i].m = make(map[flowKey]flowEntry)
	}
	return t
}

// flowHash mixes the fields that vary between flows.
func flowHash(k *flowKey) uint64 {
	h := binary.LittleEndian.Uint64(k.src[:8]) ^ binary.LittleEndian.Uint64(k.src[8:])<<1 ^
		binary.LittleEndian.Uint64(k.dst[:8])<<2 ^ binary.LittleEndian.Uint64(k.dst[8:])<<3 ^
		uint64(k.sport)<<16 ^ uint64(k.dport) ^ uint64(k.proto)<<32
	return h * 0x9e3779b97f4a7c15
}

func (t *flowTable) shard(k *flowKey) *flowShard {
	return &t.shards[flowHash(k)>>58]
}

// learn records that a packet of flow k came from p at now. halfOpen says whether it
// was a TCP SYN without ACK; an entry once past that stays so. A packet from another
// LD than the entry's moves the entry there only when the entry has seen nothing from
// its own LD for moveIdle (negative: never); otherwise it changes nothing.
//
// dead, when not nil, says whether an LD is taken for dead: a packet from another LD
// moves an entry whose LD is dead at once (unless moveIdle is negative).
func (t *flowTable) learn(k flowKey, p peer, halfOpen bool, now, moveIdle int64, dead func(peer) bool) learnResult {
	s := t.shard(&k)
	s.mu.Lock()
	if e, ok := s.m[k]; ok {
		r := learnUpdated
		switch {
		case !e.peer.sameLD(p):
			if moveIdle < 0 || now-e.seen < moveIdle && (dead == nil || !dead(e.peer)) {
				s.mu.Unlock()
				return learnRefused
			}
			r = learnMoved
		case e.peer == p && (!e.halfOpen || halfOpen) && now-e.seen < refresh:
			s.mu.Unlock()
			return learnKept
		}
		e.peer, e.seen, e.halfOpen = p, now, e.halfOpen && halfOpen
		s.m[k] = e
		s.mu.Unlock()
		return r
	}
	r := learnNew
	if len(s.m) >= t.perShard {
		if !s.evict() {
			s.mu.Unlock()
			return learnFull
		}
		r = learnEvicted
	}
	s.seq++
	s.m[k] = flowEntry{peer: p, seen: now, seq: s.seq, halfOpen: halfOpen}
	s.young = append(s.young, youngFlow{k: k, seq: s.seq})
	if n := len(s.young) - s.head; n > 2*t.perShard || s.head > 64 && s.head > n {
		s.compact()
	}
	s.mu.Unlock()
	if r == learnNew {
		t.count.Add(1)
	}
	return r
}

// current reports whether y is still an item of young: its flow is there, the same
// one, and not established.
func (s *flowShard) current(y *youngFlow) bool {
	e, ok := s.m[y.k]
	return ok && e.seq == y.seq && !e.established()
}

// evict removes the oldest flow of the shard that is not established, and reports
// whether there was one. The caller holds s.mu.
func (s *flowShard) evict() bool {
	for s.head < len(s.young) {
		y := &s.young[s.head]
		s.head++
		if s.current(y) {
			delete(s.m, y.k)
			return true
		}
	}
	s.young, s.head = s.young[:0], 0
	return false
}

// compact drops from young the items that are no longer current. The caller holds
// s.mu.
func (s *flowShard) compact() {
	n := 0
	for i := s.head; i < len(s.young); i++ {
		if s.current(&s.young[i]) {
			s.young[n] = s.young[i]
			n++
		}
	}
	clear(s.young[n:])
	s.young, s.head = s.young[:n], 0
}

// reply returns the peer of flow k for a reply of it. confirm says the reply is an
// answer (not an ICMP error or a TCP reset): the flow is marked as replied to.
func (t *flowTable) reply(k flowKey, confirm bool) (peer, bool) {
	s := t.shard(&k)
	s.mu.Lock()
	e, ok := s.m[k]
	if ok && confirm && !e.replied {
		e.replied = true
		s.m[k] = e
	}
	s.mu.Unlock()
	return e.peer, ok
}

// lookup returns the peer of flow k.
func (t *flowTable) lookup(k flowKey) (peer, bool) {
	s := t.shard(&k)
	s.mu.Lock()
	e, ok := s.m[k]
	s.mu.Unlock()
	return e.peer, ok
}

// sweep removes the entries idle for their limit or longer at now, and returns how
// many it removed.
func (t *flowTable) sweep(now int64, l limits) int {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n := 0
		for k, e := range s.m {
			if now-e.seen >= e.limit(l) {
				delete(s.m, k)
				n++
			}
		}
		if n > 0 {
			s.compact()
		}
		s.mu.Unlock()
		removed += n
	}
	t.count.Add(int64(-removed))
	return removed
}

// len returns the number of flows in the table.
func (t *flowTable) len() int { return int(t.count.Load()) }

// maxRecentLDs bounds the LDs remembered for replies that match no flow.
const maxRecentLDs = 16

// recentLDs remembers the LDs packets came from lately, for replies that match no flow:
// when only one LD has been seen within the window, it gets them.
type recentLDs struct {
	mu   sync.Mutex
	list [maxRecentLDs]struct {
		p    peer // mode: the last one this LD used
		seen int64
	}
	n int
}

// note records that p was seen at now.
func (r *recentLDs) note(p peer, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	oldest := 0
	for i := range r.n {
		e := &r.list[i]
		if e.p.addr == p.addr && e.p.v6 == p.v6 {
			e.p, e.seen = p, now
			return
		}
		if e.seen < r.list[oldest].seen {
			oldest = i
		}
	}
	if r.n < maxRecentLDs {
		oldest = r.n
		r.n++
	}
	r.list[oldest].p, r.list[oldest].seen = p, now
}

// mode returns the encapsulation LD p used last, if it has been seen.
func (r *recentLDs) mode(p peer) (mode, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.n {
		if r.list[i].p.sameLD(p) {
			return r.list[i].p.mode, true
		}
	}
	return 0, false
}

// only returns the one LD seen since now-window, if there is exactly one.
func (r *recentLDs) only(now, window int64) (peer, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var found peer
	n := 0
	for i := range r.n {
		if now-r.list[i].seen < window {
			found = r.list[i].p
			n++
		}
	}
	return found, n == 1
}

// fragCacheSize is the number of slots of fragCache, a power of two.
const fragCacheSize = 256

// fragCache remembers where the first fragment of each recent outgoing datagram went,
// so the later fragments (which carry no ports) follow it. It is used by the one
// goroutine reading the TUN device, without locks; a collision just forgets a datagram.
type fragCache struct {
	slots [fragCacheSize]struct {
		id       uint32
		src, dst [16]byte
		p, alt   peer
		seen     int64
	}
}

func (c *fragCache) slot(id uint32, dst *[16]byte) int {
	h := (id ^ binary.LittleEndian.Uint32(dst[:4]) ^ binary.LittleEndian.Uint32(dst[12:])) * 0x9e3779b1
	return int(h >> (32 - 8))
}

// put remembers that the datagram of pi goes to p, and a copy to alt unless it is zero.
func (c *fragCache) put(pi *packetInfo, p, alt peer, now int64) {
	s := &c.slots[c.slot(pi.fragID, &pi.key.dst)]
	s.id, s.src, s.dst, s.p, s.alt, s.seen = pi.fragID, pi.key.src, pi.key.dst, p, alt, now
}

// fragMaxAge is how long a first fragment's destination is remembered.
const fragMaxAge = int64(30 * time.Second)

func (c *fragCache) get(pi *packetInfo, now int64) (p, alt peer, ok bool) {
	s := &c.slots[c.slot(pi.fragID, &pi.key.dst)]
	if s.seen == 0 || s.id != pi.fragID || s.src != pi.key.src || s.dst != pi.key.dst || now-s.seen > fragMaxAge {
		return peer{}, peer{}, false
	}
	return s.p, s.alt, true
}
