package hsm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/pkcs11"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

func TestImportedKeysAreProtected(t *testing.T) {
	b, keys := fixture(t)
	for _, tk := range keys {
		t.Run(tk.name, func(t *testing.T) {
			wantID, err := backend.KeyIDOf(tk.priv.Public())
			if err != nil {
				t.Fatal(err)
			}
			if tk.key.ID != wantID || tk.key.Label != tk.name {
				t.Errorf("key ID %s label %q, want %s %q", tk.key.ID, tk.key.Label, wantID, tk.name)
			}
			o := b.keyObject(t, tk.key)
			if !bytes.Equal(o.ckaID, wantID[:]) {
				t.Errorf("CKA_ID %x, want the key ID %x", o.ckaID, wantID[:])
			}
			h := o.handle.Load().h
			for _, a := range []struct {
				typ  uint
				name string
				want byte
			}{
				{pkcs11.CKA_EXTRACTABLE, "CKA_EXTRACTABLE", 0},
				{pkcs11.CKA_SENSITIVE, "CKA_SENSITIVE", 1},
				{pkcs11.CKA_PRIVATE, "CKA_PRIVATE", 1},
				{pkcs11.CKA_TOKEN, "CKA_TOKEN", 1},
				{pkcs11.CKA_SIGN, "CKA_SIGN", 1},
			} {
				v, err := b.readAttr(h, a.typ)
				if err != nil {
					t.Errorf("reading %s: %v", a.name, err)
					continue
				}
				if len(v) != 1 || v[0] != a.want {
					t.Errorf("%s = %x, want %d", a.name, v, a.want)
				}
			}
			secret := uint(pkcs11.CKA_VALUE)
			if o.kind == kindRSA {
				secret = pkcs11.CKA_PRIVATE_EXPONENT
				for _, typ := range []uint{pkcs11.CKA_PRIME_1, pkcs11.CKA_PRIME_2, pkcs11.CKA_COEFFICIENT} {
					if v, err := b.readAttr(h, typ); err == nil {
						t.Errorf("read RSA private component 0x%x of a sensitive key: %x", typ, v)
					}
				}
				if v, err := b.readAttr(h, pkcs11.CKA_DECRYPT); err != nil || len(v) != 1 || v[0] != 1 {
					t.Errorf("CKA_DECRYPT = %x, %v; want true", v, err)
				}
			}
			v, err := b.readAttr(h, secret)
			if err == nil {
				t.Fatalf("read the private key value of a sensitive key: %x", v)
			}
			if !isRV(err, pkcs11.CKR_ATTRIBUTE_SENSITIVE) {
				t.Errorf("reading the private value: %v, want CKR_ATTRIBUTE_SENSITIVE", err)
			}
			if n := b.countObjects(t, pkcs11.CKO_PRIVATE_KEY, wantID[:]); n != 1 {
				t.Errorf("%d private key objects with the key's ID, want 1", n)
			}
			if n := b.countObjects(t, pkcs11.CKO_PUBLIC_KEY, wantID[:]); n != 1 {
				t.Errorf("%d public key objects with the key's ID, want 1", n)
			}
		})
	}
}

func TestSignAndVerify(t *testing.T) {
	_, keys := fixture(t)
	for _, tk := range keys {
		t.Run(tk.name, func(t *testing.T) {
			signAllWays(t, tk)
		})
	}
}

// signAllWays signs with every scheme the key supports and verifies in software.
func signAllWays(t *testing.T, tk testKey) {
	t.Helper()
	msg := []byte("tiergate " + tk.name)
	signer := tk.key.Signer
	switch pub := tk.key.Public.(type) {
	case *rsa.PublicKey:
		for _, h := range []crypto.Hash{crypto.SHA256, crypto.SHA384, crypto.SHA512} {
			d := digest(h, msg)
			sig, err := signer.Sign(rand.Reader, d, h)
			if err != nil {
				t.Fatalf("PKCS #1 v1.5 %v: %v", h, err)
			}
			if err := rsa.VerifyPKCS1v15(pub, h, d, sig); err != nil {
				t.Errorf("PKCS #1 v1.5 %v: %v", h, err)
			}
			for _, sl := range []int{rsa.PSSSaltLengthEqualsHash, rsa.PSSSaltLengthAuto, h.Size()} {
				opts := &rsa.PSSOptions{Hash: h, SaltLength: sl}
				sig, err := signer.Sign(rand.Reader, d, opts)
				if err != nil {
					t.Fatalf("PSS %v salt %d: %v", h, sl, err)
				}
				if err := rsa.VerifyPSS(pub, h, d, sig, &rsa.PSSOptions{Hash: h, SaltLength: rsa.PSSSaltLengthEqualsHash}); err != nil {
					t.Errorf("PSS %v salt %d: %v", h, sl, err)
				}
			}
		}
		dec, ok := signer.(crypto.Decrypter)
		if !ok {
			t.Fatal("RSA key is not a crypto.Decrypter")
		}
		secret := []byte("pre-master secret, 48 bytes of it in real TLS..")
		//lint:ignore SA1019 TLS 1.2 RSA key exchange is PKCS #1 v1.5 encryption; it is what keyserverd must decrypt
		ct, err := rsa.EncryptPKCS1v15(rand.Reader, pub, secret)
		if err != nil {
			t.Fatal(err)
		}
		pt, err := dec.Decrypt(rand.Reader, ct, nil)
		if err != nil {
			t.Fatalf("decrypting: %v", err)
		}
		if !bytes.Equal(pt, secret) {
			t.Errorf("decrypted %q, want %q", pt, secret)
		}
		if _, err := dec.Decrypt(rand.Reader, ct[1:], nil); err == nil {
			t.Error("decrypting a short ciphertext succeeded")
		}
	case *ecdsa.PublicKey:
		if _, ok := signer.(crypto.Decrypter); ok {
			t.Error("ECDSA key is a crypto.Decrypter")
		}
		for _, h := range []crypto.Hash{crypto.SHA256, crypto.SHA384} {
			for range 8 { // r and s with and without their high bit set
				d := digest(h, msg)
				sig, err := signer.Sign(rand.Reader, d, h)
				if err != nil {
					t.Fatalf("ECDSA %v: %v", h, err)
				}
				if !ecdsa.VerifyASN1(pub, d, sig) {
					t.Fatalf("ECDSA %v: signature %x does not verify", h, sig)
				}
			}
		}
	case ed25519.PublicKey:
		sig, err := signer.Sign(rand.Reader, msg, crypto.Hash(0))
		if err != nil {
			t.Fatalf("Ed25519: %v", err)
		}
		if !ed25519.Verify(pub, msg, sig) {
			t.Errorf("Ed25519 signature %x does not verify", sig)
		}
		sig, err = signer.Sign(rand.Reader, msg, &ed25519.Options{})
		if err != nil || !ed25519.Verify(pub, msg, sig) {
			t.Errorf("Ed25519 with empty options: %v", err)
		}
	default:
		t.Fatalf("unexpected public key %T", pub)
	}
}

func digest(h crypto.Hash, msg []byte) []byte {
	hh := h.New()
	hh.Write(msg)
	return hh.Sum(nil)
}

func TestSignRejectsBadInput(t *testing.T) {
	rsaKey := fixtureKey(t, "rsa2048").key.Signer
	ecKey := fixtureKey(t, "p256").key.Signer
	sha1 := make([]byte, 20)
	d256 := make([]byte, 32)
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"rsa sha1", func() error { _, err := rsaKey.Sign(nil, sha1, crypto.SHA1); return err }, "unsupported hash SHA-1"},
		{"rsa raw", func() error { _, err := rsaKey.Sign(nil, d256, crypto.Hash(0)); return err }, "unsupported hash"},
		{"rsa short digest", func() error { _, err := rsaKey.Sign(nil, sha1, crypto.SHA256); return err }, "digest is 20 bytes"},
		{"pss sha1", func() error {
			_, err := rsaKey.Sign(nil, sha1, &rsa.PSSOptions{Hash: crypto.SHA1})
			return err
		}, "unsupported hash SHA-1"},
		{"pss bad salt", func() error {
			_, err := rsaKey.Sign(nil, d256, &rsa.PSSOptions{Hash: crypto.SHA256, SaltLength: -7})
			return err
		}, "invalid salt length"},
		{"ecdsa short digest", func() error { _, err := ecKey.Sign(nil, sha1, crypto.SHA256); return err }, "digest is 20 bytes"},
	} {
		err := tc.err()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	if ed, ok := tryFixtureKey(t, "ed25519"); ok {
		if _, err := ed.key.Signer.Sign(nil, d256, crypto.SHA256); err == nil || !strings.Contains(err.Error(), "Ed25519ph") {
			t.Errorf("Ed25519ph: err = %v", err)
		}
		if _, err := ed.key.Signer.Sign(nil, d256, &ed25519.Options{Context: "x"}); err == nil || !strings.Contains(err.Error(), "Ed25519ctx") {
			t.Errorf("Ed25519ctx: err = %v", err)
		}
	}
}

func tryFixtureKey(t *testing.T, name string) (testKey, bool) {
	_, keys := fixture(t)
	for _, k := range keys {
		if k.name == name {
			return k, true
		}
	}
	return testKey{}, false
}

func TestEd25519Support(t *testing.T) {
	b, _ := fixture(t)
	if !b.mechs[ckmEdDSA] {
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		_, err := b.Import("ed", priv)
		var me *MechanismError
		if !errors.As(err, &me) || !errors.Is(err, backend.ErrUnsupportedKey) {
			t.Fatalf("importing Ed25519 into a token without CKM_EDDSA: %v, want a *MechanismError", err)
		}
		t.Skip("token lacks CKM_EDDSA")
	}
	if _, ok := tryFixtureKey(t, "ed25519"); !ok {
		t.Fatal("token supports CKM_EDDSA but no Ed25519 key was imported")
	}
}

func TestImportIsIdempotent(t *testing.T) {
	b, keys := fixture(t)
	for _, tk := range keys {
		k, err := b.Import("other-label", tk.priv)
		if err != nil {
			t.Fatalf("%s: %v", tk.name, err)
		}
		if k != tk.key {
			t.Errorf("%s: re-import returned a new key %s", tk.name, k.ID.Short())
		}
	}
	// A second backend that has not loaded the key finds it on the token.
	rsa2048 := fixtureKey(t, "rsa2048")
	p256 := fixtureKey(t, "p256")
	cfg := tokenConfig()
	cfg.Keys = []KeySpec{{Label: "p256"}}
	b2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	k, err := b2.Import("again", rsa2048.priv)
	if err != nil {
		t.Fatal(err)
	}
	if k.ID != rsa2048.key.ID || k.Label != "rsa2048" {
		t.Errorf("re-import into a second backend: key %s %q, want %s %q", k.ID.Short(), k.Label, rsa2048.key.ID.Short(), "rsa2048")
	}
	if n := b.countObjects(t, pkcs11.CKO_PRIVATE_KEY, k.ID[:]); n != 1 {
		t.Errorf("%d private objects after re-import, want 1", n)
	}
	if n := b.countObjects(t, pkcs11.CKO_PUBLIC_KEY, k.ID[:]); n != 1 {
		t.Errorf("%d public objects after re-import, want 1", n)
	}
	ks, _ := b2.Keys()
	if len(ks) != 2 || ks[0].ID != p256.key.ID || ks[1].ID != rsa2048.key.ID {
		t.Errorf("second backend serves %d keys after the import, want p256 and rsa2048", len(ks))
	}
	signAllWays(t, testKey{name: "reimported", priv: rsa2048.priv, key: k})
}

func TestImportRejects(t *testing.T) {
	b, _ := fixture(t)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, priv := range []crypto.PrivateKey{small, p521, "not a key"} {
		if _, err := b.Import("bad", priv); !errors.Is(err, backend.ErrUnsupportedKey) {
			t.Errorf("Import(%T): err = %v, want ErrUnsupportedKey", priv, err)
		}
	}
}

func TestImportThenUseWithoutReopen(t *testing.T) {
	b, _ := fixture(t)
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	finds := b.finds.Load()
	k, err := b.Import("fresh-p256", priv)
	if err != nil {
		t.Fatal(err)
	}
	if b.finds.Load() == finds {
		t.Error("Import did not look for the key on the token first")
	}
	ks, _ := b.Keys()
	found := false
	for _, x := range ks {
		found = found || x == k
	}
	if !found {
		t.Error("imported key not in Keys()")
	}
	signAllWays(t, testKey{name: "fresh-p256", priv: priv, key: k})
}

func TestSecondBackendFindsKeys(t *testing.T) {
	_, keys := fixture(t)
	byName := map[string]testKey{}
	for _, k := range keys {
		byName[k.name] = k
	}
	rsaKey, ecKey := byName["rsa3072"], byName["p384"]
	idURI := func(id protocol.KeyID) string {
		var sb strings.Builder
		for _, c := range id {
			fmt.Fprintf(&sb, "%%%02x", c)
		}
		return sb.String()
	}
	pinFile := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(pinFile, []byte(testUserPIN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []testKey // nil: at least every fixture key
	}{
		{"all", tokenConfig(), nil},
		{"by id", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{
			{ID: rsaKey.key.ID.String()}, {ID: ecKey.key.ID.String()},
		}}, []testKey{rsaKey, ecKey}},
		{"by label", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{
			{Label: "p384"}, {Label: "rsa3072"},
		}}, []testKey{ecKey, rsaKey}},
		{"by object URI", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{
			{URI: "pkcs11:token=" + testTokenLabel + ";object=rsa3072;type=private"},
		}}, []testKey{rsaKey}},
		{"by id URI, token from the URI", Config{PIN: testUserPIN, Keys: []KeySpec{
			{URI: "pkcs11:token=" + testTokenLabel + ";id=" + idURI(ecKey.key.ID)},
		}}, []testKey{ecKey}},
		{"token URI with module and pin-source", Config{
			URI: "pkcs11:token=" + testTokenLabel + "?module-path=" + DefaultModule +
				"&pin-source=file:" + url.PathEscape(pinFile),
			Keys: []KeySpec{{Label: "rsa3072"}},
		}, []testKey{rsaKey}},
		{"module-name and serial", Config{
			URI:     "pkcs11:serial=" + testToken.Serial + "?module-name=softhsm2",
			PINFile: pinFile,
			Keys:    []KeySpec{{URI: "pkcs11:object=p384"}},
		}, []testKey{ecKey}},
		{"pin from env", Config{TokenSerial: testToken.Serial, PINEnv: "TIERGATE_TEST_HSM_PIN", Keys: []KeySpec{{Label: "p384"}}}, []testKey{ecKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TIERGATE_TEST_HSM_PIN", testUserPIN)
			b, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := b.Close(); err != nil {
					t.Error(err)
				}
			}()
			ks, err := b.Keys()
			if err != nil {
				t.Fatal(err)
			}
			got := map[protocol.KeyID]*backend.Key{}
			for _, k := range ks {
				got[k.ID] = k
			}
			want := tc.want
			if want == nil {
				want = keys
			} else if len(ks) != len(want) {
				t.Errorf("got %d keys, want %d", len(ks), len(want))
			}
			for i, w := range want {
				k := got[w.key.ID]
				if k == nil {
					t.Errorf("key %s (%s) not found", w.name, w.key.ID.Short())
					continue
				}
				if tc.want != nil && ks[i].ID != w.key.ID {
					t.Errorf("keys[%d] = %q, want %q", i, ks[i].Label, w.name)
				}
				if k.Label != w.name || k.Type != w.key.Type {
					t.Errorf("key %s: label %q type %v, want %q %v", k.ID.Short(), k.Label, k.Type, w.name, w.key.Type)
				}
				signAllWays(t, testKey{name: w.name, priv: w.priv, key: k})
			}
		})
	}
}

func TestBadConfig(t *testing.T) {
	fixture(t)
	emptyPIN := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(emptyPIN, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	slot := uint(4242)
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"no such token", Config{TokenLabel: "no-such-token", PIN: "x"}, []string{`label "no-such-token"`, testTokenLabel}},
		{"no such serial", Config{TokenSerial: "0000", PIN: "x"}, []string{`serial "0000"`}},
		{"no such slot", Config{Slot: &slot, PIN: "x"}, []string{"slot 4242"}},
		{"no token selected", Config{PIN: "x"}, []string{"no token selected"}},
		{"two selectors", Config{TokenLabel: "a", TokenSerial: "b"}, []string{"mutually exclusive"}},
		{"wrong PIN", Config{TokenLabel: testTokenLabel, PIN: "wrong-pin"}, []string{"wrong PIN", testTokenLabel}},
		{"wrong PIN, first login", Config{TokenLabel: otherTokenLabel, PIN: "wrong-pin"}, []string{"wrong PIN", otherTokenLabel, "CKR_PIN_INCORRECT"}},
		{"missing PIN", Config{TokenLabel: testTokenLabel}, []string{"needs a login", testTokenLabel, "no user PIN"}},
		{"empty PIN file", Config{TokenLabel: testTokenLabel, PINFile: emptyPIN}, []string{"PIN file", "empty"}},
		{"missing PIN file", Config{TokenLabel: testTokenLabel, PINFile: "/nonexistent/pin"}, []string{"/nonexistent/pin"}},
		{"unset PIN env", Config{TokenLabel: testTokenLabel, PINEnv: "TIERGATE_NO_SUCH_VAR"}, []string{"TIERGATE_NO_SUCH_VAR", "not set"}},
		{"two PINs", Config{TokenLabel: testTokenLabel, PIN: "a", PINEnv: "B"}, []string{"mutually exclusive"}},
		{"unknown key label", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{{Label: "no-such-key"}}}, []string{`label "no-such-key"`, testTokenLabel}},
		{"unknown key id", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{{ID: "abcdef"}}}, []string{"id abcdef"}},
		{"bad key id", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{{ID: "xyz"}}}, []string{`keys[0].id: "xyz" is not hex`}},
		{"key spec with two fields", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{{ID: "ab", Label: "x"}}}, []string{"keys[0]", "exactly one"}},
		{"public key URI", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{{URI: "pkcs11:object=p256;type=public"}}}, []string{"type=public"}},
		{"key URI on another token", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{{URI: "pkcs11:token=other;object=p256"}}}, []string{"another token"}},
		{"bad URI", Config{URI: "pkcs11:tokn=x", PIN: "x"}, []string{`unknown path attribute "tokn"`}},
		{"program pin-source", Config{URI: "pkcs11:token=" + testTokenLabel + "?pin-source=%7C/bin/echo"}, []string{"running a program"}},
		{"no module", Config{Module: "/nonexistent/libpkcs11.so", TokenLabel: "x", PIN: "x"}, []string{"/nonexistent/libpkcs11.so"}},
		{"not a module", Config{Module: "/etc/passwd", TokenLabel: "x", PIN: "x"}, []string{"/etc/passwd", "not a loadable"}},
		{"conflicting module", Config{Module: "/etc/hostname", URI: "pkcs11:token=x?module-path=" + DefaultModule, PIN: "x"}, []string{"conflicts"}},
		{"negative sessions", Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Sessions: -1}, []string{"sessions: -1: must not be negative"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.cfg)
			if err == nil {
				b.Close()
				t.Fatal("New succeeded")
			}
			t.Log(err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestSessionRecovery(t *testing.T) {
	fixture(t)
	tk := fixtureKey(t, "rsa2048")
	cfg := tokenConfig()
	cfg.Keys = []KeySpec{{ID: tk.key.ID.String()}}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ks, _ := b.Keys()
	k := ks[0]
	d := sha256.Sum256([]byte("recovery"))
	sign := func() error {
		sig, err := k.Signer.Sign(nil, d[:], crypto.SHA256)
		if err != nil {
			return err
		}
		return rsa.VerifyPKCS1v15(k.Public.(*rsa.PublicKey), crypto.SHA256, d[:], sig)
	}
	if err := sign(); err != nil {
		t.Fatal(err)
	}
	if n := b.Recoveries(); n != 0 {
		t.Fatalf("%d recoveries before any failure", n)
	}

	// Every session of the process on the token closes, which also logs it out.
	if err := b.closeAllSessions(); err != nil {
		t.Fatal(err)
	}
	logins := b.logins.Load()
	if err := sign(); err != nil {
		t.Fatalf("signing after C_CloseAllSessions: %v", err)
	}
	if b.Recoveries() == 0 {
		t.Error("Recoveries() did not increase")
	}
	if b.logins.Load() != logins+1 {
		t.Errorf("%d logins during recovery, want 1", b.logins.Load()-logins)
	}

	// Again, with every pooled session stale and many operations failing at once:
	// the login is recovered once and every operation succeeds.
	if err := b.closeAllSessions(); err != nil {
		t.Fatal(err)
	}
	logins = b.logins.Load()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			if err := sign(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent sign after C_CloseAllSessions: %v", err)
	}
	if n := b.logins.Load() - logins; n != 1 {
		t.Errorf("%d logins while recovering concurrently, want 1", n)
	}

	// Logged out while the sessions stay open.
	b.mu.Lock()
	err = b.mod.ctx.Logout(b.login)
	b.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	rec := b.Recoveries()
	if err := sign(); err != nil {
		t.Fatalf("signing after C_Logout: %v", err)
	}
	if b.Recoveries() == rec {
		t.Error("Recoveries() did not increase after C_Logout")
	}

	// A stale object handle: the key is found again.
	o := b.keyObject(t, k)
	good := o.handle.Load()
	o.handle.Store(&objHandle{h: good.h + 1000, epoch: good.epoch})
	rec = b.Recoveries()
	finds := b.finds.Load()
	if err := sign(); err != nil {
		t.Fatalf("signing with a stale handle: %v", err)
	}
	if b.Recoveries() == rec || b.finds.Load() == finds {
		t.Error("a stale handle was not recovered by finding the key again")
	}
	if h := o.handle.Load().h; h != good.h {
		t.Errorf("handle after recovery = %d, want %d", h, good.h)
	}

	// The shared backend saw its sessions closed too, and recovers as well.
	signAllWays(t, fixtureKey(t, "p256"))
}

func TestNoSearchOrLoginPerOperation(t *testing.T) {
	b, keys := fixture(t)
	for _, tk := range keys {
		signAllWays(t, tk) // recover first if an earlier test reset the token
	}
	finds, logins := b.finds.Load(), b.logins.Load()
	for _, tk := range keys {
		signAllWays(t, tk)
	}
	if n := b.finds.Load() - finds; n != 0 {
		t.Errorf("%d C_FindObjectsInit calls during operations, want 0", n)
	}
	if n := b.logins.Load() - logins; n != 0 {
		t.Errorf("%d C_Login calls during operations, want 0", n)
	}
}

func TestConcurrentSign(t *testing.T) {
	_, keys := fixture(t)
	const goroutines, each = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		tk := keys[g%len(keys)]
		if strings.HasPrefix(tk.name, "rsa") && tk.name != "rsa2048" {
			tk = keys[0] // keep the run short: RSA-3072/4096 are slow in SoftHSM
		}
		wg.Go(func() {
			for i := range each {
				msg := fmt.Appendf(nil, "goroutine %d sign %d", g, i)
				if err := signOnce(tk.key, msg); err != nil {
					errs <- fmt.Errorf("%s: %w", tk.name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// signOnce signs msg with the key's default scheme and verifies the signature.
func signOnce(k *backend.Key, msg []byte) error {
	d := sha256.Sum256(msg)
	switch pub := k.Public.(type) {
	case *rsa.PublicKey:
		sig, err := k.Signer.Sign(nil, d[:], &rsa.PSSOptions{Hash: crypto.SHA256, SaltLength: rsa.PSSSaltLengthEqualsHash})
		if err != nil {
			return err
		}
		return rsa.VerifyPSS(pub, crypto.SHA256, d[:], sig, nil)
	case *ecdsa.PublicKey:
		sig, err := k.Signer.Sign(nil, d[:], crypto.SHA256)
		if err != nil {
			return err
		}
		if !ecdsa.VerifyASN1(pub, d[:], sig) {
			return errors.New("ECDSA signature does not verify")
		}
	case ed25519.PublicKey:
		sig, err := k.Signer.Sign(nil, msg, crypto.Hash(0))
		if err != nil {
			return err
		}
		if !ed25519.Verify(pub, msg, sig) {
			return errors.New("Ed25519 signature does not verify")
		}
	}
	return nil
}

func TestModuleSharedAndLoginKept(t *testing.T) {
	b, _ := fixture(t)
	tk := fixtureKey(t, "p256")
	b2, err := New(tokenConfig())
	if err != nil {
		t.Fatal(err)
	}
	if b2.mod != b.mod {
		t.Error("two backends on one module initialized it twice")
	}
	modules.mu.Lock()
	refs := b.mod.refs
	modules.mu.Unlock()
	if refs < 2 {
		t.Errorf("module refs = %d with two backends open", refs)
	}
	if err := signOnce(tk.key, []byte("before")); err != nil {
		t.Fatal(err)
	}
	rec := b.Recoveries()
	if err := b2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b2.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// Closing b2 must not have logged b out.
	if err := signOnce(tk.key, []byte("after")); err != nil {
		t.Fatal(err)
	}
	if b.Recoveries() != rec {
		t.Error("closing a second backend logged the first one out")
	}
	modules.mu.Lock()
	if b.mod.refs != refs-1 {
		t.Errorf("module refs = %d after Close, want %d", b.mod.refs, refs-1)
	}
	modules.mu.Unlock()
}

func TestClosedBackend(t *testing.T) {
	fixture(t)
	b, err := New(Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{{Label: "p256"}}, Sessions: 2})
	if err != nil {
		t.Fatal(err)
	}
	ks, _ := b.Keys()
	if len(ks) != 1 {
		t.Fatalf("%d keys, want 1", len(ks))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256(nil)
	if _, err := ks[0].Signer.Sign(nil, d[:], crypto.SHA256); !errors.Is(err, ErrClosed) {
		t.Errorf("Sign after Close: %v, want ErrClosed", err)
	}
	if _, err := b.Keys(); !errors.Is(err, ErrClosed) {
		t.Errorf("Keys after Close: %v, want ErrClosed", err)
	}
	if _, err := b.Import("x", ed25519.NewKeyFromSeed(make([]byte, 32))); !errors.Is(err, ErrClosed) {
		t.Errorf("Import after Close: %v, want ErrClosed", err)
	}
}

func TestDefaultSessions(t *testing.T) {
	b, _ := fixture(t)
	if b.sessionsMax < 1 || cap(b.pool) != b.sessionsMax {
		t.Errorf("pool of %d sessions (cap %d)", b.sessionsMax, cap(b.pool))
	}
	for _, tc := range []struct {
		max  uint
		want func(int) bool
	}{
		{pkcs11.CK_EFFECTIVELY_INFINITE, func(n int) bool { return n >= 4 }},
		{pkcs11.CK_UNAVAILABLE_INFORMATION, func(n int) bool { return n >= 4 }},
		{3, func(n int) bool { return n == 2 }},
		{1, func(n int) bool { return n == 1 }},
	} {
		if n := defaultSessions(tc.max); !tc.want(n) {
			t.Errorf("defaultSessions(%d) = %d", tc.max, n)
		}
	}
}

func TestKeyIDMatchesSPKI(t *testing.T) {
	_, keys := fixture(t)
	for _, tk := range keys {
		spki, err := x509.MarshalPKIXPublicKey(tk.key.Public)
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(spki); hex.EncodeToString(sum[:]) != tk.key.ID.String() {
			t.Errorf("%s: ID %s is not the SHA-256 of the SPKI", tk.name, tk.key.ID)
		}
	}
}

func BenchmarkSignRSA2048(b *testing.B) {
	tk := fixtureKey(b, "rsa2048")
	d := sha256.Sum256([]byte("benchmark"))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := tk.key.Signer.Sign(nil, d[:], crypto.SHA256); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "signs/s")
}

func TestPublicKeyFallback(t *testing.T) {
	b, _ := fixture(t)
	rsaPriv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecPriv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaLabel, ecLabel := uniqueLabel("no-public-rsa"), uniqueLabel("no-public-ec")
	rk, err := b.Import(rsaLabel, rsaPriv)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := b.Import(ecLabel, ecPriv)
	if err != nil {
		t.Fatal(err)
	}
	b.destroyObjects(t, pkcs11.CKO_PUBLIC_KEY, rk.ID[:])
	b.destroyObjects(t, pkcs11.CKO_PUBLIC_KEY, ek.ID[:])

	// RSA: the modulus and exponent come from the private key object.
	cfg := tokenConfig()
	cfg.Keys = []KeySpec{{Label: rsaLabel}}
	b2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	ks, _ := b2.Keys()
	if len(ks) != 1 || ks[0].ID != rk.ID {
		t.Fatalf("loaded %d keys, want the RSA key %s", len(ks), rk.ID.Short())
	}
	signAllWays(t, testKey{name: rsaLabel, priv: rsaPriv, key: ks[0]})

	// EC: the point is only in the public key object, so the key cannot be served.
	cfg.Keys = []KeySpec{{Label: ecLabel}}
	if b3, err := New(cfg); err == nil {
		b3.Close()
		t.Fatal("loaded an EC key without its public key object")
	} else if !strings.Contains(err.Error(), ecLabel) || !strings.Contains(err.Error(), "EC point") {
		t.Errorf("loading an EC key without public key object: %v", err)
	}
	// With every key selected, it is skipped and the rest still load.
	b4, err := New(tokenConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer b4.Close()
	ks, _ = b4.Keys()
	for _, k := range ks {
		if k.ID == ek.ID {
			t.Error("EC key without public key object served")
		}
	}
	// Importing it again restores the public key object.
	if _, err := b2.Import(ecLabel, ecPriv); err != nil {
		t.Fatal(err)
	}
	if n := b.countObjects(t, pkcs11.CKO_PUBLIC_KEY, ek.ID[:]); n != 1 {
		t.Errorf("%d public key objects after re-import, want 1", n)
	}
	if n := b.countObjects(t, pkcs11.CKO_PRIVATE_KEY, ek.ID[:]); n != 1 {
		t.Errorf("%d private key objects after re-import, want 1", n)
	}
}

func TestImportFindsKeyUnderOtherID(t *testing.T) {
	b, _ := fixture(t)
	priv, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	label := uniqueLabel("renamed")
	k, err := b.Import(label, priv)
	if err != nil {
		t.Fatal(err)
	}
	// Give both objects a short CKA_ID, as keys generated by other tools have, and
	// one that another key pair has as well.
	short := []byte{0x42, 0x42}
	b.setID(t, k.ID[:], short)
	other, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := b.Import(uniqueLabel("same-id"), other)
	if err != nil {
		t.Fatal(err)
	}
	b.setID(t, ok.ID[:], short)

	cfg := tokenConfig()
	cfg.Keys = []KeySpec{{Label: "p256"}}
	b2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	k2, err := b2.Import("renamed-again", priv)
	if err != nil {
		t.Fatal(err)
	}
	if k2.ID != k.ID || k2.Label != label {
		t.Errorf("import found key %s %q, want %s %q", k2.ID.Short(), k2.Label, k.ID.Short(), label)
	}
	if n := b.countObjects(t, pkcs11.CKO_PRIVATE_KEY, k.ID[:]); n != 0 {
		t.Errorf("import wrote %d new private key objects for a key already on the token", n)
	}
	if o := b2.keyObject(t, k2); !bytes.Equal(o.ckaID, short) {
		t.Errorf("CKA_ID %x, want %x", o.ckaID, short)
	}
	signAllWays(t, testKey{name: label, priv: priv, key: k2})
}

func TestKeysMadeByOtherTools(t *testing.T) {
	fixture(t)
	tool := testenvCommand(t, "pkcs11-tool", "opensc")
	run := func(args ...string) {
		t.Helper()
		args = append([]string{"--module", DefaultModule, "--token-label", otherTokenLabel, "--login", "--pin", testUserPIN}, args...)
		cmd := exec.Command(tool, args...)
		cmd.Env = append(os.Environ(), testToken.Env()...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pkcs11-tool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Fresh IDs and labels, so that the test can run repeatedly in one process.
	var ids [4]byte
	rand.Read(ids[:])
	rsaID, ecID := hex.EncodeToString(ids[:2]), hex.EncodeToString(ids[2:])
	rsaLabel, ecLabel := "tool-rsa-"+rsaID, "tool-ec-"+ecID
	run("--keypairgen", "--key-type", "rsa:2048", "--id", rsaID, "--label", rsaLabel)
	run("--keypairgen", "--key-type", "EC:prime256v1", "--id", ecID, "--label", ecLabel)

	b, err := New(Config{TokenLabel: otherTokenLabel, PIN: testUserPIN})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ks, err := b.Keys()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]bool{}
	for _, k := range ks {
		labels[k.Label] = true
		if err := signOnce(k, []byte("made by pkcs11-tool")); err != nil {
			t.Errorf("%s: %v", k.Label, err)
		}
	}
	if !labels[rsaLabel] || !labels[ecLabel] {
		t.Errorf("keys found: %v, want %s and %s", labels, rsaLabel, ecLabel)
	}
	b2, err := New(Config{TokenLabel: otherTokenLabel, PIN: testUserPIN, Keys: []KeySpec{
		{ID: ecID}, {URI: "pkcs11:id=%" + rsaID[:2] + "%" + rsaID[2:]},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if ks, _ := b2.Keys(); len(ks) != 2 || ks[0].Label != ecLabel || ks[1].Label != rsaLabel {
		t.Errorf("selected by CKA_ID: %d keys, want %s and %s", len(ks), ecLabel, rsaLabel)
	}
}

var labelSeq atomic.Uint64

// uniqueLabel returns prefix with a suffix unique in this process, so that tests
// may run repeatedly against the one token.
func uniqueLabel(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, labelSeq.Add(1))
}

func TestResolvePIN(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	crlf := write("crlf", "1234\r\n")
	spaces := write("spaces", " 12 34 \n")
	t.Setenv("TIERGATE_TEST_PIN", "from-env")
	for _, tc := range []struct {
		name string
		cfg  Config
		uris []*URI
		want string
	}{
		{"file crlf", Config{PINFile: crlf}, nil, "1234"},
		{"file keeps spaces", Config{PINFile: spaces}, nil, " 12 34 "},
		{"env", Config{PINEnv: "TIERGATE_TEST_PIN"}, nil, "from-env"},
		{"literal", Config{PIN: "lit"}, nil, "lit"},
		{"config before URI", Config{PIN: "lit"}, []*URI{{PINValue: "uri"}}, "lit"},
		{"pin-source file:", Config{}, []*URI{{}, {PINSource: "file:" + crlf}}, "1234"},
		{"pin-source file:///", Config{}, []*URI{{PINSource: "file://" + crlf}}, "1234"},
		{"pin-source path", Config{}, []*URI{{PINSource: crlf}}, "1234"},
		{"pin-value", Config{}, []*URI{{PINValue: "v"}}, "v"},
	} {
		got, err := resolvePIN(&tc.cfg, tc.uris)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := resolvePIN(&Config{}, nil); !errors.Is(err, ErrNoPIN) {
		t.Errorf("no PIN: %v, want ErrNoPIN", err)
	}
	if _, err := resolvePIN(&Config{}, []*URI{{PINSource: "file://host/etc/pin"}}); err == nil {
		t.Error("remote file pin-source accepted")
	}
}

func TestECDSADER(t *testing.T) {
	type sig struct{ R, S *big.Int }
	for _, tc := range [][2][]byte{
		{{0x01}, {0x02}},
		{{0x00, 0x00, 0x7f}, {0x80}},
		{bytes.Repeat([]byte{0xff}, 48), bytes.Repeat([]byte{0x00}, 48)},
		{append([]byte{0x00}, bytes.Repeat([]byte{0x80}, 31)...), bytes.Repeat([]byte{0x7f}, 32)},
	} {
		want, err := asn1.Marshal(sig{new(big.Int).SetBytes(tc[0]), new(big.Int).SetBytes(tc[1])})
		if err != nil {
			t.Fatal(err)
		}
		if got := ecdsaDER(tc[0], tc[1]); !bytes.Equal(got, want) {
			t.Errorf("ecdsaDER(%x, %x) = %x, want %x", tc[0], tc[1], got, want)
		}
	}
}

// TestSessionWaitBounded: with every operation session taken, a signature under a
// context gives up when the context ends (backend.ErrBusy), without reaching the
// token, and one without a context still waits for a session to come free.
func TestSessionWaitBounded(t *testing.T) {
	fixture(t)
	b, err := New(Config{TokenLabel: testTokenLabel, PIN: testUserPIN, Keys: []KeySpec{{Label: "p256"}}, Sessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ks, _ := b.Keys()
	signer := ks[0].Signer.(backend.ContextSigner)
	d := sha256.Sum256([]byte("busy"))
	held, err := b.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := signer.SignContext(ctx, d[:], crypto.SHA256); !errors.Is(err, backend.ErrBusy) || !strings.Contains(err.Error(), "none of the 1 sessions") {
		t.Errorf("SignContext with no session free: %v, want ErrBusy", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("gave up after %v", took)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ks[0].Signer.Sign(nil, d[:], crypto.SHA256)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Sign without a context did not wait for the session: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	b.release(held)
	if err := <-done; err != nil {
		t.Errorf("Sign once the session came free: %v", err)
	}
}

// TestExtractableKeysRefused: a key already on the token whose value can leave it
// (CKA_EXTRACTABLE true, CKA_SENSITIVE false) is refused when named, skipped when
// every key is listed, and served only with allow_extractable, each time counted.
func TestExtractableKeysRefused(t *testing.T) {
	b, _ := fixture(t)
	label := uniqueLabel("extractable")
	id := []byte(label)
	p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	b.mu.Lock()
	_, _, err := b.mod.ctx.GenerateKeyPair(b.login, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil)},
		[]*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256),
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true), pkcs11.NewAttribute(pkcs11.CKA_ID, id), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		},
		[]*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false),
			pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true), pkcs11.NewAttribute(pkcs11.CKA_ID, id),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		})
	b.mu.Unlock()
	if err != nil {
		t.Fatalf("generating an extractable key: %v", err)
	}
	defer b.destroyObjects(t, pkcs11.CKO_PUBLIC_KEY, id)
	defer b.destroyObjects(t, pkcs11.CKO_PRIVATE_KEY, id)

	cfg := tokenConfig()
	cfg.Keys = []KeySpec{{Label: label}}
	if b2, err := New(cfg); err == nil {
		b2.Close()
		t.Fatal("an extractable key named in keys was loaded")
	} else if !strings.Contains(err.Error(), label) || !strings.Contains(err.Error(), "CKA_EXTRACTABLE true") || !strings.Contains(err.Error(), "allow_extractable") {
		t.Errorf("refusal: %v", err)
	}

	all, err := New(tokenConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	ks, _ := all.Keys()
	for _, k := range ks {
		if k.Label == label {
			t.Error("an extractable key was served when listing every key")
		}
	}
	if refused, served := all.ExtractableKeys(); refused != 1 || served != 0 {
		t.Errorf("listing every key: refused %d, served %d; want 1 and 0", refused, served)
	}

	cfg.AllowExtractable = true
	allowed, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer allowed.Close()
	ks, _ = allowed.Keys()
	if len(ks) != 1 || ks[0].Label != label {
		t.Fatalf("allow_extractable: %d keys", len(ks))
	}
	if err := signOnce(ks[0], []byte("allowed")); err != nil {
		t.Errorf("signing with the allowed key: %v", err)
	}
	if refused, served := allowed.ExtractableKeys(); refused != 0 || served != 1 {
		t.Errorf("allow_extractable: refused %d, served %d; want 0 and 1", refused, served)
	}
}
