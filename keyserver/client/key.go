package client

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// RemoteKey is a private key held by the keyservers. It implements crypto.Signer and
// crypto.Decrypter, so it can be the PrivateKey of a tls.Certificate (for ECDSA and
// Ed25519 keys served over TLS 1.2, use PrivateKey or Client.TLSCertificate). Its
// methods block until the keyservers answer (at most Config.Timeout) and are safe for
// concurrent use.
type RemoteKey struct {
	c   *Client
	id  protocol.KeyID
	pub crypto.PublicKey
}

// NewKey returns the remote key id whose public half is pub (typically taken from the
// certificate), without asking a keyserver. Operations fail if pub is not an RSA,
// ECDSA or Ed25519 key.
func (c *Client) NewKey(id protocol.KeyID, pub crypto.PublicKey) *RemoteKey {
	return &RemoteKey{c: c, id: id, pub: pub}
}

// Key fetches the public half of key id from a keyserver, checks that it hashes to
// id, and returns the remote key.
func (c *Client) Key(ctx context.Context, id protocol.KeyID) (*RemoteKey, error) {
	req := protocol.Request{Op: protocol.OpPublicKey, KeyID: id}
	body, err := c.request(ctx, &req, nil)
	if err != nil {
		return nil, err
	}
	pub, err := x509.ParsePKIXPublicKey(body)
	if err != nil {
		return nil, &OpError{Op: req.Op, Key: id, Err: fmt.Errorf("parsing public key: %w", err)}
	}
	got, err := backend.KeyIDOf(pub)
	if err != nil {
		return nil, &OpError{Op: req.Op, Key: id, Err: err}
	}
	if got != id {
		return nil, &OpError{Op: req.Op, Key: id, Err: fmt.Errorf("server sent the public key of %s", got.Short())}
	}
	return c.NewKey(id, pub), nil
}

// TLSCertificate returns a certificate for chain (DER, leaf first) whose private key
// is held by the keyservers, without a round trip: the key ID is that of the leaf's
// public key.
func (c *Client) TLSCertificate(chain [][]byte) (tls.Certificate, error) {
	if len(chain) == 0 {
		return tls.Certificate{}, errors.New("keyserver client: empty certificate chain")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("keyserver client: parsing leaf certificate: %w", err)
	}
	id, err := backend.KeyIDOf(leaf.PublicKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("keyserver client: certificate %q: %w", leaf.Subject, err)
	}
	k := c.NewKey(id, leaf.PublicKey)
	return tls.Certificate{Certificate: chain, PrivateKey: k.PrivateKey(), Leaf: leaf}, nil
}

// PrivateKey returns the value for tls.Certificate.PrivateKey: k itself for an RSA
// key, and for ECDSA and Ed25519 keys a view of k without the Decrypt method. In TLS
// 1.2, crypto/tls takes any crypto.Decrypter for an RSA decryption key and refuses
// one whose public key is not RSA; TLS 1.3 and QUIC accept k itself for every key.
func (k *RemoteKey) PrivateKey() crypto.Signer {
	if _, ok := k.pub.(*rsa.PublicKey); ok {
		return k
	}
	return signer{k}
}

// signer is a RemoteKey that is not a crypto.Decrypter.
type signer struct{ k *RemoteKey }

func (s signer) Public() crypto.PublicKey { return s.k.pub }

func (s signer) Sign(rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.k.Sign(rand, digest, opts)
}

func (s signer) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.k.SignContext(ctx, digest, opts)
}

// ID returns the key's ID.
func (k *RemoteKey) ID() protocol.KeyID { return k.id }

// Public returns the public half of the key.
func (k *RemoteKey) Public() crypto.PublicKey { return k.pub }

// Sign signs digest (for Ed25519, the whole message) on a keyserver. rand is unused.
// See SignContext.
func (k *RemoteKey) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), digest, opts)
}

// SignContext signs digest on a keyserver, giving up when ctx ends.
//
// For an RSA key, opts is a crypto.Hash (PKCS #1 v1.5) or an *rsa.PSSOptions whose
// salt length is the hash length (PSSSaltLengthEqualsHash, PSSSaltLengthAuto or the
// hash's size); for ECDSA, a crypto.Hash, and the signature is ASN.1 DER; for Ed25519,
// crypto.Hash(0) with the whole message as digest. Hashes are SHA-256, SHA-384 and
// SHA-512.
func (k *RemoteKey) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	req := protocol.Request{KeyID: k.id, Payload: digest}
	if err := k.signRequest(&req, opts); err != nil {
		return nil, &OpError{Op: req.Op, Key: k.id, Err: err}
	}
	var fb *fallbackOp
	var local fallbackOp
	if s := k.c.fallbackKey(k.id); s != nil {
		local = fallbackOp{signer: s, digest: digest, opts: opts}
		fb = &local
	}
	return k.c.request(ctx, &req, fb)
}

// signRequest fills in req's op and hash for a signature with opts.
func (k *RemoteKey) signRequest(req *protocol.Request, opts crypto.SignerOpts) error {
	var h crypto.Hash
	if opts != nil {
		h = opts.HashFunc()
	}
	switch k.pub.(type) {
	case *rsa.PublicKey:
		req.Op = protocol.OpRSASignPKCS1
		if pss, ok := opts.(*rsa.PSSOptions); ok {
			req.Op = protocol.OpRSASignPSS
			switch pss.SaltLength {
			case rsa.PSSSaltLengthAuto, rsa.PSSSaltLengthEqualsHash:
			default:
				if pss.SaltLength != h.Size() {
					return fmt.Errorf("PSS salt length %d is not supported (only the hash length, %d)", pss.SaltLength, h.Size())
				}
			}
		}
	case *ecdsa.PublicKey:
		req.Op = protocol.OpECDSASign
	case ed25519.PublicKey:
		req.Op = protocol.OpEd25519Sign
		if o, ok := opts.(*ed25519.Options); ok && o.Context != "" {
			return errors.New("Ed25519ctx is not supported")
		}
		if h != 0 {
			return fmt.Errorf("Ed25519 signs whole messages: hash must be zero, not %v", h)
		}
		return nil
	default:
		return fmt.Errorf("unsupported public key type %T", k.pub)
	}
	var err error
	if req.Hash, err = wireHash(h); err != nil {
		return err
	}
	if len(req.Payload) != h.Size() {
		return fmt.Errorf("%v digest must be %d bytes, have %d", h, h.Size(), len(req.Payload))
	}
	return nil
}

func wireHash(h crypto.Hash) (protocol.Hash, error) {
	switch h {
	case crypto.SHA256:
		return protocol.HashSHA256, nil
	case crypto.SHA384:
		return protocol.HashSHA384, nil
	case crypto.SHA512:
		return protocol.HashSHA512, nil
	case 0:
		return 0, errors.New("a hash is required")
	}
	return 0, fmt.Errorf("hash %v is not supported (SHA-256, SHA-384 and SHA-512 are)", h)
}

// Decrypt decrypts an RSA PKCS #1 v1.5 ciphertext on a keyserver. rand is unused.
//
// opts is nil, or *rsa.PKCS1v15DecryptOptions: a non-zero SessionKeyLen asks for
// rsa.DecryptPKCS1v15SessionKey's behaviour, where a padding failure yields that many
// random bytes and no error (what the TLS 1.2 RSA key exchange needs).
func (k *RemoteKey) Decrypt(_ io.Reader, ciphertext []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	return k.DecryptContext(context.Background(), ciphertext, opts)
}

// DecryptContext is Decrypt, giving up when ctx ends.
func (k *RemoteKey) DecryptContext(ctx context.Context, ciphertext []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	req := protocol.Request{Op: protocol.OpRSADecrypt, KeyID: k.id, Payload: ciphertext}
	if err := k.decryptRequest(&req, opts); err != nil {
		return nil, &OpError{Op: req.Op, Key: k.id, Err: err}
	}
	var fb *fallbackOp
	var local fallbackOp
	if s := k.c.fallbackKey(k.id); s != nil {
		local = fallbackOp{signer: s, digest: ciphertext, decrypt: true, decOpts: opts}
		fb = &local
	}
	return k.c.request(ctx, &req, fb)
}

func (k *RemoteKey) decryptRequest(req *protocol.Request, opts crypto.DecrypterOpts) error {
	if _, ok := k.pub.(*rsa.PublicKey); !ok {
		return fmt.Errorf("cannot decrypt with a %T key", k.pub)
	}
	if len(req.Payload) == 0 {
		return errors.New("empty ciphertext")
	}
	switch o := opts.(type) {
	case nil:
	//lint:ignore SA1019 crypto/tls passes these options for the TLS 1.2 RSA key exchange.
	case *rsa.PKCS1v15DecryptOptions:
		if o == nil {
			break
		}
		if o.SessionKeyLen < 0 || o.SessionKeyLen > 0xffff {
			return fmt.Errorf("session key length %d out of range", o.SessionKeyLen)
		}
		req.Param = uint16(o.SessionKeyLen)
	default:
		return fmt.Errorf("decryption options %T are not supported (only PKCS #1 v1.5)", opts)
	}
	return nil
}

func (c *Client) fallbackKey(id protocol.KeyID) crypto.Signer {
	if len(c.cfg.Fallback) == 0 {
		return nil
	}
	return c.cfg.Fallback[id]
}

var (
	_ crypto.Signer    = (*RemoteKey)(nil)
	_ crypto.Decrypter = (*RemoteKey)(nil)
)
