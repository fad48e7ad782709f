package hsm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/miekg/pkcs11"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testenv"
)

const (
	testTokenLabel = "tiergate-hsm-test"
	// otherTokenLabel is a second token that no shared backend logs in to.
	otherTokenLabel = "tiergate-hsm-other"
	testSOPIN       = "so-pin-1234"
	testUserPIN     = "user-pin-5678"
)

// The token every test uses. SoftHSM reads SOFTHSM2_CONF once, in C_Initialize, so
// the token is made and the variable set before any test loads the module.
var (
	testToken *softhsm.Token
	setupErr  error
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if haveSoftHSM() {
		dir, err := os.MkdirTemp("", "tiergate-hsm-test-")
		if err != nil {
			setupErr = err
		} else {
			defer os.RemoveAll(dir)
			if testToken, setupErr = softhsm.CreateToken(dir, testTokenLabel, testSOPIN, testUserPIN); setupErr == nil {
				_, setupErr = softhsm.CreateToken(dir, otherTokenLabel, testSOPIN, testUserPIN)
			}
			if setupErr == nil {
				setupErr = testToken.Setenv()
			}
		}
	}
	code := m.Run()
	if fx.b != nil {
		if err := fx.b.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing the shared backend:", err)
			code = 1
		}
	}
	return code
}

func haveSoftHSM() bool {
	_, err1 := os.Stat(softhsm.DefaultModule)
	_, err2 := exec.LookPath(softhsm.Util)
	return err1 == nil && err2 == nil
}

// requireToken skips (or, under TIERGATE_REQUIRE_ALL=1, fails) t without SoftHSM2.
func requireToken(t testing.TB) {
	t.Helper()
	testenv.RequireFile(t, softhsm.DefaultModule, "softhsm2")
	testenv.RequireCommand(t, softhsm.Util, "softhsm2")
	if setupErr != nil {
		t.Fatalf("creating the test token: %v", setupErr)
	}
}

func tokenConfig() Config {
	return Config{TokenLabel: testTokenLabel, PIN: testUserPIN}
}

// testKey is a key imported into the test token, with its software original.
type testKey struct {
	name string
	priv crypto.Signer
	key  *backend.Key
}

// fx is the shared backend with one imported key of each supported kind.
var fx struct {
	once sync.Once
	b    *Backend
	keys []testKey
	err  error
}

// fixture returns the shared backend and its keys, importing them on first use.
func fixture(t testing.TB) (*Backend, []testKey) {
	t.Helper()
	requireToken(t)
	fx.once.Do(func() {
		b, err := New(tokenConfig())
		if err != nil {
			fx.err = err
			return
		}
		fx.b = b
		gens := []struct {
			name string
			gen  func() (crypto.Signer, error)
		}{
			{"rsa2048", func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 2048) }},
			{"rsa3072", func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 3072) }},
			{"rsa4096", func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 4096) }},
			{"p256", func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }},
			{"p384", func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P384(), rand.Reader) }},
		}
		if b.mechs[ckmEdDSA] {
			gens = append(gens, struct {
				name string
				gen  func() (crypto.Signer, error)
			}{"ed25519", func() (crypto.Signer, error) {
				_, priv, err := ed25519.GenerateKey(rand.Reader)
				return priv, err
			}})
		}
		for _, g := range gens {
			priv, err := g.gen()
			if err != nil {
				fx.err = err
				return
			}
			k, err := b.Import(g.name, priv)
			if err != nil {
				fx.err = err
				return
			}
			fx.keys = append(fx.keys, testKey{name: g.name, priv: priv, key: k})
		}
	})
	if fx.err != nil {
		t.Fatalf("setting up the shared backend: %v", fx.err)
	}
	return fx.b, fx.keys
}

func fixtureKey(t testing.TB, name string) testKey {
	t.Helper()
	_, keys := fixture(t)
	for _, k := range keys {
		if k.name == name {
			return k
		}
	}
	t.Skipf("no %s key on the test token", name)
	return testKey{}
}

// Test hooks into the backend's token state.

// closeAllSessions closes every session the process has on the backend's token, as
// a token reset or another library in the process would.
func (b *Backend) closeAllSessions() error {
	return b.mod.ctx.CloseAllSessions(uint(b.slot.Load()))
}

// keyObject returns the backend's object for k.
func (b *Backend) keyObject(t testing.TB, k *backend.Key) *keyObject {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.byID[k.ID]
	if o == nil {
		t.Fatalf("key %s not in backend", k.ID.Short())
	}
	return o
}

// readAttr reads attribute typ of object h with the login session.
func (b *Backend) readAttr(h pkcs11.ObjectHandle, typ uint) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.attr(b.login, h, typ)
}

// countObjects returns how many objects of class have CKA_ID id.
func (b *Backend) countObjects(t testing.TB, class uint, id []byte) int {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	hs, err := b.findLocked([]*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, class),
		pkcs11.NewAttribute(pkcs11.CKA_ID, id),
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(hs)
}

// destroyObjects destroys every object of class with CKA_ID id.
func (b *Backend) destroyObjects(t testing.TB, class uint, id []byte) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	hs, err := b.findLocked([]*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, class),
		pkcs11.NewAttribute(pkcs11.CKA_ID, id),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if err := b.mod.ctx.DestroyObject(b.login, h); err != nil {
			t.Fatal(err)
		}
	}
}

// setID changes the CKA_ID of every key object with CKA_ID from to to.
func (b *Backend) setID(t testing.TB, from, to []byte) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	hs, err := b.findLocked([]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_ID, from)})
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) == 0 {
		t.Fatalf("no objects with CKA_ID %x", from)
	}
	for _, h := range hs {
		if err := b.mod.ctx.SetAttributeValue(b.login, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_ID, to)}); err != nil {
			t.Fatal(err)
		}
	}
}

func testenvCommand(t testing.TB, name, pkg string) string {
	t.Helper()
	return testenv.RequireCommand(t, name, pkg)
}
