package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// FuzzConnResponses feeds arbitrary bytes as a server's answers to a connection with
// three requests in flight (IDs 1 to 3). Whatever arrives, every request must end,
// with an answer that was sent or with an error, and nothing may panic.
func FuzzConnResponses(f *testing.F) {
	sig := bytes.Repeat([]byte{0x30}, 70)
	ok := func(id uint64) []byte { return protocol.AppendResponse(nil, protocol.OpECDSASign, id, sig) }
	f.Add([]byte{})
	f.Add(append(append(ok(3), ok(1)...), ok(2)...))
	f.Add(append(ok(2), protocol.AppendError(nil, protocol.OpECDSASign, 1, protocol.ErrNotAuthorized)...))
	f.Add(append(ok(9), ok(1)...))                               // unknown ID, then a known one
	f.Add(protocol.AppendResponse(nil, protocol.OpPing, 1, nil)) // wrong op
	f.Add(ok(1)[:20])                                            // truncated
	bad := ok(1)
	bad[0] = 9 // version
	f.Add(bad)
	huge := ok(2)
	binary.BigEndian.PutUint32(huge[4:], protocol.MaxBody+1)
	f.Add(huge)

	f.Fuzz(func(t *testing.T, data []byte) {
		cli, srv := net.Pipe()
		defer srv.Close()
		cn := newConn(&server{addr: "fuzz"}, cli, cli, 8, time.Second)
		go io.Copy(io.Discard, srv) // the requests

		type result struct {
			body []byte
			err  error
		}
		results := make(chan result, 3)
		for range 3 {
			go func() {
				timer := getTimer(5 * time.Second)
				defer putTimer(timer)
				req := protocol.Request{Op: protocol.OpECDSASign, Hash: protocol.HashSHA256, Payload: make([]byte, 32)}
				body, err := cn.roundTrip(context.Background(), &req, 0, timer, nil, false, 0)
				results <- result{body, err}
			}()
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			cn.mu.Lock()
			n := len(cn.pending)
			cn.mu.Unlock()
			if n == 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("requests not registered")
			}
			time.Sleep(time.Millisecond)
		}
		srv.Write(data)
		srv.Close()
		for range 3 {
			select {
			case r := <-results:
				if r.err == nil && !bytes.Contains(data, r.body) {
					t.Fatalf("answer %x is not one that was sent", r.body)
				}
				if r.err != nil && errors.Is(r.err, ErrTimeout) {
					t.Fatal("a request timed out instead of failing with the connection")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a request did not end")
			}
		}
		cn.fail(errors.New("done"))
		cn.wg.Wait()
	})
}

// countingConn counts Write calls.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestWriteCoalescing checks that frames queued while a write is in progress leave
// in one write.
func TestWriteCoalescing(t *testing.T) {
	cli, srv := net.Pipe()
	defer srv.Close()
	cc := &countingConn{Conn: cli}
	cn := newConn(&server{addr: "pipe"}, cc, cc, 64, 5*time.Second)
	defer func() {
		cn.fail(errors.New("done"))
		cn.wg.Wait()
	}()

	const n = 50
	done := make(chan error, n)
	for range n {
		go func() {
			timer := getTimer(5 * time.Second)
			defer putTimer(timer)
			req := protocol.Request{Op: protocol.OpPing, Payload: []byte("12345678")}
			_, err := cn.roundTrip(context.Background(), &req, 0, timer, nil, true, 0)
			done <- err
		}()
	}
	// Nothing reads yet: the first write blocks in the pipe, the rest queue up.
	waitFor(t, 5*time.Second, "all requests queued", func() bool {
		cn.mu.Lock()
		defer cn.mu.Unlock()
		return len(cn.pending) == n
	})
	time.Sleep(20 * time.Millisecond)

	hdr := make([]byte, protocol.HeaderLen)
	for range n {
		h, body, err := protocol.ReadFrame(srv, hdr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Write(protocol.AppendResponse(nil, h.Op, h.ID, body)); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if w := cc.writes.Load(); w > 3 {
		t.Errorf("%d frames took %d writes, want them coalesced", n, w)
	}
}

func TestBackoff(t *testing.T) {
	c := &Client{cfg: Config{ReconnectMin: config.Duration(100 * time.Millisecond), ReconnectMax: config.Duration(time.Second)}}
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 60: time.Second} {
		for range 20 {
			if d := c.backoff(n); d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %s, want within [%s, %s]", n, d, want/2, want)
			}
		}
	}
}
