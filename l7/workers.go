package l7

import (
	"sync"
	"time"
)

// workerIdle is how long a connection worker waits for another connection before it
// ends.
const workerIdle = 10 * time.Second

// workers runs TCP connections on goroutines that serve one connection after
// another. A TLS handshake runs deep in crypto/tls, which makes a new goroutine grow
// its initial stack by copying it, on every connection; a goroutine that outlives its
// connection keeps the grown stack for the next one (until a garbage collection finds
// it idle and shrinks it). The pool has no size of its own: MaxConns bounds the
// connections, and so the busy workers; idle ones end after idle.
//
// The idle workers are a stack: a connection goes to the worker that became idle
// last, whose stack and data are the likeliest still in the CPU's caches, as
// fasthttp's worker pool and Go's own free goroutines do. (A channel that idle
// workers wait on hands connections out first-come first-served: after a burst has
// left thousands idle, each connection of a later trickle would run on the coldest.)
// Idle workers leave from the bottom, the longest idle first, swept by one timer
// armed only while there are idle workers, not one timer per idle worker.
type workers struct {
	serve func(*tcpConn)
	idle  time.Duration
	wg    sync.WaitGroup

	mu      sync.Mutex
	ready   []*worker // idle, the most recently idle last
	sweep   *time.Timer
	swept   bool // sweep is armed
	stopped bool
}

// worker is an idle worker's mailbox: a connection to serve, or nil to end.
type worker struct {
	ch    chan *tcpConn // capacity 1: handing over never blocks
	since time.Time     // idle since
}

func newWorkers(serve func(*tcpConn), idle time.Duration) *workers {
	w := &workers{serve: serve, idle: idle}
	w.sweep = time.AfterFunc(time.Hour, w.expire)
	w.sweep.Stop()
	return w
}

// run serves c on the most recently idle worker, or on a new one if none is idle.
func (w *workers) run(c *tcpConn) {
	w.mu.Lock()
	if n := len(w.ready); n > 0 {
		wk := w.ready[n-1]
		w.ready[n-1] = nil
		w.ready = w.ready[:n-1]
		w.mu.Unlock()
		wk.ch <- c
		return
	}
	w.mu.Unlock()
	wk := &worker{ch: make(chan *tcpConn, 1)}
	w.wg.Go(func() { w.loop(wk, c) })
}

func (w *workers) loop(wk *worker, c *tcpConn) {
	for c != nil {
		w.serve(c)
		if !w.release(wk) {
			return
		}
		c = <-wk.ch
	}
}

// release puts wk on the idle stack; false when the pool is closed.
func (w *workers) release(wk *worker) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	wk.since = time.Now()
	w.ready = append(w.ready, wk)
	if !w.swept {
		w.swept = true
		w.sweep.Reset(w.idle)
	}
	return true
}

// expire ends the workers idle for idle or longer, and rearms the sweep for the
// longest idle of the rest.
func (w *workers) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.swept = false
	if w.stopped {
		return
	}
	now := time.Now()
	n := 0
	for n < len(w.ready) && now.Sub(w.ready[n].since) >= w.idle {
		w.ready[n].ch <- nil
		n++
	}
	if n > 0 {
		rest := copy(w.ready, w.ready[n:])
		clear(w.ready[rest:])
		w.ready = w.ready[:rest]
	}
	if len(w.ready) > 0 {
		w.swept = true
		w.sweep.Reset(w.idle - now.Sub(w.ready[0].since))
	}
}

// close ends the idle workers and waits for the busy ones to finish their
// connections. run must not be called after it.
func (w *workers) close() {
	w.mu.Lock()
	w.stopped = true
	w.sweep.Stop()
	for _, wk := range w.ready {
		wk.ch <- nil
	}
	clear(w.ready)
	w.ready = nil
	w.mu.Unlock()
	w.wg.Wait()
}
