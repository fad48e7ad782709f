package daemon

import (
	"errors"
	"sync"
)

// Owner makes a daemon's changes one after the other on one goroutine, the owner,
// which alone touches the state they change, so that state needs no lock: Do queues
// a closure and waits for it to have run. The owner goroutine is Start's, or the
// daemon's own loop taking closures from Ops; either way Close ends the queue.
type Owner struct {
	ops     chan func()
	stop    chan struct{}
	served  chan struct{} // closed when Start's goroutine returns
	stopped error
	once    sync.Once
	started bool
}

// ErrNotStarted is Do's error on a nil Owner: the daemon has not started.
var ErrNotStarted = errors.New("the daemon has not started")

// NewOwner returns an Owner whose Do returns stopped once it is closed.
func NewOwner(stopped error) *Owner {
	return &Owner{ops: make(chan func()), stop: make(chan struct{}), served: make(chan struct{}), stopped: stopped}
}

// Do runs op on the owner goroutine, after the closures queued before it, and waits
// for it. Once the Owner is closed it returns the Owner's stopped error instead, and
// on a nil Owner ErrNotStarted.
func (o *Owner) Do(op func()) error {
	if o == nil {
		return ErrNotStarted
	}
	done := make(chan struct{})
	select {
	case o.ops <- func() { op(); close(done) }:
	case <-o.stop:
		return o.stopped
	}
	<-done
	return nil
}

// Ops is where a daemon's own loop takes the closures to run, one at a time, when it
// is the owner goroutine (instead of Start).
func (o *Owner) Ops() <-chan func() { return o.ops }

// Start runs the owner goroutine: it runs the closures queued until Close.
func (o *Owner) Start() {
	o.started = true
	go func() {
		defer close(o.served)
		for {
			select {
			case op := <-o.ops:
				op()
			case <-o.stop:
				return
			}
		}
	}()
}

// Close stops taking closures (Do returns the stopped error from then on) and, after
// Start, waits for the owner goroutine to return. It may be called more than once.
func (o *Owner) Close() {
	o.once.Do(func() { close(o.stop) })
	if o.started {
		<-o.served
	}
}
