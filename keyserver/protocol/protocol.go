// Package protocol is the wire format between the L7 tier and keyserverd: fixed-size
// framed messages, each carrying a request ID so that many requests share one
// connection and their responses come back in any order.
//
// The format is specified in protocol.md beside this file. The codec is pure (no I/O
// beyond an io.Reader/io.Writer) and never allocates more than MaxBody bytes for a
// frame, whatever length the peer announces.
package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Version is the protocol version this package speaks. A frame with another version
// is answered with CodeBadRequest.
const Version = 1

// ALPN is the TLS application protocol both sides negotiate: version 1 frames, with
// no request flags.
const ALPN = "tiergate-keyless/1"

// ALPNDeadline is version 1 with request deadlines (FlagDeadline): a server that
// offers it accepts the flag, and a client sends the flag only on a connection that
// negotiated it, so either side may be older than the other. Servers prefer it.
const ALPNDeadline = "tiergate-keyless/1.1"

// FlagDeadline, in a request's flags, says that its body begins with a 4-byte
// deadline: the milliseconds (at least 1) the client still waits for the answer, from
// when it sent the request. Only on connections that negotiated ALPNDeadline.
const FlagDeadline uint8 = 0x01

// DeadlineLen is the size of the deadline field that FlagDeadline puts before a
// request's body.
const DeadlineLen = 4

// MaxTimeout is the longest deadline a request can carry (2^32-1 ms, about 49
// days).
const MaxTimeout = time.Duration(1<<32-1) * time.Millisecond

// HeaderLen is the size of a frame header in bytes.
const HeaderLen = 16

// MaxBody is the largest frame body either side accepts. Larger announced lengths are
// rejected before anything is allocated.
const MaxBody = 64 << 10

// KeyIDLen is the length of a key ID: the SHA-256 of the key's SubjectPublicKeyInfo.
const KeyIDLen = sha256.Size

// Op is the operation a frame asks for (or answers).
type Op uint8

// Operations. Values are part of the wire format and never reused.
const (
	OpPing         Op = 0x01 // echo the body
	OpPublicKey    Op = 0x02 // key ID → SubjectPublicKeyInfo (DER)
	OpListKeys     Op = 0x03 // → key IDs and types the caller may use
	OpRSASignPKCS1 Op = 0x10 // RSA PKCS #1 v1.5 signature over a digest
	OpRSASignPSS   Op = 0x11 // RSA-PSS signature over a digest, salt length = hash length
	OpRSADecrypt   Op = 0x12 // RSA PKCS #1 v1.5 decryption (TLS 1.2 RSA key exchange)
	OpECDSASign    Op = 0x13 // ECDSA signature over a digest (ASN.1 DER result)
	OpEd25519Sign  Op = 0x14 // Ed25519 signature over a whole message
	OpImportKey    Op = 0x20 // admin: store a PEM private key in the backend
	opMax             = 0x21
)

var opNames = map[Op]string{
	OpPing:         "ping",
	OpPublicKey:    "public_key",
	OpListKeys:     "list_keys",
	OpRSASignPKCS1: "rsa_sign_pkcs1",
	OpRSASignPSS:   "rsa_sign_pss",
	OpRSADecrypt:   "rsa_decrypt",
	OpECDSASign:    "ecdsa_sign",
	OpEd25519Sign:  "ed25519_sign",
	OpImportKey:    "import_key",
}

// Known reports whether op is an operation of this protocol version.
func (op Op) Known() bool { _, ok := opNames[op]; return ok }

// String returns the op's metric label, e.g. "rsa_sign_pkcs1".
func (op Op) String() string {
	if n, ok := opNames[op]; ok {
		return n
	}
	return fmt.Sprintf("op_0x%02x", uint8(op))
}

// Ops lists every known operation, in wire order.
func Ops() []Op {
	ops := make([]Op, 0, len(opNames))
	for op := Op(0); op < opMax; op++ {
		if op.Known() {
			ops = append(ops, op)
		}
	}
	return ops
}

// Code is the result of a request: CodeOK, or the reason it failed.
type Code uint8

// Result codes. Values are part of the wire format.
const (
	CodeOK            Code = 0
	CodeKeyNotFound   Code = 1 // no key with that ID on this server
	CodeNotAuthorized Code = 2 // the caller may not use that key or op
	CodeBadRequest    Code = 3 // malformed, oversized, unknown op or version
	CodeCryptoFailure Code = 4 // the backend refused or failed the operation
	CodeOverloaded    Code = 5 // too many requests in flight: retry elsewhere or later
	CodeInternal      Code = 6 // anything else on the server side
	// CodeDeadlineExceeded: the request's deadline (FlagDeadline) passed before the
	// server could do it, so it was dropped; its client has given up on it.
	CodeDeadlineExceeded Code = 7
)

// MaxCode is the highest result code of this version.
const MaxCode = CodeDeadlineExceeded

var codeNames = [...]string{
	CodeOK:            "ok",
	CodeKeyNotFound:   "key_not_found",
	CodeNotAuthorized: "not_authorized",
	CodeBadRequest:    "bad_request",
	CodeCryptoFailure: "crypto_failure",
	CodeOverloaded:    "overloaded",
	CodeInternal:      "internal",

	CodeDeadlineExceeded: "deadline_exceeded",
}

// String returns the code's metric label, e.g. "key_not_found".
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code_%d", uint8(c))
}

// Error is a failed request as carried on the wire: a code and a human message.
// Match codes with errors.Is(err, protocol.ErrKeyNotFound) and friends.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "keyserver: " + e.Code.String()
	}
	return "keyserver: " + e.Code.String() + ": " + e.Message
}

// Is makes errors.Is(err, ErrX) match on the code alone.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == ""
}

// Errorf returns an *Error with code c and a formatted message.
func Errorf(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Message: fmt.Sprintf(format, args...)}
}

// Sentinels for errors.Is.
var (
	ErrKeyNotFound   = &Error{Code: CodeKeyNotFound}
	ErrNotAuthorized = &Error{Code: CodeNotAuthorized}
	ErrBadRequest    = &Error{Code: CodeBadRequest}
	ErrCryptoFailure = &Error{Code: CodeCryptoFailure}
	ErrOverloaded    = &Error{Code: CodeOverloaded}
	ErrInternal      = &Error{Code: CodeInternal}

	ErrDeadlineExceeded = &Error{Code: CodeDeadlineExceeded}
)

// CodeOf returns the wire code for err: the code of an *Error in its chain, or
// CodeInternal.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// KeyID names a key: the SHA-256 of its DER SubjectPublicKeyInfo.
type KeyID [KeyIDLen]byte

// KeyIDFromSPKI returns the ID of the key whose DER SubjectPublicKeyInfo is spki.
func KeyIDFromSPKI(spki []byte) KeyID { return sha256.Sum256(spki) }

// ParseKeyID parses a key ID written as 64 hex digits.
func ParseKeyID(s string) (KeyID, error) {
	var id KeyID
	if len(s) != 2*KeyIDLen {
		return id, fmt.Errorf("key ID %q: want %d hex digits, have %d", s, 2*KeyIDLen, len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("key ID %q: %w", s, err)
	}
	return id, nil
}

// String returns the ID as 64 lower-case hex digits.
func (id KeyID) String() string { return hex.EncodeToString(id[:]) }

// Short returns the first 12 hex digits, for logs.
func (id KeyID) Short() string { return hex.EncodeToString(id[:6]) }

// MarshalText implements encoding.TextMarshaler.
func (id KeyID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *KeyID) UnmarshalText(b []byte) error {
	v, err := ParseKeyID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// Hash names the digest algorithm of a signing request. Values are part of the wire
// format.
type Hash uint8

// Digest algorithms.
const (
	HashNone   Hash = 0 // Ed25519 (the message itself is signed) and decryption
	HashSHA256 Hash = 1
	HashSHA384 Hash = 2
	HashSHA512 Hash = 3
)

// Size returns the digest length in bytes, or 0 for HashNone and unknown values.
func (h Hash) Size() int {
	switch h {
	case HashSHA256:
		return 32
	case HashSHA384:
		return 48
	case HashSHA512:
		return 64
	}
	return 0
}

func (h Hash) String() string {
	switch h {
	case HashNone:
		return "none"
	case HashSHA256:
		return "sha256"
	case HashSHA384:
		return "sha384"
	case HashSHA512:
		return "sha512"
	}
	return fmt.Sprintf("hash_%d", uint8(h))
}

// KeyType names the algorithm of a key in a ListKeys answer.
type KeyType uint8

// Key types.
const (
	KeyRSA     KeyType = 1
	KeyECDSA   KeyType = 2
	KeyEd25519 KeyType = 3
)

func (t KeyType) String() string {
	switch t {
	case KeyRSA:
		return "rsa"
	case KeyECDSA:
		return "ecdsa"
	case KeyEd25519:
		return "ed25519"
	}
	return fmt.Sprintf("keytype_%d", uint8(t))
}
