// Package testpki makes small X.509 hierarchies for tests and the demo: a CA, server
// and client certificates for mutual TLS, and leaf certificates for a given key.
package testpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that issues certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	DER  []byte
}

// NewCA returns a new self-signed ECDSA P-256 CA named cn, valid for a day.
func NewCA(cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, DER: der}, nil
}

// Pool returns a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue signs a leaf certificate for pub named cn, valid for the given DNS names and
// IPs (strings that parse as IPs go to IPAddresses), usable for server and client auth.
func (ca *CA) Issue(cn string, pub crypto.PublicKey, names ...string) (*x509.Certificate, []byte, error) {
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing certificate for %q: %w", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, der, err
}

// Leaf issues an ECDSA P-256 certificate and key named cn as a tls.Certificate.
func (ca *CA) Leaf(cn string, names ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, der, err := ca.Issue(cn, key.Public(), names...)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, nil
}

// WriteFiles writes the CA certificate to dir/name-ca.pem and, for each leaf, its
// certificate and key to dir/<cn>.pem and dir/<cn>.key. It returns the CA path.
func (ca *CA) WriteFiles(dir, name string, leaves ...tls.Certificate) (string, error) {
	caPath := filepath.Join(dir, name+"-ca.pem")
	if err := WritePEM(caPath, "CERTIFICATE", ca.DER); err != nil {
		return "", err
	}
	for _, l := range leaves {
		cn := l.Leaf.Subject.CommonName
		if err := WritePEM(filepath.Join(dir, cn+".pem"), "CERTIFICATE", l.Certificate[0]); err != nil {
			return "", err
		}
		der, err := x509.MarshalPKCS8PrivateKey(l.PrivateKey)
		if err != nil {
			return "", err
		}
		if err := WritePEM(filepath.Join(dir, cn+".key"), "PRIVATE KEY", der); err != nil {
			return "", err
		}
	}
	return caPath, nil
}

// WritePEM writes one PEM block to path with mode 0600.
func WritePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// KeyPEM returns priv as a PKCS #8 PEM block.
func KeyPEM(priv crypto.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}
