package l7

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/route"
)

// writeCounter counts the writes made to a connection.
type writeCounter struct {
	net.Conn
	writes atomic.Int64
}

func (c *writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// heldPair is a TLS connection whose server side writes through a handshakeConn
// over a write counter, handshake done.
func heldPair(t *testing.T) (srv *tls.Conn, hsc *handshakeConn, wc *writeCounter, cli *tls.Conn) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	_ = a.SetDeadline(time.Now().Add(10 * time.Second))
	_ = b.SetDeadline(time.Now().Add(10 * time.Second))
	wc = &writeCounter{Conn: a}
	hsc = &handshakeConn{Conn: wc}
	p := getPKI(t)
	srv = tls.Server(hsc, &tls.Config{Certificates: []tls.Certificate{p.leaf}, SessionTicketsDisabled: true})
	cli = tls.Client(b, &tls.Config{RootCAs: p.pool, ServerName: "localhost"})
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	if err := cli.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return srv, hsc, wc, cli
}

// TestHeldWriteLeavesWithCloseNotify: a response held by holdNext and the
// close_notify alert after it leave in one write, and the client reads both.
func TestHeldWriteLeavesWithCloseNotify(t *testing.T) {
	srv, hsc, wc, cli := heldPair(t)
	got := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		b, err := io.ReadAll(cli)
		got <- b
		errc <- err
	}()
	before := wc.writes.Load()
	hsc.holdNext()
	if _, err := srv.Write([]byte("the response")); err != nil {
		t.Fatal(err)
	}
	if n := wc.writes.Load() - before; n != 0 {
		t.Fatalf("%d writes for a held response, want it held", n)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if n := wc.writes.Load() - before; n != 1 {
		t.Errorf("the response and close_notify took %d writes, want 1", n)
	}
	// A clean end: crypto/tls reports io.EOF (no error from ReadAll) only for a
	// close_notify here, since the pipe is not closed before it.
	if b, err := <-got, <-errc; err != nil || string(b) != "the response" {
		t.Errorf("client read %q, %v; want the response and a clean end", b, err)
	}
}

// TestHeldWriteBeforeRead: a response held for a connection kept open after all
// leaves before the server waits for the next request.
func TestHeldWriteBeforeRead(t *testing.T) {
	srv, hsc, wc, cli := heldPair(t)
	hsc.holdNext()
	if _, err := srv.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 5)
		if _, err := io.ReadFull(cli, buf); err == nil && string(buf) == "first" {
			_, _ = cli.Write([]byte("next request"))
		}
	}()
	buf := make([]byte, 64)
	n, err := srv.Read(buf) // would wait forever with "first" still held
	if err != nil || string(buf[:n]) != "next request" {
		t.Fatalf("server read %q, %v", buf[:n], err)
	}
	// Disarmed: the next write leaves at once, and one too large is never held.
	before := wc.writes.Load()
	go io.Copy(io.Discard, cli)
	if _, err := srv.Write([]byte("second")); err != nil {
		t.Fatal(err)
	}
	hsc.holdNext()
	if _, err := srv.Write(make([]byte, maxHeld+1)); err != nil {
		t.Fatal(err)
	}
	if n := wc.writes.Load() - before; n < 2 {
		t.Errorf("%d writes for an unheld write and one over maxHeld, want each sent at once", n)
	}
	if hsc.held != nil {
		t.Error("a write over maxHeld was kept back")
	}
}

// TestHeldWriteError: a held write's failure is the next write's error.
func TestHeldWriteError(t *testing.T) {
	a, b := net.Pipe()
	hsc := &handshakeConn{Conn: a}
	hsc.holdNext()
	if n, err := hsc.Write([]byte("held")); n != 4 || err != nil {
		t.Fatalf("held write: %d, %v", n, err)
	}
	b.Close()
	if _, err := hsc.Write([]byte("more")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("write after the peer closed: %v, want io.ErrClosedPipe", err)
	}
	if err := hsc.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

// TestHTTP10ResponseThenClose: requests after which the server closes (HTTP/1.0,
// Connection: close) get their whole response and a clean end of the TLS stream:
// one answered by l7d itself (written whole, so held for the close_notify), and
// proxied ones, streamed from the backend, small and over maxHeld.
func TestHTTP10ResponseThenClose(t *testing.T) {
	be := startBackend(t, "be")
	rc := &route.Config{
		Pools: []route.Pool{{Name: "p", Members: []route.PoolMember{{Addr: be.addr}}}},
		Listeners: []route.Listener{{Name: "web", VHosts: []route.VHost{{Names: []string{"*"}, Routes: []route.Route{
			{Name: "ok", Match: route.Match{Path: "/ok"}, Action: route.Action{Respond: &route.Respond{Status: 200, Body: "ok\n"}}},
			{Name: "all", Action: route.Action{Pool: "p"}},
		}}}}},
	}
	ts := startServer(t, routingConfig(t, rc))
	before := heldWrites.Load()
	for _, tc := range []struct {
		req  string
		want func(body []byte) bool
	}{
		{"GET /ok HTTP/1.0\r\n\r\n", func(b []byte) bool { return string(b) == "ok\n" }},
		{"GET /ok HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n", func(b []byte) bool { return string(b) == "ok\n" }},
		{"GET /x HTTP/1.0\r\nHost: example.com\r\n\r\n", func(b []byte) bool { return strings.Contains(string(b), "/x") }},
		{"GET /big?n=300000 HTTP/1.0\r\nHost: example.com\r\n\r\n", func(b []byte) bool { return len(b) == 300000 }},
	} {
		c, err := tls.Dial("tcp", ts.addr, ts.clientTLS())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, tc.req); err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Fatalf("%q: reading to the end: %v", tc.req, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		if err != nil {
			t.Fatalf("%q: response %.200q: %v", tc.req, raw, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || !resp.Close || !tc.want(body) {
			t.Errorf("%q: status %d, close %v, %d bytes %.100q, %v", tc.req, resp.StatusCode, resp.Close, len(body), body, err)
		}
	}
	if n := heldWrites.Load() - before; n != 2 {
		t.Errorf("%d responses held for their close_notify, want the 2 answered by l7d itself", n)
	}
}

// TestNoWriteAfterReset: a client that resets its connection after the handshake,
// before any request, gets nothing written after the reset: fasthttp's error
// response for the failed first read is dropped, not sealed and sent to a reset
// socket. The server goes on serving.
func TestNoWriteAfterReset(t *testing.T) {
	be := startBackend(t, "be")
	ts := startServer(t, baseConfig(t, be.addr))
	before := droppedWrites.Load()
	const n = 3
	for i := range n {
		c, err := tls.Dial("tcp", ts.addr, ts.clientTLS())
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the connection to reach HTTP/1.1", func() bool { return ts.conns(connHTTP1) == 1 })
		tc := c.NetConn().(*net.TCPConn)
		_ = tc.SetLinger(0) // close sends a reset
		tc.Close()
		waitFor(t, "l7d to close the reset connection", func() bool { return ts.conns(connHTTP1) == 0 })
		if got := droppedWrites.Load() - before; got != int64(i+1) {
			t.Fatalf("after %d reset connections, %d writes dropped, want one each (the error response)", i+1, got)
		}
	}
	if resp, _ := get(t, ts.client(t, "1.1"), "GET", ts.url("/"), ""); resp.StatusCode == 0 {
		t.Fatal("no response after the resets")
	}
}
