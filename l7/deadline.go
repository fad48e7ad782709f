package l7

import (
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// lazySlack is the share of the time left until a deadline by which the deadline
// armed for it may fire late: a sixteenth, 3.75 s of a 60 s timeout, 12.5 ms of a
// 200 ms one.
const lazySlack = 16

// lazyDeadlines keeps a connection's read and write deadlines lazily, as nginx keeps
// its timers (NGX_TIMER_LAZY_DELAY): a deadline set is not passed to the runtime
// when the deadline armed there already falls between it and a sixteenth of the
// time left until it past it; when it is passed on, the runtime is given the
// deadline plus that sixteenth. A keep-alive connection sets the same timeouts again
// for each request (fasthttp its write deadline before each response, the backend
// client the request's deadline on the backend connection), each a little later
// than the last: these are skipped until the margin is used up. Each set passed on
// costs a clock read, the poll descriptor's lock and a change to the runtime's
// timer heap (0.2-0.3 µs in l7d under load; six a proxied request were 3-5% of its
// CPU); one skipped costs a read of the monotonic clock.
//
// The price is precision: a deadline fires up to a sixteenth of the time it was
// set for late (3.75 s of IdleTimeout's 60 s, 0.625 s of ReadHeaderTimeout's 10 s),
// never early. A deadline in the past, such as drainDeadline, and a cleared one
// (zero) are passed on at once.
//
// It records what it armed, not what the runtime holds. A deadline in the past set
// on the connection under it, as shutdown sets drainDeadline on the raw connection
// from another goroutine, stays in force over the deadlines it skips, and is
// replaced only by one it passes on, as it would have been by any set passed on
// directly. A later deadline or none must never be set under it: it would skip
// deadlines it takes for armed. Its methods are for one goroutine at a time.
type lazyDeadlines struct {
	read, write time.Time // as armed in the runtime; zero for none
}

// lazyPlan returns the deadline to arm for t given armed, and whether the runtime
// must be called at all. left is the time until t.
func lazyPlan(armed, t time.Time, left time.Duration) (time.Time, bool) {
	if left > 0 {
		slack := left / lazySlack
		// None armed (zero) or one in the past (drainDeadline) is far behind t.
		if ahead := armed.Sub(t); ahead >= 0 && ahead <= slack {
			return armed, false
		}
		return t.Add(slack), true
	}
	if t.IsZero() {
		return t, !armed.IsZero()
	}
	return t, true // in the past: at once
}

// until is the time left until t, or 0 for no deadline. For a t read from the
// monotonic clock (time.Now().Add) it reads only that clock, not the wall clock
// as well as time.Now does.
func until(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return time.Until(t)
}

func (d *lazyDeadlines) setRead(c net.Conn, t time.Time) error {
	return d.setReadLeft(c, t, until(t))
}

// setReadLeft is setRead with the time left until t already read.
func (d *lazyDeadlines) setReadLeft(c net.Conn, t time.Time, left time.Duration) error {
	arm, call := lazyPlan(d.read, t, left)
	if !call {
		return nil
	}
	if err := c.SetReadDeadline(arm); err != nil {
		return err
	}
	d.read = arm
	return nil
}

func (d *lazyDeadlines) setWrite(c net.Conn, t time.Time) error {
	arm, call := lazyPlan(d.write, t, until(t))
	if !call {
		return nil
	}
	if err := c.SetWriteDeadline(arm); err != nil {
		return err
	}
	d.write = arm
	return nil
}

func (d *lazyDeadlines) set(c net.Conn, t time.Time) error {
	left := until(t)
	r, callR := lazyPlan(d.read, t, left)
	w, callW := lazyPlan(d.write, t, left)
	var err error
	switch {
	case callR && callW: // r == w: both t, or both t plus the same slack
		err = c.SetDeadline(r)
	case callR:
		err = c.SetReadDeadline(r)
	case callW:
		err = c.SetWriteDeadline(w)
	default:
		return nil
	}
	if err != nil {
		return err
	}
	if callR {
		d.read = r
	}
	if callW {
		d.write = w
	}
	return nil
}

// lazyConn is a connection whose deadlines are lazyDeadlines. It is used by one
// goroutine at a time, as a backend connection is by the request holding it.
type lazyConn struct {
	net.Conn
	d lazyDeadlines
}

func (c *lazyConn) SetDeadline(t time.Time) error      { return c.d.set(c.Conn, t) }
func (c *lazyConn) SetReadDeadline(t time.Time) error  { return c.d.setRead(c.Conn, t) }
func (c *lazyConn) SetWriteDeadline(t time.Time) error { return c.d.setWrite(c.Conn, t) }

// dialBackend dials a backend as fasthttp.DialTimeout does and returns the
// connection with lazy deadlines: the backend client sets its write and read
// deadlines to each request's deadline, which moves forward by the time between
// two requests on the connection.
func dialBackend(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := fasthttp.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return &lazyConn{Conn: c}, nil
}

// hasBody reports whether a request whose header h is has a body to read: a
// Content-Length above zero (ContentLength returns it) or a chunked body (-1). A
// request with neither (-2 when its header has just been read, 0 once its body has
// been) or with Content-Length: 0 has none.
func hasBody(h *fasthttp.RequestHeader) bool {
	n := h.ContentLength()
	return n > 0 || n == -1
}
