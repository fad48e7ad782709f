package main

import (
	"github.com/tiergate/tiergate/bench/benchkit"

	"context"
	"crypto/tls"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// serveGoTLSCommand is the hidden first argument that makes this program the baseline
// server of -profile -servers go-tls: crypto/tls alone, serving the site certificate
// the way the load uses l7d (handshake, then read until the client's close_notify, then
// close), with net/http/pprof. It tells what l7d adds to crypto/tls.
const serveGoTLSCommand = "serve-gotls"

func serveGoTLS(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench-handshake "+serveGoTLSCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "TLS `address`")
	certFile := fs.String("cert", "", "certificate `file`")
	keyFile := fs.String("key", "", "private key `file`")
	ticketFile := fs.String("ticket-key", "", "session ticket key `file` (64 hex digits)")
	ppAddr := fs.String("pprof", "", "`address` of /debug/pprof/ and /healthz")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := runGoTLS(*addr, *certFile, *keyFile, *ticketFile, *ppAddr); err != nil {
		fmt.Fprintf(stderr, "bench-handshake %s: %v\n", serveGoTLSCommand, err)
		return 1
	}
	return 0
}

func runGoTLS(addr, certFile, keyFile, ticketFile, ppAddr string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	hexKey, err := os.ReadFile(ticketFile)
	if err != nil {
		return err
	}
	var tk [32]byte
	if n, err := hex.Decode(tk[:], []byte(strings.TrimSpace(string(hexKey)))); err != nil || n != len(tk) {
		return fmt.Errorf("ticket key %s: want 64 hex digits", ticketFile)
	}
	cfg.SetSessionTicketKeys([][32]byte{tk})

	pln, err := net.Listen("tcp", ppAddr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	ps := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go ps.Serve(pln)
	defer ps.Close()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveHandshakes(ctx, ln, cfg)
}

// serveHandshakes serves ln until ctx ends: each connection makes a handshake, is read
// until the client's close_notify (or 10s pass), and is closed with one.
func serveHandshakes(ctx context.Context, ln net.Listener, cfg *tls.Config) error {
	return serveConns(ctx, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, cfg)
		if tc.Handshake() != nil {
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(tc, maxDrain))
		tc.Close()
	})
}

// serveConns accepts ln's connections until ctx ends and runs serve on each in a
// goroutine of its own, which closes the connection after; it returns once they
// have all ended, nil when ctx ended the accepting.
func serveConns(ctx context.Context, ln net.Listener, serve func(net.Conn)) error {
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
		wg.Go(func() {
			defer c.Close()
			serve(c)
		})
	}
}

// startProfile collects a CPU profile and an allocation profile of s over the
// measured window of a row, when s is a profiling variant, into -profile's directory
// as <server>-<version>-<mode>.pprof and .allocs.pprof. The returned function waits
// for them.
func (b *bench) startProfile(ctx context.Context, s *server, version uint16, mode string) (wait func()) {
	if s.pprofURL == "" {
		return func() {}
	}
	seconds := int((b.o.duration + time.Second - 1) / time.Second)
	base := filepath.Join(b.o.profileDir, fmt.Sprintf("%s-%s-%s", s.id, strings.ReplaceAll(strings.ToLower(tls.VersionName(version)), " ", ""), mode))
	return benchkit.FetchProfiles(ctx, s.pprofURL, base, b.o.warmup, seconds, func(what, path string, err error) {
		if err != nil {
			b.Progress("  %s profile of %s: %v", what, s.id, err)
			return
		}
		b.Progress("  %s profile of %s written to %s", what, s.id, path)
	})
}
