package l7

import (
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Connections are admitted in two steps. Until its handshake is done a connection
// holds a place among MaxHandshakes (TCP and QUIC each have their own count) and one
// among its source's MaxHandshakesPerSource; only then does it take a place among
// MaxConns. A client that opens connections it never finishes thus spends its own
// budget, for HandshakeTimeout, and not that of the clients that did.

// source is the key handshakes are counted by: an IPv4 address (as IPv4-mapped
// IPv6) or an IPv6 /64, since one IPv6 host commonly holds a whole /64.
type source struct {
	key   [16]byte
	valid bool // false for a connection whose peer is unknown: not counted by source
}

func sourceOf(a netip.Addr) source {
	if !a.IsValid() {
		return source{}
	}
	a = a.Unmap()
	s := source{key: a.As16(), valid: true}
	if a.Is6() {
		clear(s.key[8:])
	}
	return s
}

// sourceShards is how many locks the counts by source are spread over, so that
// accepts on different cores rarely meet on one.
const sourceShards = 64

// sourceCounts counts the handshakes in progress by source. A source is in the map
// only while it has one.
type sourceCounts struct {
	seed   maphash.Seed
	shards [sourceShards]sourceShard
}

type sourceShard struct {
	mu sync.Mutex
	n  map[[16]byte]int32
	_  [48]byte // a cache line of its own
}

func newSourceCounts() *sourceCounts {
	return &sourceCounts{seed: maphash.MakeSeed()}
}

func (sc *sourceCounts) shard(s source) *sourceShard {
	return &sc.shards[maphash.Comparable(sc.seed, s.key)%sourceShards]
}

// acquire counts one more handshake from s unless it already has limit; it reports
// whether it did. A source that is not valid is always admitted.
func (sc *sourceCounts) acquire(s source, limit int) bool {
	if !s.valid {
		return true
	}
	sh := sc.shard(s)
	sh.mu.Lock()
	n := sh.n[s.key]
	ok := int(n) < limit
	if ok {
		if sh.n == nil {
			sh.n = map[[16]byte]int32{}
		}
		sh.n[s.key] = n + 1
	}
	sh.mu.Unlock()
	return ok
}

// release ends a handshake acquire counted.
func (sc *sourceCounts) release(s source) {
	if !s.valid {
		return
	}
	sh := sc.shard(s)
	sh.mu.Lock()
	if n := sh.n[s.key]; n > 1 {
		sh.n[s.key] = n - 1
	} else {
		delete(sh.n, s.key)
	}
	sh.mu.Unlock()
}

// count returns the handshakes in progress from s.
func (sc *sourceCounts) count(s source) int {
	if !s.valid {
		return 0
	}
	sh := sc.shard(s)
	sh.mu.Lock()
	n := sh.n[s.key]
	sh.mu.Unlock()
	return int(n)
}

// admitHandshake takes a handshake place for a new connection from src: one of n's
// (the listener's TCP or QUIC handshakes, against MaxHandshakes) and one of src's.
// It returns nil, or the counter of the refusal.
func (l *listener) admitHandshake(n *atomic.Int64, src source) prometheus.Counter {
	if n.Add(1) > int64(l.cfg.MaxHandshakes) {
		n.Add(-1)
		return l.rejectedHandshakes
	}
	if !l.sources.acquire(src, l.cfg.MaxHandshakesPerSource) {
		n.Add(-1)
		return l.rejectedPerSource
	}
	return nil
}

// handshakeEnded gives back the places admitHandshake took.
func (l *listener) handshakeEnded(n *atomic.Int64, src source) {
	n.Add(-1)
	l.sources.release(src)
}
