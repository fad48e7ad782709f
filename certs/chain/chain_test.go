package chain

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"testing"
)

func TestKeyType(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ed, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		pub  any
		want string
	}{{&ec.PublicKey, KeyECDSA}, {&rk.PublicKey, KeyRSA}, {ed, KeyEd25519}, {"not a key", ""}, {nil, ""}} {
		if got := KeyType(tt.pub); got != tt.want {
			t.Errorf("KeyType(%T) = %q, want %q", tt.pub, got, tt.want)
		}
	}
}

func TestParseNothing(t *testing.T) {
	for _, in := range []string{"", "not PEM", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%q): no error", in)
		}
	}
}
