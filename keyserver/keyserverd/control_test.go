package keyserverd

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/store"
)

// TestControl: with a control section, keyserverd is a node of the control plane:
// its status in the store has its role and the address clients reach it at, it
// accepts every revision, and its status key goes when it stops.
func TestControl(t *testing.T) {
	s, err := store.Open(context.Background(), store.Config{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rev, err := s.Put(context.Background(), "l4-pools", "l7", []byte(`{"name":"l7","members":[{"name":"a","address":"10.0.0.11"}]}`), store.Any)
	if err != nil {
		t.Fatal(err)
	}
	p := newPKI(t)
	r := start(t, p.config(fmt.Sprintf("software: {}\nallow_all_clients: true\ncontrol: {node: ks-a, etcd_endpoints: [%q]}\n", s.Client().Endpoints()[0])))

	status := func() (agent.Status, bool) {
		resp, err := s.Client().Get(context.Background(), agent.StatusKey("ks-a"))
		if err != nil {
			t.Fatal(err)
		}
		var st agent.Status
		if len(resp.Kvs) == 0 {
			return st, false
		}
		if err := json.Unmarshal(resp.Kvs[0].Value, &st); err != nil {
			t.Fatal(err)
		}
		return st, true
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, ok := status()
		if ok && st.AppliedRevision >= rev {
			if st.Role != "keyserverd" || st.Address != r.Addr().String() || st.Error != "" || st.Started.IsZero() {
				t.Errorf("status %+v: want role keyserverd, address %s, a start time, no error", st, r.Addr())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no status of ks-a at revision %d in the store: %+v", rev, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.want("GET", "/status", 200, `"node": "ks-a"`, `"role": "keyserverd"`, `"address": "`+r.Addr().String()+`"`)
	// A node of the control plane gets its keys from uploads: with none yet it is
	// healthy (without a control section it is not).
	r.want("GET", "/status", 200, `"keys": []`)
	r.want("GET", "/healthz", 200)

	// What is fixed at start stays.
	cfg, err := LoadConfig(r.path)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, r.path, p.config(fmt.Sprintf("software: {}\nallow_all_clients: true\ncontrol: {node: ks-b, etcd_endpoints: [%q]}\n", s.Client().Endpoints()[0])))
	r.want("POST", "/reload", 409, "control cannot change at runtime")
	if cfg.Control.CacheFile == "" || !strings.HasSuffix(cfg.Control.CacheFile, "/state/"+agent.CacheFileName) {
		t.Errorf("cache file %q, want one in state_dir", cfg.Control.CacheFile)
	}

	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if _, ok := status(); ok {
		t.Error("the status key stayed after the stop")
	}
}
