package keyserverd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/testkit/daemontest"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// pki is the mutual TLS of a test: keyserverd's certificate and the client CA.
type pki struct {
	dir                  string
	cert, key, clientCAF string
	serverCA, clientCA   *testpki.CA
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	var err error
	if p.serverCA, err = testpki.NewCA("keyserverd test CA"); err != nil {
		t.Fatal(err)
	}
	if p.clientCA, err = testpki.NewCA("client CA"); err != nil {
		t.Fatal(err)
	}
	leaf, err := p.serverCA.Leaf("keyserverd", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.serverCA.WriteFiles(p.dir, "server", leaf); err != nil {
		t.Fatal(err)
	}
	p.cert, p.key = filepath.Join(p.dir, "keyserverd.pem"), filepath.Join(p.dir, "keyserverd.key")
	if p.clientCAF, err = p.clientCA.WriteFiles(p.dir, "client"); err != nil {
		t.Fatal(err)
	}
	return p
}

// config returns a configuration on loopback ports chosen by the kernel, with the
// TLS files of p, followed by more.
func (p *pki) config(more string) string {
	return fmt.Sprintf(`listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
state_dir: %q
log_level: debug
tls: {cert_file: %q, key_file: %q, client_ca_file: %q}
`, filepath.Join(p.dir, "state"), p.cert, p.key, p.clientCAF) + more
}

// softKeys writes two PEM keys, a and b, into a directory for the software backend.
func softKeys(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"a", "b"} {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		pemKey, err := testpki.KeyPEM(k)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".key"), pemKey, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// running is a Daemon running in the background.
type running struct {
	*Daemon
	t    *testing.T
	path string
	url  string
	log  *testenv.LockedBuffer
	stop func() error
	// token is the admin token in force at start (generated unless configured).
	token string
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// start runs keyserverd with config until the test ends.
func start(t *testing.T, config string) *running {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keyserverd.yaml")
	writeFile(t, path, config)
	log := &testenv.LockedBuffer{}
	d := &Daemon{Path: path, Stderr: log}
	stop := daemontest.Start(t, daemontest.Options{Name: "keyserverd", Run: d.Run, Serving: d.Serving(), Log: log})
	return &running{Daemon: d, t: t, path: path, url: "http://" + d.AdminAddr().String(), log: log, stop: stop,
		token: daemontest.Token(t, d.TokenFile())}
}

// do sends an admin request (with token tok, if any) and returns the status and body.
func (r *running) do(method, path, tok string) (int, string) {
	r.t.Helper()
	req, err := http.NewRequest(method, r.url+path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// want sends a request with the admin token and checks its status and that the body
// holds each of parts.
func (r *running) want(method, path string, status int, parts ...string) string {
	r.t.Helper()
	got, b := r.do(method, path, r.token)
	if got != status {
		r.t.Errorf("%s %s: %d, want %d: %s", method, path, got, status, b)
	}
	for _, p := range parts {
		if !strings.Contains(b, p) {
			r.t.Errorf("%s %s: body lacks %q:\n%s", method, path, p, b)
		}
	}
	return b
}

func (r *running) status() status {
	r.t.Helper()
	var st status
	if err := json.Unmarshal([]byte(r.want("GET", "/status", 200)), &st); err != nil {
		r.t.Fatal(err)
	}
	return st
}

// labels lists the labels of keys.
func labels[K protocol.KeyInfo | keyInfo](keys []K) string {
	var l []string
	for _, k := range keys {
		switch k := any(k).(type) {
		case protocol.KeyInfo:
			l = append(l, k.Label)
		case keyInfo:
			l = append(l, k.Label)
		}
	}
	return strings.Join(l, ",")
}

// listKeysAs connects as a client named cn and returns the labels of the keys it
// may use, or the error keyserverd answered.
func (r *running) listKeysAs(p *pki, cn string) (string, error) {
	r.t.Helper()
	leaf, err := p.clientCA.Leaf(cn)
	if err != nil {
		r.t.Fatal(err)
	}
	tc, err := tls.Dial("tcp", r.Addr().String(), &tls.Config{RootCAs: p.serverCA.Pool(), ServerName: "127.0.0.1",
		NextProtos: []string{keyserver.ALPN}, Certificates: []tls.Certificate{leaf}})
	if err != nil {
		return "", err
	}
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.Write(protocol.AppendRequest(nil, &protocol.Request{Op: protocol.OpListKeys, ID: 1})); err != nil {
		return "", err
	}
	h, body, err := protocol.ReadFrame(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	if err := protocol.ResponseError(h, body); err != nil {
		return "", err
	}
	keys, err := protocol.ParseKeyList(body)
	if err != nil {
		return "", err
	}
	return labels(keys), nil
}

// TestReload changes the client rules and the software keys of a running keyserverd
// through POST /reload and SIGHUP, and checks that what cannot change, or does not
// validate, is refused with the running configuration kept.
func TestReload(t *testing.T) {
	p := newPKI(t)
	keys := softKeys(t)
	base := p.config(fmt.Sprintf("software: {files: [%q]}\n", filepath.Join(keys, "a.key")))
	r := start(t, base+"clients: [{name: l7, keys: ['*']}]\n")
	r.want("GET", "/healthz", 200, "ok")
	if got, err := r.listKeysAs(p, "l7"); err != nil || got != "a" {
		t.Fatalf("keys of l7 at start: %q %v", got, err)
	}
	if got, err := r.listKeysAs(p, "other"); err != nil || got != "" {
		t.Errorf("keys of a client no rule names: %q %v", got, err)
	}

	// Rules and keys change through POST /reload.
	writeFile(t, r.path, strings.Replace(p.config(fmt.Sprintf("software: {files: [%q, %q]}\n", filepath.Join(keys, "a.key"), filepath.Join(keys, "b.key"))),
		"log_level: debug", "log_level: info", 1)+"clients: [{name: l7, keys: [b]}, {name: other, keys: ['*']}]\n")
	body := r.want("POST", "/reload", 200, `"label": "b"`, `"name": "other"`, `"software"`)
	if st := r.status(); labels(st.Keys) != "a,b" || len(st.Clients) != 2 {
		t.Errorf("status after the reload: %+v (reload answered %s)", st, body)
	}
	if got, err := r.listKeysAs(p, "l7"); err != nil || got != "b" {
		t.Errorf("keys of l7 after the reload: %q %v", got, err)
	}
	if got, err := r.listKeysAs(p, "other"); err != nil || got != "a,b" {
		t.Errorf("keys of other after the reload: %q %v", got, err)
	}
	if r.Level.Level().String() != "INFO" {
		t.Errorf("log level after the reload: %v", r.Level.Level())
	}

	// What is fixed at start is refused, and nothing changes.
	writeFile(t, r.path, strings.Replace(p.config("software: {}\nlimits: {max_conns: 3}\nallow_all_clients: true\n"), `listen: "127.0.0.1:0"`, `listen: "127.0.0.1:1"`, 1))
	r.want("POST", "/reload", 409, `"code": "restart_required"`, "listen, limits cannot change at runtime", "the running configuration stays")
	writeFile(t, r.path, base+"clients: [{keys: ['*']}]\n")
	r.want("POST", "/reload", 400, `"code": "invalid_config"`, "clients[0].name: required")
	writeFile(t, r.path, base+fmt.Sprintf("software: {files: [%q]}\n", filepath.Join(keys, "missing.key")))
	r.want("POST", "/reload", 400, `"code": "invalid_config"`)
	if st := r.status(); labels(st.Keys) != "a,b" || len(st.Clients) != 2 {
		t.Errorf("status after refused reloads: %+v", st)
	}

	// SIGHUP reloads the same way.
	writeFile(t, r.path, base+"clients: [{name: l7, keys: [a]}]\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for labels(r.status().Keys) != "a" {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not reload: %+v", r.status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := r.listKeysAs(p, "other"); err != nil || got != "" {
		t.Errorf("keys of other after SIGHUP: %q %v", got, err)
	}
	r.want("GET", "/metrics", 200,
		`tiergate_keyserver_config_changes_total{result="ok",source="reload"} 2`,
		`tiergate_keyserver_config_changes_total{result="error",source="reload"} 3`,
		"tiergate_keyserver_keys 1")
}

// TestAdminToken: with admin_token_file, /reload and /status need that token, and
// /healthz and /metrics do not.
func TestAdminToken(t *testing.T) {
	p := newPKI(t)
	tokFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokFile, "0123456789abcdef0123\n")
	r := start(t, p.config("software: {}\nallow_all_clients: true\nadmin_token_file: "+tokFile+"\n"))
	if r.token != "0123456789abcdef0123" {
		t.Errorf("token in force %q", r.token)
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{{"GET", "/healthz", 503}, {"GET", "/metrics", 200}, {"POST", "/reload", 401}, {"GET", "/status", 401}} {
		if code, body := r.do(c.method, c.path, ""); code != c.code || (c.code == 401 && !strings.Contains(body, `"code": "unauthorized"`)) {
			t.Errorf("%s %s without the token: %d %s", c.method, c.path, code, body)
		}
	}
	if code, body := r.do("POST", "/reload", "0123456789abcdef0123"); code != 200 {
		t.Errorf("reload with the token: %d %s", code, body)
	}
	if code, _ := r.do("GET", "/status", "0123456789abcdef0123"); code != 200 {
		t.Errorf("status with the token: %d", code)
	}
}

// TestAdminTokenByDefault: without admin_token_file keyserverd generates a token in
// its state directory (0600), logs where, and requires it; a request naming another
// host is refused whatever its token; admin_insecure serves without one.
func TestAdminTokenByDefault(t *testing.T) {
	p := newPKI(t)
	r := start(t, p.config("software: {}\nallow_all_clients: true\nadmin_hosts: [ks1.admin.example]\n"))
	path := filepath.Join(p.dir, "state", "admin.token")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 || len(r.token) != 64 {
		t.Fatalf("generated token %s: %v %v (%d bytes)", path, fi, err, len(r.token))
	}
	if !strings.Contains(r.log.String(), "admin token generated") || !strings.Contains(r.log.String(), path) || strings.Contains(r.log.String(), r.token) {
		t.Errorf("the log does not say where the token is (or shows it):\n%s", r.log)
	}
	if code, _ := r.do("GET", "/status", ""); code != 401 {
		t.Errorf("status without the token: %d, want 401", code)
	}
	r.want("GET", "/status", 200, `"allow_all_clients": true`)
	r.want("POST", "/reload", 200)
	if code, _ := r.do("GET", "/metrics", ""); code != 200 {
		t.Errorf("metrics without the token: %d", code)
	}
	for host, want := range map[string]int{"rebound.attacker.example": 421, "ks1.admin.example:9240": 200, "localhost": 200} {
		req, _ := http.NewRequest("GET", r.url+"/status", nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+r.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == 421 && !strings.Contains(string(b), `"code": "misdirected_request"`)) {
			t.Errorf("Host %q: %d %s, want %d", host, resp.StatusCode, b, want)
		}
	}
	// A restart reads the same token back.
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	again := start(t, p.config("software: {}\nallow_all_clients: true\n"))
	if again.token != r.token {
		t.Errorf("token after a restart %q, want %q", again.token, r.token)
	}

	open := start(t, newPKI(t).config("software: {}\nallow_all_clients: true\nadmin_insecure: true\n"))
	if code, body := open.do("GET", "/status", ""); code != 200 || open.token != "" {
		t.Errorf("admin_insecure: %d %s (token %q)", code, body, open.token)
	}
}

// TestSecretFilesWarned: keyserverd warns about its TLS key and software keys when
// their group or others may read them.
func TestSecretFilesWarned(t *testing.T) {
	p := newPKI(t)
	keys := softKeys(t)
	if err := os.Chmod(p.key, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(keys, "a.key"), 0o640); err != nil {
		t.Fatal(err)
	}
	r := start(t, p.config(fmt.Sprintf("software: {dir: %q}\nallow_all_clients: true\n", keys)))
	log := r.log.String()
	for _, want := range []string{p.key, filepath.Join(keys, "a.key")} {
		if !strings.Contains(log, "readable by others than its owner") || !strings.Contains(log, "file="+want) {
			t.Errorf("no warning about %s:\n%s", want, log)
		}
	}
	if strings.Contains(log, "file="+filepath.Join(keys, "b.key")) {
		t.Errorf("a 0600 key warned about:\n%s", log)
	}
}

// TestLameDuck stops keyserverd with lame_duck: /healthz answers 503 "shutting down"
// while clients are still served, and the stop ends only after the delay.
func TestLameDuck(t *testing.T) {
	p := newPKI(t)
	keys := softKeys(t)
	r := start(t, p.config(fmt.Sprintf("software: {dir: %q}\nlame_duck: 400ms\nallow_all_clients: true\n", keys)))
	r.want("GET", "/healthz", 200, "ok")
	startStop := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop() }()
	daemontest.WaitShuttingDown(t, func() (int, string) { return r.do("GET", "/healthz", "") })
	if got, err := r.listKeysAs(p, "l7"); err != nil || got != "a,b" {
		t.Errorf("a client during the lame-duck delay: %q %v", got, err)
	}
	r.want("POST", "/reload", 503, `"code": "unavailable"`)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(startStop); took < 400*time.Millisecond {
		t.Errorf("stopped after %v, before lame_duck", took)
	}
	if _, err := r.listKeysAs(p, "l7"); err == nil {
		t.Errorf("still serving clients after the stop")
	}
}

// hsmToken is the package's SoftHSM token: the module reads SOFTHSM2_CONF once per
// process, so every test shares one.
var hsmToken struct {
	once sync.Once
	tok  *softhsm.Token
	err  error
}

func token(t *testing.T) *softhsm.Token {
	t.Helper()
	testenv.RequireFile(t, softhsm.DefaultModule, "softhsm2")
	hsmToken.once.Do(func() {
		dir, err := os.MkdirTemp("", "keyserverd-test-token-")
		if err != nil {
			hsmToken.err = err
			return
		}
		if hsmToken.tok, hsmToken.err = softhsm.CreateToken(dir, "keyserverd-test", "so-pin-1", "pin-1"); hsmToken.err == nil {
			hsmToken.err = hsmToken.tok.Setenv()
		}
	})
	if hsmToken.err != nil {
		t.Fatalf("SoftHSM token: %v", hsmToken.err)
	}
	return hsmToken.tok
}

// TestReloadHSMKeys serves keys from a SoftHSM token, imported with `keyserverd
// import`, and changes the keys offered (pkcs11.keys) with a reload.
func TestReloadHSMKeys(t *testing.T) {
	tok := token(t)
	p := newPKI(t)
	keys := softKeys(t)
	hsmConf := func(label string) string {
		return p.config(fmt.Sprintf("pkcs11: {module: %q, token_label: %q, pin: %q, keys: [{label: %s}]}\nclients: [{name: l7, keys: ['*']}]\n",
			tok.Module, tok.Label, tok.PIN, label))
	}
	importPath := filepath.Join(t.TempDir(), "import.yaml")
	writeFile(t, importPath, hsmConf("a"))
	for _, name := range []string{"a", "b"} {
		var out, errOut bytes.Buffer
		if code := Main([]string{"import", "-config", importPath, "-label", "hsm-" + name, "-key", filepath.Join(keys, name+".key")}, &out, &errOut); code != 0 {
			t.Fatalf("import %s: %d %s", name, code, errOut.String())
		}
	}
	r := start(t, hsmConf("hsm-a"))
	if got, err := r.listKeysAs(p, "l7"); err != nil || got != "hsm-a" {
		t.Fatalf("keys at start: %q %v", got, err)
	}
	writeFile(t, r.path, hsmConf("hsm-b"))
	r.want("POST", "/reload", 200, `"label": "hsm-b"`, `"pkcs11"`)
	if got, err := r.listKeysAs(p, "l7"); err != nil || got != "hsm-b" {
		t.Errorf("keys after the reload: %q %v", got, err)
	}
	r.want("GET", "/metrics", 200, `tiergate_keyserver_extractable_keys{action="refused"} 0`, `tiergate_keyserver_extractable_keys{action="served"} 0`)
	// A key that is not on the token: refused, the keys stay.
	writeFile(t, r.path, hsmConf("hsm-none"))
	r.want("POST", "/reload", 400, `"code": "invalid_config"`, "hsm-none")
	if got, err := r.listKeysAs(p, "l7"); err != nil || got != "hsm-b" {
		t.Errorf("keys after a refused reload: %q %v", got, err)
	}
}

func TestCheckAndMain(t *testing.T) {
	p := newPKI(t)
	keys := softKeys(t)
	path := filepath.Join(t.TempDir(), "k.yaml")
	writeFile(t, path, p.config(fmt.Sprintf("software: {dir: %q}\nclients: [{name: l7, keys: ['*']}]\n", keys)))
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, p.config("software: {}\ntls: {}\n"))
	noRules := filepath.Join(t.TempDir(), "norules.yaml")
	writeFile(t, noRules, p.config(fmt.Sprintf("software: {dir: %q}\n", keys)))
	controlled := filepath.Join(t.TempDir(), "control.yaml")
	writeFile(t, controlled, p.config(fmt.Sprintf("software: {dir: %q}\nallow_all_clients: true\ncontrol: {node: ks-a, etcd_endpoints: [\"https://198.18.0.1:2379\"]}\n", keys)))
	for _, tc := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{nil, 2, "", "usage: keyserverd"},
		{[]string{"help"}, 0, "check   -config FILE", ""},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"check", "-config", path}, 0, "configuration OK", ""},
		{[]string{"check", "-config", bad}, 1, "", "mapping key \"tls\" already defined"},
		{[]string{"keys", "-config", path}, 0, "software  a", ""},
		{[]string{"check", "-config", path, "x"}, 2, "", "unexpected arguments"},
		{[]string{"check", "-config", noRules}, 1, "", "clients: no rules"},
		{[]string{"keys", "-config", noRules}, 0, "software  a", ""}, // import and keys serve no client
		{[]string{"check", "-config", controlled}, 0, "a node of the control plane: node ks-a at https://198.18.0.1:2379", ""},
	} {
		var out, errOut bytes.Buffer
		code := Main(tc.args, &out, &errOut)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errOut.String(), tc.errs) {
			t.Errorf("keyserverd %v: %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, out.String(), errOut.String(), tc.code, tc.stdout, tc.errs)
		}
	}
	var out bytes.Buffer
	if err := (&Daemon{Path: path}).Check(&out); err != nil || !strings.Contains(out.String(), "1 client rules") {
		t.Errorf("check: %v %s", err, out.String())
	}
}

// TestPINValueNotEchoed: a pin-value in the PKCS#11 URI never shows in what
// keyserverd prints when the token cannot be opened.
func TestPINValueNotEchoed(t *testing.T) {
	tok := token(t)
	p := newPKI(t)
	const pin = "Do-Not-Print-4711"
	for _, uri := range []string{
		"pkcs11:token=no-such-token?module-path=" + tok.Module + "&pin-value=" + pin,
		"pkcs11:token=" + tok.Label + ";bogus=1?pin-value=" + pin,
	} {
		path := filepath.Join(t.TempDir(), "k.yaml")
		writeFile(t, path, p.config(fmt.Sprintf("pkcs11: {uri: %q}\nallow_all_clients: true\n", uri)))
		var out, errOut bytes.Buffer
		code := Main([]string{"check", "-config", path}, &out, &errOut)
		if code != 1 || strings.Contains(out.String()+errOut.String(), pin) {
			t.Errorf("check with %q: %d\n%s%s", uri, code, out.String(), errOut.String())
		}
		log := &testenv.LockedBuffer{}
		err := (&Daemon{Path: path, Stderr: log}).Run(context.Background())
		if err == nil || strings.Contains(err.Error(), pin) || strings.Contains(log.String(), pin) {
			t.Errorf("run with %q: %v\n%s", uri, err, log)
		}
	}
}
