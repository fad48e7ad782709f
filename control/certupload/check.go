// Package certupload checks a certificate upload (a PEM chain and its PEM private
// key) and puts the key into every keyserver of the cluster: it is what controld
// does before a certificate is stored (control/api, POST
// /v1/certificates/{name}/versions).
//
// Check parses the chain and the key and refuses, with an *Error naming the field
// ("chain", "chain[1]", "key") and a stable code: a chain that is not one leaf and
// its issuers (bad_chain), a key that is not the leaf's (key_mismatch), a
// certificate not valid now (expired), a leaf with no names, not for servers, or of
// a key type other than RSA (2048 bits or more), ECDSA (P-256, P-384, P-521) or
// Ed25519 (bad_chain). A chain given in another order is put leaf first, each
// certificate followed by its issuer, and the result says so (Reordered, Notes).
// Indexes in fields are those of the chain as given, from 0.
//
// Keyservers then imports the key into each keyserver (keyserver/client's
// import_key), asks each to sign a fresh random nonce with the key ID it answered,
// and verifies every signature with the leaf's public key; a keyserver that fails
// is named (keyserver_failed). The key is held in memory only for that: it is never
// logged, stored or written to a file, and Checked.Wipe zeroes the copies this
// package made.
package certupload

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	certchain "github.com/tiergate/tiergate/certs/chain"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Stable error codes of an upload refused (Error.Code), the API's codes too.
const (
	// CodeBadChain: the chain does not parse, is not one leaf and its issuers, or
	// its leaf may not serve (no names, not for servers, a key type refused).
	CodeBadChain = "bad_chain"
	// CodeKeyMismatch: the private key is not the leaf's.
	CodeKeyMismatch = "key_mismatch"
	// CodeExpired: a certificate of the chain is expired or not yet valid.
	CodeExpired = "expired"
	// CodeInvalid: the private key does not parse.
	CodeInvalid = "invalid"
	// CodeKeyserverFailed: a keyserver could not be reached, refused the import, or
	// its signature did not verify.
	CodeKeyserverFailed = "keyserver_failed"
)

// MinRSABits is the smallest RSA key a leaf may have.
const MinRSABits = 2048

// Error is an upload refused: its code, the field at fault or the keyserver.
type Error struct {
	// Code is one of the Code constants.
	Code string
	// Field names what was refused: "chain", "chain[i]" (the i-th certificate as
	// given, from 0) or "key". Empty for a keyserver's failure.
	Field string
	// Keyserver is the address of the keyserver that failed (CodeKeyserverFailed).
	Keyserver string
	// Err says what is wrong.
	Err error
}

func (e *Error) Error() string {
	switch {
	case e.Keyserver != "":
		return fmt.Sprintf("keyserver %s: %v", e.Keyserver, e.Err)
	case e.Field != "":
		return fmt.Sprintf("%s: %v", e.Field, e.Err)
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(code, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Err: fmt.Errorf(format, args...)}
}

func index(i int) string { return fmt.Sprintf("chain[%d]", i) }

// Checked is an upload Check accepted.
type Checked struct {
	// Chain is the chain in order: the leaf first, then each issuer.
	Chain []*x509.Certificate
	// PEM is Chain as PEM CERTIFICATE blocks, the chain stored.
	PEM []byte
	// Reordered says the chain was given in another order than Chain's.
	Reordered bool
	// Notes tell what the check changed or noticed (a reordered chain, a root
	// kept, an expiry soon).
	Notes []string
	// KeyID is the leaf key's ID at the keyservers.
	KeyID protocol.KeyID

	signer crypto.Signer
	keyPEM []byte // the key as PKCS #8 PEM, for import_key
}

// Leaf returns the leaf certificate.
func (c *Checked) Leaf() *x509.Certificate { return c.Chain[0] }

// Wipe zeroes the copies of the private key Check made (its PEM for the import,
// the parsed key's numbers where they can be reached). The Checked cannot be
// imported after it.
func (c *Checked) Wipe() {
	clear(c.keyPEM)
	c.keyPEM = nil
	wipeKey(c.signer)
	c.signer = nil
}

// Check parses and checks an upload: chainPEM, the certificate chain, and keyPEM,
// the leaf's private key (PKCS #8, PKCS #1 or SEC 1 PEM, not encrypted), at time
// now. The error is an *Error. keyPEM is not kept or modified: the caller zeroes it.
func Check(chainPEM, keyPEM []byte, now time.Time) (*Checked, error) {
	given, err := parseChain(chainPEM)
	if err != nil {
		return nil, err
	}
	signer, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	c := &Checked{signer: signer}
	ok := false
	defer func() {
		if !ok {
			c.Wipe()
		}
	}()
	order, err := orderChain(given, signer.Public())
	if err != nil {
		return nil, err
	}
	for i, gi := range order {
		c.Chain = append(c.Chain, given[gi])
		if gi != i {
			c.Reordered = true
		}
	}
	if c.Reordered {
		c.Notes = append(c.Notes, fmt.Sprintf("the chain was given in another order: stored leaf first, each certificate followed by its issuer (given indexes %s)", fmtOrder(order)))
	}
	leafAt := index(order[0])
	leaf := c.Chain[0]
	if err := checkLeafKey(leaf, leafAt); err != nil {
		return nil, err
	}
	if pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(leaf.PublicKey) {
		return nil, errorf(CodeKeyMismatch, "key", "the private key is not that of the leaf %s (%s): its public key differs", leafAt, describe(leaf))
	}
	for i, cert := range c.Chain {
		at := index(order[i])
		switch {
		case now.Before(cert.NotBefore):
			return nil, errorf(CodeExpired, at, "%s is not valid before %s", describe(cert), cert.NotBefore.UTC().Format(time.RFC3339))
		case now.After(cert.NotAfter):
			return nil, errorf(CodeExpired, at, "%s expired at %s", describe(cert), cert.NotAfter.UTC().Format(time.RFC3339))
		}
		if i > 0 && !(cert.BasicConstraintsValid && cert.IsCA) && cert.Version >= 3 {
			return nil, errorf(CodeBadChain, at, "%s issues %s but is not a CA certificate (basic constraints)", describe(cert), index(order[i-1]))
		}
	}
	if len(leaf.DNSNames) == 0 && len(leaf.IPAddresses) == 0 && leaf.Subject.CommonName == "" {
		return nil, errorf(CodeBadChain, leafAt, "%s names no server: no DNS or IP address SAN and no common name", describe(leaf))
	}
	if len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return nil, errorf(CodeBadChain, leafAt, "%s is not for TLS servers: its extended key usage lacks serverAuth", describe(leaf))
	}
	if leaf.IsCA {
		c.Notes = append(c.Notes, fmt.Sprintf("the leaf %s is a CA certificate", leafAt))
	}
	if last := c.Chain[len(c.Chain)-1]; len(c.Chain) > 1 && bytes.Equal(last.RawIssuer, last.RawSubject) && last.CheckSignatureFrom(last) == nil {
		c.Notes = append(c.Notes, fmt.Sprintf("the chain ends with a self-signed root (%s), which is sent to clients as given; clients trust roots of their own", index(order[len(order)-1])))
	}
	if left := leaf.NotAfter.Sub(now); left < 30*24*time.Hour {
		c.Notes = append(c.Notes, fmt.Sprintf("the leaf expires in %d days (%s)", int(left/(24*time.Hour)), leaf.NotAfter.UTC().Format(time.RFC3339)))
	}
	var buf bytes.Buffer
	for _, cert := range c.Chain {
		pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	}
	c.PEM = buf.Bytes()
	if _, err := certchain.Parse(c.PEM); err != nil { // the check nodes make
		return nil, &Error{Code: CodeBadChain, Field: "chain", Err: err}
	}
	c.KeyID = protocol.KeyIDFromSPKI(leaf.RawSubjectPublicKeyInfo)
	der, err := x509.MarshalPKCS8PrivateKey(signer)
	if err != nil {
		return nil, &Error{Code: CodeInvalid, Field: "key", Err: fmt.Errorf("encoding the key as PKCS #8: %w", err)}
	}
	c.keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	clear(der)
	ok = true
	return c, nil
}

// parseChain returns the certificates of data in the order given.
func parseChain(data []byte) ([]*x509.Certificate, error) {
	var chain []*x509.Certificate
	for {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		switch {
		case blk.Type == "CERTIFICATE":
		case strings.Contains(blk.Type, "PRIVATE KEY"):
			clear(blk.Bytes)
			return nil, errorf(CodeBadChain, "chain", "holds a private key (a %q block): give the key as key, never with the chain", blk.Type)
		default:
			return nil, errorf(CodeBadChain, "chain", "a %q PEM block: the chain holds CERTIFICATE blocks only", blk.Type)
		}
		at := index(len(chain))
		if len(chain) == certchain.MaxLen {
			return nil, errorf(CodeBadChain, at, "the chain has more than %d certificates", certchain.MaxLen)
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, &Error{Code: CodeBadChain, Field: at, Err: fmt.Errorf("parsing the certificate: %w", err)}
		}
		for j, other := range chain {
			if bytes.Equal(other.Raw, cert.Raw) {
				return nil, errorf(CodeBadChain, at, "%s is %s again", describe(cert), index(j))
			}
		}
		chain = append(chain, cert)
	}
	if len(chain) == 0 {
		return nil, errorf(CodeBadChain, "chain", "no PEM CERTIFICATE block")
	}
	return chain, nil
}

// parseKey returns the first private key of data, zeroing the DER it decoded.
func parseKey(data []byte) (crypto.Signer, error) {
	for len(data) > 0 {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		var priv any
		var err error
		switch blk.Type {
		case "PRIVATE KEY":
			priv, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
		case "RSA PRIVATE KEY":
			priv, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
		case "EC PRIVATE KEY":
			priv, err = x509.ParseECPrivateKey(blk.Bytes)
		case "ENCRYPTED PRIVATE KEY":
			err = errors.New("an encrypted key: give it decrypted (it is only sent to the keyservers)")
		default:
			continue
		}
		if _, enc := blk.Headers["Proc-Type"]; enc && err == nil {
			err = errors.New("an encrypted key: give it decrypted (it is only sent to the keyservers)")
		}
		clear(blk.Bytes)
		if err != nil {
			wipeKey(priv)
			return nil, &Error{Code: CodeInvalid, Field: "key", Err: fmt.Errorf("a %q block: %w", blk.Type, err)}
		}
		s, ok := priv.(crypto.Signer)
		if !ok {
			wipeKey(priv)
			return nil, errorf(CodeInvalid, "key", "a %T key: want RSA, ECDSA or Ed25519", priv)
		}
		return s, nil
	}
	return nil, errorf(CodeInvalid, "key", "no PEM private key block (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)")
}

// orderChain returns the indexes of given in chain order: the leaf, then its
// issuer, and so on. The leaf is the one certificate that issues no other; among
// several, the one of key pub.
func orderChain(given []*x509.Certificate, pub crypto.PublicKey) ([]int, error) {
	n := len(given)
	issuer := make([]int, n) // index of the issuer of each, or -1
	issues := make([]bool, n)
	for i, child := range given {
		issuer[i] = -1
		for j, parent := range given {
			if i != j && bytes.Equal(child.RawIssuer, parent.RawSubject) &&
				parent.CheckSignature(child.SignatureAlgorithm, child.RawTBSCertificate, child.Signature) == nil {
				issuer[i] = j
				issues[j] = true
				break
			}
		}
	}
	var leaves []int
	for i := range given {
		if !issues[i] {
			leaves = append(leaves, i)
		}
	}
	leaf := -1
	switch {
	case len(leaves) == 1:
		leaf = leaves[0]
	case len(leaves) == 0:
		return nil, errorf(CodeBadChain, "chain", "every certificate issues another: there is no leaf")
	default:
		for _, i := range leaves {
			if k, ok := given[i].PublicKey.(interface{ Equal(crypto.PublicKey) bool }); ok && k.Equal(pub) {
				leaf = i
			}
		}
		if leaf < 0 {
			names := make([]string, len(leaves))
			for k, i := range leaves {
				names[k] = index(i)
			}
			return nil, errorf(CodeBadChain, "chain", "%s issue no other certificate and none is of the key: give one leaf and its issuers", strings.Join(names, ", "))
		}
	}
	order := []int{leaf}
	seen := map[int]bool{leaf: true}
	for cur := leaf; issuer[cur] >= 0 && !seen[issuer[cur]]; cur = issuer[cur] {
		order = append(order, issuer[cur])
		seen[issuer[cur]] = true
	}
	for i := range given {
		if !seen[i] {
			last := order[len(order)-1]
			why := "issued by none of them"
			if issuer[last] < 0 {
				why = fmt.Sprintf("not the issuer of %s (%s, issued by %q)", index(last), describe(given[last]), given[last].Issuer.String())
			}
			return nil, errorf(CodeBadChain, index(i), "%s is not in the chain of the leaf %s: %s", describe(given[i]), index(leaf), why)
		}
	}
	return order, nil
}

// checkLeafKey refuses a leaf key of a type or size that may not serve.
func checkLeafKey(leaf *x509.Certificate, at string) error {
	switch k := leaf.PublicKey.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < MinRSABits {
			return errorf(CodeBadChain, at, "an RSA key of %d bits: at least %d", k.N.BitLen(), MinRSABits)
		}
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
		default:
			return errorf(CodeBadChain, at, "an ECDSA key on %s: want P-256, P-384 or P-521", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return errorf(CodeBadChain, at, "a %T key: want RSA, ECDSA or Ed25519", leaf.PublicKey)
	}
	return nil
}

// wipeKey zeroes what it can reach of a private key's secret numbers.
func wipeKey(priv any) {
	zero := func(n *big.Int) {
		if n != nil {
			clear(n.Bits())
			n.SetInt64(0)
		}
	}
	switch k := priv.(type) {
	case *rsa.PrivateKey:
		if k == nil {
			return
		}
		zero(k.D)
		for _, p := range k.Primes {
			zero(p)
		}
		zero(k.Precomputed.Dp)
		zero(k.Precomputed.Dq)
		zero(k.Precomputed.Qinv)
	case *ecdsa.PrivateKey:
		if k != nil {
			//lint:ignore SA1019 the key is being dropped: its secret scalar is zeroed, not used (no other field reaches it)
			zero(k.D)
		}
	case ed25519.PrivateKey:
		clear(k)
	}
}

// describe names a certificate in messages.
func describe(c *x509.Certificate) string {
	if s := c.Subject.String(); s != "" {
		return fmt.Sprintf("%q", s)
	}
	return "serial " + c.SerialNumber.String()
}

func fmtOrder(order []int) string {
	s := make([]string, len(order))
	for i, o := range order {
		s[i] = fmt.Sprint(o)
	}
	return strings.Join(s, ", ")
}
