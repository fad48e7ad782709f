package route

import (
	"math"
	"net/netip"
	"sync"
)

// Defaults of RateLimit.
const (
	DefaultIPv6PrefixLen = 64
	DefaultMaxClients    = 100_000
)

// limiterShards spreads clients over this many locks, so that requests of different
// clients rarely wait for each other.
const limiterShards = 64

// limiter is a token bucket per client, in shards that each keep at most perShard
// clients and forget the least recently seen one to make room.
type limiter struct {
	cfg      RateLimit // with defaults, compared on reload
	perNanos float64   // tokens per nanosecond
	burst    float64
	v6bits   int
	perShard int
	shards   [limiterShards]limiterShard
}

type limiterShard struct {
	mu      sync.Mutex
	index   map[netip.Addr]int32
	buckets []bucket
	// Least-recently-used list through buckets: head is the most recent.
	head, tail int32
	_          [16]byte // pads the shard to a cache line, so that shards do not share one
}

type bucket struct {
	key        netip.Addr
	tokens     float64
	last       int64 // UnixNano of the last refill
	prev, next int32
}

func newLimiter(rl *RateLimit) *limiter {
	cfg := *rl
	setDefault(&cfg.Burst, max(1, int(math.Ceil(cfg.PerSecond))))
	setDefault(&cfg.IPv6PrefixLen, DefaultIPv6PrefixLen)
	setDefault(&cfg.MaxClients, DefaultMaxClients)
	l := &limiter{
		cfg:      cfg,
		perNanos: cfg.PerSecond / 1e9,
		burst:    float64(cfg.Burst),
		v6bits:   cfg.IPv6PrefixLen,
		perShard: max(1, (cfg.MaxClients+limiterShards-1)/limiterShards),
	}
	for i := range l.shards {
		l.shards[i].head, l.shards[i].tail = -1, -1
	}
	return l
}

func (l *limiter) key(ip netip.Addr) netip.Addr {
	ip = ip.Unmap().WithZone("")
	if ip.Is6() && l.v6bits < 128 {
		if p, err := ip.Prefix(l.v6bits); err == nil {
			return p.Addr()
		}
	}
	return ip
}

func (l *limiter) allow(ip netip.Addr, now int64) bool {
	key := l.key(ip)
	b16 := key.As16()
	sh := &l.shards[hashBytes(b16[:])%limiterShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := sh.index[key]
	if !ok {
		i = sh.insert(key, l.perShard)
		b := &sh.buckets[i]
		b.tokens, b.last = l.burst, now
	} else {
		sh.touch(i)
	}
	b := &sh.buckets[i]
	if elapsed := now - b.last; elapsed > 0 {
		b.tokens = min(l.burst, b.tokens+float64(elapsed)*l.perNanos)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// insert makes room for key, forgetting the least recent client when the shard is
// full, and returns its bucket at the head of the list.
func (sh *limiterShard) insert(key netip.Addr, capacity int) int32 {
	if sh.index == nil {
		sh.index = make(map[netip.Addr]int32)
	}
	var i int32
	if len(sh.buckets) < capacity {
		i = int32(len(sh.buckets))
		sh.buckets = append(sh.buckets, bucket{prev: -1, next: -1})
	} else {
		i = sh.tail
		sh.unlink(i)
		delete(sh.index, sh.buckets[i].key)
	}
	sh.buckets[i].key = key
	sh.index[key] = i
	sh.pushFront(i)
	return i
}

func (sh *limiterShard) touch(i int32) {
	if sh.head == i {
		return
	}
	sh.unlink(i)
	sh.pushFront(i)
}

func (sh *limiterShard) unlink(i int32) {
	b := &sh.buckets[i]
	if b.prev >= 0 {
		sh.buckets[b.prev].next = b.next
	} else {
		sh.head = b.next
	}
	if b.next >= 0 {
		sh.buckets[b.next].prev = b.prev
	} else {
		sh.tail = b.prev
	}
	b.prev, b.next = -1, -1
}

func (sh *limiterShard) pushFront(i int32) {
	b := &sh.buckets[i]
	b.prev, b.next = -1, sh.head
	if sh.head >= 0 {
		sh.buckets[sh.head].prev = i
	}
	sh.head = i
	if sh.tail < 0 {
		sh.tail = i
	}
}

// clients returns the number of clients tracked.
func (l *limiter) clients() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += len(sh.index)
		sh.mu.Unlock()
	}
	return n
}
