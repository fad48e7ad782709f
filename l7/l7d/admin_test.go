package l7d

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/policy/blacklist"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func mustSet(t *testing.T, text string) *blacklist.Set {
	t.Helper()
	s, err := blacklist.ParseText(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAdminBlacklists(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := &Daemon{listenerNames: []string{"web"}, lists: blacklist.NewLists(blacklist.Options{Registerer: reg})}
	d.Reg, d.Log = reg, quietLogger()
	d.bl = blacklist.NewStore(d.lists, "", d.Log)
	c := &control{d: d}
	c.setConfig(&FileConfig{Blacklists: map[string]blacklist.ListConfig{"web": {Action: blacklist.ActionClose}}})
	d.startOwner(c)
	t.Cleanup(d.close)
	srv := httptest.NewServer(d.adminHandler())
	defer srv.Close()

	call := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		b, _ := io.ReadAll(resp.Body)
		if len(b) > 0 && b[0] == '{' {
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatalf("%s %s: %v: %s", method, path, err, b)
			}
		}
		return resp.StatusCode, out
	}
	blocked := func(list, addr string) bool { return d.lists.Listener(list).Contains(netip.MustParseAddr(addr)) }

	if code, out := call("PUT", "/blacklists/global", "192.0.2.1\n192.0.2.4/30 ttl=1h\n2001:db8::1\n"); code != 200 || out["entries"] != 3.0 || out["action"] != "forbid" {
		t.Errorf("PUT text: %d %v", code, out)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	blacklist.WriteBinary(zw, mustSet(t, "203.0.113.0/24\n203.0.114.1\n"))
	zw.Close()
	if code, out := call("PUT", "/blacklists/web", gz.String()); code != 200 || out["entries"] != 2.0 || out["action"] != "close" {
		t.Errorf("PUT gzip binary: %d %v", code, out)
	}
	code, out := call("PUT", "/blacklists/global", "192.0.2.9\nbogus\n10.0.0.0/40\n")
	lines, _ := out["lines"].([]any)
	if code != 422 || out["code"] != "bad_lines" || out["bad_lines"] != 2.0 || len(lines) != 2 ||
		lines[0].(map[string]any)["line"] != 2.0 || lines[1].(map[string]any)["line"] != 3.0 {
		t.Errorf("PUT bad lines: %d %v", code, out)
	}
	if !blocked("global", "192.0.2.5") || blocked("global", "192.0.2.9") {
		t.Errorf("a rejected upload changed the list")
	}
	if code, out := call("POST", "/blacklists/global/delta", "-192.0.2.4/30\n+192.0.2.9 ttl=60\n"); code != 200 || out["entries"] != 3.0 {
		t.Errorf("delta: %d %v", code, out)
	}
	if blocked("global", "192.0.2.5") || !blocked("global", "192.0.2.1") || !blocked("global", "192.0.2.9") || !blocked("global", "2001:db8::1") {
		t.Errorf("delta not applied")
	}
	if code, out := call("POST", "/blacklists/global/delta", "192.0.2.10\n"); code != 422 || out["bad_lines"] != 1.0 {
		t.Errorf("delta without sign: %d %v", code, out)
	}
	if code, out := call("PUT", "/blacklists/api", "192.0.2.1\n"); code != 404 || out["code"] != "unknown_list" {
		t.Errorf("unknown list: %d %v", code, out)
	}
	if code, _ := call("DELETE", "/blacklists/global", ""); code != 405 {
		t.Errorf("DELETE: %d, want 405", code)
	}
	if code, out := call("GET", "/blacklists/web", ""); code != 200 || out["entries"] != 2.0 {
		t.Errorf("GET: %d %v", code, out)
	}
	resp, err := http.Get(srv.URL + "/blacklists")
	if err != nil {
		t.Fatal(err)
	}
	var all []listInfo
	json.NewDecoder(resp.Body).Decode(&all)
	resp.Body.Close()
	if len(all) != 2 || all[0].List != "global" || all[1].List != "web" {
		t.Errorf("GET /blacklists: %+v", all)
	}
}
