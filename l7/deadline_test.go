package l7

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tiergate/tiergate/internal/config"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// deadlineCounter counts the deadlines set on the connection under it: the calls the
// lazy layer passes on to the runtime.
type deadlineCounter struct {
	net.Conn
	reads, writes, both atomic.Int64
}

func (c *deadlineCounter) SetDeadline(t time.Time) error {
	c.both.Add(1)
	return c.Conn.SetDeadline(t)
}

func (c *deadlineCounter) SetReadDeadline(t time.Time) error {
	c.reads.Add(1)
	return c.Conn.SetReadDeadline(t)
}

func (c *deadlineCounter) SetWriteDeadline(t time.Time) error {
	c.writes.Add(1)
	return c.Conn.SetWriteDeadline(t)
}

func (c *deadlineCounter) calls() [3]int64 {
	return [3]int64{c.reads.Load(), c.writes.Load(), c.both.Load()}
}

// late is how late past its deadline a test lets a blocked call return: the lazy
// slack plus the scheduling of a busy machine under the race detector (a past
// deadline's write on a fresh machine running every package's tests took 179 ms to
// fail). A lost deadline fails it still: the deadlines it stands in for are a
// minute or never.
func late(d time.Duration) time.Duration { return d/lazySlack + time.Second }

// blockedRead reads from c until it fails and returns when, and the error.
func blockedRead(c net.Conn) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		ch <- readResult{time.Now(), err}
	}()
	return ch
}

type readResult struct {
	at  time.Time
	err error
}

func waitResult(t *testing.T, ch <-chan readResult, within time.Duration) readResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("still blocked after %v", within)
		return readResult{}
	}
}

// checkFired checks that a call given deadline d returned with a timeout, not
// before d and at most late(timeout) after it.
func checkFired(t *testing.T, what string, r readResult, d time.Time, timeout time.Duration) {
	t.Helper()
	if !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: %v, want a deadline exceeded", what, r.err)
	}
	if r.at.Before(d) {
		t.Errorf("%s: failed %v before its deadline", what, d.Sub(r.at))
	}
	if over := r.at.Sub(d); over > late(timeout) {
		t.Errorf("%s: failed %v after its deadline of %v, want at most %v", what, over, timeout, late(timeout))
	}
}

func TestLazyPlan(t *testing.T) {
	base := time.Now()
	at := func(d time.Duration) time.Time { return base.Add(d) }
	for _, tc := range []struct {
		name  string
		armed time.Time
		t     time.Time
		left  time.Duration
		arm   time.Time
		call  bool
	}{
		{"first deadline: armed with its slack", time.Time{}, at(64 * time.Second), 64 * time.Second, at(68 * time.Second), true},
		{"the same again: skipped", at(68 * time.Second), at(64 * time.Second), 64 * time.Second, at(68 * time.Second), false},
		{"later, within the slack: skipped", at(68 * time.Second), at(66 * time.Second), 64 * time.Second, at(68 * time.Second), false},
		{"at the armed deadline: skipped", at(68 * time.Second), at(68 * time.Second), 64 * time.Second, at(68 * time.Second), false},
		{"later than armed: armed", at(68 * time.Second), at(69 * time.Second), 64 * time.Second, at(73 * time.Second), true},
		{"earlier than the slack: armed", at(68 * time.Second), at(63 * time.Second), 64 * time.Second, at(67 * time.Second), true},
		{"the slack is the new deadline's", at(68 * time.Second), at(66 * time.Second), 16 * time.Second, at(67 * time.Second), true},
		{"past: at once", at(68 * time.Second), at(-time.Second), -time.Second, at(-time.Second), true},
		{"past, under a past armed one: at once", at(-2 * time.Second), at(-time.Second), -time.Second, at(-time.Second), true},
		{"drainDeadline: at once", at(68 * time.Second), drainDeadline, -time.Hour, drainDeadline, true},
		{"zero: cleared", at(68 * time.Second), time.Time{}, 0, time.Time{}, true},
		{"zero, none armed: skipped", time.Time{}, time.Time{}, 0, time.Time{}, false},
	} {
		arm, call := lazyPlan(tc.armed, tc.t, tc.left)
		if call != tc.call || !arm.Equal(tc.arm) {
			t.Errorf("%s: lazyPlan = %v, %v; want %v, %v", tc.name, arm.Sub(base), call, tc.arm.Sub(base), tc.call)
		}
	}
}

func TestLazyReadDeadlineFires(t *testing.T) {
	_, s := tcpPair(t)
	c := &lazyConn{Conn: s}
	const timeout = 200 * time.Millisecond
	d := time.Now().Add(timeout)
	if err := c.SetReadDeadline(d); err != nil {
		t.Fatal(err)
	}
	if slack := c.d.read.Sub(d); slack <= 0 || slack > timeout/lazySlack {
		t.Errorf("armed %v past the deadline, want within (0, %v]", slack, timeout/lazySlack)
	}
	checkFired(t, "read", waitResult(t, blockedRead(c), 5*time.Second), d, timeout)
}

func TestLazySkipsWithinSlack(t *testing.T) {
	_, s := tcpPair(t)
	cc := &deadlineCounter{Conn: s}
	c := &lazyConn{Conn: cc}
	want := func(step string, calls [3]int64) {
		t.Helper()
		if got := cc.calls(); got != calls {
			t.Errorf("%s: runtime calls (read, write, both) %v, want %v", step, got, calls)
		}
	}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	want("first read deadline", [3]int64{1, 0, 0})
	for range 100 {
		c.SetReadDeadline(time.Now().Add(time.Minute))
	}
	want("the same timeout again", [3]int64{1, 0, 0})
	c.SetReadDeadline(time.Now().Add(time.Minute + 5*time.Second))
	want("a deadline past the slack", [3]int64{2, 0, 0})
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	want("a shorter one", [3]int64{3, 0, 0})
	c.SetReadDeadline(time.Time{})
	c.SetReadDeadline(time.Time{})
	want("cleared twice", [3]int64{4, 0, 0})

	c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	want("write deadlines", [3]int64{4, 1, 0})

	// Both: the write deadline is skipped, the read one set alone.
	c.SetDeadline(time.Now().Add(30 * time.Second))
	want("both, write already armed", [3]int64{5, 1, 0})
	c.SetDeadline(time.Now().Add(30 * time.Second))
	want("both again", [3]int64{5, 1, 0})
	c.SetDeadline(time.Now().Add(5 * time.Second))
	want("both shorter", [3]int64{5, 1, 1})
	c.SetDeadline(drainDeadline)
	c.SetDeadline(drainDeadline)
	want("both in the past, twice", [3]int64{5, 1, 3})
	c.SetDeadline(time.Time{})
	c.SetDeadline(time.Time{})
	want("both cleared twice", [3]int64{5, 1, 4})
}

func TestLazyShorterDeadlineAppliesAtOnce(t *testing.T) {
	_, s := tcpPair(t)
	c := &lazyConn{Conn: s}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	res := blockedRead(c)
	time.Sleep(20 * time.Millisecond)
	const timeout = 50 * time.Millisecond
	d := time.Now().Add(timeout)
	c.SetReadDeadline(d)
	checkFired(t, "read shortened from 60s", waitResult(t, res, 5*time.Second), d, timeout)
}

func TestLazyPastDeadlineAppliesAtOnce(t *testing.T) {
	for _, past := range []struct {
		name string
		t    func() time.Time
	}{
		{"drainDeadline", func() time.Time { return drainDeadline }},
		{"now", time.Now}, // crypto/tls's close_notify
	} {
		t.Run(past.name, func(t *testing.T) {
			_, s := tcpPair(t)
			c := &lazyConn{Conn: s}
			c.SetReadDeadline(time.Now().Add(time.Minute))
			res := blockedRead(c)
			time.Sleep(20 * time.Millisecond)
			start := time.Now()
			c.SetReadDeadline(past.t())
			r := waitResult(t, res, 5*time.Second)
			if !errors.Is(r.err, os.ErrDeadlineExceeded) {
				t.Fatalf("read: %v, want a deadline exceeded", r.err)
			}
			if took := r.at.Sub(start); took > late(0) {
				t.Errorf("read failed %v after a deadline in the past", took)
			}
		})
	}
}

func TestLazyZeroClears(t *testing.T) {
	cl, s := tcpPair(t)
	c := &lazyConn{Conn: s}
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	c.SetReadDeadline(time.Time{})
	res := blockedRead(c)
	select {
	case r := <-res:
		t.Fatalf("read with its deadline cleared failed: %v", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	cl.Write([]byte{1})
	if r := waitResult(t, res, 5*time.Second); r.err != nil {
		t.Errorf("read: %v", r.err)
	}
}

// TestLazyKeepsDirectDrain: a past deadline set on the connection under the lazy
// layer (shutdown's drainDeadline on the raw connection) stays in force over a
// deadline the layer skips: it never arms a later one over it unasked.
func TestLazyKeepsDirectDrain(t *testing.T) {
	_, s := tcpPair(t)
	c := &lazyConn{Conn: s}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	res := blockedRead(c)
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	s.SetReadDeadline(drainDeadline) // under the lazy layer, from another goroutine
	r := waitResult(t, res, 5*time.Second)
	if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.at.Sub(start) > late(0) {
		t.Fatalf("read after the direct drain: %v after %v", r.err, r.at.Sub(start))
	}
	// The next request's idle deadline, within the slack of the one armed: skipped,
	// and the drain stays.
	c.SetReadDeadline(time.Now().Add(time.Minute))
	start = time.Now()
	r = waitResult(t, blockedRead(c), 5*time.Second)
	if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.at.Sub(start) > late(0) {
		t.Errorf("read after a skipped deadline over the drain: %v after %v", r.err, r.at.Sub(start))
	}
	// Through the layer, the drain applies whatever it thinks is armed.
	c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	c.SetReadDeadline(drainDeadline)
	start = time.Now()
	r = waitResult(t, blockedRead(c), 5*time.Second)
	if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.at.Sub(start) > late(0) {
		t.Errorf("read after a drain through the layer: %v after %v", r.err, r.at.Sub(start))
	}
}

// blockedWrite writes to c until its socket buffers are full and the write fails.
func blockedWrite(t *testing.T, peer, c net.Conn) <-chan readResult {
	t.Helper()
	peer.(*net.TCPConn).SetReadBuffer(4096)
	ch := make(chan readResult, 1)
	go func() {
		_, err := c.Write(make([]byte, 64<<20))
		ch <- readResult{time.Now(), err}
	}()
	return ch
}

func TestLazyWriteDeadline(t *testing.T) {
	t.Run("fires", func(t *testing.T) {
		cl, s := tcpPair(t)
		s.SetWriteBuffer(4096)
		c := &lazyConn{Conn: s}
		const timeout = 200 * time.Millisecond
		d := time.Now().Add(timeout)
		c.SetWriteDeadline(d)
		checkFired(t, "write", waitResult(t, blockedWrite(t, cl, c), 5*time.Second), d, timeout)
	})
	t.Run("skipped within the slack", func(t *testing.T) {
		cl, s := tcpPair(t)
		s.SetWriteBuffer(4096)
		cc := &deadlineCounter{Conn: s}
		c := &lazyConn{Conn: cc}
		const timeout = 200 * time.Millisecond
		c.SetWriteDeadline(time.Now().Add(timeout))
		time.Sleep(5 * time.Millisecond)
		d := time.Now().Add(timeout) // 5 ms later, within the 12.5 ms slack
		c.SetWriteDeadline(d)
		if n := cc.writes.Load(); n != 1 {
			t.Errorf("runtime calls: %d, want 1", n)
		}
		checkFired(t, "write", waitResult(t, blockedWrite(t, cl, c), 5*time.Second), d, timeout)
	})
	t.Run("shortened", func(t *testing.T) {
		cl, s := tcpPair(t)
		s.SetWriteBuffer(4096)
		c := &lazyConn{Conn: s}
		c.SetWriteDeadline(time.Now().Add(time.Minute))
		res := blockedWrite(t, cl, c)
		time.Sleep(20 * time.Millisecond)
		const timeout = 50 * time.Millisecond
		d := time.Now().Add(timeout)
		c.SetWriteDeadline(d)
		checkFired(t, "write shortened from 60s", waitResult(t, res, 5*time.Second), d, timeout)
	})
	t.Run("past", func(t *testing.T) {
		cl, s := tcpPair(t)
		s.SetWriteBuffer(4096)
		c := &lazyConn{Conn: s}
		c.SetWriteDeadline(time.Now().Add(time.Minute))
		res := blockedWrite(t, cl, c)
		time.Sleep(20 * time.Millisecond)
		start := time.Now()
		c.SetWriteDeadline(drainDeadline)
		r := waitResult(t, res, 5*time.Second)
		if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.at.Sub(start) > late(0) {
			t.Errorf("write after a past deadline: %v after %v", r.err, r.at.Sub(start))
		}
	})
}

// TestBackendDeadlinesLazy: fasthttp's backend client sets a write and a read
// deadline on its connection for every request; over the lazy layer, a keep-alive
// connection's requests within the slack of the first cost no runtime call, and a
// backend that does not answer still times out.
func TestBackendDeadlinesLazy(t *testing.T) {
	b := startBackend(t, "b1")
	var cc *deadlineCounter
	hc := &fasthttp.HostClient{
		Addr: b.addr,
		Dial: func(addr string) (net.Conn, error) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			cc = &deadlineCounter{Conn: c}
			return &lazyConn{Conn: cc}, nil
		},
	}
	for i := range 20 {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://" + b.addr + "/")
		if err := hc.DoDeadline(req, resp, time.Now().Add(30*time.Second)); err != nil || resp.StatusCode() != 200 {
			t.Fatalf("request %d: %v %d", i, err, resp.StatusCode())
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
	if got := cc.calls(); got != [3]int64{1, 1, 0} {
		t.Errorf("runtime calls (read, write, both) for 20 requests on one connection: %v, want [1 1 0]", got)
	}

	// A request the backend holds past its deadline times out at it.
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + b.addr + "/slow?d=5s")
	const timeout = 300 * time.Millisecond
	d := time.Now().Add(timeout)
	err := hc.DoDeadline(req, resp, d)
	if !errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("request past its deadline: %v, want a timeout", err)
	}
	if over := time.Since(d); over > late(timeout) {
		t.Errorf("request timed out %v after its deadline", over)
	}
}

func TestDialBackend(t *testing.T) {
	b := startBackend(t, "b1")
	c, err := dialBackend(b.addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*lazyConn); !ok {
		t.Fatalf("dialBackend returned a %T, want a *lazyConn", c)
	}
	if _, err := dialBackend(closedPort(t), time.Second); err == nil {
		t.Errorf("dialing a closed port succeeded")
	}
}

func TestHasBody(t *testing.T) {
	for _, tc := range []struct {
		head string
		n    int // what ContentLength returns once the header is read
		body bool
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", -2, false},
		{"GET / HTTP/1.0\r\n\r\n", -2, false},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", 0, false},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", 5, true},
		{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", -1, true},
		{"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n", 3, true},
	} {
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader(tc.head))); err != nil {
			t.Fatalf("%q: %v", tc.head, err)
		}
		if n := h.ContentLength(); n != tc.n {
			t.Errorf("%q: ContentLength %d, want %d", tc.head, n, tc.n)
		}
		if got := hasBody(&h); got != tc.body {
			t.Errorf("%q: hasBody %v, want %v", tc.head, got, tc.body)
		}
	}
}

// h1Client is an HTTP/1.1 connection to ts read a response at a time.
type h1Client struct {
	*tls.Conn
	br *bufio.Reader
}

func dialH1(t *testing.T, ts *testServer) *h1Client {
	t.Helper()
	c, err := tls.Dial("tcp", ts.addr, &tls.Config{RootCAs: ts.pki.pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &h1Client{Conn: c, br: bufio.NewReader(c)}
}

// do sends raw and reads the response to it.
func (c *h1Client) do(t *testing.T, raw string) *http.Response {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("sending %q: %v", raw, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("response to %q: %v", raw, err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("response body to %q: %v", raw, err)
	}
	resp.Body.Close()
	return resp
}

// closedAfter waits for the server to close c, reading what it sends, and returns
// when it did.
func (c *h1Client) closedAfter(t *testing.T, start time.Time) time.Duration {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c.br); err != nil {
		t.Fatalf("waiting for the server to close: %v", err)
	}
	return time.Since(start)
}

// checkClosedIn checks that a connection closed by a timeout of d did so between
// d (less the time its response took to come) and d with its slack.
func checkClosedIn(t *testing.T, what string, took, d time.Duration) {
	t.Helper()
	if took < d-50*time.Millisecond || took > d+late(d) {
		t.Errorf("%s: closed after %v, want %v (at most %v late)", what, took, d, late(d))
	}
}

const headerGet = "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"

func TestH1IdleTimeoutAfterRequests(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	const idle = 400 * time.Millisecond
	cfg.Listeners[0].IdleTimeout = config.Duration(idle)
	ts := startServer(t, cfg)
	c := dialH1(t, ts)
	for range 5 {
		if resp := c.do(t, headerGet); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	checkClosedIn(t, "idle keep-alive connection", c.closedAfter(t, time.Now()), idle)
}

// TestH1IdleTimeoutLongerThanHeader: with the defaults' order (IdleTimeout longer
// than ReadHeaderTimeout) the idle deadline extends the header deadline armed for
// the last request without a system call; when that one fires, the connection arms
// its idle deadline and keeps waiting, and is closed at the idle timeout, neither
// at the header deadline nor never.
func TestH1IdleTimeoutLongerThanHeader(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	const header, idle = 150 * time.Millisecond, 600 * time.Millisecond
	cfg.Listeners[0].ReadHeaderTimeout = config.Duration(header)
	cfg.Listeners[0].IdleTimeout = config.Duration(idle)
	ts := startServer(t, cfg)
	c := dialH1(t, ts)
	for range 5 {
		if resp := c.do(t, headerGet); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	checkClosedIn(t, "idle keep-alive connection", c.closedAfter(t, time.Now()), idle)

	// A request that comes after the header deadline armed for the one before has
	// passed, within the idle timeout, is served.
	c = dialH1(t, ts)
	if resp := c.do(t, headerGet); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	time.Sleep(2 * header)
	if resp := c.do(t, headerGet); resp.StatusCode != 200 {
		t.Fatalf("request after %v idle: status %d", 2*header, resp.StatusCode)
	}
}

// TestH1HeaderTimeoutAfterRequest: a header that comes slowly on a kept-alive
// connection is cut at ReadHeaderTimeout from its first byte, though the idle
// timeout armed before it is longer.
func TestH1HeaderTimeoutAfterRequest(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	const header = 400 * time.Millisecond
	cfg.Listeners[0].ReadHeaderTimeout = config.Duration(header)
	ts := startServer(t, cfg)
	c := dialH1(t, ts)
	if resp := c.do(t, headerGet); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	io.WriteString(c, "GET / HTTP/1.1\r\n")
	checkClosedIn(t, "slow header", c.closedAfter(t, start), header)
}

// TestH1BodyTimeout: ReadTimeout bounds a body's read, Content-Length or chunked,
// though ReadHeaderTimeout is longer; a request without a body keeps its header's
// deadline, which may pass while its backend answers.
func TestH1BodyTimeout(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	const header, body = 300 * time.Millisecond, 600 * time.Millisecond
	cfg.Listeners[0].ReadHeaderTimeout = config.Duration(header)
	cfg.Listeners[0].ReadTimeout = config.Duration(body)
	ts := startServer(t, cfg)

	c := dialH1(t, ts)
	for range 2 {
		if resp := c.do(t, "GET /slow?d=500ms HTTP/1.1\r\nHost: localhost\r\n\r\n"); resp.StatusCode != 200 {
			t.Fatalf("GET answered after its header deadline: %d", resp.StatusCode)
		}
	}
	for _, head := range []string{
		"POST /sink HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\nab",
		"POST /sink HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
	} {
		c := dialH1(t, ts)
		if resp := c.do(t, headerGet); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		start := time.Now()
		io.WriteString(c, head)
		// The body's deadline, not the header's, set when the header is read.
		took := c.closedAfter(t, start)
		if took < body-50*time.Millisecond || took > body+late(body) {
			t.Errorf("%q: closed after %v, want %v (at most %v late)", head, took, body, late(body))
		}
	}
}

// TestH1DrainKeepAlive: Shutdown closes a kept-alive HTTP/1.1 connection waiting
// for its next request at once, through the deadline it sets on the raw connection
// under the lazy one armed for IdleTimeout.
func TestH1DrainKeepAlive(t *testing.T) {
	b := startBackend(t, "b1")
	ts := startServer(t, baseConfig(t, b.addr))
	c := dialH1(t, ts)
	for range 3 {
		if resp := c.do(t, headerGet); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	l := ts.l()
	waitFor(t, "the connection idle", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, tc := range l.conns {
			if !tc.idle.Load() {
				return false
			}
		}
		return len(l.conns) == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := ts.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if took := c.closedAfter(t, start); took > time.Second {
		t.Errorf("idle keep-alive connection closed %v after Shutdown", took)
	}
}

// countingListener hands out its connections as deadlineCounters.
type countingListener struct {
	net.Listener
	conns chan *deadlineCounter
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	dc := &deadlineCounter{Conn: c}
	select {
	case l.conns <- dc:
	default:
	}
	return dc, nil
}

// TestH1DeadlinesPerRequest counts the deadlines a kept-alive HTTP/1.1 connection
// sets on its TCP connection for requests without a body that follow each other:
// none, past the first write deadline. fasthttp set four a request before (idle,
// header, body and write); the lazy layer alone, two (idle and header alternate).
func TestH1DeadlinesPerRequest(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	conns := make(chan *deadlineCounter, 1)
	cfg.Listeners[0].WrapListener = func(ln net.Listener) (net.Listener, error) {
		return countingListener{Listener: ln, conns: conns}, nil
	}
	ts := startServer(t, cfg)
	c := dialH1(t, ts)
	if resp := c.do(t, headerGet); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	dc := <-conns
	before := dc.calls()
	const n = 20
	for range n {
		if resp := c.do(t, headerGet); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	after := dc.calls()
	reads, writes, both := after[0]-before[0], after[1]-before[1], after[2]-before[2]
	t.Logf("%d requests: %d read, %d write, %d read and write deadlines set", n, reads, writes, both)
	// The idle deadline extends the header deadline armed for the request before,
	// and the next header deadline falls within that one's slack: none reaches the
	// runtime while requests follow each other (two a request without extend-on-fire,
	// four before the lazy layer).
	if reads > 2 || writes > 1 || both != 0 {
		t.Errorf("%d requests set %d read, %d write and %d read and write deadlines; want at most 2, 1 and 0",
			n, reads, writes, both)
	}
}

// BenchmarkSetReadDeadline: a read deadline of now+60s set per call, as fasthttp
// sets its write deadline per response, on the TCP connection and through the lazy
// layer; and alternating 60 s and 10 s, as fasthttp's idle and header deadlines on a
// keep-alive connection, which the lazy layer passes on every time.
func BenchmarkSetReadDeadline(b *testing.B) {
	_, s := tcpPair(b)
	lazy := &lazyConn{Conn: s}
	for _, bc := range []struct {
		name string
		c    net.Conn
		alt  bool
	}{
		{"raw", s, false},
		{"lazy", lazy, false},
		{"raw-alternating", s, true},
		{"lazy-alternating", lazy, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				d := time.Minute
				if bc.alt && i&1 == 1 {
					d = 10 * time.Second
				}
				i++
				if err := bc.c.SetReadDeadline(time.Now().Add(d)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
