package tgctl

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tiergate/tiergate/control/api"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
)

// fixture is controld's API over a real embedded store, in an httptest server.
type fixture struct {
	st    *store.Store
	srv   *api.Server
	hs    *httptest.Server
	admin string
	dir   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(context.Background(), store.Config{Dir: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv := api.New(st, quiet)
	admin, err := srv.EnsureAdminToken(context.Background())
	if err != nil || admin == "" {
		t.Fatalf("first admin token: %q, %v", admin, err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &fixture{st: st, srv: srv, hs: hs, admin: admin, dir: t.TempDir()}
}

// result is one run of tgctl.
type result struct {
	code           int
	stdout, stderr string
}

// run runs tgctl in-process against the fixture's API with the admin token (an
// explicit --token or --api in args wins).
func (f *fixture) run(t *testing.T, args ...string) result {
	t.Helper()
	return f.runEnv(t, map[string]string{EnvAPI: f.hs.URL, EnvToken: f.admin, "HOME": f.dir}, "", args...)
}

func (f *fixture) runEnv(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(context.Background(), args, Env{
		Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string { return env[k] },
	})
	return result{code, out.String(), errOut.String()}
}

func (f *fixture) file(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// token makes a token of role with tgctl token create.
func (f *fixture) token(t *testing.T, name, role string) string {
	t.Helper()
	r := f.run(t, "token", "create", name, "--role", role)
	if r.code != 0 {
		t.Fatalf("token create: %d %s", r.code, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// served reports whether the API serves a route ("GET /v1/nodes"): the routes other
// parts of the control plane add as they land.
func (f *fixture) served(route string) bool {
	for _, rt := range f.srv.Routes() {
		if rt.String() == route {
			return true
		}
	}
	return false
}

const webYAML = `# an L7 pool and the L4 objects
kind: pools
name: app
members:
  - addr: 198.18.1.1:80
---
kind: l4-pools
name: l7
members:
  - name: a
    address: 198.18.2.1
---
- kind: l4-rules
  name: https
  vip: 203.0.113.1
  protocol: tcp
  port: 443
  pool: l7
`

func TestKindsAreTheModels(t *testing.T) {
	if !slices.Equal(Kinds, model.Kinds) {
		t.Errorf("Kinds %v, the model's %v", Kinds, model.Kinds)
	}
	var roles []string
	for _, r := range api.Roles {
		roles = append(roles, string(r))
	}
	if !slices.Equal(Roles, roles) {
		t.Errorf("Roles %v, the API's %v", Roles, roles)
	}
	if MaxChanges != store.MaxChanges {
		t.Errorf("MaxChanges %d, the store's %d", MaxChanges, store.MaxChanges)
	}
}

func TestApplyGetDeleteRoundTrip(t *testing.T) {
	f := newFixture(t)
	file := f.file(t, "web.yaml", webYAML)

	r := f.run(t, "apply", "-f", file)
	if r.code != 0 || !strings.Contains(r.stdout, "pools/app created") || !strings.Contains(r.stdout, "l4-rules/https created") || !strings.Contains(r.stdout, "applied at revision") {
		t.Fatalf("apply: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Applied again: nothing changes, nothing is written.
	objs, rev, err := f.st.List(context.Background(), "pools")
	if err != nil || len(objs) != 1 {
		t.Fatalf("stored pools: %v %v", objs, err)
	}
	r = f.run(t, "apply", "-f", file)
	if r.code != 0 || !strings.Contains(r.stdout, "pools/app unchanged") || !strings.Contains(r.stdout, "no changes") {
		t.Fatalf("apply again: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if again, _, _ := f.st.List(context.Background(), "pools"); again[0].ModRevision != objs[0].ModRevision {
		t.Errorf("an unchanged apply wrote the pool (revision %d, then %d)", objs[0].ModRevision, again[0].ModRevision)
	}
	_ = rev

	// get: a table, and YAML that apply takes back.
	r = f.run(t, "get", "pools")
	if r.code != 0 || !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, "app") {
		t.Fatalf("get pools: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, "get", "pool", "app", "-o", "yaml")
	var doc map[string]any
	if r.code != 0 || yaml.Unmarshal([]byte(r.stdout), &doc) != nil || doc["kind"] != "pools" || doc["name"] != "app" {
		t.Fatalf("get pool app -o yaml: %d %v\n%s%s", r.code, doc, r.stdout, r.stderr)
	}
	edited := strings.Replace(r.stdout, "198.18.1.1:80", "198.18.1.9:80", 1)
	r = f.runEnv(t, map[string]string{EnvAPI: f.hs.URL, EnvToken: f.admin}, edited, "apply", "-f", "-")
	if r.code != 0 || !strings.Contains(r.stdout, "pools/app configured") {
		t.Fatalf("apply of get's YAML, edited: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, "get", "pools", "-o", "json")
	var list []map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 || !strings.Contains(r.stdout, "198.18.1.9:80") {
		t.Fatalf("get pools -o json: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, "get", "l4-rules", "-o", "yaml")
	if r.code != 0 {
		t.Fatalf("get l4-rules -o yaml: %d %s", r.code, r.stderr)
	}
	docs, err := ParseDocuments("get", []byte(r.stdout))
	if err != nil || len(docs) != 1 || docs[0].Kind != "l4-rules" || docs[0].Name != "https" {
		t.Fatalf("get -o yaml does not parse as an apply file: %v %v\n%s", docs, err, r.stdout)
	}

	// delete: a pool a rule names is refused with the field; then the rule, then it.
	r = f.run(t, "delete", "l4-pools", "l7")
	if r.code != ExitInvalid || !strings.Contains(r.stderr, "\n  l4-rules/https.pool") {
		t.Fatalf("deleting a pool a rule names: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.run(t, "delete", "l4-rules", "https"); r.code != 0 || !strings.Contains(r.stdout, "l4-rules/https deleted at revision") {
		t.Fatalf("delete: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.run(t, "delete", "l4-pools", "l7", "-o", "json"); r.code != 0 || !json.Valid([]byte(r.stdout)) {
		t.Fatalf("delete -o json: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.run(t, "get", "l4-pools", "l7"); r.code != ExitNotFound {
		t.Fatalf("get after delete: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.run(t, "delete", "l4-pools", "l7"); r.code != ExitNotFound {
		t.Fatalf("delete of nothing: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestApplyConflictExits3(t *testing.T) {
	f := newFixture(t)
	file := f.file(t, "web.yaml", webYAML)
	if r := f.run(t, "apply", "-f", file); r.code != 0 {
		t.Fatalf("apply: %d %s", r.code, r.stderr)
	}
	// --create-only over objects that exist: a conflict, and nothing written.
	edited := f.file(t, "edited.yaml", strings.Replace(webYAML, "198.18.1.1:80", "198.18.1.2:80", 1))
	r := f.run(t, "apply", "--create-only", "-f", edited)
	if r.code != ExitConflict || !strings.Contains(r.stderr, "conflict") {
		t.Fatalf("apply --create-only over existing objects: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A delete with a revision that is not the object's.
	o, err := f.st.Get(context.Background(), "pools", "app")
	if err != nil {
		t.Fatal(err)
	}
	r = f.run(t, "delete", "pools", "app", "--if-match", "1")
	if r.code != ExitConflict || o.ModRevision == 1 {
		t.Fatalf("delete with a stale --if-match: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if _, err := f.st.Get(context.Background(), "pools", "app"); err != nil {
		t.Fatalf("the pool is gone after a refused delete: %v", err)
	}
}

// TestApplyRacesAWrite changes an object between apply's read and its write: the
// change set carries the revision read, so it fails whole with 412.
func TestApplyRacesAWrite(t *testing.T) {
	f := newFixture(t)
	if r := f.run(t, "apply", "-f", f.file(t, "web.yaml", webYAML)); r.code != 0 {
		t.Fatalf("apply: %d %s", r.code, r.stderr)
	}
	docs, err := ParseDocuments("web.yaml", []byte(strings.Replace(webYAML, "198.18.1.1:80", "198.18.1.2:80", 1)+"---\nkind: pools\nname: new\nmembers: [{addr: 198.18.1.5:80}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	o := &options{env: Env{Stderr: io.Discard, Getenv: func(string) string { return "" }}, api: f.hs.URL, token: f.admin, output: FormatTable, timeout: 10e9, ready: true}
	ctx := context.Background()
	plan, err := o.plan(ctx, docs, false)
	if err != nil {
		t.Fatal(err)
	}
	// Someone else writes the pool now.
	cur, _ := f.st.Get(ctx, "pools", "app")
	if _, err := f.st.Commit(ctx, store.ChangeSet{Changes: []store.Change{{Kind: "pools", Name: "app", Value: []byte(`{"name":"app","members":[{"addr":"198.18.1.7:80"}]}`), IfRevision: cur.ModRevision}}, Check: model.Check}); err != nil {
		t.Fatal(err)
	}
	_, err = o.call(ctx, request{method: "POST", path: "/v1/changesets", body: changeSet(plan), what: "applying"}, nil)
	if ExitCode(err) != ExitConflict {
		t.Fatalf("a change set over a changed object: exit %d, %v", ExitCode(err), err)
	}
	if _, err := f.st.Get(ctx, "pools", "new"); err == nil {
		t.Error("half the change set was written")
	}
}

func TestApplyInvalidExits4WithFieldPaths(t *testing.T) {
	f := newFixture(t)
	// A rule naming a pool that is not there, beside a good pool: the snapshot's check.
	bad := f.file(t, "bad.yaml", `kind: l4-rules
name: https
vip: 203.0.113.1
protocol: tcp
port: 443
pool: missing
---
kind: pools
name: app
members: [{addr: 198.18.1.1:80}]
`)
	r := f.run(t, "apply", "-f", bad)
	if r.code != ExitInvalid || !strings.Contains(r.stderr, "invalid (422)") || !strings.Contains(r.stderr, "\n  l4-rules/https.pool: \"missing\"") {
		t.Fatalf("an apply naming a missing pool: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// An object its own model refuses.
	r = f.run(t, "apply", "-f", f.file(t, "bad2.yaml", "kind: pools\nname: app\nmembers: []\n"))
	if r.code != ExitInvalid || !strings.Contains(r.stderr, "\n  pools/app.members: ") {
		t.Fatalf("a pool without members: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if objs, _, _ := f.st.List(context.Background(), "pools"); len(objs) != 0 {
		t.Errorf("a refused apply stored %v", objs)
	}
	// A file that is not one: usage, before the API is asked.
	for _, content := range []string{"kind: pools\n", "name: x\n", "kind: nope\nname: x\n", "- 1\n", "kind: pools\nname: a\n---\nkind: pool\nname: a\n"} {
		if r := f.run(t, "apply", "-f", f.file(t, "x.yaml", content)); r.code != ExitUsage {
			t.Errorf("apply of %q: %d %s", content, r.code, r.stderr)
		}
	}
}

func TestAuthExits6(t *testing.T) {
	f := newFixture(t)
	viewer := f.token(t, "watcher", "viewer")
	file := f.file(t, "web.yaml", webYAML)
	r := f.run(t, "--token", viewer, "apply", "-f", file)
	if r.code != ExitAuth || !strings.Contains(r.stderr, "forbidden") {
		t.Fatalf("apply with a viewer's token: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := f.run(t, "--token", viewer, "get", "pools"); r.code != 0 {
		t.Fatalf("a viewer reads: %d %s", r.code, r.stderr)
	}
	if r := f.run(t, "--token", viewer, "token", "list"); r.code != ExitAuth {
		t.Fatalf("a viewer lists tokens: %d %s", r.code, r.stderr)
	}
	r = f.runEnv(t, map[string]string{EnvAPI: f.hs.URL}, "", "get", "pools")
	if r.code != ExitAuth || !strings.Contains(r.stderr, "TIERGATE_TOKEN") {
		t.Fatalf("no token: %d %s", r.code, r.stderr)
	}
	if r := f.run(t, "--token", "admin.00", "get", "pools"); r.code != ExitAuth {
		t.Fatalf("a bad token: %d %s", r.code, r.stderr)
	}
}

func TestUnreachableExits7(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var out, errOut bytes.Buffer
	code := Run(context.Background(), []string{"--api", "http://" + addr, "--request-timeout", "2s", "get", "pools"},
		Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }})
	if code != ExitUnreachable || !strings.Contains(errOut.String(), "out of reach") {
		t.Fatalf("a closed port: %d %s", code, errOut.String())
	}
}

func TestUsageExits2(t *testing.T) {
	f := newFixture(t)
	for _, args := range [][]string{
		{"bogus"}, {"get"}, {"get", "nokind"}, {"get", "pools", "a", "b"}, {"-o", "xml", "get", "pools"},
		{"get", "pools", "--nope"}, {"cert", "bogus"}, {"apply"}, {"rollback", "x"}, {"token", "create", "x"},
	} {
		if r := f.run(t, args...); r.code != ExitUsage {
			t.Errorf("tgctl %q: %d %s", args, r.code, r.stderr)
		}
	}
	if r := f.run(t, "--help"); r.code != 0 || !strings.Contains(r.stdout, "Exit codes") {
		t.Errorf("--help: %d %s", r.code, r.stdout)
	}
	if r := f.run(t, "apply", "--help"); r.code != 0 || !strings.Contains(r.stdout, "kind: pools") {
		t.Errorf("apply --help does not show the file's form: %d %s", r.code, r.stdout)
	}
}

func TestConfigFile(t *testing.T) {
	f := newFixture(t)
	cfg := f.file(t, "tgctl.yaml", "api: "+f.hs.URL+"\ntoken: "+f.admin+"\n")
	r := f.runEnv(t, nil, "", "--config", cfg, "get", "pools")
	if r.code != 0 {
		t.Fatalf("with --config: %d %s", r.code, r.stderr)
	}
	// The default file, under $HOME/.config; the environment over it.
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".config", "tiergate"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".config", "tiergate", "tgctl.yaml"), []byte("api: "+f.hs.URL+"\ntoken: wrong.00\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := f.runEnv(t, map[string]string{"HOME": home}, "", "get", "pools"); r.code != ExitAuth {
		t.Fatalf("the default file's token: %d %s", r.code, r.stderr)
	}
	if r := f.runEnv(t, map[string]string{"HOME": home, EnvToken: f.admin}, "", "get", "pools"); r.code != 0 {
		t.Fatalf("TIERGATE_TOKEN over the file: %d %s", r.code, r.stderr)
	}
	if r := f.runEnv(t, map[string]string{"HOME": home, EnvToken: "wrong.00"}, "", "--token", f.admin, "get", "pools"); r.code != 0 {
		t.Fatalf("--token over TIERGATE_TOKEN: %d %s", r.code, r.stderr)
	}
	bad := f.file(t, "bad.yaml", "api: x\ncolour: red\n")
	if r := f.runEnv(t, nil, "", "--config", bad, "get", "pools"); r.code == 0 || !strings.Contains(r.stderr, "colour") {
		t.Fatalf("an unknown key in the config file: %d %s", r.code, r.stderr)
	}
	if r := f.runEnv(t, nil, "", "--config", filepath.Join(f.dir, "none.yaml"), "get", "pools"); r.code == 0 {
		t.Fatalf("a --config that does not exist: %d %s", r.code, r.stderr)
	}
}

func TestTokens(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "ci", "policy-operator")
	if !strings.HasPrefix(tok, "ci.") {
		t.Fatalf("token create printed %q", tok)
	}
	r := f.run(t, "token", "list", "-o", "yaml")
	var ans struct {
		Tokens []struct{ Name, Role string }
	}
	if r.code != 0 || yaml.Unmarshal([]byte(r.stdout), &ans) != nil || len(ans.Tokens) != 2 {
		t.Fatalf("token list -o yaml: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout, tok[3:]) {
		t.Error("token list shows a secret")
	}
	if r := f.run(t, "--token", tok, "apply", "-f", f.file(t, "web.yaml", webYAML)); r.code != 0 {
		t.Fatalf("a policy-operator applies: %d %s", r.code, r.stderr)
	}
	if r := f.run(t, "token", "delete", "ci"); r.code != 0 {
		t.Fatalf("token delete: %d %s", r.code, r.stderr)
	}
	if r := f.run(t, "--token", tok, "get", "pools"); r.code != ExitAuth {
		t.Fatalf("a deleted token: %d %s", r.code, r.stderr)
	}
}

func TestCompletion(t *testing.T) {
	f := newFixture(t)
	if r := f.run(t, "apply", "-f", f.file(t, "web.yaml", webYAML)); r.code != 0 {
		t.Fatalf("apply: %d %s", r.code, r.stderr)
	}
	r := f.run(t, "completion", "bash")
	if r.code != 0 || !strings.Contains(r.stdout, "__start_tgctl") {
		t.Fatalf("completion bash: %d %.200s %s", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, "__complete", "get", "")
	if r.code != 0 || !strings.Contains(r.stdout, "l4-rules\n") {
		t.Fatalf("completing a kind: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, "__complete", "get", "pools", "")
	if r.code != 0 || !strings.Contains(r.stdout, "app\n") {
		t.Fatalf("completing a name from the API: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestHTTPSWithCAFile: an https API is trusted through --ca-file (or the config
// file's ca_file); without it the certificate is refused, an error (1) rather than
// out of reach.
func TestHTTPSWithCAFile(t *testing.T) {
	f := newFixture(t)
	hs := httptest.NewTLSServer(f.srv)
	defer hs.Close()
	ca := f.file(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw})))
	env := map[string]string{EnvAPI: hs.URL, EnvToken: f.admin}
	if r := f.runEnv(t, env, "", "--ca-file", ca, "get", "pools"); r.code != 0 {
		t.Fatalf("https with --ca-file: %d %s", r.code, r.stderr)
	}
	cfg := f.file(t, "tgctl.yaml", "ca_file: ca.pem\n") // beside it
	if r := f.runEnv(t, env, "", "--config", cfg, "get", "pools"); r.code != 0 {
		t.Fatalf("https with the config file's ca_file: %d %s", r.code, r.stderr)
	}
	if r := f.runEnv(t, env, "", "get", "pools"); r.code != ExitError || !strings.Contains(r.stderr, "certificate") {
		t.Fatalf("https without the CA: %d %s", r.code, r.stderr)
	}
	if r := f.run(t, "--ca-file", ca, "get", "pools"); r.code != ExitUsage {
		t.Fatalf("--ca-file with an http API: %d %s", r.code, r.stderr)
	}
}

// TestClearTextRefusals: a private key is never sent to a plain http API on another
// host, and a token sent there is warned about.
func TestClearTextRefusals(t *testing.T) {
	f := newFixture(t)
	env := map[string]string{EnvAPI: "http://198.18.0.1:9", EnvToken: f.admin}
	chain := f.file(t, "c.pem", "x")
	r := f.runEnv(t, env, "", "--request-timeout", "1s", "cert", "upload", "--name", "a", "--cert", chain, "--key", chain)
	if r.code != ExitError || !strings.Contains(r.stderr, "in clear") || strings.Contains(r.stderr, "out of reach") {
		t.Fatalf("an upload to plain http elsewhere: %d %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "warning: http://198.18.0.1:9 is plain http") {
		t.Errorf("no warning about the token: %s", r.stderr)
	}
	if r := f.run(t, "get", "pools"); strings.Contains(r.stderr, "warning") {
		t.Errorf("a warning for loopback: %s", r.stderr)
	}
}

func TestApplyOverMaxChanges(t *testing.T) {
	f := newFixture(t)
	var b strings.Builder
	for i := 0; i <= MaxChanges; i++ {
		b.WriteString("---\nkind: pools\nname: p" + strconv.Itoa(i) + "\nmembers: [{addr: 198.18.1.1:80}]\n")
	}
	r := f.run(t, "apply", "-f", f.file(t, "many.yaml", b.String()))
	if r.code != ExitError || !strings.Contains(r.stderr, "at most 100") {
		t.Fatalf("an apply of %d objects: %d %s", MaxChanges+1, r.code, r.stderr)
	}
}
