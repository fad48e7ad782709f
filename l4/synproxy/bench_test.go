package synproxy

import (
	"testing"
	"time"
)

// BenchmarkCookie is the cookie of one SYN: two SipHash-2-4 of 44 bytes.
func BenchmarkCookie(b *testing.B) {
	k := NewKeys([]byte("bench"), time.Hour)
	k.Update(1_800_000_000)
	tu := tuple(client4, vip4, 40000, 443)
	var sink uint32
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sink += k.Cookie(&tu, uint32(i), 30_000_000, 3)
	}
	_ = sink
}

// BenchmarkCheck is the check of a good cookie ACK.
func BenchmarkCheck(b *testing.B) {
	k := NewKeys([]byte("bench"), time.Hour)
	k.Update(1_800_000_000)
	tu := tuple(client4, vip4, 40000, 443)
	c := k.Cookie(&tu, 99, 30_000_000, 3)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := k.Check(&tu, 100, c+1, 30_000_000); !ok {
			b.Fatal("cookie refused")
		}
	}
}

// BenchmarkToClient is the translation of a member's data segment with timestamps.
func BenchmarkToClient(b *testing.B) {
	s := segment(b, 5000, 7000, 4000, []byte{1, 1, 8, 10, 0, 0, 0, 100, 0, 0, 0, 200}, make([]byte, 1400))
	d := Delta{SeqDelta: 12345, TSDelta: 678, WShift: 0}
	b.ReportAllocs()
	for b.Loop() {
		if err := d.ToClient(s); err != nil {
			b.Fatal(err)
		}
	}
}
