package protocol

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to the frame reader and request parser the server
// runs on every connection. It must never panic, allocate more than MaxBody per frame,
// or return an error that is not typed; what it accepts must re-encode to itself.
func FuzzDecode(f *testing.F) {
	for _, r := range sampleRequests() {
		f.Add(AppendRequest(nil, r))
	}
	f.Add(AppendHeader(nil, Header{Version: Version, Op: OpPing, Len: 1 << 31}))
	f.Add(AppendHeader(nil, Header{Version: 0, Op: OpPing}))
	f.Add([]byte{1, 0x10, 0, 0, 0, 0, 0, 3})
	// Deadline flag: a zero deadline, one cut short, and another flag.
	f.Add(AppendFrame(nil, Header{Op: OpPing, Flags: FlagDeadline}, []byte{0, 0, 0, 0, 'x'}))
	f.Add(AppendFrame(nil, Header{Op: OpListKeys, Flags: FlagDeadline}, []byte{0, 1}))
	f.Add(AppendFrame(nil, Header{Op: OpPing, Flags: 3}, []byte{0, 0, 0, 1}))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		hdr := make([]byte, HeaderLen)
		for i := 0; i < 64; i++ {
			h, body, err := ReadFrame(r, hdr)
			if err != nil {
				var fe *FrameError
				if err != io.EOF && !errors.Is(err, ErrTruncated) && !errors.As(err, &fe) {
					t.Fatalf("untyped error %v", err)
				}
				return
			}
			if len(body) > MaxBody || len(body) != int(h.Len) {
				t.Fatalf("body of %d bytes for length %d", len(body), h.Len)
			}
			req, err := ParseRequest(h, body)
			if err != nil {
				if !errors.Is(err, ErrBadRequest) {
					t.Fatalf("untyped parse error %v", err)
				}
				continue
			}
			again := AppendRequest(nil, req)
			if want := AppendFrame(nil, h, body); !bytes.Equal(again, want) {
				t.Fatalf("accepted frame re-encodes differently:\n got %x\nwant %x", again, want)
			}
		}
	})
}

// FuzzParseKeyList checks the client's decoder of ListKeys answers.
func FuzzParseKeyList(f *testing.F) {
	f.Add(AppendKeyList(nil, []KeyInfo{{ID: KeyID{1}, Type: KeyRSA, Label: "a"}}))
	f.Add([]byte{0, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := ParseKeyList(data)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if again := AppendKeyList(nil, keys); !bytes.Equal(again, data) {
			t.Fatalf("re-encodes differently: %x vs %x", again, data)
		}
	})
}
