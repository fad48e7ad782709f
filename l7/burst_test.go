package l7

import (
	"bufio"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// burstKey is an RSA-4096 key (testdata/rsa4096.key) and a certificate for
// localhost issued to it: a key whose signature is most of a full handshake's CPU.
func burstKey(t *testing.T) (tls.Certificate, *rsa.PrivateKey) {
	t.Helper()
	b, err := os.ReadFile("testdata/rsa4096.key")
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("testdata/rsa4096.key: no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatalf("testdata/rsa4096.key: %v", err)
	}
	key := k.(*rsa.PrivateKey)
	cert, der, err := getPKI(t).ca.Issue("localhost", key.Public(), "localhost")
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, key
}

// signCost is the least time of a few signatures by key: its CPU cost, near enough.
func signCost(t *testing.T, key *rsa.PrivateKey) time.Duration {
	t.Helper()
	digest := sha256.Sum256([]byte("burst"))
	best := time.Duration(1 << 62)
	for range 3 {
		start := time.Now()
		if _, err := key.Sign(rand.Reader, digest[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256}); err != nil {
			t.Fatal(err)
		}
		best = min(best, time.Since(start))
	}
	return best
}

// TestLocalKeyBurstNotTimedOut: a burst of full handshakes with a local key, all
// accepted at once, takes the server longer than HandshakeTimeout to sign, on any
// number of cores; each client answers at once. Every connection is served: the
// time a handshake waits for a core behind the others' signatures is not the
// client's, and HandshakeTimeout bounds only the client's. With the timeout counted
// from accept, the later part of the burst was closed unanswered.
func TestLocalKeyBurstNotTimedOut(t *testing.T) {
	if testing.Short() {
		t.Skip("a burst of RSA-4096 handshakes")
	}
	cert, key := burstKey(t)
	// The timeout is half the burst's signing on all cores; the burst's size makes
	// it at least 300 ms, so that a client's own turn (its answer to the server's
	// flight) fits in it many times over.
	cost := signCost(t, key)
	procs := runtime.GOMAXPROCS(0)
	const minTimeout = 300 * time.Millisecond
	n := max(int(2*time.Duration(procs)*minTimeout/cost)+1, 16)
	timeout := time.Duration(n) * cost / time.Duration(2*procs)
	t.Logf("signature %v, %d handshakes, handshake_timeout %v on %d cores", cost, n, timeout, procs)

	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	cfg.Listeners[0].HandshakeTimeout = config.Duration(timeout)
	cfg.Listeners[0].MaxHandshakes = n
	cfg.Listeners[0].MaxHandshakesPerSource = n
	ts := startServer(t, cfg)
	clientTLS := &tls.Config{RootCAs: ts.pki.pool, ServerName: "localhost", MinVersion: tls.VersionTLS13}

	// Every client connects first, then all send their ClientHello at once.
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.DialTimeout("tcp", ts.addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for i, c := range conns {
		wg.Go(func() {
			<-begin
			errs[i] = burstRequest(c, clientTLS)
		})
	}
	start := time.Now()
	close(begin)
	wg.Wait()
	took := time.Since(start)

	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 5 {
				t.Errorf("connection %d: %v", i, err)
			}
		}
	}
	timedOut := counter(ts.m.handshakes.WithLabelValues("web", transportTCP, "1.3", "false", "rsa", resultTimeout))
	t.Logf("burst served in %v (%.1f× handshake_timeout); %d of %d failed, %v handshake timeouts", took, float64(took)/float64(timeout), failed, n, timedOut)
	if failed > 0 || timedOut > 0 {
		t.Fatalf("%d of %d connections of the burst failed, %v of them by handshake timeout; want none", failed, n, timedOut)
	}
}

// burstRequest does a TLS 1.3 handshake over c and one request, and checks the answer.
func burstRequest(c net.Conn, cfg *tls.Config) error {
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if _, err := tc.Write([]byte("GET /burst HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")); err != nil {
		return fmt.Errorf("writing the request: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answer %d, want 200", resp.StatusCode)
	}
	return nil
}
