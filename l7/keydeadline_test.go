package l7

import (
	"context"
	"crypto"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// deadlineSigner is a key whose operations take a context, as the keyserver client's
// do: it signs locally and records the deadline each operation was given.
type deadlineSigner struct {
	crypto.Signer
	mu        sync.Mutex
	deadlines []time.Time // zero: no deadline
	plain     int         // operations through Sign, without a context
}

func (s *deadlineSigner) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	d, _ := ctx.Deadline()
	s.mu.Lock()
	s.deadlines = append(s.deadlines, d)
	s.mu.Unlock()
	return s.Signer.Sign(nil, digest, opts)
}

func (s *deadlineSigner) Sign(rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	s.mu.Lock()
	s.plain++
	s.mu.Unlock()
	return s.Signer.Sign(rand, digest, opts)
}

// TestKeyOperationGetsHandshakeDeadline: an offloaded key's operation is given the
// handshake's own deadline (its start plus what is left of the client's
// HandshakeTimeout, nearly all of it by then), which the keyserver client
// waits until in place of its fixed request timeout, so a burst queued behind a busy
// keyserver is not failed while its clients still wait.
func TestKeyOperationGetsHandshakeDeadline(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	p := getPKI(t)
	leaf := p.leaf
	ds := &deadlineSigner{Signer: leaf.PrivateKey.(crypto.Signer)}
	leaf.PrivateKey = ds
	cfg.Listeners[0].TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	const hsTimeout = 7 * time.Second
	cfg.Listeners[0].HandshakeTimeout = config.Duration(hsTimeout)
	ts := startServer(t, cfg)

	before := time.Now()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ts.addr,
		&tls.Config{ServerName: "localhost", RootCAs: ts.pki.pool, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	c.Close()

	ds.mu.Lock()
	defer ds.mu.Unlock()
	if ds.plain != 0 || len(ds.deadlines) != 1 {
		t.Fatalf("%d operations with a context, %d without; want 1 with", len(ds.deadlines), ds.plain)
	}
	d := ds.deadlines[0]
	if d.Before(before.Add(hsTimeout)) || d.After(after.Add(hsTimeout)) {
		t.Errorf("the key operation's deadline is %v after the dial began, want %v (the handshake's)", d.Sub(before), hsTimeout)
	}
}

// A key operation started late in the client's budget still gets HandshakeTimeout
// of its own: it is the server's time, which the budget does not pay for.
func TestKeyDeadlineIsTheServers(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	const timeout = 4 * time.Second
	c := &handshakeConn{Conn: a}
	// Accepted 3 s ago, and the client's bytes came only now: it has used 3 s of its 4.
	c.start(time.Now().Add(-3*time.Second), timeout)
	c.last = time.Now()
	now := time.Now()
	if d := c.keyDeadline(); d.Before(now.Add(timeout)) {
		t.Fatalf("a key operation started with 1 s of the client's budget left gets %v, want at least %v", d.Sub(now), timeout)
	}
	c.start(time.Now(), timeout)
	c.owed = 10 * time.Second // a long computation not yet settled: the budget left is more
	if d := c.keyDeadline(); d.Before(now.Add(timeout + 9*time.Second)) {
		t.Fatalf("with the budget extended by the server's own time the key operation gets %v", d.Sub(now))
	}
}
