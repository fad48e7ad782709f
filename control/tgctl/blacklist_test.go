package tgctl

import (
	"context"
	"encoding/json"
	"fmt"
	"go/build"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/api"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// blNode is a real node agent with a real blacklist follower over the fixture's
// store.
type blNode struct {
	mu    sync.Mutex
	lists map[string]*blacklist.List
}

func (n *blNode) list(name string) *blacklist.List {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lists[name] == nil {
		n.lists[name] = blacklist.NewList(name, blacklist.Options{})
	}
	return n.lists[name]
}

func (f *fixture) startBlacklistNode(t *testing.T, name string) *blNode {
	t.Helper()
	n := &blNode{lists: map[string]*blacklist.List{}}
	var mu sync.Mutex
	var a *agent.Agent
	fl, err := blsync.NewFollower(blsync.FollowerConfig{Store: f.st, List: n.list, Logger: slog.New(slog.DiscardHandler),
		Changed: func() {
			mu.Lock()
			defer mu.Unlock()
			if a != nil {
				a.Report()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	a, err = agent.New(agent.Config{Store: f.st, Node: name, Role: "l7d", Blacklists: fl.Versions,
		BlacklistHits: fl.Hits, HitsInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Apply: func(context.Context, *model.Snapshot, int64) error { return nil }})
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); fl.Run(ctx) }()
	go func() { defer wg.Done(); a.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return n
}

// TestBlacklistCommands: add (with a duration and a reason) and remove change the
// list a real node enforces; push replaces it from a file; bad lines exit 4 with
// their numbers; show gives the size, version and each node's version; list;
// a viewer cannot push (exit 6).
func TestBlacklistCommands(t *testing.T) {
	f := newFixture(t)
	risk := f.token(t, "crowdsec", "risk-engine")
	viewer := f.token(t, "ops-view", "viewer")
	n := f.startBlacklistNode(t, "l7-a")
	as := func(tok string, args ...string) result {
		return f.runEnv(t, map[string]string{EnvAPI: f.hs.URL, EnvToken: tok, "HOME": f.dir}, "", args...)
	}

	r := as(risk, "blacklist", "add", "--ip", "198.51.100.7", "-d", "4h", "-R", "scanner")
	if r.code != 0 || !strings.Contains(r.stdout, "198.51.100.7 added to blacklist global: version 1") {
		t.Fatalf("add: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = as(risk, "blacklist", "add", "--cidr", "203.0.113.0/24")
	if r.code != 0 {
		t.Fatalf("add --cidr: %d %s", r.code, r.stderr)
	}
	r = as(risk, "blacklist", "remove", "--cidr", "203.0.113.0/25")
	if r.code != 0 || !strings.Contains(r.stdout, "removed from blacklist global: version 3") {
		t.Fatalf("remove: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = as(risk, "blacklist", "show", "global", "-o", "json")
	var info blacklistInfo
	for i := 0; i < 500 && (info.Applied != 1 || info.Version != 3); i++ {
		r = as(risk, "blacklist", "show", "global", "-o", "json")
		if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
			t.Fatalf("show -o json: %d %s %s", r.code, r.stdout, r.stderr)
		}
	}
	if info.Applied != 1 || len(info.Nodes) != 1 || info.Nodes[0].Node != "l7-a" || info.Nodes[0].Version != 3 {
		t.Fatalf("show: %+v", info)
	}
	l := n.list("global")
	if !l.Contains(netip.MustParseAddr("198.51.100.7")) || l.Contains(netip.MustParseAddr("203.0.113.1")) || !l.Contains(netip.MustParseAddr("203.0.113.201")) {
		t.Fatal("the node does not enforce what was added and removed")
	}
	// Hits the node counted: in its row and the list's total.
	l.Hit(blacklist.SourcePacket)
	l.Hit(blacklist.SourceHeader)
	for deadline := time.Now().Add(10 * time.Second); info.Hits != 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		r = as(risk, "blacklist", "show", "global", "-o", "json")
		if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
			t.Fatalf("show -o json: %d %s %s", r.code, r.stdout, r.stderr)
		}
	}
	if info.Hits != 2 || len(info.Nodes) != 1 || info.Nodes[0].Hits != 2 {
		t.Fatalf("show's hits: %+v", info)
	}
	r = as(risk, "blacklist", "show", "global")
	if r.code != 0 || !strings.Contains(r.stdout, "l7-a") || !strings.Contains(r.stdout, "applied") || !strings.Contains(r.stdout, "1/1") {
		t.Fatalf("show:\n%s%s", r.stdout, r.stderr)
	}
	if fs := strings.Fields(lineWith(r.stdout, "l7-a")); len(fs) != 5 || fs[4] != "2" || !strings.Contains(r.stdout, "HITS") {
		t.Fatalf("show: the node's row %q has no hits column of 2:\n%s", fs, r.stdout)
	}

	file := f.file(t, "list.txt", "192.0.2.1\n192.0.2.2 ttl=1h\n# a comment\n2001:db8::/48\n")
	r = as(risk, "blacklist", "push", "edge", "-f", file)
	if r.code != 0 || !strings.Contains(r.stdout, "blacklist edge: 3 entries, version 1") {
		t.Fatalf("push: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	bad := f.file(t, "bad.ndjson", `{"ip":"192.0.2.1"}`+"\n"+`{"ip":"192.0.2.300"}`+"\n")
	r = as(risk, "blacklist", "push", "edge", "-f", bad)
	if r.code != ExitInvalid || !strings.Contains(r.stderr, "line 2") {
		t.Fatalf("push of bad lines: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = as(viewer, "blacklist", "push", "edge", "-f", file)
	if r.code != ExitAuth {
		t.Fatalf("a viewer's push: %d %s", r.code, r.stderr)
	}
	r = as(viewer, "blacklist", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "edge") || !strings.Contains(r.stdout, "global") {
		t.Fatalf("list:\n%s%s", r.stdout, r.stderr)
	}
	if r := as(viewer, "__complete", "blacklist", "show", "ed"); r.code != 0 || !strings.HasPrefix(r.stdout, "edge\tversion 1, 3 entries\n") {
		t.Fatalf("completion of a list's name: %d %q", r.code, r.stdout)
	}
	if r := as(risk, "blacklist", "add", "--ip", "nope"); r.code != ExitUsage {
		t.Fatalf("add --ip nope: %d", r.code)
	}
	if r := as(risk, "blacklist", "show", "missing"); r.code != ExitNotFound {
		t.Fatalf("show of a missing list: %d", r.code)
	}
}

// TestBlacklistPushWait: a large push is answered with an operation, and --wait
// polls it until the node applied it.
func TestBlacklistPushWait(t *testing.T) {
	f := newFixture(t)
	n := f.startBlacklistNode(t, "l7-a")
	var b strings.Builder
	for i := 0; i < api.AsyncEntries+10; i++ {
		j := 2 * i
		fmt.Fprintf(&b, "10.%d.%d.%d\n", byte(j>>16), byte(j>>8), byte(j))
	}
	file := f.file(t, "big.txt", b.String())
	r := f.run(t, "blacklist", "push", "big", "-f", file, "--wait", "60s", "--interval", "50ms")
	if r.code != 0 || !strings.Contains(r.stdout, "applied on 1 of 1 nodes") {
		t.Fatalf("push --wait: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := n.list("big").Len(); got != api.AsyncEntries+10 {
		t.Fatalf("the node enforces %d entries", got)
	}
}

// TestNoServerImports: tgctl shares no code with the server, so its binary does
// not carry the store and etcd's client.
func TestNoServerImports(t *testing.T) {
	pkg, err := build.Default.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/tiergate/tiergate/control/") || strings.HasPrefix(imp, "go.etcd.io/") {
			t.Errorf("tgctl imports %s", imp)
		}
	}
}

// lineWith is the first line of s holding sub.
func lineWith(s, sub string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			return line
		}
	}
	return ""
}
