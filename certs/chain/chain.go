// Package chain parses and checks PEM certificate chains, and names the key types
// Tiergate serves: what the L7 tier (certs) and the control plane's model
// (control/model) both read, in a package of its own that imports nothing but the
// standard library, so that every node that links the model (l4d too) links no
// more than this of the L7 tier.
package chain

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

// MaxLen bounds the certificates in one chain.
const MaxLen = 10

// Key types of a leaf's public key.
const (
	KeyRSA     = "rsa"
	KeyECDSA   = "ecdsa"
	KeyEd25519 = "ed25519"
)

// KeyType returns the key type of pub (KeyRSA, KeyECDSA or KeyEd25519), or "" for
// any other.
func KeyType(pub any) string {
	switch pub.(type) {
	case *rsa.PublicKey:
		return KeyRSA
	case *ecdsa.PublicKey:
		return KeyECDSA
	case ed25519.PublicKey:
		return KeyEd25519
	}
	return ""
}

// Parse parses a PEM certificate chain and checks its order: the leaf first,
// then each issuer in turn, every certificate signed by the next one (the root may be
// left out). Text around the PEM blocks and private key blocks are ignored; any other
// block type is an error, as are an empty chain and more than MaxLen
// certificates.
func Parse(data []byte) ([]*x509.Certificate, error) {
	var chain []*x509.Certificate
	for {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		switch {
		case blk.Type == "CERTIFICATE":
		case strings.HasSuffix(blk.Type, "PRIVATE KEY"):
			continue
		default:
			return nil, fmt.Errorf("unexpected PEM block %q in a certificate chain", blk.Type)
		}
		if len(chain) == MaxLen {
			return nil, fmt.Errorf("chain has more than %d certificates", MaxLen)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing certificate %d of the chain: %w", len(chain)+1, err)
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	if err := checkOrder(chain); err != nil {
		return nil, err
	}
	return chain, nil
}

// checkOrder checks that every certificate of chain is signed by the next one.
func checkOrder(chain []*x509.Certificate) error {
	for i := 0; i+1 < len(chain); i++ {
		child, parent := chain[i], chain[i+1]
		err := child.CheckSignatureFrom(parent)
		if err == nil {
			continue
		}
		for k, other := range chain {
			if k != i && k != i+1 && child.CheckSignatureFrom(other) == nil {
				return fmt.Errorf("wrong chain order: certificate %d (%s) is issued by certificate %d (%s), not by the next one; list the leaf first, then each issuer in order",
					i+1, describe(child), k+1, describe(other))
			}
		}
		if parent.CheckSignatureFrom(child) == nil {
			return fmt.Errorf("wrong chain order: certificate %d (%s) issued certificate %d (%s); list the leaf first, then each issuer in order",
				i+1, describe(child), i+2, describe(parent))
		}
		if !bytes.Equal(child.RawIssuer, parent.RawSubject) {
			return fmt.Errorf("certificate %d (%s) is issued by %q, but certificate %d is %s: list the leaf first, then each issuer in order",
				i+1, describe(child), child.Issuer.String(), i+2, describe(parent))
		}
		return fmt.Errorf("signature of certificate %d (%s) does not verify with its issuer, certificate %d (%s): %w",
			i+1, describe(child), i+2, describe(parent), err)
	}
	return nil
}

// describe names a certificate in error messages.
func describe(c *x509.Certificate) string {
	if s := c.Subject.String(); s != "" {
		return fmt.Sprintf("%q", s)
	}
	return "serial " + c.SerialNumber.String()
}
