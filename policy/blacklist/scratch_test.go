package blacklist

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// heapGrowth returns the bytes f allocated on the Go heap.
func heapGrowth(f func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}

// TestUpdateHeap checks that replacing a large list, from a Builder, text, the
// binary format or by a delta, allocates on the Go heap little more than the Set it
// makes, so that it starts no collection beside the lookups; and that the working
// arrays it mapped are unmapped when it returns.
func TestUpdateHeap(t *testing.T) {
	const n = 300_000
	r := rand.New(rand.NewPCG(7, 7))
	addrs := make([]netip.Addr, n)
	var text bytes.Buffer
	for i := range addrs {
		addrs[i] = a4(r.Uint32()).addr()
		text.WriteString(addrs[i].String())
		text.WriteByte('\n')
	}
	var ref *Set
	{
		var b Builder
		for _, a := range addrs {
			b.AddAddr(a, time.Time{})
		}
		ref = b.Build()
		b.Reset()
	}
	var bin bytes.Buffer
	if err := WriteBinary(&bin, ref); err != nil {
		t.Fatal(err)
	}
	d := &Delta{}
	for i := range 5000 {
		d.Add = append(d.Add, Entry{Prefix: netip.PrefixFrom(a4(r.Uint32()).addr(), 32)})
		d.Remove = append(d.Remove, netip.PrefixFrom(addrs[i], 32))
	}
	before := scratchMapped.Load()
	// The limit: the Set, plus room for the small arrays kept on the heap (chunks
	// and buffers under scratchMinBytes, the delta's own entries).
	limit := uint64(ref.Bytes())*3/2 + 1<<20
	for _, c := range []struct {
		name string
		run  func() (*Set, error)
	}{
		{"Builder", func() (*Set, error) {
			var b Builder
			defer b.Reset()
			for _, a := range addrs {
				b.AddAddr(a, time.Time{})
			}
			return b.Build(), nil
		}},
		{"text", func() (*Set, error) { return Read(bytes.NewReader(text.Bytes())) }},
		{"binary", func() (*Set, error) { return Read(bytes.NewReader(bin.Bytes())) }},
		{"delta", func() (*Set, error) {
			l := NewList("t", Options{})
			l.Replace(ref)
			err := l.Apply(d)
			l.waitFold() // its fold in the background, counted with it
			return l.Snapshot(), err
		}},
		{"WriteBinary", func() (*Set, error) { return ref, WriteBinary(io.Discard, ref) }},
	} {
		var s *Set
		var err error
		grew := heapGrowth(func() { s, err = c.run() })
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if want := ref.Len(); c.name != "delta" && s.Len() != want {
			t.Errorf("%s: %d entries, want %d", c.name, s.Len(), want)
		}
		lim := limit
		if c.name == "delta" {
			lim += uint64(ref.Bytes()) // an overlay, then the tables it is folded into
		}
		if grew > lim {
			t.Errorf("%s: %d bytes allocated on the heap for a set of %d (limit %d)", c.name, grew, s.Bytes(), lim)
		}
		if m := scratchMapped.Load(); m != before {
			t.Errorf("%s: %d bytes still mapped after it returned, want %d", c.name, m, before)
		}
	}
}

// TestBuilderMemoryReleased checks that a Builder dropped without Reset unmaps its
// memory once collected.
func TestBuilderMemoryReleased(t *testing.T) {
	before := scratchMapped.Load()
	func() {
		var b Builder
		r := rand.New(rand.NewPCG(8, 8))
		for range 200_000 {
			b.AddAddr(a4(r.Uint32()).addr(), time.Time{})
		}
		if s := b.Build(); s.Len() == 0 {
			t.Fatal("empty set")
		}
		if scratchMapped.Load() == before {
			t.Fatal("a Builder of 200k entries mapped nothing")
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for scratchMapped.Load() != before {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still mapped by a collected Builder", scratchMapped.Load()-before)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

// TestScratchReused checks that a build takes the mappings the build before it
// handed back (no new mapping, so no page faults), and that they are unmapped once
// no build took or handed back one for a while.
func TestScratchReused(t *testing.T) {
	defer pool.setIdle(0)
	pool.setIdle(time.Hour)
	r := rand.New(rand.NewPCG(9, 9))
	var text bytes.Buffer
	for range 200_000 {
		text.WriteString(a4(r.Uint32()).addr().String())
		text.WriteByte('\n')
	}
	read := func() {
		if _, err := Read(bytes.NewReader(text.Bytes())); err != nil {
			t.Fatal(err)
		}
	}
	read()
	maps := scratchMaps.Load()
	if pool.kept() == 0 {
		t.Fatal("a build of 200k entries kept no mapping for the next")
	}
	read()
	if n := scratchMaps.Load() - maps; n != 0 {
		t.Errorf("the same build again made %d mappings, want 0", n)
	}
	pool.setIdle(10 * time.Millisecond)
	read()
	deadline := time.Now().Add(10 * time.Second)
	for pool.kept() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still kept %v after the last build", pool.kept(), 10*time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
