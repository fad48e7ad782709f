//go:build tiergate_stdpatch

package stdpatch

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"testing"
	_ "unsafe" // for go:linkname
)

// x25519PublicFromPrivate is the patched crypto/ecdh's fixed-base computation. Linking
// it fails unless the build used the overlay: with the tag, the patch must be there.
//
//go:linkname x25519PublicFromPrivate crypto/ecdh.x25519PublicFromPrivate
func x25519PublicFromPrivate(dst, scalar []byte)

// TestPatchedX25519 checks that the patched computation is the one in use: it gives
// what NewPrivateKey gives, and what the ladder gives.
func TestPatchedX25519(t *testing.T) {
	for range 200 {
		k := make([]byte, 32)
		rand.Read(k)
		got := make([]byte, 32)
		x25519PublicFromPrivate(got, k)
		priv, err := ecdh.X25519().NewPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, priv.PublicKey().Bytes()) {
			t.Fatalf("private key %x: fixed base %x, NewPrivateKey %x", k, got, priv.PublicKey().Bytes())
		}
	}
}

// TestDrainedReadWaits checks the internal/poll patch: in a request-and-answer
// exchange over TCP, a read after a short read waits for readiness before its
// system call, so each message costs its reader one read instead of a read that
// fails with EAGAIN and then the one that finds it (about 4 reads a round with the
// standard library as it is; 2 with the patch).
func TestDrainedReadWaits(t *testing.T) {
	const rounds = 2000
	reads := pingPongReads(t, rounds)
	t.Logf("%.2f read system calls per round (two messages)", reads)
	if reads > 2.6 {
		t.Errorf("%.2f read system calls per round of two messages; want about 2 (one per message)", reads)
	}
}
