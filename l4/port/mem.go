package port

import (
	"fmt"
	"sync"
	"sync/atomic"
	"weak"
)

// MemHeadroom is the headroom of a Mem buffer: Off of a freshly allocated or injected
// buffer (the same as DPDK's default RTE_PKTMBUF_HEADROOM).
const MemHeadroom = 128

// memIndexBits is how many low bits of a Mem Handle hold the buffer's slot in its pool;
// the bits above hold the pool's ID (from 1, so a valid Handle is never 0).
const memIndexBits = 24

// MaxMemPool is the largest pool a Mem can have.
const MaxMemPool = 1 << memIndexBits

// Mem is an in-memory Port for tests and benchmarks. It owns a fixed pool of buffers
// allocated once by NewMem.
//
// Inject copies frames into pool buffers and queues them for RxBurst. What TxBurst
// takes is copied out and kept for Sent and Drain, and the buffers go back to the pool;
// with Loopback set, TxBurst instead queues the buffers themselves, uncopied, on the
// receive queue of the same number, for throughput benchmarks.
//
// After NewMem, Mem never allocates on RxBurst, TxBurst with Loopback, Alloc or Free:
// each call takes one uncontended mutex per burst, not per packet. Inject, Sent and
// Drain may be called from a test goroutine while workers run. Buffers of different Mem
// ports may be mixed freely (received on one, transmitted on or freed through another).
//
// Mem checks what a real port cannot: freeing or transmitting a buffer that is already
// free, or a frame that lies outside its buffer, panics.
type Mem struct {
	// Loopback makes TxBurst queue transmitted buffers for RxBurst instead of keeping
	// copies. Set it before the first TxBurst.
	Loopback bool

	name    string
	mac     [6]byte
	pool    *memPool
	rx      []memRing
	txLimit atomic.Int64 // frames TxBurst takes per call; < 0: no limit

	sentMu sync.Mutex
	sent   []sentFrame
}

type sentFrame struct {
	queue int
	frame []byte
}

// memRing is a receive queue: a fixed ring of buffers waiting for RxBurst.
type memRing struct {
	mu   sync.Mutex
	ents []Buf
	head int
	n    int
	_    [64]byte // keep queues on separate cache lines
}

// memPool is a fixed set of equal-sized buffers carved from one slice.
type memPool struct {
	id      uintptr
	bufSize int
	mem     []byte

	mu    sync.Mutex
	free  []uint32 // stack of free slots
	owned []bool   // slot is out of the free stack
}

// pools maps a pool ID (minus one) to its pool, weakly, so that a Mem that is no longer
// referenced is collected with its pool.
var pools struct {
	mu   sync.Mutex
	list atomic.Pointer[[]weak.Pointer[memPool]]
}

func registerPool(p *memPool) {
	pools.mu.Lock()
	defer pools.mu.Unlock()
	var list []weak.Pointer[memPool]
	if old := pools.list.Load(); old != nil {
		list = *old
	}
	list = append(list[:len(list):len(list)], weak.Make(p))
	p.id = uintptr(len(list))
	pools.list.Store(&list)
}

// NewMem returns an in-memory port with the given number of receive and transmit queues
// and a pool of poolSize buffers of bufSize bytes each (MemHeadroom included). It panics
// if queues < 1, poolSize is not in [1, MaxMemPool] or bufSize ≤ MemHeadroom: those are
// mistakes in the test that calls it.
func NewMem(name string, mac [6]byte, queues, poolSize, bufSize int) *Mem {
	if queues < 1 || poolSize < 1 || poolSize > MaxMemPool || bufSize <= MemHeadroom {
		panic(fmt.Sprintf("port.NewMem(%q): bad geometry: %d queues, %d buffers of %d bytes", name, queues, poolSize, bufSize))
	}
	p := &memPool{
		bufSize: bufSize,
		mem:     make([]byte, poolSize*bufSize),
		free:    make([]uint32, poolSize),
		owned:   make([]bool, poolSize),
	}
	for i := range p.free {
		p.free[i] = uint32(poolSize - 1 - i) // slot 0 on top
	}
	registerPool(p)
	m := &Mem{name: name, mac: mac, pool: p, rx: make([]memRing, queues)}
	for i := range m.rx {
		m.rx[i].ents = make([]Buf, poolSize)
	}
	m.txLimit.Store(-1)
	return m
}

// Name returns the name given to NewMem.
func (m *Mem) Name() string { return m.name }

// MAC returns the address given to NewMem.
func (m *Mem) MAC() [6]byte { return m.mac }

// RxQueues returns the queue count given to NewMem.
func (m *Mem) RxQueues() int { return len(m.rx) }

// TxQueues returns the queue count given to NewMem.
func (m *Mem) TxQueues() int { return len(m.rx) }

// Headroom returns MemHeadroom.
func (m *Mem) Headroom() int { return MemHeadroom }

// RxBurst takes up to len(bufs) queued buffers from receive queue queue.
func (m *Mem) RxBurst(queue int, bufs []Buf) int {
	r := &m.rx[queue]
	r.mu.Lock()
	n := min(len(bufs), r.n)
	for i := range n {
		j := r.head + i
		if j >= len(r.ents) {
			j -= len(r.ents)
		}
		bufs[i] = r.ents[j]
		r.ents[j] = Buf{}
	}
	r.head += n
	if r.head >= len(r.ents) {
		r.head -= len(r.ents)
	}
	r.n -= n
	r.mu.Unlock()
	return n
}

// TxBurst takes bufs from the front (at most the limit set by SetTxLimit). Without
// Loopback it keeps a copy of each frame for Sent and Drain and frees the buffers; with
// Loopback it queues them on receive queue queue while there is room.
func (m *Mem) TxBurst(queue int, bufs []Buf) int {
	if queue < 0 || queue >= len(m.rx) {
		panic(fmt.Sprintf("port.Mem %q: TxBurst on queue %d of %d", m.name, queue, len(m.rx)))
	}
	n := len(bufs)
	if lim := m.txLimit.Load(); lim >= 0 && int64(n) > lim {
		n = int(lim)
	}
	m.checkBurst("TxBurst", bufs[:n])
	if m.Loopback {
		r := &m.rx[queue]
		r.mu.Lock()
		n = min(n, len(r.ents)-r.n)
		for i := range n {
			j := r.head + r.n + i
			if j >= len(r.ents) {
				j -= len(r.ents)
			}
			r.ents[j] = bufs[i]
		}
		r.n += n
		r.mu.Unlock()
		return n
	}
	m.sentMu.Lock()
	for i := range n {
		m.sent = append(m.sent, sentFrame{queue: queue, frame: append([]byte(nil), bufs[i].Frame()...)})
	}
	m.sentMu.Unlock()
	m.Free(bufs[:n])
	return n
}

// checkBurst panics if a frame lies outside its buffer or a buffer is free; it locks
// each pool once per run of buffers from that pool.
func (m *Mem) checkBurst(op string, bufs []Buf) {
	for i := 0; i < len(bufs); {
		p := poolOf(bufs[i].Handle)
		p.mu.Lock()
		for ; i < len(bufs) && bufs[i].Handle>>memIndexBits == p.id; i++ {
			b := &bufs[i]
			slot := b.Handle & (MaxMemPool - 1)
			switch {
			case b.Off < 0 || b.Len < 0 || b.Off+b.Len > len(b.Data):
				p.mu.Unlock()
				panic(fmt.Sprintf("port.Mem %q: %s: frame [%d:%d+%d] outside its %d-byte buffer", m.name, op, b.Off, b.Off, b.Len, len(b.Data)))
			case int(slot) >= len(p.owned) || !p.owned[slot]:
				p.mu.Unlock()
				panic(fmt.Sprintf("port.Mem %q: %s of buffer %#x that is free", m.name, op, b.Handle))
			}
		}
		p.mu.Unlock()
	}
}

// Alloc fills bufs with free buffers from the pool (Off = MemHeadroom, Len = 0) and
// returns how many; fewer than len(bufs) when the pool runs out.
func (m *Mem) Alloc(bufs []Buf) int {
	p := m.pool
	p.mu.Lock()
	n := min(len(bufs), len(p.free))
	for i := range n {
		slot := p.free[len(p.free)-1-i]
		p.owned[slot] = true
		bufs[i] = Buf{Data: p.buf(slot), Off: MemHeadroom, Handle: p.id<<memIndexBits | uintptr(slot)}
	}
	p.free = p.free[:len(p.free)-n]
	p.mu.Unlock()
	return n
}

// Free returns bufs to their pools (which may be other Mem ports' pools).
func (m *Mem) Free(bufs []Buf) {
	for i := 0; i < len(bufs); {
		p := poolOf(bufs[i].Handle)
		p.mu.Lock()
		for ; i < len(bufs) && bufs[i].Handle>>memIndexBits == p.id; i++ {
			slot := uint32(bufs[i].Handle & (MaxMemPool - 1))
			if int(slot) >= len(p.owned) || !p.owned[slot] {
				p.mu.Unlock()
				panic(fmt.Sprintf("port.Mem %q: Free of buffer %#x that is free", m.name, bufs[i].Handle))
			}
			p.owned[slot] = false
			p.free = append(p.free, slot) // within capacity: one entry per slot
		}
		p.mu.Unlock()
	}
}

func (p *memPool) buf(slot uint32) []byte {
	lo := int(slot) * p.bufSize
	hi := lo + p.bufSize
	return p.mem[lo:hi:hi]
}

// poolOf returns the pool a Mem Handle belongs to.
func poolOf(h uintptr) *memPool {
	id := h >> memIndexBits
	list := pools.list.Load()
	if id == 0 || list == nil || id > uintptr(len(*list)) {
		panic(fmt.Sprintf("port.Mem: handle %#x is not a Mem buffer", h))
	}
	p := (*list)[id-1].Value()
	if p == nil {
		panic(fmt.Sprintf("port.Mem: handle %#x belongs to a Mem that was collected", h))
	}
	return p
}

// Inject queues copies of frames on receive queue 0; see InjectQueue.
func (m *Mem) Inject(frames ...[]byte) int { return m.InjectQueue(0, frames...) }

// InjectQueue copies frames into pool buffers at MemHeadroom and queues them on receive
// queue queue, in order. It returns how many it queued: it stops at the first frame that
// does not fit in a buffer, or when the pool or the queue is full.
func (m *Mem) InjectQueue(queue int, frames ...[]byte) int {
	r := &m.rx[queue]
	var b [1]Buf
	for k, f := range frames {
		if len(f) > m.pool.bufSize-MemHeadroom || m.Alloc(b[:]) == 0 {
			return k
		}
		b[0].Len = copy(b[0].Data[MemHeadroom:], f)
		r.mu.Lock()
		if r.n == len(r.ents) {
			r.mu.Unlock()
			m.Free(b[:])
			return k
		}
		j := r.head + r.n
		if j >= len(r.ents) {
			j -= len(r.ents)
		}
		r.ents[j] = b[0]
		r.n++
		r.mu.Unlock()
	}
	return len(frames)
}

// Pending returns how many buffers wait on receive queue queue.
func (m *Mem) Pending(queue int) int {
	r := &m.rx[queue]
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// Sent returns copies of the frames transmitted so far on all queues, oldest first,
// and keeps them.
func (m *Mem) Sent() [][]byte {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	out := make([][]byte, len(m.sent))
	for i, s := range m.sent {
		out[i] = s.frame
	}
	return out
}

// Drain returns the frames transmitted so far on all queues, oldest first, and forgets
// them.
func (m *Mem) Drain() [][]byte {
	out := m.Sent()
	m.sentMu.Lock()
	m.sent = m.sent[len(out):]
	if len(m.sent) == 0 {
		m.sent = nil
	}
	m.sentMu.Unlock()
	return out
}

// DrainQueue returns the frames transmitted so far on transmit queue queue, oldest
// first, and forgets them (frames of other queues stay).
func (m *Mem) DrainQueue(queue int) [][]byte {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	var out [][]byte
	keep := m.sent[:0]
	for _, s := range m.sent {
		if s.queue == queue {
			out = append(out, s.frame)
		} else {
			keep = append(keep, s)
		}
	}
	clear(m.sent[len(keep):])
	m.sent = keep
	return out
}

// SetTxLimit makes each TxBurst take at most n frames, to exercise a full transmit
// queue; n < 0 removes the limit (the default).
func (m *Mem) SetTxLimit(n int) { m.txLimit.Store(int64(n)) }

// Avail returns how many buffers of this port's pool are free.
func (m *Mem) Avail() int {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	return len(m.pool.free)
}

// Interface guard.
var _ Port = (*Mem)(nil)
