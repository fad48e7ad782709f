package wire

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// refChecksum is RFC 1071 word by word.
func refChecksum(b []byte, initial uint32) uint16 {
	s := initial
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
		s = s&0xffff + s>>16
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func TestChecksumKnown(t *testing.T) {
	// RFC 1071 section 3 example: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
	if got := Checksum([]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}, 0); got != ^uint16(0xddf2) {
		t.Errorf("RFC 1071 example: %#04x, want %#04x", got, ^uint16(0xddf2))
	}
	// A textbook IPv4 header with its checksum b861.
	h := []byte{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}
	if got := Checksum(h, 0); got != 0xb861 {
		t.Errorf("IPv4 header: %#04x, want 0xb861", got)
	}
	h[10], h[11] = 0xb8, 0x61
	if got := Checksum(h, 0); got != 0 {
		t.Errorf("IPv4 header with checksum: %#04x, want 0", got)
	}
	if got := Checksum(nil, 0); got != 0xffff {
		t.Errorf("empty: %#04x", got)
	}
	if got := Checksum([]byte{0xff, 0xff}, 0xffff); got != 0 {
		t.Errorf("all ones: %#04x", got)
	}
}

func TestChecksumMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 300 {
		for range 5 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			init := r.Uint32() >> r.IntN(33)
			if r.IntN(4) == 0 {
				// Long runs of 0xff stress the carries.
				for i := range b {
					b[i] = 0xff
				}
			}
			if got, want := Checksum(b, init), refChecksum(b, init); got != want {
				t.Fatalf("len %d init %#x: %#04x, want %#04x", n, init, got, want)
			}
		}
	}
}

// TestSumSplits checks that summing a buffer in two parts at an even offset, with the
// accumulator carried over, is summing it whole.
func TestSumSplits(t *testing.T) {
	b := bytes.Repeat([]byte{0xff, 0xfe, 0x01, 0x80, 0x7f}, 41)
	for i := 0; i <= len(b); i += 2 {
		if got, want := Fold(Sum(b[i:], Sum(b[:i], 0))), Fold(Sum(b, 0)); got != want {
			t.Fatalf("split at %d: %#04x, whole %#04x", i, got, want)
		}
	}
}

func BenchmarkChecksum1500(b *testing.B) {
	buf := bytes.Repeat([]byte{0xa5, 0x5a, 0xff}, 500)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		Checksum(buf, 0)
	}
}
