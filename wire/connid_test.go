package wire

import (
	"bytes"
	"errors"
	"testing"
)

func TestConnIDEncodeDecode(t *testing.T) {
	for _, id := range []uint16{1, 2, 0x00ff, 0x0100, 4242, 0xfffe, 0xffff} {
		var b [ConnIDLen + 4]byte
		if err := EncodeConnID(b[:], id); err != nil {
			t.Fatalf("EncodeConnID(%d): %v", id, err)
		}
		if b[0] != 0x07 {
			t.Errorf("EncodeConnID(%d): first byte %#x, want 0x07", id, b[0])
		}
		if b[1] != byte(id>>8) || b[2] != byte(id) {
			t.Errorf("EncodeConnID(%d): server ID bytes % x", id, b[1:3])
		}
		if !bytes.Equal(b[ConnIDLen:], make([]byte, 4)) {
			t.Errorf("EncodeConnID(%d) wrote past ConnIDLen: % x", id, b)
		}
		for _, in := range [][]byte{b[:ConnIDLen], b[:]} {
			got, ok := DecodeConnID(in)
			if !ok || got != id {
				t.Errorf("DecodeConnID(% x) = %d, %v; want %d, true", in, got, ok, id)
			}
		}
	}
}

func TestConnIDEncodeErrors(t *testing.T) {
	if err := EncodeConnID(make([]byte, ConnIDLen-1), 1); !errors.Is(err, ErrConnIDShort) {
		t.Errorf("short dst: %v, want ErrConnIDShort", err)
	}
	if err := EncodeConnID(make([]byte, ConnIDLen), 0); !errors.Is(err, ErrServerID) {
		t.Errorf("server ID 0: %v, want ErrServerID", err)
	}
}

func TestConnIDNonceVaries(t *testing.T) {
	seen := map[[ConnIDLen]byte]bool{}
	for range 1000 {
		var b [ConnIDLen]byte
		if err := EncodeConnID(b[:], 7); err != nil {
			t.Fatal(err)
		}
		if seen[b] {
			t.Fatalf("connection ID % x issued twice", b)
		}
		seen[b] = true
	}
}

func TestConnIDNotOurs(t *testing.T) {
	for _, tc := range []struct {
		name string
		cid  []byte
	}{
		{"empty", nil},
		{"short", []byte{0x07, 0x00, 0x01, 1, 2, 3, 4}},
		{"rotation 1", []byte{0x27, 0x00, 0x01, 1, 2, 3, 4, 5}},
		{"rotation 7 (unroutable)", []byte{0xe7, 0x00, 0x01, 1, 2, 3, 4, 5}},
		{"length 8", []byte{0x08, 0x00, 0x01, 1, 2, 3, 4, 5, 6}},
		{"length 4", []byte{0x04, 0x00, 0x01, 1, 2, 3, 4, 5}},
		{"server ID 0", []byte{0x07, 0x00, 0x00, 1, 2, 3, 4, 5}},
	} {
		if id, ok := DecodeConnID(tc.cid); ok {
			t.Errorf("%s: DecodeConnID(% x) = %d, true; want not ours", tc.name, tc.cid, id)
		}
	}
}

func BenchmarkDecodeConnID(b *testing.B) {
	cid := []byte{0x07, 0x12, 0x34, 1, 2, 3, 4, 5}
	b.ReportAllocs()
	var sum uint16
	for b.Loop() {
		id, _ := DecodeConnID(cid)
		sum += id
	}
	_ = sum
}
