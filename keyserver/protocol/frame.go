package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Header is the fixed 16-byte head of every frame:
//
//	0      1   2     3      4          8                 16
//	| ver | op | code | flags | body len | request ID      |
//
// All integers are big-endian.
type Header struct {
	Version uint8
	Op      Op
	Code    Code   // CodeOK in requests
	Flags   uint8  // reserved, zero
	Len     uint32 // body length, at most MaxBody
	ID      uint64 // chosen by the client, echoed in the response
}

// ErrTruncated is returned (wrapped) when the stream ends inside a frame.
var ErrTruncated = errors.New("keyserver: truncated frame")

// FrameError is a frame that cannot be read any further: an unsupported version or an
// announced body length above MaxBody. The stream cannot be resynchronised after it,
// so the reader answers Header.ID with Err and closes the connection.
type FrameError struct {
	Header Header
	Err    *Error
}

func (e *FrameError) Error() string { return e.Err.Error() }
func (e *FrameError) Unwrap() error { return e.Err }

// AppendHeader appends h in wire form to dst.
func AppendHeader(dst []byte, h Header) []byte {
	dst = append(dst, h.Version, byte(h.Op), byte(h.Code), h.Flags)
	dst = binary.BigEndian.AppendUint32(dst, h.Len)
	return binary.BigEndian.AppendUint64(dst, h.ID)
}

// ParseHeader decodes a header from the first HeaderLen bytes of b. It returns a
// *FrameError for a version other than Version or a length above MaxBody, and
// ErrTruncated if b is short.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, ErrTruncated
	}
	h := Header{
		Version: b[0],
		Op:      Op(b[1]),
		Code:    Code(b[2]),
		Flags:   b[3],
		Len:     binary.BigEndian.Uint32(b[4:8]),
		ID:      binary.BigEndian.Uint64(b[8:16]),
	}
	if h.Version != Version {
		return h, &FrameError{h, Errorf(CodeBadRequest, "unsupported protocol version %d (want %d)", h.Version, Version)}
	}
	if h.Len > MaxBody {
		return h, &FrameError{h, Errorf(CodeBadRequest, "frame body of %d bytes exceeds the limit of %d", h.Len, MaxBody)}
	}
	return h, nil
}

// AppendFrame appends a whole frame (header with Len set from body, then body) to dst.
func AppendFrame(dst []byte, h Header, body []byte) []byte {
	h.Version = Version
	h.Len = uint32(len(body))
	return append(AppendHeader(dst, h), body...)
}

// ReadFrame reads one frame from r. hdr is scratch space of at least HeaderLen bytes
// (pass nil to allocate). The body is freshly allocated, at most MaxBody bytes.
//
// At a clean end of stream between frames it returns io.EOF. A stream that ends inside
// a frame gives an error wrapping ErrTruncated. A header that cannot be honoured gives
// a *FrameError; the stream is then unusable.
func ReadFrame(r io.Reader, hdr []byte) (Header, []byte, error) {
	if len(hdr) < HeaderLen {
		hdr = make([]byte, HeaderLen)
	}
	hdr = hdr[:HeaderLen]
	if n, err := io.ReadFull(r, hdr); err != nil {
		if err == io.EOF {
			return Header{}, nil, io.EOF
		}
		if err == io.ErrUnexpectedEOF {
			return Header{}, nil, fmt.Errorf("%w: %d of %d header bytes", ErrTruncated, n, HeaderLen)
		}
		return Header{}, nil, err
	}
	h, err := ParseHeader(hdr)
	if err != nil {
		return h, nil, err
	}
	if h.Len == 0 {
		return h, nil, nil
	}
	body := make([]byte, h.Len)
	if n, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return h, nil, fmt.Errorf("%w: %d of %d body bytes of request %d", ErrTruncated, n, h.Len, h.ID)
		}
		return h, nil, err
	}
	return h, body, nil
}
