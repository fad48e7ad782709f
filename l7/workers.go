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
// connections, and so the busy workers; idle ones end after workerIdle.
type workers struct {
	ready chan *tcpConn // unbuffered: a send succeeds only to an idle worker
	stop  chan struct{}
	serve func(*tcpConn)
	idle  time.Duration
	wg    sync.WaitGroup
}

func newWorkers(serve func(*tcpConn), idle time.Duration) *workers {
	return &workers{ready: make(chan *tcpConn), stop: make(chan struct{}), serve: serve, idle: idle}
}

// run serves c on an idle worker, or on a new one if none is idle.
func (w *workers) run(c *tcpConn) {
	select {
	case w.ready <- c:
	default:
		w.wg.Go(func() { w.loop(c) })
	}
}

func (w *workers) loop(c *tcpConn) {
	w.serve(c)
	t := time.NewTimer(w.idle)
	defer t.Stop()
	for {
		select {
		case c = <-w.ready:
		case <-t.C:
			return
		case <-w.stop:
			return
		}
		w.serve(c)
		t.Reset(w.idle)
	}
}

// close ends the idle workers and waits for the busy ones to finish their
// connections. run must not be called after it.
func (w *workers) close() {
	close(w.stop)
	w.wg.Wait()
}
