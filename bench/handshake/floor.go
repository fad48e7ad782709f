package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// The floor rows: what the Go runtime and crypto/tls alone cost per connection in
// each shape with a request (and the sequential ones without), against which l7d's
// figure there is read: where a target is missed, whether the floor misses it as
// well, and by how much l7d is above the floor. The floor server
// is this program (serve-floor) as the least Go server that does a connection's work
// the way l7d does it: standard library only, the site certificate and key and l7d's
// ticket key, TCP_DEFER_ACCEPT and no TCP keepalive as l7d's defaults, one goroutine
// per connection, one deadline, the request answered `200 ok` from a fixed buffer,
// TCP closed without close_notify once the client has closed (with it when the
// server closes first, after an HTTP/1.0 request), one P (benchkit.FloorEnv: the
// least a Go server spends per connection; l7d's autoprocs adds a second only when
// its load needs it) and the same GODEBUG setting l7d runs with (its
// sysmon setting, l7/runtime.go). go-floor-local signs with its key; go-floor-offload asks the floor
// signer (serve-floor-signer, this program again, with the key) for each signature
// over a plain TCP connection kept open, one request and its answer at a time: the
// least a round trip to a key server costs the L7 side (l7d's keyserver channel is
// mutual TLS, whose sealing of ~300 bytes each way costs about a microsecond). The
// signer's CPU is shown beside, as keyserverd's is.
const (
	srvFloorLocal   = "go-floor-local"
	srvFloorOffload = "go-floor-offload"

	serveFloorCommand       = "serve-floor"
	serveFloorSignerCommand = "serve-floor-signer"
)

// floorFor is the floor server of an l7d server.
var floorFor = map[string]string{srvL7Local: srvFloorLocal, srvL7Offload: srvFloorOffload}

// floorShape reports whether the floor servers are measured in sh: every shape with
// a request (those the targets are read over), and the sequential ones without.
func floorShape(sh shape) bool {
	return sh.request || sh.n == 1 && (sh.kind == kindClosed || sh.kind == kindTimed)
}

// floorResponse is the floor server's answer, as l7d's respond route gives it.
var floorResponse = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 3\r\n\r\n" + okBody)

// startFloor starts a floor server (and for go-floor-offload its signer first).
func (b *bench) startFloor(ctx context.Context, id string) (*server, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	s := &server{id: id, addr: addr, floor: true}
	args := []string{serveFloorCommand, "-addr", addr, "-cert", b.f.siteCert, "-ticket-key", b.f.ticketKey}
	if id == srvFloorLocal {
		s.label = "floor: crypto/tls alone, key local"
		args = append(args, "-key", b.f.siteKey)
	} else {
		s.label = "floor: crypto/tls alone, key on the floor signer"
		saddr, err := benchkit.FreeAddr()
		if err != nil {
			return nil, err
		}
		if s.ks, err = benchkit.StartProcess(id+"-signer", self, []string{serveFloorSignerCommand, "-addr", saddr, "-key", b.f.siteKey},
			nil, filepath.Join(b.f.dir, id+"-signer.log")); err != nil {
			return nil, err
		}
		if err := waitDial(ctx, s.ks, saddr, 10*time.Second); err != nil {
			s.ks.Stop(5 * time.Second)
			return nil, err
		}
		args = append(args, "-signer", saddr)
	}
	env := append(slices.Clone(benchkit.FloorEnv), b.o.l7dEnv...)
	if s.proc, err = benchkit.StartProcess(id, self, args, env, filepath.Join(b.f.dir, id+".log")); err != nil {
		if s.ks != nil {
			s.ks.Stop(5 * time.Second)
		}
		return nil, err
	}
	s.clock = s.proc.CPU()
	s.schedPIDs = []int{s.proc.PID()}
	s.userClock = benchkit.ProcessUserCPU(s.proc.PID(), false)
	if err := b.waitTLS(ctx, s, 10*time.Second); err != nil {
		s.proc.Stop(5 * time.Second)
		if s.ks != nil {
			s.ks.Stop(5 * time.Second)
		}
		return nil, fmt.Errorf("%w; log:\n%s", err, s.proc.LogTail(10))
	}
	return s, nil
}

// waitDial polls addr until it accepts a TCP connection.
func waitDial(ctx context.Context, p *benchkit.Process, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting within %v: %w; log:\n%s", addr, timeout, err, p.LogTail(10))
		}
		select {
		case <-p.Done():
			return p.Exited()
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func serveFloor(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench-handshake "+serveFloorCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "TLS `address`")
	certFile := fs.String("cert", "", "certificate `file`")
	keyFile := fs.String("key", "", "private key `file` (or -signer)")
	signer := fs.String("signer", "", "floor signer's `address` (or -key)")
	ticketFile := fs.String("ticket-key", "", "session ticket key `file` (64 hex digits)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := floorConfig(*certFile, *keyFile, *signer, *ticketFile)
	if err == nil {
		var ln net.Listener
		if ln, err = listenDeferred(*addr); err == nil {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err = floorServe(ctx, ln, cfg)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench-handshake %s: %v\n", serveFloorCommand, err)
		return 1
	}
	return 0
}

// floorConfig is the floor server's TLS configuration: the certificate with its key
// from keyFile, or with a floorSigner for signerAddr.
func floorConfig(certFile, keyFile, signerAddr, ticketFile string) (*tls.Config, error) {
	var cert tls.Certificate
	var err error
	if keyFile != "" {
		if cert, err = tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return nil, err
		}
	} else {
		pemBytes, err := os.ReadFile(certFile)
		if err != nil {
			return nil, err
		}
		for blk, rest := pem.Decode(pemBytes); blk != nil; blk, rest = pem.Decode(rest) {
			cert.Certificate = append(cert.Certificate, blk.Bytes)
		}
		if len(cert.Certificate) == 0 {
			return nil, fmt.Errorf("%s: no certificate", certFile)
		}
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, err
		}
		cert.PrivateKey = newFloorSigner(signerAddr, cert.Leaf.PublicKey)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	if ticketFile != "" {
		hexKey, err := os.ReadFile(ticketFile)
		if err != nil {
			return nil, err
		}
		var tk [32]byte
		if n, err := hex.Decode(tk[:], []byte(strings.TrimSpace(string(hexKey)))); err != nil || n != len(tk) {
			return nil, fmt.Errorf("ticket key %s: want 64 hex digits", ticketFile)
		}
		cfg.SetSessionTicketKeys([][32]byte{tk})
	}
	return cfg, nil
}

// listenDeferred listens on addr with TCP_DEFER_ACCEPT (1 s) and no TCP keepalive,
// as l7d's defaults.
func listenDeferred(addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

// floorServe serves ln until ctx ends: each connection on a goroutine of its own
// makes its handshake, answers each request it reads with floorResponse, and is
// closed (TCP only) when the client closes or 10 s pass.
func floorServe(ctx context.Context, ln net.Listener, cfg *tls.Config) error {
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Go(func() { floorConn(c, cfg) })
	}
}

var headerEnd = []byte("\r\n\r\n")

func floorConn(c net.Conn, cfg *tls.Config) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Server(c, cfg)
	if tc.Handshake() != nil {
		return
	}
	var buf [4096]byte
	n := 0
	for {
		m, err := tc.Read(buf[n:])
		if err != nil {
			return
		}
		n += m
		for {
			i := bytes.Index(buf[:n], headerEnd)
			if i < 0 {
				break
			}
			if _, err := tc.Write(floorResponse); err != nil {
				return
			}
			if !keepAlive(buf[:i]) {
				// The server closes first: with close_notify, as TLS asks and l7d and
				// nginx send it.
				tc.Close()
				return
			}
			n = copy(buf[:], buf[i+len(headerEnd):n])
		}
		if n == len(buf) {
			return
		}
	}
}

// keepAlive reports whether a request (its head) keeps its connection open:
// HTTP/1.1 without Connection: close (s_time's HTTP/1.0 requests close theirs).
func keepAlive(head []byte) bool {
	line, _, _ := bytes.Cut(head, []byte("\r\n"))
	if !bytes.HasSuffix(line, []byte("HTTP/1.1")) {
		return false
	}
	return !bytes.Contains(bytes.ToLower(head), []byte("\r\nconnection: close"))
}

// The floor signer's exchange, one at a time on a connection: a request is the
// signature's padding (0 PKCS #1 v1.5, 1 PSS with a salt as long as the hash), its
// hash (crypto.Hash, one byte), the digest's length (one byte) and the digest; the
// answer is the signature's length (two bytes, big-endian) and the signature, or a
// length of 0 for a failure.

// floorSigner is a crypto.Signer whose signatures the floor signer makes.
type floorSigner struct {
	addr  string
	pub   crypto.PublicKey
	conns chan net.Conn // idle connections
}

func newFloorSigner(addr string, pub crypto.PublicKey) *floorSigner {
	return &floorSigner{addr: addr, pub: pub, conns: make(chan net.Conn, 64)}
}

func (s *floorSigner) Public() crypto.PublicKey { return s.pub }

func (s *floorSigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if len(digest) > 255 {
		return nil, errors.New("floor signer: digest too long")
	}
	req := make([]byte, 3+len(digest))
	if _, ok := opts.(*rsa.PSSOptions); ok {
		req[0] = 1
	}
	req[1], req[2] = byte(opts.HashFunc()), byte(len(digest))
	copy(req[3:], digest)
	var c net.Conn
	select {
	case c = <-s.conns:
	default:
		var err error
		if c, err = net.Dial("tcp", s.addr); err != nil {
			return nil, fmt.Errorf("floor signer: %w", err)
		}
	}
	sig, err := floorExchange(c, req)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("floor signer: %w", err)
	}
	select {
	case s.conns <- c:
	default:
		c.Close()
	}
	return sig, nil
}

func floorExchange(c net.Conn, req []byte) ([]byte, error) {
	if _, err := c.Write(req); err != nil {
		return nil, err
	}
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint16(hdr[:])
	if n == 0 {
		return nil, errors.New("the signer failed")
	}
	sig := make([]byte, n)
	_, err := io.ReadFull(c, sig)
	return sig, err
}

func serveFloorSigner(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench-handshake "+serveFloorSignerCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "TCP `address`")
	keyFile := fs.String("key", "", "private key `file` (PEM, PKCS #8)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	err := func() error {
		key, err := loadSigner(*keyFile)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return floorSign(ctx, ln, key)
	}()
	if err != nil {
		fmt.Fprintf(stderr, "bench-handshake %s: %v\n", serveFloorSignerCommand, err)
		return 1
	}
	return 0
}

func loadSigner(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: not a signing key", path)
	}
	return s, nil
}

// floorSign answers signature requests on ln's connections until ctx ends.
func floorSign(ctx context.Context, ln net.Listener, key crypto.Signer) error {
	return serveConns(ctx, ln, func(c net.Conn) {
		go func() { <-ctx.Done(); c.Close() }()
		var hdr [3]byte
		for {
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			digest := make([]byte, hdr[2])
			if _, err := io.ReadFull(c, digest); err != nil {
				return
			}
			var opts crypto.SignerOpts = crypto.Hash(hdr[1])
			if hdr[0] == 1 {
				opts = &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.Hash(hdr[1])}
			}
			sig, err := key.Sign(rand.Reader, digest, opts)
			if err != nil || len(sig) > 0xffff {
				sig = nil
			}
			out := make([]byte, 2+len(sig))
			binary.BigEndian.PutUint16(out, uint16(len(sig)))
			copy(out[2:], sig)
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	})
}

// floorSum is a sequential shape's floor: each server's CPU per connection and its
// parts (µs, medians of the repeats), and what the targets ask of l7d in it.
type floorSum struct {
	Generator string                 `json:"generator"`
	Request   bool                   `json:"request"`
	Servers   map[string]floorServer `json:"servers"`
	// nginx ÷ l7d offloaded and l7d local ÷ offloaded, as in vs_nginx_by_shape and
	// offload_gain_by_shape; the l7d offloaded CPU per connection each target needs
	// (nginx's ÷ 2, l7d local's ÷ 3.5); and the vs_nginx l7d would reach if its
	// user time were Go's X25519 alone, its kernel time as measured: the bound a Go
	// server's key exchange and l7d's system calls put on it here.
	VsNginx            *float64 `json:"vs_nginx"`
	OffloadGain        *float64 `json:"offload_gain"`
	VsNginxNeedsUs     *float64 `json:"vs_nginx_target_needs_l7d_offload_us"`
	OffloadGainNeedsUs *float64 `json:"offload_gain_target_needs_l7d_offload_us"`
	VsNginxBound       *float64 `json:"vs_nginx_if_l7d_user_time_were_x25519_only"`
	// What the floor itself reaches: nginx ÷ go-floor-offload and go-floor-local ÷
	// go-floor-offload, the targets' figures with the floor in l7d's place; and
	// l7d-offload ÷ go-floor-offload, how far above the floor l7d is.
	FloorVsNginx     *float64 `json:"floor_vs_nginx"`
	FloorOffloadGain *float64 `json:"floor_offload_gain"`
	L7OverFloor      *float64 `json:"l7d_offload_over_floor"`
}

// floorServer is one server's CPU per connection in a shape and its parts: user and
// system time, the public-key cryptography it must do (cryptoCosts: Go's or
// OpenSSL's; none of the signature when offloaded), its user time beyond that
// (runtime, TLS records and messages, HTTP, the key server's client), and its
// threads' scheduler counters.
type floorServer struct {
	CPU         *float64 `json:"cpu_us"`
	User        *float64 `json:"user_us"`
	Sys         *float64 `json:"sys_us"`
	Crypto      *float64 `json:"public_key_crypto_us"`
	UserBeyond  *float64 `json:"user_beyond_crypto_us"`
	KeyServer   *float64 `json:"key_server_us,omitempty"`
	Voluntary   *float64 `json:"voluntary_switches"`
	Involuntary *float64 `json:"involuntary_switches"`
	RunqWaitUs  *float64 `json:"runqueue_wait_us"`
	Slices      *float64 `json:"timeslices"`
}

func minus(a, b *float64) *float64 {
	if a == nil || b == nil {
		return nil
	}
	return ptr(round(*a-*b, 1))
}

// floorServers are the servers of the floor table, in its order.
var floorServers = []string{srvL7Local, srvFloorLocal, srvL7Offload, srvFloorOffload, srvNginx}

// cryptoOf is the public-key cryptography per connection of server srv.
func (c *cryptoCosts) cryptoOf(srv string) *float64 {
	if c == nil {
		return nil
	}
	switch srv {
	case srvL7Local, srvFloorLocal:
		return ptr(round(c.GoX25519Pair+c.GoRSASign, 1))
	case srvL7Offload, srvFloorOffload:
		return ptr(c.GoX25519Pair)
	case srvNginx:
		if c.OpenSSLRSASign == 0 || c.OpenSSLX25519Pair == 0 {
			return nil
		}
		return ptr(round(c.OpenSSLX25519Pair+c.OpenSSLRSASign, 1))
	}
	return nil
}

// floorReport prints the floor tables of the shapes measured with the floor and
// returns them by shape.
func (b *bench) floorReport(w io.Writer) map[string]floorSum {
	out := map[string]floorSum{}
	var order []shape
	for _, sh := range b.o.matrix {
		if _, done := out[sh.name]; done || !floorShape(sh) {
			continue
		}
		fs := floorSum{Generator: sh.gen, Request: sh.request, Servers: map[string]floorServer{}}
		for _, srv := range floorServers {
			count := func(clock int, scale float64) *float64 {
				v := b.shapeMedianOf(sh.name, srv, func(r *mrow) float64 { return r.perConnCount(clock) / scale })
				if v != nil {
					v = ptr(round(*v, 2))
				}
				return v
			}
			fsv := floorServer{CPU: b.shapeMedian(sh.name, srv, mclockServer), User: b.shapeMedian(sh.name, srv, mclockUser),
				Crypto: b.crypto.cryptoOf(srv), Voluntary: count(mclockVoluntary, 1), Involuntary: count(mclockInvoluntary, 1),
				RunqWaitUs: count(mclockRunqWait, 1e3), Slices: count(mclockSlices, 1)}
			if fsv.CPU == nil {
				continue
			}
			if srv == srvL7Offload || srv == srvFloorOffload {
				fsv.KeyServer = b.shapeMedian(sh.name, srv, mclockKeyserver)
			}
			fsv.Sys, fsv.UserBeyond = minus(fsv.CPU, fsv.User), minus(fsv.User, fsv.Crypto)
			fs.Servers[srv] = fsv
		}
		if _, ok := fs.Servers[srvFloorLocal]; !ok {
			if _, ok := fs.Servers[srvFloorOffload]; !ok {
				continue
			}
		}
		loc, off, ngx := fs.Servers[srvL7Local].CPU, fs.Servers[srvL7Offload].CPU, fs.Servers[srvNginx].CPU
		fs.VsNginx, fs.OffloadGain = ratio(ngx, off), ratio(loc, off)
		if ngx != nil {
			fs.VsNginxNeedsUs = ptr(round(*ngx/targetVsNginx, 1))
		}
		if loc != nil {
			fs.OffloadGainNeedsUs = ptr(round(*loc/targetOffloadGain, 1))
		}
		if o := fs.Servers[srvL7Offload]; o.Sys != nil && o.Crypto != nil {
			fs.VsNginxBound = ratio(ngx, ptr(*o.Sys+*o.Crypto))
		}
		floc, foff := fs.Servers[srvFloorLocal].CPU, fs.Servers[srvFloorOffload].CPU
		fs.FloorVsNginx, fs.FloorOffloadGain, fs.L7OverFloor = ratio(ngx, foff), ratio(floc, foff), ratio(off, foff)
		out[sh.name] = fs
		order = append(order, sh)
	}
	if len(out) == 0 {
		return nil
	}
	c := b.crypto
	fmt.Fprintf(w, "\nThe floor of each shape: server CPU µs per connection, medians of the repeats.\n")
	fmt.Fprintf(w, "%s, %s: crypto/tls alone, one P, l7d's runtime settings, key local or on a least key server (floor.go).\n", srvFloorLocal, srvFloorOffload)
	if c != nil {
		fmt.Fprintf(w, "public-key crypto per connection, one core: Go X25519 keygen + shared %.0f µs, RSA-2048 PSS sign %.0f µs;\n", c.GoX25519Pair, c.GoRSASign)
		fmt.Fprintf(w, "OpenSSL (%s) X25519 2 × derive %.0f µs, RSA-2048 sign %.0f µs (openssl speed)\n", c.OpenSSLVersion, c.OpenSSLX25519Pair, c.OpenSSLRSASign)
	}
	fmt.Fprintf(w, "user − crypto: the runtime, TLS records and messages, HTTP, the key server's client; sleeps: voluntary context switches of\n")
	fmt.Fprintf(w, "the server's threads (each an idle transition and the wake-up ending it), from /proc/<pid>/task/*/status and schedstat\n")
	t := benchkit.Table{Header: []string{"shape", "server", "CPU", "user", "sys", "pk crypto", "user − crypto", "key server", "sleeps", "involuntary", "slices", "runq wait µs"}}
	for _, sh := range order {
		t.Separator()
		for _, srv := range floorServers {
			v, ok := out[sh.name].Servers[srv]
			if !ok {
				continue
			}
			t.Row(sh.name, srv, num1(v.CPU), num1(v.User), num1(v.Sys), num1(v.Crypto), num1(v.UserBeyond), num1(v.KeyServer),
				num2(v.Voluntary), num2(v.Involuntary), num2(v.Slices), num1(v.RunqWaitUs))
		}
	}
	t.Fprint(w)
	st := benchkit.Table{Header: []string{"shape", "nginx ÷ l7d off.", "nginx ÷ floor off.", "needs l7d off. ≤ µs", "local ÷ off.", "floor local ÷ off.", "needs l7d off. ≤ µs", "l7d off. ÷ floor off.", "nginx ÷ (l7d off. sys + Go X25519)"}}
	for _, sh := range order {
		fs := out[sh.name]
		st.Row(sh.name, ratioText(fs.VsNginx, nil, nil), ratioText(fs.FloorVsNginx, nil, nil), num1(fs.VsNginxNeedsUs),
			ratioText(fs.OffloadGain, nil, nil), ratioText(fs.FloorOffloadGain, nil, nil), num1(fs.OffloadGainNeedsUs),
			ratioText(fs.L7OverFloor, nil, nil), ratioText(fs.VsNginxBound, nil, nil))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "The targets' figures with the floor in l7d's place (nginx ÷ floor off., floor local ÷ off.): where the floor misses a target\n")
	fmt.Fprintf(w, "too, a Go server cannot reach it in that shape on this machine; l7d off. ÷ floor off. is how far above that floor l7d is.\n")
	st.Fprint(w)
	return out
}

func num2(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *v)
}
