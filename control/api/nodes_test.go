package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
)

// runAgent runs a node agent over the fixture's store until the returned stop.
func (f *fixture) runAgent(t *testing.T, cfg agent.Config) (stop func()) {
	t.Helper()
	cfg.Store = f.st
	cfg.Logger = slog.New(slog.DiscardHandler)
	if cfg.Apply == nil {
		cfg.Apply = func(context.Context, *model.Snapshot, int64) error { return nil }
	}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("agent %s: %v", cfg.Node, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("agent %s did not stop", cfg.Node)
		}
	}
	t.Cleanup(stop)
	return stop
}

// until asks fn every 20ms for 10s at most, until it says done.
func until(t *testing.T, what string, fn func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, last := fn()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s; last: %s", what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNodesAndRollouts: real agents report to the store; /v1/nodes shows each
// with its role, address, applied revision, lag, uptime and certificates, one
// that refused the latest configuration as refused, one that stopped as lost;
// /v1/rollouts/{revision} says who applied, refused, has not answered, or is lost.
func TestNodesAndRollouts(t *testing.T) {
	f := newFixture(t)
	viewer := f.token(t, "ops-view", RoleViewer)
	r1 := f.putPool(t, f.admin, "app", "198.18.1.1:80", 0)
	certs := []agent.CertInUse{{Name: "www", Version: 2, SHA256: strings.Repeat("0f", 32)}}
	f.runAgent(t, agent.Config{Node: "l7-a", Role: "l7d", Address: "198.18.0.1:443", Certificates: func() []agent.CertInUse { return certs }})
	// l7-b refuses every pool named "bad".
	f.runAgent(t, agent.Config{Node: "l7-b", Role: "l7d", Address: "198.18.0.2:443", Apply: func(_ context.Context, s *model.Snapshot, _ int64) error {
		if _, ok := s.Pools["bad"]; ok {
			return errors.New("pool bad is not for this node")
		}
		return nil
	}})
	stopL4 := f.runAgent(t, agent.Config{Node: "l4-a", Role: "l4d", Address: "198.18.0.3:9090"})

	nodes := func() Nodes {
		a := f.do(t, viewer, "GET", "/v1/nodes", "")
		var out Nodes
		if a.status != http.StatusOK || json.Unmarshal(a.body, &out) != nil {
			t.Fatalf("nodes: %d %s", a.status, a.body)
		}
		return out
	}
	byName := func(ns Nodes) map[string]Node {
		m := map[string]Node{}
		for _, n := range ns.Nodes {
			m[n.Node] = n
		}
		return m
	}
	until(t, "three nodes at the first revision", func() (bool, string) {
		ns := nodes()
		for _, n := range ns.Nodes {
			if n.AppliedRevision < r1 || n.Lag != 0 || n.State != NodeOK {
				return false, strconv.Itoa(len(ns.Nodes)) + " nodes"
			}
		}
		return len(ns.Nodes) == 3, strconv.Itoa(len(ns.Nodes)) + " nodes"
	})
	m := byName(nodes())
	a := m["l7-a"]
	if a.Role != "l7d" || a.Address != "198.18.0.1:443" || a.Started.IsZero() || a.Updated.IsZero() || a.UptimeSeconds < 0 ||
		len(a.Certificates) != 1 || a.Certificates[0] != certs[0] {
		t.Fatalf("l7-a: %+v", a)
	}
	if len(m["l4-a"].Certificates) != 0 || m["l4-a"].Role != "l4d" {
		t.Fatalf("l4-a: %+v", m["l4-a"])
	}

	// A write l7-b refuses: it stays at what it had, refused; the others apply.
	r2 := f.putPool(t, f.admin, "bad", "198.18.1.9:80", 0)
	until(t, "the rollout of the refused write", func() (bool, string) {
		a := f.do(t, viewer, "GET", "/v1/rollouts/"+strconv.FormatInt(r2, 10), "")
		var ro Rollout
		if a.status != http.StatusOK || json.Unmarshal(a.body, &ro) != nil {
			return false, string(a.body)
		}
		return ro.Applied == 2 && ro.Refused == 1 && ro.Pending == 0 && ro.Lost == 0, string(a.body)
	})
	a2 := f.do(t, viewer, "GET", "/v1/rollouts/"+strconv.FormatInt(r2, 10), "")
	var ro Rollout
	json.Unmarshal(a2.body, &ro)
	for _, n := range ro.Nodes {
		switch n.Node {
		case "l7-b":
			if n.State != RolloutRefused || n.RefusedRevision < r2 || !strings.Contains(n.Error, "pool bad is not for this node") || n.AppliedRevision >= r2 {
				t.Fatalf("l7-b in the rollout: %+v", n)
			}
		default:
			if n.State != RolloutApplied || n.AppliedRevision < r2 {
				t.Fatalf("%s in the rollout: %+v", n.Node, n)
			}
		}
	}
	m = byName(nodes())
	if b := m["l7-b"]; b.State != NodeRefused || b.Lag == 0 || !strings.Contains(b.Error, "pool bad") {
		t.Fatalf("l7-b: %+v", b)
	}
	if m["l7-a"].State != NodeOK || m["l7-a"].Lag != 0 {
		t.Fatalf("l7-a: %+v", m["l7-a"])
	}

	// l4-a stops: its status goes with its lease, its seen record stays: lost.
	stopL4()
	until(t, "l4-a lost", func() (bool, string) {
		n := byName(nodes())["l4-a"]
		return n.State == NodeLost, n.State
	})
	if n := byName(nodes())["l4-a"]; n.UptimeSeconds != 0 || n.Address != "198.18.0.3:9090" {
		t.Fatalf("lost l4-a: %+v", n)
	}

	// A node that reports but has not reached a revision is pending: one whose
	// status (under a lease, as an agent writes it) is behind.
	cli := f.st.Client()
	lease, err := cli.Grant(context.Background(), 30)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(agent.Status{Node: "l7-c", Role: "l7d", AppliedRevision: r1, Started: time.Now(), Updated: time.Now()})
	if _, err := cli.Put(context.Background(), agent.StatusKey("l7-c"), string(st), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	a2 = f.do(t, viewer, "GET", "/v1/rollouts/"+strconv.FormatInt(r2, 10), "")
	if err := json.Unmarshal(a2.body, &ro); err != nil || ro.Applied != 1 || ro.Refused != 1 || ro.Pending != 1 || ro.Lost != 1 || len(ro.Nodes) != 4 {
		t.Fatalf("rollout with a pending and a lost node: %s", a2.body)
	}
	ns := nodes()
	if c := byName(ns)["l7-c"]; c.State != NodeOK || c.Lag != ns.Revision-r1 || c.Lag <= 0 {
		t.Fatalf("l7-c behind: %+v (configuration at %d)", c, ns.Revision)
	}
	if a := f.do(t, viewer, "GET", "/v1/rollouts/"+strconv.FormatInt(ns.Revision+100, 10), ""); a.status != http.StatusNotFound {
		t.Fatalf("the rollout of a revision not reached: %d %s", a.status, a.body)
	}
	// A lost node is forgotten by an admin; one that reports is not.
	if a := f.do(t, viewer, "DELETE", "/v1/nodes/l4-a", ""); a.status != http.StatusForbidden {
		t.Fatalf("a viewer forgot a node: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "DELETE", "/v1/nodes/l7-a", ""); a.status != http.StatusConflict || a.err.Code != CodeExists {
		t.Fatalf("forgetting a node that reports: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "DELETE", "/v1/nodes/l4-a", ""); a.status != http.StatusNoContent {
		t.Fatalf("forgetting a lost node: %d %s", a.status, a.body)
	}
	if _, ok := byName(nodes())["l4-a"]; ok {
		t.Fatal("a forgotten node is still listed")
	}
	if a := f.do(t, f.admin, "DELETE", "/v1/nodes/l4-a", ""); a.status != http.StatusNotFound {
		t.Fatalf("forgetting it again: %d %s", a.status, a.body)
	}
	if a := f.do(t, "", "GET", "/v1/nodes", ""); a.status != http.StatusUnauthorized {
		t.Fatalf("nodes without a token: %d", a.status)
	}
}
