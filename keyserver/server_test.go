package keyserver

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/keyserver/softkey"
	"github.com/tiergate/tiergate/testkit/testpki"
)

type fixture struct {
	srv      *Server
	reg      *prometheus.Registry
	serverCA *testpki.CA
	clientCA *testpki.CA
	soft     *softkey.Backend
	rsa      *rsa.PrivateKey
	ec       *ecdsa.PrivateKey
	ed       ed25519.PrivateKey
	ids      map[string]protocol.KeyID
}

var (
	keysOnce sync.Once
	rsaKey   *rsa.PrivateKey
	ecKey    *ecdsa.PrivateKey
	edKey    ed25519.PrivateKey
)

func testKeys(t testing.TB) {
	keysOnce.Do(func() {
		var err error
		if rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			t.Fatal(err)
		}
		if ecKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
		if _, edKey, err = ed25519.GenerateKey(rand.Reader); err != nil {
			t.Fatal(err)
		}
	})
}

// slowBackend wraps a backend so every signature takes delay: it stands for a busy
// HSM when testing the server's own queueing and shutdown.
type slowBackend struct {
	backend.Backend
	delay time.Duration
}

type slowSigner struct {
	crypto.Signer
	delay time.Duration
}

func (s slowSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	time.Sleep(s.delay)
	return s.Signer.Sign(r, d, o)
}

func (b slowBackend) Keys() ([]*backend.Key, error) {
	keys, err := b.Backend.Keys()
	out := make([]*backend.Key, len(keys))
	for i, k := range keys {
		kk := *k
		kk.Signer = slowSigner{k.Signer, b.delay}
		out[i] = &kk
	}
	return out, err
}

func newFixture(t *testing.T, tweak func(*Config)) *fixture {
	t.Helper()
	testKeys(t)
	f := &fixture{rsa: rsaKey, ec: ecKey, ed: edKey, reg: prometheus.NewRegistry(), ids: map[string]protocol.KeyID{}}
	var err error
	if f.serverCA, err = testpki.NewCA("keyserver CA"); err != nil {
		t.Fatal(err)
	}
	if f.clientCA, err = testpki.NewCA("client CA"); err != nil {
		t.Fatal(err)
	}
	f.soft, err = softkey.New(softkey.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for label, k := range map[string]crypto.PrivateKey{"rsa": f.rsa, "ec": f.ec, "ed": f.ed} {
		bk, err := f.soft.Import(label, k)
		if err != nil {
			t.Fatal(err)
		}
		f.ids[label] = bk.ID
	}
	serverCert, err := f.serverCA.Leaf("keyserver", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Addr:       "127.0.0.1:0",
		TLS:        &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: f.clientCA.Pool()},
		Backends:   []backend.Backend{f.soft},
		Registerer: f.reg,
		Clients: []ClientRule{
			{Name: "l7-all", Keys: []string{"*"}, Ops: []string{"*"}},
			{Name: "l7-ec", Keys: []string{"ec"}},
			{Name: "l7-rsa-by-id", Keys: []string{f.ids["rsa"].String()}},
			{Name: "admin", Keys: []string{"*"}, Admin: true},
		},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	f.srv, err = NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f.srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return f
}

// rawConn speaks the wire protocol directly, so tests can send what a well-behaved
// client never would.
type rawConn struct {
	t  *testing.T
	tc *tls.Conn
	br *bufio.Reader
}

func (f *fixture) clientTLS(t *testing.T, ca *testpki.CA, cn string) *tls.Config {
	cfg := &tls.Config{RootCAs: f.serverCA.Pool(), ServerName: "127.0.0.1", NextProtos: []string{ALPN}}
	if ca != nil {
		cert, err := ca.Leaf(cn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

func (f *fixture) dialAs(t *testing.T, ca *testpki.CA, cn string) (*rawConn, error) {
	tc, err := tls.Dial("tcp", f.srv.Addr().String(), f.clientTLS(t, ca, cn))
	if err != nil {
		return nil, err
	}
	// In TLS 1.3 the server's verdict on the client certificate arrives after the
	// client's handshake returns: a round trip surfaces it.
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { tc.Close() })
	return &rawConn{t: t, tc: tc, br: bufio.NewReader(tc)}, nil
}

func (f *fixture) dial(t *testing.T, cn string) *rawConn {
	t.Helper()
	c, err := f.dialAs(t, f.clientCA, cn)
	if err != nil {
		t.Fatalf("dial as %s: %v", cn, err)
	}
	return c
}

func (c *rawConn) send(r *protocol.Request) {
	c.t.Helper()
	if _, err := c.tc.Write(protocol.AppendRequest(nil, r)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *rawConn) recv() (protocol.Header, []byte, error) {
	h, body, err := protocol.ReadFrame(c.br, nil)
	if err != nil {
		return h, nil, err
	}
	return h, body, protocol.ResponseError(h, body)
}

func (c *rawConn) do(r *protocol.Request) ([]byte, error) {
	c.t.Helper()
	c.send(r)
	h, body, err := c.recv()
	if h.ID != r.ID && err == nil {
		c.t.Fatalf("answer to request %d carries ID %d", r.ID, h.ID)
	}
	return body, err
}

func digest(h crypto.Hash, msg string) []byte {
	hh := h.New()
	hh.Write([]byte(msg))
	return hh.Sum(nil)
}

func TestOperationsVerify(t *testing.T) {
	f := newFixture(t, nil)
	c := f.dial(t, "l7-all")
	hashes := []struct {
		p protocol.Hash
		c crypto.Hash
	}{{protocol.HashSHA256, crypto.SHA256}, {protocol.HashSHA384, crypto.SHA384}, {protocol.HashSHA512, crypto.SHA512}}
	id := uint64(1)
	for _, h := range hashes {
		d := digest(h.c, "tiergate")
		sig, err := c.do(&protocol.Request{Op: protocol.OpRSASignPKCS1, ID: id, KeyID: f.ids["rsa"], Hash: h.p, Payload: d})
		if err != nil {
			t.Fatalf("pkcs1 %s: %v", h.p, err)
		}
		if err := rsa.VerifyPKCS1v15(&f.rsa.PublicKey, h.c, d, sig); err != nil {
			t.Errorf("pkcs1 %s: %v", h.p, err)
		}
		id++
		sig, err = c.do(&protocol.Request{Op: protocol.OpRSASignPSS, ID: id, KeyID: f.ids["rsa"], Hash: h.p, Payload: d})
		if err != nil {
			t.Fatalf("pss %s: %v", h.p, err)
		}
		if err := rsa.VerifyPSS(&f.rsa.PublicKey, h.c, d, sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash}); err != nil {
			t.Errorf("pss %s: %v", h.p, err)
		}
		id++
		sig, err = c.do(&protocol.Request{Op: protocol.OpECDSASign, ID: id, KeyID: f.ids["ec"], Hash: h.p, Payload: d})
		if err != nil {
			t.Fatalf("ecdsa %s: %v", h.p, err)
		}
		if !ecdsa.VerifyASN1(&f.ec.PublicKey, d, sig) {
			t.Errorf("ecdsa %s: signature does not verify", h.p)
		}
		id++
	}
	msg := []byte("an Ed25519 signature covers the whole message")
	sig, err := c.do(&protocol.Request{Op: protocol.OpEd25519Sign, ID: id, KeyID: f.ids["ed"], Payload: msg})
	if err != nil || !ed25519.Verify(f.ed.Public().(ed25519.PublicKey), msg, sig) {
		t.Errorf("ed25519: err=%v, verified=%v", err, err == nil && ed25519.Verify(f.ed.Public().(ed25519.PublicKey), msg, sig))
	}

	secret := []byte("0123456789abcdef0123456789abcdef0123456789abcdef")
	//lint:ignore SA1019 TLS 1.2 RSA key exchange is PKCS #1 v1.5 encryption; it is what keyserverd must decrypt
	ct, err := rsa.EncryptPKCS1v15(rand.Reader, &f.rsa.PublicKey, secret)
	if err != nil {
		t.Fatal(err)
	}
	pt, err := c.do(&protocol.Request{Op: protocol.OpRSADecrypt, ID: 100, KeyID: f.ids["rsa"], Payload: ct})
	if err != nil || string(pt) != string(secret) {
		t.Errorf("decrypt: %q, %v", pt, err)
	}
	pt, err = c.do(&protocol.Request{Op: protocol.OpRSADecrypt, ID: 101, KeyID: f.ids["rsa"], Param: 48, Payload: ct})
	if err != nil || string(pt) != string(secret) {
		t.Errorf("decrypt session key: %q, %v", pt, err)
	}
	// A ciphertext that does not decrypt gives random bytes of the session key length,
	// not an error, and not the same bytes twice.
	bad := make([]byte, len(ct))
	r1, err1 := c.do(&protocol.Request{Op: protocol.OpRSADecrypt, ID: 102, KeyID: f.ids["rsa"], Param: 48, Payload: bad})
	r2, err2 := c.do(&protocol.Request{Op: protocol.OpRSADecrypt, ID: 103, KeyID: f.ids["rsa"], Param: 48, Payload: bad})
	if err1 != nil || err2 != nil || len(r1) != 48 || string(r1) == string(r2) {
		t.Errorf("bad session key ciphertext: %x %v / %x %v", r1, err1, r2, err2)
	}
	if _, err := c.do(&protocol.Request{Op: protocol.OpRSADecrypt, ID: 104, KeyID: f.ids["rsa"], Payload: bad}); !errors.Is(err, protocol.ErrCryptoFailure) {
		t.Errorf("bad plain ciphertext: %v, want crypto_failure", err)
	}

	spki, err := c.do(&protocol.Request{Op: protocol.OpPublicKey, ID: 200, KeyID: f.ids["ec"]})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.ParsePKIXPublicKey(spki)
	if err != nil || !pub.(*ecdsa.PublicKey).Equal(&f.ec.PublicKey) || sha256.Sum256(spki) != f.ids["ec"] {
		t.Errorf("public key: %v", err)
	}
	pong, err := c.do(&protocol.Request{Op: protocol.OpPing, ID: 201, Payload: []byte("hello")})
	if err != nil || string(pong) != "hello" {
		t.Errorf("ping: %q %v", pong, err)
	}
	if got := testutil.ToFloat64(f.srv.m.ops.WithLabelValues("rsa_sign_pkcs1", "ok")); got != 3 {
		t.Errorf("tiergate_keyserver_ops_total{op=rsa_sign_pkcs1,result=ok} = %v, want 3", got)
	}
}

func TestListKeysAndAuthorization(t *testing.T) {
	f := newFixture(t, nil)
	cases := []struct {
		client string
		want   []string
	}{
		{"l7-all", []string{"rsa", "ec", "ed"}},
		{"l7-ec", []string{"ec"}},
		{"l7-rsa-by-id", []string{"rsa"}},
		{"stranger", nil},
	}
	for _, tc := range cases {
		t.Run(tc.client, func(t *testing.T) {
			c := f.dial(t, tc.client)
			body, err := c.do(&protocol.Request{Op: protocol.OpListKeys, ID: 1})
			if err != nil {
				t.Fatal(err)
			}
			keys, err := protocol.ParseKeyList(body)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, k := range keys {
				got[k.Label] = true
			}
			if len(got) != len(tc.want) {
				t.Errorf("listed %v, want %v", got, tc.want)
			}
			for i, label := range []string{"rsa", "ec", "ed"} {
				allowed := false
				for _, w := range tc.want {
					allowed = allowed || w == label
				}
				if got[label] != allowed {
					t.Errorf("listed %v, want %v", got, tc.want)
				}
				_, err := c.do(&protocol.Request{Op: protocol.OpPublicKey, ID: uint64(10 + i), KeyID: f.ids[label]})
				if allowed && err != nil {
					t.Errorf("public key %s: %v", label, err)
				}
				if !allowed && !errors.Is(err, protocol.ErrNotAuthorized) {
					t.Errorf("public key %s: %v, want not_authorized", label, err)
				}
			}
		})
	}
	if got := testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectNotAuthorized)); got < 5 {
		t.Errorf("not_authorized rejections = %v, want ≥ 5", got)
	}
}

func TestMultiplexedAnswersInAnyOrder(t *testing.T) {
	f := newFixture(t, nil)
	c := f.dial(t, "l7-all")
	const n = 300
	d := digest(crypto.SHA256, "x")
	var frames []byte
	for i := uint64(1); i <= n; i++ {
		r := &protocol.Request{Op: protocol.OpPing, ID: i, Payload: binary.BigEndian.AppendUint64(nil, i)}
		if i%3 == 0 {
			r = &protocol.Request{Op: protocol.OpRSASignPKCS1, ID: i, KeyID: f.ids["rsa"], Hash: protocol.HashSHA256, Payload: d}
		}
		frames = protocol.AppendRequest(frames, r)
	}
	go c.tc.Write(frames)
	seen := map[uint64]bool{}
	inOrder := true
	var last uint64
	for len(seen) < n {
		h, body, err := c.recv()
		if err != nil {
			t.Fatalf("after %d answers: %v", len(seen), err)
		}
		if seen[h.ID] {
			t.Fatalf("request %d answered twice", h.ID)
		}
		seen[h.ID] = true
		inOrder = inOrder && h.ID > last
		last = h.ID
		if h.ID%3 == 0 {
			if err := rsa.VerifyPKCS1v15(&f.rsa.PublicKey, crypto.SHA256, d, body); err != nil {
				t.Errorf("request %d: %v", h.ID, err)
			}
		} else if binary.BigEndian.Uint64(body) != h.ID {
			t.Errorf("ping %d echoed %x", h.ID, body)
		}
	}
	if inOrder {
		t.Log("answers happened to arrive in order")
	}
}

func TestBadInputGetsTypedErrors(t *testing.T) {
	f := newFixture(t, nil)
	bystander := f.dial(t, "l7-all")
	checkBystander := func(step string) {
		t.Helper()
		if _, err := bystander.do(&protocol.Request{Op: protocol.OpPing, ID: 7, Payload: []byte(step)}); err != nil {
			t.Fatalf("after %s another client's ping failed: %v", step, err)
		}
	}

	t.Run("oversized length", func(t *testing.T) {
		c := f.dial(t, "l7-all")
		hdr := protocol.AppendHeader(nil, protocol.Header{Version: protocol.Version, Op: protocol.OpPing, Len: 1 << 30, ID: 42})
		c.tc.Write(hdr)
		h, _, err := c.recv()
		if !errors.Is(err, protocol.ErrBadRequest) || h.ID != 42 {
			t.Fatalf("got id=%d err=%v, want bad_request for 42", h.ID, err)
		}
		if _, _, err := c.recv(); err != io.EOF {
			t.Errorf("connection not closed after an oversized frame: %v", err)
		}
		checkBystander("oversized")
	})
	t.Run("unknown operation", func(t *testing.T) {
		c := f.dial(t, "l7-all")
		c.tc.Write(protocol.AppendFrame(nil, protocol.Header{Op: 0x7f, ID: 5}, []byte("?")))
		h, _, err := c.recv()
		if !errors.Is(err, protocol.ErrBadRequest) || h.ID != 5 {
			t.Fatalf("got id=%d err=%v, want bad_request for 5", h.ID, err)
		}
		if _, err := c.do(&protocol.Request{Op: protocol.OpPing, ID: 6}); err != nil {
			t.Errorf("connection unusable after an unknown op: %v", err)
		}
		checkBystander("unknown op")
	})
	t.Run("wrong version", func(t *testing.T) {
		c := f.dial(t, "l7-all")
		c.tc.Write(protocol.AppendHeader(nil, protocol.Header{Version: 9, Op: protocol.OpPing, ID: 8}))
		if h, _, err := c.recv(); !errors.Is(err, protocol.ErrBadRequest) || h.ID != 8 {
			t.Fatalf("got id=%d err=%v, want bad_request", h.ID, err)
		}
	})
	t.Run("malformed body", func(t *testing.T) {
		c := f.dial(t, "l7-all")
		// A SHA-256 signing request with a 5-byte digest.
		_, err := c.do(&protocol.Request{Op: protocol.OpRSASignPKCS1, ID: 9, KeyID: f.ids["rsa"], Hash: protocol.HashSHA256, Payload: []byte("short")})
		if !errors.Is(err, protocol.ErrBadRequest) {
			t.Fatalf("got %v, want bad_request", err)
		}
		// An RSA operation on an ECDSA key.
		_, err = c.do(&protocol.Request{Op: protocol.OpRSASignPKCS1, ID: 10, KeyID: f.ids["ec"], Hash: protocol.HashSHA256, Payload: digest(crypto.SHA256, "x")})
		if !errors.Is(err, protocol.ErrBadRequest) {
			t.Fatalf("got %v, want bad_request", err)
		}
	})
	t.Run("truncated frame", func(t *testing.T) {
		c := f.dial(t, "l7-all")
		full := protocol.AppendRequest(nil, &protocol.Request{Op: protocol.OpPing, ID: 11, Payload: []byte("0123456789")})
		c.tc.Write(full[:len(full)-4])
		c.tc.CloseWrite()
		h, _, err := c.recv()
		if !errors.Is(err, protocol.ErrBadRequest) || h.ID != 11 {
			t.Fatalf("got id=%d err=%v, want bad_request for 11", h.ID, err)
		}
		checkBystander("truncated")
	})
	t.Run("unknown key", func(t *testing.T) {
		c := f.dial(t, "l7-all")
		_, err := c.do(&protocol.Request{Op: protocol.OpECDSASign, ID: 12, KeyID: protocol.KeyID{1, 2, 3}, Hash: protocol.HashSHA256, Payload: digest(crypto.SHA256, "x")})
		if !errors.Is(err, protocol.ErrKeyNotFound) {
			t.Fatalf("got %v, want key_not_found", err)
		}
	})
	t.Run("not authorized for the key", func(t *testing.T) {
		c := f.dial(t, "l7-ec")
		_, err := c.do(&protocol.Request{Op: protocol.OpRSASignPKCS1, ID: 13, KeyID: f.ids["rsa"], Hash: protocol.HashSHA256, Payload: digest(crypto.SHA256, "x")})
		if !errors.Is(err, protocol.ErrNotAuthorized) {
			t.Fatalf("got %v, want not_authorized", err)
		}
		checkBystander("not authorized")
	})
	t.Run("no client certificate", func(t *testing.T) {
		before := testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectNoClientCert))
		c, err := f.dialAs(t, nil, "")
		if err == nil {
			_, _, err = c.recv()
		}
		if err == nil || err == io.EOF {
			t.Fatalf("a client without a certificate got %v, want a TLS alert", err)
		}
		waitCounter(t, f.srv.m.rejections.WithLabelValues(rejectNoClientCert), before+1)
		checkBystander("no cert")
	})
	t.Run("certificate from another CA", func(t *testing.T) {
		other, _ := testpki.NewCA("client CA") // same name, different key
		before := testutil.ToFloat64(f.srv.m.rejections.WithLabelValues(rejectUnknownCA))
		c, err := f.dialAs(t, other, "l7-all")
		if err == nil {
			_, _, err = c.recv()
		}
		if err == nil || err == io.EOF {
			t.Fatalf("a client of another CA got %v, want a TLS alert", err)
		}
		waitCounter(t, f.srv.m.rejections.WithLabelValues(rejectUnknownCA), before+1)
		checkBystander("other CA")
	})
}

func waitCounter(t *testing.T, c prometheus.Counter, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(c) < want {
		if time.Now().After(deadline) {
			t.Fatalf("counter = %v, want %v", testutil.ToFloat64(c), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOverloadedInsteadOfQueueing(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Limits.MaxInFlightPerConn = 2
		c.Backends = []backend.Backend{slowBackend{c.Backends[0], 200 * time.Millisecond}}
	})
	c := f.dial(t, "l7-all")
	var frames []byte
	for i := uint64(1); i <= 6; i++ {
		frames = protocol.AppendRequest(frames, &protocol.Request{Op: protocol.OpECDSASign, ID: i, KeyID: f.ids["ec"], Hash: protocol.HashSHA256, Payload: digest(crypto.SHA256, "x")})
	}
	c.tc.Write(frames)
	ok, overloaded := 0, 0
	for i := 0; i < 6; i++ {
		_, _, err := c.recv()
		switch {
		case err == nil:
			ok++
		case errors.Is(err, protocol.ErrOverloaded):
			overloaded++
		default:
			t.Fatalf("answer %d: %v", i, err)
		}
	}
	if ok != 2 || overloaded != 4 {
		t.Errorf("ok=%d overloaded=%d, want 2 and 4", ok, overloaded)
	}
}

func TestShutdownDrainsInFlight(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Backends = []backend.Backend{slowBackend{c.Backends[0], 300 * time.Millisecond}}
	})
	c := f.dial(t, "l7-all")
	var frames []byte
	for i := uint64(1); i <= 5; i++ {
		frames = protocol.AppendRequest(frames, &protocol.Request{Op: protocol.OpECDSASign, ID: i, KeyID: f.ids["ec"], Hash: protocol.HashSHA256, Payload: digest(crypto.SHA256, "x")})
	}
	c.tc.Write(frames)
	time.Sleep(50 * time.Millisecond) // let the server read them
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- f.srv.Shutdown(ctx)
	}()
	for i := 0; i < 5; i++ {
		if _, _, err := c.recv(); err != nil {
			t.Fatalf("in-flight request %d lost in shutdown: %v", i, err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.recv(); err == nil {
		t.Error("connection still open after shutdown")
	}
	if f.srv.Healthy() == nil {
		t.Error("healthy after shutdown")
	}
}

func TestImportKey(t *testing.T) {
	f := newFixture(t, nil)
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pemKey, err := testpki.KeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	user := f.dial(t, "l7-all")
	if _, err := user.do(&protocol.Request{Op: protocol.OpImportKey, ID: 1, Label: "new", Payload: pemKey}); !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Fatalf("import by a non-admin: %v, want not_authorized", err)
	}
	admin := f.dial(t, "admin")
	if _, err := admin.do(&protocol.Request{Op: protocol.OpImportKey, ID: 2, Label: "junk", Payload: []byte("not a key")}); !errors.Is(err, protocol.ErrBadRequest) {
		t.Fatalf("import of junk: %v, want bad_request", err)
	}
	body, err := admin.do(&protocol.Request{Op: protocol.OpImportKey, ID: 3, Label: "new", Payload: pemKey})
	if err != nil {
		t.Fatal(err)
	}
	var id protocol.KeyID
	copy(id[:], body)
	if want, _ := backend.KeyIDOf(key.Public()); id != want {
		t.Fatalf("import returned %s, want %s", id, want)
	}
	d := sha512.Sum384([]byte("x"))
	sig, err := user.do(&protocol.Request{Op: protocol.OpECDSASign, ID: 4, KeyID: id, Hash: protocol.HashSHA384, Payload: d[:]})
	if err != nil || !ecdsa.VerifyASN1(&key.PublicKey, d[:], sig) {
		t.Fatalf("sign with the imported key: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	ca, _ := testpki.NewCA("ca")
	cert, _ := ca.Leaf("ks")
	soft, _ := softkey.New(softkey.Config{})
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no TLS", Config{Backends: []backend.Backend{soft}}, "TLS with a server certificate is required"},
		{"no client CA", Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}, Backends: []backend.Backend{soft}}, "ClientCAs is required"},
		{"no backend", Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool()}}, "at least one key backend"},
		{"unnamed rule", Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool()}, Backends: []backend.Backend{soft}, Clients: []ClientRule{{}}}, "clients[0].name: required"},
		{"empty key", Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool()}, Backends: []backend.Backend{soft}, Clients: []ClientRule{{Name: "a", Keys: []string{"x", ""}}}}, "clients[0].keys[1]: empty"},
		{"negative limit", Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool()}, Backends: []backend.Backend{soft}, Limits: Limits{MaxConns: -1, IdleTimeout: -1}}, "limits.max_conns: must not be negative\nlimits.idle_timeout: must not be negative"},
	}
	for _, tc := range cases {
		_, err := NewServer(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// TestApply changes the client rules and the backends of a running server: an open
// connection follows the new rules from its next request, the keys become the new
// backends', and an update with a bad part changes nothing.
func TestApply(t *testing.T) {
	f := newFixture(t, nil)
	c := f.dial(t, "l7-ec")
	d := digest(crypto.SHA256, "apply")
	sign := func(id uint64, key string) error {
		_, err := c.do(&protocol.Request{Op: protocol.OpECDSASign, ID: id, KeyID: f.ids[key], Hash: protocol.HashSHA256, Payload: d})
		return err
	}
	if err := sign(1, "ec"); err != nil {
		t.Fatalf("before: %v", err)
	}

	// A bad rule: refused, nothing changes.
	if _, err := f.srv.Apply(Update{Clients: []ClientRule{{Name: "l7-ec"}, {Keys: []string{"*"}}}}); err == nil || !strings.Contains(err.Error(), "clients[1].name: required") {
		t.Errorf("a bad rule: %v", err)
	}
	if err := sign(2, "ec"); err != nil {
		t.Errorf("after a refused update: %v", err)
	}

	// The rule loses the key: the same connection is refused from its next request.
	if _, err := f.srv.Apply(Update{Clients: []ClientRule{{Name: "l7-ec", Keys: []string{"rsa"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := sign(3, "ec"); protocol.CodeOf(err) != protocol.CodeNotAuthorized {
		t.Errorf("after the rule lost the key: %v, want not_authorized", err)
	}

	// New backends: the keys offered are theirs; the old ones are handed back.
	soft2, err := softkey.New(softkey.Config{})
	if err != nil {
		t.Fatal(err)
	}
	k2, err := soft2.Import("ec2", f.ec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.Apply(Update{Clients: []ClientRule{{Name: "*", Keys: []string{"*"}}}, Backends: []backend.Backend{}}); err == nil {
		t.Errorf("an empty list of backends was applied")
	}
	replaced, err := f.srv.Apply(Update{Clients: []ClientRule{{Name: "*", Keys: []string{"ec2"}}}, Backends: []backend.Backend{soft2}})
	if err != nil {
		t.Fatal(err)
	}
	if len(replaced) != 1 || replaced[0] != backend.Backend(f.soft) {
		t.Errorf("replaced %v, want the old software backend", replaced)
	}
	if keys := f.srv.Keys(); len(keys) != 1 || keys[0].Label != "ec2" || keys[0].ID != k2.ID {
		t.Errorf("keys after the new backends: %+v", keys)
	}
	if bs := f.srv.Backends(); len(bs) != 1 || bs[0] != backend.Backend(soft2) {
		t.Errorf("backends in force: %v", bs)
	}
	if err := sign(4, "ec"); err != nil { // the same key, now by label ec2
		t.Errorf("with the new backend: %v", err)
	}
	if _, err := c.do(&protocol.Request{Op: protocol.OpRSASignPKCS1, ID: 5, KeyID: f.ids["rsa"], Hash: protocol.HashSHA256, Payload: d}); protocol.CodeOf(err) != protocol.CodeKeyNotFound {
		t.Errorf("a key of the replaced backend: %v, want key_not_found", err)
	}

	// After Shutdown, changes are refused.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.Apply(Update{AllowAllClients: true}); !errors.Is(err, ErrServerClosed) {
		t.Errorf("apply after shutdown: %v", err)
	}
}
