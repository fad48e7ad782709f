package client

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/keyserver/softkey"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// TestRealServer runs the client against keyserver.Server with software keys
// (go test -tags realserver).
func TestRealServer(t *testing.T) {
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
	srv, err := keyserver.NewServer(keyserver.Config{
		TLS:      &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.ca.Pool()},
		Backends: []backend.Backend{b},
		Clients:  []keyserver.ClientRule{{Name: "*", Keys: []string{"*"}, Ops: []string{"*"}, Admin: true}},
		Logger:   quietLog,
	})
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
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()

	c, err := New(Config{Servers: []string{ln.Addr().String()}, TLS: p.clientTLS(), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	waitConns(t, c, 0, 2)
	if proto := c.servers[0].slots[0].conn.Load().nc.(*tls.Conn).ConnectionState().NegotiatedProtocol; proto != keyserver.ALPNDeadline {
		t.Errorf("negotiated ALPN %q, want %q", proto, keyserver.ALPNDeadline)
	}
	keys, err := c.ListKeys(ctx)
	if err != nil || len(keys) != 4 {
		t.Fatalf("ListKeys = %d keys, %v", len(keys), err)
	}
	d := sum256(1)
	rk, err := c.Key(ctx, keyID(t, ks.rsa))
	if err != nil {
		t.Fatal(err)
	}
	sig, err := rk.Sign(nil, d, crypto.SHA256)
	if err != nil || rsa.VerifyPKCS1v15(&ks.rsa.PublicKey, crypto.SHA256, d, sig) != nil {
		t.Fatalf("PKCS1: %v", err)
	}
	sig, err = rk.Sign(nil, d, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256})
	if err != nil || rsa.VerifyPSS(&ks.rsa.PublicKey, crypto.SHA256, d, sig, nil) != nil {
		t.Fatalf("PSS: %v", err)
	}
	secret := make([]byte, 48)
	rand.Read(secret)
	//lint:ignore SA1019 TLS 1.2 RSA key exchange is PKCS #1 v1.5 encryption; it is what keyserverd must decrypt
	ct, _ := rsa.EncryptPKCS1v15(rand.Reader, &ks.rsa.PublicKey, secret)
	//lint:ignore SA1019 TLS 1.2 RSA key exchange is PKCS #1 v1.5 encryption; it is what keyserverd must decrypt
	if pt, err := rk.Decrypt(nil, ct, &rsa.PKCS1v15DecryptOptions{SessionKeyLen: 48}); err != nil || string(pt) != string(secret) {
		t.Fatalf("decrypt: %v", err)
	}
	ek := c.NewKey(keyID(t, ks.p256), ks.p256.Public())
	if sig, err := ek.Sign(nil, d, crypto.SHA256); err != nil || !ecdsa.VerifyASN1(&ks.p256.PublicKey, d, sig) {
		t.Fatalf("ECDSA: %v", err)
	}
	edk := c.NewKey(keyID(t, ks.ed), ks.ed.Public())
	if sig, err := edk.Sign(nil, []byte("m"), crypto.Hash(0)); err != nil || !ed25519.Verify(ks.ed.Public().(ed25519.PublicKey), []byte("m"), sig) {
		t.Fatalf("Ed25519: %v", err)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	pemKey, _ := testpki.KeyPEM(priv)
	if id, err := c.Import(ctx, "new", pemKey); err != nil || id != keyID(t, priv) {
		t.Fatalf("Import = %s, %v", id.Short(), err)
	}
	if _, err := c.NewKey(protocol.KeyID{1}, ks.p256.Public()).Sign(nil, d, crypto.SHA256); err == nil {
		t.Fatal("signing with an unknown key succeeded")
	}
}
