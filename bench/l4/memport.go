package main

import (
	"sync/atomic"

	"github.com/tiergate/tiergate/l4/port"
)

// genBufSize is the size of a generator buffer: the headroom and a full frame.
const genBufSize = 2048

// genPool is the buffers of the in-memory measurement: a fixed set cycled between the
// generator (RxBurst takes them) and the sink (TxBurst gives them back). Only the
// worker's goroutine touches it: RxBurst, the data queues' TxBurst and Free run there.
// Buffers the control goroutine allocates come from the Go heap (Handle 0) and never
// enter the pool.
type genPool struct {
	free []port.Buf // stack of free buffers
	size int
}

func newGenPool(n int) *genPool {
	mem := make([]byte, n*genBufSize)
	p := &genPool{free: make([]port.Buf, n), size: n}
	for i := range p.free {
		p.free[i] = port.Buf{
			Data:   mem[i*genBufSize : (i+1)*genBufSize : (i+1)*genBufSize],
			Off:    port.MemHeadroom,
			Handle: uintptr(i + 1),
		}
	}
	return p
}

// put returns pool buffers; heap buffers (Handle 0) are left to the collector.
func (p *genPool) put(bufs []port.Buf) {
	for i := range bufs {
		if bufs[i].Handle != 0 {
			p.free = append(p.free, bufs[i])
		}
	}
}

// genFeed is what the generator hands out: count frames of set (count < 0: until
// stopped), from slot 0 on, in storage order, cycling.
type genFeed struct {
	set     *frameSet
	left    int64 // worker only
	pos     int   // worker only
	stop    atomic.Bool
	stopped atomic.Bool   // RxBurst saw stop: it hands out nothing more
	handed  atomic.Uint64 // frames handed out
}

// genPort is the external port of the in-memory measurement, a stand-in for a NIC
// with an endless receive ring: RxBurst copies pre-built frames into free buffers, the
// copy standing for the NIC's DMA into an mbuf, on the worker's own core. Nothing is
// expected to be transmitted on it; what is (and what the control goroutine sends) is
// counted and dropped.
type genPort struct {
	name string
	mac  [6]byte
	pool *genPool
	feed atomic.Pointer[genFeed]

	tx    atomic.Uint64 // frames transmitted on the data queue (replies to clients)
	ctlTx atomic.Uint64 // frames the control goroutine transmitted
}

// start makes RxBurst hand out count frames of set (count < 0: until stop).
func (g *genPort) start(set *frameSet, count int64) *genFeed {
	f := &genFeed{set: set, left: count}
	g.feed.Store(f)
	return f
}

func (g *genPort) Name() string  { return g.name }
func (g *genPort) MAC() [6]byte  { return g.mac }
func (g *genPort) RxQueues() int { return 1 }
func (g *genPort) TxQueues() int { return 2 }
func (g *genPort) Headroom() int { return port.MemHeadroom }

// RxBurst fills bufs with copies of the next frames of the feed.
func (g *genPort) RxBurst(queue int, bufs []port.Buf) int {
	if queue != 0 {
		return 0
	}
	return handOut(g.feed.Load(), g.pool, bufs)
}

// handOut fills bufs from pool with copies of the next frames of f (nil: none).
func handOut(f *genFeed, pool *genPool, bufs []port.Buf) int {
	if f == nil {
		return 0
	}
	if f.stop.Load() {
		f.stopped.Store(true)
		return 0
	}
	if f.left == 0 {
		return 0
	}
	n := min(len(bufs), len(pool.free))
	if f.left > 0 && int64(n) > f.left {
		n = int(f.left)
	}
	free := pool.free
	set := f.set
	pos := f.pos
	for i := range n {
		b := free[len(free)-1-i]
		off := pos * set.stride
		b.Len = copy(b.Data[port.MemHeadroom:], set.data[off:off+set.length])
		b.Off = port.MemHeadroom
		bufs[i] = b
		if pos++; pos == set.n {
			pos = 0
		}
	}
	pool.free = free[:len(free)-n]
	f.pos = pos
	if f.left > 0 {
		f.left -= int64(n)
	}
	f.handed.Add(uint64(n))
	return n
}

// TxBurst counts and recycles.
func (g *genPort) TxBurst(queue int, bufs []port.Buf) int {
	if queue == g.TxQueues()-1 {
		g.ctlTx.Add(uint64(len(bufs)))
		return len(bufs) // control frames are heap buffers
	}
	g.tx.Add(uint64(len(bufs)))
	g.pool.put(bufs)
	return len(bufs)
}

// Alloc serves the control goroutine, from the heap.
func (g *genPort) Alloc(bufs []port.Buf) int { return heapAlloc(bufs) }

// Free recycles pool buffers.
func (g *genPort) Free(bufs []port.Buf) { g.pool.put(bufs) }

// sinkPort is the internal port of the in-memory measurement: TxBurst takes every
// frame (as a NIC would, at once) and recycles its buffer; it receives only what a
// feed started on it hands out (the members' replies of the SYN-proxy rows).
type sinkPort struct {
	name  string
	mac   [6]byte
	pool  *genPool
	feed  atomic.Pointer[genFeed]
	ctlTx atomic.Uint64
}

// start makes RxBurst hand out count frames of set (count < 0: until stop).
func (s *sinkPort) start(set *frameSet, count int64) *genFeed {
	f := &genFeed{set: set, left: count}
	s.feed.Store(f)
	return f
}

// RxBurst hands out the feed's frames, if one was started.
func (s *sinkPort) RxBurst(queue int, bufs []port.Buf) int {
	if queue != 0 {
		return 0
	}
	return handOut(s.feed.Load(), s.pool, bufs)
}

func (s *sinkPort) Name() string              { return s.name }
func (s *sinkPort) MAC() [6]byte              { return s.mac }
func (s *sinkPort) RxQueues() int             { return 1 }
func (s *sinkPort) TxQueues() int             { return 2 }
func (s *sinkPort) Headroom() int             { return port.MemHeadroom }
func (s *sinkPort) Alloc(bufs []port.Buf) int { return heapAlloc(bufs) }
func (s *sinkPort) Free(bufs []port.Buf)      { s.pool.put(bufs) }
func (s *sinkPort) TxBurst(q int, bufs []port.Buf) int {
	if q == s.TxQueues()-1 {
		s.ctlTx.Add(uint64(len(bufs)))
		return len(bufs)
	}
	s.pool.put(bufs)
	return len(bufs)
}

// heapAlloc gives the control goroutine buffers of its own, so the pool stays the
// worker's alone.
func heapAlloc(bufs []port.Buf) int {
	for i := range bufs {
		bufs[i] = port.Buf{Data: make([]byte, genBufSize), Off: port.MemHeadroom}
	}
	return len(bufs)
}

// Interface guards.
var (
	_ port.Port = (*genPort)(nil)
	_ port.Port = (*sinkPort)(nil)
)
