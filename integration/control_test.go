package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/testkit/cluster"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// The site the control-plane tests configure: listener "web", its routing to pool
// "app" (the test's echo backend) for www.example.test, and certificate "www"
// bound to it.
const controlSite = "www.example.test"

// controlCluster is a cluster under test with the tgctl binary and the files it is
// given.
type controlCluster struct {
	*cluster.Cluster
	t       *testing.T
	tgctl   string
	dir     string
	backend *echoBackend
}

// startControlCluster starts controld (embedded store, or an external etcd) and two
// keyserverd, all as processes.
func startControlCluster(t *testing.T, external bool) *controlCluster {
	t.Helper()
	requireSoftHSM(t)
	etcdBin := ""
	if external {
		// make deps installs etcd-server; without it only this test is skipped.
		etcdBin = testenv.RequireCommand(t, "etcd", "etcd-server")
	}
	bin := binaries(t)
	// A short directory: the embedded etcd's unix socket must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "tg-ctl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("TIERGATE_KEEP") != "" {
			t.Logf("TIERGATE_KEEP: the cluster's files are in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// On the embedded etcd the l7d nodes reach it by controld's -etcd-listen URL,
	// the keyservers and l4d by its unix socket.
	c, err := cluster.Start(ctx, cluster.Options{Bin: bin, Dir: dir, ExternalEtcd: external, EtcdBin: etcdBin, EtcdListen: !external})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return &controlCluster{Cluster: c, t: t, tgctl: filepath.Join(bin, "tgctl"), dir: t.TempDir(), backend: newEchoBackend(t)}
}

// tgResult is a run of tgctl.
type tgResult struct {
	code           int
	stdout, stderr string
}

func (r tgResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// tg runs the tgctl binary against the cluster's controld with token.
func (c *controlCluster) tg(token string, args ...string) tgResult {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.tgctl, args...)
	cmd.Env = append(os.Environ(), "TIERGATE_API="+c.API, "TIERGATE_TOKEN="+token, "HOME="+c.dir, "XDG_CONFIG_HOME="+c.dir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := tgResult{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("tgctl %v: %v", args, err)
	}
	return r
}

// admin runs tgctl with the admin token and fails the test unless it exits want.
func (c *controlCluster) admin(want int, args ...string) tgResult {
	c.t.Helper()
	r := c.tg(c.Token, args...)
	if r.code != want {
		c.t.Fatalf("tgctl %s: want exit %d, got %v", strings.Join(args, " "), want, r)
	}
	return r
}

// file writes a file in the test's directory and returns its path.
func (c *controlCluster) file(name string, data []byte) string {
	c.t.Helper()
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// site returns a fresh P-256 site certificate for controlSite signed by the site
// CA, valid from notBefore to notAfter (zero: now), written as name.pem and
// name.key.
func (c *controlCluster) site(name string, notBefore, notAfter time.Time) (*cluster.SiteCert, string, string) {
	c.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		c.t.Fatal(err)
	}
	s, err := c.IssueSite(key, notBefore, notAfter, controlSite)
	if err != nil {
		c.t.Fatal(err)
	}
	return s, c.file(name+".pem", s.ChainPEM), c.file(name+".key", s.KeyPEM)
}

// upload runs tgctl cert upload of www and wants it to succeed, every keyserver
// verified.
func (c *controlCluster) upload(certFile, keyFile string) {
	c.t.Helper()
	r := c.admin(0, "cert", "upload", "--name", "www", "--cert", certFile, "--key", keyFile, "-o", "json")
	var ans struct {
		Keyservers []struct {
			Address  string `json:"address"`
			Verified bool   `json:"verified"`
		} `json:"keyservers"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &ans); err != nil {
		c.t.Fatalf("cert upload -o json: %v\n%s", err, r)
	}
	verified := 0
	for _, k := range ans.Keyservers {
		if k.Verified {
			verified++
		}
	}
	if verified != len(c.Keyservers) {
		c.t.Fatalf("cert upload: %d keyservers verified, want %d\n%s", verified, len(c.Keyservers), r)
	}
}

// siteObjects is the apply file of the site: listener web, its routing, pool app
// and the binding of certificate www, with extra appended to the pool's members.
func (c *controlCluster) siteObjects(listenerExtra string) string {
	return fmt.Sprintf(`kind: listeners
name: web
addr: "198.18.0.10:443"
%s---
kind: routing
name: web
vhosts:
  - names: [%q]
    routes:
      - name: app
        action: {pool: app}
---
kind: pools
name: app
members: [{addr: %q}]
---
kind: cert-bindings
name: www
certificates: [www]
listeners: [web]
`, listenerExtra, controlSite, c.backend.addr)
}

// versions returns the number of stored versions of certificate www.
func (c *controlCluster) versions() int {
	c.t.Helper()
	var ans struct {
		Versions []json.RawMessage `json:"versions"`
	}
	if err := c.Call(context.Background(), "GET", "/v1/certificates/www/versions", nil, &ans); err != nil {
		c.t.Fatal(err)
	}
	return len(ans.Versions)
}

// waitServed waits for both l7d to serve s to new handshakes.
func (c *controlCluster) waitServed(s *cluster.SiteCert) time.Duration {
	c.t.Helper()
	took, err := c.WaitServed(context.Background(), controlSite, s.Serial(), 10*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	return took
}

// opensslSerial returns the serial of the leaf openssl s_client is served by addr
// for controlSite, checking it against the site CA.
func (c *controlCluster) opensslSerial(addr string) *big.Int {
	c.t.Helper()
	openssl := testenv.RequireCommand(c.t, "openssl", "openssl")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", addr, "-servername", controlSite,
		"-CAfile", c.SiteCAFile, "-verify_return_error", "-verify_hostname", controlSite)
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("openssl s_client -connect %s: %v\n%s", addr, err, out)
	}
	block, _ := pem.Decode(out[bytes.Index(out, []byte("-----BEGIN CERTIFICATE-----")):])
	if block == nil {
		c.t.Fatalf("openssl s_client printed no certificate:\n%s", out)
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		c.t.Fatal(err)
	}
	return leaf.SerialNumber
}

// checkServed checks, with openssl s_client, that both l7d serve s.
func (c *controlCluster) checkServed(s *cluster.SiteCert) {
	c.t.Helper()
	for _, l := range c.L7 {
		if got := c.opensslSerial(l.Listen); got.Cmp(s.Serial()) != 0 {
			c.t.Errorf("openssl s_client against %s: serial %x, want %x", l.Name, got, s.Serial())
		}
	}
}

// curl GETs path through node l over HTTP/2 and returns the backend's view of it.
func (c *controlCluster) curl(l *cluster.L7, path string) (echo, error) {
	c.t.Helper()
	curl := testenv.RequireCommand(c.t, "curl", "curl")
	port := l.Listen[strings.LastIndexByte(l.Listen, ':')+1:]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, curl, "-sS", "--fail", "--cacert", c.SiteCAFile, "--resolve", controlSite+":"+port+":127.0.0.1",
		"https://"+controlSite+":"+port+path).CombinedOutput()
	var e echo
	if err != nil {
		return e, fmt.Errorf("curl through %s: %v\n%s", l.Name, err, out)
	}
	if err := json.Unmarshal(out, &e); err != nil {
		return e, fmt.Errorf("curl through %s: %v\n%s", l.Name, err, out)
	}
	return e, nil
}

// checkRequests sends a request through each l7d with curl and, with h3, one over
// HTTP/3 with quic-go's client, whose QUIC handshake must be served s; each must
// reach the backend.
func (c *controlCluster) checkRequests(what string, h3 bool, s *cluster.SiteCert) {
	c.t.Helper()
	for _, l := range c.L7 {
		if !l.Running() {
			continue
		}
		e, err := c.curl(l, "/via-"+l.Node)
		if err != nil {
			c.t.Fatalf("%s: %v\n%s", what, err, l.LogTail(30))
		}
		if e.Path != "/via-"+l.Node || e.XForwardedProto != "https" {
			c.t.Errorf("%s: curl through %s: the backend saw %+v", what, l.Name, e)
		}
		if !h3 {
			continue
		}
		tr := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: c.SiteCA.Pool(), ServerName: controlSite}}
		req, _ := http.NewRequest("GET", "https://"+l.Listen+"/h3-"+l.Node, nil)
		req.Host = controlSite
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := tr.RoundTrip(req.WithContext(ctx))
		if err != nil {
			cancel()
			tr.Close()
			c.t.Fatalf("%s: HTTP/3 through %s: %v\n%s", what, l.Name, err, l.LogTail(30))
		}
		var he echo
		json.NewDecoder(resp.Body).Decode(&he)
		resp.Body.Close()
		cancel()
		tr.Close()
		if resp.ProtoMajor != 3 || resp.StatusCode != 200 || he.Path != "/h3-"+l.Node {
			c.t.Errorf("%s: HTTP/3 through %s: %s %d, the backend saw %+v", what, l.Name, resp.Proto, resp.StatusCode, he)
		}
		if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 || resp.TLS.PeerCertificates[0].SerialNumber.Cmp(s.Serial()) != 0 {
			c.t.Errorf("%s: HTTP/3 through %s: the QUIC handshake was not served serial %x", what, l.Name, s.Serial())
		}
	}
}

// nodeRow is a row of tgctl nodes -o json.
type nodeRow struct {
	Node            string `json:"node"`
	Role            string `json:"role"`
	Address         string `json:"address"`
	AppliedRevision int64  `json:"applied_revision"`
	State           string `json:"state"`
	Error           string `json:"error"`
	Certificates    []struct {
		Name    string `json:"name"`
		Version int    `json:"version"`
		SHA256  string `json:"sha256"`
	} `json:"certificates"`
}

// nodes runs tgctl nodes -o json and returns the rows by node.
func (c *controlCluster) nodes() map[string]nodeRow {
	c.t.Helper()
	r := c.admin(0, "nodes", "-o", "json")
	var ans struct {
		Nodes []nodeRow `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &ans); err != nil {
		c.t.Fatalf("tgctl nodes -o json: %v\n%s", err, r)
	}
	out := map[string]nodeRow{}
	for _, n := range ans.Nodes {
		out[n.Node] = n
	}
	return out
}

// waitNodes polls tgctl nodes until ok holds, at most 30s (a lease is 10s, and
// renewed when the store restarts).
func (c *controlCluster) waitNodes(what string, ok func(map[string]nodeRow) bool) map[string]nodeRow {
	c.t.Helper()
	var n map[string]nodeRow
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if n = c.nodes(); ok(n) {
			return n
		}
	}
	c.t.Fatalf("tgctl nodes: still not %s after 30s: %+v", what, n)
	return nil
}

// checkKeyNowhere looks for the private key of each site certificate (its PEM
// body, its PKCS #8 DER and its private scalar) in every file of the store's data,
// of controld, of the l7d nodes and of the keyservers but their tokens: it belongs
// in the tokens only.
func (c *controlCluster) checkKeyNowhere(sites ...*cluster.SiteCert) {
	c.t.Helper()
	type needle struct {
		what string
		b    []byte
	}
	var needles []needle
	for i, s := range sites {
		block, _ := pem.Decode(s.KeyPEM)
		b64 := base64.StdEncoding.EncodeToString(block.Bytes)
		// The secret itself: an ECDSA key's scalar, an RSA key's first prime.
		var secret []byte
		switch k := s.Key.(type) {
		case *ecdsa.PrivateKey:
			var err error
			if secret, err = k.Bytes(); err != nil {
				c.t.Fatal(err)
			}
		case *rsa.PrivateKey:
			secret = k.Primes[0].Bytes()
		default:
			c.t.Fatalf("key %d: a %T", i, s.Key)
		}
		needles = append(needles,
			// The PEM's second line: the first is the same for every key of a type.
			needle{fmt.Sprintf("key %d PEM", i), []byte(b64[64:112])},
			needle{fmt.Sprintf("key %d PKCS #8 DER", i), block.Bytes},
			needle{fmt.Sprintf("key %d secret", i), secret},
			needle{fmt.Sprintf("key %d secret, hex", i), []byte(hex.EncodeToString(secret))},
			needle{fmt.Sprintf("key %d secret, base64", i), []byte(base64.StdEncoding.EncodeToString(secret)[:40])})
	}
	roots := []string{c.StoreDir, c.Controld.Dir}
	for _, l := range c.L7 {
		roots = append(roots, l.Dir)
	}
	for _, ks := range c.Keyservers {
		roots = append(roots, ks.Dir)
	}
	files := 0
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			for _, ks := range c.Keyservers {
				if path == ks.Token.Dir {
					return filepath.SkipDir
				}
			}
			if d.IsDir() || !d.Type().IsRegular() {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files++
			for _, n := range needles {
				if bytes.Contains(data, n.b) {
					c.t.Errorf("the private key (%s) is in %s", n.what, path)
				}
			}
			return nil
		})
		if err != nil {
			c.t.Fatal(err)
		}
	}
	var cached int
	for _, l := range c.L7 {
		if _, err := os.Stat(l.CacheFile); err == nil {
			cached++
		}
	}
	if cached != len(c.L7) || files < 10 {
		c.t.Errorf("looked for the key in %d files, %d of %d l7d cache files among them", files, cached, len(c.L7))
	}
}

// getOn sends GET / for controlSite over HTTP/1.1 on conn and returns the status.
func getOn(t *testing.T, conn *tls.Conn) int {
	t.Helper()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET /old HTTP/1.1\r\nHost: "+controlSite+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// checkKeyInTokens asks each running keyserver's admin endpoint (GET /status)
// for the keys it offers: the key of each site certificate must be among them,
// in its PKCS #11 token.
func (c *controlCluster) checkKeyInTokens(sites ...*cluster.SiteCert) {
	c.t.Helper()
	for _, ks := range c.Keyservers {
		if !ks.Running() {
			continue
		}
		tok, err := os.ReadFile(filepath.Join(ks.Dir, "state", "admin.token"))
		if err != nil {
			c.t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://"+ks.Admin+"/status", nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			c.t.Fatal(err)
		}
		var st struct {
			Keys []struct {
				ID string `json:"id"`
			} `json:"keys"`
			Backends []string `json:"backends"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			c.t.Fatalf("%s GET /status: %d %v", ks.Name, resp.StatusCode, err)
		}
		for i, s := range sites {
			id, err := backend.KeyIDOf(s.Key.Public())
			if err != nil {
				c.t.Fatal(err)
			}
			found := false
			for _, k := range st.Keys {
				found = found || k.ID == id.String()
			}
			if !found {
				c.t.Errorf("%s (backends %v) does not offer key %d (%s)", ks.Name, st.Backends, i, id)
			}
		}
	}
}

// leafSHA256 is the hex SHA-256 of s's leaf, as nodes report their certificates.
func leafSHA256(s *cluster.SiteCert) string {
	sum := sha256.Sum256(s.Leaf.Raw)
	return hex.EncodeToString(sum[:])
}

// startSite uploads version 1 of www, applies the site's objects with tgctl and
// starts two l7d, which must serve it (crypto/tls and openssl s_client), with
// requests reaching the backend over HTTP/2 and HTTP/3.
func (c *controlCluster) startSite() *cluster.SiteCert {
	c.t.Helper()
	v1, v1Cert, v1Key := c.site("v1", time.Time{}, time.Time{})
	c.upload(v1Cert, v1Key)
	r := c.admin(0, "apply", "-f", c.file("web.yaml", []byte(c.siteObjects(""))))
	if !strings.Contains(r.stdout, "routing/web created") || !strings.Contains(r.stdout, "applied at revision") {
		c.t.Errorf("tgctl apply: %s", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, node := range []string{"l7-a", "l7-b"} {
		if _, err := c.AddL7(ctx, node); err != nil {
			c.t.Fatal(err)
		}
	}
	c.waitServed(v1)
	c.checkServed(v1)
	c.checkRequests("applied with tgctl", true, v1)
	return v1
}

// TestControlPlaneEmbedded runs the cluster on controld's embedded etcd: every
// write through the tgctl binary, the nodes (two l7d, two keyserverd, and an l4d
// where DPDK runs) fed and listed by controld only.
func TestControlPlaneEmbedded(t *testing.T) {
	start := time.Now()
	c := startControlCluster(t, false)
	t.Logf("controld and two keyserverd started in %v", time.Since(start).Round(time.Millisecond))
	v1 := c.startSite()

	// An l4d too where DPDK runs: fed the L4 objects applied with tgctl.
	l4 := c.startL4()

	// A new version: both l7d serve it to new handshakes (over TCP and QUIC); a
	// connection made before goes on with version 1.
	old, err := tls.Dial("tcp", c.L7[0].Listen, &tls.Config{RootCAs: c.SiteCA.Pool(), ServerName: controlSite, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	v2, v2Cert, v2Key := c.site("v2", time.Time{}, time.Time{})
	upAt := time.Now()
	c.upload(v2Cert, v2Key)
	took := c.waitServed(v2)
	t.Logf("version 2 served by both l7d %v after tgctl cert upload returned (%v with the upload)", took.Round(time.Millisecond), time.Since(upAt).Round(time.Millisecond))
	c.checkServed(v2)
	c.checkRequests("version 2", true, v2)
	if code := getOn(t, old); code != 200 || old.ConnectionState().PeerCertificates[0].SerialNumber.Cmp(v1.Serial()) != 0 {
		t.Errorf("the connection made before version 2: %d, want 200 on version 1's handshake", code)
	}

	// A rollback to version 1 is served, then version 2 again.
	c.admin(0, "cert", "rollback", "www", "1")
	c.waitServed(v1)
	c.admin(0, "cert", "rollback", "www", "2")
	c.waitServed(v2)

	// tgctl nodes: the l7d with their certificate, the keyservers, all applied.
	want := leafSHA256(v2)
	nodes := c.waitNodes("reporting version 2 on both l7d", func(n map[string]nodeRow) bool {
		for _, l := range c.L7 {
			if r := n[l.Node]; len(r.Certificates) != 1 || r.Certificates[0].SHA256 != want {
				return false
			}
		}
		return true
	})
	for _, l := range c.L7 {
		r := nodes[l.Node]
		if r.Role != "l7d" || r.Address != l.Admin || r.State != "ok" || r.AppliedRevision == 0 || r.Certificates[0].Version != 2 {
			t.Errorf("tgctl nodes: %s is %+v, want role l7d, address %s, state ok, an applied revision, www version 2", l.Node, r, l.Admin)
		}
	}
	for _, ks := range c.Keyservers {
		if r := nodes[ks.Node]; r.Role != "keyserverd" || r.Address != ks.Addr || r.State != "ok" {
			t.Errorf("tgctl nodes: %s is %+v, want role keyserverd at %s, state ok", ks.Node, r, ks.Addr)
		}
	}
	if l4 != nil {
		if r := nodes[l4.Node]; r.Role != "l4d" || r.Address != l4.Admin || r.State != "ok" || r.AppliedRevision == 0 {
			t.Errorf("tgctl nodes: %s is %+v, want role l4d at %s, state ok", l4.Node, r, l4.Admin)
		}
	}
	if table := c.admin(0, "nodes").stdout; !strings.Contains(table, "l7-a") || !strings.Contains(table, "ks-2") || !strings.Contains(table, want[:12]) {
		t.Errorf("tgctl nodes (table) lacks a node or the certificate's fingerprint:\n%s", table)
	}

	// Refused uploads, each naming its field, storing nothing.
	other, err := testpki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	badChain, err := cluster.IssueWith(c.SiteCA, other, k, time.Time{}, time.Time{}, controlSite)
	if err != nil {
		t.Fatal(err)
	}
	_, v3Cert, _ := c.site("v3", time.Time{}, time.Time{})
	_, expiredCert, expiredKey := c.site("expired", time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
	for _, tc := range []struct{ name, cert, key, code, field string }{
		{"bad chain", c.file("bad-chain.pem", badChain.ChainPEM), c.file("bad-chain.key", badChain.KeyPEM), "bad_chain", "chain[1]"},
		{"mismatched key", v3Cert, filepath.Join(c.dir, "v2.key"), "key_mismatch", "key"},
		{"expired", expiredCert, expiredKey, "expired", "chain[0]"},
	} {
		r := c.tg(c.Token, "cert", "upload", "--name", "www", "--cert", tc.cert, "--key", tc.key)
		if r.code != 4 || !strings.Contains(r.stderr, tc.code) || !strings.Contains(r.stderr, tc.field) {
			t.Errorf("%s: want exit 4, %s naming %s, got %v", tc.name, tc.code, tc.field, r)
		}
	}
	if n := c.versions(); n != 2 {
		t.Errorf("%d versions of www stored after the refused uploads, want 2", n)
	}

	// A conflicting write: 412, exit 3.
	spare := fmt.Sprintf("kind: pools\nname: spare\nmembers: [{addr: %q}]\n", c.backend.addr)
	c.admin(0, "apply", "-f", c.file("spare.yaml", []byte(spare)))
	stale := c.objectRevision("pools", "spare")
	c.admin(0, "apply", "-f", c.file("spare2.yaml", []byte(spare+"balance: least_request\n")))
	if r := c.tg(c.Token, "delete", "pools", "spare", "--if-match", fmt.Sprint(stale)); r.code != 3 || !strings.Contains(r.stderr+r.stdout, "conflict") {
		t.Errorf("delete with a stale revision: want exit 3 (412 conflict), got %v", r)
	}

	// A change set with a dangling pool is refused whole: neither the new pool nor
	// the routing change is stored.
	dangling := fmt.Sprintf(`kind: pools
name: extra
members: [{addr: %q}]
---
kind: routing
name: web
vhosts:
  - names: [%q]
    routes:
      - name: app
        action: {pool: missing}
`, c.backend.addr, controlSite)
	if r := c.tg(c.Token, "apply", "-f", c.file("dangling.yaml", []byte(dangling))); r.code != 4 || !strings.Contains(r.stderr, "routing/web") || !strings.Contains(r.stderr, "missing") {
		t.Errorf("apply with a dangling pool: want exit 4 naming routing/web's pool, got %v", r)
	}
	if r := c.tg(c.Token, "get", "pools", "extra"); r.code != 5 {
		t.Errorf("the refused change set's pool was stored: get pools extra: %v", r)
	}

	// A token of the wrong role is refused: exit 6.
	r := c.admin(0, "token", "create", "certs-only", "--role", "cert-operator")
	certOp := strings.TrimSpace(r.stdout)
	if r := c.tg(certOp, "apply", "-f", c.file("spare3.yaml", []byte(spare))); r.code != 6 {
		t.Errorf("a cert-operator applying a pool: want exit 6, got %v", r)
	}
	r = c.admin(0, "token", "create", "watcher", "--role", "viewer")
	viewer := strings.TrimSpace(r.stdout)
	if r := c.tg(viewer, "cert", "upload", "--name", "www", "--cert", v2Cert, "--key", v2Key); r.code != 6 {
		t.Errorf("a viewer uploading a certificate: want exit 6, got %v", r)
	}
	if r := c.tg(viewer, "nodes"); r.code != 0 {
		t.Errorf("a viewer listing nodes: %v", r)
	}

	// The history says who wrote the newest revision, and what.
	var revs struct {
		Revisions []struct {
			Revision int64  `json:"revision"`
			Who      string `json:"who"`
			Changes  []struct {
				Op, Kind, Name string
			} `json:"changes"`
		} `json:"revisions"`
	}
	r = c.admin(0, "revisions", "--limit", "1", "-o", "json")
	if err := json.Unmarshal([]byte(r.stdout), &revs); err != nil || len(revs.Revisions) != 1 {
		t.Fatalf("revisions -o json: %v\n%s", err, r)
	}
	before := revs.Revisions[0]
	adminName, _, _ := strings.Cut(c.Token, ".")
	if before.Who != adminName || len(before.Changes) == 0 || before.Changes[0].Kind != "pools" || before.Changes[0].Name != "spare" {
		t.Errorf("the newest revision is %+v, want the admin token's (%s) write of pools/spare", before, adminName)
	}

	// A snapshot the nodes refuse (a listener change that takes a restart): each
	// l7d reports why, the rollout says refused, and the old one keeps serving.
	r = c.admin(0, "apply", "-f", c.file("restart.yaml", []byte(c.siteObjects("max_conns: 7\n"))), "-o", "json")
	var applied struct {
		Revision int64 `json:"revision"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &applied); err != nil || applied.Revision == 0 {
		t.Fatalf("apply -o json: %v\n%s", err, r)
	}
	rev := fmt.Sprint(applied.Revision)
	var rollout struct {
		Nodes []struct {
			Node, State, Error string
		} `json:"nodes"`
		Refused int `json:"refused"`
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		// Exit 1 when a node refused the revision.
		r = c.tg(c.Token, "rollout", "status", rev, "-o", "json")
		if err := json.Unmarshal([]byte(r.stdout), &rollout); err != nil {
			t.Fatalf("rollout status -o json: %v\n%s", err, r)
		}
		if rollout.Refused == 2 || time.Now().After(deadline) {
			break
		}
	}
	if r.code != 1 {
		t.Errorf("rollout status %s of a refused revision: want exit 1, got %v", rev, r)
	}
	if rollout.Refused != 2 {
		t.Errorf("rollout status %s: %d refused, want both l7d:\n%s", rev, rollout.Refused, r.stdout)
	}
	for _, n := range rollout.Nodes {
		if strings.HasPrefix(n.Node, "l7-") && (n.State != "refused" || !strings.Contains(n.Error, "max_conns") || !strings.Contains(n.Error, "restart")) {
			t.Errorf("rollout status: %s is %s with %q, want refused saying max_conns takes a restart", n.Node, n.State, n.Error)
		}
	}
	nodes = c.nodes()
	for _, l := range c.L7 {
		if n := nodes[l.Node]; n.State != "refused" {
			t.Errorf("tgctl nodes: %s is %q after the refused snapshot, want refused", l.Node, n.State)
		}
	}
	c.checkServed(v2)
	c.checkRequests("after the refused snapshot", false, v2)
	// tgctl diff sees the listener's change; a rollback to the revision before it
	// is applied by both l7d, after which the file no longer differs.
	web := filepath.Join(c.dir, "web.yaml")
	if r := c.tg(c.Token, "diff", "-f", web); r.code != 1 || !strings.Contains(r.stdout, "max_conns") {
		t.Errorf("diff -f web.yaml with the listener changed: want exit 1 showing max_conns, got %v", r)
	}
	c.admin(0, "rollback", fmt.Sprint(before.Revision))
	c.waitNodes("applying again", func(n map[string]nodeRow) bool {
		return n["l7-a"].State == "ok" && n["l7-b"].State == "ok"
	})
	if r := c.tg(c.Token, "diff", "-f", web); r.code != 0 {
		t.Errorf("diff -f web.yaml after the rollback: want exit 0, got %v", r)
	}

	// A keyserver that hangs during an upload (frozen with SIGSTOP) is named once
	// controld's time for it (3s) is up; nothing is stored.
	ks1 := c.Keyservers[0]
	if err := ks1.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	_, v4Cert, v4Key := c.site("v4", time.Time{}, time.Time{})
	frozen := time.Now()
	r = c.tg(c.Token, "cert", "upload", "--name", "www", "--cert", v4Cert, "--key", v4Key)
	hung := time.Since(frozen)
	if err := ks1.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if r.code == 0 || !strings.Contains(r.stderr, ks1.Addr) || !strings.Contains(r.stderr, "keyserver_failed") {
		t.Errorf("upload with %s frozen: want keyserver_failed naming %s, got %v", ks1.Node, ks1.Addr, r)
	}
	t.Logf("upload with %s frozen refused after %v", ks1.Node, hung.Round(time.Millisecond))
	if n := c.versions(); n != 2 {
		t.Errorf("%d versions of www stored after the upload to a frozen keyserver, want 2", n)
	}

	// A keyserver down during an upload (killed, as a crash): nothing stored, the
	// error names it.
	ks2 := c.Keyservers[1]
	ks2.Kill()
	killed := time.Now()
	r = c.tg(c.Token, "cert", "upload", "--name", "www", "--cert", v4Cert, "--key", v4Key)
	if r.code == 0 || !strings.Contains(r.stderr, ks2.Addr) {
		t.Errorf("upload with %s stopped: want a failure naming %s, got %v", ks2.Node, ks2.Addr, r)
	}
	if n := c.versions(); n != 2 {
		t.Errorf("%d versions of www stored after the failed upload, want 2", n)
	}
	c.waitServed(v2)

	// The key of every upload (and of the refused ones) is in no file but the tokens.
	c.checkKeyNowhere(v1, v2)
	c.checkKeyInTokens(v1, v2)

	// controld and its embedded etcd stopped: both l7d keep serving; an l7d
	// restarted with the store still down serves its cached snapshot.
	c.storeOutage(v2)

	// The killed keyserver shows as lost once its lease ran out.
	c.waitNodes(ks2.Node+" lost", func(n map[string]nodeRow) bool { return n[ks2.Node].State == "lost" })
	t.Logf("%s killed: listed as lost %v later", ks2.Node, time.Since(killed).Round(100*time.Millisecond))
	t.Logf("the whole test took %v", time.Since(start).Round(time.Millisecond))
}

// startL4 starts l4d node l4-a on DPDK null devices and applies an L4 rule and pool
// with tgctl, which it must apply; nil without root or libdpdk (the l4d binary is
// built without DPDK then).
func (c *controlCluster) startL4() *cluster.L4 {
	c.t.Helper()
	if os.Geteuid() != 0 || exec.Command("pkg-config", "--exists", "libdpdk").Run() != nil {
		if testenv.Strict() {
			c.t.Fatal("TIERGATE_REQUIRE_ALL=1 and the l4d node needs root and libdpdk (Debian package libdpdk-dev)")
		}
		c.t.Log("no l4d node: it needs root and libdpdk (Debian package libdpdk-dev)")
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l4, err := c.AddL4(ctx, "l4-a")
	if err != nil {
		c.t.Fatal(err)
	}
	r := c.admin(0, "apply", "-o", "json", "-f", c.file("l4.yaml", []byte(`kind: l4-pools
name: l7
members: [{name: a, address: 198.18.1.11}, {name: b, address: 198.18.1.12}]
health: {type: none}
---
kind: l4-rules
name: https
vip: 198.18.0.10
protocol: tcp
port: 443
pool: l7
`)))
	var applied struct {
		Revision int64 `json:"revision"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &applied); err != nil || applied.Revision == 0 {
		c.t.Fatalf("apply -o json: %v\n%s", err, r)
	}
	c.waitNodes("l4-a applying the L4 objects", func(n map[string]nodeRow) bool {
		return n["l4-a"].State == "ok" && n["l4-a"].AppliedRevision >= applied.Revision
	})
	return l4
}

// objectRevision reads an object's revision (its ETag) through the API.
func (c *controlCluster) objectRevision(kind, name string) int64 {
	c.t.Helper()
	req, _ := http.NewRequest("GET", c.API+"/v1/"+kind+"/"+name, nil)
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body.Close()
	var rev int64
	fmt.Sscanf(strings.Trim(resp.Header.Get("ETag"), `"`), "%d", &rev)
	if rev == 0 {
		c.t.Fatalf("GET /v1/%s/%s: no revision in ETag %q", kind, name, resp.Header.Get("ETag"))
	}
	return rev
}

// storeOutage stops controld (and the external etcd, if any): both l7d go on
// serving s; then l7-a restarted with the store still down serves it from its
// cache file. Then the store comes back and both l7d report to it again.
func (c *controlCluster) storeOutage(s *cluster.SiteCert) {
	c.t.Helper()
	if err := c.Controld.Stop(); err != nil {
		c.t.Fatal(err)
	}
	if err := c.Etcd.Stop(); err != nil {
		c.t.Fatal(err)
	}
	if r := c.tg(c.Token, "nodes"); r.code != 7 {
		c.t.Errorf("tgctl nodes with controld stopped: want exit 7 (unreachable), got %v", r)
	}
	time.Sleep(500 * time.Millisecond)
	c.checkServed(s)
	c.checkRequests("with the store stopped", false, s)
	l := c.L7[0]
	if err := l.Stop(); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Start(ctx); err != nil {
		c.t.Fatalf("l7d restarted with the store down: %v", err)
	}
	if _, err := c.WaitServed(ctx, controlSite, s.Serial(), 5*time.Second, l); err != nil {
		c.t.Fatalf("restarted with the store down: %v\n%s", err, l.LogTail(30))
	}
	c.checkServed(s)
	c.checkRequests("l7-a restarted with the store down", true, s)
	if !strings.Contains(l.LogTail(200), "cached snapshot") {
		c.t.Errorf("%s's log does not say it applied its cached snapshot:\n%s", l.Name, l.LogTail(40))
	}

	// The store back: every l7d reports to it again.
	if c.Etcd != nil {
		if err := c.Etcd.Start(ctx); err != nil {
			c.t.Fatal(err)
		}
	}
	if err := c.Controld.Start(ctx); err != nil {
		c.t.Fatal(err)
	}
	if err := c.WaitNodes(ctx, 20*time.Second, "l7-a", "l7-b"); err != nil {
		c.t.Errorf("after the outage: %v", err)
	}
}

// TestControlPlaneExternalEtcd runs the cluster on an external etcd (Debian's
// etcd-server) that controld and every node reach: an upload served by both l7d
// with its key nowhere but the tokens, the routing applied with tgctl serving, an
// RSA certificate beside the ECDSA one of the same binding, and controld and etcd
// stopped while the l7d keep serving.
func TestControlPlaneExternalEtcd(t *testing.T) {
	start := time.Now()
	c := startControlCluster(t, true)
	v1 := c.startSite()
	v2, v2Cert, v2Key := c.site("v2", time.Time{}, time.Time{})
	c.upload(v2Cert, v2Key)
	took := c.waitServed(v2)
	t.Logf("version 2 served by both l7d %v after tgctl cert upload returned", took.Round(time.Millisecond))
	c.checkServed(v2)
	nodes := c.waitNodes("listing every node applied", func(n map[string]nodeRow) bool {
		for _, name := range []string{"l7-a", "l7-b", "ks-1", "ks-2"} {
			if n[name].State != "ok" {
				return false
			}
		}
		return len(n["l7-a"].Certificates) == 1 && n["l7-a"].Certificates[0].SHA256 == leafSHA256(v2)
	})
	if nodes["l7-b"].Role != "l7d" || nodes["ks-1"].Role != "keyserverd" {
		t.Errorf("tgctl nodes: %+v", nodes)
	}

	// An RSA certificate of the same name beside the ECDSA one, in the same
	// binding: each l7d serves a client the one it supports.
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaSite, err := c.IssueSite(rsaKey, time.Time{}, time.Time{}, controlSite)
	if err != nil {
		t.Fatal(err)
	}
	c.admin(0, "cert", "upload", "--name", "www-rsa", "--cert", c.file("rsa.pem", rsaSite.ChainPEM), "--key", c.file("rsa.key", rsaSite.KeyPEM))
	both := strings.Replace(c.siteObjects(""), "certificates: [www]", "certificates: [www, www-rsa]", 1)
	c.admin(0, "apply", "-f", c.file("both.yaml", []byte(both)))
	suites := map[string]uint16{"ecdsa": tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, "rsa": tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}
	want := map[string]*big.Int{"ecdsa": v2.Serial(), "rsa": rsaSite.Serial()}
	for _, l := range c.L7 {
		for _, kt := range []string{"rsa", "ecdsa"} {
			var got *big.Int
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				conn, err := tls.Dial("tcp", l.Listen, &tls.Config{RootCAs: c.SiteCA.Pool(), ServerName: controlSite,
					MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suites[kt]}})
				if err == nil {
					got = conn.ConnectionState().PeerCertificates[0].SerialNumber
					conn.Close()
					if got.Cmp(want[kt]) == 0 {
						break
					}
				}
			}
			if got == nil || got.Cmp(want[kt]) != 0 {
				t.Errorf("%s: a TLS 1.2 client of %s suites only was served serial %x, want %x", l.Name, kt, got, want[kt])
			}
		}
	}

	c.checkKeyNowhere(v1, v2, rsaSite)
	c.checkKeyInTokens(v1, v2, rsaSite)
	c.storeOutage(v2)
	t.Logf("the whole test took %v", time.Since(start).Round(time.Millisecond))
}
