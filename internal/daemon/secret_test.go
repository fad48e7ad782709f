package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminHost: a request whose Host is not a loopback address, localhost, the
// address it arrived on or a configured name is refused 421 (DNS rebinding), even
// for /healthz and /metrics, token or not.
func TestAdminHost(t *testing.T) {
	var auth AdminAuth
	auth.SetToken([]byte(testToken))
	auth.SetHosts([]string{"Admin.Example.:9240", "[2001:db8::7]"})
	h := guarded(&auth)
	local := &net.TCPAddr{IP: net.ParseIP("198.51.100.7"), Port: 9240}
	for _, tc := range []struct {
		host, path string
		code       int
	}{
		{"127.0.0.1:9240", "/healthz", 200},
		{"127.0.0.1", "/metrics", 200},
		{"127.9.9.9:1", "/healthz", 200},
		{"[::1]:9240", "/healthz", 200},
		{"[::ffff:127.0.0.1]:9240", "/healthz", 200},
		{"localhost:9240", "/healthz", 200},
		{"LOCALHOST.", "/healthz", 200},
		{"198.51.100.7:9240", "/healthz", 200}, // the address it arrived on
		{"admin.example", "/healthz", 200},
		{"admin.example:1234", "/reload", 200},
		{"[2001:db8::7]:9240", "/healthz", 200},
		{"", "/healthz", 200},
		{"evil.example:9240", "/healthz", 421},
		{"evil.example", "/metrics", 421},
		{"evil.example", "/reload", 421},
		{"198.51.100.8:9240", "/healthz", 421},
		{"localhost.evil.example", "/healthz", 421},
		{"127.0.0.1.evil.example", "/healthz", 421},
		{"0.0.0.0:9240", "/healthz", 421},
	} {
		r := httptest.NewRequest("GET", tc.path, nil)
		if tc.path == "/reload" {
			r.Method = "POST"
			r.Header.Set("Authorization", "Bearer "+testToken)
		}
		r.Host = tc.host
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, net.Addr(local)))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code {
			t.Errorf("Host %q %s: %d, want %d: %s", tc.host, tc.path, w.Code, tc.code, w.Body)
			continue
		}
		if tc.code != 421 {
			continue
		}
		var e struct {
			Status  int    `json:"status"`
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Status != 421 || e.Code != CodeMisdirected || !strings.Contains(e.Message, tc.host) {
			t.Errorf("Host %q: body %s", tc.host, w.Body)
		}
	}

	// Over a real listener: the address it listens on is accepted, a rebound name is
	// not.
	srv := httptest.NewServer(guarded(&AdminAuth{}))
	defer srv.Close()
	for host, want := range map[string]int{"": 200, "attacker.example": 421} {
		req, _ := http.NewRequest("GET", srv.URL+"/healthz", nil)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %q over a listener: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestAdminTokenDefault: with no admin_token_file a token is generated once into the
// state directory (0600, directory 0700) and read back after; admin_insecure means
// none; a named file must exist.
func TestAdminTokenDefault(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	dir := filepath.Join(t.TempDir(), "state", "keyserverd")
	tok, path, err := AdminToken("", false, dir, log)
	if err != nil || len(tok) != 64 || path != filepath.Join(dir, GeneratedTokenFile) {
		t.Fatalf("generated: %q %q %v", tok, path, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory mode: %v %v", fi.Mode(), err)
	}
	if !strings.Contains(logs.String(), "admin token generated") || !strings.Contains(logs.String(), path) || strings.Contains(logs.String(), string(tok)) {
		t.Errorf("log: %s", logs.String())
	}
	again, _, err := AdminToken("", false, dir, log)
	if err != nil || !bytes.Equal(again, tok) {
		t.Errorf("read again: %q %v, want the same token", again, err)
	}
	if tok, path, err := AdminToken("", true, dir, log); tok != nil || path != "" || err != nil {
		t.Errorf("insecure: %q %q %v", tok, path, err)
	}
	if _, _, err := AdminToken("", false, "", log); err == nil {
		t.Errorf("no state directory: no error")
	}
	if _, _, err := AdminToken(filepath.Join(dir, "missing"), false, dir, log); err == nil || !strings.Contains(err.Error(), "admin_token_file") {
		t.Errorf("a named file that is missing: %v", err)
	}

	// A token file others can read is warned about.
	logs.Reset()
	named := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(named, []byte(testToken+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if tok, _, err := AdminToken(named, false, dir, log); err != nil || string(tok) != testToken {
		t.Fatalf("named file: %q %v", tok, err)
	}
	if !strings.Contains(logs.String(), "readable by others") || !strings.Contains(logs.String(), "-rw-r--r--") {
		t.Errorf("no warning for a 0644 token file: %s", logs.String())
	}
	os.Chmod(named, 0o600)
	logs.Reset()
	if WarnIfExposed(log, "x", named) || logs.Len() != 0 {
		t.Errorf("warned about a 0600 file: %s", logs.String())
	}
}

// FuzzAdminHost: whatever the Host header, the check never panics, and lets a
// request through only when the host, less its port, brackets and final dot, is a
// loopback address, localhost or a configured name.
func FuzzAdminHost(f *testing.F) {
	for _, s := range []string{"", "127.0.0.1:9240", "[::1]", "localhost.", "evil.example", "[fe80::1%eth0]:1", "admin.example:1", ":", "[", "127.0.0.1.nip.io"} {
		f.Add(s)
	}
	var auth AdminAuth
	auth.SetHosts([]string{"admin.example"})
	h := guarded(&auth)
	f.Fuzz(func(t *testing.T, host string) {
		r := httptest.NewRequest("GET", "/healthz", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		n := normalHost(host)
		ip, err := netip.ParseAddr(n)
		want := host == "" || n == "localhost" || n == "admin.example" || (err == nil && ip.Unmap().WithZone("").IsLoopback())
		if (w.Code == 200) != want {
			t.Fatalf("Host %q: %d", host, w.Code)
		}
	})
}
