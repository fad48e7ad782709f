package l7

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// handshakeConn is the TCP connection as crypto/tls reads and writes it. During the
// handshake it keeps HandshakeTimeout a bound on the time the handshake waits for its
// client, and not on the time the client waits for l7d: time spent between two reads
// or writes (computing, a signature queued behind others, a goroutine waiting for a
// core, an offloaded key's round trip) is added to the connection's deadline before
// the next one. A deadline counted from accept alone failed the later connections of
// a burst of full handshakes with a local key: each was waiting for a core behind
// the signatures of those accepted before it when its time ran out, after part of
// its work had been done, and was closed unanswered. nginx's timeouts likewise run
// only while it waits for the client.
//
// The server's time is added only once it reaches a sixteenth of HandshakeTimeout,
// so an ordinary handshake sets its deadline once, at accept (the client's budget is
// then short of HandshakeTimeout by less than that sixteenth). After the handshake
// the connection passes reads and writes straight through, but for a held write
// (holdNext). Its methods run on the goroutine serving the connection.
type handshakeConn struct {
	net.Conn
	l         *listener
	deadline  time.Time     // read and write deadline in force; zero once the handshake is over
	last      time.Time     // when the handshake last stopped waiting for the client (accept, first)
	owed      time.Duration // the server's time since last, not yet added to deadline
	slack     time.Duration // owed is added to deadline once it reaches this
	handshake bool

	hold bool    // holdNext: keep the next write back
	held *[]byte // a write kept back, sent with the next write, or before a read or close
}

// maxHeld is the largest write kept back: a response sent whole in one write.
const maxHeld = 16 << 10

var heldPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// heldWrites counts the writes kept back (tests).
var heldWrites atomic.Int64

// holdNext keeps the next write back until the write after it, a read or Close,
// and sends both in one write. HTTP/1.1 arms it for a response written whole
// before the server closes the connection (an HTTP/1.0 request, Connection: close):
// the response and the close_notify alert crypto/tls sends on Close then leave in
// one system call and one TCP segment, where they took two of each (a tenth of a
// system call's and a wakeup of the client's less per such connection). When
// the connection is kept open after all, the next read sends the response first.
func (c *handshakeConn) holdNext() { c.hold = true }

// start begins the handshake's clock at accept, at which the connection's deadline
// is set to accept + timeout.
func (c *handshakeConn) start(accept time.Time, timeout time.Duration) {
	c.deadline = accept.Add(timeout)
	c.last = accept
	c.slack = timeout / 16
	c.handshake = true
	_ = c.Conn.SetDeadline(c.deadline)
}

// end stops the clock and clears the deadline.
func (c *handshakeConn) end() {
	c.handshake = false
	c.deadline = time.Time{}
	_ = c.Conn.SetDeadline(time.Time{})
}

// keyDeadline is the deadline of a key operation the handshake starts now. The
// operation is the server's time, which the client's budget does not pay for: it
// gets HandshakeTimeout of its own (or what is left of the client's budget, when
// that is more), so that in a burst an operation queued behind a busy keyserver for
// most of HandshakeTimeout is still waited for.
func (c *handshakeConn) keyDeadline() time.Time {
	return time.Now().Add(max(c.deadline.Add(c.owed).Sub(c.last), 16*c.slack))
}

// settle adds the server's time since the last wait for the client to the deadline,
// once it is worth a system call, before the handshake waits for the client again.
func (c *handshakeConn) settle() {
	now := time.Now()
	c.owed += now.Sub(c.last)
	c.last = now
	if c.owed < c.slack {
		return
	}
	c.deadline = c.deadline.Add(c.owed)
	c.owed = 0
	_ = c.Conn.SetDeadline(c.deadline)
	// Shutdown sets draining, then moves the deadline of every handshaking connection
	// to the past: seen here after this deadline was set, or set after it.
	if c.l.s.draining.Load() {
		_ = c.Conn.SetDeadline(drainDeadline)
	}
}

func (c *handshakeConn) Read(p []byte) (int, error) {
	if !c.handshake {
		if c.held != nil {
			if err := c.flush(nil); err != nil {
				return 0, err
			}
		}
		return c.Conn.Read(p)
	}
	c.settle()
	n, err := c.Conn.Read(p)
	if n == 0 && timedOut(err) && !c.l.s.draining.Load() {
		// Go's scheduler runs expired timers before it polls the network, and a
		// process with every core busy polls only when the system monitor does (10
		// ms): the deadline can fire on a read whose bytes have arrived. Look at the
		// socket once more, as nginx handles the events it got before the timers
		// that expired.
		_ = c.Conn.SetReadDeadline(time.Now().Add(time.Millisecond))
		n, err = c.Conn.Read(p)
		if n > 0 {
			// The bytes came in time; how much of the budget they left is not
			// known: the slack, from now.
			c.deadline, c.owed = time.Now().Add(c.slack), 0
			_ = c.Conn.SetDeadline(c.deadline)
		}
	}
	c.last = time.Now()
	return n, err
}

func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (c *handshakeConn) Write(p []byte) (int, error) {
	if !c.handshake {
		switch {
		case c.held != nil:
			return len(p), c.flush(p)
		case c.hold && len(p) <= maxHeld:
			c.hold = false
			b := heldPool.Get().(*[]byte)
			*b = append((*b)[:0], p...)
			c.held = b
			heldWrites.Add(1)
			return len(p), nil
		}
		c.hold = false
		return c.Conn.Write(p)
	}
	c.settle()
	n, err := c.Conn.Write(p)
	c.last = time.Now()
	return n, err
}

// flush sends the held write and p after it in one write. An error is that of
// the held bytes as much as p's: the caller's earlier write reported success,
// as one the kernel buffers does before the connection fails.
func (c *handshakeConn) flush(p []byte) error {
	b := c.held
	c.held = nil
	*b = append(*b, p...)
	_, err := c.Conn.Write(*b)
	if cap(*b) <= 2*maxHeld {
		heldPool.Put(b)
	}
	return err
}

// Close sends a held write, then closes the connection.
func (c *handshakeConn) Close() error {
	if c.held != nil {
		_ = c.flush(nil)
	}
	return c.Conn.Close()
}
