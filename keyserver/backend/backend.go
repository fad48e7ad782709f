// Package backend defines what keyserverd needs from a key store: a set of private keys
// named by the SHA-256 of their SubjectPublicKeyInfo, each usable as a crypto.Signer
// (and, for RSA, a crypto.Decrypter), and a way to import a new key.
//
// The PKCS#11 backend lives in keyserver/hsm and the software (PEM file) backend in
// keyserver/softkey; both hand the server Keys of this package.
package backend

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Key is one private key a backend offers. Signer must be safe for concurrent use.
//
// Signer.Sign follows crypto.Signer: for RSA, opts is a crypto.Hash (PKCS #1 v1.5
// over a digest) or *rsa.PSSOptions (PSS, salt length equal to the hash length); for
// ECDSA, a crypto.Hash with an ASN.1 DER signature as result; for Ed25519, crypto.Hash(0)
// over the whole message. RSA keys also implement crypto.Decrypter (PKCS #1 v1.5).
type Key struct {
	ID     protocol.KeyID
	Label  string
	Type   protocol.KeyType
	Public crypto.PublicKey
	Signer crypto.Signer
}

// Backend is a source of keys.
type Backend interface {
	// Name is a short label for logs and metrics, e.g. "pkcs11" or "software".
	Name() string
	// Keys returns every key the backend offers now.
	Keys() ([]*Key, error)
	// Import stores a private key under label and returns it as a Key. In an HSM the
	// key becomes a non-extractable, sensitive token object.
	Import(label string, priv crypto.PrivateKey) (*Key, error)
	// Close releases the backend's resources.
	Close() error
}

// ContextSigner is a Signer whose signatures may wait for the backend (a free
// PKCS#11 session): SignContext gives up, with an error wrapping ErrBusy and nothing
// done, when ctx ends before the backend takes the operation. Once taken, an
// operation runs to its end. The server uses it, when a key's Signer has it, to
// bound that wait by the request's deadline.
type ContextSigner interface {
	SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error)
}

// ContextDecrypter is ContextSigner's counterpart for crypto.Decrypter.
type ContextDecrypter interface {
	DecryptContext(ctx context.Context, ciphertext []byte, opts crypto.DecrypterOpts) ([]byte, error)
}

// ErrBusy is wrapped by the error of a ContextSigner or ContextDecrypter whose
// context ended before the backend could take the operation: it was not done.
var ErrBusy = errors.New("backend busy")

// ErrUnsupportedKey is returned for key types other than RSA, ECDSA P-256/P-384 and
// Ed25519.
var ErrUnsupportedKey = errors.New("unsupported key type")

// KeyIDOf returns the key ID of pub: the SHA-256 of its DER SubjectPublicKeyInfo.
func KeyIDOf(pub crypto.PublicKey) (protocol.KeyID, error) {
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return protocol.KeyID{}, fmt.Errorf("marshalling public key: %w", err)
	}
	return protocol.KeyIDFromSPKI(spki), nil
}

// TypeOf returns the protocol key type of pub.
func TypeOf(pub crypto.PublicKey) (protocol.KeyType, error) {
	switch p := pub.(type) {
	case *rsa.PublicKey:
		return protocol.KeyRSA, nil
	case *ecdsa.PublicKey:
		switch p.Curve.Params().Name {
		case "P-256", "P-384":
			return protocol.KeyECDSA, nil
		}
		return 0, fmt.Errorf("%w: ECDSA curve %s", ErrUnsupportedKey, p.Curve.Params().Name)
	case ed25519.PublicKey:
		return protocol.KeyEd25519, nil
	}
	return 0, fmt.Errorf("%w: %T", ErrUnsupportedKey, pub)
}

// NewKey fills ID and Type from signer's public key.
func NewKey(label string, signer crypto.Signer) (*Key, error) {
	pub := signer.Public()
	t, err := TypeOf(pub)
	if err != nil {
		return nil, err
	}
	id, err := KeyIDOf(pub)
	if err != nil {
		return nil, err
	}
	return &Key{ID: id, Label: label, Type: t, Public: pub, Signer: signer}, nil
}
