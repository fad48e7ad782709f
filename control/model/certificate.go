package model

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	certchain "github.com/tiergate/tiergate/certs/chain"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
)

// Certificate is one version of a certificate chain, its private key held by the
// keyservers under KeyID: never the key itself. Everything but Name, Version and
// Chain is derived from the chain (NewCertificate fills it in) and kept beside it
// for lists and checks; Validate holds them to the chain.
type Certificate struct {
	// Name identifies the certificate in bindings, lists and metrics. Required.
	Name string `yaml:"name" json:"name"`

	// Version counts the uploads of Name, from 1. Required.
	Version int `yaml:"version" json:"version"`

	// Chain is the PEM certificate chain: the leaf first, then each issuer in order
	// (the root may be left out), as certs/chain.Parse reads it. It holds no private
	// key block. Required.
	Chain string `yaml:"chain" json:"chain"`

	// KeyID names the leaf's private key at the keyservers: the SHA-256 of its
	// SubjectPublicKeyInfo, in 64 hex digits.
	KeyID string `yaml:"key_id" json:"key_id"`

	// KeyType is the leaf's key type: "rsa", "ecdsa" or "ed25519".
	KeyType string `yaml:"key_type" json:"key_type"`

	// SANs are the names the certificate serves, lower case: its DNS and IP address
	// SANs or, when it has neither, its subject's common name.
	SANs []string `yaml:"sans" json:"sans"`

	// NotAfter is the end of the leaf's validity.
	NotAfter time.Time `yaml:"not_after" json:"not_after"`
}

// Kind returns KindCertificate.
func (*Certificate) Kind() string { return KindCertificate }

// ObjectName returns the certificate's name.
func (c *Certificate) ObjectName() string { return c.Name }

// NewCertificate returns version version of the certificate name made of chain, its
// derived fields filled in, or the error of Validate.
func NewCertificate(name string, version int, chain []byte) (*Certificate, error) {
	c := &Certificate{Name: name, Version: version, Chain: string(chain)}
	if leaf, err := certchain.Parse(chain); err == nil {
		c.KeyID, c.KeyType, c.SANs, c.NotAfter = derived(leaf[0])
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// KeyID returns the key ID of leaf's private key at the keyservers: the SHA-256 of
// its SubjectPublicKeyInfo in 64 hex digits, as keyserver/protocol.KeyIDFromSPKI
// (a test holds the two together; the model does not import the keyserver).
func KeyID(leaf *x509.Certificate) string {
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// derived returns the fields of a Certificate that its leaf determines.
func derived(leaf *x509.Certificate) (keyID, keyType string, sans []string, notAfter time.Time) {
	keyID, keyType = KeyID(leaf), certchain.KeyType(leaf.PublicKey)
	add := func(n string) {
		n = strings.ToLower(strings.TrimSuffix(n, "."))
		if n != "" && !slices.Contains(sans, n) {
			sans = append(sans, n)
		}
	}
	for _, n := range leaf.DNSNames {
		add(n)
	}
	for _, ip := range leaf.IPAddresses {
		add(ip.String())
	}
	if len(leaf.DNSNames) == 0 && len(leaf.IPAddresses) == 0 {
		add(leaf.Subject.CommonName)
	}
	return keyID, keyType, sans, leaf.NotAfter.UTC()
}

// Validate checks the chain with certs/chain.Parse, that it holds no private key, and
// that the derived fields are the chain's. Whether the certificate is valid now is
// not checked: a stored certificate expires, and the nodes say so.
func (c *Certificate) Validate() error {
	var ck config.Checker
	checkName(&ck, c.Name, true)
	if c.Version < 1 {
		ck.Addf("version", "%d: versions count from 1", c.Version)
	}
	if c.Chain == "" {
		ck.Addf("chain", "required")
		return ck.Err()
	}
	for rest := []byte(c.Chain); ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if strings.Contains(blk.Type, "PRIVATE KEY") {
			ck.Addf("chain", "holds a private key (a %q block): private keys are never stored; the keyservers hold them", blk.Type)
			return ck.Err()
		}
	}
	chain, err := certchain.Parse([]byte(c.Chain))
	if err != nil {
		ck.Add("chain", err)
		return ck.Err()
	}
	keyID, keyType, sans, notAfter := derived(chain[0])
	if keyType == "" {
		ck.Addf("chain", "the leaf's key is %T, not RSA, ECDSA or Ed25519", chain[0].PublicKey)
	}
	if c.KeyID != keyID {
		ck.Addf("key_id", "%q is not the leaf's key ID %s", c.KeyID, keyID)
	}
	if c.KeyType != keyType {
		ck.Addf("key_type", "%q is not the leaf's key type %q", c.KeyType, keyType)
	}
	if !slices.Equal(c.SANs, sans) {
		ck.Addf("sans", "%q are not the leaf's names %q", c.SANs, sans)
	}
	if !c.NotAfter.Equal(notAfter) {
		ck.Addf("not_after", "%s is not the leaf's %s", c.NotAfter.UTC().Format(time.RFC3339), notAfter.Format(time.RFC3339))
	}
	return ck.Err()
}

// DaysLeft returns the whole days from now to the end of the leaf's validity:
// 0 in its last day, negative once it has expired.
func (c *Certificate) DaysLeft(now time.Time) int {
	left := c.NotAfter.Sub(now)
	days := int(left / (24 * time.Hour))
	if left < 0 && left%(24*time.Hour) != 0 {
		days--
	}
	return days
}

// CertVersionPrefix is the etcd prefix of the certificates' versions: every upload
// is kept, immutable, as a CertificateVersion at CertVersionKey(name, version),
// written in the same transaction as the certificate in force
// (certificates/<name>). It is outside store.Prefix: the nodes never read it.
const CertVersionPrefix = "/tiergate/certversions/v1/"

// CertVersionKey returns the etcd key of version version of the certificate name.
func CertVersionKey(name string, version int) string {
	return CertVersionPrefix + name + "/" + strconv.Itoa(version)
}

// CertificateVersion is one upload of a certificate as kept under
// CertVersionPrefix: the certificate and how it came to be stored.
type CertificateVersion struct {
	Certificate

	// Uploaded is when it was stored.
	Uploaded time.Time `yaml:"uploaded" json:"uploaded"`

	// UploadedBy is the name of the API token that uploaded it.
	UploadedBy string `yaml:"uploaded_by" json:"uploaded_by"`

	// Keyservers are the addresses of the keyservers its key was imported into
	// and verified on.
	Keyservers []string `yaml:"keyservers" json:"keyservers"`
}

// Serves reports whether the certificate is for the server name name: one of its
// SANs is name (in any case), or a wildcard SAN "*.example.com" covers it (one label:
// a.example.com; a wildcard name "*.example.com" is covered by that SAN alone).
func (c *Certificate) Serves(name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for _, san := range c.SANs {
		if san == name {
			return true
		}
		if suffix, ok := strings.CutPrefix(san, "*."); ok && !strings.HasPrefix(name, "*.") {
			if label, rest, ok := strings.Cut(name, "."); ok && label != "" && rest == suffix {
				return true
			}
		}
	}
	return false
}

// CertBinding binds certificates to listeners: l7d serves them there for the server
// names given (SNI). Several certificates in one binding are the same names with
// different key types (ECDSA and RSA side by side); l7d picks, per handshake, the
// first the client supports, ECDSA before Ed25519 before RSA.
type CertBinding struct {
	// Name identifies the binding. Required.
	Name string `yaml:"name" json:"name"`

	// Certificates are the names of the certificates served, one per key type. At
	// least one.
	Certificates []string `yaml:"certificates" json:"certificates"`

	// Listeners are the names of the listeners they are served on. At least one.
	Listeners []string `yaml:"listeners" json:"listeners"`

	// ServerNames are the server names (SNI) the certificates are served for there:
	// DNS names, "*.example.com" wildcards or IP addresses, each one a certificate of
	// the binding serves. Two bindings may not serve one name on one listener.
	// Default: every name of the certificates (their SANs).
	ServerNames []string `yaml:"server_names,omitempty" json:"server_names,omitempty"`

	// Default serves the certificates on the listeners to handshakes whose server
	// name no binding serves, or that send none. One default per listener. Default
	// false: such handshakes fail.
	Default bool `yaml:"default,omitempty" json:"default,omitempty"`
}

// Kind returns KindCertBinding.
func (*CertBinding) Kind() string { return KindCertBinding }

// ObjectName returns the binding's name.
func (b *CertBinding) ObjectName() string { return b.Name }

// Validate checks the binding's names; what they refer to is for the snapshot.
func (b *CertBinding) Validate() error {
	var ck config.Checker
	checkName(&ck, b.Name, true)
	names := func(field string, list []string) {
		if len(list) == 0 {
			ck.Addf(field, "at least one is required")
		}
		seen := map[string]bool{}
		for i, n := range list {
			path := config.Index(field, i)
			switch err := checkRef(n); {
			case err != nil:
				ck.Add(path, err)
			case seen[n]:
				ck.Addf(path, "%q is listed twice", n)
			}
			seen[n] = true
		}
	}
	names("certificates", b.Certificates)
	names("listeners", b.Listeners)
	seen := map[string]bool{}
	for i, n := range b.ServerNames {
		path := config.Index("server_names", i)
		key := strings.ToLower(n)
		if err := checkServerName(key); err != nil {
			ck.Add(path, err)
		} else if seen[key] {
			ck.Addf(path, "%q is listed twice", n)
		}
		seen[key] = true
	}
	return ck.Err()
}

// checkRef checks the name of an object referred to.
func checkRef(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	return store.CheckName(name)
}

// checkServerName checks a lower-case server name: an IP address, a DNS name, or a
// DNS name under "*.".
func checkServerName(n string) error {
	if _, err := netip.ParseAddr(n); err == nil {
		return nil
	}
	host := strings.TrimPrefix(n, "*.")
	if host == "" || len(n) > 253 {
		return fmt.Errorf("%q: want a DNS name of up to 253 characters, a wildcard \"*.example.com\" or an IP address", n)
	}
	for label := range strings.SplitSeq(host, ".") {
		ok := label != "" && len(label) <= 63 && label[0] != '-' && label[len(label)-1] != '-'
		for i := 0; ok && i < len(label); i++ {
			c := label[i]
			ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
		}
		if !ok {
			return fmt.Errorf("%q: label %q: want 1 to 63 letters, digits, '-' (not first or last) and '_'", n, label)
		}
	}
	return nil
}
