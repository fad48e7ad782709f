package certs

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

// ParseChain parses a PEM certificate chain and checks its order: the leaf first,
// then each issuer in turn, every certificate signed by the next one (the root may be
// left out). Text around the PEM blocks and private key blocks are ignored; any other
// block type is an error, as are an empty chain and more than MaxChainLen
// certificates.
func ParseChain(data []byte) ([]*x509.Certificate, error) {
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
		if len(chain) == MaxChainLen {
			return nil, fmt.Errorf("chain has more than %d certificates", MaxChainLen)
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
