package model

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/policy/route"
)

// storeSnapshot is snap as the store would hold it at rev, each object at the
// revision mods gives it (1 when missing).
func storeSnapshot(t *testing.T, rev int64, snap *Snapshot, mods map[string]int64, raw ...store.Object) *store.Snapshot {
	t.Helper()
	var objs []store.Object
	for _, o := range snap.Objects() {
		data, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		mod := mods[o.Kind()+"/"+o.ObjectName()]
		if mod == 0 {
			mod = 1
		}
		objs = append(objs, store.Object{Kind: o.Kind(), Name: o.ObjectName(), Value: data, ModRevision: mod})
	}
	return store.NewSnapshot(rev, append(objs, raw...))
}

// errText is err's text, or "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestCheckerAsCheck: over a run of snapshots, good and bad, the Checker refuses
// what Check refuses with the same problems, and reuses (the same pointer) the
// objects that did not change while decoding again those that did.
func TestCheckerAsCheck(t *testing.T) {
	var c Checker
	base := fullSnapshot(t)
	pool := func(addr string) *Pool {
		return &Pool{route.Pool{Name: "app", Members: []route.PoolMember{{Addr: addr}}}}
	}
	withPool := func(p *Pool) *Snapshot {
		s := NewSnapshot(1)
		for _, o := range base.Objects() {
			if o.Kind() == KindPool {
				continue
			}
			s.Add(o)
		}
		if p != nil {
			s.Add(p)
		}
		return s
	}
	steps := []struct {
		name string
		ss   *store.Snapshot
		ok   bool
	}{
		{"first", storeSnapshot(t, 10, withPool(pool("198.18.1.1:8080")), nil), true},
		{"pool changed", storeSnapshot(t, 11, withPool(pool("198.18.1.2:8080")), map[string]int64{"pools/app": 11}), true},
		{"pool invalid", storeSnapshot(t, 12, withPool(&Pool{route.Pool{Name: "app"}}), map[string]int64{"pools/app": 12}), false},
		{"pool missing", storeSnapshot(t, 13, withPool(nil), nil), false},
		{"pool undecodable", storeSnapshot(t, 14, withPool(nil), nil,
			store.Object{Kind: KindPool, Name: "app", Value: []byte(`{"name":"app","colour":1}`), ModRevision: 14}), false},
		{"pool back", storeSnapshot(t, 15, withPool(pool("198.18.1.3:8080")), map[string]int64{"pools/app": 15}), true},
	}
	var prev *Snapshot
	for _, st := range steps {
		got, err := c.Check(st.ss)
		want := Check(st.ss)
		if errText(err) != errText(want) {
			t.Fatalf("%s: Checker says %v, Check says %v", st.name, err, want)
		}
		if (err == nil) != st.ok {
			t.Fatalf("%s: err %v, want ok=%v", st.name, err, st.ok)
		}
		if err != nil {
			continue
		}
		if got.Revision != st.ss.Revision || len(got.Objects()) != st.ss.Len() {
			t.Fatalf("%s: %d objects at %d, want %d at %d", st.name, len(got.Objects()), got.Revision, st.ss.Len(), st.ss.Revision)
		}
		if want := fmt.Sprint(st.ss.List(KindPool)[0].Value); fmt.Sprint(mustJSON(t, got.Pools["app"])) != want {
			t.Fatalf("%s: pool %s, want %s", st.name, mustJSON(t, got.Pools["app"]), want)
		}
		if prev != nil {
			if got.Listeners["web"] != prev.Listeners["web"] {
				t.Errorf("%s: the unchanged listener was decoded again", st.name)
			}
			if got.Pools["app"] == prev.Pools["app"] {
				t.Errorf("%s: the changed pool is the one checked before", st.name)
			}
		}
		prev = got
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
