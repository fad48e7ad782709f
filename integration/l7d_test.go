package integration

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// echoBackend is an HTTP/1.1 server that answers with what it received.
type echoBackend struct {
	addr string
	hits atomic.Int64
}

type echo struct {
	Method, Path, Proto, Host     string
	XFF, XRealIP, XForwardedProto string
}

func newEchoBackend(t *testing.T) *echoBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &echoBackend{addr: ln.Addr().String()}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(echo{r.Method, r.URL.Path, r.Proto, r.Host,
			r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Real-Ip"), r.Header.Get("X-Forwarded-Proto")})
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return b
}

// site is a certificate set for l7d: one CA, certificates written to files.
type site struct {
	dir string
	ca  *testpki.CA
}

func newSite(t *testing.T) *site {
	t.Helper()
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	s := &site{dir: t.TempDir(), ca: ca}
	if _, err := ca.WriteFiles(s.dir, "site"); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *site) caFile() string { return filepath.Join(s.dir, "site-ca.pem") }

// cert issues a certificate for names with priv's public key, writes <file>.pem and,
// when withKey, <file>.key; it returns the certificate path.
func (s *site) cert(t *testing.T, file string, priv crypto.Signer, withKey bool, names ...string) string {
	t.Helper()
	_, der, err := s.ca.Issue(names[0], priv.Public(), names...)
	if err != nil {
		t.Fatal(err)
	}
	certPath := filepath.Join(s.dir, file+".pem")
	if err := testpki.WritePEM(certPath, "CERTIFICATE", der); err != nil {
		t.Fatal(err)
	}
	if withKey {
		keyDER, _ := x509.MarshalPKCS8PrivateKey(priv)
		if err := testpki.WritePEM(filepath.Join(s.dir, file+".key"), "PRIVATE KEY", keyDER); err != nil {
			t.Fatal(err)
		}
	}
	return certPath
}

func (s *site) pool() *x509.CertPool { return s.ca.Pool() }

// l7dProc is one l7d process.
type l7dProc struct {
	daemon
	cfgPath  string
	addr     string
	admin    string
	stateDir string // the state_dir given unless the configuration has one
}

// newL7d writes cfg (YAML, with %[1]s the listener address and %[2]s the admin address
// substituted; a state_dir of the test's unless it gives one, where l7d generates its
// admin token) and starts l7d.
func newL7d(t *testing.T, cfg string) *l7dProc {
	t.Helper()
	dir := t.TempDir()
	p := &l7dProc{cfgPath: filepath.Join(dir, "l7d.yaml"), addr: freePort(t), admin: freePort(t), stateDir: filepath.Join(dir, "state")}
	p.daemon = daemon{t: t, name: "l7d", args: []string{filepath.Join(binaries(t), "l7d"), "run", "-config", p.cfgPath},
		health: "http://" + p.admin + "/healthz", log: filepath.Join(dir, "l7d.log")}
	p.writeConfig(cfg)
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *l7dProc) writeConfig(cfg string) {
	p.t.Helper()
	cfg = fmt.Sprintf(cfg, p.addr, p.admin)
	if !strings.Contains(cfg, "state_dir:") {
		cfg += fmt.Sprintf("state_dir: %q\n", p.stateDir)
	}
	if err := os.WriteFile(p.cfgPath, []byte(cfg), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// token returns the admin token l7d generated in the state_dir newL7d gave it.
func (p *l7dProc) token() string {
	p.t.Helper()
	b, err := os.ReadFile(filepath.Join(p.stateDir, "admin.token"))
	if err != nil {
		p.t.Fatalf("l7d's admin token: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// post sends an empty POST to path on the admin endpoint, with the admin token.
func (p *l7dProc) post(path string) (*http.Response, error) {
	req, err := http.NewRequest("POST", "http://"+p.admin+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+p.token())
	return http.DefaultClient.Do(req)
}

func (p *l7dProc) port() string { _, port, _ := net.SplitHostPort(p.addr); return port }

// metric sums the samples of an l7d metric whose line contains every filter.
func (p *l7dProc) metric(name string, filters ...string) float64 {
	return scrape("http://"+p.admin+"/metrics", name, filters...)
}

func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	return keyByName(t, "rsa2048").priv.(*rsa.PrivateKey)
}

func ecKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func httpsClient(s *site, proto string) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.pool(), ServerName: "site.test"}, ForceAttemptHTTP2: proto == "h2"}
	if proto == "h1" {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestL7dServesHTTP1HTTP2HTTP3 checks one l7d listener over the three protocols, with
// curl and quic-go as clients, and the headers sent to the backend.
func TestL7dServesHTTP1HTTP2HTTP3(t *testing.T) {
	curl := testenv.RequireCommand(t, "curl", "curl")
	backend := newEchoBackend(t)
	s := newSite(t)
	rsaCert := s.cert(t, "rsa", rsaKey(t), true, "site.test")
	ecCert := s.cert(t, "ec", ecKey(t), true, "site.test")
	l7 := newL7d(t, `
listeners: [{name: public, addr: "%[1]s", pool: web}]
backends: {web: {members: ["`+backend.addr+`"]}}
certificates:
  certificates: [{cert_file: "`+rsaCert+`", key_file: "`+strings.TrimSuffix(rsaCert, ".pem")+`.key"},
                 {cert_file: "`+ecCert+`", key_file: "`+strings.TrimSuffix(ecCert, ".pem")+`.key"}]
admin_listen: "%[2]s"
`)
	url := "https://site.test:" + l7.port() + "/hello"
	for _, tc := range []struct{ flag, proto string }{{"--http1.1", "HTTP/1.1"}, {"--http2", "HTTP/2"}} {
		out, err := exec.Command(curl, "-sS", tc.flag, "--cacert", s.caFile(), "--resolve", "site.test:"+l7.port()+":127.0.0.1",
			"-D", "-", "-H", "X-Forwarded-For: 203.0.113.66", url).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %s: %v\n%s\n%s", tc.flag, err, out, l7.logTail())
		}
		s := string(out)
		if !strings.Contains(strings.ToLower(s), `alt-svc: h3=":`+l7.port()+`"`) {
			t.Errorf("curl %s: no Alt-Svc advertising h3:\n%s", tc.flag, s)
		}
		var e echo
		if err := json.Unmarshal([]byte(s[strings.Index(s, "{"):]), &e); err != nil {
			t.Fatalf("curl %s: body: %v\n%s", tc.flag, err, s)
		}
		if e.Path != "/hello" || e.Proto != "HTTP/1.1" || e.XForwardedProto != "https" || e.XRealIP != "127.0.0.1" ||
			!strings.HasSuffix(e.XFF, "127.0.0.1") || strings.Contains(e.XFF, "203.0.113.66") {
			t.Errorf("curl %s: backend saw %+v (want the client's own address, the spoofed XFF dropped)", tc.flag, e)
		}
		if !strings.Contains(s, tc.proto) {
			t.Errorf("curl %s: response is not %s:\n%s", tc.flag, tc.proto, s)
		}
	}

	// HTTP/3 with quic-go's client.
	h3 := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: s.pool(), ServerName: "site.test"}}
	defer h3.Close()
	req, _ := http.NewRequest("GET", "https://"+l7.addr+"/h3", nil)
	req.Host = "site.test"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := h3.RoundTrip(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("HTTP/3: %v\n%s", err, l7.logTail())
	}
	var e echo
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.ProtoMajor != 3 || e.Path != "/h3" || e.XForwardedProto != "https" {
		t.Errorf("HTTP/3: %s, backend saw %+v", resp.Proto, e)
	}
	if got := l7.metric("tiergate_tls_handshakes_total", `result="ok"`); got < 3 {
		t.Errorf("tiergate_tls_handshakes_total{result=ok} = %v, want ≥ 3 (h1, h2, h3)", got)
	}
	if got := l7.metric("tiergate_http_requests_total", `code="200"`); got < 3 {
		t.Errorf("tiergate_http_requests_total{code=200} = %v, want ≥ 3", got)
	}
}

// sClient runs openssl s_client with an HTTP request on stdin and returns its output.
func sClient(t *testing.T, args ...string) string {
	t.Helper()
	openssl := testenv.RequireCommand(t, "openssl", "openssl")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, openssl, append([]string{"s_client"}, args...)...)
	cmd.Stdin = strings.NewReader("GET / HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("openssl s_client %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestL7dSNISelectionAndResumptionAcrossNodes: SNI picks the certificate, RSA or
// ECDSA by what the client supports, and a session from one l7d resumes on another
// that shares the ticket keys, in TLS 1.2 and 1.3.
func TestL7dSNISelectionAndResumptionAcrossNodes(t *testing.T) {
	backend := newEchoBackend(t)
	s := newSite(t)
	rsaCert := s.cert(t, "rsa", rsaKey(t), true, "site.test")
	ecCert := s.cert(t, "ec", ecKey(t), true, "site.test")
	otherCert := s.cert(t, "other", ecKey(t), true, "other.test", "*.wild.test")
	ticketKey := filepath.Join(s.dir, "ticket.key")
	key := make([]byte, 32)
	rand.Read(key)
	os.WriteFile(ticketKey, []byte(hex.EncodeToString(key)), 0o600)
	cfg := `
listeners: [{addr: "%[1]s", pool: web, disable_http3: true}]
backends: {web: {members: ["` + backend.addr + `"]}}
certificates:
  certificates:
    - {cert_file: "` + rsaCert + `", key_file: "` + strings.TrimSuffix(rsaCert, ".pem") + `.key"}
    - {cert_file: "` + ecCert + `", key_file: "` + strings.TrimSuffix(ecCert, ".pem") + `.key"}
    - {name: other, cert_file: "` + otherCert + `", key_file: "` + strings.TrimSuffix(otherCert, ".pem") + `.key"}
  default: other
  ticket_key_files: ["` + ticketKey + `"]
admin_listen: "%[2]s"
`
	a := newL7d(t, cfg)
	b := newL7d(t, cfg)
	common := []string{"-CAfile", s.caFile(), "-verify_return_error"}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"ECDSA preferred", []string{"-servername", "site.test", "-brief"}, []string{"Peer certificate: CN = site.test", "Signature type: ECDSA"}},
		{"RSA when the client wants it", []string{"-servername", "site.test", "-brief", "-sigalgs", "RSA-PSS+SHA256:RSA+SHA256"}, []string{"Peer certificate: CN = site.test", "Signature type: RSA-PSS"}},
		{"TLS 1.2 RSA suite", []string{"-servername", "site.test", "-brief", "-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"}, []string{"Protocol version: TLSv1.2", "Signature type: RSA"}},
		{"other name", []string{"-servername", "other.test", "-brief"}, []string{"Peer certificate: CN = other.test"}},
		{"wildcard", []string{"-servername", "a.wild.test", "-brief"}, []string{"Peer certificate: CN = other.test"}},
		{"default for an unknown name", []string{"-servername", "unknown.test", "-brief", "-verify_hostname", "other.test"}, []string{"Peer certificate: CN = other.test"}},
	}
	for _, tc := range cases {
		out := sClient(t, append(append([]string{"-connect", a.addr}, common...), tc.args...)...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, out)
			}
		}
	}

	for _, v := range []string{"-tls1_3", "-tls1_2"} {
		sess := filepath.Join(t.TempDir(), "sess")
		first := sClient(t, append(common, "-connect", a.addr, "-servername", "site.test", v, "-sess_out", sess)...)
		if !strings.Contains(first, "New, TLSv1.") {
			t.Fatalf("%s: first handshake not new:\n%s", v, first)
		}
		second := sClient(t, append(common, "-connect", b.addr, "-servername", "site.test", v, "-sess_in", sess)...)
		if !strings.Contains(second, "Reused, TLSv1.") {
			t.Errorf("%s: session from node A did not resume on node B:\n%s", v, second)
		}
	}
	if got := b.metric("tiergate_tls_handshakes_total", `resumed="true"`, `result="ok"`); got < 2 {
		t.Errorf("node B counted %v resumed handshakes, want 2", got)
	}
}

// TestL7dReloadUnderLoadLosesNothing reloads l7d (a good reload adding a name, then a
// bad one) while a bounded client loop runs: no request may fail.
func TestL7dReloadUnderLoadLosesNothing(t *testing.T) {
	backend := newEchoBackend(t)
	s := newSite(t)
	cert := s.cert(t, "site", ecKey(t), true, "site.test")
	newCert := s.cert(t, "new", ecKey(t), true, "new.test")
	badCert := filepath.Join(s.dir, "bad.pem")
	os.WriteFile(badCert, []byte("not a certificate"), 0o600)
	base := `
listeners: [{addr: "%[1]s", pool: web}]
backends: {web: {members: ["` + backend.addr + `"]}}
admin_listen: "%[2]s"
certificates:
  certificates:
    - {cert_file: "` + cert + `", key_file: "` + strings.TrimSuffix(cert, ".pem") + `.key"}
`
	l7 := newL7d(t, base)

	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			proto := []string{"h1", "h2"}[w%2]
			c := httpsClient(s, proto)
			for i := 0; i < 2000 && time.Now().Before(stop); i++ {
				if i%10 == 0 {
					c.CloseIdleConnections() // new handshakes too, not only requests
				}
				resp, err := c.Get("https://" + l7.addr + "/x")
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
			}
		}(w)
	}
	time.Sleep(time.Second)
	l7.writeConfig(base + `    - {cert_file: "` + newCert + `", key_file: "` + strings.TrimSuffix(newCert, ".pem") + `.key"}` + "\n")
	l7.signal(syscall.SIGHUP)
	waitFor(t, 5*time.Second, "reload counted", func() bool {
		return l7.metric("tiergate_l7_reloads_total", `result="ok"`) >= 1
	})
	out := sClient(t, "-connect", l7.addr, "-servername", "new.test", "-brief", "-CAfile", s.caFile(), "-verify_return_error")
	if !strings.Contains(out, "CN = new.test") {
		t.Errorf("after reload new.test is not served:\n%s", out)
	}
	time.Sleep(500 * time.Millisecond)
	// A reload whose only certificate is garbage is refused; the running set stays.
	l7.writeConfig(strings.Replace(base, cert, badCert, 1))
	resp, err := l7.post("/reload")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("bad reload answered %d %s, want 422", resp.StatusCode, body)
	}
	wg.Wait()
	t.Logf("%d requests, %d failed (first: %v)", ok.Load(), failed.Load(), firstErr.Load())
	if failed.Load() != 0 || ok.Load() < 50 {
		t.Errorf("%d requests failed of %d during reloads: %v\n%s", failed.Load(), ok.Load()+failed.Load(), firstErr.Load(), l7.logTail())
	}
	out = sClient(t, "-connect", l7.addr, "-servername", "new.test", "-brief", "-CAfile", s.caFile(), "-verify_return_error")
	if !strings.Contains(out, "CN = new.test") {
		t.Errorf("after the refused reload new.test is no longer served:\n%s", out)
	}
}

// TestL7dRemoteKeyKeyserverKilled: l7d's RSA key is on two keyservers; one is killed
// while clients handshake; handshakes keep completing through the other.
func TestL7dRemoteKeyKeyserverKilled(t *testing.T) {
	requireSoftHSM(t)
	backend := newEchoBackend(t)
	p := newPKI(t)
	k := keyByName(t, "rsa2048")
	ka := newKeyserver(t, p, []*siteKey{k})
	kb := newKeyserver(t, p, []*siteKey{k})
	l7cert, err := p.clientCA.Leaf("l7-node")
	if err != nil {
		t.Fatal(err)
	}
	mtlsDir := t.TempDir()
	if _, err := p.clientCA.WriteFiles(mtlsDir, "l7", l7cert); err != nil {
		t.Fatal(err)
	}
	s := newSite(t)
	cert := s.cert(t, "site", k.priv, false, "site.test") // no key file: the key is remote
	l7 := newL7d(t, `
listeners: [{addr: "%[1]s", pool: web, disable_http3: true}]
backends: {web: {members: ["`+backend.addr+`"]}}
admin_listen: "%[2]s"
certificates: {certificates: [{cert_file: "`+cert+`"}]}
keyservers:
  servers: ["`+ka.addr+`", "`+kb.addr+`"]
  cert_file: "`+filepath.Join(mtlsDir, "l7-node.pem")+`"
  key_file: "`+filepath.Join(mtlsDir, "l7-node.key")+`"
  ca_file: "`+filepath.Join(p.dir, "server-ca.pem")+`"
  request_timeout: 500ms
`)
	cfg := &tls.Config{RootCAs: s.pool(), ServerName: "site.test", MaxVersion: tls.VersionTLS13}
	var ok, failed, okAfter atomic.Int64
	var killed atomic.Bool
	var firstErr atomic.Value
	var wg sync.WaitGroup
	stop := time.Now().Add(4 * time.Second)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000 && time.Now().Before(stop); i++ {
				d := tls.Dialer{Config: cfg}
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
				c, err := d.DialContext(ctx, "tcp", l7.addr)
				cancel()
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				c.Close()
				ok.Add(1)
				if killed.Load() {
					okAfter.Add(1)
				}
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	ka.kill()
	killed.Store(true)
	wg.Wait()
	t.Logf("%d handshakes (%d after the kill), %d failed (first: %v)", ok.Load(), okAfter.Load(), failed.Load(), firstErr.Load())
	if okAfter.Load() == 0 {
		t.Errorf("no handshake completed after keyserver A was killed\n%s", l7.logTail())
	}
	if f := failed.Load(); f*20 > ok.Load()+f {
		t.Errorf("%d of %d handshakes failed", f, ok.Load()+f)
	}
	if got := l7.metric("tiergate_tls_handshakes_total", `sig="rsa"`, `result="ok"`); got < float64(ok.Load()) {
		t.Errorf("l7d counted %v RSA handshakes, clients completed %d", got, ok.Load())
	}
}
