package hsm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/asn1"
	"fmt"
	"math/big"

	"github.com/miekg/pkcs11"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Import implements backend.Backend. It writes priv (*rsa.PrivateKey,
// *ecdsa.PrivateKey on P-256 or P-384, or ed25519.PrivateKey) to the token as a
// sensitive, non-extractable private key object and its public key object, both with
// CKA_ID set to the key ID (the SHA-256 of the SubjectPublicKeyInfo) and CKA_LABEL to
// label. The key can be used at once.
//
// Importing a key that is already on the token, under this ID or another, returns the
// existing key and writes nothing.
func (b *Backend) Import(label string, priv crypto.PrivateKey) (*backend.Key, error) {
	k, err := b.importKey(label, priv)
	if err != nil {
		return nil, fmt.Errorf("hsm: importing key %q into token %q: %w", label, b.tokenLabel, err)
	}
	return k.key, nil
}

func (b *Backend) importKey(label string, priv crypto.PrivateKey) (*keyObject, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if p, ok := priv.(*ed25519.PrivateKey); ok && p != nil {
		priv = *p
	}
	var (
		keyType uint
		pubT    []*pkcs11.Attribute
		privT   []*pkcs11.Attribute
		pub     crypto.PublicKey
	)
	switch p := priv.(type) {
	case *rsa.PrivateKey:
		if p.N.BitLen() < minRSABits {
			return nil, fmt.Errorf("%w: RSA-%d (at least %d bits are served)", backend.ErrUnsupportedKey, p.N.BitLen(), minRSABits)
		}
		if len(p.Primes) != 2 {
			return nil, fmt.Errorf("%w: multi-prime RSA", backend.ErrUnsupportedKey)
		}
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("invalid RSA key: %w", err)
		}
		p.Precompute()
		keyType, pub = pkcs11.CKK_RSA, &p.PublicKey
		e := big.NewInt(int64(p.E)).Bytes()
		pubT = []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, true),
			pkcs11.NewAttribute(pkcs11.CKA_MODULUS, p.N.Bytes()),
			pkcs11.NewAttribute(pkcs11.CKA_PUBLIC_EXPONENT, e),
		}
		privT = []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true),
			pkcs11.NewAttribute(pkcs11.CKA_MODULUS, p.N.Bytes()),
			pkcs11.NewAttribute(pkcs11.CKA_PUBLIC_EXPONENT, e),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE_EXPONENT, p.D.Bytes()),
			pkcs11.NewAttribute(pkcs11.CKA_PRIME_1, p.Primes[0].Bytes()),
			pkcs11.NewAttribute(pkcs11.CKA_PRIME_2, p.Primes[1].Bytes()),
			pkcs11.NewAttribute(pkcs11.CKA_EXPONENT_1, p.Precomputed.Dp.Bytes()),
			pkcs11.NewAttribute(pkcs11.CKA_EXPONENT_2, p.Precomputed.Dq.Bytes()),
			pkcs11.NewAttribute(pkcs11.CKA_COEFFICIENT, p.Precomputed.Qinv.Bytes()),
		}
	case *ecdsa.PrivateKey:
		var params []byte
		switch p.Curve.Params().Name {
		case "P-256":
			params = oidP256
		case "P-384":
			params = oidP384
		default:
			return nil, fmt.Errorf("%w: ECDSA curve %s", backend.ErrUnsupportedKey, p.Curve.Params().Name)
		}
		scalar, err := p.Bytes()
		if err != nil {
			return nil, fmt.Errorf("invalid ECDSA key: %w", err)
		}
		point, err := p.PublicKey.Bytes()
		if err != nil {
			return nil, fmt.Errorf("invalid ECDSA key: %w", err)
		}
		ecPoint, _ := asn1.Marshal(point)
		keyType, pub = pkcs11.CKK_EC, &p.PublicKey
		pubT = []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, params),
			pkcs11.NewAttribute(pkcs11.CKA_EC_POINT, ecPoint),
		}
		privT = []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, params),
			pkcs11.NewAttribute(pkcs11.CKA_VALUE, scalar),
		}
	case ed25519.PrivateKey:
		if len(p) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("invalid Ed25519 key: %d bytes", len(p))
		}
		if !b.mechs[ckmEdDSA] {
			return nil, &MechanismError{Token: b.tokenLabel, Mechanism: "CKM_EDDSA", For: "Ed25519 keys"}
		}
		pk := p.Public().(ed25519.PublicKey)
		ecPoint, _ := asn1.Marshal([]byte(pk))
		keyType, pub = ckkECEdwards, pk
		pubT = []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, oidEd25519),
			pkcs11.NewAttribute(pkcs11.CKA_EC_POINT, ecPoint),
		}
		privT = []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, oidEd25519),
			pkcs11.NewAttribute(pkcs11.CKA_VALUE, p.Seed()),
		}
	default:
		return nil, fmt.Errorf("%w: %T", backend.ErrUnsupportedKey, priv)
	}
	if _, err := backend.TypeOf(pub); err != nil {
		return nil, err
	}
	id, err := backend.KeyIDOf(pub)
	if err != nil {
		return nil, err
	}

	common := func(class uint) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, class),
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, keyType),
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_ID, id[:]),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		}
	}
	pubT = append(common(pkcs11.CKO_PUBLIC_KEY), append([]*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false),
		pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
	}, pubT...)...)
	privT = append(common(pkcs11.CKO_PRIVATE_KEY), append([]*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, false),
		pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
	}, privT...)...)

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	if k := b.byID[id]; k != nil {
		return k, nil
	}
	k, err := b.createLocked(id, keyType, label, pubT, privT)
	if err != nil && recoverable(err) {
		if rerr := b.ensureLoginLocked(); rerr != nil {
			return nil, fmt.Errorf("%w (recovering: %v)", err, rerr)
		}
		k, err = b.createLocked(id, keyType, label, pubT, privT)
	}
	if err != nil {
		return nil, err
	}
	return b.addLocked(k), nil
}

// createLocked returns the key with ID id from the token, creating what is missing
// of its objects from the templates. A public key object left by an interrupted
// import is reused, and one that was lost is created again.
func (b *Backend) createLocked(id protocol.KeyID, keyType uint, label string, pubT, privT []*pkcs11.Attribute) (*keyObject, error) {
	ctx := b.mod.ctx
	privs, err := b.listPrivateLocked(
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, keyType),
		pkcs11.NewAttribute(pkcs11.CKA_ID, id[:]))
	if err != nil {
		return nil, err
	}
	if len(privs) == 0 {
		if k, err := b.findUnderOtherIDLocked(id, keyType); err != nil || k != nil {
			return k, err
		}
	}
	pubs, err := b.findLocked([]*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_ID, id[:]),
	})
	if err != nil {
		return nil, fmt.Errorf("finding public key object: %w", err)
	}
	var pubH pkcs11.ObjectHandle
	created := false
	if len(pubs) == 0 {
		if pubH, err = ctx.CreateObject(b.login, pubT); err != nil {
			return nil, fmt.Errorf("creating public key object: %w", err)
		}
		created = true
	}
	c := candidate{keyType: keyType, id: id[:], label: label}
	if len(privs) > 0 {
		c = privs[0]
	} else if c.h, err = ctx.CreateObject(b.login, privT); err != nil {
		if created {
			_ = ctx.DestroyObject(b.login, pubH)
		}
		return nil, fmt.Errorf("creating private key object: %w", err)
	}
	k, err := b.buildKeyLocked(c)
	if err != nil {
		return nil, fmt.Errorf("loading the key: %w", err)
	}
	if k.id != id {
		return nil, fmt.Errorf("the token holds key %s under the CKA_ID of key %s", k.id, id)
	}
	return k, nil
}

// findUnderOtherIDLocked returns the key with ID id if it is on the token under
// another CKA_ID, as keys made by other tools are, by comparing the public keys of
// the private keys of keyType.
func (b *Backend) findUnderOtherIDLocked(id protocol.KeyID, keyType uint) (*keyObject, error) {
	cs, err := b.listPrivateLocked(pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, keyType))
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if string(c.id) == string(id[:]) {
			continue
		}
		if k, err := b.buildKeyLocked(c); err == nil && k.id == id {
			return k, nil
		}
	}
	return nil, nil
}
