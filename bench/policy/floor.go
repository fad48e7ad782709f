package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// The floor row: what the Go runtime, net and crypto/tls alone cost to proxy a
// keep-alive request, against which l7d's figure is read. Where l7d misses nginx's
// CPU per request, the floor says whether any Go proxy built on these would meet it
// on this machine, and how much of l7d's cost is its own (fasthttp, the policy,
// header rewriting, metrics) rather than the runtime's, TLS's and the kernel's.
//
// The floor server is this program (serve-floor): standard library only, the site
// certificate and key, one goroutine per client connection with a 4 KiB reader, and
// one backend connection of its own, dialled at its first request and kept alive:
// no pool. A request head is read to its blank line and sent to the backend as it
// came (the load's requests are GETs without a body), the response head is read to
// its blank line and its Content-Length body after it, and both go to the client in
// one write. Nothing is parsed, checked or rewritten besides: no header is added,
// removed or normalized. It runs with one P and the GODEBUG setting l7d runs with
// (its sysmon setting, l7/runtime.go).
//
// The second floor (go-floor-fasthttp, serve-floor -fasthttp) is the same with
// fasthttp's Server and HostClient in place of the hand-written loop, as l7d's
// HTTP/1.1 side uses them: each request parsed and written again both ways, and
// nothing else (no policy, routing, header rewriting, deadlines or metrics). Read
// between the two floors and l7d, it says how much of l7d's cost is fasthttp's and
// how much its own.
const (
	srvFloor          = "go-floor"
	srvFloorFasthttp  = "go-floor-fasthttp"
	serveFloorCommand = "serve-floor"

	// floorMaxHead bounds a request or response head the floor reads.
	floorMaxHead = 16 << 10
)

// startFloor starts the floor server id (srvFloor or srvFloorFasthttp).
func (b *bench) startFloor(ctx context.Context, fx *fixture, backend, id string) (*endpoint, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	e := &endpoint{id: id, label: "floor: Go net and crypto/tls alone, 1 P", addr: addr}
	args := []string{serveFloorCommand, "-addr", addr, "-cert", fx.cert, "-key", fx.key, "-backend", backend}
	if id == srvFloorFasthttp {
		e.label = "floor: fasthttp's server and client alone, 1 P"
		args = append(args, "-fasthttp")
	}
	if e.proc, err = benchkit.StartProcess(id, self, args, benchkit.FloorEnv, filepath.Join(b.dir, id+".log")); err != nil {
		return nil, err
	}
	e.clock, e.user = e.proc.CPU(), benchkit.ProcessUserCPU(e.proc.PID(), false)
	return e, b.waitServing(ctx, e, fx)
}

func serveFloor(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench-policy "+serveFloorCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "TLS `address`")
	certFile := fs.String("cert", "", "certificate `file`")
	keyFile := fs.String("key", "", "private key `file`")
	backend := fs.String("backend", "", "backend's HTTP/1.1 `address`")
	withFasthttp := fs.Bool("fasthttp", false, "proxy with fasthttp's Server and HostClient")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	err := func() error {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return err
		}
		cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if *withFasthttp {
			return floorServeFasthttp(ctx, ln, cfg, *backend)
		}
		return floorServe(ctx, ln, cfg, *backend)
	}()
	if err != nil {
		fmt.Fprintf(stderr, "bench-policy %s: %v\n", serveFloorCommand, err)
		return 1
	}
	return 0
}

// floorServe proxies the connections ln accepts to backend until ctx ends.
func floorServe(ctx context.Context, ln net.Listener, cfg *tls.Config, backend string) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]struct{}{}
	go func() {
		<-ctx.Done()
		ln.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		mu.Lock()
		open[nc] = struct{}{}
		mu.Unlock()
		wg.Go(func() {
			floorConn(tls.Server(nc, cfg), backend)
			mu.Lock()
			delete(open, nc)
			mu.Unlock()
			nc.Close()
		})
	}
}

// floorServeFasthttp proxies the connections ln accepts to backend with fasthttp's
// Server and HostClient, set as l7d sets them where it matters to the cost (names
// and paths not normalized, no default headers added), until ctx ends.
func floorServeFasthttp(ctx context.Context, ln net.Listener, cfg *tls.Config, backend string) error {
	hc := &fasthttp.HostClient{Addr: backend, NoDefaultUserAgentHeader: true,
		DisableHeaderNamesNormalizing: true, DisablePathNormalizing: true}
	srv := &fasthttp.Server{
		Handler: func(c *fasthttp.RequestCtx) {
			c.Request.URI().SetScheme("http") // the backend's, not the client's https
			if err := hc.Do(&c.Request, &c.Response); err != nil {
				c.Error(err.Error(), fasthttp.StatusBadGateway)
			}
		},
		NoDefaultServerHeader: true, NoDefaultDate: true, NoDefaultContentType: true,
	}
	go func() {
		<-ctx.Done()
		srv.Shutdown()
	}()
	err := srv.Serve(tls.NewListener(ln, cfg))
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// floorConn serves one client connection's requests until it closes or one fails.
func floorConn(c *tls.Conn, backend string) {
	cr := bufio.NewReaderSize(c, 4<<10)
	var be net.Conn
	var br *bufio.Reader
	defer func() {
		if be != nil {
			be.Close()
		}
	}()
	var out []byte
	for {
		head, err := readHead(cr, nil, true)
		if err != nil {
			return
		}
		if be == nil {
			if be, err = net.Dial("tcp", backend); err != nil {
				return
			}
			br = bufio.NewReaderSize(be, 4<<10)
		}
		if _, err := be.Write(head); err != nil {
			return
		}
		if out, err = floorResponse(br, out[:0]); err != nil {
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

var errHeadTooLarge = errors.New("head larger than 16 KiB")

// readHead appends to dst the head of a message read from r, through its blank line.
// With view, it returns instead a view into r's buffer when the head is in it whole,
// valid until r is read again.
func readHead(r *bufio.Reader, dst []byte, view bool) ([]byte, error) {
	// Most heads are in the buffer whole once their first byte is.
	if _, err := r.Peek(1); err != nil {
		return nil, err
	}
	if view {
		buf, _ := r.Peek(r.Buffered())
		i := bytes.Index(buf, []byte("\r\n\r\n"))
		if j := bytes.Index(buf, []byte("\n\n")); j >= 0 && j < i || bytes.HasPrefix(buf, []byte("\r\n")) {
			i = -1 // another blank line first: gathered line by line below
		}
		if i >= 0 {
			head := buf[:i+4]
			r.Discard(i + 4)
			return head, nil
		}
	}
	base := len(dst)
	start := base // of the line being read, which may come in pieces
	for {
		piece, err := r.ReadSlice('\n')
		dst = append(dst, piece...)
		if len(dst)-base > floorMaxHead {
			return nil, errHeadTooLarge
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // a line longer than the buffer
		}
		if err != nil {
			return nil, err
		}
		if line := dst[start:]; string(line) == "\r\n" || string(line) == "\n" {
			return dst, nil
		}
		start = len(dst)
	}
}

// floorResponse appends a response read from r to dst: its head and its
// Content-Length body.
func floorResponse(r *bufio.Reader, dst []byte) ([]byte, error) {
	start := len(dst)
	dst, err := readHead(r, dst, false)
	if err != nil {
		return nil, err
	}
	n, err := contentLength(dst[start:])
	if err != nil {
		return nil, err
	}
	at := len(dst)
	dst = slices.Grow(dst, n)[:at+n]
	if _, err := io.ReadFull(r, dst[at:]); err != nil {
		return nil, err
	}
	return dst, nil
}

var errNoLength = errors.New("response without a Content-Length")

// contentLength finds a head's Content-Length value.
func contentLength(head []byte) (int, error) {
	for len(head) > 0 {
		i := bytes.IndexByte(head, '\n')
		if i < 0 {
			break
		}
		line := head[:i]
		head = head[i+1:]
		const name = "content-length:"
		if len(line) > len(name) && equalFold(line[:len(name)], name) {
			n, err := strconv.Atoi(string(bytes.TrimSpace(line[len(name):])))
			if err != nil || n < 0 || n > 1<<20 {
				return 0, fmt.Errorf("bad Content-Length %q", line)
			}
			return n, nil
		}
	}
	return 0, errNoLength
}
