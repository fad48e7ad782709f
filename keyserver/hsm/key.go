package hsm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/asn1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"
	"sync/atomic"

	"github.com/miekg/pkcs11"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// PKCS#11 3.0 values that github.com/miekg/pkcs11 v1.1.2 does not define.
const (
	ckkECEdwards = 0x00000040 // CKK_EC_EDWARDS
	ckmEdDSA     = 0x00001057 // CKM_EDDSA
)

// minRSABits is the smallest RSA modulus served.
const minRSABits = 2048

// DER encodings of the curve OIDs used as CKA_EC_PARAMS.
var (
	oidP256    = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	oidP384    = []byte{0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22}
	oidEd25519 = []byte{0x06, 0x03, 0x2b, 0x65, 0x70}
	// edwards25519 as a PrintableString, which PKCS#11 3.0 also allows.
	nameEd25519 = append([]byte{0x13, 0x0c}, "edwards25519"...)
)

type keyKind uint8

const (
	kindRSA keyKind = iota + 1
	kindECDSA
	kindEd25519
)

// keyObject is a private key on the token, with its handle cached.
type keyObject struct {
	b     *Backend
	kind  keyKind
	ckaID []byte // CKA_ID on the token; may differ from id for keys made elsewhere
	label string // CKA_LABEL
	id    protocol.KeyID
	pub   crypto.PublicKey
	size  int // RSA modulus or EC scalar length in bytes
	key   *backend.Key

	handle atomic.Pointer[objHandle]
}

// objHandle is a private object handle and the login epoch it was found in.
type objHandle struct {
	h     pkcs11.ObjectHandle
	epoch uint64
}

func (k *keyObject) String() string {
	return fmt.Sprintf("%s (%q)", k.id.Short(), k.label)
}

// keySpec is a parsed KeySpec.
type keySpec struct {
	desc  string
	uri   *URI
	id    []byte
	label string
}

func parseKeySpecs(in []KeySpec) ([]keySpec, error) {
	out := make([]keySpec, 0, len(in))
	for i, ks := range in {
		n := 0
		for _, s := range []string{ks.URI, ks.ID, ks.Label} {
			if s != "" {
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("keys[%d]: set exactly one of uri, id and label", i)
		}
		switch {
		case ks.URI != "":
			u, err := ParseURI(ks.URI)
			if err != nil {
				return nil, fmt.Errorf("keys[%d]: %w", i, err)
			}
			if u.Type != "" && u.Type != "private" {
				return nil, fmt.Errorf("keys[%d]: URI %s has type=%s: key URIs name private keys", i, Redact(ks.URI), u.Type)
			}
			out = append(out, keySpec{desc: "URI " + Redact(ks.URI), uri: u})
		case ks.ID != "":
			s := strings.ReplaceAll(strings.TrimPrefix(strings.ToLower(ks.ID), "0x"), ":", "")
			id, err := hex.DecodeString(s)
			if err != nil || len(id) == 0 {
				return nil, fmt.Errorf("keys[%d]: id %q is not hex", i, ks.ID)
			}
			out = append(out, keySpec{desc: "id " + hex.EncodeToString(id), id: id})
		default:
			out = append(out, keySpec{desc: fmt.Sprintf("label %q", ks.Label), label: ks.Label})
		}
	}
	return out, nil
}

// candidate is a private key object as listed, before its public key is read.
type candidate struct {
	h       pkcs11.ObjectHandle
	keyType uint
	id      []byte
	label   string
}

func (c candidate) String() string {
	if c.label != "" {
		return fmt.Sprintf("private key %q (id %x)", c.label, c.id)
	}
	return fmt.Sprintf("private key with id %x", c.id)
}

// findLocked returns the objects matching tmpl, searching with the login session.
func (b *Backend) findLocked(tmpl []*pkcs11.Attribute) ([]pkcs11.ObjectHandle, error) {
	ctx := b.mod.ctx
	b.finds.Add(1)
	if err := ctx.FindObjectsInit(b.login, tmpl); err != nil {
		return nil, err
	}
	var all []pkcs11.ObjectHandle
	for {
		hs, _, err := ctx.FindObjects(b.login, 64)
		if err != nil {
			_ = ctx.FindObjectsFinal(b.login)
			return nil, err
		}
		if len(hs) == 0 {
			break
		}
		all = append(all, hs...)
	}
	return all, ctx.FindObjectsFinal(b.login)
}

// attr reads one attribute of h.
func (b *Backend) attr(sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, typ uint) ([]byte, error) {
	as, err := b.mod.ctx.GetAttributeValue(sh, h, []*pkcs11.Attribute{pkcs11.NewAttribute(typ, nil)})
	if err != nil {
		return nil, err
	}
	return as[0].Value, nil
}

// listPrivateLocked returns every private key object on the token matching extra.
func (b *Backend) listPrivateLocked(extra ...*pkcs11.Attribute) ([]candidate, error) {
	tmpl := append([]*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
	}, extra...)
	hs, err := b.findLocked(tmpl)
	if err != nil {
		return nil, fmt.Errorf("finding private keys on token %q: %w", b.tokenLabel, err)
	}
	cs := make([]candidate, 0, len(hs))
	for _, h := range hs {
		as, err := b.mod.ctx.GetAttributeValue(b.login, h, []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, nil),
			pkcs11.NewAttribute(pkcs11.CKA_ID, nil),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, nil),
		})
		if err != nil {
			return nil, fmt.Errorf("reading private key object %d on token %q: %w", h, b.tokenLabel, err)
		}
		cs = append(cs, candidate{h: h, keyType: ulong(as[0].Value), id: as[1].Value, label: string(as[2].Value)})
	}
	return cs, nil
}

// loadKeysLocked loads the keys specs select, or all supported keys if there are no
// specs.
func (b *Backend) loadKeysLocked(specs []keySpec, slot uint, ti pkcs11.TokenInfo) error {
	cs, err := b.listPrivateLocked()
	if err != nil {
		return err
	}
	if len(specs) == 0 {
		for _, c := range cs {
			if err := b.checkExtractableLocked(c); err != nil {
				b.log.Error("pkcs11 key refused", "token", b.tokenLabel, "key", c.String(), "err", err)
				continue
			}
			k, err := b.buildKeyLocked(c)
			if err != nil {
				b.log.Warn("pkcs11 key skipped", "token", b.tokenLabel, "key", c.String(), "err", err)
				continue
			}
			b.addLocked(k)
		}
		return nil
	}
	for _, s := range specs {
		var match []candidate
		for _, c := range cs {
			if s.matches(c) {
				match = append(match, c)
			}
		}
		if s.uri != nil {
			sel := selectorOf(s.uri)
			if !sel.matchesToken(b.mod.ctx, slot, ti) {
				return fmt.Errorf("key %s names another token than %q", s.desc, b.tokenLabel)
			}
			if sel.libManufacturer != "" || sel.libDescription != "" || sel.libVersion != "" {
				info, err := b.mod.ctx.GetInfo()
				if err != nil || !sel.matchesLibrary(info) {
					return fmt.Errorf("key %s names another PKCS#11 module than %s", s.desc, b.mod.path)
				}
			}
		}
		switch {
		case len(match) == 0:
			return fmt.Errorf("no private key with %s on token %q", s.desc, b.tokenLabel)
		case len(match) > 1 && s.uri == nil:
			return fmt.Errorf("%d private keys with %s on token %q: select by id", len(match), s.desc, b.tokenLabel)
		}
		for _, c := range match {
			if err := b.checkExtractableLocked(c); err != nil {
				return fmt.Errorf("loading key %s (%s): %w", s.desc, c, err)
			}
			k, err := b.buildKeyLocked(c)
			if err != nil {
				return fmt.Errorf("loading key %s (%s): %w", s.desc, c, err)
			}
			b.addLocked(k)
		}
	}
	return nil
}

// checkExtractableLocked refuses c, unless AllowExtractable, when its value can
// leave the token: CKA_EXTRACTABLE true or CKA_SENSITIVE false. Either way such a
// key is counted, and a served one logged as a warning.
func (b *Backend) checkExtractableLocked(c candidate) error {
	as, err := b.mod.ctx.GetAttributeValue(b.login, c.h, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, nil),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, nil),
	})
	if err != nil || len(as) != 2 {
		b.log.Warn("pkcs11 key: cannot read CKA_EXTRACTABLE and CKA_SENSITIVE; served", "token", b.tokenLabel, "key", c.String(), "err", err)
		return nil
	}
	extractable := len(as[0].Value) == 1 && as[0].Value[0] != 0
	sensitive := len(as[1].Value) == 1 && as[1].Value[0] != 0
	if !extractable && sensitive {
		return nil
	}
	why := fmt.Sprintf("its value can leave the token (CKA_EXTRACTABLE %v, CKA_SENSITIVE %v)", extractable, sensitive)
	if b.allowExtractable {
		b.extractableServed.Add(1)
		b.log.Warn("pkcs11 key served although "+why+": re-import it with keyserverd import, which stores keys non-extractable",
			"token", b.tokenLabel, "key", c.String())
		return nil
	}
	b.extractableRefused.Add(1)
	return fmt.Errorf("refused: %s; re-import it with keyserverd import (non-extractable), or set allow_extractable: true", why)
}

func (s keySpec) matches(c candidate) bool {
	switch {
	case s.uri != nil:
		return (s.uri.Object == "" || s.uri.Object == c.label) && (s.uri.ID == nil || bytes.Equal(s.uri.ID, c.id))
	case s.id != nil:
		return bytes.Equal(s.id, c.id)
	}
	return s.label == c.label
}

// addLocked adds k to the key set unless a key with its ID is there already.
func (b *Backend) addLocked(k *keyObject) *keyObject {
	if old := b.byID[k.id]; old != nil {
		return old
	}
	b.byID[k.id] = k
	b.keys = append(b.keys, k)
	return k
}

// buildKeyLocked reads the public half of c and makes its signer.
func (b *Backend) buildKeyLocked(c candidate) (*keyObject, error) {
	if v, err := b.attr(b.login, c.h, pkcs11.CKA_ALWAYS_AUTHENTICATE); err == nil && len(v) == 1 && v[0] != 0 {
		return nil, errors.New("key needs a login before every use (CKA_ALWAYS_AUTHENTICATE), which is not supported")
	}
	k := &keyObject{b: b, ckaID: c.id, label: c.label}
	pubH, hasPub, err := b.findPublicLocked(c)
	if err != nil {
		return nil, err
	}
	// pubAttr reads typ from the public key object, or from the private one when
	// there is none or it lacks typ.
	pubAttr := func(typ uint) ([]byte, error) {
		if hasPub {
			if v, err := b.attr(b.login, pubH, typ); err == nil && len(v) > 0 {
				return v, nil
			}
		}
		return b.attr(b.login, c.h, typ)
	}
	var signer crypto.Signer
	switch c.keyType {
	case pkcs11.CKK_RSA:
		if !b.mechs[pkcs11.CKM_RSA_PKCS] {
			return nil, &MechanismError{Token: b.tokenLabel, Mechanism: "CKM_RSA_PKCS", For: "RSA keys"}
		}
		n, err := pubAttr(pkcs11.CKA_MODULUS)
		if err != nil {
			return nil, fmt.Errorf("reading RSA modulus: %w", err)
		}
		e, err := pubAttr(pkcs11.CKA_PUBLIC_EXPONENT)
		if err != nil {
			return nil, fmt.Errorf("reading RSA public exponent: %w", err)
		}
		pub, err := rsaPublic(n, e)
		if err != nil {
			return nil, err
		}
		k.kind, k.pub, k.size = kindRSA, pub, pub.Size()
		signer = &rsaSigner{k}
	case pkcs11.CKK_EC:
		if !b.mechs[pkcs11.CKM_ECDSA] {
			return nil, &MechanismError{Token: b.tokenLabel, Mechanism: "CKM_ECDSA", For: "ECDSA keys"}
		}
		params, err := pubAttr(pkcs11.CKA_EC_PARAMS)
		if err != nil {
			return nil, fmt.Errorf("reading EC parameters: %w", err)
		}
		point, err := pubAttr(pkcs11.CKA_EC_POINT)
		if err != nil {
			return nil, fmt.Errorf("reading EC point (no public key object with CKA_ID %x?): %w", c.id, err)
		}
		pub, err := ecdsaPublic(params, point)
		if err != nil {
			return nil, err
		}
		k.kind, k.pub, k.size = kindECDSA, pub, (pub.Curve.Params().BitSize+7)/8
		signer = &ecdsaSigner{k}
	case ckkECEdwards:
		if !b.mechs[ckmEdDSA] {
			return nil, &MechanismError{Token: b.tokenLabel, Mechanism: "CKM_EDDSA", For: "Ed25519 keys"}
		}
		params, err := pubAttr(pkcs11.CKA_EC_PARAMS)
		if err != nil {
			return nil, fmt.Errorf("reading EdDSA parameters: %w", err)
		}
		point, err := pubAttr(pkcs11.CKA_EC_POINT)
		if err != nil {
			return nil, fmt.Errorf("reading EdDSA public key (no public key object with CKA_ID %x?): %w", c.id, err)
		}
		pub, err := ed25519Public(params, point)
		if err != nil {
			return nil, err
		}
		k.kind, k.pub, k.size = kindEd25519, pub, ed25519.PublicKeySize
		signer = &ed25519Signer{k}
	default:
		return nil, fmt.Errorf("%w: PKCS#11 key type 0x%x", backend.ErrUnsupportedKey, c.keyType)
	}
	key, err := backend.NewKey(c.label, signer)
	if err != nil {
		return nil, err
	}
	k.id, k.key = key.ID, key
	k.handle.Store(&objHandle{h: c.h, epoch: b.handleEpoch.Load()})
	return k, nil
}

// findPublicLocked finds the public key object paired with c: same CKA_ID, or same
// label when the private key has no ID.
func (b *Backend) findPublicLocked(c candidate) (pkcs11.ObjectHandle, bool, error) {
	tmpl := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, c.keyType),
	}
	switch {
	case len(c.id) > 0:
		tmpl = append(tmpl, pkcs11.NewAttribute(pkcs11.CKA_ID, c.id))
	case c.label != "":
		tmpl = append(tmpl, pkcs11.NewAttribute(pkcs11.CKA_LABEL, c.label))
	default:
		return 0, false, nil
	}
	hs, err := b.findLocked(tmpl)
	if err != nil {
		return 0, false, fmt.Errorf("finding public key of %s: %w", c, err)
	}
	if len(hs) > 1 {
		// Several key pairs share the CKA_ID: narrow down by label, and for RSA by
		// the modulus, which the private key object carries too.
		hs = b.narrowLocked(hs, pkcs11.CKA_LABEL, []byte(c.label))
		if len(hs) > 1 && c.keyType == pkcs11.CKK_RSA {
			if n, err := b.attr(b.login, c.h, pkcs11.CKA_MODULUS); err == nil {
				hs = b.narrowLocked(hs, pkcs11.CKA_MODULUS, n)
			}
		}
		if len(hs) != 1 {
			return 0, false, fmt.Errorf("cannot tell which public key object belongs to %s: several share its CKA_ID and label", c)
		}
	}
	if len(hs) == 0 {
		return 0, false, nil
	}
	return hs[0], true, nil
}

// narrowLocked keeps the objects whose attribute typ is v, or all of them if none is.
func (b *Backend) narrowLocked(hs []pkcs11.ObjectHandle, typ uint, v []byte) []pkcs11.ObjectHandle {
	var keep []pkcs11.ObjectHandle
	for _, h := range hs {
		if have, err := b.attr(b.login, h, typ); err == nil && bytes.Equal(have, v) {
			keep = append(keep, h)
		}
	}
	if len(keep) == 0 {
		return hs
	}
	return keep
}

// refindLocked finds k's private object again after its handle went stale.
func (b *Backend) refindLocked(k *keyObject) (pkcs11.ObjectHandle, error) {
	epoch := b.handleEpoch.Load()
	var extra []*pkcs11.Attribute
	keyType := uint(pkcs11.CKK_RSA)
	switch k.kind {
	case kindECDSA:
		keyType = pkcs11.CKK_EC
	case kindEd25519:
		keyType = ckkECEdwards
	}
	extra = append(extra, pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, keyType))
	switch {
	case len(k.ckaID) > 0:
		extra = append(extra, pkcs11.NewAttribute(pkcs11.CKA_ID, k.ckaID))
	case k.label != "":
		extra = append(extra, pkcs11.NewAttribute(pkcs11.CKA_LABEL, k.label))
	default:
		return 0, fmt.Errorf("key %s has neither CKA_ID nor CKA_LABEL to find it again by", k)
	}
	hs, err := b.findLocked(append([]*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
	}, extra...))
	if err != nil {
		return 0, err
	}
	if len(hs) == 0 {
		return 0, fmt.Errorf("key %s is no longer on token %q", k, b.tokenLabel)
	}
	k.handle.Store(&objHandle{h: hs[0], epoch: epoch})
	return hs[0], nil
}

// ulong decodes a CK_ULONG attribute value (native byte order and size).
func ulong(v []byte) uint {
	var x uint64
	switch len(v) {
	case 8:
		x = binary.NativeEndian.Uint64(v)
	case 4:
		x = uint64(binary.NativeEndian.Uint32(v))
	default:
		return ^uint(0)
	}
	return uint(x)
}

func rsaPublic(n, e []byte) (*rsa.PublicKey, error) {
	N := new(big.Int).SetBytes(n)
	E := new(big.Int).SetBytes(e)
	if N.Sign() == 0 || !E.IsInt64() || E.Int64() < 3 || E.Int64() > 1<<31-1 {
		return nil, errors.New("malformed RSA public key")
	}
	if bits := N.BitLen(); bits < minRSABits {
		return nil, fmt.Errorf("%w: RSA-%d (at least %d bits are served)", backend.ErrUnsupportedKey, bits, minRSABits)
	}
	return &rsa.PublicKey{N: N, E: int(E.Int64())}, nil
}

func curveOf(params []byte) (elliptic.Curve, error) {
	switch {
	case bytes.Equal(params, oidP256):
		return elliptic.P256(), nil
	case bytes.Equal(params, oidP384):
		return elliptic.P384(), nil
	}
	var oid asn1.ObjectIdentifier
	if _, err := asn1.Unmarshal(params, &oid); err == nil {
		return nil, fmt.Errorf("%w: EC curve %s (P-256 and P-384 are served)", backend.ErrUnsupportedKey, oid)
	}
	return nil, fmt.Errorf("%w: EC parameters %x (named curves only)", backend.ErrUnsupportedKey, params)
}

// unwrapPoint returns the point in CKA_EC_POINT: a DER OCTET STRING as PKCS#11
// specifies, or the raw point as some tokens return it. n is the raw length.
func unwrapPoint(v []byte, n int) ([]byte, error) {
	if len(v) == n && (n == ed25519.PublicKeySize || v[0] == 4) {
		return v, nil
	}
	var raw []byte
	if rest, err := asn1.Unmarshal(v, &raw); err != nil || len(rest) != 0 {
		return nil, fmt.Errorf("malformed CKA_EC_POINT %x", v)
	}
	if len(raw) != n {
		return nil, fmt.Errorf("CKA_EC_POINT holds %d bytes, want %d", len(raw), n)
	}
	return raw, nil
}

func ecdsaPublic(params, point []byte) (*ecdsa.PublicKey, error) {
	curve, err := curveOf(params)
	if err != nil {
		return nil, err
	}
	size := (curve.Params().BitSize + 7) / 8
	raw, err := unwrapPoint(point, 1+2*size)
	if err != nil {
		return nil, err
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(curve, raw)
	if err != nil {
		return nil, fmt.Errorf("EC public key: %w", err)
	}
	return pub, nil
}

func ed25519Public(params, point []byte) (ed25519.PublicKey, error) {
	if !bytes.Equal(params, oidEd25519) && !bytes.Equal(params, nameEd25519) {
		return nil, fmt.Errorf("%w: EdDSA parameters %x (Ed25519 only)", backend.ErrUnsupportedKey, params)
	}
	raw, err := unwrapPoint(point, ed25519.PublicKeySize)
	if err != nil {
		return nil, err
	}
	return ed25519.PublicKey(bytes.Clone(raw)), nil
}

// Mechanisms used on every operation, built once.
var (
	mechRSAPKCS = pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil)
	mechECDSA   = pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
	mechEdDSA   = pkcs11.NewMechanism(ckmEdDSA, nil)
)

// hashInfo describes a digest the RSA signers accept.
type hashInfo struct {
	prefix []byte // DER DigestInfo up to the digest
	mech   uint   // CKM_SHAxxx for PSS parameters
	mgf    uint   // CKG_MGF1_SHAxxx
	pss    *pkcs11.Mechanism
}

var hashes = map[crypto.Hash]*hashInfo{
	crypto.SHA256: {
		prefix: []byte{0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20},
		mech:   pkcs11.CKM_SHA256, mgf: pkcs11.CKG_MGF1_SHA256,
	},
	crypto.SHA384: {
		prefix: []byte{0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05, 0x00, 0x04, 0x30},
		mech:   pkcs11.CKM_SHA384, mgf: pkcs11.CKG_MGF1_SHA384,
	},
	crypto.SHA512: {
		prefix: []byte{0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05, 0x00, 0x04, 0x40},
		mech:   pkcs11.CKM_SHA512, mgf: pkcs11.CKG_MGF1_SHA512,
	},
}

func init() {
	for h, hi := range hashes {
		hi.pss = pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_PSS, pkcs11.NewPSSParams(hi.mech, hi.mgf, uint(h.Size())))
	}
}

func rsaHash(h crypto.Hash, digest []byte) (*hashInfo, error) {
	hi := hashes[h]
	if hi == nil {
		return nil, fmt.Errorf("unsupported hash %v for RSA (SHA-256, SHA-384 and SHA-512 are)", h)
	}
	if len(digest) != h.Size() {
		return nil, fmt.Errorf("digest is %d bytes, %v needs %d", len(digest), h, h.Size())
	}
	return hi, nil
}

var errNilOpts = errors.New("nil crypto.SignerOpts")

func (k *keyObject) fail(what string, err error) error {
	if errors.Is(err, ErrClosed) {
		return fmt.Errorf("hsm: %s with key %s: %w", what, k, err)
	}
	return fmt.Errorf("hsm: %s with key %s on token %q: %w", what, k, k.b.tokenLabel, err)
}

// rsaSigner is an RSA key on the token: a crypto.Signer and crypto.Decrypter.
type rsaSigner struct{ k *keyObject }

func (s *rsaSigner) Public() crypto.PublicKey { return s.k.pub }

// Sign signs digest with RSASSA-PKCS1-v1_5 (opts a crypto.Hash) or RSASSA-PSS (opts
// an *rsa.PSSOptions; salt length equal to the hash length unless a positive length
// is given). rand is not used: the token has its own.
func (s *rsaSigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), digest, opts)
}

// SignContext is Sign, giving up (backend.ErrBusy) when ctx ends before a session is
// free (backend.ContextSigner).
func (s *rsaSigner) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	k := s.k
	if opts == nil {
		return nil, k.fail("signing (RSA)", errNilOpts)
	}
	if pss, ok := opts.(*rsa.PSSOptions); ok {
		hi, err := rsaHash(pss.Hash, digest)
		if err != nil {
			return nil, k.fail("signing (RSA-PSS)", err)
		}
		if !k.b.mechs[pkcs11.CKM_RSA_PKCS_PSS] {
			return nil, k.fail("signing (RSA-PSS)", &MechanismError{Token: k.b.tokenLabel, Mechanism: "CKM_RSA_PKCS_PSS", For: "RSA-PSS signatures"})
		}
		mech := hi.pss
		switch sl := pss.SaltLength; {
		case sl == rsa.PSSSaltLengthEqualsHash, sl == rsa.PSSSaltLengthAuto, sl == pss.Hash.Size():
		case sl > 0:
			mech = pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_PSS, pkcs11.NewPSSParams(hi.mech, hi.mgf, uint(sl)))
		default:
			return nil, k.fail("signing (RSA-PSS)", fmt.Errorf("invalid salt length %d", sl))
		}
		sig, err := k.b.op(ctx, k, false, mech, digest)
		if err != nil {
			return nil, k.fail("signing (CKM_RSA_PKCS_PSS)", err)
		}
		return sig, nil
	}
	hi, err := rsaHash(opts.HashFunc(), digest)
	if err != nil {
		return nil, k.fail("signing (RSA PKCS #1 v1.5)", err)
	}
	in := make([]byte, 0, len(hi.prefix)+len(digest))
	in = append(append(in, hi.prefix...), digest...)
	sig, err := k.b.op(ctx, k, false, mechRSAPKCS, in)
	if err != nil {
		return nil, k.fail("signing (CKM_RSA_PKCS)", err)
	}
	return sig, nil
}

// Decrypt decrypts an RSAES-PKCS1-v1_5 ciphertext. opts is ignored: the caller
// handles TLS session-key semantics.
func (s *rsaSigner) Decrypt(_ io.Reader, ciphertext []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	return s.DecryptContext(context.Background(), ciphertext, opts)
}

// DecryptContext is Decrypt, giving up (backend.ErrBusy) when ctx ends before a
// session is free (backend.ContextDecrypter).
func (s *rsaSigner) DecryptContext(ctx context.Context, ciphertext []byte, _ crypto.DecrypterOpts) ([]byte, error) {
	k := s.k
	if len(ciphertext) != k.size {
		return nil, k.fail("decrypting (CKM_RSA_PKCS)", fmt.Errorf("ciphertext is %d bytes, the modulus %d", len(ciphertext), k.size))
	}
	pt, err := k.b.op(ctx, k, true, mechRSAPKCS, ciphertext)
	if err != nil {
		return nil, k.fail("decrypting (CKM_RSA_PKCS)", err)
	}
	return pt, nil
}

// ecdsaSigner is an ECDSA key on the token.
type ecdsaSigner struct{ k *keyObject }

func (s *ecdsaSigner) Public() crypto.PublicKey { return s.k.pub }

// Sign signs digest with CKM_ECDSA and returns an ASN.1 DER signature.
func (s *ecdsaSigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), digest, opts)
}

// SignContext is Sign, giving up (backend.ErrBusy) when ctx ends before a session is
// free (backend.ContextSigner).
func (s *ecdsaSigner) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	k := s.k
	if opts == nil {
		return nil, k.fail("signing (ECDSA)", errNilOpts)
	}
	if h := opts.HashFunc(); h != 0 && len(digest) != h.Size() {
		return nil, k.fail("signing (ECDSA)", fmt.Errorf("digest is %d bytes, %v needs %d", len(digest), h, h.Size()))
	}
	if len(digest) == 0 || len(digest) > 64 {
		return nil, k.fail("signing (ECDSA)", fmt.Errorf("digest is %d bytes", len(digest)))
	}
	raw, err := k.b.op(ctx, k, false, mechECDSA, digest)
	if err != nil {
		return nil, k.fail("signing (CKM_ECDSA)", err)
	}
	if len(raw) != 2*k.size {
		return nil, k.fail("signing (CKM_ECDSA)", fmt.Errorf("token returned a %d-byte signature, want %d", len(raw), 2*k.size))
	}
	return ecdsaDER(raw[:k.size], raw[k.size:]), nil
}

// ecdsaDER encodes SEQUENCE { r INTEGER, s INTEGER } from big-endian r and s.
func ecdsaDER(r, s []byte) []byte {
	r, s = trimInt(r), trimInt(s)
	body := 2 + len(r) + int(r[0]>>7) + 2 + len(s) + int(s[0]>>7)
	out := make([]byte, 0, 3+body)
	out = append(out, 0x30)
	out = appendLen(out, body)
	for _, v := range [][]byte{r, s} {
		out = append(out, 0x02)
		if v[0]&0x80 != 0 {
			out = appendLen(out, len(v)+1)
			out = append(out, 0)
		} else {
			out = appendLen(out, len(v))
		}
		out = append(out, v...)
	}
	return out
}

// trimInt strips leading zeros, keeping at least one byte.
func trimInt(v []byte) []byte {
	for len(v) > 1 && v[0] == 0 {
		v = v[1:]
	}
	if len(v) == 0 {
		return []byte{0}
	}
	return v
}

func appendLen(b []byte, n int) []byte {
	if n < 0x80 {
		return append(b, byte(n))
	}
	return append(b, 0x81, byte(n)) // ECDSA signatures up to P-521 stay below 256 bytes
}

// ed25519Signer is an Ed25519 key on the token.
type ed25519Signer struct{ k *keyObject }

func (s *ed25519Signer) Public() crypto.PublicKey { return s.k.pub }

// Sign signs the whole message with pure Ed25519 (CKM_EDDSA). opts must not ask for
// a hash (Ed25519ph) or a context (Ed25519ctx).
func (s *ed25519Signer) Sign(_ io.Reader, message []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), message, opts)
}

// SignContext is Sign, giving up (backend.ErrBusy) when ctx ends before a session is
// free (backend.ContextSigner).
func (s *ed25519Signer) SignContext(ctx context.Context, message []byte, opts crypto.SignerOpts) ([]byte, error) {
	k := s.k
	if opts == nil {
		return nil, k.fail("signing (Ed25519)", errNilOpts)
	}
	if opts.HashFunc() != 0 {
		return nil, k.fail("signing (Ed25519)", fmt.Errorf("Ed25519ph (hash %v) is not supported; pass crypto.Hash(0)", opts.HashFunc()))
	}
	if o, ok := opts.(*ed25519.Options); ok && o.Context != "" {
		return nil, k.fail("signing (Ed25519)", errors.New("Ed25519ctx is not supported"))
	}
	sig, err := k.b.op(ctx, k, false, mechEdDSA, message)
	if err != nil {
		return nil, k.fail("signing (CKM_EDDSA)", err)
	}
	return sig, nil
}

var (
	_ backend.ContextSigner    = (*rsaSigner)(nil)
	_ backend.ContextDecrypter = (*rsaSigner)(nil)
	_ backend.ContextSigner    = (*ecdsaSigner)(nil)
	_ backend.ContextSigner    = (*ed25519Signer)(nil)
)
