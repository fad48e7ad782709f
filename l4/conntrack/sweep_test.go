package conntrack

import (
	"testing"
)

// TestSweep removes the entries drop picks, over calls of a few positions, and
// leaves the others findable; a sweep ends with 0.
func TestSweep(t *testing.T) {
	tb, err := New(Config{Capacity: 100})
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int) Key { return Key{Client: [16]byte{15: byte(i)}, ClientPort: uint16(1000 + i), Rule: 1} }
	hash := func(i int) uint64 { return uint64(i)*0x9e3779b97f4a7c15 | 1 }
	for i := range 60 {
		k := key(i)
		if _, ok := tb.Insert(&k, hash(i), uint16(i%3), StateEstablished, 10); !ok {
			t.Fatalf("insert %d", i)
		}
	}
	// A hole: entries deleted before the sweep are skipped.
	for i := 50; i < 55; i++ {
		k := key(i)
		tb.Delete(&k, hash(i))
	}
	var visited, removed int
	pos := uint32(1)
	calls := 0
	for {
		next, r := tb.Sweep(pos, 7, func(k *Key) bool {
			visited++
			return k.Client[15]%2 == 0 // even clients go
		})
		removed += r
		calls++
		if next == 0 {
			break
		}
		if next != pos+7 {
			t.Fatalf("Sweep(%d, 7) went on at %d", pos, next)
		}
		pos = next
	}
	if visited != 55 || removed != 27 || calls != 9 {
		t.Fatalf("visited %d, removed %d in %d calls; want 55, 27, 9", visited, removed, calls)
	}
	if tb.Len() != 28 {
		t.Fatalf("%d entries left, want 28", tb.Len())
	}
	for i := range 60 {
		k := key(i)
		_, _, ok := tb.Lookup(&k, hash(i), 10)
		want := i%2 == 1 && (i < 50 || i >= 55)
		if ok != want {
			t.Errorf("entry %d present %v, want %v", i, ok, want)
		}
	}
	if n := tb.MemberCounts(); n[0]+n[1]+n[2] != 28 {
		t.Errorf("member counts %v add up to %d, want 28", n[:3], n[0]+n[1]+n[2])
	}
	// An empty table's sweep ends at once.
	empty, _ := New(Config{Capacity: 10})
	if next, r := empty.Sweep(0, 5, func(*Key) bool { t.Fatal("drop called"); return false }); next != 0 || r != 0 {
		t.Fatalf("empty table: Sweep = %d, %d", next, r)
	}
}
