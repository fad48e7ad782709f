package tgctl

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
)

// requireRoutes fails the test when the API does not serve a route it needs.
func (f *fixture) requireRoutes(t *testing.T, routes ...string) {
	t.Helper()
	for _, rt := range routes {
		if !f.served(rt) {
			t.Fatalf("the API does not serve %s", rt)
		}
	}
}

// appliedRevision runs apply -f and returns the revision it printed.
func (f *fixture) apply(t *testing.T, file string) int64 {
	t.Helper()
	r := f.run(t, "apply", "-f", file, "-o", "json")
	var ans struct{ Revision int64 }
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ans) != nil || ans.Revision == 0 {
		t.Fatalf("apply -f %s: %d\n%s%s", file, r.code, r.stdout, r.stderr)
	}
	return ans.Revision
}

var editedYAML = strings.Replace(webYAML, "198.18.1.1:80", "198.18.1.2:80", 1) + `---
kind: pools
name: new
members: [{addr: 198.18.1.5:80}]
`

func TestDiff(t *testing.T) {
	f := newFixture(t)
	f.requireRoutes(t, "POST /v1/changesets")
	file := f.file(t, "web.yaml", webYAML)
	f.apply(t, file)
	head, err := f.st.Head(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	if r := f.run(t, "diff", "-f", file); r.code != 0 || r.stdout != "" {
		t.Fatalf("diff of what is stored: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	edited := f.file(t, "edited.yaml", editedYAML)
	r := f.run(t, "diff", "-f", edited)
	if r.code != 1 {
		t.Fatalf("diff with differences: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"--- pools/app (revision ", "+++ pools/app (as in " + edited + ")", "\n-  - addr: 198.18.1.1:80\n+  - addr: 198.18.1.2:80\n",
		"--- pools/new (absent)\n+++ pools/new (as in ", "\n+kind: pools\n+name: new\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("diff lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "l4-rules") {
		t.Errorf("diff shows an unchanged object:\n%s", r.stdout)
	}
	if now, _ := f.st.Head(context.Background()); now != head {
		t.Fatalf("diff wrote: the head moved from %d to %d", head, now)
	}
	r = f.run(t, "diff", "-f", edited, "-o", "json")
	var ans struct {
		Changes []struct{ Op, Kind, Name string }
	}
	if r.code != 1 || json.Unmarshal([]byte(r.stdout), &ans) != nil || len(ans.Changes) != 2 {
		t.Fatalf("diff -o json: %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Refused by the dry run: 4 and the field, not 1.
	bad := f.file(t, "bad.yaml", strings.Replace(webYAML, "pool: l7", "pool: missing", 1))
	if r := f.run(t, "diff", "-f", bad); r.code != ExitInvalid || !strings.Contains(r.stderr, "\n  l4-rules/https.pool: ") {
		t.Fatalf("diff of a refused file: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Another error: 8, never 1.
	if r := f.run(t, "diff", "-f", f.dir+"/none.yaml"); r.code != ExitDiffFailed {
		t.Fatalf("diff of a file that is not there: %d %s", r.code, r.stderr)
	}
	if now, _ := f.st.Head(context.Background()); now != head {
		t.Fatalf("diff wrote: the head moved from %d to %d", head, now)
	}
}

func TestRevisionsDiffRevisionsRollback(t *testing.T) {
	f := newFixture(t)
	f.requireRoutes(t, "GET /v1/revisions", "GET /v1/diff", "POST /v1/rollback")
	r1 := f.apply(t, f.file(t, "web.yaml", webYAML))
	r2 := f.apply(t, f.file(t, "edited.yaml", editedYAML))

	r := f.run(t, "revisions", "-o", "json")
	var revs struct {
		Revisions []struct {
			Revision int64
			Who      string
			Changes  []struct{ Op, Kind, Name string }
		}
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &revs) != nil || len(revs.Revisions) != 2 ||
		revs.Revisions[0].Revision != r2 || revs.Revisions[0].Who != "admin" || len(revs.Revisions[0].Changes) != 2 {
		t.Fatalf("revisions -o json: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// One row, r2's: the revision is each row's first column (a time's digits
	// elsewhere in the row may read like r1).
	if r := f.run(t, "revisions", "--limit", "1"); r.code != 0 || !strings.Contains(r.stdout, "put pools/app") || !slices.Equal(firstColumn(r.stdout), []string{"REVISION", strconv.FormatInt(r2, 10)}) {
		t.Fatalf("revisions --limit 1: %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	r = f.run(t, "diff-revisions", strconv.FormatInt(r1, 10), strconv.FormatInt(r2, 10))
	if r.code != 0 || !strings.Contains(r.stdout, "-  - addr: 198.18.1.1:80\n+  - addr: 198.18.1.2:80") || !strings.Contains(r.stdout, "+name: new") {
		t.Fatalf("diff-revisions: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := f.run(t, "diff-revisions", strconv.FormatInt(r1, 10), "-o", "yaml"); r.code != 0 || yaml.Unmarshal([]byte(r.stdout), new(map[string]any)) != nil {
		t.Fatalf("diff-revisions -o yaml: %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Completion offers the revisions, newest first, with who and what.
	if r := f.run(t, "__complete", "rollback", ""); r.code != 0 || !strings.HasPrefix(r.stdout, strconv.FormatInt(r2, 10)+"\tadmin: put pools/app") {
		t.Fatalf("completing a revision: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A dry run shows the diff back to r1 and stores nothing.
	head, _ := f.st.Head(context.Background())
	r = f.run(t, "rollback", strconv.FormatInt(r1, 10), "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "-  - addr: 198.18.1.2:80\n+  - addr: 198.18.1.1:80") || !strings.Contains(r.stdout, "dry run") {
		t.Fatalf("rollback --dry-run: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if now, _ := f.st.Head(context.Background()); now != head {
		t.Fatalf("rollback --dry-run wrote: the head moved from %d to %d", head, now)
	}
	// A rollback expecting a revision that is not the current one: 3.
	if r := f.run(t, "rollback", strconv.FormatInt(r1, 10), "--expect-revision", strconv.FormatInt(r1, 10)); r.code != ExitConflict {
		t.Fatalf("rollback with a stale --expect-revision: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := f.run(t, "rollback", strconv.FormatInt(r1, 10)); r.code != 0 || !strings.Contains(r.stdout, "rolled back to revision "+strconv.FormatInt(r1, 10)) {
		t.Fatalf("rollback: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := f.run(t, "get", "pools", "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, "198.18.1.1:80") || strings.Contains(r.stdout, `"new"`) {
		t.Fatalf("after the rollback: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// startAgent runs a node agent over the fixture's store; refuse names a pool whose
// presence makes it refuse a snapshot.
func (f *fixture) startAgent(t *testing.T, node, refuse string) (stop func()) {
	t.Helper()
	a, err := agent.New(agent.Config{
		Store: f.st, Node: node, Role: "l7d", Address: "198.18.0.1:443",
		Certificates: func() []agent.CertInUse {
			return []agent.CertInUse{{Name: "www", Version: 3, SHA256: strings.Repeat("ab", 32)}}
		},
		Apply: func(_ context.Context, snap *model.Snapshot, _ int64) error {
			if refuse != "" && snap.Pools[refuse] != nil {
				return errors.New("pool " + refuse + " is not for this node")
			}
			return nil
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func TestRolloutStatusAndNodes(t *testing.T) {
	f := newFixture(t)
	f.requireRoutes(t, "GET /v1/rollouts/{revision}", "GET /v1/nodes")
	f.startAgent(t, "l7-a", "")
	stopB := f.startAgent(t, "l7-b", "picky")
	rev := f.apply(t, f.file(t, "web.yaml", webYAML))

	r := f.run(t, "rollout", "status", strconv.FormatInt(rev, 10), "--wait", "20s", "--interval", "50ms")
	if r.code != 0 || !strings.Contains(r.stdout, "2 applied, 0 refused, 0 pending") {
		t.Fatalf("rollout status --wait: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	rev2 := f.apply(t, f.file(t, "picky.yaml", "kind: pools\nname: picky\nmembers: [{addr: 198.18.1.8:80}]\n"))
	r = f.run(t, "rollout", "status", "--wait", "20s", "--interval", "50ms", "-o", "json")
	var ro struct {
		Revision         int64
		Applied, Refused int
		Nodes            []struct{ Node, State, Error string }
	}
	if r.code != ExitError || json.Unmarshal([]byte(r.stdout), &ro) != nil || ro.Revision != rev2 || ro.Applied != 1 || ro.Refused != 1 || !strings.Contains(r.stderr, "refused by 1 node") {
		t.Fatalf("rollout status of a refused revision: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, n := range ro.Nodes {
		if n.Node == "l7-b" && (n.State != "refused" || !strings.Contains(n.Error, "not for this node")) {
			t.Errorf("the refusing node: %+v", n)
		}
	}

	r = f.run(t, "nodes")
	if r.code != 0 || !strings.Contains(r.stdout, "l7-a") || !strings.Contains(r.stdout, "198.18.0.1:443") || !strings.Contains(r.stdout, "www@3:abababababab") {
		t.Fatalf("nodes: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, "nodes", "-o", "yaml")
	var nodes struct {
		Nodes []struct {
			Node, State  string
			Certificates []struct{ SHA256 string }
		}
	}
	if r.code != 0 || yaml.Unmarshal([]byte(r.stdout), &nodes) != nil || len(nodes.Nodes) != 2 || len(nodes.Nodes[0].Certificates) != 1 {
		t.Fatalf("nodes -o yaml: %d %+v\n%s%s", r.code, nodes, r.stdout, r.stderr)
	}

	// A node that reports is not forgotten; one stopped is lost, then forgotten.
	if r := f.run(t, "nodes", "forget", "l7-b"); r.code != ExitError || !strings.Contains(r.stderr, "reports") {
		t.Fatalf("forgetting a node that reports: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	stopB()
	if r := f.run(t, "nodes"); r.code != 0 || !regexp.MustCompile(`(?m)^l7-b .* lost `).MatchString(r.stdout) {
		t.Fatalf("nodes after l7-b stopped: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := f.run(t, "nodes", "forget", "l7-b"); r.code != 0 || !strings.Contains(r.stdout, "node l7-b forgotten") {
		t.Fatalf("nodes forget: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := f.run(t, "nodes"); r.code != 0 || strings.Contains(r.stdout, "l7-b") {
		t.Fatalf("nodes after forget: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := f.run(t, "nodes", "forget", "l7-b"); r.code != ExitNotFound {
		t.Fatalf("forgetting it again: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestDiffRefusesAControldWithoutDryRun: against an API whose document does not
// give the change sets a dry_run parameter (a controld from before dry runs, which
// would commit), diff sends nothing and fails.
func TestDiffRefusesAControldWithoutDryRun(t *testing.T) {
	f := newFixture(t)
	f.apply(t, f.file(t, "web.yaml", webYAML))
	head, _ := f.st.Head(context.Background())
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/openapi.json" {
			f.srv.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		f.srv.ServeHTTP(rec, r)
		var doc map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
			t.Errorf("the API's document: %v", err)
		}
		delete(doc["paths"].(map[string]any)["/v1/changesets"].(map[string]any)["post"].(map[string]any), "parameters")
		json.NewEncoder(w).Encode(doc)
	}))
	defer old.Close()
	r := f.runEnv(t, map[string]string{EnvAPI: old.URL, EnvToken: f.admin}, "", "diff", "-f", f.file(t, "edited.yaml", editedYAML))
	if r.code != ExitDiffFailed || !strings.Contains(r.stderr, "does not take dry runs") {
		t.Fatalf("diff against a controld without dry runs: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if now, _ := f.st.Head(context.Background()); now != head {
		t.Fatalf("the head moved from %d to %d", head, now)
	}
}

// TestRolloutStatusWaitTimesOut: a node still applying when --wait's time is up
// makes rollout status exit 1, saying how many are pending.
func TestRolloutStatusWaitTimesOut(t *testing.T) {
	f := newFixture(t)
	f.requireRoutes(t, "GET /v1/rollouts/{revision}")
	release := make(chan struct{})
	a, err := agent.New(agent.Config{
		Store: f.st, Node: "slow", Role: "l7d", Logger: slog.New(slog.DiscardHandler),
		Apply: func(ctx context.Context, snap *model.Snapshot, _ int64) error {
			if snap.Pools["app"] == nil {
				return nil
			}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	rev := f.apply(t, f.file(t, "web.yaml", webYAML))
	r := f.run(t, "rollout", "status", strconv.FormatInt(rev, 10), "--wait", "300ms", "--interval", "50ms")
	if r.code != ExitError || !strings.Contains(r.stderr, "1 node(s) still pending after 300ms") || !strings.Contains(r.stdout, "1 pending") {
		t.Fatalf("rollout status with a node still applying: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Without --wait it only reports.
	if r := f.run(t, "rollout", "status", strconv.FormatInt(rev, 10)); r.code != 0 || !strings.Contains(r.stdout, "1 pending") {
		t.Fatalf("rollout status without --wait: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	close(release)
	if r := f.run(t, "rollout", "status", strconv.FormatInt(rev, 10), "--wait", "20s", "--interval", "50ms"); r.code != 0 || !strings.Contains(r.stdout, "1 applied") {
		t.Fatalf("rollout status once applied: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// firstColumn returns the first field of each non-empty line of a table.
func firstColumn(table string) []string {
	var out []string
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}
