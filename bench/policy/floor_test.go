package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestFloorProxies: the floor server forwards each request of a keep-alive client
// connection, as it came, over one backend connection of its own, and returns the
// backend's answers whole; the bench's own client reads them as the backend's.
func TestFloorProxies(t *testing.T) {
	t.Run("own loop", func(t *testing.T) { testFloor(t, floorServe, true) })
	t.Run("fasthttp", func(t *testing.T) { testFloor(t, floorServeFasthttp, false) })
}

func testFloor(t *testing.T, serve func(context.Context, net.Listener, *tls.Config, string) error, asItCame bool) {
	fx, err := newFixture(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The backend: a fixed answer to each request head, counting heads and
	// connections.
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer bln.Close()
	var heads, backendConns atomic.Int64
	var lastHead atomic.Pointer[string]
	go func() {
		for {
			c, err := bln.Accept()
			if err != nil {
				return
			}
			backendConns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					h, err := readHead(br, nil, false)
					if err != nil {
						return
					}
					heads.Add(1)
					s := string(h)
					lastHead.Store(&s)
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nServer: test\r\ncontent-length: %d\r\n\r\n%s", len(body), body)
				}
			}()
		}
	}()

	cert, err := tls.LoadX509KeyPair(fx.cert, fx.key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}, bln.Addr().String())
	}()

	cl := newClient(ln.Addr().String(), fx, 2, 5*time.Second)
	for i := range 6 {
		if err := cl.op(context.Background(), i%2, 0); err != nil {
			t.Fatalf("request %d through the floor: %v", i, err)
		}
	}
	if n := heads.Load(); n != 6 {
		t.Errorf("the backend saw %d requests, want 6", n)
	}
	if n := backendConns.Load(); n < 1 || n > 2 {
		t.Errorf("%d backend connections for 2 keep-alive clients, want 1 or 2", n)
	}
	if h := *lastHead.Load(); asItCame && h != string(request) {
		t.Errorf("the backend got %q, want the request as the client sent it, %q", h, request)
	}
	cl.close()
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("floorServe: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("floorServe did not return after its context ended")
	}
}

func TestFloorResponse(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		err            string
	}{
		{"whole", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcNEXT", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", ""},
		{"lower case, spaces", "HTTP/1.1 200 OK\r\ncontent-length:  2 \r\n\r\nxy", "HTTP/1.1 200 OK\r\ncontent-length:  2 \r\n\r\nxy", ""},
		{"bare newlines", "HTTP/1.1 204 No Content\nContent-Length: 0\n\n", "HTTP/1.1 204 No Content\nContent-Length: 0\n\n", ""},
		{"no length", "HTTP/1.1 200 OK\r\nServer: x\r\n\r\nabc", "", "without a Content-Length"},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "", "bad Content-Length"},
		{"huge length", "HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", "", "bad Content-Length"},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", "", "unexpected EOF"},
		{"no blank line", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", "", "EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := floorResponse(bufio.NewReaderSize(strings.NewReader(tc.in), 16), []byte("kept:"))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != "kept:"+tc.want {
				t.Errorf("got %q, want %q after what dst held", got, tc.want)
			}
		})
	}
	long := "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("p", 100)+"\r\n", 200) + "\r\n"
	if _, err := floorResponse(bufio.NewReader(strings.NewReader(long)), nil); !errors.Is(err, errHeadTooLarge) {
		t.Errorf("a head of %d bytes: %v, want errHeadTooLarge", len(long), err)
	}
}

// TestReadHeadView: a head whole in the reader's buffer is returned as a view
// without being copied, one that is not is gathered line by line, and what follows
// either is left to be read.
func TestReadHeadView(t *testing.T) {
	in := "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: b\r\n\r\n"
	br := bufio.NewReaderSize(strings.NewReader(in), 64)
	h, err := readHead(br, nil, true)
	if err != nil || string(h) != "GET / HTTP/1.1\r\nHost: a\r\n\r\n" {
		t.Fatalf("first head %q, %v", h, err)
	}
	h, err = readHead(br, nil, true)
	if err != nil || string(h) != "GET /2 HTTP/1.1\r\nHost: b\r\n\r\n" {
		t.Fatalf("second head %q, %v", h, err)
	}
	if _, err := readHead(br, nil, true); err != io.EOF {
		t.Fatalf("after the last head: %v, want EOF", err)
	}
	// Larger than the buffer: read line by line.
	big := "GET / HTTP/1.1\r\nX-A: " + strings.Repeat("a", 80) + "\r\n\r\nrest"
	br = bufio.NewReaderSize(strings.NewReader(big), 16)
	if h, err := readHead(br, nil, true); err != nil || string(h) != big[:len(big)-4] {
		t.Fatalf("a head larger than the buffer: %q, %v", h, err)
	}
	if rest, _ := io.ReadAll(br); string(rest) != "rest" {
		t.Errorf("left after the head: %q", rest)
	}
}

// FuzzFloorResponse: whatever a backend sends, the floor's response reader returns
// a head that ends in a blank line and a body of its Content-Length, or an error; it
// never panics, and never allocates past its head and body bounds.
func FuzzFloorResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"))
	f.Add([]byte("HTTP/1.1 200 OK\r\ncontent-length:7\r\n\r\nabc"))
	f.Add([]byte("HTTP/1.1 200 OK\nContent-Length: 0\n\n"))
	f.Add([]byte("\r\n\r\n"))
	f.Add([]byte("Content-Length: 1048577\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := floorResponse(bufio.NewReaderSize(bytes.NewReader(in), 16), nil)
		if err != nil {
			return
		}
		if len(got) > len(in) {
			t.Fatalf("returned %d bytes from %d", len(got), len(in))
		}
		if !bytes.Equal(got, in[:len(got)]) {
			t.Fatalf("returned %q, not a prefix of the input", got)
		}
		i := bytes.Index(got, []byte("\n\r\n"))
		j := bytes.Index(got, []byte("\n\n"))
		if i < 0 && j < 0 {
			t.Fatalf("returned %q, with no blank line", got)
		}
	})
}
