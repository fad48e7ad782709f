package protocol

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func sampleRequests() []*Request {
	var id KeyID
	for i := range id {
		id[i] = byte(i)
	}
	return []*Request{
		{Op: OpPing, ID: 1, Payload: []byte("ping")},
		{Op: OpPing, ID: 2},
		{Op: OpListKeys, ID: 3},
		{Op: OpPublicKey, ID: 4, KeyID: id},
		{Op: OpRSASignPKCS1, ID: 5, KeyID: id, Hash: HashSHA256, Payload: bytes.Repeat([]byte{1}, 32)},
		{Op: OpRSASignPSS, ID: 6, KeyID: id, Hash: HashSHA384, Payload: bytes.Repeat([]byte{2}, 48)},
		{Op: OpECDSASign, ID: 7, KeyID: id, Hash: HashSHA512, Payload: bytes.Repeat([]byte{3}, 64)},
		{Op: OpEd25519Sign, ID: 8, KeyID: id, Payload: []byte("message")},
		{Op: OpRSADecrypt, ID: 9, KeyID: id, Param: 48, Payload: bytes.Repeat([]byte{4}, 256)},
		{Op: OpImportKey, ID: 1 << 60, Label: "example.com", Payload: []byte("-----BEGIN PRIVATE KEY-----")},
		{Op: OpRSASignPSS, ID: 10, KeyID: id, Hash: HashSHA256, Payload: bytes.Repeat([]byte{5}, 32), Timeout: 250 * time.Millisecond},
		{Op: OpPing, ID: 11, Payload: []byte("p"), Timeout: time.Millisecond},
		{Op: OpListKeys, ID: 12, Timeout: MaxTimeout},
	}
}

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range sampleRequests() {
		wire := AppendRequest(nil, r)
		h, body, err := ReadFrame(bytes.NewReader(wire), nil)
		if err != nil {
			t.Fatalf("%s: %v", r.Op, err)
		}
		got, err := ParseRequest(h, body)
		if err != nil {
			t.Fatalf("%s: %v", r.Op, err)
		}
		if got.Op != r.Op || got.ID != r.ID || got.KeyID != r.KeyID || got.Hash != r.Hash ||
			got.Param != r.Param || got.Label != r.Label || !bytes.Equal(got.Payload, r.Payload) || got.Timeout != r.Timeout {
			t.Errorf("%s: round trip gave %+v, want %+v", r.Op, got, r)
		}
	}
}

func TestReadFrameErrors(t *testing.T) {
	valid := AppendRequest(nil, &Request{Op: OpPing, ID: 77, Payload: []byte("abcdef")})
	oversized := AppendHeader(nil, Header{Version: Version, Op: OpPing, Len: MaxBody + 1, ID: 78})
	badVersion := append([]byte{2}, valid[1:]...)
	cases := []struct {
		name   string
		in     []byte
		is     error
		wantID uint64
	}{
		{"empty stream", nil, io.EOF, 0},
		{"short header", valid[:7], ErrTruncated, 0},
		{"short body", valid[:len(valid)-1], ErrTruncated, 77},
		{"oversized", oversized, ErrBadRequest, 78},
		{"bad version", badVersion, ErrBadRequest, 77},
	}
	for _, tc := range cases {
		h, _, err := ReadFrame(bytes.NewReader(tc.in), nil)
		if !errors.Is(err, tc.is) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.is)
		}
		if h.ID != tc.wantID {
			t.Errorf("%s: header ID %d, want %d", tc.name, h.ID, tc.wantID)
		}
	}
}

func TestParseRequestRejects(t *testing.T) {
	var id KeyID
	cases := []struct {
		name string
		h    Header
		body []byte
		want string
	}{
		{"unknown op", Header{Op: 0x55}, nil, "unknown operation 0x55"},
		{"unknown flag", Header{Op: OpPing, Flags: 2}, nil, "flags 0 or 0x01"},
		{"deadline cut short", Header{Op: OpPing, Flags: FlagDeadline}, []byte{0, 0, 1}, "shorter than its 4-byte deadline"},
		{"deadline of zero", Header{Op: OpPing, Flags: FlagDeadline}, []byte{0, 0, 0, 0}, "deadline of 0 ms"},
		{"deadline before a short key prefix", Header{Op: OpPublicKey, Flags: FlagDeadline}, append([]byte{0, 0, 0, 9}, id[:]...), "shorter than the 35-byte key prefix"},
		{"short key prefix", Header{Op: OpPublicKey}, make([]byte, 10), "shorter than the 35-byte key prefix"},
		{"digest length", Header{Op: OpRSASignPKCS1}, append(append(id[:], byte(HashSHA256), 0, 0), 1, 2, 3), "digest must be 32 bytes, have 3"},
		{"unknown hash", Header{Op: OpECDSASign}, append(id[:], 9, 0, 0), "unsupported hash hash_9"},
		{"ed25519 with hash", Header{Op: OpEd25519Sign}, append(id[:], byte(HashSHA256), 0, 0), "hash and parameter must be zero"},
		{"empty ciphertext", Header{Op: OpRSADecrypt}, append(id[:], 0, 0, 48), "empty ciphertext"},
		{"list with body", Header{Op: OpListKeys}, []byte{1}, "body must be empty"},
		{"import label overrun", Header{Op: OpImportKey}, []byte{0, 9, 'a'}, "bad label length 9"},
		{"import without key", Header{Op: OpImportKey}, []byte{0, 1, 'a'}, "no key"},
	}
	for _, tc := range cases {
		_, err := ParseRequest(tc.h, tc.body)
		if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want bad_request containing %q", tc.name, err, tc.want)
		}
	}
}

// TestDeadlineOnTheWire: a request's Timeout travels as FlagDeadline and whole
// milliseconds, rounded up, before the op's own body, which is otherwise unchanged.
func TestDeadlineOnTheWire(t *testing.T) {
	r := &Request{Op: OpPing, ID: 5, Payload: []byte("xy")}
	plain := AppendRequest(nil, r)
	r.Timeout = 1500*time.Microsecond + 1
	wire := AppendRequest(nil, r)
	if wire[3] != FlagDeadline || len(wire) != len(plain)+DeadlineLen ||
		!bytes.Equal(wire[HeaderLen:HeaderLen+DeadlineLen], []byte{0, 0, 0, 2}) || !bytes.Equal(wire[HeaderLen+DeadlineLen:], plain[HeaderLen:]) {
		t.Fatalf("wire %x (without the deadline %x)", wire, plain)
	}
	h, body, err := ReadFrame(bytes.NewReader(wire), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseRequest(h, body)
	if err != nil || got.Timeout != 2*time.Millisecond || string(got.Payload) != "xy" {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	r.Timeout = 2000 * time.Hour
	if got := AppendRequest(nil, r); !bytes.Equal(got[HeaderLen:HeaderLen+DeadlineLen], []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("a deadline past MaxTimeout: %x", got)
	}
	if CodeDeadlineExceeded.String() != "deadline_exceeded" || !errors.Is(Errorf(CodeDeadlineExceeded, "late"), ErrDeadlineExceeded) {
		t.Error("deadline_exceeded code")
	}
}

func TestErrorResponse(t *testing.T) {
	wire := AppendError(nil, OpECDSASign, 9, Errorf(CodeKeyNotFound, "no key %d", 1))
	h, body, err := ReadFrame(bytes.NewReader(wire), nil)
	if err != nil {
		t.Fatal(err)
	}
	rerr := ResponseError(h, body)
	if !errors.Is(rerr, ErrKeyNotFound) || errors.Is(rerr, ErrNotAuthorized) || h.ID != 9 || h.Op != OpECDSASign {
		t.Fatalf("got %v (id %d op %s)", rerr, h.ID, h.Op)
	}
	if CodeOf(rerr) != CodeKeyNotFound || CodeOf(errors.New("x")) != CodeInternal || CodeOf(nil) != CodeOK {
		t.Error("CodeOf maps wrongly")
	}
	long := AppendError(nil, OpPing, 1, &Error{Code: CodeInternal, Message: strings.Repeat("x", 5000)})
	if len(long) != HeaderLen+MaxErrorMessage {
		t.Errorf("error message not bounded: %d bytes", len(long))
	}
}

func TestKeyList(t *testing.T) {
	keys := []KeyInfo{{ID: KeyID{1}, Type: KeyRSA, Label: "a"}, {ID: KeyID{2}, Type: KeyECDSA, Label: ""}, {ID: KeyID{3}, Type: KeyEd25519, Label: strings.Repeat("l", 300)}}
	got, err := ParseKeyList(AppendKeyList(nil, keys))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != keys[0] || got[1] != keys[1] || len(got[2].Label) != MaxLabel {
		t.Errorf("got %+v", got)
	}
	if _, err := ParseKeyList([]byte{0xff, 0xff, 1, 2}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("huge count: %v", err)
	}
}

func TestKeyIDText(t *testing.T) {
	id := KeyIDFromSPKI([]byte("spki"))
	back, err := ParseKeyID(id.String())
	if err != nil || back != id {
		t.Fatalf("%v %v", back, err)
	}
	for _, bad := range []string{"", "zz", strings.Repeat("g", 64)} {
		if _, err := ParseKeyID(bad); err == nil {
			t.Errorf("ParseKeyID(%q) accepted", bad)
		}
	}
}

func BenchmarkRequestRoundTrip(b *testing.B) {
	r := sampleRequests()[4]
	buf := make([]byte, 0, 256)
	hdr := make([]byte, HeaderLen)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendRequest(buf[:0], r)
		h, body, err := ReadFrame(bytes.NewReader(buf), hdr)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ParseRequest(h, body); err != nil {
			b.Fatal(err)
		}
	}
}
