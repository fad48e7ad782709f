package port

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
)

var testMAC = [6]byte{0x02, 0, 0, 0, 0, 1}

func frame(i, n int) []byte {
	f := make([]byte, n)
	for j := range f {
		f[j] = byte(i + j)
	}
	return f
}

func TestMemIdentity(t *testing.T) {
	m := NewMem("ext", testMAC, 3, 8, 256)
	if m.Name() != "ext" || m.MAC() != testMAC || m.RxQueues() != 3 || m.TxQueues() != 3 || m.Headroom() != MemHeadroom {
		t.Fatalf("identity: %q %v rx=%d tx=%d headroom=%d", m.Name(), m.MAC(), m.RxQueues(), m.TxQueues(), m.Headroom())
	}
	if m.Avail() != 8 {
		t.Fatalf("Avail = %d, want 8", m.Avail())
	}
}

func TestNewMemRejectsBadGeometry(t *testing.T) {
	for _, tc := range []struct{ queues, pool, size int }{
		{0, 8, 256}, {1, 0, 256}, {1, 8, MemHeadroom}, {1, MaxMemPool + 1, 256},
	} {
		t.Run(fmt.Sprint(tc), func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			NewMem("bad", testMAC, tc.queues, tc.pool, tc.size)
		})
	}
}

func TestMemInjectAndRxBurst(t *testing.T) {
	for _, tc := range []struct {
		name             string
		pool, inject     int
		burst            int
		wantQueued       int
		wantFirst, wantN int // first RxBurst
	}{
		{"fewer than a burst", 16, 3, 32, 3, 3, 0},
		{"more than a burst", 16, 10, 4, 10, 4, 0},
		{"pool exhausted", 4, 6, 32, 4, 4, 0},
		{"empty", 4, 0, 32, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMem("p", testMAC, 2, tc.pool, 512)
			var frames [][]byte
			for i := range tc.inject {
				frames = append(frames, frame(i, 60+i))
			}
			if got := m.Inject(frames...); got != tc.wantQueued {
				t.Fatalf("Inject = %d, want %d", got, tc.wantQueued)
			}
			if m.Pending(0) != tc.wantQueued || m.Pending(1) != 0 {
				t.Fatalf("Pending = %d/%d", m.Pending(0), m.Pending(1))
			}
			bufs := make([]Buf, tc.burst)
			var got [][]byte
			for {
				n := m.RxBurst(0, bufs)
				if len(got) == 0 && n != tc.wantFirst {
					t.Fatalf("first RxBurst = %d, want %d", n, tc.wantFirst)
				}
				if n == 0 {
					break
				}
				for _, b := range bufs[:n] {
					if b.Off != MemHeadroom || len(b.Data) != 512 || b.Handle == 0 {
						t.Fatalf("buffer: off %d, %d bytes, handle %#x", b.Off, len(b.Data), b.Handle)
					}
					got = append(got, bytes.Clone(b.Frame()))
				}
				m.Free(bufs[:n])
			}
			if len(got) != tc.wantQueued {
				t.Fatalf("received %d frames, want %d", len(got), tc.wantQueued)
			}
			for i, f := range got {
				if !bytes.Equal(f, frames[i]) {
					t.Fatalf("frame %d: got % x, want % x", i, f, frames[i])
				}
			}
			if m.Avail() != tc.pool {
				t.Fatalf("Avail after freeing all = %d, want %d", m.Avail(), tc.pool)
			}
		})
	}
}

func TestMemInjectTooLarge(t *testing.T) {
	m := NewMem("p", testMAC, 1, 4, 256)
	if n := m.Inject(frame(0, 64), frame(1, 256-MemHeadroom+1), frame(2, 64)); n != 1 {
		t.Fatalf("Inject = %d, want 1 (stop at the frame that does not fit)", n)
	}
	if n := m.InjectQueue(0, frame(0, 256-MemHeadroom)); n != 1 {
		t.Fatalf("a frame that exactly fits: Inject = %d", n)
	}
	if m.Avail() != 2 {
		t.Fatalf("Avail = %d, want 2", m.Avail())
	}
}

func TestMemAllocExhaustionAndFree(t *testing.T) {
	m := NewMem("p", testMAC, 1, 5, 256)
	bufs := make([]Buf, 4)
	if n := m.Alloc(bufs); n != 4 {
		t.Fatalf("Alloc = %d, want 4", n)
	}
	seen := map[uintptr]bool{}
	for _, b := range bufs {
		if b.Off != MemHeadroom || b.Len != 0 || len(b.Data) != 256 || cap(b.Data) != 256 {
			t.Fatalf("fresh buffer: off %d len %d size %d cap %d", b.Off, b.Len, len(b.Data), cap(b.Data))
		}
		if seen[b.Handle] {
			t.Fatalf("handle %#x handed out twice", b.Handle)
		}
		seen[b.Handle] = true
	}
	more := make([]Buf, 4)
	if n := m.Alloc(more); n != 1 {
		t.Fatalf("Alloc from a pool with one left = %d, want 1", n)
	}
	if n := m.Alloc(more[1:]); n != 0 || m.Avail() != 0 {
		t.Fatalf("Alloc from an empty pool = %d (avail %d)", n, m.Avail())
	}
	if n := m.Inject(frame(0, 60)); n != 0 {
		t.Fatalf("Inject into an empty pool = %d", n)
	}
	m.Free(bufs)
	m.Free(more[:1])
	if m.Avail() != 5 {
		t.Fatalf("Avail after Free = %d, want 5", m.Avail())
	}
	// Buffers do not overlap: writing every byte of each leaves the others intact.
	all := make([]Buf, 5)
	m.Alloc(all)
	for i, b := range all {
		for j := range b.Data {
			b.Data[j] = byte(i)
		}
	}
	for i, b := range all {
		if bytes.Count(b.Data, []byte{byte(i)}) != len(b.Data) {
			t.Fatalf("buffer %d was overwritten by another", i)
		}
	}
	m.Free(all)
}

func TestMemTxKeepsCopies(t *testing.T) {
	m := NewMem("p", testMAC, 2, 8, 256)
	bufs := make([]Buf, 3)
	m.Alloc(bufs)
	for i := range bufs {
		// Prepend into the headroom, as encapsulation does.
		bufs[i].Off -= 4
		bufs[i].Len = copy(bufs[i].Data[bufs[i].Off:], frame(i, 10+i))
	}
	if n := m.TxBurst(1, bufs[:2]); n != 2 {
		t.Fatalf("TxBurst = %d", n)
	}
	if n := m.TxBurst(0, bufs[2:]); n != 1 {
		t.Fatalf("TxBurst = %d", n)
	}
	if m.Avail() != 8 {
		t.Fatalf("transmitted buffers not returned to the pool: avail %d", m.Avail())
	}
	sent := m.Sent()
	if len(sent) != 3 || !bytes.Equal(sent[0], frame(0, 10)) || !bytes.Equal(sent[2], frame(2, 12)) {
		t.Fatalf("Sent = %x", sent)
	}
	// The copies do not alias pool memory.
	m.Alloc(bufs)
	for _, b := range bufs {
		clear(b.Data)
	}
	m.Free(bufs)
	if !bytes.Equal(m.Sent()[0], frame(0, 10)) {
		t.Fatal("Sent frame aliases a pool buffer")
	}
	if q1 := m.DrainQueue(1); len(q1) != 2 || !bytes.Equal(q1[1], frame(1, 11)) {
		t.Fatalf("DrainQueue(1) = %x", q1)
	}
	if d := m.Drain(); len(d) != 1 || !bytes.Equal(d[0], frame(2, 12)) {
		t.Fatalf("Drain = %x", d)
	}
	if len(m.Drain()) != 0 || len(m.Sent()) != 0 {
		t.Fatal("Drain did not forget")
	}
}

func TestMemTxLimit(t *testing.T) {
	m := NewMem("p", testMAC, 1, 8, 256)
	bufs := make([]Buf, 5)
	m.Alloc(bufs)
	m.SetTxLimit(2)
	if n := m.TxBurst(0, bufs); n != 2 {
		t.Fatalf("TxBurst with limit 2 = %d", n)
	}
	m.SetTxLimit(0)
	if n := m.TxBurst(0, bufs[2:]); n != 0 {
		t.Fatalf("TxBurst with limit 0 = %d", n)
	}
	m.SetTxLimit(-1)
	if n := m.TxBurst(0, bufs[2:]); n != 3 {
		t.Fatalf("TxBurst without limit = %d", n)
	}
	if m.Avail() != 8 || len(m.Drain()) != 5 {
		t.Fatalf("avail %d", m.Avail())
	}
}

func TestMemLoopback(t *testing.T) {
	m := NewMem("p", testMAC, 2, 64, 256)
	m.Loopback = true
	var frames [][]byte
	for i := range 40 {
		frames = append(frames, frame(i, 60))
	}
	if m.InjectQueue(1, frames...) != 40 {
		t.Fatal("inject")
	}
	bufs := make([]Buf, 32)
	n := m.RxBurst(1, bufs)
	if n != 32 {
		t.Fatalf("RxBurst = %d", n)
	}
	handles := map[uintptr]bool{}
	for i := range n {
		handles[bufs[i].Handle] = true
		bufs[i].Data[bufs[i].Off] ^= 0xff // visible after the loop: no copy
	}
	// TxBurst on queue 1 loops to RX queue 1, behind the 8 still queued.
	if got := m.TxBurst(1, bufs[:n]); got != n {
		t.Fatalf("loopback TxBurst = %d", got)
	}
	if len(m.Sent()) != 0 {
		t.Fatal("loopback kept copies")
	}
	var got [][]byte
	for {
		k := m.RxBurst(1, bufs)
		if k == 0 {
			break
		}
		for _, b := range bufs[:k] {
			got = append(got, bytes.Clone(b.Frame()))
		}
		m.Free(bufs[:k])
	}
	if len(got) != 40 {
		t.Fatalf("received %d", len(got))
	}
	for i := range 8 {
		if !bytes.Equal(got[i], frames[32+i]) {
			t.Fatalf("frame %d out of order", i)
		}
	}
	for i := range 32 {
		want := bytes.Clone(frames[i])
		want[0] ^= 0xff
		if !bytes.Equal(got[8+i], want) {
			t.Fatalf("looped frame %d: % x, want % x", i, got[8+i], want)
		}
	}
	if m.Avail() != 64 {
		t.Fatalf("Avail = %d", m.Avail())
	}
}

func TestMemLoopbackDoesNotAllocate(t *testing.T) {
	m := NewMem("p", testMAC, 1, 64, 2048)
	m.Loopback = true
	for i := range 32 {
		m.Inject(frame(i, 64))
	}
	bufs := make([]Buf, 32)
	allocs := testing.AllocsPerRun(100, func() {
		n := m.RxBurst(0, bufs)
		if m.TxBurst(0, bufs[:n]) != n {
			panic("loopback TxBurst short")
		}
	})
	if allocs != 0 {
		t.Fatalf("RxBurst+TxBurst on loopback: %v allocations per burst", allocs)
	}
	allocs = testing.AllocsPerRun(100, func() {
		n := m.Alloc(bufs)
		m.Free(bufs[:n])
	})
	if allocs != 0 {
		t.Fatalf("Alloc+Free: %v allocations per burst", allocs)
	}
}

func TestMemBuffersCrossPorts(t *testing.T) {
	ext := NewMem("ext", testMAC, 1, 4, 256)
	in := NewMem("int", testMAC, 1, 4, 512)
	ext.Inject(frame(1, 60), frame(2, 60))
	bufs := make([]Buf, 4)
	n := ext.RxBurst(0, bufs)
	k := in.Alloc(bufs[n:])
	if n != 2 || k != 2 {
		t.Fatalf("rx %d alloc %d", n, k)
	}
	bufs[2].Len = copy(bufs[2].Data[bufs[2].Off:], frame(3, 70))
	// A mixed burst: two of ext's buffers then one of int's, transmitted on int.
	if got := in.TxBurst(0, bufs[:3]); got != 3 {
		t.Fatalf("TxBurst = %d", got)
	}
	// And one of int's freed through ext.
	ext.Free(bufs[3:4])
	if ext.Avail() != 4 || in.Avail() != 4 {
		t.Fatalf("avail ext %d int %d", ext.Avail(), in.Avail())
	}
	if s := in.Drain(); len(s) != 3 || !bytes.Equal(s[0], frame(1, 60)) || !bytes.Equal(s[2], frame(3, 70)) {
		t.Fatalf("sent %x", s)
	}
}

func TestMemMisusePanics(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		do         func(m *Mem, b []Buf)
	}{
		{"double free", "that is free", func(m *Mem, b []Buf) { m.Free(b); m.Free(b) }},
		{"transmit after free", "that is free", func(m *Mem, b []Buf) { m.Free(b); m.TxBurst(0, b) }},
		{"frame past the buffer", "outside", func(m *Mem, b []Buf) { b[0].Len = len(b[0].Data); m.TxBurst(0, b) }},
		{"negative offset", "outside", func(m *Mem, b []Buf) { b[0].Off = -1; m.TxBurst(0, b) }},
		{"foreign handle", "not a Mem buffer", func(m *Mem, b []Buf) { b[0].Handle = 7; m.Free(b) }},
		{"bad queue", "queue", func(m *Mem, b []Buf) { m.TxBurst(1, b) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMem("p", testMAC, 1, 4, 256)
			b := make([]Buf, 1)
			m.Alloc(b)
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), tc.want) {
					t.Fatalf("panic %v, want one containing %q", r, tc.want)
				}
			}()
			tc.do(m, b)
		})
	}
}

// TestMemConcurrentInject runs a worker (RxBurst, loopback TxBurst, Free) against a
// test goroutine injecting and reading; run it with -race.
func TestMemConcurrentInject(t *testing.T) {
	m := NewMem("p", testMAC, 2, 256, 256)
	m.Loopback = true
	const total = 2000
	var wg sync.WaitGroup
	received := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		bufs := make([]Buf, 32)
		for received < total {
			n := m.RxBurst(0, bufs)
			// Send half back around once, free the rest.
			for i := range n {
				if bufs[i].Data[bufs[i].Off] == 0 {
					bufs[i].Data[bufs[i].Off] = 1
					if m.TxBurst(0, bufs[i:i+1]) == 1 {
						continue
					}
				}
				m.Free(bufs[i : i+1])
				received++
			}
		}
	}()
	for i := 0; i < total; {
		f := []byte{byte(i % 2), 2, 3}
		i += m.Inject(f)
	}
	wg.Wait()
	if m.Avail() != 256 {
		t.Fatalf("Avail = %d after the run", m.Avail())
	}
}

func BenchmarkMemLoopback(b *testing.B) {
	m := NewMem("p", testMAC, 1, 1024, 2048)
	m.Loopback = true
	for i := range 512 {
		m.Inject(frame(i, 64))
	}
	bufs := make([]Buf, 32)
	b.ReportAllocs()
	pkts := 0
	for b.Loop() {
		n := m.RxBurst(0, bufs)
		pkts += m.TxBurst(0, bufs[:n])
	}
	b.ReportMetric(float64(pkts)/b.Elapsed().Seconds()/1e6, "Mpps")
}
