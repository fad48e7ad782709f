package l7d

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/testkit/daemontest"
)

const (
	tokenA = "token-a-0123456789abcdef"
	tokenB = "token-b-0123456789abcdef"
)

// TestAdminToken: with admin_token_file, the admin API answers 401 without the token
// (healthz and metrics excepted) and serves with it; a reload reads the file again,
// a reload with a bad token file changes nothing, and one without a token file puts
// the generated token in force.
func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "admin.token")
	writeFile(t, tokFile, tokenA+"\n")
	admin := freeAddr(t)
	path := testConfig(t, dir, admin, "admin_token_file: "+tokFile+"\n")
	runDaemon(t, path, admin)
	base := "http://" + admin
	anon := adminClient{t: t, base: base}
	withA := adminClient{t: t, base: base, token: tokenA}
	withB := adminClient{t: t, base: base, token: tokenB}

	for _, req := range []struct{ method, path, body string }{
		{"GET", "/blacklists", ""},
		{"GET", "/blacklists/global", ""},
		{"PUT", "/blacklists/global", "192.0.2.1\n"},
		{"POST", "/blacklists/global/delta", "+192.0.2.1\n"},
		{"DELETE", "/blacklists/global/state", ""},
		{"POST", "/reload", ""},
		{"GET", "/nosuch", ""},
	} {
		for _, c := range []adminClient{anon, withB} {
			code, out, body := c.call(req.method, req.path, req.body)
			if code != 401 || out["code"] != "unauthorized" || out["status"] != 401.0 {
				t.Errorf("%s %s with token %q: %d %s, want 401 unauthorized", req.method, req.path, c.token, code, body)
			}
		}
	}
	resp, err := http.Get(base + "/blacklists")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ch := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(ch, "Bearer") {
		t.Errorf("WWW-Authenticate %q", ch)
	}
	for _, p := range []string{"/healthz", "/metrics"} {
		if code, _, _ := anon.call("GET", p, ""); code != 200 {
			t.Errorf("GET %s without a token: %d, want 200", p, code)
		}
	}
	if code, _, _ := anon.call("GET", "/blacklists/global", ""); code != 401 {
		t.Fatal("not guarded")
	}
	if code, out, _ := withA.call("PUT", "/blacklists/global", "192.0.2.1\n"); code != 200 || out["entries"] != 1.0 {
		t.Errorf("PUT with the token: %d %v", code, out)
	}
	if code, _, _ := withA.call("GET", "/blacklists", ""); code != 200 {
		t.Errorf("GET with the token: %d", code)
	}

	// A new token in the file takes effect on reload, not before.
	writeFile(t, tokFile, tokenB+"\n")
	if code, _, _ := withB.call("GET", "/blacklists", ""); code != 401 {
		t.Errorf("the new token works before the reload: %d", code)
	}
	if code, _, body := withA.call("POST", "/reload", ""); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	if code, _, _ := withA.call("GET", "/blacklists", ""); code != 401 {
		t.Errorf("the old token still works after the reload: %d", code)
	}
	if code, _, _ := withB.call("GET", "/blacklists", ""); code != 200 {
		t.Errorf("the new token does not work after the reload: %d", code)
	}

	// A token file that became unusable: the reload is refused, the token stays.
	writeFile(t, tokFile, "short\n")
	if code, _, body := withB.call("POST", "/reload", ""); code != 422 || !strings.Contains(body, "admin_token_file") {
		t.Errorf("reload with a short token: %d %s", code, body)
	}
	if code, _, _ := withB.call("GET", "/blacklists", ""); code != 200 {
		t.Errorf("a refused reload changed the token: %d", code)
	}

	// No token file any more: the token l7d generates is in force.
	testConfig(t, dir, admin, "")
	if code, _, body := withB.call("POST", "/reload", ""); code != 200 {
		t.Fatalf("reload without a token file: %d %s", code, body)
	}
	generated := adminClient{t: t, base: base, token: daemontest.Token(t, filepath.Join(defaultTokenDir, daemon.GeneratedTokenFile))}
	if code, _, _ := anon.call("GET", "/blacklists", ""); code != 401 {
		t.Errorf("without a token file the API is open: %d", code)
	}
	if code, _, _ := withB.call("GET", "/blacklists", ""); code != 401 {
		t.Errorf("the file's token still works after the reload without it: %d", code)
	}
	if code, _, _ := generated.call("GET", "/blacklists", ""); code != 200 {
		t.Errorf("the generated token does not work: %d", code)
	}
}

// TestAdminTokenByDefault: without admin_token_file, l7d generates a token in its
// state directory (0600) at the first start, logs where and not what, and the admin
// API wants it: an unauthenticated POST /reload is answered 401, one with the token
// 200. A restart keeps the token; it lies beside the blacklists' state files without
// being taken for one. Without state_dir it goes to DefaultTokenDir.
func TestAdminTokenByDefault(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	admin := freeAddr(t)
	path := testConfig(t, dir, admin, "state_dir: "+stateDir+"\n")
	c, log := runDaemon(t, path, admin)
	tokFile := filepath.Join(stateDir, daemon.GeneratedTokenFile)
	fi, err := os.Stat(tokFile)
	if err != nil {
		t.Fatalf("no token generated: %v\n%s", err, log)
	}
	if fi.Mode().Perm() != 0o600 || len(c.token) != 64 {
		t.Errorf("token file mode %v, token of %d bytes", fi.Mode().Perm(), len(c.token))
	}
	anon := adminClient{t: t, base: c.base}
	if code, out, body := anon.call("POST", "/reload", ""); code != 401 || out["code"] != "unauthorized" {
		t.Errorf("POST /reload without the token: %d %s, want 401 unauthorized", code, body)
	}
	if code, _, body := c.call("POST", "/reload", ""); code != 200 {
		t.Errorf("POST /reload with the generated token: %d %s", code, body)
	}
	for _, p := range []string{"/healthz", "/metrics"} {
		if code, _, _ := anon.call("GET", p, ""); code != 200 {
			t.Errorf("GET %s without a token: %d, want 200", p, code)
		}
	}
	if code, out, body := c.call("PUT", "/blacklists/global", "192.0.2.1\n"); code != 200 || out["state_file"] != filepath.Join(stateDir, "blacklist-global.bin") {
		t.Errorf("PUT with the token: %d %s", code, body)
	}
	l := log.String()
	if !strings.Contains(l, "admin token generated") || !strings.Contains(l, "file="+tokFile) || strings.Contains(l, c.token) {
		t.Errorf("the log does not say where the token is, or shows it:\n%s", l)
	}
	if strings.Contains(l, "state file of no list") {
		t.Errorf("the token was taken for a blacklist state file:\n%s", l)
	}
	if _, again, _ := setupDaemon(t, path); again.token != c.token {
		t.Errorf("a restart made a new token")
	}

	// Without state_dir: in DefaultTokenDir (the tests' own).
	dir2 := t.TempDir()
	_, c2, _ := setupDaemon(t, testConfig(t, dir2, "127.0.0.1:0", ""))
	if want := daemontest.Token(t, filepath.Join(defaultTokenDir, daemon.GeneratedTokenFile)); c2.token == "" || c2.token != want {
		t.Errorf("without state_dir the token is not DefaultTokenDir's: %q, want %q", c2.token, want)
	}
	if code, _, _ := (adminClient{t: t, base: c2.base}).call("POST", "/reload", ""); code != 401 {
		t.Errorf("POST /reload without the token (no state_dir): %d, want 401", code)
	}
}

// TestAdminNonLoopback: an admin address other hosts reach is served with the
// generated token, and with none under admin_insecure; l7d check reports where the
// token would be without making it; a reload cannot take admin_insecure away, nor
// move admin_listen: both take a restart.
func TestAdminNonLoopback(t *testing.T) {
	dir := t.TempDir()
	admin := freeAddr(t)
	everywhere := strings.Replace(admin, "127.0.0.1", "0.0.0.0", 1)
	checkState := filepath.Join(dir, "check-state")
	var out bytes.Buffer
	if err := (&Daemon{Path: testConfig(t, dir, everywhere, "state_dir: "+checkState+"\n"), Stderr: io.Discard}).Check(&out); err != nil {
		t.Fatalf("check: %v", err)
	}
	if !strings.Contains(out.String(), "token in "+filepath.Join(checkState, "admin.token")+", generated if missing") {
		t.Errorf("check does not say where the token is:\n%s", out.String())
	}
	if _, err := os.Stat(filepath.Join(checkState, "admin.token")); err == nil {
		t.Errorf("check generated a token")
	}

	stateDir := filepath.Join(dir, "state")
	c, _ := runDaemon(t, testConfig(t, dir, everywhere, "state_dir: "+stateDir+"\n"), admin)
	if code, _, _ := (adminClient{t: t, base: c.base}).call("GET", "/blacklists", ""); code != 401 {
		t.Errorf("an address others reach without the token: %d, want 401", code)
	}
	if code, _, _ := c.call("GET", "/blacklists", ""); code != 200 {
		t.Errorf("an address others reach with the token: %d", code)
	}

	// With admin_insecure it serves with no token.
	dir2 := t.TempDir()
	admin2 := freeAddr(t)
	everywhere2 := strings.Replace(admin2, "127.0.0.1", "0.0.0.0", 1)
	c2, _ := runDaemon(t, testConfig(t, dir2, everywhere2, "admin_insecure: true\n"), admin2)
	if code, _, _ := c2.call("GET", "/blacklists", ""); code != 200 || c2.token != "" {
		t.Errorf("admin_insecure: %d, token %q", code, c2.token)
	}
	// Taking admin_insecure away, or moving admin_listen, takes a restart.
	testConfig(t, dir2, everywhere2, "")
	if code, out, body := c2.call("POST", "/reload", ""); code != 422 || out["code"] != "restart_required" || !strings.Contains(body, "admin_insecure") {
		t.Errorf("reload dropping admin_insecure: %d %s", code, body)
	}
	testConfig(t, dir2, freeAddr(t), "admin_insecure: true\n")
	if code, out, body := c2.call("POST", "/reload", ""); code != 422 || out["code"] != "restart_required" || !strings.Contains(body, "admin_listen") {
		t.Errorf("reload moving admin_listen: %d %s", code, body)
	}
	if code, _, _ := c2.call("GET", "/blacklists", ""); code != 200 {
		t.Errorf("a refused reload changed the admin endpoint: %d", code)
	}
}
