package client

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/keyserver/softkey"
)

// startServer runs a keyserver.Server on loopback with the test keys until the test
// ends; tweak adjusts its configuration.
func startServer(t *testing.T, tweak func(*keyserver.Config)) (addr string, reg *prometheus.Registry) {
	t.Helper()
	ks := testKeys()
	p := sharedPKI()
	b, err := softkey.New(softkey.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ks.all() {
		if _, err := b.Import("k", k); err != nil {
			t.Fatal(err)
		}
	}
	reg = prometheus.NewRegistry()
	cfg := keyserver.Config{
		TLS:        &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.ca.Pool()},
		Backends:   []backend.Backend{b},
		Clients:    []keyserver.ClientRule{{Name: "*", Keys: []string{"*"}}},
		Registerer: reg,
		Logger:     quietLog,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := keyserver.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return ln.Addr().String(), reg
}

// TestSilentConnectionsDoNotLockOutClients: silent TCP connections from one source,
// more than the keyserver's max_conns, never let their TLS handshake start; a real
// client from another address still connects and signs at once, and the flood is
// counted.
func TestSilentConnectionsDoNotLockOutClients(t *testing.T) {
	addr, reg := startServer(t, func(c *keyserver.Config) {
		c.Limits.MaxConns = 4
		c.Limits.HandshakeTimeout = config.Duration(20 * time.Second) // longer than the test
	})
	const silent = 20
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	for range silent {
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
	}
	time.Sleep(100 * time.Millisecond) // let the server accept them all

	c, err := New(Config{Servers: []string{addr}, TLS: sharedPKI().clientTLS(), Logger: quietLog,
		ConnsPerServer: 2, Timeout: config.Duration(2 * time.Second), DialTimeout: config.Duration(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ks := testKeys()
	d256 := sum256(7)
	sig, err := c.NewKey(keyID(t, ks.p256), ks.p256.Public()).Sign(nil, d256, crypto.SHA256)
	if err != nil || !ecdsa.VerifyASN1(&ks.p256.PublicKey, d256, sig) {
		t.Fatalf("a real client beside %d silent connections: %v", silent, err)
	}
	if got := counterValue(t, reg, "tiergate_keyserver_rejections_total", "reason", "too_many_source_handshakes"); got != silent-keyserver.DefaultMaxHandshakesPerSource {
		t.Errorf("too_many_source_handshakes = %v, want %d", got, silent-keyserver.DefaultMaxHandshakesPerSource)
	}
	if got := counterValue(t, reg, "tiergate_keyserver_rejections_total", "reason", "too_many_conns"); got != 0 {
		t.Errorf("too_many_conns = %v", got)
	}
}

// stallBackend stands for an HSM with one session taken by a slow operation: each
// signature takes its one slot for hold; one that cannot take it before its context
// ends gives up with backend.ErrBusy, as keyserver/hsm does. signed counts the
// signatures made.
type stallBackend struct {
	backend.Backend
	slot   chan struct{}
	hold   time.Duration
	signed *atomic.Int64
}

type stallSigner struct {
	crypto.Signer
	b stallBackend
}

func (s stallSigner) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	select {
	case s.b.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, backend.ErrBusy
	}
	defer func() { <-s.b.slot }()
	s.b.signed.Add(1)
	time.Sleep(s.b.hold)
	return s.Signer.Sign(rand.Reader, d, o)
}

func (s stallSigner) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), d, o)
}

func (b stallBackend) Keys() ([]*backend.Key, error) {
	keys, err := b.Backend.Keys()
	out := make([]*backend.Key, len(keys))
	for i, k := range keys {
		kk := *k
		kk.Signer = stallSigner{k.Signer, b}
		out[i] = &kk
	}
	return out, err
}

// TestRequestsCarryTheirDeadline: the client sends each attempt's timeout, so a
// keyserver whose backend is busy drops the requests the client gave up on instead
// of doing them after the caller left.
func TestRequestsCarryTheirDeadline(t *testing.T) {
	var signed atomic.Int64
	addr, reg := startServer(t, func(c *keyserver.Config) {
		c.Backends = []backend.Backend{stallBackend{c.Backends[0], make(chan struct{}, 1), 600 * time.Millisecond, &signed}}
	})
	c, err := New(Config{Servers: []string{addr}, TLS: sharedPKI().clientTLS(), Logger: quietLog,
		ConnsPerServer: 1, RequestTimeout: config.Duration(100 * time.Millisecond), Timeout: config.Duration(100 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitConns(t, c, 0, 1)
	if proto := c.servers[0].slots[0].conn.Load().nc.(*tls.Conn).ConnectionState().NegotiatedProtocol; proto != ALPNDeadline {
		t.Fatalf("negotiated %q, want %q", proto, ALPNDeadline)
	}
	ks := testKeys()
	key := c.NewKey(keyID(t, ks.p256), ks.p256.Public())
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := key.Sign(nil, sum256(i), crypto.SHA256)
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; !errors.Is(err, ErrTimeout) {
			t.Errorf("sign with the backend stalled: %v, want a timeout", err)
		}
	}
	// The first took the backend; the other two waited for it until their deadline
	// passed and were dropped, not signed after their callers had left.
	deadline := time.Now().Add(3 * time.Second)
	for counterValue(t, reg, "tiergate_keyserver_rejections_total", "reason", "deadline_exceeded") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("deadline_exceeded = %v, want 2", counterValue(t, reg, "tiergate_keyserver_rejections_total", "reason", "deadline_exceeded"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(700 * time.Millisecond) // what the backend would still have done
	if n := signed.Load(); n != 1 {
		t.Errorf("%d signatures made, want 1", n)
	}
}

// TestServerDeadlineIsTimeout: a server's deadline_exceeded answer is a timeout to
// the caller, as the client's own timer running out is; which of the two comes
// first depends on the machine's load. Other answers are not.
func TestServerDeadlineIsTimeout(t *testing.T) {
	err := &OpError{Op: protocol.OpECDSASign, Err: &serverError{addr: "192.0.2.1:4430", err: protocol.Errorf(protocol.CodeDeadlineExceeded, "request 3: its deadline passed")}}
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("%v: not ErrTimeout", err)
	}
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeDeadlineExceeded {
		t.Errorf("%v: the server's answer is not kept", err)
	}
	other := &serverError{addr: "192.0.2.1:4430", err: protocol.Errorf(protocol.CodeInternal, "backend failed")}
	if errors.Is(other, ErrTimeout) {
		t.Errorf("%v: taken for a timeout", other)
	}
}
