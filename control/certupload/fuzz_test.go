package certupload

import (
	"bytes"
	"crypto/x509"
	"strings"
	"testing"

	certchain "github.com/tiergate/tiergate/certs/chain"
	"github.com/tiergate/tiergate/control/model"
)

// FuzzCheck runs the parser of uploads (the chain and the key, untrusted bytes from
// the API) on anything: it must not panic, what it accepts must be a chain nodes
// read (certchain.Parse) and the model stores, and no error may quote the key.
func FuzzCheck(f *testing.F) {
	p := testPKI(f)
	k := ecKey(f)
	leaf := p.leaf(f, k, nil)
	key := keyPEM(f, k)
	f.Add(pemOf(leaf, p.inter), key)
	f.Add(pemOf(p.root, leaf, p.inter), key)
	f.Add(pemOf(leaf), key) // no issuer
	f.Add(pemOf(leaf), []byte(nil))
	// No RSA seed: generating an RSA key under the fuzzer's coverage takes minutes.
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), key)
	f.Add(append(pemOf(leaf), key...), key)
	f.Add(pemOf(leaf, p.inter), []byte("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n"))
	f.Fuzz(func(t *testing.T, chain, key []byte) {
		keyCopy := bytes.Clone(key)
		ck, err := Check(chain, key, now)
		if !bytes.Equal(key, keyCopy) {
			t.Fatal("Check changed the key it was given")
		}
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %T %v is not an *Error", err, err)
			}
			for _, line := range strings.Split(string(key), "\n") {
				if len(line) >= 16 && !strings.HasPrefix(line, "-----") && strings.Contains(err.Error(), line) {
					t.Fatalf("the error quotes the key: %v", err)
				}
			}
			return
		}
		defer ck.Wipe()
		parsed, err := certchain.Parse(ck.PEM)
		if err != nil {
			t.Fatalf("accepted chain does not parse as nodes read it: %v", err)
		}
		if len(parsed) != len(ck.Chain) || !parsed[0].Equal(ck.Leaf()) {
			t.Fatal("accepted PEM is not the chain")
		}
		if _, err := x509.ParsePKIXPublicKey(ck.Leaf().RawSubjectPublicKeyInfo); err != nil {
			t.Fatal(err)
		}
		if _, err := model.NewCertificate("fuzz", 1, ck.PEM); err != nil {
			t.Fatalf("accepted chain refused by the model: %v", err)
		}
	})
}
