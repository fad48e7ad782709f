package l7

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tiergate/tiergate/internal/config"
)

// clientFrom returns an HTTP/1.1 client whose connections to ts leave from the
// loopback address ip (any of 127.0.0.0/8 is ours), so a test can play several
// sources.
func (ts *testServer) clientFrom(t testing.TB, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 3 * time.Second}
	tr := &http.Transport{TLSClientConfig: ts.clientTLS(), DialContext: d.DialContext}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP1(true)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// silent opens n TCP connections to addr from ip that send nothing, one after the
// other. A connection the server resets at once may fail in Dial already: it is left
// out, and counted in the second result.
func silent(t testing.TB, addr, ip string, n int) (open []net.Conn, reset int) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	var cs []net.Conn
	for range n {
		c, err := d.Dial("tcp", addr)
		if errors.Is(err, syscall.ECONNRESET) {
			reset++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs, reset
}

func (ts *testServer) rejected(reason string) float64 {
	return counter(ts.m.connsRejected.WithLabelValues("web", reason))
}

// Connections that never finish their handshake hold places of their own, bounded
// per source, and not those of MaxConns: silent connections from one source do not
// lock others out.
func TestHandshakeBudget(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	l := &cfg.Listeners[0]
	l.MaxConns = 2
	l.MaxHandshakes = 4
	l.MaxHandshakesPerSource = 2
	l.DeferAccept = -1 // accepted at once, so the test need not wait for the kernel
	l.DisableHTTP3 = true
	ts := startServer(t, cfg)

	// Eight silent connections from 127.0.0.1: two are in their handshake, the six
	// others reset at accept.
	held, refusedReset := silent(t, ts.addr, "127.0.0.1", 8)
	waitFor(t, "silent connections admitted or refused", func() bool {
		return ts.conns(connTLS) == 2 && ts.rejected("handshakes_per_source") == 6
	})
	for _, c := range held[2:] {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			refusedReset++
		}
	}
	if refusedReset != 6 {
		t.Errorf("%d of the 6 connections beyond the source's limit closed", refusedReset)
	}

	// Two real clients from other sources are served: MaxConns is theirs.
	var clients []*http.Client
	for _, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		c := ts.clientFrom(t, ip)
		clients = append(clients, c)
		resp, body := get(t, c, "GET", ts.url("/"), "")
		if resp.StatusCode != 200 {
			t.Fatalf("client from %s: %d %s", ip, resp.StatusCode, body)
		}
	}
	if n := ts.l().nconns.Load(); n != 2 {
		t.Errorf("%d connections past their handshake, want the 2 clients'", n)
	}
	if n := ts.rejected("max_conns"); n != 0 {
		t.Errorf("max_conns refused %v connections", n)
	}
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	waitFor(t, "the clients' connections closed", func() bool { return ts.l().nconns.Load() == 0 })

	// The listener's handshake budget: two more silent sources fill it, the next is reset.
	silent(t, ts.addr, "127.0.0.4", 1)
	silent(t, ts.addr, "127.0.0.5", 1)
	waitFor(t, "handshake budget full", func() bool { return ts.conns(connTLS) == 4 })
	silent(t, ts.addr, "127.0.0.6", 1)
	waitFor(t, "a connection beyond max_handshakes refused", func() bool { return ts.rejected("max_handshakes") == 1 })
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// countingSigner counts the signatures made with its key.
type countingSigner struct {
	crypto.Signer
	n *atomic.Int64
}

func (s countingSigner) Sign(rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	s.n.Add(1)
	return s.Signer.Sign(rand, digest, opts)
}

// deafConn is a client's UDP socket whose return path is cut: what it sends goes
// out, nothing comes back, as for a client whose source address is spoofed.
type deafConn struct{ net.PacketConn }

func (d deafConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		if _, _, err := d.PacketConn.ReadFrom(p); err != nil {
			return 0, nil, err
		}
	}
}

// oneWayInitials starts n QUIC handshakes to addr from one UDP socket on ip that
// never hears back; they end with ctx.
func oneWayInitials(t testing.TB, ctx context.Context, addr, ip string, n int) {
	t.Helper()
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: deafConn{udp}}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := tr.Dial(ctx, ua, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h3"}},
				&quic.Config{HandshakeIdleTimeout: time.Minute})
			if err == nil {
				c.CloseWithError(0, "")
			}
		})
	}
	t.Cleanup(func() {
		wg.Wait()
		tr.Close()
		udp.Close()
	})
}

// QUIC handshakes from sources that never answer cost no signature beyond the
// Retry threshold, hold no place among MaxConns, and do not hold up shutdown.
func TestQUICRetry(t *testing.T) {
	for _, tc := range []struct {
		name       string
		above, per int
	}{
		{"handshakes in progress", 2, 100},
		{"per source", 100, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBackend(t, "b1")
			cfg := baseConfig(t, b.addr)
			var sigs atomic.Int64
			leaf := getPKI(t).leaf
			leaf.PrivateKey = countingSigner{Signer: leaf.PrivateKey.(crypto.Signer), n: &sigs}
			l := &cfg.Listeners[0]
			l.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
			l.MaxConns = 4
			l.QUICRetryAbove = tc.above
			l.MaxHandshakesPerSource = tc.per
			l.HandshakeTimeout = config.Duration(20 * time.Second) // the one-way handshakes stay
			ts := startServer(t, cfg)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			oneWayInitials(t, ctx, ts.addr, "127.0.0.5", 8)
			retries := ts.m.quicRetries.WithLabelValues("web")
			waitFor(t, "Retries for the handshakes beyond the threshold", func() bool {
				return counter(retries) >= 6 && ts.l().quicHS.Load() == 2
			})
			time.Sleep(200 * time.Millisecond) // any late signature would show now
			if n := sigs.Load(); n != 2 {
				t.Errorf("%d signatures for 8 one-way handshakes, want 2 (those below the threshold)", n)
			}
			if n := ts.l().nconns.Load(); n != 0 {
				t.Errorf("one-way handshakes hold %d places among MaxConns", n)
			}

			// A real TLS client over TCP gets through, and a real QUIC client too, by
			// way of a Retry.
			if resp, body := get(t, ts.client(t, "1.1"), "GET", ts.url("/"), ""); resp.StatusCode != 200 {
				t.Fatalf("TLS client: %d %s", resp.StatusCode, body)
			}
			before := counter(retries)
			if resp, body := get(t, ts.client(t, "3"), "GET", ts.url("/"), ""); resp.StatusCode != 200 {
				t.Fatalf("HTTP/3 client: %d %s", resp.StatusCode, body)
			}
			if counter(retries) == before && tc.above == 2 {
				t.Errorf("the HTTP/3 client was not asked to prove its address")
			}

			// Shutdown does not wait for the handshakes that never end.
			start := time.Now()
			sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer scancel()
			if err := ts.Shutdown(sctx); err != nil {
				t.Errorf("shutdown: %v", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("shutdown took %v with one-way handshakes pending", d)
			}
		})
	}
}

func TestSourceCounts(t *testing.T) {
	sc := newSourceCounts()
	a := sourceOf(netip.MustParseAddr("192.0.2.1"))
	mapped := sourceOf(netip.MustParseAddr("::ffff:192.0.2.1"))
	v6a := sourceOf(netip.MustParseAddr("2001:db8:1:2::1"))
	v6b := sourceOf(netip.MustParseAddr("2001:db8:1:2:ffff::9")) // same /64
	v6c := sourceOf(netip.MustParseAddr("2001:db8:1:3::1"))
	if a != mapped || v6a != v6b || v6a == v6c {
		t.Fatalf("sources: %v %v %v %v %v", a, mapped, v6a, v6b, v6c)
	}
	for i := range 3 {
		if ok := sc.acquire(a, 2); ok != (i < 2) {
			t.Errorf("acquire %d: %v", i, ok)
		}
	}
	if !sc.acquire(v6a, 1) || sc.acquire(v6b, 1) || !sc.acquire(v6c, 1) {
		t.Errorf("IPv6 sources are not counted by /64")
	}
	if n := sc.count(a); n != 2 {
		t.Errorf("count %d", n)
	}
	sc.release(a)
	sc.release(a)
	if n := sc.count(a); n != 0 || len(sc.shard(a).n) != 0 && sc.shard(a).n[a.key] != 0 {
		t.Errorf("after release: %d", n)
	}
	var none source
	for range 3 {
		if !sc.acquire(none, 0) {
			t.Errorf("an unknown source was refused")
		}
	}
}

func BenchmarkSourceCounts(b *testing.B) {
	sc := newSourceCounts()
	s := sourceOf(netip.MustParseAddr("198.51.100.7"))
	b.ReportAllocs()
	for b.Loop() {
		sc.acquire(s, 100)
		sc.release(s)
	}
}
