package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/keyserver/protocol"
)

// maxBatch is the size beyond which the writer stops coalescing queued frames.
const maxBatch = 64 << 10

// conn is one multiplexed connection to a keyserver. Callers register a call under a
// fresh request ID and queue the encoded frame; the writer goroutine coalesces queued
// frames into one write; the reader goroutine hands each answer to the call waiting
// for its ID. Whoever removes a call from pending (reader, fail or the caller on
// timeout) is the only one who may complete it.
type conn struct {
	srv *server
	nc  net.Conn // the TLS connection
	raw net.Conn // the TCP connection under it

	wch          chan *[]byte  // encoded frames for the writer
	sem          chan struct{} // one token per request in flight
	done         chan struct{} // closed by fail
	pingNow      chan struct{} // asks the supervisor for an early ping
	writeTimeout time.Duration
	deadlines    bool // the connection negotiated ALPNDeadline: requests carry their deadline
	inflight     atomic.Int64
	frames       atomic.Uint64  // answers read: a late ping's answer may be late behind these
	wg           sync.WaitGroup // reader and writer

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*call
	err     error // why the connection failed; set before done is closed
}

// call is a request waiting for its answer.
type call struct {
	ch chan response // capacity 1: completing a call never blocks
	op protocol.Op
}

type response struct {
	h    protocol.Header
	body []byte
	err  error
}

var callPool = sync.Pool{New: func() any { return &call{ch: make(chan response, 1)} }}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func putBuf(b *[]byte) {
	if cap(*b) <= protocol.HeaderLen+protocol.MaxBody {
		bufPool.Put(b)
	}
}

func newConn(srv *server, nc, raw net.Conn, maxInFlight int, writeTimeout time.Duration) *conn {
	cn := &conn{
		srv:          srv,
		nc:           nc,
		raw:          raw,
		wch:          make(chan *[]byte, maxInFlight+8),
		sem:          make(chan struct{}, maxInFlight),
		done:         make(chan struct{}),
		pingNow:      make(chan struct{}, 1),
		writeTimeout: writeTimeout,
		pending:      make(map[uint64]*call),
	}
	if tc, ok := nc.(*tls.Conn); ok {
		cn.deadlines = tc.ConnectionState().NegotiatedProtocol == protocol.ALPNDeadline
	}
	cn.wg.Add(2)
	go cn.readLoop()
	go cn.writeLoop()
	return cn
}

// fail marks the connection dead, closes it and fails every pending call. Only the
// first call has an effect.
func (cn *conn) fail(cause error) {
	cn.mu.Lock()
	if cn.err != nil {
		cn.mu.Unlock()
		return
	}
	cn.err = &connLostError{cause: cause}
	pending := cn.pending
	cn.pending = nil
	cn.mu.Unlock()
	close(cn.done)
	// Closing the TCP connection rather than the TLS one never blocks on a writer
	// stuck in a full send buffer; no close_notify is needed by the protocol.
	cn.raw.Close()
	for _, c := range pending {
		c.ch <- response{err: cn.err}
	}
}

// failed returns the connection's error once it has failed.
func (cn *conn) failed() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err
}

func (cn *conn) readLoop() {
	defer cn.wg.Done()
	br := bufio.NewReaderSize(cn.nc, 16<<10)
	hdr := make([]byte, protocol.HeaderLen)
	for {
		h, body, err := protocol.ReadFrame(br, hdr)
		if err != nil {
			var fe *protocol.FrameError
			if errors.As(err, &fe) {
				// Not wrapped: the *protocol.Error inside describes the stream, not a
				// request, and must not be taken for the server's answer.
				err = fmt.Errorf("unreadable response frame: %v", fe)
			} else {
				err = fmt.Errorf("reading: %w", err)
			}
			cn.fail(err)
			return
		}
		cn.srv.answered()
		cn.frames.Add(1)
		cn.mu.Lock()
		c, ok := cn.pending[h.ID]
		if ok {
			delete(cn.pending, h.ID)
		}
		cn.mu.Unlock()
		if !ok {
			continue // the caller gave up on it
		}
		if h.Op != c.op {
			err := fmt.Errorf("protocol violation: answer to %s request %d is a %s frame", c.op, h.ID, h.Op)
			c.ch <- response{err: &connLostError{cause: err}}
			cn.fail(err)
			return
		}
		c.ch <- response{h: h, body: body}
	}
}

func (cn *conn) writeLoop() {
	defer cn.wg.Done()
	buf := make([]byte, 0, 4<<10)
	for {
		select {
		case b := <-cn.wch:
			buf = append(buf[:0], *b...)
			putBuf(b)
		case <-cn.done:
			return
		}
	coalesce:
		for len(buf) < maxBatch {
			select {
			case b := <-cn.wch:
				buf = append(buf, *b...)
				putBuf(b)
			default:
				break coalesce
			}
		}
		cn.raw.SetWriteDeadline(time.Now().Add(cn.writeTimeout))
		if _, err := cn.nc.Write(buf); err != nil {
			cn.fail(fmt.Errorf("writing: %w", err))
			return
		}
		if cap(buf) > 4*maxBatch {
			buf = make([]byte, 0, 4<<10)
		}
	}
}

// roundTrip sends req (with a fresh ID) and waits for its answer until timer fires,
// ctx ends or the client closes. A ping does not take an in-flight slot, so that a
// busy connection can still be probed. budget, timer's period, is sent as the
// request's deadline when the connection takes one (zero: none).
//
// When check is positive and no answer came within it, the connection is checked
// by a ping (a stalled server's failed ping fails the connection and so this call)
// and the call waits on until timer fires.
func (cn *conn) roundTrip(ctx context.Context, req *protocol.Request, budget time.Duration, timer *time.Timer, closing <-chan struct{}, ping bool, check time.Duration) ([]byte, error) {
	if !ping {
		select {
		case cn.sem <- struct{}{}:
		default:
			select {
			case cn.sem <- struct{}{}:
			case <-cn.done:
				return nil, cn.failed()
			case <-timer.C:
				return nil, ErrTimeout
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-closing:
				return nil, ErrClosed
			}
		}
		defer func() { <-cn.sem }()
	}
	cn.inflight.Add(1)
	defer cn.inflight.Add(-1)

	c := callPool.Get().(*call)
	c.op = req.Op
	cn.mu.Lock()
	if cn.err != nil {
		err := cn.err
		cn.mu.Unlock()
		callPool.Put(c)
		return nil, err
	}
	cn.nextID++
	id := cn.nextID
	cn.pending[id] = c
	cn.mu.Unlock()

	b := bufPool.Get().(*[]byte)
	if cn.deadlines && budget > 0 && req.Timeout != budget {
		r := *req
		r.Timeout = budget
		*b = protocol.AppendRequest((*b)[:0], &r)
	} else {
		*b = protocol.AppendRequest((*b)[:0], req)
	}
	binary.BigEndian.PutUint64((*b)[8:protocol.HeaderLen], id)
	select {
	case cn.wch <- b:
	case <-cn.done:
		// fail completes the call: wait for it below.
	}

	var checkC <-chan time.Time
	if check > 0 {
		ct := getTimer(check)
		defer putTimer(ct)
		checkC = ct.C
	}
	for {
		select {
		case <-checkC:
			cn.requestPing()
			checkC = nil
		case r := <-c.ch:
			callPool.Put(c)
			if r.err != nil {
				return nil, r.err
			}
			if err := protocol.ResponseError(r.h, r.body); err != nil {
				return nil, err
			}
			return r.body, nil
		case <-timer.C:
			cn.abandon(id, c)
			return nil, ErrTimeout
		case <-ctx.Done():
			cn.abandon(id, c)
			return nil, ctx.Err()
		case <-closing:
			cn.abandon(id, c)
			return nil, ErrClosed
		}
	}
}

// abandon removes a call its caller no longer waits for. If the reader or fail took
// it first, its completion is on the way: drain it so the call can be reused.
func (cn *conn) abandon(id uint64, c *call) {
	cn.mu.Lock()
	mine := cn.pending[id] == c
	if mine {
		delete(cn.pending, id)
	}
	cn.mu.Unlock()
	if !mine {
		<-c.ch
	}
	callPool.Put(c)
}

// requestPing asks the supervisor for a health ping now, unless one is asked already.
func (cn *conn) requestPing() {
	select {
	case cn.pingNow <- struct{}{}:
	default:
	}
}

// Slot states.
const (
	slotConnecting int32 = iota // first dial, or redial after a connection that worked
	slotUp                      // a connection is up
	slotDown                    // the last dial failed
)

// slot is one of a server's ConnsPerServer connections, kept up by its own
// supervisor goroutine across failures.
type slot struct {
	srv   *server
	conn  atomic.Pointer[conn]
	state atomic.Int32
}

// runSlot dials, supervises and redials one connection until the client closes.
func (c *Client) runSlot(s *slot) {
	defer c.wg.Done()
	log := c.log.With("server", s.srv.addr)
	failures := 0
	for !c.isClosed() {
		s.srv.dials.Add(1)
		cn, err := c.dial(s.srv)
		if err != nil {
			if c.isClosed() {
				return
			}
			s.srv.dialErrors.Add(1)
			s.srv.setDialErr(err)
			c.setState(s, slotDown)
			failures++
			if failures == 1 {
				log.Warn("keyserver connection failed", "err", err)
			} else {
				log.Debug("keyserver connection failed", "err", err, "failures", failures)
			}
			if !c.sleep(c.backoff(failures)) {
				return
			}
			continue
		}
		if failures > 0 {
			log.Info("keyserver connection restored", "after_failures", failures)
		} else {
			log.Debug("keyserver connected")
		}
		s.conn.Store(cn)
		s.srv.up.Add(1)
		s.srv.m.addConns(1)
		c.setState(s, slotUp)
		upSince := time.Now()

		c.supervise(cn)

		// Connecting before down, so that requests looking for a connection wait for
		// this one rather than give up on the server.
		c.setState(s, slotConnecting)
		s.conn.Store(nil)
		s.srv.up.Add(-1)
		s.srv.m.addConns(-1)
		cn.wg.Wait()
		if c.isClosed() {
			return
		}
		log.Warn("keyserver connection lost", "err", cn.failed(), "up_for", time.Since(upSince).Round(time.Millisecond))
		if time.Since(upSince) >= c.cfg.ReconnectMax.D() {
			failures = 0
		}
		failures++
		if !c.sleep(c.backoff(failures)) {
			return
		}
	}
}

// supervise pings cn every PingInterval (and when a request on it timed out) until
// it fails or the client closes.
func (c *Client) supervise(cn *conn) {
	t := time.NewTicker(c.cfg.PingInterval.D())
	defer t.Stop()
	timer := getTimer(c.cfg.RequestTimeout.D())
	defer putTimer(timer)
	var seq uint64
	var payload [8]byte
	for {
		select {
		case <-cn.done:
			return
		case <-c.closing:
			cn.fail(ErrClosed)
			return
		case <-t.C:
		case <-cn.pingNow:
		}
		seq++
		binary.BigEndian.PutUint64(payload[:], seq)
		timer.Reset(c.cfg.RequestTimeout.D())
		req := protocol.Request{Op: protocol.OpPing, Payload: payload[:]}
		frames := cn.frames.Load()
		body, err := cn.roundTrip(context.Background(), &req, 0, timer, c.closing, true, 0)
		var pe *protocol.Error
		switch {
		case errors.Is(err, ErrTimeout) && (cn.frames.Load() != frames || cn.unread()):
			// Late, but the connection works: answers came meanwhile, or wait in the
			// socket for a reader that has not had a CPU (l7d in a burst of handshakes,
			// its goroutines queued for a P before the reader). Ask again rather than
			// fail the requests in flight on it, whose answers are on their way.
			c.log.Debug("keyserver ping answer late behind others", "server", cn.srv.addr, "answers", cn.frames.Load()-frames)
			cn.requestPing()
		case err == nil && string(body) != string(payload[:]):
			cn.fail(errors.New("health ping: answer does not echo the request"))
			return
		case errors.Is(err, ErrClosed):
			cn.fail(ErrClosed)
			return
		case errors.As(err, &pe):
			// The server answered: the connection works.
			c.log.Debug("keyserver ping refused", "server", cn.srv.addr, "err", err)
		case err != nil:
			if errors.Is(err, ErrTimeout) {
				// Nothing came from the server for the ping's whole wait: it comes last
				// in the choice of servers until it answers again, redialled or not.
				c.penalize(cn.srv)
			}
			cn.fail(fmt.Errorf("health ping: %w", err))
			return
		}
	}
}

// unread reports whether bytes from the server wait in the TCP connection's receive
// queue (SIOCINQ), not yet read.
func (cn *conn) unread() bool {
	sc, ok := cn.raw.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n, ierr := 0, error(nil)
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
		return false
	}
	return ierr == nil && n > 0
}

func (c *Client) dial(srv *server) (*conn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout.D())
	defer cancel()
	d := tls.Dialer{
		NetDialer: &net.Dialer{KeepAlive: 15 * time.Second},
		Config:    c.tls,
	}
	nc, err := d.DialContext(ctx, "tcp", srv.addr)
	if err != nil {
		return nil, err
	}
	return newConn(srv, nc, nc.(*tls.Conn).NetConn(), c.cfg.MaxInFlightPerConn, c.cfg.RequestTimeout.D()), nil
}

var timerPool sync.Pool

// getTimer returns a running timer that fires after d. Timers are reused: since Go
// 1.23 Stop and Reset leave no stale tick in the channel.
func getTimer(d time.Duration) *time.Timer {
	if t, ok := timerPool.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func putTimer(t *time.Timer) {
	t.Stop()
	timerPool.Put(t)
}
