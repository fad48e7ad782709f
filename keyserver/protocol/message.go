package protocol

import (
	"encoding/binary"
	"time"
	"unicode/utf8"
)

// keyOpPrefix is the fixed part of a key operation's body: key ID, hash, parameter.
const keyOpPrefix = KeyIDLen + 1 + 2

// MaxErrorMessage bounds the human message of an error response.
const MaxErrorMessage = 1024

// MaxLabel bounds a key label (ImportKey, ListKeys).
const MaxLabel = 255

// Request is a decoded request frame.
type Request struct {
	Op Op
	ID uint64

	// Key operations (PublicKey, sign and decrypt ops).
	KeyID KeyID
	Hash  Hash
	// Param is op-specific: for RSADecrypt, the expected session key length (0 for
	// plain decryption; see protocol.md); zero otherwise.
	Param uint16

	// Payload is the digest to sign, the message (Ed25519), the ciphertext, the ping
	// data, or the PEM key of ImportKey.
	Payload []byte
	// Label names an imported key (ImportKey only).
	Label string

	// Timeout is how long the client still waits for the answer, from when it sent
	// the request: sent as FlagDeadline and a whole number of milliseconds (rounded
	// up, at most MaxTimeout). Zero means none: the server bounds the work by its
	// own limits only. Send it only on a connection that negotiated ALPNDeadline.
	Timeout time.Duration
}

// timeoutMillis is r.Timeout on the wire: whole milliseconds, rounded up, 1 to
// 2^32-1.
func (r *Request) timeoutMillis() uint32 {
	if r.Timeout >= MaxTimeout {
		return 1<<32 - 1
	}
	return uint32((r.Timeout + time.Millisecond - 1) / time.Millisecond)
}

// isKeyOp reports whether op's body starts with the key-operation prefix.
func isKeyOp(op Op) bool {
	switch op {
	case OpPublicKey, OpRSASignPKCS1, OpRSASignPSS, OpRSADecrypt, OpECDSASign, OpEd25519Sign:
		return true
	}
	return false
}

// AppendRequest appends r as a complete frame to dst.
func AppendRequest(dst []byte, r *Request) []byte {
	h := Header{Version: Version, Op: r.Op, ID: r.ID}
	if r.Timeout > 0 {
		h.Flags = FlagDeadline
	}
	start := len(dst)
	dst = AppendHeader(dst, h)
	if r.Timeout > 0 {
		dst = binary.BigEndian.AppendUint32(dst, r.timeoutMillis())
	}
	switch {
	case isKeyOp(r.Op):
		dst = append(dst, r.KeyID[:]...)
		dst = append(dst, byte(r.Hash))
		dst = binary.BigEndian.AppendUint16(dst, r.Param)
		dst = append(dst, r.Payload...)
	case r.Op == OpImportKey:
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(r.Label)))
		dst = append(dst, r.Label...)
		dst = append(dst, r.Payload...)
	default:
		dst = append(dst, r.Payload...)
	}
	binary.BigEndian.PutUint32(dst[start+4:], uint32(len(dst)-start-HeaderLen))
	return dst
}

// ParseRequest decodes the body of a request frame with header h. Errors are *Error
// with CodeBadRequest, naming what is wrong. Payload aliases body.
func ParseRequest(h Header, body []byte) (*Request, error) {
	r := &Request{Op: h.Op, ID: h.ID}
	if h.Code != CodeOK || h.Flags&^FlagDeadline != 0 {
		return r, Errorf(CodeBadRequest, "request %d: code must be zero and flags 0 or 0x%02x (deadline)", h.ID, FlagDeadline)
	}
	if h.Flags&FlagDeadline != 0 {
		if len(body) < DeadlineLen {
			return r, Errorf(CodeBadRequest, "request %d: body of %d bytes is shorter than its %d-byte deadline", h.ID, len(body), DeadlineLen)
		}
		ms := binary.BigEndian.Uint32(body)
		if ms == 0 {
			return r, Errorf(CodeBadRequest, "request %d: deadline of 0 ms", h.ID)
		}
		r.Timeout = time.Duration(ms) * time.Millisecond
		body = body[DeadlineLen:]
	}
	if !h.Op.Known() {
		return r, Errorf(CodeBadRequest, "request %d: unknown operation 0x%02x", h.ID, uint8(h.Op))
	}
	switch {
	case isKeyOp(h.Op):
		if len(body) < keyOpPrefix {
			return r, Errorf(CodeBadRequest, "request %d (%s): body of %d bytes is shorter than the %d-byte key prefix", h.ID, h.Op, len(body), keyOpPrefix)
		}
		copy(r.KeyID[:], body)
		r.Hash = Hash(body[KeyIDLen])
		r.Param = binary.BigEndian.Uint16(body[KeyIDLen+1:])
		r.Payload = body[keyOpPrefix:]
		if err := r.validateKeyOp(); err != nil {
			return r, err
		}
	case h.Op == OpImportKey:
		if len(body) < 2 {
			return r, Errorf(CodeBadRequest, "request %d (import_key): truncated label length", h.ID)
		}
		n := int(binary.BigEndian.Uint16(body))
		if n > MaxLabel || len(body) < 2+n {
			return r, Errorf(CodeBadRequest, "request %d (import_key): bad label length %d", h.ID, n)
		}
		r.Label = string(body[2 : 2+n])
		if !utf8.ValidString(r.Label) {
			return r, Errorf(CodeBadRequest, "request %d (import_key): label is not UTF-8", h.ID)
		}
		r.Payload = body[2+n:]
		if len(r.Payload) == 0 {
			return r, Errorf(CodeBadRequest, "request %d (import_key): no key", h.ID)
		}
	case h.Op == OpListKeys:
		if len(body) != 0 {
			return r, Errorf(CodeBadRequest, "request %d (list_keys): body must be empty", h.ID)
		}
	default: // ping
		r.Payload = body
	}
	return r, nil
}

func (r *Request) validateKeyOp() error {
	switch r.Op {
	case OpPublicKey:
		if r.Hash != HashNone || r.Param != 0 || len(r.Payload) != 0 {
			return Errorf(CodeBadRequest, "request %d (public_key): hash, parameter and payload must be empty", r.ID)
		}
	case OpRSASignPKCS1, OpRSASignPSS, OpECDSASign:
		size := r.Hash.Size()
		if size == 0 {
			return Errorf(CodeBadRequest, "request %d (%s): unsupported hash %s", r.ID, r.Op, r.Hash)
		}
		if len(r.Payload) != size {
			return Errorf(CodeBadRequest, "request %d (%s): %s digest must be %d bytes, have %d", r.ID, r.Op, r.Hash, size, len(r.Payload))
		}
		if r.Param != 0 {
			return Errorf(CodeBadRequest, "request %d (%s): parameter must be zero", r.ID, r.Op)
		}
	case OpEd25519Sign:
		if r.Hash != HashNone || r.Param != 0 {
			return Errorf(CodeBadRequest, "request %d (ed25519_sign): hash and parameter must be zero", r.ID)
		}
	case OpRSADecrypt:
		if r.Hash != HashNone {
			return Errorf(CodeBadRequest, "request %d (rsa_decrypt): hash must be none", r.ID)
		}
		if len(r.Payload) == 0 {
			return Errorf(CodeBadRequest, "request %d (rsa_decrypt): empty ciphertext", r.ID)
		}
	}
	return nil
}

// AppendResponse appends a success response frame for request (op, id) to dst.
func AppendResponse(dst []byte, op Op, id uint64, body []byte) []byte {
	return AppendFrame(dst, Header{Op: op, ID: id}, body)
}

// AppendError appends an error response frame for request (op, id) to dst. The
// message is cut to MaxErrorMessage bytes.
func AppendError(dst []byte, op Op, id uint64, e *Error) []byte {
	msg := e.Message
	if len(msg) > MaxErrorMessage {
		msg = msg[:MaxErrorMessage]
	}
	code := e.Code
	if code == CodeOK {
		code = CodeInternal
	}
	return AppendFrame(dst, Header{Op: op, Code: code, ID: id}, []byte(msg))
}

// ResponseError returns the error carried by a response frame, or nil if h.Code is
// CodeOK.
func ResponseError(h Header, body []byte) error {
	if h.Code == CodeOK {
		return nil
	}
	if len(body) > MaxErrorMessage {
		body = body[:MaxErrorMessage]
	}
	return &Error{Code: h.Code, Message: string(body)}
}

// KeyInfo is one entry of a ListKeys answer.
type KeyInfo struct {
	ID    KeyID
	Type  KeyType
	Label string
}

// AppendKeyList encodes a ListKeys answer body: a 16-bit count, then per key its ID, a
// type byte, a label length byte and the label. Labels are cut to MaxLabel bytes; the
// list is cut where it would exceed MaxBody.
func AppendKeyList(dst []byte, keys []KeyInfo) []byte {
	start := len(dst)
	dst = append(dst, 0, 0)
	n := 0
	for _, k := range keys {
		label := k.Label
		if len(label) > MaxLabel {
			label = label[:MaxLabel]
		}
		if len(dst)-start+KeyIDLen+2+len(label) > MaxBody || n == 0xffff {
			break
		}
		dst = append(dst, k.ID[:]...)
		dst = append(dst, byte(k.Type), byte(len(label)))
		dst = append(dst, label...)
		n++
	}
	binary.BigEndian.PutUint16(dst[start:], uint16(n))
	return dst
}

// ParseKeyList decodes a ListKeys answer body.
func ParseKeyList(b []byte) ([]KeyInfo, error) {
	if len(b) < 2 {
		return nil, Errorf(CodeBadRequest, "key list: truncated count")
	}
	n := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	// Each entry takes at least KeyIDLen+2 bytes: bound the allocation by what is there.
	if n > len(b)/(KeyIDLen+2) {
		return nil, Errorf(CodeBadRequest, "key list: count %d exceeds body", n)
	}
	keys := make([]KeyInfo, 0, n)
	for i := 0; i < n; i++ {
		if len(b) < KeyIDLen+2 {
			return nil, Errorf(CodeBadRequest, "key list: entry %d truncated", i)
		}
		var k KeyInfo
		copy(k.ID[:], b)
		k.Type = KeyType(b[KeyIDLen])
		l := int(b[KeyIDLen+1])
		b = b[KeyIDLen+2:]
		if len(b) < l {
			return nil, Errorf(CodeBadRequest, "key list: entry %d label truncated", i)
		}
		k.Label = string(b[:l])
		b = b[l:]
		keys = append(keys, k)
	}
	if len(b) != 0 {
		return nil, Errorf(CodeBadRequest, "key list: %d trailing bytes", len(b))
	}
	return keys, nil
}
