package store

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

var ctx = context.Background()

// revision returns the store's current revision.
func revision(t *testing.T, s *Store) int64 {
	t.Helper()
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Revision
}

func TestPutGet(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		r1, err := s.Put(ctx, "pools", "web", []byte(`{"name":"web"}`), 0)
		if err != nil {
			t.Fatal(err)
		}
		o, err := s.Get(ctx, "pools", "web")
		if err != nil {
			t.Fatal(err)
		}
		if o.Kind != "pools" || o.Name != "web" || string(o.Value) != `{"name":"web"}` || o.ModRevision != r1 || o.CreateRevision != r1 || o.Version != 1 {
			t.Fatalf("got %+v, want pools/web at revision %d", o, r1)
		}
		r2, err := s.Put(ctx, "pools", "web", []byte(`{"name":"web","x":1}`), r1)
		if err != nil {
			t.Fatal(err)
		}
		if r2 <= r1 {
			t.Fatalf("revision %d after %d", r2, r1)
		}
		if _, err := s.Put(ctx, "pools", "api", []byte(`{}`), Any); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Put(ctx, "listeners", "web", []byte(`{}`), Any); err != nil {
			t.Fatal(err)
		}
		objs, rev, err := s.List(ctx, "pools")
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) != 2 || objs[0].Name != "api" || objs[1].Name != "web" || objs[1].Version != 2 || rev < r2 {
			t.Fatalf("List: %+v at %d", objs, rev)
		}
		snap, err := s.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Len() != 3 || strings.Join(snap.Kinds(), ",") != "listeners,pools" {
			t.Fatalf("snapshot: %d objects of %v", snap.Len(), snap.Kinds())
		}
		if o, ok := snap.Get("pools", "web"); !ok || o.ModRevision != r2 {
			t.Fatalf("snapshot's pools/web: %+v", o)
		}
		if _, err := s.Get(ctx, "pools", "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing object: %v", err)
		}
		if _, err := s.Put(ctx, "pools", "bad", []byte(`{`), Any); err == nil || !strings.Contains(err.Error(), "not JSON") {
			t.Fatalf("a value that is not JSON: %v", err)
		}
		for _, k := range [][2]string{{"Pools", "x"}, {"pools", "a/b"}, {"pools", ""}, {"", "x"}, {"pools", ".x"}} {
			if _, err := s.Put(ctx, k[0], k[1], []byte(`{}`), Any); err == nil {
				t.Errorf("Put(%q, %q) took a bad key", k[0], k[1])
			}
		}
		// Deleting it and reading past revisions.
		dr, err := s.Delete(ctx, "pools", "web", r2)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "pools", "web"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted object: %v", err)
		}
		if o, err := s.GetAt(ctx, "pools", "web", dr-1); err != nil || o.ModRevision != r2 {
			t.Fatalf("GetAt before the delete: %+v, %v", o, err)
		}
		if _, err := s.GetAt(ctx, "pools", "web", r1-1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetAt before the create: %v", err)
		}
	})
}

func TestIfMatchConflict(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		r1, err := s.Put(ctx, "pools", "web", []byte(`1`), 0)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := s.Put(ctx, "pools", "web", []byte(`2`), r1)
		if err != nil {
			t.Fatal(err)
		}
		before := revision(t, s)
		check := func(err error, expected, actual int64) {
			t.Helper()
			var ce *ConflictError
			if !errors.Is(err, ErrConflict) || !errors.As(err, &ce) {
				t.Fatalf("want a conflict, got %v", err)
			}
			if ce.Kind != "pools" || ce.Name != "web" || ce.Expected != expected || ce.Actual != actual {
				t.Fatalf("conflict %+v, want pools/web expected %d actual %d", ce, expected, actual)
			}
		}
		_, err = s.Put(ctx, "pools", "web", []byte(`3`), r1) // stale
		check(err, r1, r2)
		_, err = s.Put(ctx, "pools", "web", []byte(`3`), 0) // create over it
		check(err, 0, r2)
		_, err = s.Delete(ctx, "pools", "web", r1)
		check(err, r1, r2)
		_, err = s.Put(ctx, "pools", "new", []byte(`3`), 5) // update of nothing
		var ce *ConflictError
		if !errors.As(err, &ce) || ce.Actual != 0 || ce.Name != "new" {
			t.Fatalf("update of a missing object: %v", err)
		}
		if !strings.Contains(err.Error(), "pools/new is absent, not at revision 5") {
			t.Fatalf("message: %v", err)
		}
		if _, err := s.Delete(ctx, "pools", "new", Any); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete of a missing object: %v", err)
		}
		if got := revision(t, s); got != before {
			t.Fatalf("refused writes moved the revision from %d to %d", before, got)
		}
		if o, _ := s.Get(ctx, "pools", "web"); string(o.Value) != "2" {
			t.Fatalf("value %s after refused writes", o.Value)
		}
	})
}

func TestChangeSetAllOrNothing(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ra, _ := s.Put(ctx, "pools", "a", []byte(`"a1"`), 0)
		rb, _ := s.Put(ctx, "pools", "b", []byte(`"b1"`), 0)
		if _, err := s.Put(ctx, "pools", "b", []byte(`"b2"`), rb); err != nil {
			t.Fatal(err)
		}
		before := revision(t, s)
		cs := ChangeSet{Changes: []Change{
			{Kind: "pools", Name: "a", Value: []byte(`"a2"`), IfRevision: ra},
			{Kind: "pools", Name: "c", Value: []byte(`"c1"`), IfRevision: 0},
			{Kind: "pools", Name: "b", Delete: true, IfRevision: rb}, // stale
		}}
		_, err := s.Commit(ctx, cs)
		var ce *ConflictError
		if !errors.As(err, &ce) || ce.Name != "b" {
			t.Fatalf("want a conflict on pools/b, got %v", err)
		}
		if got := revision(t, s); got != before {
			t.Fatalf("a refused change set moved the revision from %d to %d", before, got)
		}
		if o, _ := s.Get(ctx, "pools", "a"); string(o.Value) != `"a1"` {
			t.Fatalf("pools/a is %s after a refused change set", o.Value)
		}
		if _, err := s.Get(ctx, "pools", "c"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("pools/c after a refused change set: %v", err)
		}
		// The same with every revision right commits all of it at one revision.
		ob, _ := s.Get(ctx, "pools", "b")
		cs.Changes[2].IfRevision = ob.ModRevision
		rev, err := s.Commit(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		snap, _ := s.Snapshot(ctx)
		a, _ := snap.Get("pools", "a")
		c, _ := snap.Get("pools", "c")
		if _, ok := snap.Get("pools", "b"); ok || a.ModRevision != rev || c.ModRevision != rev || snap.Revision != rev {
			t.Fatalf("after the change set at %d: %+v", rev, snap.All())
		}
		// The same check on the unchecked and the checked path: a change set with a
		// check reads the snapshot and finds the stale revision there.
		cs2 := ChangeSet{
			Changes: []Change{{Kind: "pools", Name: "a", Value: []byte(`"a3"`), IfRevision: ra}},
			Check:   func(*Snapshot) error { t.Error("check called for a change set whose revisions are stale"); return nil },
		}
		if _, err := s.Commit(ctx, cs2); !errors.Is(err, ErrConflict) {
			t.Fatalf("checked change set with a stale revision: %v", err)
		}
	})
}

func TestCheckRefusal(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		if _, err := s.Put(ctx, "pools", "web", []byte(`{}`), 0); err != nil {
			t.Fatal(err)
		}
		before := revision(t, s)
		var seen *Snapshot
		cs := ChangeSet{
			Changes: []Change{
				{Kind: "routes", Name: "r1", Value: []byte(`{"pool":"web"}`), IfRevision: 0},
				{Kind: "routes", Name: "r2", Value: []byte(`{"pool":"gone"}`), IfRevision: 0},
				{Kind: "pools", Name: "web", Delete: true, IfRevision: Any},
			},
			// A check in the shape of the model's: routes must name a pool.
			Check: func(snap *Snapshot) error {
				seen = snap
				var ck config.Checker
				for _, r := range snap.List("routes") {
					pool := strings.TrimSuffix(strings.TrimPrefix(string(r.Value), `{"pool":"`), `"}`)
					if _, ok := snap.Get("pools", pool); !ok {
						ck.Addf("routes/"+r.Name+".pool", "no pool is named %q", pool)
					}
				}
				return ck.Err()
			},
		}
		_, err := s.Commit(ctx, cs)
		var che *CheckError
		var fe *config.FieldError
		if !errors.As(err, &che) || !errors.As(err, &fe) || fe.Path != "routes/r1.pool" {
			t.Fatalf("want the check's field error on routes/r1.pool, got %v", err)
		}
		if !strings.Contains(err.Error(), "routes/r2.pool: no pool is named \"gone\"") {
			t.Fatalf("the error does not name routes/r2.pool: %v", err)
		}
		if che.Revision != before || seen.Revision != before || seen.Len() != 2 {
			t.Fatalf("the check saw revision %d with %d objects (%v), want %d with the two routes", seen.Revision, seen.Len(), seen.All(), before)
		}
		if o, _ := seen.Get("routes", "r1"); o.ModRevision != 0 || o.Version != 1 {
			t.Fatalf("a pending object in the checked snapshot: %+v", o)
		}
		if got := revision(t, s); got != before {
			t.Fatalf("a refused change set moved the revision from %d to %d", before, got)
		}
		// Keeping the pool and dropping r2 passes.
		cs.Changes = cs.Changes[:1]
		if _, err := s.Commit(ctx, cs); err != nil {
			t.Fatal(err)
		}
	})
}

// TestConcurrentWriters races change sets: on one object's revision exactly one
// wins; with a check of the whole snapshot, a change set that lost the race is
// checked again against the winner's writes and refused, never committed unchecked.
func TestConcurrentWriters(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		r, err := s.Put(ctx, "pools", "web", []byte(`0`), 0)
		if err != nil {
			t.Fatal(err)
		}
		const writers = 4
		errs := make(chan error, writers)
		start := make(chan struct{})
		for i := range writers {
			go func() {
				<-start
				_, err := s.Commit(ctx, ChangeSet{Changes: []Change{
					{Kind: "pools", Name: "web", Value: []byte{'1' + byte(i)}, IfRevision: r},
					{Kind: "pools", Name: "w" + string(rune('a'+i)), Value: []byte(`1`), IfRevision: 0},
				}})
				errs <- err
			}()
		}
		close(start)
		won := 0
		for range writers {
			err := waitFor(t, errs, "writer's result")
			switch {
			case err == nil:
				won++
			case !errors.Is(err, ErrConflict):
				t.Errorf("a writer failed otherwise than by a conflict: %v", err)
			}
		}
		if won != 1 {
			t.Fatalf("%d writers won the same revision", won)
		}
		if objs, _, _ := s.List(ctx, "pools"); len(objs) != 2 {
			t.Fatalf("pools after the race: %+v", objs)
		}

		// Two change sets creating different objects, each checked that the kind
		// "leader" has at most one object: one commits, the other is checked again
		// against it and refused.
		ok, refused, calls := raceChecked(t, s, func(snap *Snapshot) error {
			if len(snap.List("leader")) > 1 {
				return &config.FieldError{Path: "leader", Err: errors.New("more than one")}
			}
			return nil
		},
			[]Change{{Kind: "leader", Name: "a", Value: []byte(`{}`), IfRevision: 0}},
			[]Change{{Kind: "leader", Name: "b", Value: []byte(`{}`), IfRevision: 0}},
		)
		leaders, _, _ := s.List(ctx, "leader")
		if ok != 1 || refused != 1 || len(leaders) != 1 || calls < 3 {
			t.Fatalf("%d committed, %d refused, %d leaders stored, %d checks (want 1, 1, 1, at least 3)", ok, refused, len(leaders), calls)
		}

		// A route to pool p and the deletion of p, each consistent with the snapshot
		// both read: the deletion leaves no key behind for the other to compare, and
		// still one of them is refused.
		if _, err := s.Put(ctx, "pool", "p", []byte(`{}`), 0); err != nil {
			t.Fatal(err)
		}
		ok, refused, calls = raceChecked(t, s, func(snap *Snapshot) error {
			for _, r := range snap.List("route") {
				if _, found := snap.Get("pool", string(r.Value[1:len(r.Value)-1])); !found {
					return &config.FieldError{Path: "route/" + r.Name, Err: errors.New("no such pool")}
				}
			}
			return nil
		},
			[]Change{{Kind: "route", Name: "r", Value: []byte(`"p"`), IfRevision: 0}},
			[]Change{{Kind: "pool", Name: "p", Delete: true, IfRevision: Any}},
		)
		snap, _ := s.Snapshot(ctx)
		_, pool := snap.Get("pool", "p")
		_, route := snap.Get("route", "r")
		if ok != 1 || refused != 1 || pool != route || calls < 3 {
			t.Fatalf("%d committed, %d refused, pool stored %v, route stored %v, %d checks (want 1, 1, both stored or neither, at least 3)", ok, refused, pool, route, calls)
		}
	})
}

// raceChecked commits change sets a and b at once with check, each check waiting
// for the other's first call so both read the same snapshot, and returns how many
// committed, how many their check refused and how many checks ran.
func raceChecked(t *testing.T, s *Store, check func(*Snapshot) error, a, b []Change) (ok, refused, calls int) {
	t.Helper()
	var mu sync.Mutex
	arrived := make(chan struct{})
	barrier := func(snap *Snapshot) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 2 {
			close(arrived)
		}
		if n <= 2 {
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				return errors.New("the other writer never checked")
			}
		}
		return check(snap)
	}
	results := make(chan error, 2)
	for _, changes := range [][]Change{a, b} {
		go func() {
			_, err := s.Commit(ctx, ChangeSet{Changes: changes, Check: barrier})
			results <- err
		}()
	}
	for range 2 {
		err := waitFor(t, results, "checked writer's result")
		var che *CheckError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &che):
			refused++
		default:
			t.Errorf("checked writer: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return ok, refused, calls
}

func TestHistory(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		var revs []int64
		rev := int64(0)
		for _, v := range []string{`1`, `2`, `3`} {
			var err error
			if rev, err = s.Put(ctx, "pools", "web", []byte(v), rev); err != nil {
				t.Fatal(err)
			}
			revs = append(revs, rev)
			if _, err := s.Put(ctx, "pools", "other", []byte(v), Any); err != nil { // revisions in between
				t.Fatal(err)
			}
		}
		h, err := s.History(ctx, "pools", "web", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 3 {
			t.Fatalf("history of %d revisions: %+v", len(h), h)
		}
		for i, o := range h {
			want := len(h) - 1 - i
			if o.ModRevision != revs[want] || string(o.Value) != string(rune('1'+want)) || o.Version != int64(want+1) {
				t.Errorf("history[%d] = %+v, want value %d at revision %d", i, o, want+1, revs[want])
			}
		}
		if h, _ := s.History(ctx, "pools", "web", 2); len(h) != 2 {
			t.Fatalf("history bounded to 2: %d", len(h))
		}
		o, err := s.GetAt(ctx, "pools", "web", revs[0])
		if err != nil || string(o.Value) != "1" {
			t.Fatalf("GetAt(%d) = %+v, %v", revs[0], o, err)
		}
		// Compaction drops what History and GetAt could reach.
		if err := s.Compact(ctx, revs[1]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetAt(ctx, "pools", "web", revs[0]); !errors.Is(err, ErrCompacted) {
			t.Fatalf("GetAt a compacted revision: %v", err)
		}
		h, err = s.History(ctx, "pools", "web", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 2 || h[1].Version != 2 {
			t.Fatalf("history after compaction: %+v", h)
		}
	})
}

func TestTooLarge(t *testing.T) {
	s := openEmbedded(t)
	big := append(append([]byte{'"'}, bytes.Repeat([]byte{'x'}, MaxValueBytes-2)...), '"')
	if _, err := s.Put(ctx, "blobs", "max", big, 0); err != nil {
		t.Fatalf("a value of exactly %d bytes: %v", MaxValueBytes, err)
	}
	over := append(append([]byte{'"'}, bytes.Repeat([]byte{'x'}, MaxValueBytes-1)...), '"')
	if _, err := s.Put(ctx, "blobs", "over", over, 0); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "blobs/over") {
		t.Fatalf("a value over the limit: %v", err)
	}
	half := append(append([]byte{'"'}, bytes.Repeat([]byte{'x'}, MaxValueBytes/2)...), '"')
	_, err := s.Commit(ctx, ChangeSet{Changes: []Change{
		{Kind: "blobs", Name: "a", Value: half, IfRevision: Any},
		{Kind: "blobs", Name: "b", Value: half, IfRevision: Any},
		{Kind: "blobs", Name: "c", Value: half, IfRevision: Any},
	}})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a change set over the limit: %v", err)
	}
	many := make([]Change, MaxChanges+1)
	for i := range many {
		many[i] = Change{Kind: "blobs", Name: "n" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Value: []byte(`1`), IfRevision: Any}
	}
	if _, err := s.Commit(ctx, ChangeSet{Changes: many}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("%d changes: %v", len(many), err)
	}
	if _, err := s.Commit(ctx, ChangeSet{Changes: many[:MaxChanges]}); err != nil {
		t.Fatalf("%d changes: %v", MaxChanges, err)
	}
}

func TestChangeSetRefusedBeforeWriting(t *testing.T) {
	s := openEmbedded(t)
	for _, tc := range []struct {
		name    string
		changes []Change
		want    string
	}{
		{"empty", nil, "empty change set"},
		{"twice", []Change{{Kind: "a", Name: "x", Value: []byte(`1`), IfRevision: Any}, {Kind: "a", Name: "x", Delete: true, IfRevision: Any}}, "changed twice"},
		{"bad revision", []Change{{Kind: "a", Name: "x", Value: []byte(`1`), IfRevision: -2}}, "expected revision -2"},
		{"delete with value", []Change{{Kind: "a", Name: "x", Value: []byte(`1`), Delete: true, IfRevision: Any}}, "a delete with a value"},
		{"delete absent", []Change{{Kind: "a", Name: "x", Delete: true, IfRevision: 0}}, "must not exist"},
	} {
		if _, err := s.Commit(ctx, ChangeSet{Changes: tc.changes}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestReopenKeepsData(t *testing.T) {
	dir := t.TempDir()
	log, _ := testLogger(t, slog.LevelWarn)
	s, err := Open(ctx, Config{Dir: dir, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Put(ctx, "pools", "web", []byte(`{"members":1}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	// The data directory is taken while the store is open.
	if _, err := Open(ctx, Config{Dir: dir, Logger: log}); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("a second store on the same directory: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	s, err = Open(ctx, Config{Dir: dir, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o, err := s.Get(ctx, "pools", "web")
	if err != nil || string(o.Value) != `{"members":1}` || o.ModRevision != rev {
		t.Fatalf("after reopening: %+v, %v (want the value at revision %d)", o, err, rev)
	}
	if _, err := s.Put(ctx, "pools", "web", []byte(`{}`), rev); err != nil {
		t.Fatalf("writing after reopening: %v", err)
	}
}

func TestSettings(t *testing.T) {
	s := openEmbedded(t)
	st, err := s.Settings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Embedded || st.QuotaBackendBytes != DefaultQuotaBackendBytes || st.CompactionMode != "revision" ||
		st.CompactionRetention != DefaultCompactionRetention || st.SnapshotCount != DefaultSnapshotCount || st.MaxRequestBytes != 1536*1024 {
		t.Fatalf("default settings: %+v", st)
	}
	if len(st.Endpoints) != 1 || !strings.HasPrefix(st.Endpoints[0], "unix://") {
		t.Fatalf("the embedded store's endpoint: %v", st.Endpoints)
	}
	log, _ := testLogger(t, slog.LevelWarn)
	s2, err := Open(ctx, Config{Dir: t.TempDir(), Logger: log, QuotaBackendBytes: 256 << 20, CompactionRetention: 500, SnapshotCount: 2000})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	st, err = s2.Settings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.QuotaBackendBytes != 256<<20 || st.CompactionRetention != 500 || st.SnapshotCount != 2000 {
		t.Fatalf("settings given: %+v", st)
	}
	ext := openExternal(t)
	st, err = ext.Settings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Embedded || len(st.Endpoints) != 1 || !strings.HasPrefix(st.Endpoints[0], "https://127.0.0.1:") {
		t.Fatalf("external settings: %+v", st)
	}
}

func TestEtcdLogsThroughSlog(t *testing.T) {
	log, buf := testLogger(t, slog.LevelDebug)
	s, err := Open(ctx, Config{Dir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"component=etcd ", "embedded etcd ready"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log has no %q", want)
		}
	}
	// What etcd logs at every start and stop is routine: nothing above debug.
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "component=etcd") && !strings.Contains(line, "level=DEBUG") {
			t.Errorf("etcd logged above debug on a clean start and stop: %s", line)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "dir: required"},
		{Config{Dir: "/x", Endpoints: []string{"https://h:2379"}}, "dir: set with endpoints"},
		{Config{Endpoints: []string{"ftp://h"}}, "endpoints[0]: \"ftp://h\": want an http"},
		{Config{Endpoints: []string{"https://"}}, "endpoints[0]: \"https://\": no host"},
		{Config{Endpoints: []string{"https://h:2379"}, CertFile: "c"}, "cert_file: cert_file and key_file go together"},
		{Config{Dir: "/x", CAFile: "ca"}, "ca_file: only for an external etcd"},
		{Config{Dir: "/" + strings.Repeat("d", 120)}, "dir: \"/ddd"},
		{Config{Dir: "/x", QuotaBackendBytes: 1 << 20}, "quota_backend_bytes: 1048576: below 64 MiB"},
		{Config{Dir: "/x", DialTimeout: -1}, "dial_timeout"},
		{Config{Dir: "/x", CompactionRetention: -1}, "compaction_retention"},
		{Config{Endpoints: []string{"https://h:2379"}, Username: "n"}, "username: username and password_file go together"},
		{Config{Dir: "/x", Username: "n", PasswordFile: "p"}, "username: only for an external etcd"},
		{Config{Dir: "/x", ListenClientURL: "http://0.0.0.0:2379"}, "listen_client_url: \"http://0.0.0.0:2379\": only a loopback"},
		{Config{Dir: "/x", ListenClientURL: "https://127.0.0.1:2379"}, "listen_client_url: \"https://127.0.0.1:2379\": want http"},
		{Config{Dir: "/x", ListenClientURL: "http://127.0.0.1"}, "listen_client_url"},
		{Config{Endpoints: []string{"https://h:2379"}, ListenClientURL: "http://127.0.0.1:2379"}, "listen_client_url: only for the embedded"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if err := (&Config{Dir: "/x"}).Validate(); err != nil {
		t.Errorf("a directory alone: %v", err)
	}
	if err := (&Config{Dir: "/x", ListenClientURL: "http://[::1]:2379"}).Validate(); err != nil {
		t.Errorf("a loopback listen URL: %v", err)
	}
}

// TestListenClientURL: the embedded etcd serves its loopback URL too (with the
// port it got for port 0), and a store opened there as an external one sees the
// same objects.
func TestListenClientURL(t *testing.T) {
	log, _ := testLogger(t, slog.LevelWarn)
	s, err := Open(ctx, Config{Dir: t.TempDir(), ListenClientURL: "http://127.0.0.1:0", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	urls := s.ClientURLs()
	var tcp string
	for _, u := range urls {
		if strings.HasPrefix(u, "http://127.0.0.1:") && !strings.HasSuffix(u, ":0") {
			tcp = u
		}
	}
	if len(urls) != 2 || !strings.HasPrefix(urls[0], "unix://") || tcp == "" {
		t.Fatalf("client URLs %v, want the socket and a loopback URL with its port", urls)
	}
	rev, err := s.Put(ctx, "pool", "app", []byte(`{"a":1}`), Any)
	if err != nil {
		t.Fatal(err)
	}
	other, err := Open(ctx, Config{Endpoints: []string{tcp}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	o, err := other.Get(ctx, "pool", "app")
	if err != nil || o.ModRevision != rev {
		t.Fatalf("through %s: %+v %v", tcp, o, err)
	}
	if got := other.ClientURLs(); len(got) != 1 || got[0] != tcp {
		t.Fatalf("an external store's client URLs %v", got)
	}
}

// TestExternalNeedsClientCertificate: the external etcd of the tests requires
// client certificates, so the TLS settings are what let the store in.
func TestExternalNeedsClientCertificate(t *testing.T) {
	openExternal(t) // started
	cfg := external.cfg
	cfg.CertFile, cfg.KeyFile = "", ""
	cfg.DialTimeout = config.Duration(time.Second)
	cfg.Logger = slog.New(slog.DiscardHandler)
	if s, err := Open(ctx, cfg); err == nil {
		s.Close()
		t.Fatal("opened the external store without a client certificate")
	}
}
