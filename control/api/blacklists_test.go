package api

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// node is a real node agent with a real blacklist follower over the fixture's
// store, reporting the versions it enforces.
type node struct {
	f     *blsync.Follower
	mu    sync.Mutex
	lists map[string]*blacklist.List
}

func (n *node) list(name string) *blacklist.List {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lists[name] == nil {
		n.lists[name] = blacklist.NewList(name, blacklist.Options{})
	}
	return n.lists[name]
}

func (f *fixture) runNode(t *testing.T, name string) *node {
	t.Helper()
	n := &node{lists: map[string]*blacklist.List{}}
	var a *agent.Agent
	var amu sync.Mutex
	fl, err := blsync.NewFollower(blsync.FollowerConfig{Store: f.st, List: n.list, Logger: slog.New(slog.DiscardHandler),
		Changed: func() {
			amu.Lock()
			defer amu.Unlock()
			if a != nil {
				a.Report()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	n.f = fl
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	a, err = agent.New(agent.Config{Store: f.st, Node: name, Role: "l7d", Logger: slog.New(slog.DiscardHandler), Blacklists: fl.Versions,
		BlacklistHits: fl.Hits, HitsInterval: 50 * time.Millisecond,
		Apply: func(context.Context, *model.Snapshot, int64) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan struct{})
	go func() { defer close(adone); a.Run(actx) }()
	t.Cleanup(func() { acancel(); <-adone })
	return n
}

func decode[T any](t *testing.T, a answer) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(a.body, &v); err != nil {
		t.Fatalf("%s: %v", a.body, err)
	}
	return v
}

// TestBlacklistPushes: a risk engine replaces a list (text) and changes it by
// NDJSON and text deltas; bad lines are refused by their numbers and change
// nothing; a viewer reads and cannot push; the list's show and the operation say
// which nodes (real agents with real followers) applied it.
func TestBlacklistPushes(t *testing.T) {
	f := newFixture(t)
	risk := f.token(t, "crowdsec", RoleRiskEngine)
	viewer := f.token(t, "ops-view", RoleViewer)
	n1, n2 := f.runNode(t, "l7-a"), f.runNode(t, "l7-b")

	a := f.do(t, risk, "PUT", "/v1/blacklists/global", "198.51.100.7\n203.0.113.0/24 ttl=1h\n", "Content-Type", "text/plain")
	if a.status != http.StatusOK {
		t.Fatalf("replace: %d %s", a.status, a.body)
	}
	pr := decode[PushResult](t, a)
	if pr.Version != 1 || pr.Entries != 2 || pr.Operation == "" {
		t.Fatalf("replace answer %+v", pr)
	}
	if a := f.do(t, viewer, "PUT", "/v1/blacklists/global", "192.0.2.1\n"); a.status != http.StatusForbidden || a.err.Code != CodeForbidden {
		t.Fatalf("a viewer's push: %d %s", a.status, a.body)
	}
	if a := f.do(t, viewer, "POST", "/v1/blacklists/global/delta", `{"ip":"192.0.2.1"}`, "Content-Type", "application/x-ndjson"); a.status != http.StatusForbidden {
		t.Fatalf("a viewer's delta: %d %s", a.status, a.body)
	}

	a = f.do(t, risk, "POST", "/v1/blacklists/global/delta", `{"ip":"192.0.2.1","duration":"4h","reason":"scanner"}
{"cidr":"203.0.113.0/25","op":"remove"}
`, "Content-Type", "application/x-ndjson")
	if a.status != http.StatusOK {
		t.Fatalf("delta: %d %s", a.status, a.body)
	}
	if pr := decode[PushResult](t, a); pr.Version != 2 || pr.Added != 1 || pr.Removed != 1 {
		t.Fatalf("delta answer %+v", pr)
	}
	a = f.do(t, risk, "POST", "/v1/blacklists/global/delta", "+192.0.2.2 ttl=600\n-198.51.100.7\n", "Content-Type", "text/plain")
	if a.status != http.StatusOK || decode[PushResult](t, a).Version != 3 {
		t.Fatalf("text delta: %d %s", a.status, a.body)
	}

	// Bad lines: refused by number, nothing stored.
	a = f.do(t, risk, "POST", "/v1/blacklists/global/delta", `{"ip":"192.0.2.9"}
{"ip":"192.0.2.300"}
{"ip":"192.0.2.10","duration":"soon"}
`, "Content-Type", "application/x-ndjson")
	if a.status != http.StatusUnprocessableEntity || a.err.Code != CodeBadLines {
		t.Fatalf("bad lines: %d %s", a.status, a.body)
	}
	var bad struct {
		BadLines int `json:"bad_lines"`
		Lines    []struct {
			Line int `json:"line"`
		} `json:"lines"`
	}
	json.Unmarshal(a.body, &bad)
	if bad.BadLines != 2 || len(bad.Lines) != 2 || bad.Lines[0].Line != 2 || bad.Lines[1].Line != 3 {
		t.Fatalf("bad lines %s", a.body)
	}
	a = f.do(t, risk, "PUT", "/v1/blacklists/global", "192.0.2.1\nnot-an-address\n")
	if a.status != http.StatusUnprocessableEntity || a.err.Code != CodeBadLines || !strings.Contains(string(a.body), `"line": 2`) {
		t.Fatalf("bad text line: %d %s", a.status, a.body)
	}

	// Every node applies version 3; the show and the operation say so.
	until(t, "both nodes at version 3", func() (bool, string) {
		a := f.do(t, viewer, "GET", "/v1/blacklists/global", "")
		info := decode[BlacklistInfo](t, a)
		return a.status == http.StatusOK && info.Version == 3 && info.Applied == 2 && info.NodesTotal == 2, string(a.body)
	})
	for _, n := range []*node{n1, n2} {
		l := n.list("global")
		if !l.Contains(netip.MustParseAddr("192.0.2.1")) || !l.Contains(netip.MustParseAddr("192.0.2.2")) || l.Contains(netip.MustParseAddr("198.51.100.7")) ||
			l.Contains(netip.MustParseAddr("203.0.113.5")) || !l.Contains(netip.MustParseAddr("203.0.113.200")) || l.Contains(netip.MustParseAddr("192.0.2.9")) {
			t.Fatal("a node's list is not the one pushed")
		}
	}
	// Hits: each node's in its row, their sum in the show's.
	for i, n := range []*node{n1, n2} {
		for range 3 - i {
			n.list("global").Hit(blacklist.SourcePacket)
		}
	}
	until(t, "the nodes' hits in the show", func() (bool, string) {
		a := f.do(t, viewer, "GET", "/v1/blacklists/global", "")
		info := decode[BlacklistInfo](t, a)
		hits := map[string]uint64{}
		for _, n := range info.Nodes {
			hits[n.Node] = n.Hits
		}
		return info.Hits == 5 && hits["l7-a"] == 3 && hits["l7-b"] == 2, string(a.body)
	})

	a = f.do(t, viewer, "GET", "/v1/operations/"+pr.Operation, "")
	op := decode[Operation](t, a)
	if a.status != http.StatusOK || op.State != OpApplied || op.Message != "applied on 2 of 2 nodes" || op.Version != 1 || op.List != "global" {
		t.Fatalf("operation: %d %s", a.status, a.body)
	}
	a = f.do(t, viewer, "GET", "/v1/blacklists", "")
	var lists struct{ Lists []BlacklistInfo }
	json.Unmarshal(a.body, &lists)
	if len(lists.Lists) != 1 || lists.Lists[0].Name != "global" || lists.Lists[0].Version != 3 {
		t.Fatalf("lists: %s", a.body)
	}
	if a := f.do(t, viewer, "GET", "/v1/operations/0123456789abcdef01234567", ""); a.status != http.StatusNotFound {
		t.Fatalf("a missing operation: %d", a.status)
	}
	if a := f.do(t, viewer, "GET", "/v1/blacklists/nope", ""); a.status != http.StatusNotFound {
		t.Fatalf("a missing list: %d", a.status)
	}
	if !strings.Contains(f.audit.String(), "kind=blacklists name=global op=delta") {
		t.Fatalf("no audit line of the delta:\n%s", f.audit.String())
	}
}

// TestBlacklistIdempotency: a push retried with its Idempotency-Key gets the first
// answer and changes nothing more; another key pushes again.
func TestBlacklistIdempotency(t *testing.T) {
	f := newFixture(t)
	risk := f.token(t, "crowdsec", RoleRiskEngine)
	body := `{"ip":"192.0.2.1"}`
	first := f.do(t, risk, "POST", "/v1/blacklists/global/delta", body, "Content-Type", "application/x-ndjson", "Idempotency-Key", "k1")
	again := f.do(t, risk, "POST", "/v1/blacklists/global/delta", body, "Content-Type", "application/x-ndjson", "Idempotency-Key", "k1")
	if first.status != http.StatusOK || again.status != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s, retry %d %s", first.status, first.body, again.status, again.body)
	}
	if decode[PushResult](t, first) != decode[PushResult](t, again) {
		t.Fatalf("the retry's answer %s differs from the first %s", again.body, first.body)
	}
	other := f.do(t, risk, "POST", "/v1/blacklists/global/delta", body, "Content-Type", "application/x-ndjson", "Idempotency-Key", "k2")
	if decode[PushResult](t, other).Version != 2 {
		t.Fatalf("another key: %s", other.body)
	}
	// A failed push is not remembered: the same key may be retried once right.
	if a := f.do(t, risk, "PUT", "/v1/blacklists/global", "bad line\n", "Idempotency-Key", "k3"); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("bad push: %d", a.status)
	}
	if a := f.do(t, risk, "PUT", "/v1/blacklists/global", "192.0.2.7\n", "Idempotency-Key", "k3"); a.status != http.StatusOK || decode[PushResult](t, a).Version != 3 {
		t.Fatalf("the push retried right: %d %s", a.status, a.body)
	}
}

// TestBlacklistLargeReplace: a large list (binary, gzip) answers 202 with an
// operation that goes from pending to applied on the node; gzip NDJSON is read.
func TestBlacklistLargeReplace(t *testing.T) {
	f := newFixture(t)
	risk := f.token(t, "crowdsec", RoleRiskEngine)
	n := f.runNode(t, "l7-a")
	var b blacklist.Builder
	for i := 0; i < AsyncEntries+5000; i++ {
		j := 2 * i // apart, so that they do not merge into ranges
		b.AddAddr(netip.AddrFrom4([4]byte{10, byte(j >> 16), byte(j >> 8), byte(j)}), time.Time{})
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := blacklist.WriteBinary(zw, b.Build()); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	a := f.do(t, risk, "PUT", "/v1/blacklists/big", buf.String(), "Content-Type", "application/octet-stream", "Content-Encoding", "gzip")
	if a.status != http.StatusAccepted {
		t.Fatalf("large replace: %d %s", a.status, a.body)
	}
	pr := decode[PushResult](t, a)
	if pr.State != OpPending || pr.Entries != AsyncEntries+5000 || a.header.Get("Location") != "/v1/operations/"+pr.Operation {
		t.Fatalf("answer %+v %v", pr, a.header)
	}
	until(t, "the operation applied", func() (bool, string) {
		a := f.do(t, risk, "GET", "/v1/operations/"+pr.Operation, "")
		op := decode[Operation](t, a)
		return op.State == OpApplied && op.Version == 1 && op.Nodes == 1, string(a.body)
	})
	if l := n.list("big"); l.Len() != AsyncEntries+5000 || !l.Contains(netip.MustParseAddr("10.1.0.6")) || l.Contains(netip.MustParseAddr("10.1.0.7")) {
		t.Fatalf("the node's list has %d entries, not the pushed ones", l.Len())
	}

	var nd bytes.Buffer
	zw = gzip.NewWriter(&nd)
	for i := 0; i < 3; i++ {
		fmt.Fprintf(zw, `{"ip":"198.51.100.%d","expires":"2100-01-01T00:00:00Z"}`+"\n", i)
	}
	zw.Close()
	a = f.do(t, risk, "PUT", "/v1/blacklists/big", nd.String(), "Content-Type", "application/x-ndjson")
	if a.status != http.StatusOK || decode[PushResult](t, a).Version != 2 || decode[PushResult](t, a).Entries != 3 {
		t.Fatalf("gzip NDJSON: %d %s", a.status, a.body)
	}
}

// TestBlacklistOpenAPI: the document has the blacklist routes.
func TestBlacklistOpenAPI(t *testing.T) {
	f := newFixture(t)
	a := f.do(t, "", "GET", "/v1/openapi.json", "")
	for _, p := range []string{`"/v1/blacklists"`, `"/v1/blacklists/{name}"`, `"/v1/blacklists/{name}/delta"`, `"/v1/operations/{id}"`} {
		if !bytes.Contains(a.body, []byte(p)) {
			t.Errorf("the OpenAPI document has no %s", p)
		}
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name string `json:"name"`
			} `json:"parameters"`
			RequestBody struct {
				Content map[string]any `json:"content"`
			} `json:"requestBody"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(a.body, &doc); err != nil {
		t.Fatal(err)
	}
	put := doc.Paths["/v1/blacklists/{name}"]["put"]
	var names []string
	for _, p := range put.Parameters {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "name,Idempotency-Key" || put.RequestBody.Content["application/x-ndjson"] == nil {
		t.Fatalf("the push's parameters %v and bodies %v", names, put.RequestBody.Content)
	}
}
