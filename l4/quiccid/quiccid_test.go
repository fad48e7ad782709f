package quiccid

import (
	"bytes"
	"errors"
	"testing"
)

func TestEncodeDecode(t *testing.T) {
	for _, id := range []uint16{1, 2, 0x00ff, 0x0100, 4242, 0xfffe, 0xffff} {
		var b [Len + 4]byte
		if err := Encode(b[:], id); err != nil {
			t.Fatalf("Encode(%d): %v", id, err)
		}
		if b[0] != 0x07 {
			t.Errorf("Encode(%d): first byte %#x, want 0x07", id, b[0])
		}
		if b[1] != byte(id>>8) || b[2] != byte(id) {
			t.Errorf("Encode(%d): server ID bytes % x", id, b[1:3])
		}
		if !bytes.Equal(b[Len:], make([]byte, 4)) {
			t.Errorf("Encode(%d) wrote past Len: % x", id, b)
		}
		for _, in := range [][]byte{b[:Len], b[:]} {
			got, ok := Decode(in)
			if !ok || got != id {
				t.Errorf("Decode(% x) = %d, %v; want %d, true", in, got, ok, id)
			}
		}
	}
}

func TestEncodeErrors(t *testing.T) {
	if err := Encode(make([]byte, Len-1), 1); !errors.Is(err, ErrShort) {
		t.Errorf("short dst: %v, want ErrShort", err)
	}
	if err := Encode(make([]byte, Len), 0); !errors.Is(err, ErrServerID) {
		t.Errorf("server ID 0: %v, want ErrServerID", err)
	}
}

func TestNonceVaries(t *testing.T) {
	seen := map[[Len]byte]bool{}
	for range 1000 {
		var b [Len]byte
		if err := Encode(b[:], 7); err != nil {
			t.Fatal(err)
		}
		if seen[b] {
			t.Fatalf("connection ID % x issued twice", b)
		}
		seen[b] = true
	}
}

func TestDecodeNotOurs(t *testing.T) {
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
		if id, ok := Decode(tc.cid); ok {
			t.Errorf("%s: Decode(% x) = %d, true; want not ours", tc.name, tc.cid, id)
		}
	}
}

func TestGenerator(t *testing.T) {
	g := Generator{ServerID: 513}
	if g.ConnectionIDLen() != Len {
		t.Fatalf("ConnectionIDLen = %d", g.ConnectionIDLen())
	}
	c, err := g.GenerateConnectionID()
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != Len {
		t.Fatalf("generated length %d", c.Len())
	}
	if id, ok := Decode(c.Bytes()); !ok || id != 513 {
		t.Fatalf("Decode(generated % x) = %d, %v", c.Bytes(), id, ok)
	}
	if _, err := (Generator{}).GenerateConnectionID(); !errors.Is(err, ErrServerID) {
		t.Fatalf("zero server ID: %v, want ErrServerID", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{0x07, 0x00, 0x01, 1, 2, 3, 4, 5})
	f.Add([]byte{0x07, 0xff, 0xff, 1, 2, 3, 4, 5, 9, 9})
	f.Add([]byte{0x07, 0x00, 0x00, 1, 2, 3, 4, 5})
	f.Add([]byte{0x47, 0x00, 0x01})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, cid []byte) {
		id, ok := Decode(cid)
		if !ok {
			return
		}
		if id == 0 || len(cid) < Len {
			t.Fatalf("Decode(% x) = %d, true", cid, id)
		}
		var b [Len]byte
		if err := Encode(b[:], id); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b[:3], cid[:3]) {
			t.Fatalf("re-encoding %d gives % x, input starts % x", id, b[:3], cid[:3])
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	cid := []byte{0x07, 0x12, 0x34, 1, 2, 3, 4, 5}
	b.ReportAllocs()
	var sum uint16
	for b.Loop() {
		id, _ := Decode(cid)
		sum += id
	}
	_ = sum
}

func BenchmarkGenerate(b *testing.B) {
	g := Generator{ServerID: 9}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.GenerateConnectionID(); err != nil {
			b.Fatal(err)
		}
	}
}
