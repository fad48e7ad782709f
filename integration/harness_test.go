// Package integration holds end-to-end tests that start real Tiergate processes (and,
// later, network namespaces). The benchmark programs live in bench/.
package integration

import (
	"bufio"
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
	if binDir != "" {
		os.RemoveAll(binDir)
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
	var err error
	if p.serverCA, err = testpki.NewCA("keyserver CA"); err != nil {
		t.Fatal(err)
	}
	if p.clientCA, err = testpki.NewCA("L7 client CA"); err != nil {
		t.Fatal(err)
	}
	leaf, err := p.serverCA.Leaf("keyserverd", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.serverCA.WriteFiles(p.dir, "server", leaf); err != nil {
		t.Fatal(err)
	}
	if p.clientCAF, err = p.clientCA.WriteFiles(p.dir, "client"); err != nil {
		t.Fatal(err)
	}
	p.serverCert = filepath.Join(p.dir, "keyserverd.pem")
	p.serverKey = filepath.Join(p.dir, "keyserverd.key")
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
// stopped gracefully or killed.
type daemon struct {
	t      *testing.T
	name   string
	args   []string
	env    []string
	health string // URL of /healthz
	log    string
	client *http.Client // for health; default http.DefaultClient
	cmd    *exec.Cmd
	done   chan error
}

func (d *daemon) start() {
	t := d.t
	t.Helper()
	logf, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	d.cmd = exec.Command(d.args[0], d.args[1:]...)
	d.cmd.Env = append(os.Environ(), d.env...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.done = make(chan error, 1)
	go func(c *exec.Cmd, done chan error) { done <- c.Wait() }(d.cmd, d.done)
	deadline := time.Now().Add(15 * time.Second)
	client := d.client
	if client == nil {
		client = http.DefaultClient
	}
	for {
		resp, err := client.Get(d.health)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case err := <-d.done:
			t.Fatalf("%s exited: %v\n%s", d.name, err, d.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy after 15s\n%s", d.name, d.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill stops the process at once, as a crash would.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Kill()
	<-d.done
	d.cmd = nil
}

// stop sends SIGTERM and waits for a graceful exit.
func (d *daemon) stop() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		if err != nil {
			d.t.Errorf("%s exited with %v after SIGTERM\n%s", d.name, err, d.logTail())
		}
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		d.t.Errorf("%s did not stop within 20s of SIGTERM", d.name)
	}
	d.cmd = nil
}

func (d *daemon) logTail() string {
	b, _ := os.ReadFile(d.log)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// scrape sums the samples of metric name at url whose line contains every filter and
// none of the exclusions (filters starting with "!").
func scrape(url, name string, filters ...string) float64 {
	return scrapeWith(http.DefaultClient, url, name, filters...)
}

// scrapeWith is scrape through client.
func scrapeWith(client *http.Client, url, name string, filters ...string) float64 {
	resp, err := client.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, f := range filters {
			if neg, found := strings.CutPrefix(f, "!"); found {
				ok = ok && !strings.Contains(line, neg)
			} else {
				ok = ok && strings.Contains(line, f)
			}
		}
		if ok {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			sum += v
		}
	}
	return sum
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
  - name: l7-ec-only
    keys: [p256, p384]
`, ks.addr, ks.metrics, p.serverCert, p.serverKey, p.clientCAF, tok.Module, tok.Label, pinFile)
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
