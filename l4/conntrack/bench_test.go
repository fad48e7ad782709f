package conntrack

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// fill inserts n established entries with random keys and returns the keys and hashes.
func fill(b *testing.B, tb *Table, n int) ([]Key, []uint64) {
	b.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]Key, n)
	hashes := make([]uint64, n)
	for i := range keys {
		k := &keys[i]
		for j := 0; j < 16; j += 8 {
			v := r.Uint64()
			for x := range 8 {
				k.Client[j+x] = byte(v >> (8 * x))
			}
		}
		k.ClientPort = uint16(r.Uint32())
		k.Rule = uint16(r.IntN(8))
		hashes[i] = testHash(k)
		if _, ok := tb.Insert(k, hashes[i], uint16(i%100), StateEstablished, 1); !ok {
			b.Fatal("insert failed")
		}
	}
	return keys, hashes
}

// shuffle reorders keys and hashes together, so that walking them in order visits the
// table's entries (allocated in insertion order) at random.
func shuffle(keys []Key, hashes []uint64) {
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(keys), func(i, j int) {
		keys[i], keys[j] = keys[j], keys[i]
		hashes[i], hashes[j] = hashes[j], hashes[i]
	})
}

// BenchmarkLookupHit1M is the established path: LookupTCP (ACK) of random flows in a
// table of 1,000,000 (44 MiB), so nearly every probe misses the CPU caches twice (the
// bucket and the entry).
func BenchmarkLookupHit1M(b *testing.B) {
	const n = 1_000_000
	tb := newTable(b, n)
	keys, hashes := fill(b, tb, n)
	shuffle(keys, hashes)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok := tb.LookupTCP(&keys[i], hashes[i], ack, 2); !ok {
			b.Fatal("miss")
		}
		if i++; i == n {
			i = 0
		}
	}
}

// BenchmarkLookupHit1MBurst is BenchmarkLookupHit1M the way a packet loop runs it: a
// burst of 32 prefetched, then looked up. One op is one burst; lookup-ns is per lookup.
func BenchmarkLookupHit1MBurst(b *testing.B) {
	const n, burst = 1_000_000, 32
	tb := newTable(b, n)
	keys, hashes := fill(b, tb, n)
	shuffle(keys, hashes)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ks, hs := keys[i:i+burst], hashes[i:i+burst]
		for _, h := range hs {
			tb.Prefetch(h)
		}
		for j := range ks {
			if _, ok := tb.LookupTCP(&ks[j], hs[j], ack, 2); !ok {
				b.Fatal("miss")
			}
		}
		if i += burst; i+burst > n {
			i = 0
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*burst), "lookup-ns")
}

// BenchmarkLookupMiss1M is the first packet of a new flow: LookupTCP (SYN) of absent
// keys in a table of 1,000,000.
func BenchmarkLookupMiss1M(b *testing.B) {
	const n = 1_000_000
	tb := newTable(b, n)
	fill(b, tb, n)
	b.ReportAllocs()
	var seq int
	for b.Loop() {
		k := testKey(seq)
		if _, ok := tb.LookupTCP(&k, testHash(&k), syn, 2); ok {
			b.Fatal("hit")
		}
		seq++
	}
}

// BenchmarkLookupHitSmall is the same with 10,000 entries, which fit in cache: the cost
// of the code itself.
func BenchmarkLookupHitSmall(b *testing.B) {
	const n = 10_000
	tb := newTable(b, n)
	keys, hashes := fill(b, tb, n)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok := tb.LookupTCP(&keys[i], hashes[i], ack, 2); !ok {
			b.Fatal("miss")
		}
		if i++; i == n {
			i = 0
		}
	}
}

// BenchmarkInsertNew is the new-flow path in steady state: a lookup that misses, an
// insert of a half-open entry, the ACK that establishes it, and the reaper every 32
// flows. The clock advances so that flows expire (established timeout 20 s) at the rate
// they arrive, keeping a 1,000,000-entry table about 80 % full.
func BenchmarkInsertNew(b *testing.B) {
	const capacity = 1_000_000
	tb, err := New(Config{Capacity: capacity, Timeouts: Timeouts{Established: 20e9}})
	if err != nil {
		b.Fatal(err)
	}
	perSecond := uint64(capacity * 8 / 10 / 20)
	b.ReportAllocs()
	var seq uint64
	for b.Loop() {
		now := uint32(seq / perSecond)
		k := testKey(int(seq))
		k.Rule = uint16(seq >> 24)
		h := testHash(&k)
		if _, ok := tb.LookupTCP(&k, h, syn, now); ok {
			b.Fatal("new flow found")
		}
		if _, ok := tb.Insert(&k, h, uint16(seq), StateSynRecv, now); !ok {
			b.Fatal("insert failed")
		}
		tb.LookupTCP(&k, h, ack, now)
		if seq%32 == 0 {
			tb.Expire(now, 64)
		}
		seq++
	}
	st := tb.Stats()
	b.ReportMetric(float64(st.Evictions), "evictions")
	b.ReportMetric(float64(tb.Len())/capacity*100, "%full")
}

// BenchmarkInsertSYNFlood inserts half-open entries into a full table: every insert
// evicts the least recently seen half-open entry.
func BenchmarkInsertSYNFlood(b *testing.B) {
	const capacity = 1_000_000
	tb := newTable(b, capacity)
	var seq uint64
	for ; seq < capacity; seq++ {
		k := testKey(int(seq))
		k.Rule = uint16(seq >> 24)
		tb.Insert(&k, testHash(&k), 1, StateSynRecv, 1)
	}
	b.ReportAllocs()
	for b.Loop() {
		k := testKey(int(seq))
		k.Rule = uint16(seq >> 24)
		h := testHash(&k)
		if _, ok := tb.LookupTCP(&k, h, syn, 2); ok {
			b.Fatal("new flow found")
		}
		if ev, ok := tb.Insert(&k, h, 1, StateSynRecv, 2); !ok || !ev {
			b.Fatal("insert did not evict")
		}
		seq++
	}
}

// BenchmarkMemory10M builds a table of 10,000,000 connections and reports its memory:
// the allocated bytes per entry and in total, and the Go heap it actually grew by.
func BenchmarkMemory10M(b *testing.B) {
	if testing.Short() {
		b.Skip("builds a 10M-entry table")
	}
	const n = 10_000_000
	var ms0, ms1 runtime.MemStats
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		tb := newTable(b, n)
		for i := range n {
			k := testKey(i)
			k.Rule = uint16(i >> 24)
			if _, ok := tb.Insert(&k, testHash(&k), uint16(i), StateEstablished, 1); !ok {
				b.Fatal("insert failed")
			}
		}
		runtime.ReadMemStats(&ms1)
		b.ReportMetric(float64(tb.MemoryBytes())/n, "bytes/entry")
		b.ReportMetric(float64(tb.MemoryBytes())/(1<<20), "MiB")
		b.ReportMetric(float64(ms1.HeapAlloc-ms0.HeapAlloc)/(1<<20), "heapMiB")
		runtime.KeepAlive(tb)
	}
}
