package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/testkit/testenv"
)

var ctx = context.Background()

// testLogger returns a logger whose output the test prints when it fails.
func testLogger(t testing.TB) *slog.Logger {
	buf := &testenv.LockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// openStore opens an embedded store in dir, closed at the end of the test.
func openStore(t testing.TB, dir string) *store.Store {
	t.Helper()
	s, err := store.Open(ctx, store.Config{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// pool is a pool's JSON: valid with members, invalid without.
func pool(name string, members ...string) []byte {
	var ms []string
	for _, m := range members {
		ms = append(ms, fmt.Sprintf(`{"addr":%q}`, m))
	}
	return fmt.Appendf(nil, `{"name":%q,"members":[%s]}`, name, strings.Join(ms, ","))
}

// recorder is an Apply that records what it was given.
type recorder struct {
	mu    sync.Mutex
	revs  []int64
	pools map[string]int // pool name → members in the last snapshot applied
	// block, when set, is called before recording (outside the lock).
	block func(rev int64)
	fail  func(rev int64) error
}

func (r *recorder) apply(_ context.Context, s *model.Snapshot, rev int64) error {
	if r.block != nil {
		r.block(rev)
	}
	r.mu.Lock()
	fail := r.fail
	r.mu.Unlock()
	if fail != nil {
		if err := fail(rev); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s.Revision != rev {
		return fmt.Errorf("snapshot at %d given as %d", s.Revision, rev)
	}
	r.revs = append(r.revs, rev)
	r.pools = map[string]int{}
	for name, p := range s.Pools {
		r.pools[name] = len(p.Members)
	}
	return nil
}

func (r *recorder) applied() ([]int64, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.revs...), r.pools
}

// start runs a on its own goroutine; the test's end stops it and checks it
// returned ctx's error.
func start(t testing.TB, a *Agent) context.CancelFunc {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return within 10s of its context's end")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// status reads node's status key; ok is false when there is none.
func status(t testing.TB, cli *clientv3.Client, node string) (st Status, lease clientv3.LeaseID, ok bool) {
	t.Helper()
	resp, err := cli.Get(ctx, StatusKey(node))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return Status{}, 0, false
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &st); err != nil {
		t.Fatalf("status %s: %v", resp.Kvs[0].Value, err)
	}
	return st, clientv3.LeaseID(resp.Kvs[0].Lease), true
}

// waitStatus waits (10s at most) for node's status to satisfy ok.
func waitStatus(t testing.TB, cli *clientv3.Client, node, what string, ok func(Status, bool) bool) Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _, found := status(t, cli, node)
		if ok(st, found) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s; status %+v (found %v)", what, st, found)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ack accepts a status that has applied rev or later: a snapshot is read at the
// store's revision, which the node's own status write may have moved past the last
// write of configuration.
func ack(rev int64) func(Status, bool) bool {
	return func(st Status, ok bool) bool { return ok && st.AppliedRevision >= rev && st.Error == "" }
}

func TestAckNack(t *testing.T) {
	s := openStore(t, t.TempDir())
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	a, err := New(Config{Store: s, Node: "l7-a", Role: "l7d", Apply: rec.apply, Logger: testLogger(t), Registerer: reg,
		CacheFile: filepath.Join(t.TempDir(), "snapshot.json")})
	if err != nil {
		t.Fatal(err)
	}
	start(t, a)
	cli := s.Client()

	r1, err := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, cli, "l7-a", "ACK of the good write", ack(r1))
	applied1 := st.AppliedRevision
	if st.Node != "l7-a" || st.Role != "l7d" || st.RefusedRevision != 0 || st.Updated.IsZero() {
		t.Fatalf("status %+v", st)
	}

	// A pool without members fails Validate: written past the model's check, it is
	// refused, Apply is not called, and r1 stays in force.
	r2, err := s.Put(ctx, model.KindPool, "empty", pool("empty"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, cli, "l7-a", "NACK of the invalid write", func(st Status, ok bool) bool { return ok && st.RefusedRevision == r2 })
	if st.AppliedRevision != applied1 || !strings.Contains(st.Error, "pools/empty.members") {
		t.Fatalf("NACK %+v, want applied %d and an error at pools/empty.members", st, applied1)
	}
	if revs, pools := rec.applied(); len(revs) == 0 || revs[len(revs)-1] != applied1 || len(pools) != 1 || pools["app"] != 1 {
		t.Fatalf("applied %v %v after the NACK, want %d in force", revs, pools, applied1)
	}
	if got := testutil.ToFloat64(a.met.nacks); got != 1 {
		t.Fatalf("nacks %v, want 1", got)
	}

	// Apply refusing a snapshot is a NACK too.
	r3, _ := s.Delete(ctx, model.KindPool, "empty", store.Any)
	applied3 := waitStatus(t, cli, "l7-a", "ACK after the fix", ack(r3)).AppliedRevision
	var failed atomic.Bool
	rec.mu.Lock()
	rec.fail = func(rev int64) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("listener busy")
		}
		return nil
	}
	rec.mu.Unlock()
	r4, _ := s.Put(ctx, model.KindPool, "api", pool("api", "198.18.1.2:80"), store.Any)
	st = waitStatus(t, cli, "l7-a", "NACK of Apply's error", func(st Status, ok bool) bool { return ok && st.RefusedRevision == r4 })
	if st.AppliedRevision != applied3 || !strings.Contains(st.Error, "listener busy") {
		t.Fatalf("NACK %+v", st)
	}

	// A later good write is applied whole.
	r5, _ := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80", "198.18.1.3:80"), store.Any)
	applied5 := waitStatus(t, cli, "l7-a", "ACK of the later write", ack(r5)).AppliedRevision
	if _, pools := rec.applied(); len(pools) != 2 || pools["app"] != 2 || pools["api"] != 1 {
		t.Fatalf("pools in force %v", pools)
	}
	if got := testutil.ToFloat64(a.met.applied); got != float64(applied5) {
		t.Fatalf("applied revision gauge %v, want %d", got, applied5)
	}
	if got := testutil.ToFloat64(a.met.nacks); got != 2 {
		t.Fatalf("nacks %v, want 2", got)
	}
}

// TestApplyTriedAgain: a snapshot Apply refused is tried again, with a backoff,
// until Apply takes it, with no new write needed (a keyserver back, an address
// up); the NACK stands meanwhile.
func TestApplyTriedAgain(t *testing.T) {
	s := openStore(t, t.TempDir())
	var calls atomic.Int32
	rec := &recorder{fail: func(int64) error {
		if calls.Add(1) <= 2 {
			return errors.New("no keyserver connection is up")
		}
		return nil
	}}
	a, err := New(Config{Store: s, Node: "l7-a", Apply: rec.apply, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	r1, err := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	start(t, a)
	waitStatus(t, s.Client(), "l7-a", "the NACK", func(st Status, ok bool) bool {
		return ok && st.RefusedRevision >= r1 && strings.Contains(st.Error, "no keyserver")
	})
	st := waitStatus(t, s.Client(), "l7-a", "the ACK once Apply takes it", ack(r1))
	if calls.Load() != 3 || st.Error != "" {
		t.Fatalf("Apply called %d times (want 3), status %+v", calls.Load(), st)
	}
	// 1s, then 2s.
	if d := time.Since(t0); d < 3*time.Second {
		t.Fatalf("applied %v after the start: the backoff (1s, 2s) was not kept", d)
	}
	if got := testutil.ToFloat64(a.met.nacks); got != 1 {
		t.Fatalf("nacks %v, want 1 (tries again are not counted)", got)
	}
}

// TestStatusLease: the status is under a lease of StatusTTL, so it goes away when
// the agent stops keeping it alive, and at once when the agent stops.
func TestStatusLease(t *testing.T) {
	s := openStore(t, t.TempDir())
	a, err := New(Config{Store: s, Node: "l4-a", Role: "l4d", Apply: (&recorder{}).apply, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, a)
	rev, _ := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	cli := s.Client()
	waitStatus(t, cli, "l4-a", "ACK", ack(rev))
	_, lease, _ := status(t, cli, "l4-a")
	ttl, err := cli.TimeToLive(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != int64(StatusTTL/time.Second) || ttl.TTL <= 0 || ttl.TTL > ttl.GrantedTTL {
		t.Fatalf("status lease: granted %ds, left %ds, want %v", ttl.GrantedTTL, ttl.TTL, StatusTTL)
	}
	stop()
	if _, _, ok := status(t, cli, "l4-a"); ok {
		t.Fatal("the status key is still there after the agent stopped")
	}
	if ttl, err := cli.TimeToLive(ctx, lease); err != nil || ttl.TTL != -1 {
		t.Fatalf("lease after the stop: %+v %v, want revoked", ttl, err)
	}
}

// TestStatusReportsNode: the status carries the node's address, its start and the
// certificates it serves, Report writes certificates changed outside an Apply, and
// the seen record, under no lease, outlives the status.
func TestStatusReportsNode(t *testing.T) {
	s := openStore(t, t.TempDir())
	var mu sync.Mutex
	certs := []CertInUse{{Name: "www", Version: 1, SHA256: strings.Repeat("ab", 32)}}
	before := time.Now()
	a, err := New(Config{Store: s, Node: "l7-c", Role: "l7d", Address: "198.18.0.10:443", Apply: (&recorder{}).apply, Logger: testLogger(t),
		Certificates: func() []CertInUse {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(certs)
		}})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, a)
	rev, _ := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	cli := s.Client()
	st := waitStatus(t, cli, "l7-c", "ACK", ack(rev))
	if st.Address != "198.18.0.10:443" || st.Started.Before(before.Add(-time.Second)) || st.Started.After(time.Now()) ||
		len(st.Certificates) != 1 || st.Certificates[0] != certs[0] {
		t.Fatalf("status %+v", st)
	}
	started := st.Started

	// Certificates changed without a configuration change: Report writes them.
	mu.Lock()
	certs = append(certs, CertInUse{Name: "api", Version: 3, SHA256: strings.Repeat("cd", 32)})
	mu.Unlock()
	a.Report()
	st = waitStatus(t, cli, "l7-c", "the new certificates", func(st Status, ok bool) bool { return ok && len(st.Certificates) == 2 })
	if st.Certificates[1].Name != "api" || st.Certificates[1].Version != 3 || !st.Started.Equal(started) {
		t.Fatalf("status %+v", st)
	}

	stop()
	if _, _, ok := status(t, cli, "l7-c"); ok {
		t.Fatal("the status key is still there after the agent stopped")
	}
	resp, err := cli.Get(ctx, SeenKey("l7-c"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("seen record after the stop: %v %v", resp, err)
	}
	var seen Status
	if err := json.Unmarshal(resp.Kvs[0].Value, &seen); err != nil {
		t.Fatal(err)
	}
	if resp.Kvs[0].Lease != 0 || seen.Node != "l7-c" || seen.Address != "198.18.0.10:443" || len(seen.Certificates) != 2 || seen.AppliedRevision < rev {
		t.Fatalf("seen record %+v (lease %x)", seen, resp.Kvs[0].Lease)
	}
}

// TestStatusLeaseLost: when the status lease ends without the agent (expired, as
// etcd revokes it after StatusTTL without a keep-alive), the key goes with it, and
// the agent reports again under a new lease.
func TestStatusLeaseLost(t *testing.T) {
	s := openStore(t, t.TempDir())
	a, err := New(Config{Store: s, Node: "l7-b", Apply: (&recorder{}).apply, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	start(t, a)
	rev, _ := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	cli := s.Client()
	waitStatus(t, cli, "l7-b", "ACK", ack(rev))
	_, lease, _ := status(t, cli, "l7-b")
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := status(t, cli, "l7-b"); ok {
		t.Fatal("the status key outlived its lease")
	}
	waitStatus(t, cli, "l7-b", "status under a new lease", ack(rev))
	if _, l2, _ := status(t, cli, "l7-b"); l2 == lease {
		t.Fatalf("status still under the revoked lease %x", lease)
	}
}

// TestStartFromCache: a node started while the store is out of reach applies the
// snapshot it last applied, keeps trying the store, and goes on from the store once
// it is back.
func TestStartFromCache(t *testing.T) {
	dir, cacheFile := t.TempDir(), filepath.Join(t.TempDir(), "snapshot.json")
	s := openStore(t, dir)
	r1, err := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Store: s, Node: "l7-a", Apply: (&recorder{}).apply, CacheFile: cacheFile, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, a)
	// The first snapshot is read at the store's revision then, which is r1 or, when
	// the agent's own status key was written first, later: that is what it applied.
	applied := waitStatus(t, s.Client(), "l7-a", "ACK", func(st Status, ok bool) bool {
		return ok && st.AppliedRevision >= r1 && st.Error == ""
	}).AppliedRevision
	stop()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// The store is down: the node's opens fail until up is set.
	var up atomic.Bool
	var tries atomic.Int32
	rec := &recorder{}
	b, err := New(Config{Open: func(ctx context.Context) (*store.Store, error) {
		tries.Add(1)
		if !up.Load() {
			return nil, errors.New("connection refused")
		}
		return store.Open(ctx, store.Config{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	}, Node: "l7-a", Apply: rec.apply, CacheFile: cacheFile, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	deadline := time.Now().Add(10 * time.Second)
	for {
		revs, pools := rec.applied()
		if len(revs) == 1 && revs[0] == applied && pools["app"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cached snapshot was not applied within 10s: %v %v", revs, pools)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := b.Status(); st.AppliedRevision != applied || st.Error != "" {
		t.Fatalf("status from the cache %+v", st)
	}
	for tries.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the store was tried %d times within 10s", tries.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}

	up.Store(true)
	// The store is back; a write made then reaches the node.
	var s2 *store.Store
	for s2 == nil {
		// The node holds the store's directory once it opened it: write through its
		// client, as controld would through its own.
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("the node did not reach the store within 20s")
		}
		s2 = b.cur.Load()
		time.Sleep(10 * time.Millisecond)
	}
	r2, err := s2.Put(ctx, model.KindPool, "api", pool("api", "198.18.1.2:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, s2.Client(), "l7-a", "ACK from the store back", ack(r2))
	if got := testutil.ToFloat64(b.met.reconnects); got < 1 {
		t.Fatalf("store reconnects %v, want at least 1", got)
	}
}

// TestWatchAcrossCompaction: revisions compacted before the node's watch reached
// them are not lost: the node reads the whole state again and applies it.
func TestWatchAcrossCompaction(t *testing.T) {
	s := openStore(t, t.TempDir())
	r0, err := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	// The node is busy applying r0 while the store moves on and compacts.
	busy, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rec := &recorder{block: func(rev int64) {
		if rev == r0 {
			once.Do(func() { close(busy); <-release })
		}
	}}
	a, err := New(Config{Store: s, Node: "l7-a", Apply: rec.apply, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	start(t, a)
	select {
	case <-busy:
	case <-time.After(10 * time.Second):
		t.Fatal("r0 not applied within 10s")
	}
	s.Put(ctx, model.KindPool, "api", pool("api", "198.18.1.2:80"), store.Any)
	s.Delete(ctx, model.KindPool, "app", store.Any)
	r3, err := s.Put(ctx, model.KindPool, "web", pool("web", "198.18.1.3:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx, r3); err != nil {
		t.Fatal(err)
	}
	close(release)
	waitStatus(t, s.Client(), "l7-a", "ACK after the compaction", func(st Status, ok bool) bool {
		return ok && st.AppliedRevision >= r3 && st.Error == ""
	})
	revs, pools := rec.applied()
	if len(pools) != 2 || pools["api"] != 1 || pools["web"] != 1 {
		t.Fatalf("pools in force %v, want api and web", pools)
	}
	// Nothing between r0 and the compaction was applied on its own: the node went
	// from r0 to the state read again.
	if len(revs) != 2 || revs[0] != r0 || revs[1] < r3 {
		t.Fatalf("revisions applied %v, want %d then one at %d or later", revs, r0, r3)
	}
}

// TestBurstAppliedAsLatest: revisions written while the node applies one are
// applied together, as the latest of them, not one after the other.
func TestBurstAppliedAsLatest(t *testing.T) {
	s := openStore(t, t.TempDir())
	r0, err := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	busy, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rec := &recorder{block: func(rev int64) {
		if rev > r0 {
			once.Do(func() { close(busy); <-release })
		}
	}}
	a, err := New(Config{Store: s, Node: "l7-a", Apply: rec.apply, Logger: testLogger(t), CacheFile: filepath.Join(t.TempDir(), "cache.json")})
	if err != nil {
		t.Fatal(err)
	}
	start(t, a)
	waitStatus(t, s.Client(), "l7-a", "ACK of the first", ack(r0))
	r1, err := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80", "198.18.1.2:80"), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-busy:
	case <-time.After(10 * time.Second):
		t.Fatal("the second revision not applied within 10s")
	}
	var last int64
	for i := range 4 {
		if last, err = s.Put(ctx, model.KindPool, fmt.Sprintf("p%d", i), pool(fmt.Sprintf("p%d", i), "198.18.1.3:80"), store.Any); err != nil {
			t.Fatal(err)
		}
	}
	// The watch has seen them all before the node is free again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.objsMu.Lock()
		p := a.pending
		a.objsMu.Unlock()
		if p >= last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch at %d, not at %d within 10s", p, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	waitStatus(t, s.Client(), "l7-a", "ACK of the burst", ack(last))
	revs, pools := rec.applied()
	if !slices.Equal(revs, []int64{r0, r1, last}) {
		t.Fatalf("revisions applied %v, want %v", revs, []int64{r0, r1, last})
	}
	if len(pools) != 5 || pools["app"] != 2 {
		t.Fatalf("pools in force %v", pools)
	}
	// The cache file gets the latest.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		data, err := os.ReadFile(a.cfg.CacheFile)
		var c cache
		if err == nil && json.Unmarshal(data, &c) == nil && c.Revision == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cache file not at revision %d within 10s (%v)", last, err)
		}
	}
}

// TestManyAgents: 50 agents in one process, sharing one store client as the
// agents of one host would not (each node has its own), all reach a written
// revision; the time from the write to the last ACK is logged.
func TestManyAgents(t *testing.T) {
	const n = 50
	s := openStore(t, t.TempDir())
	cli := s.Client()
	agents := make([]*Agent, n)
	for i := range agents {
		a, err := New(Config{Store: s, Node: fmt.Sprintf("l7-%02d", i), Role: "l7d", Apply: (&recorder{}).apply,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		agents[i] = a
		start(t, a)
	}
	// Every agent reports (its status written) before the write.
	waitAll := func(what string, ok func(Status, bool) bool) time.Duration {
		t0 := time.Now()
		for _, a := range agents {
			waitStatus(t, cli, a.cfg.Node, what, ok)
		}
		return time.Since(t0)
	}
	waitAll("first status", func(_ Status, ok bool) bool { return ok })
	for round := range 3 {
		t0 := time.Now()
		rev, err := s.Put(ctx, model.KindPool, "app", pool("app", fmt.Sprintf("198.18.1.%d:80", round+1)), store.Any)
		if err != nil {
			t.Fatal(err)
		}
		// The agents' own view first (no store round trip), then the status keys.
		deadline := t0.Add(10 * time.Second)
		for _, a := range agents {
			for a.Status().AppliedRevision < rev {
				if time.Now().After(deadline) {
					t.Fatalf("agent %s at %+v, not at %d within 10s", a.cfg.Node, a.Status(), rev)
				}
				time.Sleep(time.Millisecond)
			}
		}
		applied := time.Since(t0)
		waitAll("ACK", ack(rev))
		t.Logf("round %d: %d agents applied revision %d within %v of the write, all reported within %v", round, n, rev, applied, time.Since(t0))
	}
}

// TestEncodeCache: the cache file as written reads back as encoding/json reads
// it, every field of every object kept.
func TestEncodeCache(t *testing.T) {
	ss := store.NewSnapshot(42, []store.Object{
		{Kind: model.KindPool, Name: "app", Value: pool("app", "198.18.1.1:80"), ModRevision: 40, CreateRevision: 3, Version: 7},
		{Kind: model.KindPool, Name: "b\"q", Value: []byte(` {"name" : "b\"q"} `), ModRevision: 41, CreateRevision: 41, Version: 1},
	})
	var c cache
	if err := json.Unmarshal(encodeCache(ss), &c); err != nil {
		t.Fatalf("%s: %v", encodeCache(ss), err)
	}
	want, err := json.Marshal(cache{Revision: 42, Objects: ss.All()})
	if err != nil {
		t.Fatal(err)
	}
	var w cache
	json.Unmarshal(want, &w)
	got, _ := json.Marshal(c)
	again, _ := json.Marshal(w)
	if string(got) != string(again) {
		t.Fatalf("cache read back as\n%s\nwant\n%s", got, again)
	}
}
