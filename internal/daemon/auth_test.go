package daemon

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

const testToken = "s3cret-token-0123456789"

// guarded is an admin mux with one more route, behind auth.
func guarded(auth *AdminAuth) http.Handler {
	mux := AdminMux(prometheus.NewRegistry(), func() error { return nil })
	mux.HandleFunc("/reload", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("reloaded\n")) })
	return auth.Wrap(mux)
}

func TestAdminAuth(t *testing.T) {
	var auth AdminAuth
	h := guarded(&auth)
	type req struct {
		method, path, authz string
	}
	serve := func(r req) *httptest.ResponseRecorder {
		hr := httptest.NewRequest(r.method, r.path, nil)
		hr.Host = "127.0.0.1:9240"
		if r.authz != "" {
			hr.Header.Set("Authorization", r.authz)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, hr)
		return w
	}

	// No token: everything is served.
	if w := serve(req{"POST", "/reload", ""}); w.Code != 200 || auth.Enabled() {
		t.Fatalf("without a token: %d", w.Code)
	}

	auth.SetToken([]byte(testToken))
	for _, tc := range []struct {
		name      string
		req       req
		code      int
		challenge string // WWW-Authenticate of a 401
	}{
		{"healthz open", req{"GET", "/healthz", ""}, 200, ""},
		{"metrics open", req{"GET", "/metrics", ""}, 200, ""},
		{"HEAD metrics open", req{"HEAD", "/metrics", ""}, 200, ""},
		{"POST metrics guarded", req{"POST", "/metrics", ""}, 401, "Bearer"},
		{"healthz with a trailing slash guarded", req{"GET", "/healthz/", ""}, 401, "Bearer"},
		{"no header", req{"POST", "/reload", ""}, 401, "Bearer"},
		{"other scheme", req{"POST", "/reload", "Basic " + testToken}, 401, "Bearer"},
		{"empty bearer", req{"POST", "/reload", "Bearer "}, 401, "Bearer"},
		{"no space", req{"POST", "/reload", "Bearer" + testToken}, 401, "Bearer"},
		{"wrong token", req{"POST", "/reload", "Bearer nope"}, 401, `Bearer error="invalid_token"`},
		{"token prefix", req{"POST", "/reload", "Bearer " + testToken[:len(testToken)-1]}, 401, `Bearer error="invalid_token"`},
		{"token and more", req{"POST", "/reload", "Bearer " + testToken + "x"}, 401, `Bearer error="invalid_token"`},
		{"right token", req{"POST", "/reload", "Bearer " + testToken}, 200, ""},
		{"scheme case-insensitive", req{"POST", "/reload", "bearer " + testToken}, 200, ""},
		{"unknown path with the token", req{"GET", "/nosuch", "Bearer " + testToken}, 404, ""},
		{"unknown path without", req{"GET", "/nosuch", ""}, 401, "Bearer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(tc.req)
			if w.Code != tc.code {
				t.Fatalf("%d, want %d: %s", w.Code, tc.code, w.Body)
			}
			if tc.code != 401 {
				return
			}
			if got := w.Header().Get("WWW-Authenticate"); got != tc.challenge {
				t.Errorf("WWW-Authenticate %q, want %q", got, tc.challenge)
			}
			var e struct {
				Status  int    `json:"status"`
				Code    string `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Status != 401 || e.Code != CodeUnauthorized || e.Message == "" {
				t.Errorf("body %s: %+v %v", w.Body, e, err)
			}
			if w.Header().Get("Content-Type") != "application/json" {
				t.Errorf("Content-Type %q", w.Header().Get("Content-Type"))
			}
		})
	}

	// A new token replaces the old one at once; none opens the endpoint again.
	auth.SetToken([]byte("another-token-abcdefgh"))
	if serve(req{"POST", "/reload", "Bearer " + testToken}).Code != 401 || serve(req{"POST", "/reload", "Bearer another-token-abcdefgh"}).Code != 200 {
		t.Errorf("the token was not replaced")
	}
	auth.SetToken(nil)
	if serve(req{"POST", "/reload", ""}).Code != 200 || auth.Enabled() {
		t.Errorf("removing the token did not open the endpoint")
	}
}

func TestAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content, want, err string
	}{
		{"trailing newline", testToken + "\n", testToken, ""},
		{"surrounding space", "  " + testToken + " \r\n", testToken, ""},
		{"empty", "\n", "", "0 bytes, want at least 16"},
		{"short", "short\n", "", "5 bytes, want at least 16"},
		{"inner space", "abcdefgh ijklmnopq\n", "", "a space"},
		{"non-ASCII", "abcdefghijklmnopé", "", "non-ASCII"},
		{"control", "abcdefgh\x01ijklmnopq", "", "control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			tok, err := ReadTokenFile(path)
			switch {
			case tc.err == "" && (err != nil || string(tok) != tc.want):
				t.Errorf("got %q, %v; want %q", tok, err, tc.want)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), path)):
				t.Errorf("got %q, %v; want an error naming the file and %q", tok, err, tc.err)
			}
		})
	}
	if _, err := ReadTokenFile(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: %v", err)
	}
}

func TestAdminLoopbackListen(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9241":          true,
		"127.3.4.5:1":             true,
		"[::1]:9241":              true,
		"[::ffff:127.0.0.1]:9241": true,
		"localhost:9241":          true,
		"LOCALHOST:1":             true,
		":9241":                   false,
		"0.0.0.0:9241":            false,
		"[::]:9241":               false,
		"10.0.0.1:9241":           false,
		"admin.example:9241":      false,
		"127.0.0.1":               false, // no port: not a listen address
		"":                        false,
	} {
		if got := IsLoopbackListen(addr); got != want {
			t.Errorf("IsLoopbackListen(%q) = %v, want %v", addr, got, want)
		}
	}
}

// FuzzAdminAuth: whatever the Authorization header, the guard never panics and lets
// a request through only with the token itself.
func FuzzAdminAuth(f *testing.F) {
	for _, s := range []string{"", "Bearer " + testToken, "bearer  " + testToken + " ", "Bearer", "Basic eDp5", "Bearer \x00", " Bearer x"} {
		f.Add(s)
	}
	var auth AdminAuth
	auth.SetToken([]byte(testToken))
	h := guarded(&auth)
	f.Fuzz(func(t *testing.T, authz string) {
		r := httptest.NewRequest("POST", "/reload", nil)
		r.Host = "localhost:9240"
		r.Header["Authorization"] = []string{authz}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		tok, ok := bearer(authz)
		if (w.Code == 200) != (ok && tok == testToken) {
			t.Fatalf("header %q: %d", authz, w.Code)
		}
	})
}

func TestReadAdminTokenFile(t *testing.T) {
	if tok, err := ReadAdminTokenFile(""); tok != nil || err != nil {
		t.Errorf("no file: %q %v", tok, err)
	}
	path := filepath.Join(t.TempDir(), "token")
	if _, err := ReadAdminTokenFile(path); err == nil || !strings.HasPrefix(err.Error(), "admin_token_file: ") {
		t.Errorf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := ReadAdminTokenFile(path); err != nil || string(tok) != "0123456789abcdef0123" {
		t.Errorf("token: %q %v", tok, err)
	}
	if Result(nil) != "ok" || Result(os.ErrNotExist) != "error" {
		t.Errorf("Result")
	}
}
