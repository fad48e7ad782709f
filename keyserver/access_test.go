package keyserver

import (
	"bufio"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// TestRulesRequired: without client rules the server does not start, unless
// allow_all_clients says so, and then it is reported and grants signatures only.
func TestRulesRequired(t *testing.T) {
	testKeys(t)
	f := newFixture(t, nil)
	cfg := f.srv.cfg
	cfg.Clients, cfg.Registerer = nil, nil
	if _, err := NewServer(cfg); err == nil || !strings.Contains(err.Error(), "clients: no rules") {
		t.Fatalf("no rules: %v", err)
	}
	cfg.AllowAllClients = true
	cfg.Clients = []ClientRule{{Name: "x", Keys: []string{"*"}}}
	if _, err := NewServer(cfg); err == nil || !strings.Contains(err.Error(), "allow_all_clients: set together with client rules") {
		t.Fatalf("rules and allow_all_clients: %v", err)
	}

	f = newFixture(t, func(c *Config) { c.Clients, c.AllowAllClients = nil, true })
	if !f.srv.AllowsAllClients() || testutil.ToFloat64(f.srv.m.allowAll) != 1 {
		t.Errorf("allow_all_clients not reported")
	}
	c := f.dial(t, "anyone")
	d := digest(crypto.SHA256, "all")
	if _, err := c.do(&protocol.Request{Op: protocol.OpECDSASign, ID: 1, KeyID: f.ids["ec"], Hash: protocol.HashSHA256, Payload: d}); err != nil {
		t.Errorf("sign under allow_all_clients: %v", err)
	}
	//lint:ignore SA1019 TLS 1.2 RSA key exchange is PKCS #1 v1.5 encryption; it is what keyserverd must decrypt
	ct, _ := rsa.EncryptPKCS1v15(rand.Reader, &f.rsa.PublicKey, []byte("secret"))
	if _, err := c.do(&protocol.Request{Op: protocol.OpRSADecrypt, ID: 2, KeyID: f.ids["rsa"], Payload: ct}); !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Errorf("decrypt under allow_all_clients: %v, want not_authorized", err)
	}
	if _, err := f.srv.Apply(Update{Clients: []ClientRule{{Name: "anyone", Keys: []string{"ec"}}}}); err != nil {
		t.Fatal(err)
	}
	if f.srv.AllowsAllClients() || testutil.ToFloat64(f.srv.m.allowAll) != 0 {
		t.Errorf("allow_all_clients still reported after rules were applied")
	}
	if _, err := f.srv.Apply(Update{}); err == nil || !strings.Contains(err.Error(), "no rules") {
		t.Errorf("applying no rules: %v", err)
	}
}

// TestOpsPerRule: a rule without ops may sign and fetch public keys but not decrypt;
// rsa_decrypt, and only what is listed, when ops say so.
func TestOpsPerRule(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Clients = []ClientRule{
			{Name: "signer", Keys: []string{"*"}},
			{Name: "decrypter", Keys: []string{"*"}, Ops: []string{"rsa_decrypt"}},
			{Name: "pss-only", Keys: []string{"*"}, Ops: []string{"rsa_sign_pss", "public_key"}},
		}
	})
	d := digest(crypto.SHA256, "ops")
	//lint:ignore SA1019 TLS 1.2 RSA key exchange is PKCS #1 v1.5 encryption; it is what keyserverd must decrypt
	ct, _ := rsa.EncryptPKCS1v15(rand.Reader, &f.rsa.PublicKey, []byte("secret"))
	pkcs1 := &protocol.Request{Op: protocol.OpRSASignPKCS1, KeyID: f.ids["rsa"], Hash: protocol.HashSHA256, Payload: d}
	pss := &protocol.Request{Op: protocol.OpRSASignPSS, KeyID: f.ids["rsa"], Hash: protocol.HashSHA256, Payload: d}
	ec := &protocol.Request{Op: protocol.OpECDSASign, KeyID: f.ids["ec"], Hash: protocol.HashSHA256, Payload: d}
	ed := &protocol.Request{Op: protocol.OpEd25519Sign, KeyID: f.ids["ed"], Payload: []byte("m")}
	pub := &protocol.Request{Op: protocol.OpPublicKey, KeyID: f.ids["rsa"]}
	dec := &protocol.Request{Op: protocol.OpRSADecrypt, KeyID: f.ids["rsa"], Payload: ct}
	for _, tc := range []struct {
		client  string
		allowed map[*protocol.Request]bool
	}{
		{"signer", map[*protocol.Request]bool{pkcs1: true, pss: true, ec: true, ed: true, pub: true, dec: false}},
		{"decrypter", map[*protocol.Request]bool{pkcs1: false, pss: false, ec: false, ed: false, pub: false, dec: true}},
		{"pss-only", map[*protocol.Request]bool{pkcs1: false, pss: true, ec: false, ed: false, pub: true, dec: false}},
	} {
		c := f.dial(t, tc.client)
		id := uint64(0)
		for req, allowed := range tc.allowed {
			id++
			r := *req
			r.ID = id
			_, err := c.do(&r)
			if allowed && err != nil {
				t.Errorf("%s %s: %v", tc.client, r.Op, err)
			}
			if !allowed && (!errors.Is(err, protocol.ErrNotAuthorized) || !strings.Contains(err.Error(), "may not ask for "+r.Op.String())) {
				t.Errorf("%s %s: %v, want not_authorized", tc.client, r.Op, err)
			}
		}
	}
	for _, tc := range []struct{ ops, err string }{
		{"import_key", `clients[0].ops[0]: unknown operation "import_key"`},
		{"", `clients[0].ops[0]: unknown operation ""`},
		{"decrypt", `unknown operation "decrypt": want sign, * or one of public_key, rsa_sign_pkcs1`},
	} {
		if err := ValidateClients([]ClientRule{{Name: "x", Ops: []string{tc.ops}}}); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("ops %q: %v, want %q", tc.ops, err, tc.err)
		}
	}
}

// TestDenyList: a certificate listed by serial or by key is refused at the
// handshake's end, and an open connection is cut once a new list names it.
func TestDenyList(t *testing.T) {
	f := newFixture(t, nil)
	byKey, err := f.clientCA.Leaf("l7-all")
	if err != nil {
		t.Fatal(err)
	}
	bySerial, err := f.clientCA.Leaf("l7-all")
	if err != nil {
		t.Fatal(err)
	}
	spki := sha256.Sum256(byKey.Leaf.RawSubjectPublicKeyInfo)
	serial := bySerial.Leaf.SerialNumber.Bytes()
	var colons []string
	for _, b := range serial {
		colons = append(colons, hex.EncodeToString([]byte{b}))
	}
	deny := DenyList{Serials: []string{strings.ToUpper(strings.Join(colons, ":"))}, SPKISHA256: []string{hex.EncodeToString(spki[:])}}

	dial := func(cert tls.Certificate) (*rawConn, error) {
		cfg := f.clientTLS(t, nil, "")
		cfg.Certificates = []tls.Certificate{cert}
		tc, err := tls.Dial("tcp", f.srv.Addr().String(), cfg)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { tc.Close() })
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		return &rawConn{t: t, tc: tc, br: bufio.NewReader(tc)}, nil
	}
	ping := func(c *rawConn, id uint64) error {
		if _, err := c.tc.Write(protocol.AppendRequest(nil, &protocol.Request{Op: protocol.OpPing, ID: id, Payload: []byte("p")})); err != nil {
			return err
		}
		_, _, err := c.recv()
		return err
	}
	open, err := dial(byKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(open, 1); err != nil {
		t.Fatalf("before the deny list: %v", err)
	}
	if _, err := f.srv.Apply(Update{Clients: f.srv.cfg.Clients, Deny: deny}); err != nil {
		t.Fatal(err)
	}
	if err := ping(open, 2); err == nil {
		t.Errorf("an open connection of a denied key is still served")
	}
	for name, cert := range map[string]tls.Certificate{"key": byKey, "serial": bySerial} {
		c, err := dial(cert)
		if err == nil {
			err = ping(c, 3)
		}
		if err == nil {
			t.Errorf("denied by %s: served", name)
		}
	}
	waitCounter(t, f.srv.m.rejections.WithLabelValues(rejectDenied), 3)
	if c, err := dial(f.leaf(t, "l7-all")); err != nil || ping(c, 4) != nil {
		t.Errorf("a certificate not on the list: %v", err)
	}
	if err := (DenyList{Serials: []string{"xyz"}, SPKISHA256: []string{"00"}}).Validate(); err == nil ||
		!strings.Contains(err.Error(), `serials[0]: serial "xyz"`) || !strings.Contains(err.Error(), `spki_sha256[0]: spki_sha256 "00"`) {
		t.Errorf("bad deny list: %v", err)
	}
}

// TestRateLimit: a client over its rule's rate is answered overloaded and counted;
// another client of the same rule has a bucket of its own.
func TestRateLimit(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Clients = []ClientRule{{Name: "l7", Keys: []string{"*"}, RateLimit: RateLimit{PerSecond: 0.5, Burst: 3}}}
	})
	d := digest(crypto.SHA256, "rate")
	sign := func(c *rawConn, id uint64) error {
		_, err := c.do(&protocol.Request{Op: protocol.OpECDSASign, ID: id, KeyID: f.ids["ec"], Hash: protocol.HashSHA256, Payload: d})
		return err
	}
	a1, a2 := f.dial(t, "l7"), f.dial(t, "l7")
	// a1 and a2 have different certificates (one key each): separate buckets.
	for i := uint64(1); i <= 3; i++ {
		if err := sign(a1, i); err != nil {
			t.Fatalf("request %d within the burst: %v", i, err)
		}
	}
	if err := sign(a1, 4); !errors.Is(err, protocol.ErrOverloaded) || !strings.Contains(err.Error(), "rate limit") {
		t.Errorf("over the rate: %v, want overloaded", err)
	}
	if _, err := a1.do(&protocol.Request{Op: protocol.OpPing, ID: 5}); err != nil {
		t.Errorf("a ping over the rate: %v", err)
	}
	if err := sign(a2, 1); err != nil {
		t.Errorf("another client of the rule: %v", err)
	}
	if got := testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectRateLimited)); got != 1 {
		t.Errorf("rate_limited = %v, want 1", got)
	}
	if err := ValidateClients([]ClientRule{{Name: "x", RateLimit: RateLimit{PerSecond: -1, Burst: -2}}}); err == nil ||
		!strings.Contains(err.Error(), "rate_limit.per_second") || !strings.Contains(err.Error(), "rate_limit.burst") {
		t.Errorf("bad rate limit: %v", err)
	}
}

// gatedBackend stands for an HSM with one session: its keys' signatures take the
// gate for hold, and one that cannot take it before its context ends gives up with
// backend.ErrBusy, as keyserver/hsm does. reached counts the signatures made.
type gatedBackend struct {
	backend.Backend
	gate    chan struct{}
	hold    time.Duration
	reached *atomic.Int64
}

type gatedSigner struct {
	crypto.Signer
	b gatedBackend
}

func (s gatedSigner) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	select {
	case s.b.gate <- struct{}{}:
	case <-ctx.Done():
		return nil, backend.ErrBusy
	}
	defer func() { <-s.b.gate }()
	s.b.reached.Add(1)
	time.Sleep(s.b.hold)
	return s.Signer.Sign(rand.Reader, d, o)
}

func (s gatedSigner) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), d, o)
}

func (b gatedBackend) Keys() ([]*backend.Key, error) {
	keys, err := b.Backend.Keys()
	out := make([]*backend.Key, len(keys))
	for i, k := range keys {
		kk := *k
		kk.Signer = gatedSigner{k.Signer, b}
		out[i] = &kk
	}
	return out, err
}

// TestDeadlineDropsWork: a request whose deadline passes while it waits for the
// backend is dropped (deadline_exceeded) without reaching it, one without a
// deadline waits no longer than backend_wait (overloaded), and one whose deadline is
// later than backend_wait is waited for and done.
func TestDeadlineDropsWork(t *testing.T) {
	var reached atomic.Int64
	f := newFixture(t, func(c *Config) {
		c.Limits.BackendWait = config.Duration(150 * time.Millisecond)
		c.Backends = []backend.Backend{gatedBackend{c.Backends[0], make(chan struct{}, 1), 400 * time.Millisecond, &reached}}
	})
	c := f.dial(t, "l7-all")
	d := digest(crypto.SHA256, "late")
	req := func(id uint64, timeout time.Duration) []byte {
		return protocol.AppendRequest(nil, &protocol.Request{Op: protocol.OpECDSASign, ID: id, KeyID: f.ids["ec"], Hash: protocol.HashSHA256, Payload: d, Timeout: timeout})
	}
	c.tc.Write(req(1, 0))
	time.Sleep(50 * time.Millisecond) // request 1 holds the backend
	c.tc.Write(append(append(req(2, 30*time.Millisecond), req(3, 0)...), req(4, 2*time.Second)...))
	got := map[uint64]error{}
	for range 4 {
		h, _, err := c.recv()
		got[h.ID] = err
	}
	if got[1] != nil {
		t.Errorf("request 1: %v", got[1])
	}
	if !errors.Is(got[2], protocol.ErrDeadlineExceeded) {
		t.Errorf("request 2 (30ms deadline): %v, want deadline_exceeded", got[2])
	}
	if !errors.Is(got[3], protocol.ErrOverloaded) || !strings.Contains(got[3].Error(), "backend_wait") {
		t.Errorf("request 3 (no deadline): %v, want overloaded past backend_wait", got[3])
	}
	if got[4] != nil {
		t.Errorf("request 4 (2s deadline, past backend_wait 150ms, the backend free after 400ms): %v", got[4])
	}
	if n := reached.Load(); n != 2 {
		t.Errorf("%d signatures reached the backend, want 2 (requests 1 and 4)", n)
	}
	if testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectDeadline)) != 1 ||
		testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectBackendBusy)) != 1 {
		t.Errorf("rejections: deadline_exceeded %v, backend_busy %v", testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectDeadline)),
			testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectBackendBusy)))
	}
}

// TestHandshakeBudget: connections in their handshake from one source beyond
// max_handshakes_per_source, and from all beyond max_handshakes, are closed at
// accept, and an authenticated client still gets in.
func TestHandshakeBudget(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Limits.MaxConns = 2
		c.Limits.MaxHandshakes = 4
		c.Limits.MaxHandshakesPerSource = 2
		c.Limits.HandshakeTimeout = config.Duration(5 * time.Second)
	})
	silent := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		nc, err := d.Dial("tcp", f.srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	var fromTwo []net.Conn
	for range 4 {
		fromTwo = append(fromTwo, silent("127.0.0.2"))
	}
	waitCounter(t, f.srv.m.rejections.WithLabelValues(rejectSourceHandshakes), 2)
	silent("127.0.0.3")
	silent("127.0.0.3")
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(f.srv.m.handshaking) != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%v handshakes in progress, want 4", testutil.ToFloat64(f.srv.m.handshaking))
		}
		time.Sleep(5 * time.Millisecond)
	}
	silent("127.0.0.4")
	waitCounter(t, f.srv.m.rejections.WithLabelValues(rejectTooManyHandshakes), 1)
	if got := testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectTooManyConns)); got != 0 {
		t.Errorf("too_many_conns = %v: connections in their handshake took authenticated places", got)
	}
	// Places come free as handshakes end; authenticated clients fill max_conns, and
	// one more is closed after its handshake.
	for _, nc := range fromTwo {
		nc.Close()
	}
	for testutil.ToFloat64(f.srv.m.handshaking) > 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%v handshakes in progress after two closed", testutil.ToFloat64(f.srv.m.handshaking))
		}
		time.Sleep(5 * time.Millisecond)
	}
	a, b := f.dial(t, "l7-all"), f.dial(t, "l7-ec")
	for i, c := range []*rawConn{a, b} {
		if _, err := c.do(&protocol.Request{Op: protocol.OpPing, ID: uint64(i + 1)}); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	third := f.dial(t, "l7-all")
	if _, err := third.do(&protocol.Request{Op: protocol.OpPing, ID: 9}); err == nil {
		t.Errorf("a client beyond max_conns was served")
	}
	waitCounter(t, f.srv.m.rejections.WithLabelValues(rejectTooManyConns), 1)
}

// leaf is a client certificate of the fixture's client CA.
func (f *fixture) leaf(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	cert, err := f.clientCA.Leaf(cn)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
