package stdpatch

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests in this file hold for the standard library with or without the
// internal/poll patch (a read after a short TCP read waits for readiness before its
// system call): they check that no read waits for bytes that have already arrived.
// patched_test.go checks that the patch saves the failing reads.

// tcpPair returns both ends of a loopback TCP connection, closed when the test ends.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		c.Close()
		t.Fatal(r.err)
	}
	t.Cleanup(func() { c.Close(); r.c.Close() })
	return c.(*net.TCPConn), r.c.(*net.TCPConn)
}

// readWithin reads into p with a deadline of d from now.
// shortRead writes the byte b from c and reads it on s into buf: a read shorter
// than it asked for, after which the patched library waits for readiness first.
func shortRead(t *testing.T, c, s net.Conn, buf []byte, b byte) {
	t.Helper()
	if _, err := c.Write([]byte{b}); err != nil {
		t.Fatal(err)
	}
	if n, err := readWithin(t, s, buf, 2*time.Second); n != 1 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
}

func readWithin(t *testing.T, c net.Conn, p []byte, d time.Duration) (int, error) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	return c.Read(p)
}

// TestReadAfterShortReadSeesArrivedBytes: after a short read, bytes that arrive
// before the next Read is called are read at once.
func TestReadAfterShortReadSeesArrivedBytes(t *testing.T) {
	c, s := tcpPair(t)
	buf := make([]byte, 4096)
	for i := range 200 {
		msg := []byte("message " + strconv.Itoa(i))
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		// The bytes are in s's queue before the read when the sleep is long enough
		// for loopback, and race it otherwise: both orders must work.
		if i%2 == 0 {
			time.Sleep(200 * time.Microsecond)
		}
		n, err := readWithin(t, s, buf, 2*time.Second)
		if err != nil || !bytes.Equal(buf[:n], msg) {
			t.Fatalf("round %d: read %q, %v; want %q", i, buf[:n], err, msg)
		}
	}
}

// TestFullReadDoesNotWait: a read that fills its buffer may leave bytes in the
// queue, and the next read returns them without waiting for more.
func TestFullReadDoesNotWait(t *testing.T) {
	c, s := tcpPair(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // all of it queued at s
	got := make([]byte, 0, len(data))
	buf := make([]byte, 1000)
	for len(got) < len(data) {
		n, err := readWithin(t, s, buf, 2*time.Second)
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v (a read waited for bytes already queued)", len(got), len(data), err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the bytes read differ from those written")
	}
}

// TestStreamInPieces: a stream written in pieces of random sizes at random intervals
// is read whole and in order by reads of random sizes.
func TestStreamInPieces(t *testing.T) {
	c, s := tcpPair(t)
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 256<<10)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	werr := make(chan error, 1)
	go func() {
		wr := rand.New(rand.NewPCG(3, 4))
		for off := 0; off < len(data); {
			n := min(1+wr.IntN(9000), len(data)-off)
			if _, err := c.Write(data[off : off+n]); err != nil {
				werr <- err
				return
			}
			off += n
			if wr.IntN(4) == 0 {
				time.Sleep(time.Duration(wr.IntN(300)) * time.Microsecond)
			}
		}
		werr <- nil
	}()
	got := make([]byte, 0, len(data))
	for len(got) < len(data) {
		buf := make([]byte, 1+rng.IntN(20000))
		n, err := readWithin(t, s, buf, 5*time.Second)
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v", len(got), len(data), err)
		}
		got = append(got, buf[:n]...)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the bytes read differ from those written")
	}
}

// TestShortReadThenDeadline: a read after a short read, with nothing arriving, ends
// at its deadline, and one with a deadline already past fails at once.
func TestShortReadThenDeadline(t *testing.T) {
	c, s := tcpPair(t)
	buf := make([]byte, 100)
	shortRead(t, c, s, buf, 'x')
	start := time.Now()
	_, err := readWithin(t, s, buf, 50*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing sent: %v, want the deadline", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 2*time.Second {
		t.Fatalf("the 50 ms deadline ended the read after %v", d)
	}
	if _, err := c.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	if n, err := readWithin(t, s, buf, 2*time.Second); n != 1 || err != nil || buf[0] != 'y' {
		t.Fatalf("read after the timeout: %q, %v", buf[:n], err)
	}
	if err := s.SetReadDeadline(time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with a past deadline: %v", err)
	}
}

// TestShortReadThenClose: a read waiting after a short read ends when the connection
// is closed, and when the peer closes (EOF).
func TestShortReadThenClose(t *testing.T) {
	for _, who := range []string{"local", "peer"} {
		t.Run(who, func(t *testing.T) {
			c, s := tcpPair(t)
			buf := make([]byte, 100)
			shortRead(t, c, s, buf, 'x')
			done := make(chan error, 1)
			go func() {
				_, err := readWithin(t, s, buf, 5*time.Second)
				done <- err
			}()
			time.Sleep(20 * time.Millisecond)
			want := io.EOF
			if who == "local" {
				s.Close()
				want = net.ErrClosed
			} else {
				c.Close()
			}
			select {
			case err := <-done:
				if !errors.Is(err, want) {
					t.Fatalf("read: %v, want %v", err, want)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("the read did not end")
			}
		})
	}
}

// TestRawReadBetween: a read through SyscallConn between two Reads may leave bytes
// queued without new readiness; the Read after it must not wait for more.
func TestRawReadBetween(t *testing.T) {
	c, s := tcpPair(t)
	buf := make([]byte, 100)
	shortRead(t, c, s, buf, 'a')
	if _, err := c.Write([]byte("bcd")); err != nil {
		t.Fatal(err)
	}
	rc, err := s.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var one [1]byte
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		var n int
		n, rerr = syscall.Read(int(fd), one[:])
		return rerr != syscall.EAGAIN || n > 0
	})
	if err != nil || rerr != nil || one[0] != 'b' {
		t.Fatalf("raw read: %q, %v, %v", one[:], err, rerr)
	}
	n, err := readWithin(t, s, buf, time.Second)
	if err != nil || string(buf[:n]) != "cd" {
		t.Fatalf("read after the raw read: %q, %v; want \"cd\" without waiting", buf[:n], err)
	}
}

// readSyscalls returns the read system calls this process has made (syscr in
// /proc/self/io), or skips the test where it cannot be read.
func readSyscalls(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("read system calls: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "syscr: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("/proc/self/io: %q", l)
			}
			return n
		}
	}
	t.Skip("no syscr in /proc/self/io")
	return 0
}

// pingPongReads runs rounds of a request and an answer over loopback TCP, one side
// answering each request as it comes, and returns the read system calls per round
// (both sides' reads).
func pingPongReads(t *testing.T, rounds int) float64 {
	t.Helper()
	c, s := tcpPair(t)
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for range rounds {
			n, err := s.Read(buf)
			if err != nil {
				errc <- err
				return
			}
			if _, err := s.Write(buf[:n]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 4096)
	msg := bytes.Repeat([]byte("r"), 100)
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	before := readSyscalls(t)
	for i := range rounds {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(msg); {
			n, err := c.Read(buf[got:])
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			got += n
		}
	}
	after := readSyscalls(t)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return float64(after-before) / float64(rounds)
}

// TestShortReadThenEndOfStream: bytes followed by the peer's close (FIN) or reset
// (RST) are read, then the end of stream or the error, whether both arrived before
// the first read or the end came later. An end of stream signals readiness once,
// possibly before the read that leaves the queue empty.
func TestShortReadThenEndOfStream(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reset bool
		wait  time.Duration // before the first read
	}{
		{"close, both arrived", false, 20 * time.Millisecond},
		{"close, racing", false, 0},
		{"reset, both arrived", true, 20 * time.Millisecond},
		{"reset, racing", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 50 {
				c, s := tcpPair(t)
				if _, err := c.Write([]byte("0123456789")); err != nil {
					t.Fatal(err)
				}
				if tc.reset {
					if err := c.SetLinger(0); err != nil {
						t.Fatal(err)
					}
				}
				c.Close()
				time.Sleep(tc.wait)
				if err := s.SetReadDeadline(time.Now().Add(3 * time.Second)); err != nil {
					t.Fatal(err)
				}
				all, err := io.ReadAll(s)
				switch {
				case errors.Is(err, os.ErrDeadlineExceeded):
					t.Fatalf("run %d: read %q, then waited for an end of stream that had come", i, all)
				case tc.reset && !errors.Is(err, syscall.ECONNRESET):
					t.Fatalf("run %d: read %q, %v; want the reset", i, all, err)
				case !tc.reset && (err != nil || string(all) != "0123456789"):
					t.Fatalf("run %d: read %q, %v", i, all, err)
				}
			}
		})
	}
}
