package agent

import (
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
)

// TestStatusReportsBlacklists: the status carries the blacklist versions
// Config.Blacklists returns, and Report writes them when they changed.
func TestStatusReportsBlacklists(t *testing.T) {
	s := openStore(t, t.TempDir())
	var mu sync.Mutex
	versions := map[string]int64{"global": 3}
	a, err := New(Config{Store: s, Node: "l7-b", Role: "l7d", Apply: (&recorder{}).apply, Logger: testLogger(t),
		Blacklists: func() map[string]int64 {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(versions)
		}})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, a)
	defer stop()
	rev, _ := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	cli := s.Client()
	st := waitStatus(t, cli, "l7-b", "ACK", ack(rev))
	if st.Blacklists["global"] != 3 {
		t.Fatalf("status %+v: want blacklist global at 3", st)
	}
	mu.Lock()
	versions["global"], versions["web"] = 4, 1
	mu.Unlock()
	a.Report()
	waitStatus(t, cli, "l7-b", "the new blacklist versions", func(st Status, ok bool) bool {
		return ok && st.Blacklists["global"] == 4 && st.Blacklists["web"] == 1
	})
}

// TestStatusReportsBlacklistHits: the status carries the hits Config.BlacklistHits
// returns, read again every HitsInterval with no Report, and written when they
// changed.
func TestStatusReportsBlacklistHits(t *testing.T) {
	s := openStore(t, t.TempDir())
	var mu sync.Mutex
	hits := map[string]uint64{"global": 2}
	a, err := New(Config{Store: s, Node: "l4-a", Role: "l4d", Apply: (&recorder{}).apply, Logger: testLogger(t),
		Blacklists: func() map[string]int64 { return map[string]int64{"global": 1} },
		BlacklistHits: func() map[string]uint64 {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(hits)
		},
		HitsInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, a)
	defer stop()
	rev, _ := s.Put(ctx, model.KindPool, "app", pool("app", "198.18.1.1:80"), store.Any)
	cli := s.Client()
	st := waitStatus(t, cli, "l4-a", "ACK", ack(rev))
	if st.BlacklistHits["global"] != 2 {
		t.Fatalf("status %+v: want 2 hits of global", st)
	}
	mu.Lock()
	hits["global"], hits["web"] = 7, 1
	mu.Unlock()
	waitStatus(t, cli, "l4-a", "the new hits, with no Report", func(st Status, ok bool) bool {
		return ok && st.BlacklistHits["global"] == 7 && st.BlacklistHits["web"] == 1
	})
	if got := a.Status().BlacklistHits; got["global"] != 7 || got["web"] != 1 {
		t.Fatalf("Status().BlacklistHits = %v", got)
	}
}
