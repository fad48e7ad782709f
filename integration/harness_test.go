// Package integration holds end-to-end tests that start real Tiergate processes (and,
// later, network namespaces). The benchmark programs live in bench/.
package integration

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/proc"
	"github.com/tiergate/tiergate/internal/promtext"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds the project's commands once per test run.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "tiergate-bin-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir+"/", "github.com/tiergate/tiergate/cmd/...", "github.com/tiergate/tiergate/bench/hsload").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{binDir, keyDir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

func requireSoftHSM(t *testing.T) {
	t.Helper()
	testenv.RequireFile(t, softhsm.DefaultModule, "softhsm2")
	testenv.RequireCommand(t, "softhsm2-util", "softhsm2")
}

// siteKey is a private key under test, with its PEM file and key ID.
type siteKey struct {
	name string
	priv crypto.Signer
	pem  string
	id   protocol.KeyID
}

var (
	keysOnce sync.Once
	keyDir   string
	allKeys  []*siteKey
)

// testKeys generates RSA-2048/3072/4096 and ECDSA P-256/P-384 keys once per run.
func testKeys(t *testing.T) []*siteKey {
	t.Helper()
	keysOnce.Do(func() {
		var err error
		keyDir, err = os.MkdirTemp("", "tiergate-keys-")
		if err != nil {
			t.Fatal(err)
		}
		gen := []struct {
			name string
			f    func() (crypto.Signer, error)
		}{
			{"rsa2048", func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 2048) }},
			{"rsa3072", func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 3072) }},
			{"rsa4096", func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 4096) }},
			{"p256", func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }},
			{"p384", func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P384(), rand.Reader) }},
		}
		for _, g := range gen {
			priv, err := g.f()
			if err != nil {
				t.Fatal(err)
			}
			pemBytes, err := testpki.KeyPEM(priv)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(keyDir, g.name+".key")
			if err := os.WriteFile(path, pemBytes, 0o600); err != nil {
				t.Fatal(err)
			}
			id, _ := backend.KeyIDOf(priv.Public())
			allKeys = append(allKeys, &siteKey{name: g.name, priv: priv, pem: path, id: id})
		}
	})
	if len(allKeys) != 5 {
		t.Fatal("test keys not generated")
	}
	return allKeys
}

func keyByName(t *testing.T, name string) *siteKey {
	for _, k := range testKeys(t) {
		if k.name == name {
			return k
		}
	}
	t.Fatalf("no key %s", name)
	return nil
}

// pki is the mutual-TLS set-up between the L7 side and the keyservers.
type pki struct {
	dir        string
	serverCA   *testpki.CA
	clientCA   *testpki.CA
	serverCert string
	serverKey  string
	clientCAF  string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	m, err := testpki.NewMutualTLS(p.dir, "keyserver", "keyserverd", []string{"127.0.0.1"}, "")
	if err != nil {
		t.Fatal(err)
	}
	p.serverCA, p.clientCA = m.ServerCA, m.ClientCA
	p.serverCert, p.serverKey, p.clientCAF = m.ServerCert, m.ServerKey, m.ClientCAFile
	return p
}

// clientTLS returns a client configuration for a client named cn.
func (p *pki) clientTLS(t *testing.T, cn string) *tls.Config {
	t.Helper()
	cert, err := p.clientCA.Leaf(cn)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: p.serverCA.Pool(), ServerName: "127.0.0.1"}
}

// daemon is a Tiergate process under test: started, awaited until /healthz answers,
// stopped gracefully or killed. Its log keeps the lines of every run.
type daemon struct {
	t      *testing.T
	name   string
	args   []string
	env    []string
	health string // URL of /healthz
	log    string
	client *http.Client  // for health; default http.DefaultClient
	proc   *proc.Process // nil when not running
}

func (d *daemon) start() {
	t := d.t
	t.Helper()
	cmd := exec.Command(d.args[0], d.args[1:]...)
	cmd.Env = append(os.Environ(), d.env...)
	p, err := proc.Start(d.name, d.log, cmd, proc.AppendLog())
	if err != nil {
		t.Fatal(err)
	}
	d.proc = p
	client := d.client
	if client == nil {
		client = http.DefaultClient
	}
	if err := p.WaitHTTP(context.Background(), client, d.health, 15*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.logTail())
	}
}

// kill stops the process at once, as a crash would.
func (d *daemon) kill() {
	if d.proc == nil {
		return
	}
	d.proc.Kill()
	d.proc = nil
}

// stop sends SIGTERM and waits for a graceful exit.
func (d *daemon) stop() {
	if d.proc == nil {
		return
	}
	if err := d.proc.Stop(20 * time.Second); err != nil {
		d.t.Errorf("stopping %s with SIGTERM: %v\n%s", d.name, err, d.logTail())
	}
	d.proc = nil
}

// signal sends sig (SIGHUP: reload) to the running process.
func (d *daemon) signal(sig os.Signal) {
	d.t.Helper()
	if err := d.proc.Signal(sig); err != nil {
		d.t.Fatal(err)
	}
}

// logTail is the end of the log, over every run.
func (d *daemon) logTail() string { return proc.Tail(d.log, 100) }

// scrape sums the samples of metric name at url whose labels pass every matcher
// (promtext.Samples.Select: `label="value"`, or `!label="value"` to exclude); -1 when
// the scrape fails.
func scrape(url, name string, matchers ...string) float64 {
	return scrapeWith(http.DefaultClient, url, name, matchers...)
}

// scrapeWith is scrape through client.
func scrapeWith(client *http.Client, url, name string, matchers ...string) float64 {
	ss, err := promtext.Get(context.Background(), client, url)
	if err != nil {
		return -1
	}
	return ss.Sum(name, matchers...)
}

// keyserverProc is one keyserverd process on its own SoftHSM2 token.
type keyserverProc struct {
	daemon
	bin     string
	tok     *softhsm.Token
	cfgPath string
	addr    string
	metrics string
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// newKeyserver creates a token, imports keys into it with `keyserverd import`, writes
// a configuration, and starts keyserverd.
func newKeyserver(t *testing.T, p *pki, keys []*siteKey) *keyserverProc {
	t.Helper()
	dir := t.TempDir()
	tok, err := softhsm.CreateToken(filepath.Join(dir, "token"), "tiergate-test", "so-pin-1234", "pin-1234")
	if err != nil {
		t.Fatal(err)
	}
	pinFile := filepath.Join(dir, "pin")
	if err := os.WriteFile(pinFile, []byte(tok.PIN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ks := &keyserverProc{bin: filepath.Join(binaries(t), "keyserverd"), tok: tok,
		cfgPath: filepath.Join(dir, "keyserverd.yaml"), addr: freePort(t), metrics: freePort(t)}
	ks.daemon = daemon{t: t, name: "keyserverd", args: []string{ks.bin, "run", "-config", ks.cfgPath},
		env: tok.Env(), health: "http://" + ks.metrics + "/healthz", log: filepath.Join(dir, "keyserverd.log")}
	cfg := fmt.Sprintf(`listen: %q
metrics_listen: %q
state_dir: %q
log_level: debug
shutdown_grace: 5s
tls:
  cert_file: %q
  key_file: %q
  client_ca_file: %q
pkcs11:
  module: %q
  token_label: %q
  pin_file: %q
clients:
  - name: l7-node
    keys: ["*"]
    ops: ["*"]   # signatures, public keys and rsa_decrypt (TLS 1.2 RSA key exchange)
  - name: l7-ec-only
    keys: [p256, p384]
`, ks.addr, ks.metrics, dir, p.serverCert, p.serverKey, p.clientCAF, tok.Module, tok.Label, pinFile)
	if err := os.WriteFile(ks.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		cmd := exec.Command(ks.bin, "import", "-config", ks.cfgPath, "-label", k.name, "-key", k.pem)
		cmd.Env = append(os.Environ(), tok.Env()...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("keyserverd import %s: %v\n%s", k.name, err, stderr.String())
		}
		if !strings.HasPrefix(string(out), k.id.String()) {
			t.Fatalf("keyserverd import %s printed %q, want the key ID %s first", k.name, out, k.id)
		}
	}
	ks.start()
	t.Cleanup(ks.stop)
	return ks
}

// opsOK sums tiergate_keyserver_ops_total{result="ok"} over every op but ping.
func (ks *keyserverProc) opsOK() float64 {
	return scrape("http://"+ks.metrics+"/metrics", "tiergate_keyserver_ops_total", `result="ok"`, `!op="ping"`)
}
