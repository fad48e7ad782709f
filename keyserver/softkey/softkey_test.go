package softkey

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

func TestParsePEMFormats(t *testing.T) {
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, edk, _ := ed25519.GenerateKey(rand.Reader)
	pkcs8 := func(k any) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	sec1, _ := x509.MarshalECPrivateKey(ek)
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}})
	cases := []struct {
		name string
		in   []byte
		err  string
	}{
		{"pkcs8 rsa", pkcs8(rk), ""},
		{"pkcs8 ec", pkcs8(ek), ""},
		{"pkcs8 ed25519", pkcs8(edk), ""},
		{"pkcs1", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)}), ""},
		{"sec1", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}), ""},
		{"certificate first", append(cert, pkcs8(ek)...), ""},
		{"encrypted pkcs8", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}), "encrypted PEM keys are not supported"},
		{"legacy encrypted", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: []byte{1}}), "encrypted PEM keys are not supported"},
		{"no key", cert, "no PEM private key found"},
		{"garbage", []byte("hello"), "no PEM private key found"},
		{"bad der", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2}}), "asn1"},
	}
	for _, tc := range cases {
		_, err := ParsePEM(tc.in)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestDirLoadAndImport(t *testing.T) {
	dir := t.TempDir()
	ek, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(ek)
	os.WriteFile(filepath.Join(dir, "a.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, "a.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), 0o600)
	b, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := b.Keys()
	if len(keys) != 1 || keys[0].Label != "a" || keys[0].Type != protocol.KeyECDSA {
		t.Fatalf("loaded %+v", keys)
	}
	want, _ := backend.KeyIDOf(ek.Public())
	if keys[0].ID != want {
		t.Errorf("key ID %s, want %s", keys[0].ID, want)
	}

	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	k, err := b.Import("site", rk)
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256([]byte("x"))
	sig, err := k.Signer.Sign(rand.Reader, d[:], crypto.SHA256)
	if err != nil || rsa.VerifyPKCS1v15(&rk.PublicKey, crypto.SHA256, d[:], sig) != nil {
		t.Fatalf("sign with imported key: %v", err)
	}
	again, err := b.Import("other-name", rk)
	if err != nil || again.ID != k.ID {
		t.Errorf("re-import: %v", err)
	}
	// The import survives a restart.
	b2, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if keys, _ := b2.Keys(); len(keys) != 2 {
		t.Errorf("after restart %d keys, want 2", len(keys))
	}
	for _, bad := range []string{"", "../x", ".hidden", "a/b"} {
		k2, _ := rsa.GenerateKey(rand.Reader, 1024)
		if _, err := b.Import(bad, k2); err == nil {
			t.Errorf("label %q accepted as a file name", bad)
		}
	}
}

func TestBadFiles(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.key")
	os.WriteFile(bad, []byte("junk"), 0o600)
	if _, err := New(Config{Files: []string{bad}}); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad file: %v", err)
	}
	if _, err := New(Config{Files: []string{filepath.Join(dir, "missing.key")}}); err == nil {
		t.Error("missing file accepted")
	}
	if _, err := New(Config{Dir: filepath.Join(dir, "nope")}); err == nil {
		t.Error("missing dir accepted")
	}
}
