package blsync

import (
	"os"
	"testing"
	"time"
)

// TestMeasure10M writes a 10M-entry IPv4 list and logs what it costs in the store
// and how long writing and reading it take. It runs with TIERGATE_BLSYNC_10M=1 (a
// minute and some 2 GiB of memory).
func TestMeasure10M(t *testing.T) {
	if os.Getenv("TIERGATE_BLSYNC_10M") == "" {
		t.Skip("set TIERGATE_BLSYNC_10M=1 to measure a 10M list")
	}
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet()})
	s := randomSet(10, 10_000_000)
	eps := st.Client().Endpoints()
	before, err := st.Client().Status(ctx, eps[0])
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := w.Replace(ctx, "big", s, "m"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	time.Sleep(2 * time.Second) // the backend's sizes are updated on its commit interval
	after, _ := st.Client().Status(ctx, eps[0])
	m, _ := w.Show(ctx, "big")
	w.bases = map[string]cachedBase{}
	start = time.Now()
	got, _, err := w.Read(ctx, "big")
	if err != nil || got.Len() != s.Len() {
		t.Fatalf("Read: %v", err)
	}
	t.Logf("10M list: %d entries, %d chunks, %.1f MiB of chunks; store in use %.1f -> %.1f MiB (+%.1f MiB), file %.1f -> %.1f MiB; write %v, read and build %v",
		s.Len(), len(m.Base.Chunks), float64(m.Base.Bytes)/(1<<20), float64(before.DbSizeInUse)/(1<<20), float64(after.DbSizeInUse)/(1<<20),
		float64(after.DbSizeInUse-before.DbSizeInUse)/(1<<20),
		float64(before.DbSize)/(1<<20), float64(after.DbSize)/(1<<20), took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
