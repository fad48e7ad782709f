package l7d

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

const (
	tokenA = "token-a-0123456789abcdef"
	tokenB = "token-b-0123456789abcdef"
)

// TestAdminToken: with admin_token_file, the admin API answers 401 without the token
// (healthz and metrics excepted) and serves with it; a reload reads the file again,
// and a reload with a bad token file changes nothing.
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

	// No token file any more (on a loopback address): the API is open again.
	testConfig(t, dir, admin, "")
	if code, _, body := withB.call("POST", "/reload", ""); code != 200 {
		t.Fatalf("reload without a token file: %d %s", code, body)
	}
	if code, _, _ := anon.call("GET", "/blacklists", ""); code != 200 {
		t.Errorf("without a token file the API still asks for one: %d", code)
	}
}

// TestAdminNonLoopbackRefused: l7d does not start with an admin address other hosts
// reach and no token, unless told the network guards it; a reload cannot get there.
func TestAdminNonLoopbackRefused(t *testing.T) {
	dir := t.TempDir()
	path := testConfig(t, dir, "0.0.0.0:0", "")
	d := &Daemon{Path: path, Stderr: io.Discard}
	err := d.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `admin_listen: "0.0.0.0:0"`) || !strings.Contains(err.Error(), "admin_token_file") {
		t.Fatalf("Run with a non-loopback admin address and no token: %v", err)
	}
	if err := (&Daemon{Path: path, Stderr: io.Discard}).Check(io.Discard); err == nil {
		t.Errorf("check passed it")
	}

	// With admin_insecure it starts.
	admin := freeAddr(t)
	path = testConfig(t, dir, strings.Replace(admin, "127.0.0.1", "0.0.0.0", 1), "admin_insecure: true\n")
	runDaemon(t, path, admin)
	c := adminClient{t: t, base: "http://" + admin}
	if code, _, _ := c.call("GET", "/blacklists", ""); code != 200 {
		t.Errorf("admin_insecure: %d", code)
	}
	// Taking admin_insecure away while listening everywhere is refused.
	testConfig(t, dir, strings.Replace(admin, "127.0.0.1", "0.0.0.0", 1), "")
	if code, _, body := c.call("POST", "/reload", ""); code != 422 || !strings.Contains(body, "admin_listen") {
		t.Errorf("reload dropping admin_insecure: %d %s", code, body)
	}
}
