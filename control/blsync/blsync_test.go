package blsync

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/policy/blacklist"
)

var ctx = context.Background()

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openStore(t testing.TB) *store.Store {
	t.Helper()
	st, err := store.Open(ctx, store.Config{Dir: t.TempDir(), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// randomSet is n random IPv4 addresses (from seed), a few ranges and IPv6
// entries, some expiring in an hour.
func randomSet(seed uint64, n int) *blacklist.Set {
	r := rand.New(rand.NewPCG(seed, 1))
	var b blacklist.Builder
	exp := time.Now().Add(time.Hour)
	for i := 0; i < n; i++ {
		a := netip.AddrFrom4([4]byte{byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32()), byte(r.Uint32())})
		if i%10 == 0 {
			b.AddAddr(a, exp)
		} else {
			b.AddAddr(a, time.Time{})
		}
	}
	b.Add(netip.MustParsePrefix("198.51.100.0/24"), time.Time{})
	b.Add(netip.MustParsePrefix("2001:db8::/48"), exp)
	b.AddAddr(netip.MustParseAddr("2001:db8:1::7"), time.Time{})
	return b.Build()
}

// same reports whether two sets hold the same entries.
func same(a, b *blacklist.Set) bool {
	var x, y []blacklist.Entry
	for e := range a.All() {
		x = append(x, e)
	}
	for e := range b.All() {
		y = append(y, e)
	}
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i].Prefix != y[i].Prefix || !x[i].Expires.Equal(y[i].Expires) {
			return false
		}
	}
	return true
}

func keys(t *testing.T, st *store.Store, prefix string) []string {
	t.Helper()
	resp, err := st.Client().Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

func apply(t *testing.T, s *blacklist.Set, ds ...*blacklist.Delta) *blacklist.Set {
	t.Helper()
	l := blacklist.NewList("x", blacklist.Options{})
	l.Replace(s)
	for _, d := range ds {
		if err := l.Apply(d); err != nil {
			t.Fatal(err)
		}
	}
	return l.Snapshot()
}

// TestReplaceAndDelta: a list over several chunks is stored and read back whole;
// a delta is a record beside the manifest; a second replace leaves only its own
// chunks and no delta; versions go up by one per write.
func TestReplaceAndDelta(t *testing.T) {
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet()})
	s1 := randomSet(1, 700_000)
	v, err := w.Replace(ctx, "global", s1, "risk")
	if err != nil || v != 1 {
		t.Fatalf("Replace: %d, %v", v, err)
	}
	m, err := w.Show(ctx, "global")
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Base.Chunks) < 2 || m.Entries != int64(s1.Len()) || m.Who != "risk" {
		t.Fatalf("manifest %+v: want several chunks and %d entries", m, s1.Len())
	}
	for _, c := range m.Base.Chunks {
		if c.Bytes > MaxChunkBytes {
			t.Fatalf("chunk of %d bytes", c.Bytes)
		}
	}
	got, _, err := w.Read(ctx, "global")
	if err != nil || !same(got, s1) {
		t.Fatalf("Read: %v (same %v)", err, err == nil && same(got, s1))
	}

	d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("203.0.113.7/32")}},
		Remove: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/25")}}
	v, err = w.Delta(ctx, "global", d, "risk")
	if err != nil || v != 2 {
		t.Fatalf("Delta: %d, %v", v, err)
	}
	m, _ = w.Show(ctx, "global")
	if m.Version != 2 || m.Base.Version != 1 || m.Deltas.From != 2 || m.Deltas.To != 2 {
		t.Fatalf("manifest after a delta %+v", m)
	}
	w.bases = map[string]cachedBase{} // read from the store, not the cache
	got, _, err = w.Read(ctx, "global")
	if err != nil || !same(got, apply(t, s1, d)) {
		t.Fatalf("Read after a delta: %v", err)
	}
	if !got.Contains(netip.MustParseAddr("203.0.113.7")) || got.Contains(netip.MustParseAddr("198.51.100.3")) || !got.Contains(netip.MustParseAddr("198.51.100.200")) {
		t.Fatal("the delta is not in the list read")
	}

	s2 := randomSet(2, 300_000)
	if v, err = w.Replace(ctx, "global", s2, "risk"); err != nil || v != 3 {
		t.Fatalf("second Replace: %d, %v", v, err)
	}
	m, _ = w.Show(ctx, "global")
	chunks := keys(t, st, chunkPrefix("global"))
	if len(chunks) != len(m.Base.Chunks) {
		t.Fatalf("%d chunk keys for %d chunks: the old ones were not deleted", len(chunks), len(m.Base.Chunks))
	}
	if ds := keys(t, st, deltaPrefix("global")); len(ds) != 0 {
		t.Fatalf("deltas left after a replace: %v", ds)
	}
	lists, err := w.Lists(ctx)
	if err != nil || len(lists) != 1 || lists[0].Name != "global" {
		t.Fatalf("Lists: %v %v", lists, err)
	}
	if _, err := w.Show(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Show of a missing list: %v", err)
	}
	// The same list again writes no chunk: they are addressed by content.
	before := st.Client()
	r0, _ := before.Get(ctx, "x")
	if _, err := w.Replace(ctx, "global", s2, "risk"); err != nil {
		t.Fatal(err)
	}
	r1, _ := before.Get(ctx, "x")
	if writes := r1.Header.Revision - r0.Header.Revision; writes > 2 {
		t.Fatalf("the same list written again took %d writes, want the manifest's only", writes)
	}
}

// TestCompaction: past CompactDeltas the deltas become a new base at the same
// version, and their keys go.
func TestCompaction(t *testing.T) {
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet(), CompactDeltas: 4})
	s := randomSet(3, 1000)
	if _, err := w.Replace(ctx, "l", s, "a"); err != nil {
		t.Fatal(err)
	}
	var ds []*blacklist.Delta
	for i := 0; i < 4; i++ {
		d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 32)}}}
		if i == 3 {
			d.Remove = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/31")}
		}
		ds = append(ds, d)
		if _, err := w.Delta(ctx, "l", d, "a"); err != nil {
			t.Fatal(err)
		}
	}
	w.Wait()
	m, _ := w.Show(ctx, "l")
	if m.Version != 5 || m.Base.Version != 5 || m.Deltas.Count() != 0 {
		t.Fatalf("manifest after compaction %+v", m)
	}
	if left := keys(t, st, deltaPrefix("l")); len(left) != 0 {
		t.Fatalf("deltas left after compaction: %v", left)
	}
	w.bases = map[string]cachedBase{}
	got, _, err := w.Read(ctx, "l")
	if err != nil || !same(got, apply(t, s, ds...)) {
		t.Fatalf("compacted list differs: %v", err)
	}
}

// TestCombine: deltas folded into one have the effect of applying them in turn.
func TestCombine(t *testing.T) {
	s := randomSet(4, 2000)
	p := netip.MustParsePrefix
	ds := []*blacklist.Delta{
		{Add: []blacklist.Entry{{Prefix: p("10.0.0.0/8")}}},
		{Remove: []netip.Prefix{p("10.1.0.0/16")}, Add: []blacklist.Entry{{Prefix: p("192.0.2.1/32")}}},
		{Remove: []netip.Prefix{p("192.0.2.0/24")}, Add: []blacklist.Entry{{Prefix: p("10.1.2.3/32"), Expires: time.Now().Add(time.Hour)}}},
	}
	c, err := combine(ds)
	if err != nil {
		t.Fatal(err)
	}
	if !same(apply(t, s, c), apply(t, s, ds...)) {
		t.Fatal("the combined delta differs from the deltas in turn")
	}
}

// fixture is a writer and a follower over one store.
type listSet struct {
	mu    sync.Mutex
	lists map[string]*blacklist.List
}

func (ls *listSet) get(name string) *blacklist.List {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.lists == nil {
		ls.lists = map[string]*blacklist.List{}
	}
	l := ls.lists[name]
	if l == nil {
		l = blacklist.NewList(name, blacklist.Options{})
		ls.lists[name] = l
	}
	return l
}

func runFollower(t *testing.T, cfg FollowerConfig) (*Follower, func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	f, err := NewFollower(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.Run(c) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return f, stop
}

func waitVersion(t *testing.T, f *Follower, name string, v int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for f.Versions()[name] != v {
		if time.Now().After(deadline) {
			t.Fatalf("list %s at version %d (errors %v), want %d", name, f.Versions()[name], f.Errors(), v)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFollower: a node follows replaces and deltas; restarted behind by many
// deltas it catches up with them; restarted while the store is out of reach it
// enforces the list kept on disk.
func TestFollower(t *testing.T) {
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet()})
	dir := t.TempDir()
	ls := &listSet{}
	changed := make(chan struct{}, 100)
	f, stop := runFollower(t, FollowerConfig{Store: st, Dir: dir, List: ls.get, Changed: func() { changed <- struct{}{} }})
	s1 := randomSet(5, 500_000)
	if _, err := w.Replace(ctx, "global", s1, "a"); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, f, "global", 1)
	if !same(ls.get("global").Snapshot(), s1) {
		t.Fatal("the list in force is not the one written")
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed was not called")
	}
	d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("203.0.113.9/32")}}}
	if _, err := w.Delta(ctx, "global", d, "a"); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, f, "global", 2)
	if !ls.get("global").Contains(netip.MustParseAddr("203.0.113.9")) {
		t.Fatal("the delta is not in force")
	}
	stop()

	// Behind by many deltas.
	want := apply(t, s1, d)
	for i := 0; i < 40; i++ {
		d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 32)}}}
		if i%5 == 4 {
			d.Remove = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i - 2)}), 32)}
		}
		if _, err := w.Delta(ctx, "global", d, "a"); err != nil {
			t.Fatal(err)
		}
		want = apply(t, want, d)
	}
	var logs strings.Builder
	var logMu sync.Mutex
	ls2 := &listSet{}
	f2, stop2 := runFollower(t, FollowerConfig{Store: st, Dir: dir, List: ls2.get,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
	waitVersion(t, f2, "global", 42)
	if !same(ls2.get("global").Snapshot(), want) {
		t.Fatal("the list caught up with deltas differs from the store's")
	}
	logMu.Lock()
	if !strings.Contains(logs.String(), "from=2 by=deltas") {
		t.Errorf("the node did not catch up by deltas from its version on disk:\n%s", logs.String())
	}
	logMu.Unlock()
	stop2()
	time.Sleep(100 * time.Millisecond)

	// The store out of reach: the list on disk is enforced.
	ls3 := &listSet{}
	f3, _ := runFollower(t, FollowerConfig{Dir: dir, List: ls3.get,
		Open: func(context.Context) (*store.Store, error) { return nil, errors.New("the store is down") }})
	waitVersion(t, f3, "global", 42)
	if !same(ls3.get("global").Snapshot(), want) {
		t.Fatal("the list loaded from disk differs")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestCorruptChunk: a chunk whose bytes are not its hash's is refused and
// reported; the list in force stays; once the chunk is right the node follows.
func TestCorruptChunk(t *testing.T) {
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet()})
	dir := t.TempDir()
	s1 := randomSet(6, 1000)
	if _, err := w.Replace(ctx, "global", s1, "a"); err != nil {
		t.Fatal(err)
	}
	ls := &listSet{}
	f, stop := runFollower(t, FollowerConfig{Store: st, Dir: dir, List: ls.get})
	waitVersion(t, f, "global", 1)
	stop()

	s2 := randomSet(7, 1000)
	if _, err := w.Replace(ctx, "global", s2, "a"); err != nil {
		t.Fatal(err)
	}
	m, _ := w.Show(ctx, "global")
	key := ChunkKey("global", m.Base.Chunks[0].SHA256)
	resp, _ := st.Client().Get(ctx, key)
	good := resp.Kvs[0].Value
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 0x40
	if _, err := st.Client().Put(ctx, key, string(bad)); err != nil {
		t.Fatal(err)
	}
	ls2 := &listSet{}
	reg := prometheus.NewRegistry()
	f2, _ := runFollower(t, FollowerConfig{Store: st, Dir: dir, List: ls2.get, Registerer: reg})
	deadline := time.Now().Add(10 * time.Second)
	for f2.Errors()["global"] == "" {
		if time.Now().After(deadline) {
			t.Fatal("the corrupt chunk was not reported")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e := f2.Errors()["global"]; !strings.Contains(e, "corrupt") || !strings.Contains(e, m.Base.Chunks[0].SHA256) {
		t.Fatalf("error %q: want the chunk named as corrupt", e)
	}
	if f2.Versions()["global"] != 1 || !same(ls2.get("global").Snapshot(), s1) {
		t.Fatalf("version %d in force after a corrupt chunk, want 1 kept", f2.Versions()["global"])
	}
	if n := testutil.ToFloat64(f2.refused.WithLabelValues("global")); n != 1 {
		t.Fatalf("tiergate_blsync_refused_total %v, want 1", n)
	}
	if v := testutil.ToFloat64(f2.version.WithLabelValues("global")); v != 1 {
		t.Fatalf("tiergate_blsync_version %v, want 1", v)
	}
	if _, err := st.Client().Put(ctx, key, string(good)); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, f2, "global", 2)
	if !same(ls2.get("global").Snapshot(), s2) || len(f2.Errors()) != 0 {
		t.Fatalf("after the chunk was made right: errors %v", f2.Errors())
	}
}

// TestDiskCacheCorrupt: a list on disk that is not what its record says is not
// loaded.
func TestDiskCacheCorrupt(t *testing.T) {
	dir := t.TempDir()
	s := randomSet(8, 100)
	if err := writeCache(dir, "global", 3, s); err != nil {
		t.Fatal(err)
	}
	if got, v, err := readCache(dir, "global"); err != nil || v != 3 || !same(got, s) {
		t.Fatalf("readCache: %d %v", v, err)
	}
	p := filepath.Join(dir, "global.bl")
	data, _ := os.ReadFile(p)
	data[20] ^= 1
	os.WriteFile(p, data, 0o600)
	if _, _, err := readCache(dir, "global"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("readCache of a changed file: %v", err)
	}
}

// TestFollowerBehindCompaction: a node whose version is older than the base (its
// deltas compacted away) fetches the base and the deltas after it; when the
// store it was given is closed, Run returns.
func TestFollowerBehindCompaction(t *testing.T) {
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet(), CompactDeltas: 5})
	dir := t.TempDir()
	s := randomSet(11, 5000)
	if _, err := w.Replace(ctx, "global", s, "a"); err != nil {
		t.Fatal(err)
	}
	ls := &listSet{}
	f, stop := runFollower(t, FollowerConfig{Store: st, Dir: dir, List: ls.get})
	waitVersion(t, f, "global", 1)
	stop()
	want := s
	for i := 0; i < 7; i++ {
		d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 32)}}}
		if _, err := w.Delta(ctx, "global", d, "a"); err != nil {
			t.Fatal(err)
		}
		want = apply(t, want, d)
		if i == 4 {
			w.Wait()
		}
	}
	m, _ := w.Show(ctx, "global")
	if m.Base.Version != 6 || m.Deltas.From != 7 || m.Deltas.To != 8 {
		t.Fatalf("manifest %+v: want a base at 6 and deltas 7 and 8", m)
	}
	var logs strings.Builder
	var mu sync.Mutex
	ls2 := &listSet{}
	f2, err := NewFollower(FollowerConfig{Store: st, Dir: dir, List: ls2.get, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f2.Run(context.Background()) }()
	waitVersion(t, f2, "global", 8)
	if !same(ls2.get("global").Snapshot(), want) {
		t.Fatal("the list built from the new base and deltas differs")
	}
	mu.Lock()
	if !strings.Contains(logs.String(), "from=1 by=base") {
		t.Errorf("not caught up by the base:\n%s", logs.String())
	}
	mu.Unlock()
	st.Close()
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Run after the store closed: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the store was closed")
	}
}

// TestQuota: a replace that would take the store past its share of the quota is
// refused with store.ErrNoSpace, and nothing of it is stored.
func TestQuota(t *testing.T) {
	st, err := store.Open(ctx, store.Config{Dir: t.TempDir(), Logger: quiet(), QuotaBackendBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := NewWriter(st, WriterConfig{Logger: quiet(), QuotaShare: 0.05}) // 3.2 MiB
	if _, err := w.Replace(ctx, "small", randomSet(12, 1000), "a"); err != nil {
		t.Fatal(err)
	}
	_, err = w.Replace(ctx, "big", randomSet(13, 2_000_000), "a")
	if !errors.Is(err, store.ErrNoSpace) || !strings.Contains(err.Error(), "quota") {
		t.Fatalf("a replace past the quota's share: %v", err)
	}
	if ks := keys(t, st, Prefix+"big/"); len(ks) != 0 {
		t.Fatalf("keys of the refused list: %v", ks)
	}
}

// TestConcurrentWriters: two writers (two controld) replacing and changing one
// list at once leave a manifest whose every chunk exists, no chunk it does not
// name, and the versions of every write accepted in order.
func TestConcurrentWriters(t *testing.T) {
	st := openStore(t)
	ws := []*Writer{NewWriter(st, WriterConfig{Logger: quiet(), CompactDeltas: 3}), NewWriter(st, WriterConfig{Logger: quiet(), CompactDeltas: 3})}
	var wg sync.WaitGroup
	var mu sync.Mutex
	versions := map[int64]bool{}
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 6; k++ {
				var v int64
				var err error
				if k%2 == 0 {
					v, err = w.Replace(ctx, "global", randomSet(uint64(100+10*i+k), 150_000), "w")
				} else {
					v, err = w.Delta(ctx, "global", &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(10*i + k)}), 32)}}}, "w")
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if versions[v] {
					t.Errorf("version %d given twice", v)
				}
				versions[v] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, w := range ws {
		w.Wait()
	}
	m, err := ws[0].Show(ctx, "global")
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 12 {
		t.Fatalf("version %d after 12 writes", m.Version)
	}
	named := map[string]bool{}
	for _, c := range m.Base.Chunks {
		named[ChunkKey("global", c.SHA256)] = true
	}
	present := keys(t, st, chunkPrefix("global"))
	for _, k := range present {
		delete(named, k)
	}
	if len(named) != 0 {
		t.Fatalf("the manifest names missing chunks: %v", named)
	}
	ws[0].bases = map[string]cachedBase{}
	if _, _, err := ws[0].Read(ctx, "global"); err != nil {
		t.Fatalf("the list does not read back: %v", err)
	}
	if len(present) != len(m.Base.Chunks) {
		t.Logf("%d chunk keys for %d chunks named (left by a writer whose manifest lost)", len(present), len(m.Base.Chunks))
	}
}

// TestFollowerHits: Hits gives, for each list in force, the hits its List
// counted of every source; a list not yet in force is not in it.
func TestFollowerHits(t *testing.T) {
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet()})
	ls := &listSet{}
	f, _ := runFollower(t, FollowerConfig{Store: st, List: ls.get})
	if h := f.Hits(); len(h) != 0 {
		t.Fatalf("Hits before any list: %v", h)
	}
	d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("203.0.113.9/32")}}}
	if _, err := w.Delta(ctx, "global", d, "a"); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, f, "global", 1)
	if h := f.Hits(); len(h) != 1 || h["global"] != 0 {
		t.Fatalf("Hits with no hit: %v", h)
	}
	l := ls.get("global")
	l.Hit(blacklist.SourcePacket)
	l.Hit(blacklist.SourcePacket)
	l.Hit(blacklist.SourceHeader)
	l.Hit("other")
	if h := f.Hits(); h["global"] != 4 {
		t.Fatalf("Hits after 4: %v", h)
	}
}

// TestFollowerVerifyOnly: a verify-only follower reaches each version, by base
// and by delta, with nothing put in its List nor kept on disk, and refuses a
// chunk whose bytes are not its hash's, keeping the version before.
func TestFollowerVerifyOnly(t *testing.T) {
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet()})
	dir := t.TempDir()
	ls := &listSet{}
	f, _ := runFollower(t, FollowerConfig{Store: st, Dir: dir, List: ls.get, VerifyOnly: true})
	if _, err := w.Replace(ctx, "global", randomSet(9, 1_000_000), "a"); err != nil {
		t.Fatal(err)
	}
	m, _ := w.Show(ctx, "global")
	if len(m.Base.Chunks) < 2 {
		t.Fatalf("the base is %d chunk(s), want several", len(m.Base.Chunks))
	}
	waitVersion(t, f, "global", 1)
	d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("203.0.113.9/32")}}}
	if _, err := w.Delta(ctx, "global", d, "a"); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, f, "global", 2)
	if n := ls.get("global").Len(); n != 0 {
		t.Fatalf("a verify-only follower put %d entries in force", n)
	}
	if files, _ := os.ReadDir(dir); len(files) != 0 {
		t.Fatalf("a verify-only follower kept %d files in its Dir", len(files))
	}

	// A replace whose first chunk is not what its hash says: refused.
	if _, err := w.Replace(ctx, "global", randomSet(10, 1_000_000), "a"); err != nil {
		t.Fatal(err)
	}
	m, _ = w.Show(ctx, "global")
	ls2 := &listSet{}
	key := ChunkKey("global", m.Base.Chunks[0].SHA256)
	resp, _ := st.Client().Get(ctx, key)
	bad := append([]byte(nil), resp.Kvs[0].Value...)
	bad[len(bad)/2] ^= 0x40
	if _, err := st.Client().Put(ctx, key, string(bad)); err != nil {
		t.Fatal(err)
	}
	f2, _ := runFollower(t, FollowerConfig{Store: st, List: ls2.get, VerifyOnly: true})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(f2.Errors()["global"], "corrupt") {
		if time.Now().After(deadline) {
			t.Fatalf("the corrupt chunk was not reported: errors %v, versions %v", f2.Errors(), f2.Versions())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v, ok := f2.Versions()["global"]; ok {
		t.Fatalf("version %d counted in force with a corrupt chunk", v)
	}
}

// TestFollowerSavesLatest: versions put in force one after the other are kept on
// disk, the latest of them at the latest saveGap after it, with the follower still
// running.
func TestFollowerSavesLatest(t *testing.T) {
	st := openStore(t)
	w := NewWriter(st, WriterConfig{Logger: quiet()})
	dir := t.TempDir()
	ls := &listSet{}
	f, _ := runFollower(t, FollowerConfig{Store: st, Dir: dir, List: ls.get})
	for i := range 3 {
		d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 32)}}}
		if _, err := w.Delta(ctx, "global", d, "a"); err != nil {
			t.Fatal(err)
		}
		waitVersion(t, f, "global", int64(i+1))
	}
	deadline := time.Now().Add(3 * saveGap)
	for {
		_, v, err := readCache(dir, "global")
		if err == nil && v == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("on disk: version %d (%v), want 3 within %v", v, err, 3*saveGap)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFollowerChecksEarly: the chunks the watch delivers are checked against
// their names (and decoded) as they come, so the manifest's sync reads none of
// them again; one whose bytes are not its name's is not kept, and is refused by
// the sync as corrupt.
func TestFollowerChecksEarly(t *testing.T) {
	s := randomSet(14, 1_000_000)
	chunks, err := encodeChunks(s)
	if err != nil || len(chunks) < 2 {
		t.Fatalf("%d chunks: %v", len(chunks), err)
	}
	m := &Manifest{Name: "global", Version: 1, Base: Base{Version: 1, Entries: int64(s.Len())}}
	for _, verify := range []bool{false, true} {
		f, err := NewFollower(FollowerConfig{Store: openStore(t), List: (&listSet{}).get, VerifyOnly: verify, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		m.Base.Chunks = nil
		for _, c := range chunks {
			m.Base.Chunks = append(m.Base.Chunks, c.ref)
			key := ChunkKey("global", c.ref.SHA256)
			f.seen[key] = c.data
			f.checkEarly(key, c.data)
		}
		// No store client: a chunk not checked early would be read from it.
		got, err := f.base(ctx, nil, m, 1)
		if err != nil {
			t.Fatalf("verify only %v: %v", verify, err)
		}
		if !verify && !same(got, s) {
			t.Fatal("the base built from the chunks checked early is not the list")
		}
		if verify && got != nil {
			t.Fatal("a verify-only base built a list")
		}

		bad := append([]byte(nil), chunks[0].data...)
		bad[len(bad)/2] ^= 0x40
		key := ChunkKey("global", chunks[0].ref.SHA256)
		f.seen[key] = bad // delivered again, corrupt: the good copy checked before goes
		f.checkEarly(key, bad)
		if _, ok := f.early[key]; ok {
			t.Fatalf("verify only %v: a chunk not matching its name was kept", verify)
		}
		if _, err := f.base(ctx, nil, m, 1); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("verify only %v: the base with a corrupt chunk: %v", verify, err)
		}
	}
}
