package main

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/l4/port"
)

const (
	bufSize  = 2048
	headroom = port.MemHeadroom
	frameLen = 14 + 20 + 20
)

// pool is the buffers of a generator port and its sink, used by one worker
// goroutine only (RxBurst, TxBurst and Free of both ports), so it takes no lock.
type pool struct {
	mem  []byte
	free []uint32
}

func newPool(n int) *pool {
	p := &pool{mem: make([]byte, n*bufSize)}
	for i := range n {
		p.free = append(p.free, uint32(i))
	}
	return p
}

func (p *pool) buf(i uint32) []byte { return p.mem[int(i)*bufSize : int(i+1)*bufSize] }

func (p *pool) put(bufs []port.Buf) {
	for _, b := range bufs {
		p.free = append(p.free, uint32(b.Handle))
	}
}

// genPort stands for the external NIC: RxBurst writes client → VIP TCP frames of
// flows 0..flows-1, in turn, into buffers (the NIC's DMA), SYNs or ACKs, for the job
// that start set, until it has made the job's limit or pause ended it.
//
// A job is handed to the worker whole (one pointer), and pause waits until the
// worker has finished the burst it was in: a burst of the job before never counts
// towards the next, nor leaves frames in flight after pause.
type genPort struct {
	p      *pool
	mac    [6]byte
	tmpl   [frameLen]byte
	flows  int
	job    atomic.Pointer[genJob]
	bursts atomic.Uint64 // RxBurst calls begun
	freed  atomic.Uint64
	// The worker's alone.
	cur  *genJob
	next int
}

// genJob is one run of frames: SYNs or ACKs, limit of them (0: without end).
type genJob struct {
	syn      bool
	limit    int64
	produced atomic.Int64
}

func newGenPort(p *pool, mac, dstMAC [6]byte, vip [4]byte, flows int) *genPort {
	g := &genPort{p: p, mac: mac, flows: flows}
	t := g.tmpl[:]
	copy(t[0:6], dstMAC[:])
	copy(t[6:12], []byte{2, 0, 0, 0, 0xe0, 0xfe})
	binary.BigEndian.PutUint16(t[12:], 0x0800)
	ip := t[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(ip[2:], 40)
	copy(ip[16:20], vip[:])
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[2:], 443)
	binary.BigEndian.PutUint32(tcp[4:], 1000)
	tcp[12] = 5 << 4
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	return g
}

// client is flow i's address and port: 198.19.0.0/16, ports from 10000.
func client(i int) ([4]byte, uint16) {
	return [4]byte{198, 19, byte(i >> 8), byte(i)}, uint16(10000 + i>>16)
}

// start produces count frames (SYNs when syn) from flow 0; count 0: without end.
// It returns the job, whose produced count says how far it got.
func (g *genPort) start(syn bool, count int64) *genJob {
	g.pause()
	j := &genJob{syn: syn, limit: count}
	g.job.Store(j)
	return j
}

// pause ends the job under way and returns once the worker is past the burst it
// was in (or after a second, if the worker is stopped).
func (g *genPort) pause() {
	if g.job.Swap(nil) == nil {
		return
	}
	b := g.bursts.Load()
	for deadline := time.Now().Add(time.Second); g.bursts.Load() < b+2 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Microsecond)
	}
}

func (g *genPort) Name() string         { return "gen" }
func (g *genPort) MAC() [6]byte         { return g.mac }
func (g *genPort) RxQueues() int        { return 1 }
func (g *genPort) TxQueues() int        { return 1 }
func (g *genPort) Headroom() int        { return headroom }
func (g *genPort) Alloc([]port.Buf) int { return 0 }

func (g *genPort) RxBurst(_ int, bufs []port.Buf) int {
	g.bursts.Add(1)
	j := g.job.Load()
	if j == nil {
		return 0
	}
	if j != g.cur {
		g.cur, g.next = j, 0
	}
	flags := byte(0x10)
	if j.syn {
		flags = 0x02
	}
	n := len(bufs)
	if j.limit > 0 {
		n = int(min(int64(n), j.limit-j.produced.Load()))
	}
	n = min(n, len(g.p.free))
	for k := range n {
		i := g.p.free[len(g.p.free)-1]
		g.p.free = g.p.free[:len(g.p.free)-1]
		b := g.p.buf(i)
		f := b[headroom : headroom+frameLen]
		copy(f, g.tmpl[:])
		addr, sport := client(g.next)
		ip := f[14:]
		copy(ip[12:16], addr[:])
		var sum uint32
		for j := 0; j < 20; j += 2 {
			sum += uint32(binary.BigEndian.Uint16(ip[j:]))
		}
		for sum > 0xffff {
			sum = sum&0xffff + sum>>16
		}
		binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
		binary.BigEndian.PutUint16(ip[20:], sport)
		ip[33] = flags
		bufs[k] = port.Buf{Data: b, Off: headroom, Len: frameLen, Handle: uintptr(i)}
		if g.next++; g.next == g.flows {
			g.next = 0
		}
	}
	j.produced.Add(int64(n))
	return n
}

func (g *genPort) TxBurst(_ int, bufs []port.Buf) int {
	g.p.put(bufs)
	return len(bufs)
}

func (g *genPort) Free(bufs []port.Buf) {
	g.freed.Add(uint64(len(bufs)))
	g.p.put(bufs)
}

// sinkPort stands for the internal NIC: it counts what it is given to send.
type sinkPort struct {
	p    *pool
	mac  [6]byte
	sent atomic.Uint64
}

func (s *sinkPort) Name() string                { return "sink" }
func (s *sinkPort) MAC() [6]byte                { return s.mac }
func (s *sinkPort) RxQueues() int               { return 1 }
func (s *sinkPort) TxQueues() int               { return 1 }
func (s *sinkPort) Headroom() int               { return headroom }
func (s *sinkPort) Alloc([]port.Buf) int        { return 0 }
func (s *sinkPort) RxBurst(int, []port.Buf) int { return 0 }

func (s *sinkPort) TxBurst(_ int, bufs []port.Buf) int {
	s.sent.Add(uint64(len(bufs)))
	s.p.put(bufs)
	return len(bufs)
}

func (s *sinkPort) Free(bufs []port.Buf) { s.p.put(bufs) }

var (
	_ port.Port = (*genPort)(nil)
	_ port.Port = (*sinkPort)(nil)
)
