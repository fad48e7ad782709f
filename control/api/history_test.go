package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/control/store"
)

// put writes a pool through the API and returns the revision it committed at.
func (f *fixture) putPool(t *testing.T, token, name, addr string, ifRev int64) int64 {
	t.Helper()
	body := `{"name":"` + name + `","members":[{"addr":"` + addr + `"}]}`
	hdr := []string{"If-None-Match", "*"}
	if ifRev > 0 {
		hdr = []string{"If-Match", etag2(ifRev)}
	}
	a := f.do(t, token, "PUT", "/v1/pools/"+name, body, hdr...)
	var c Committed
	if a.status != http.StatusOK || json.Unmarshal(a.body, &c) != nil {
		t.Fatalf("putting pool %s: %d %s", name, a.status, a.body)
	}
	return c.Revision
}

// TestRevisionsAndDiff: every write is listed with who made it and what it
// changed, and the diff between two revisions has each object before and after.
func TestRevisionsAndDiff(t *testing.T) {
	f := newFixture(t)
	policy := f.token(t, "ops-policy", RolePolicyOperator)
	viewer := f.token(t, "ops-view", RoleViewer)
	r1 := f.putPool(t, f.admin, "app", "198.18.1.1:80", 0)
	r2 := f.putPool(t, policy, "app", "198.18.1.2:80", r1)
	c := f.do(t, policy, "POST", "/v1/changesets", `{"changes":[
		{"kind":"pools","name":"api","object":{"name":"api","members":[{"addr":"198.18.1.3:80"}]},"if_revision":0},
		{"kind":"pools","name":"app","delete":true,"if_revision":`+strconv.FormatInt(r2, 10)+`}]}`)
	var done Committed
	if c.status != http.StatusOK || json.Unmarshal(c.body, &done) != nil {
		t.Fatalf("change set: %d %s", c.status, c.body)
	}
	r3 := done.Revision

	a := f.do(t, viewer, "GET", "/v1/revisions?limit=10", "")
	var revs struct {
		Revisions []struct {
			Revision int64  `json:"revision"`
			Time     string `json:"time"`
			Who      string `json:"who"`
			Changes  []struct {
				Op, Kind, Name string
			} `json:"changes"`
		} `json:"revisions"`
	}
	if a.status != http.StatusOK || json.Unmarshal(a.body, &revs) != nil {
		t.Fatalf("revisions: %d %s", a.status, a.body)
	}
	if len(revs.Revisions) != 3 {
		t.Fatalf("revisions: %s", a.body)
	}
	newest, oldest := revs.Revisions[0], revs.Revisions[2]
	if newest.Revision != r3 || newest.Who != "ops-policy" || newest.Time == "" || len(newest.Changes) != 2 ||
		newest.Changes[0].Op != "put" || newest.Changes[0].Name != "api" || newest.Changes[1].Op != "delete" || newest.Changes[1].Kind != "pools" {
		t.Fatalf("revision %d: %+v", r3, newest)
	}
	if oldest.Revision != r1 || oldest.Who != "admin" {
		t.Fatalf("revision %d: %+v", r1, oldest)
	}
	a = f.do(t, viewer, "GET", "/v1/revisions?limit=1", "")
	if json.Unmarshal(a.body, &revs) != nil || len(revs.Revisions) != 1 || revs.Revisions[0].Revision != r3 {
		t.Fatalf("limit 1: %s", a.body)
	}
	one := f.do(t, viewer, "GET", "/v1/revisions/"+strconv.FormatInt(r2, 10), "")
	var rev store.Revision
	if one.status != http.StatusOK || json.Unmarshal(one.body, &rev) != nil || rev.Who != "ops-policy" || rev.Revision != r2 {
		t.Fatalf("revision %d: %d %s", r2, one.status, one.body)
	}
	if a := f.do(t, viewer, "GET", "/v1/revisions/"+strconv.FormatInt(r3+50, 10), ""); a.status != http.StatusNotFound {
		t.Fatalf("a revision that is no write: %d %s", a.status, a.body)
	}
	if a := f.do(t, viewer, "GET", "/v1/revisions/x", ""); a.status != http.StatusBadRequest {
		t.Fatalf("a revision that is no number: %d %s", a.status, a.body)
	}

	d := f.do(t, viewer, "GET", "/v1/diff?from="+strconv.FormatInt(r1, 10), "")
	var diff Diff
	if d.status != http.StatusOK || json.Unmarshal(d.body, &diff) != nil {
		t.Fatalf("diff: %d %s", d.status, d.body)
	}
	if diff.From != r1 || diff.To < r3 || len(diff.Changes) != 2 ||
		diff.Changes[0].Name != "api" || diff.Changes[0].Op != "put" || diff.Changes[0].Before != nil || !strings.Contains(string(diff.Changes[0].After), "198.18.1.3") ||
		diff.Changes[1].Name != "app" || diff.Changes[1].Op != "delete" || !strings.Contains(string(diff.Changes[1].Before), "198.18.1.1") || diff.Changes[1].After != nil {
		t.Fatalf("diff from %d: %s", r1, d.body)
	}
	d = f.do(t, viewer, "GET", "/v1/diff?from="+strconv.FormatInt(r1, 10)+"&to="+strconv.FormatInt(r2, 10), "")
	if err := json.Unmarshal(d.body, &diff); err != nil || diff.To != r2 || len(diff.Changes) != 1 ||
		!strings.Contains(string(diff.Changes[0].Before), "198.18.1.1") || !strings.Contains(string(diff.Changes[0].After), "198.18.1.2") {
		t.Fatalf("diff %d..%d: %s", r1, r2, d.body)
	}
	if a := f.do(t, viewer, "GET", "/v1/diff", ""); a.status != http.StatusBadRequest {
		t.Fatalf("a diff without from: %d %s", a.status, a.body)
	}
	if err := f.st.Compact(context.Background(), r3); err != nil {
		t.Fatal(err)
	}
	if a := f.do(t, viewer, "GET", "/v1/diff?from="+strconv.FormatInt(r1, 10), ""); a.status != http.StatusGone || a.err.Code != CodeCompacted {
		t.Fatalf("a diff from a compacted revision: %d %s", a.status, a.body)
	}
}

// TestChangeSetDryRun: a dry run checks the change set and answers its diff,
// storing nothing; one the check refuses is answered as the commit would be.
func TestChangeSetDryRun(t *testing.T) {
	f := newFixture(t)
	r1 := f.putPool(t, f.admin, "app", "198.18.1.1:80", 0)
	body := `{"changes":[
		{"kind":"pools","name":"api","object":{"name":"api","members":[{"addr":"198.18.1.3:80"}]},"if_revision":0},
		{"kind":"pools","name":"app","object":{"name":"app","members":[{"addr":"198.18.1.2:80"}]},"if_revision":` + strconv.FormatInt(r1, 10) + `}]}`
	a := f.do(t, f.admin, "POST", "/v1/changesets?dry_run=true", body)
	var dr DryRun
	if a.status != http.StatusOK || json.Unmarshal(a.body, &dr) != nil {
		t.Fatalf("dry run: %d %s", a.status, a.body)
	}
	if !dr.DryRun || dr.Revision < r1 || len(dr.Changes) != 2 || dr.Changes[0].Name != "api" || dr.Changes[0].Before != nil ||
		!strings.Contains(string(dr.Changes[1].Before), "198.18.1.1") || !strings.Contains(string(dr.Changes[1].After), "198.18.1.2") {
		t.Fatalf("dry run: %s", a.body)
	}
	if g := f.do(t, f.admin, "GET", "/v1/pools/api", ""); g.status != http.StatusNotFound {
		t.Fatalf("the dry run stored: %d %s", g.status, g.body)
	}
	if head, _ := f.st.Head(context.Background()); head != r1 {
		t.Fatalf("the dry run wrote: head %d, want %d", head, r1)
	}
	dangling := `{"changes":[{"kind":"routing","name":"web","object":{"name":"web","vhosts":[{"names":["*"],"routes":[{"action":{"pool":"missing"}}]}]},"if_revision":0}]}`
	if a := f.do(t, f.admin, "POST", "/v1/changesets?dry_run=true", dangling); a.status != http.StatusUnprocessableEntity || a.err.Code != CodeInvalid {
		t.Fatalf("a dry run of a dangling reference: %d %s", a.status, a.body)
	}
	stale := strings.Replace(body, `"if_revision":0}`, `"if_revision":`+strconv.FormatInt(r1, 10)+`}`, 1)
	if a := f.do(t, f.admin, "POST", "/v1/changesets?dry_run=true", stale); a.status != http.StatusPreconditionFailed {
		t.Fatalf("a dry run of a stale change: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "POST", "/v1/changesets?dry_run=maybe", body); a.status != http.StatusBadRequest {
		t.Fatalf("dry_run=maybe: %d %s", a.status, a.body)
	}
	viewer := f.token(t, "ops-view", RoleViewer)
	if a := f.do(t, viewer, "POST", "/v1/changesets?dry_run=true", body); a.status != http.StatusForbidden {
		t.Fatalf("a viewer's dry run: %d %s", a.status, a.body)
	}
}

// TestRollback: a rollback makes the objects equal to those of an earlier
// revision in one write, recorded as its token's; it is refused when the
// configuration moved on past expect_revision (412), when the revision was
// compacted (410), and for a role that may not write every kind it changes.
func TestRollback(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	r1 := f.putPool(t, f.admin, "app", "198.18.1.1:80", 0)
	r2 := f.putPool(t, f.admin, "app", "198.18.1.2:80", r1)
	r3 := f.putPool(t, f.admin, "api", "198.18.1.3:80", 0)
	policy := f.token(t, "ops-policy", RolePolicyOperator)
	certOp := f.token(t, "ops-certs", RoleCertOperator)
	viewer := f.token(t, "ops-view", RoleViewer)
	req := func(to, expect int64, dry bool) string {
		return `{"revision":` + strconv.FormatInt(to, 10) + `,"expect_revision":` + strconv.FormatInt(expect, 10) + `,"dry_run":` + strconv.FormatBool(dry) + `}`
	}

	if a := f.do(t, policy, "POST", "/v1/rollback", req(r1, r2, false)); a.status != http.StatusPreconditionFailed || a.err.Code != CodeConflict {
		t.Fatalf("a rollback against a stale revision: %d %s", a.status, a.body)
	}
	if a := f.do(t, policy, "POST", "/v1/rollback", `{"revision":`+strconv.FormatInt(r1, 10)+`}`); a.status != http.StatusPreconditionRequired {
		t.Fatalf("a rollback without expect_revision: %d %s", a.status, a.body)
	}
	for _, tok := range []string{certOp, viewer} {
		if a := f.do(t, tok, "POST", "/v1/rollback", req(r1, r3, false)); a.status != http.StatusForbidden || a.err.Code != CodeForbidden {
			t.Fatalf("a rollback of pools by a role that may not write them: %d %s", a.status, a.body)
		}
	}
	dry := f.do(t, policy, "POST", "/v1/rollback", req(r1, r3, true))
	var out RevisionRollback
	if dry.status != http.StatusOK || json.Unmarshal(dry.body, &out) != nil || !out.DryRun || out.Revision != r3 || len(out.Changes) != 2 {
		t.Fatalf("dry run of the rollback: %d %s", dry.status, dry.body)
	}
	if head, _ := f.st.Head(ctx); head != r3 {
		t.Fatalf("the rollback's dry run wrote: head %d", head)
	}

	a := f.do(t, policy, "POST", "/v1/rollback", req(r1, r3, false))
	if a.status != http.StatusOK || json.Unmarshal(a.body, &out) != nil || out.Revision <= r3 || out.To != r1 || len(out.Changes) != 2 {
		t.Fatalf("rollback: %d %s", a.status, a.body)
	}
	now, err := f.st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at, err := f.st.SnapshotAt(ctx, r1)
	if err != nil {
		t.Fatal(err)
	}
	if d := store.Diff(now, at); len(d) != 0 {
		t.Fatalf("after the rollback the objects differ from revision %d: %+v", r1, d)
	}
	rev, err := f.st.RevisionAt(ctx, out.Revision)
	if err != nil || rev.Who != "ops-policy" || len(rev.Changes) != 2 {
		t.Fatalf("the rollback's revision: %+v %v", rev, err)
	}
	if !strings.Contains(f.audit.String(), "audit: rollback") {
		t.Errorf("the rollback is not audit-logged:\n%s", f.audit.String())
	}
	// Nothing left to change: answered without a write.
	last := out.Revision
	a = f.do(t, policy, "POST", "/v1/rollback", req(r1, last, false))
	if a.status != http.StatusOK || json.Unmarshal(a.body, &out) != nil || out.Changes == nil || len(out.Changes) != 0 || out.Revision != last {
		t.Fatalf("a rollback to what is in force: %d %s", a.status, a.body)
	}

	if err := f.st.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	if a := f.do(t, policy, "POST", "/v1/rollback", req(r2, last, false)); a.status != http.StatusGone || a.err.Code != CodeCompacted {
		t.Fatalf("a rollback to a compacted revision: %d %s", a.status, a.body)
	}
}
