package synproxy

import "testing"

// The reference vectors of the SipHash paper (appendix A) and its implementation:
// key 00 01 .. 0f, messages 00, 00 01, ...
func TestSipHashVectors(t *testing.T) {
	var k [16]byte
	for i := range k {
		k[i] = byte(i)
	}
	k0 := uint64(0x0706050403020100)
	k1 := uint64(0x0f0e0d0c0b0a0908)
	msg := make([]byte, 64)
	for i := range msg {
		msg[i] = byte(i)
	}
	for _, tc := range []struct {
		n    int
		want uint64
	}{
		{0, 0x726fdb47dd0e0e31},
		{1, 0x74f839c593dc67fd},
		{8, 0x93f5f5799a932462},
		{15, 0xa129ca6149be45e5},
		{63, 0x958a324ceb064572},
	} {
		if got := sipHash(k0, k1, msg[:tc.n]); got != tc.want {
			t.Errorf("SipHash of %d bytes = %#x, want %#x", tc.n, got, tc.want)
		}
	}
}
