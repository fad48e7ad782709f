package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
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

func ack(rev int64) func(Status, bool) bool {
	return func(st Status, ok bool) bool { return ok && st.AppliedRevision == rev && st.Error == "" }
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
	if st.AppliedRevision != r1 || !strings.Contains(st.Error, "pools/empty.members") {
		t.Fatalf("NACK %+v, want applied %d and an error at pools/empty.members", st, r1)
	}
	if revs, pools := rec.applied(); len(revs) == 0 || revs[len(revs)-1] != r1 || len(pools) != 1 || pools["app"] != 1 {
		t.Fatalf("applied %v %v after the NACK, want r1=%d in force", revs, pools, r1)
	}
	if got := testutil.ToFloat64(a.met.nacks); got != 1 {
		t.Fatalf("nacks %v, want 1", got)
	}

	// Apply refusing a snapshot is a NACK too.
	r3, _ := s.Delete(ctx, model.KindPool, "empty", store.Any)
	waitStatus(t, cli, "l7-a", "ACK after the fix", ack(r3))
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
	if st.AppliedRevision != r3 || !strings.Contains(st.Error, "listener busy") {
		t.Fatalf("NACK %+v", st)
	}

	// A later good write is applied whole.
	r5, _ := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80", "198.18.1.3:80"), store.Any)
	waitStatus(t, cli, "l7-a", "ACK of the later write", ack(r5))
	if _, pools := rec.applied(); len(pools) != 2 || pools["app"] != 2 || pools["api"] != 1 {
		t.Fatalf("pools in force %v", pools)
	}
	if got := testutil.ToFloat64(a.met.applied); got != float64(r5) {
		t.Fatalf("applied revision gauge %v, want %d", got, r5)
	}
	if got := testutil.ToFloat64(a.met.nacks); got != 2 {
		t.Fatalf("nacks %v, want 2", got)
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
