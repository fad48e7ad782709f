package main

import (
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/l4/port"
)

// clockBase is the origin of the meters' timestamps.
var clockBase = time.Now()

// nanotime is monotonic nanoseconds since clockBase (never 0 in practice).
func nanotime() int64 { return int64(time.Since(clockBase)) }

// meter wraps a port and counts, per burst, what the worker receives and transmits on
// its data queue, so a phase is timed where the packets are handled: from the first
// burst received after arm to the burst that completes the expected count. It adds a
// few atomic operations per burst, none per packet. The stamps also record the
// worker thread's CPU time (the worker calls the meter on its own thread), so that on a
// shared machine the packets can be divided by the CPU time the worker really had.
type meter struct {
	port.Port

	rx    atomic.Uint64 // frames received on queue 0
	polls atomic.Uint64 // RxBurst calls
	empty atomic.Uint64 // RxBurst calls that found nothing
	// idle is the time from each empty RxBurst to the next one that found frames: the
	// time the worker waited for the source. A wait that ends with the first frames
	// after arm is not counted (the phase had not begun).
	idle       atomic.Int64
	emptySince int64         // nanotime of the first empty RxBurst of the current run; worker only
	tx         atomic.Uint64 // frames transmitted on the data queues
	ctlTx      atomic.Uint64 // frames transmitted on the control queue

	firstRx    atomic.Int64  // nanotime of the first non-empty RxBurst since arm; 0: none yet
	firstRxCPU atomic.Int64  // the receiving thread's CPU time then
	target     atomic.Uint64 // tx count that completes the phase; 0: none
	doneAt     atomic.Int64  // nanotime when tx reached target; 0: not yet
	doneCPU    atomic.Int64  // the transmitting thread's CPU time then

	wantSample atomic.Bool
	sample     atomic.Pointer[[]byte] // a copy of the first frame transmitted after wantSample

	// capture, when set, keeps a copy of every frame transmitted on the data queues
	// (the SYN-proxy rows' handshakes; never while a phase is timed).
	capture atomic.Pointer[frameSet]
}

func newMeter(p port.Port) *meter { return &meter{Port: p} }

// arm starts timing a phase that ends when target more frames have been transmitted
// (target 0: no end stamp).
func (m *meter) arm(target uint64) {
	m.doneAt.Store(0)
	m.firstRx.Store(0)
	if target > 0 {
		m.target.Store(m.tx.Load() + target)
	} else {
		m.target.Store(0)
	}
}

// RxBurst counts what the wrapped port receives.
func (m *meter) RxBurst(queue int, bufs []port.Buf) int {
	n := m.Port.RxBurst(queue, bufs)
	m.polls.Add(1)
	if n == 0 {
		m.empty.Add(1)
		if m.emptySince == 0 {
			m.emptySince = nanotime()
		}
		return 0
	}
	m.rx.Add(uint64(n))
	if m.firstRx.Load() == 0 {
		m.firstRxCPU.Store(selfThreadCPU())
		m.firstRx.Store(nanotime())
		m.emptySince = 0
	} else if m.emptySince != 0 {
		m.idle.Add(nanotime() - m.emptySince)
		m.emptySince = 0
	}
	return n
}

// TxBurst counts what the wrapped port takes.
func (m *meter) TxBurst(queue int, bufs []port.Buf) int {
	if queue == m.Port.TxQueues()-1 {
		n := m.Port.TxBurst(queue, bufs)
		m.ctlTx.Add(uint64(n))
		return n
	}
	if c := m.capture.Load(); c != nil {
		for i := range bufs {
			if f := bufs[i].Frame(); c.n < cap(c.data)/c.stride && len(f) <= c.stride {
				copy(c.data[c.n*c.stride:], f)
				c.n++
			}
		}
	}
	if len(bufs) > 0 && m.wantSample.Load() {
		f := append([]byte(nil), bufs[0].Frame()...)
		m.sample.Store(&f)
		m.wantSample.Store(false)
	}
	n := m.Port.TxBurst(queue, bufs)
	t := m.tx.Add(uint64(n))
	if tg := m.target.Load(); tg != 0 && t >= tg && m.doneAt.Load() == 0 {
		m.doneCPU.Store(selfThreadCPU())
		m.doneAt.Store(nanotime())
	}
	return n
}

// takeSample asks for a copy of the next transmitted frame.
func (m *meter) takeSample() {
	m.sample.Store(nil)
	m.wantSample.Store(true)
}
