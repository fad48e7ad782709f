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

// flowEntry is a flow table value: no pointers, so the table costs the garbage collector
// nothing to scan.
type flowEntry struct {
	peer peer
	// seen is when the last packet of the flow arrived, in nanoseconds of the table's
	// clock; refreshed at most once per refresh.
	seen int64
	// halfOpen is set while the flow has shown only TCP SYNs: it expires sooner.
	halfOpen bool
}

// refresh is how stale an entry's seen time may get before a packet rewrites it.
const refresh = int64(time.Second)

const numShards = 64

// flowTable maps inner flows (client to VIP) to the LD they came from. It is sharded,
// with a mutex per shard; entries expire idle, half-open ones sooner.
type flowTable struct {
	shards   [numShards]flowShard
	perShard int
	count    atomic.Int64
}

type flowShard struct {
	mu sync.Mutex
	m  map[flowKey]flowEntry
	_  [40]byte // keep shards on separate cache lines
}

// learnResult says what learn did.
type learnResult uint8

const (
	learnKept learnResult = iota // entry already current
	learnUpdated
	learnNew
	learnFull // no room: the flow is not tracked
)

func newFlowTable(maxFlows int) *flowTable {
	t := &flowTable{perShard: max(1, maxFlows/numShards)}
	for i := range t.shards {
		t.shards[i].m = make(map[flowKey]flowEntry)
	}
	return t
}

func (t *flowTable) shard(k *flowKey) *flowShard {
	// A cheap mix of the fields that vary between flows.
	h := binary.LittleEndian.Uint64(k.src[:8]) ^ binary.LittleEndian.Uint64(k.src[8:])<<1 ^
		binary.LittleEndian.Uint64(k.dst[:8])<<2 ^ binary.LittleEndian.Uint64(k.dst[8:])<<3 ^
		uint64(k.sport)<<16 ^ uint64(k.dport) ^ uint64(k.proto)<<32
	h *= 0x9e3779b97f4a7c15
	return &t.shards[h>>58]
}

// learn records that a packet of flow k came from p at now. halfOpen says whether it
// was a TCP SYN without ACK; an entry once past that stays established.
func (t *flowTable) learn(k flowKey, p peer, halfOpen bool, now int64) learnResult {
	s := t.shard(&k)
	s.mu.Lock()
	e, ok := s.m[k]
	switch {
	case ok:
		if e.peer == p && (!e.halfOpen || halfOpen) && now-e.seen < refresh {
			s.mu.Unlock()
			return learnKept
		}
		e.peer, e.seen, e.halfOpen = p, now, e.halfOpen && halfOpen
		s.m[k] = e
		s.mu.Unlock()
		return learnUpdated
	case len(s.m) >= t.perShard:
		s.mu.Unlock()
		return learnFull
	default:
		s.m[k] = flowEntry{peer: p, seen: now, halfOpen: halfOpen}
		s.mu.Unlock()
		t.count.Add(1)
		return learnNew
	}
}

// lookup returns the peer of flow k.
func (t *flowTable) lookup(k flowKey) (peer, bool) {
	s := t.shard(&k)
	s.mu.Lock()
	e, ok := s.m[k]
	s.mu.Unlock()
	return e.peer, ok
}

// sweep removes the entries idle since before now-idle (now-halfOpenIdle for half-open
// ones) and returns how many it removed.
func (t *flowTable) sweep(now, idle, halfOpenIdle int64) int {
	removed := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			limit := idle
			if e.halfOpen {
				limit = halfOpenIdle
			}
			if now-e.seen >= limit {
				delete(s.m, k)
				removed++
			}
		}
		s.mu.Unlock()
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
		p        peer
		seen     int64
	}
}

func (c *fragCache) slot(id uint32, dst *[16]byte) int {
	h := (id ^ binary.LittleEndian.Uint32(dst[:4]) ^ binary.LittleEndian.Uint32(dst[12:])) * 0x9e3779b1
	return int(h >> (32 - 8))
}

func (c *fragCache) put(pi *packetInfo, p peer, now int64) {
	s := &c.slots[c.slot(pi.fragID, &pi.key.dst)]
	s.id, s.src, s.dst, s.p, s.seen = pi.fragID, pi.key.src, pi.key.dst, p, now
}

// fragMaxAge is how long a first fragment's destination is remembered.
const fragMaxAge = int64(30 * time.Second)

func (c *fragCache) get(pi *packetInfo, now int64) (peer, bool) {
	s := &c.slots[c.slot(pi.fragID, &pi.key.dst)]
	if s.seen == 0 || s.id != pi.fragID || s.src != pi.key.src || s.dst != pi.key.dst || now-s.seen > fragMaxAge {
		return peer{}, false
	}
	return s.p, true
}
