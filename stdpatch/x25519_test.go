package stdpatch

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/hex"
	"testing"
)

// TestX25519 checks X25519 public keys against RFC 7748's vectors and, for random
// private keys, against the Montgomery ladder (ECDH with the base point), whether or
// not the build patched crypto/ecdh.
func TestX25519(t *testing.T) {
	// RFC 7748, section 6.1.
	vectors := []struct{ priv, pub string }{
		{"77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a", "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"},
		{"5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb", "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"},
	}
	for _, v := range vectors {
		priv, err := ecdh.X25519().NewPrivateKey(unhex(t, v.priv))
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(priv.PublicKey().Bytes()); got != v.pub {
			t.Errorf("public key of %s: %s, want %s", v.priv, got, v.pub)
		}
	}
	base, err := ecdh.X25519().NewPublicKey(append([]byte{9}, make([]byte, 31)...))
	if err != nil {
		t.Fatal(err)
	}
	keys := [][]byte{make([]byte, 32), bytes.Repeat([]byte{0xff}, 32)}
	for range 500 {
		k := make([]byte, 32)
		rand.Read(k)
		keys = append(keys, k)
	}
	for _, k := range keys {
		priv, err := ecdh.X25519().NewPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		ladder, err := priv.ECDH(base)
		if err != nil {
			t.Fatal(err)
		}
		if got := priv.PublicKey().Bytes(); !bytes.Equal(got, ladder) {
			t.Fatalf("private key %x: public key %x, the ladder gives %x", k, got, ladder)
		}
	}
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func BenchmarkX25519PublicKey(b *testing.B) {
	k := make([]byte, 32)
	rand.Read(k)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ecdh.X25519().NewPrivateKey(k); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkX25519ECDH(b *testing.B) {
	priv, _ := ecdh.X25519().GenerateKey(rand.Reader)
	peer, _ := ecdh.X25519().GenerateKey(rand.Reader)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := priv.ECDH(peer.PublicKey()); err != nil {
			b.Fatal(err)
		}
	}
}
