package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/testkit/testenv"
)

type fixture struct {
	st    *store.Store
	srv   *Server
	hs    *httptest.Server
	admin string
	audit *testenv.LockedBuffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	audit := &testenv.LockedBuffer{}
	log := slog.New(slog.NewTextHandler(audit, nil))
	st, err := store.Open(context.Background(), store.Config{Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv := New(st, log)
	admin, err := srv.EnsureAdminToken(context.Background())
	if err != nil || admin == "" {
		t.Fatalf("first admin token: %q, %v", admin, err)
	}
	again, err := srv.EnsureAdminToken(context.Background())
	if err != nil || again != "" {
		t.Fatalf("a second first token: %q, %v", again, err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &fixture{st: st, srv: srv, hs: hs, admin: admin, audit: audit}
}

type answer struct {
	status int
	header http.Header
	body   []byte
	err    struct {
		Status  int            `json:"status"`
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Errors  []FieldProblem `json:"errors"`
	}
}

func (f *fixture) do(t *testing.T, token, method, path, body string, hdr ...string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.hs.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header}
	a.body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(a.body, &a.err); err != nil {
			t.Fatalf("%s %s: %d with a body not in the error shape: %s", method, path, resp.StatusCode, a.body)
		}
		if a.err.Status != resp.StatusCode || a.err.Code == "" {
			t.Fatalf("%s %s: error shape %s", method, path, a.body)
		}
	}
	return a
}

func (f *fixture) token(t *testing.T, name string, role Role) string {
	t.Helper()
	a := f.do(t, f.admin, "POST", "/v1/tokens", `{"name":"`+name+`","role":"`+string(role)+`"}`)
	if a.status != http.StatusCreated {
		t.Fatalf("creating token %s: %d %s", name, a.status, a.body)
	}
	var nt NewToken
	if err := json.Unmarshal(a.body, &nt); err != nil {
		t.Fatal(err)
	}
	return nt.Token
}

const pool = `{"name":"app","members":[{"addr":"198.18.1.1:80"}]}`

func TestCreateGetUpdateETag(t *testing.T) {
	f := newFixture(t)
	if a := f.do(t, f.admin, "PUT", "/v1/pools/app", pool); a.status != http.StatusPreconditionRequired || a.err.Code != CodePreconditionRequired {
		t.Fatalf("a put without a precondition: %d %s", a.status, a.body)
	}
	a := f.do(t, f.admin, "PUT", "/v1/pools/app", pool, "If-None-Match", "*")
	if a.status != http.StatusOK {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	etag := a.header.Get("ETag")
	g := f.do(t, f.admin, "GET", "/v1/pools/app", "")
	if g.status != http.StatusOK || g.header.Get("ETag") != etag || !bytes.Contains(g.body, []byte("198.18.1.1:80")) {
		t.Fatalf("get: %d etag %q (want %q) %s", g.status, g.header.Get("ETag"), etag, g.body)
	}
	if a := f.do(t, f.admin, "PUT", "/v1/pools/app", pool, "If-None-Match", "*"); a.status != http.StatusPreconditionFailed || a.err.Code != CodeConflict {
		t.Fatalf("create again: %d %s", a.status, a.body)
	}
	upd := strings.Replace(pool, "198.18.1.1", "198.18.1.2", 1)
	u := f.do(t, f.admin, "PUT", "/v1/pools/app", upd, "If-Match", etag)
	if u.status != http.StatusOK || u.header.Get("ETag") == etag {
		t.Fatalf("update: %d %s", u.status, u.body)
	}
	if a := f.do(t, f.admin, "PUT", "/v1/pools/app", pool, "If-Match", etag); a.status != http.StatusPreconditionFailed || a.err.Code != CodeConflict {
		t.Fatalf("update with a stale If-Match: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "DELETE", "/v1/pools/app", "", "If-Match", etag); a.status != http.StatusPreconditionFailed {
		t.Fatalf("delete with a stale If-Match: %d %s", a.status, a.body)
	}
	l := f.do(t, f.admin, "GET", "/v1/pools", "")
	var list List
	if err := json.Unmarshal(l.body, &list); err != nil || len(list.Items) != 1 || etag2(list.Items[0].Revision) != u.header.Get("ETag") {
		t.Fatalf("list: %v %s", err, l.body)
	}
	if a := f.do(t, f.admin, "DELETE", "/v1/pools/app", "", "If-Match", u.header.Get("ETag")); a.status != http.StatusOK {
		t.Fatalf("delete: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "GET", "/v1/pools/app", ""); a.status != http.StatusNotFound || a.err.Code != "not_found" {
		t.Fatalf("get after delete: %d %s", a.status, a.body)
	}
	// The audit log names who wrote what at which revision.
	log := f.audit.String()
	if !strings.Contains(log, "audit: write") || !strings.Contains(log, "token=admin") || !strings.Contains(log, "kind=pools") || !strings.Contains(log, "revision=") {
		t.Errorf("audit log:\n%s", log)
	}
}

func etag2(rev int64) string { return `"` + strconv.FormatInt(rev, 10) + `"` }

func TestValidation422(t *testing.T) {
	f := newFixture(t)
	routing := `{"name":"web","vhosts":[{"names":["*"],"routes":[{"action":{"pool":"missing"}}]}]}`
	a := f.do(t, f.admin, "PUT", "/v1/routing/web", routing, "If-None-Match", "*")
	if a.status != http.StatusUnprocessableEntity || a.err.Code != CodeInvalid {
		t.Fatalf("routing to a missing pool: %d %s", a.status, a.body)
	}
	found := false
	for _, p := range a.err.Errors {
		found = found || p.Path == "routing/web.vhosts[0].routes[0].action.pool"
	}
	if !found {
		t.Errorf("422 does not name the pool field: %s", a.body)
	}
	if a := f.do(t, f.admin, "PUT", "/v1/pools/app", `{"name":"app"}`, "If-None-Match", "*"); a.status != http.StatusUnprocessableEntity || !strings.Contains(string(a.body), "pools/app.members") {
		t.Fatalf("a pool without members: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "PUT", "/v1/pools/app", `{"name":"app","color":"red"}`, "If-None-Match", "*"); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("an unknown field: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "PUT", "/v1/pools/app", `{"name":`, "If-None-Match", "*"); a.status != http.StatusBadRequest {
		t.Fatalf("bad JSON: %d %s", a.status, a.body)
	}
}

func TestChangeSetAllOrNothing(t *testing.T) {
	f := newFixture(t)
	a := f.do(t, f.admin, "PUT", "/v1/pools/app", pool, "If-None-Match", "*")
	rev := strings.Trim(a.header.Get("ETag"), `"`)
	// The second change is stale: nothing is written, not even the first.
	body := `{"changes":[
		{"kind":"pools","name":"api","object":{"name":"api","members":[{"addr":"198.18.1.3:80"}]},"if_revision":0},
		{"kind":"pools","name":"app","object":` + pool + `,"if_revision":` + rev + `1}]}`
	if a := f.do(t, f.admin, "POST", "/v1/changesets", body); a.status != http.StatusPreconditionFailed || a.err.Code != CodeConflict {
		t.Fatalf("stale change set: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "GET", "/v1/pools/api", ""); a.status != http.StatusNotFound {
		t.Fatalf("half a change set was written: %d %s", a.status, a.body)
	}
	// An invalid one is refused whole too.
	body = `{"changes":[
		{"kind":"pools","name":"api","object":{"name":"api","members":[{"addr":"198.18.1.3:80"}]},"if_revision":0},
		{"kind":"pools","name":"app","delete":true,"if_revision":` + rev + `},
		{"kind":"pools","name":"bad","object":{"name":"bad"},"if_revision":0}]}`
	if a := f.do(t, f.admin, "POST", "/v1/changesets", body); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("invalid change set: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "GET", "/v1/pools/app", ""); a.status != http.StatusOK {
		t.Fatalf("a refused change set deleted: %d %s", a.status, a.body)
	}
	body = `{"changes":[
		{"kind":"pools","name":"api","object":{"name":"api","members":[{"addr":"198.18.1.3:80"}]},"if_revision":0},
		{"kind":"pools","name":"app","delete":true,"if_revision":` + rev + `}]}`
	c := f.do(t, f.admin, "POST", "/v1/changesets", body)
	var done Committed
	if c.status != http.StatusOK || json.Unmarshal(c.body, &done) != nil || done.Revision == 0 {
		t.Fatalf("change set: %d %s", c.status, c.body)
	}
	g := f.do(t, f.admin, "GET", "/v1/pools/api", "")
	if g.status != http.StatusOK || g.header.Get("ETag") != etag2(done.Revision) {
		t.Fatalf("after the change set: %d %q %s", g.status, g.header.Get("ETag"), g.body)
	}
	if a := f.do(t, f.admin, "GET", "/v1/pools/app", ""); a.status != http.StatusNotFound {
		t.Fatalf("the delete of the change set: %d", a.status)
	}
}

func TestDeleteReferenced(t *testing.T) {
	f := newFixture(t)
	a := f.do(t, f.admin, "PUT", "/v1/l4-pools/l7", `{"name":"l7","members":[{"name":"a","address":"198.18.2.1"}]}`, "If-None-Match", "*")
	if a.status != http.StatusOK {
		t.Fatalf("l4 pool: %d %s", a.status, a.body)
	}
	r := f.do(t, f.admin, "PUT", "/v1/l4-rules/https", `{"name":"https","vip":"203.0.113.1","protocol":"tcp","port":443,"pool":"l7"}`, "If-None-Match", "*")
	if r.status != http.StatusOK {
		t.Fatalf("l4 rule: %d %s", r.status, r.body)
	}
	d := f.do(t, f.admin, "DELETE", "/v1/l4-pools/l7", "", "If-Match", a.header.Get("ETag"))
	if d.status != http.StatusUnprocessableEntity || !strings.Contains(string(d.body), "l4-rules/https.pool") {
		t.Fatalf("deleting a pool a rule names: %d %s", d.status, d.body)
	}
}

func TestRoles(t *testing.T) {
	f := newFixture(t)
	viewer := f.token(t, "ops-view", RoleViewer)
	risk := f.token(t, "risk", RoleRiskEngine)
	policy := f.token(t, "policy", RolePolicyOperator)
	certOp := f.token(t, "certs", RoleCertOperator)

	if a := f.do(t, "", "GET", "/v1/pools", ""); a.status != http.StatusUnauthorized || a.err.Code != "unauthorized" {
		t.Fatalf("no token: %d %s", a.status, a.body)
	}
	// The same token with its last hex digit changed (never to itself).
	last := "0"
	if strings.HasSuffix(viewer, "0") {
		last = "1"
	}
	if a := f.do(t, viewer[:len(viewer)-1]+last, "GET", "/v1/pools", ""); a.status != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d %s", a.status, a.body)
	}
	if a := f.do(t, viewer, "GET", "/v1/pools", ""); a.status != http.StatusOK {
		t.Fatalf("viewer reads: %d %s", a.status, a.body)
	}
	for _, tok := range []string{viewer, risk, certOp} {
		if a := f.do(t, tok, "PUT", "/v1/pools/app", pool, "If-None-Match", "*"); a.status != http.StatusForbidden || a.err.Code != CodeForbidden {
			t.Fatalf("a pool written by %s: %d %s", tok[:5], a.status, a.body)
		}
		body := `{"changes":[{"kind":"routing","name":"web","object":{"name":"web"},"if_revision":0}]}`
		if a := f.do(t, tok, "POST", "/v1/changesets", body); a.status != http.StatusForbidden {
			t.Fatalf("routing changed by %s: %d %s", tok[:5], a.status, a.body)
		}
	}
	if a := f.do(t, risk, "PUT", "/v1/routing/web", `{"name":"web"}`, "If-None-Match", "*"); a.status != http.StatusForbidden {
		t.Fatalf("risk-engine wrote routing: %d %s", a.status, a.body)
	}
	if a := f.do(t, policy, "PUT", "/v1/pools/app", pool, "If-None-Match", "*"); a.status != http.StatusOK {
		t.Fatalf("policy-operator writes pools: %d %s", a.status, a.body)
	}
	if a := f.do(t, policy, "PUT", "/v1/certificates/www", `{}`, "If-None-Match", "*"); a.status != http.StatusForbidden {
		t.Fatalf("policy-operator wrote a certificate: %d %s", a.status, a.body)
	}
	if a := f.do(t, certOp, "PUT", "/v1/certificates/www", `{"name":"www"}`, "If-None-Match", "*"); a.status != http.StatusMethodNotAllowed || a.err.Code != CodeUseUpload {
		t.Fatalf("cert-operator writes certificates by upload only: %d %s", a.status, a.body)
	}
	for _, tok := range []string{viewer, policy, certOp, risk} {
		if a := f.do(t, tok, "GET", "/v1/tokens", ""); a.status != http.StatusForbidden {
			t.Fatalf("tokens listed by a non-admin: %d", a.status)
		}
	}
	if a := f.do(t, f.admin, "DELETE", "/v1/tokens/ops-view", ""); a.status != http.StatusNoContent {
		t.Fatalf("deleting a token: %d %s", a.status, a.body)
	}
	if a := f.do(t, viewer, "GET", "/v1/pools", ""); a.status != http.StatusUnauthorized {
		t.Fatalf("a deleted token: %d %s", a.status, a.body)
	}
}

func TestTokensStoredHashed(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "hashed", RoleViewer)
	secret := tok[strings.LastIndexByte(tok, '.')+1:]
	resp, err := f.st.Client().Get(context.Background(), "/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if strings.HasPrefix(string(kv.Key), TokenPrefix) {
			n++
		}
		for _, s := range []string{secret, f.admin[strings.LastIndexByte(f.admin, '.')+1:]} {
			if bytes.Contains(kv.Value, []byte(s)) {
				t.Errorf("%s holds a token's plaintext", kv.Key)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d tokens stored under %s, want 2", n, TokenPrefix)
	}
	ss, err := f.st.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ss.Len() != 0 {
		t.Errorf("tokens are in the snapshot nodes read: %v", ss.Kinds())
	}
	l := f.do(t, f.admin, "GET", "/v1/tokens", "")
	if l.status != http.StatusOK || bytes.Contains(l.body, []byte(`"hash"`)) || !bytes.Contains(l.body, []byte("hashed")) {
		t.Errorf("token list: %d %s", l.status, l.body)
	}
}

// TestOpenAPI walks the document against the live routes: every route the server
// registers is documented, and every documented operation answers (its route is
// found: neither the catch-all's no_route nor 405).
func TestOpenAPI(t *testing.T) {
	f := newFixture(t)
	a := f.do(t, "", "GET", "/v1/openapi.json", "")
	if a.status != http.StatusOK {
		t.Fatalf("openapi: %d %s", a.status, a.body)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(a.body, &doc); err != nil || !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi document: %v %.200s", err, a.body)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	for _, rt := range f.srv.Routes() {
		if !documented[rt.String()] {
			t.Errorf("%s is served but not documented", rt)
		}
	}
	if len(documented) != len(f.srv.Routes())+1 {
		t.Errorf("%d operations documented, %d routes (+ the document)", len(documented), len(f.srv.Routes()))
	}
	for op := range documented {
		method, path, _ := strings.Cut(op, " ")
		path = strings.ReplaceAll(path, "{name}", "probe")
		path = strings.ReplaceAll(path, "{revision}", "1")
		a := f.do(t, f.admin, method, path, "")
		if a.status == http.StatusMethodNotAllowed || a.err.Code == CodeNoRoute {
			t.Errorf("%s is documented but does not answer: %d %s", op, a.status, a.body)
		}
	}
	// The catch-all answers what is not a route in the error shape.
	if a := f.do(t, f.admin, "GET", "/v1/nothing", ""); a.status != http.StatusNotFound || a.err.Code != CodeNoRoute {
		t.Errorf("an unknown route: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.admin, "PATCH", "/v1/pools", ""); a.err.Code != CodeNoRoute {
		t.Errorf("an unknown method: %d %s", a.status, a.body)
	}
}
