package certupload

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	certchain "github.com/tiergate/tiergate/certs/chain"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/client"
)

var now = time.Now()

// pki is a root, an intermediate under it, and leaves under the intermediate.
type pki struct {
	root, inter       *x509.Certificate
	rootKey, interKey crypto.Signer
}

var (
	pkiOnce sync.Once
	thePKI  *pki
	rsaOnce sync.Once
	rsaKey  *rsa.PrivateKey
)

func testPKI(t testing.TB) *pki {
	pkiOnce.Do(func() {
		p := &pki{rootKey: ecKey(t), interKey: ecKey(t)}
		p.root = issue(t, nil, nil, p.rootKey, func(c *x509.Certificate) {
			c.Subject.CommonName, c.IsCA, c.BasicConstraintsValid = "Test Root", true, true
			c.KeyUsage = x509.KeyUsageCertSign
		})
		p.inter = issue(t, p.root, p.rootKey, p.interKey, func(c *x509.Certificate) {
			c.Subject.CommonName, c.IsCA, c.BasicConstraintsValid = "Test Intermediate", true, true
			c.KeyUsage = x509.KeyUsageCertSign
		})
		thePKI = p
	})
	return thePKI
}

func ecKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func rsa2048(t testing.TB) *rsa.PrivateKey {
	rsaOnce.Do(func() {
		var err error
		if rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			t.Fatal(err)
		}
	})
	return rsaKey
}

// issue makes a certificate for key's public half signed by parent (self-signed
// when parent is nil), valid an hour ago to 90 days on, changed by mod.
func issue(t testing.TB, parent *x509.Certificate, parentKey, key crypto.Signer, mod func(*x509.Certificate)) *x509.Certificate {
	t.Helper()
	sn, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: "www.example.com"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(90 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"www.example.com", "example.com"},
	}
	if mod != nil {
		mod(tmpl)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (p *pki) leaf(t testing.TB, key crypto.Signer, mod func(*x509.Certificate)) *x509.Certificate {
	return issue(t, p.inter, p.interKey, key, mod)
}

func pemOf(cs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range cs {
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

func keyPEM(t testing.TB, k crypto.Signer) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func wantError(t *testing.T, err error, code, field, msg string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v, want an *Error %s at %s", err, code, field)
	}
	if e.Code != code || e.Field != field || !strings.Contains(e.Error(), msg) {
		t.Fatalf("error %q (code %s, field %s), want code %s, field %s, a message with %q", e, e.Code, e.Field, code, field, msg)
	}
}

func TestCheckAccepts(t *testing.T) {
	p := testPKI(t)
	ec := ecKey(t)
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	_ = edPub
	for _, tc := range []struct {
		name    string
		key     crypto.Signer
		keyType string
	}{
		{"ECDSA", ec, certchain.KeyECDSA},
		{"RSA", rsa2048(t), certchain.KeyRSA},
		{"Ed25519", edPriv, certchain.KeyEd25519},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf := p.leaf(t, tc.key, nil)
			ck, err := Check(pemOf(leaf, p.inter), keyPEM(t, tc.key), now)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Wipe()
			if ck.Reordered || len(ck.Chain) != 2 || !ck.Leaf().Equal(leaf) {
				t.Fatalf("reordered %v, chain of %d", ck.Reordered, len(ck.Chain))
			}
			if !bytes.Equal(ck.PEM, pemOf(leaf, p.inter)) {
				t.Errorf("PEM is not the chain given")
			}
			c, err := model.NewCertificate("www", 1, ck.PEM)
			if err != nil {
				t.Fatal(err)
			}
			if c.KeyType != tc.keyType || c.KeyID != ck.KeyID.String() {
				t.Errorf("model: key type %s, ID %s; want %s, %s", c.KeyType, c.KeyID, tc.keyType, ck.KeyID)
			}
			if got, err := parseKey(ck.keyPEM); err != nil || !got.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(tc.key.Public()) {
				t.Errorf("the key to import is not the key given: %v", err)
			}
		})
	}
}

func TestCheckKeyFormats(t *testing.T) {
	p := testPKI(t)
	ec := ecKey(t)
	ecDER, _ := x509.MarshalECPrivateKey(ec)
	rk := rsa2048(t)
	for name, tc := range map[string]struct {
		key   crypto.Signer
		block *pem.Block
	}{
		"SEC 1":  {ec, &pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER}},
		"PKCS 1": {rk, &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)}},
	} {
		leaf := p.leaf(t, tc.key, nil)
		// Text and a certificate around the key are ignored.
		keyFile := append([]byte("key file\n"), pemOf(leaf)...)
		keyFile = append(keyFile, pem.EncodeToMemory(tc.block)...)
		ck, err := Check(pemOf(leaf, p.inter), keyFile, now)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.HasPrefix(ck.keyPEM, []byte("-----BEGIN PRIVATE KEY-----")) {
			t.Errorf("%s: the key is not imported as PKCS #8", name)
		}
		ck.Wipe()
		if ck.keyPEM != nil || ck.signer != nil {
			t.Errorf("%s: Wipe left the key", name)
		}
	}
}

func TestCheckReorders(t *testing.T) {
	p := testPKI(t)
	k := ecKey(t)
	leaf := p.leaf(t, k, nil)
	for _, given := range [][]*x509.Certificate{
		{p.inter, leaf},
		{p.root, p.inter, leaf},
		{p.inter, p.root, leaf},
		{leaf, p.root, p.inter},
	} {
		ck, err := Check(pemOf(given...), keyPEM(t, k), now)
		if err != nil {
			t.Fatal(err)
		}
		if !ck.Reordered || !ck.Leaf().Equal(leaf) || !ck.Chain[1].Equal(p.inter) {
			t.Fatalf("given %d certificates: reordered %v, leaf %v", len(given), ck.Reordered, ck.Leaf().Subject)
		}
		if len(ck.Notes) == 0 || !strings.Contains(ck.Notes[0], "another order") {
			t.Errorf("notes %q do not say the chain was reordered", ck.Notes)
		}
		if _, err := certchain.Parse(ck.PEM); err != nil {
			t.Errorf("the reordered chain does not parse as nodes read it: %v", err)
		}
		if len(given) == 3 && !strings.Contains(strings.Join(ck.Notes, "\n"), "self-signed root") {
			t.Errorf("notes %q do not mention the root", ck.Notes)
		}
	}
	// In order: nothing to say.
	ck, err := Check(pemOf(leaf, p.inter, p.root), keyPEM(t, k), now)
	if err != nil || ck.Reordered {
		t.Fatalf("a chain in order: reordered %v, %v", ck != nil && ck.Reordered, err)
	}
}

func TestCheckRefuses(t *testing.T) {
	p := testPKI(t)
	k := ecKey(t)
	other := ecKey(t)
	leaf := p.leaf(t, k, nil)
	otherCA := issue(t, nil, nil, other, func(c *x509.Certificate) {
		c.Subject.CommonName, c.IsCA, c.BasicConstraintsValid = "Other Root", true, true
	})
	smallRSA, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	notCA := p.leaf(t, other, func(c *x509.Certificate) { c.Subject.CommonName = "not a CA" })
	underNotCA := issue(t, notCA, other, k, nil)
	keyOK := keyPEM(t, k)
	for _, tc := range []struct {
		name              string
		chain, key        []byte
		code, field, want string
	}{
		{"empty chain", nil, keyOK, CodeBadChain, "chain", "no PEM CERTIFICATE"},
		{"garbage certificate", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), keyOK, CodeBadChain, "chain[0]", "parsing the certificate"},
		{"second garbage", append(pemOf(leaf), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")...), keyOK, CodeBadChain, "chain[1]", "parsing"},
		{"key in the chain", append(pemOf(leaf), keyOK...), keyOK, CodeBadChain, "chain", "private key"},
		{"other block", append(pemOf(leaf), pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: []byte{1}})...), keyOK, CodeBadChain, "chain", "X509 CRL"},
		{"duplicate", pemOf(leaf, p.inter, leaf), keyOK, CodeBadChain, "chain[2]", "chain[0] again"},
		{"unrelated certificate", pemOf(leaf, p.inter, otherCA), keyOK, CodeBadChain, "chain[2]", "not in the chain"},
		{"two leaves", pemOf(p.leaf(t, other, nil), p.leaf(t, other, nil)), keyOK, CodeBadChain, "chain", "issue no other"},
		{"issuer not a CA", pemOf(underNotCA, notCA), keyOK, CodeBadChain, "chain[1]", "not a CA"},
		{"mismatched key", pemOf(leaf, p.inter), keyPEM(t, other), CodeKeyMismatch, "key", "not that of the leaf"},
		{"no key", pemOf(leaf, p.inter), []byte("nothing"), CodeInvalid, "key", "no PEM private key"},
		{"bad key", pemOf(leaf, p.inter), []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), CodeInvalid, "key", "PRIVATE KEY"},
		{"encrypted key", pemOf(leaf, p.inter), []byte("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"), CodeInvalid, "key", "encrypted"},
		{"expired leaf", pemOf(p.leaf(t, k, func(c *x509.Certificate) { c.NotAfter = now.Add(-time.Minute) }), p.inter), keyOK, CodeExpired, "chain[0]", "expired at"},
		{"expired leaf given second", pemOf(p.inter, p.leaf(t, k, func(c *x509.Certificate) { c.NotAfter = now.Add(-time.Minute) })), keyOK, CodeExpired, "chain[1]", "expired at"},
		{"not yet valid", pemOf(p.leaf(t, k, func(c *x509.Certificate) { c.NotBefore = now.Add(time.Hour) }), p.inter), keyOK, CodeExpired, "chain[0]", "not valid before"},
		{"no names", pemOf(p.leaf(t, k, func(c *x509.Certificate) { c.Subject.CommonName, c.DNSNames = "", nil }), p.inter), keyOK, CodeBadChain, "chain[0]", "names no server"},
		{"client only", pemOf(p.leaf(t, k, func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} }), p.inter), keyOK, CodeBadChain, "chain[0]", "serverAuth"},
		{"small RSA", pemOf(p.leaf(t, smallRSA, nil), p.inter), keyPEM(t, smallRSA), CodeBadChain, "chain[0]", "1024 bits"},
		{"P-224", pemOf(p.leaf(t, p224, nil), p.inter), keyPEM(t, p224), CodeBadChain, "chain[0]", "P-224"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ck, err := Check(tc.chain, tc.key, now)
			if err == nil {
				ck.Wipe()
			}
			wantError(t, err, tc.code, tc.field, tc.want)
		})
	}
}

func TestCheckExpiringSoonNoted(t *testing.T) {
	p := testPKI(t)
	k := ecKey(t)
	leaf := p.leaf(t, k, func(c *x509.Certificate) { c.NotAfter = now.Add(10*24*time.Hour + time.Hour) })
	ck, err := Check(pemOf(leaf, p.inter), keyPEM(t, k), now)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Wipe()
	if !strings.Contains(strings.Join(ck.Notes, "\n"), "expires in 10 days") {
		t.Errorf("notes %q", ck.Notes)
	}
}

// TestImportTimeouts: an upload's keyserver clients wait DefaultImportTimeout
// unless the section says otherwise, not a handshake signature's 1s.
func TestImportTimeouts(t *testing.T) {
	got := importConfig(client.Config{Servers: []string{"127.0.0.1:1"}})
	if got.RequestTimeout != DefaultImportTimeout || got.Timeout != DefaultImportTimeout {
		t.Fatalf("defaults %v/%v, want %v", got.RequestTimeout, got.Timeout, DefaultImportTimeout)
	}
	set := importConfig(client.Config{RequestTimeout: config.Duration(time.Second), Timeout: config.Duration(2 * time.Second)})
	if set.RequestTimeout != config.Duration(time.Second) || set.Timeout != config.Duration(2*time.Second) {
		t.Fatalf("given timeouts replaced: %v/%v", set.RequestTimeout, set.Timeout)
	}
}
