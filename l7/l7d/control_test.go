package l7d

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/softkey"
	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/policy/route"
	"github.com/tiergate/tiergate/testkit/daemontest"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// controlEnv is what an l7d fed by the control plane needs: an embedded store that
// serves a loopback URL, a keyserver holding the site keys, a CA for the sites'
// certificates, and an l7d file with a control section.
type controlEnv struct {
	t      *testing.T
	dir    string
	st     *store.Store
	ks     *keyserver.Server
	siteCA *testpki.CA
	key    crypto.Signer // the site key the keyserver holds
	path   string        // l7d's file
	listen string        // where the node binds listener "web" (node_listeners)
	admin  string
}

func newControlEnv(t *testing.T) *controlEnv {
	t.Helper()
	e := newControlEnvStopped(t)
	e.startKeyserver()
	return e
}

// startKeyserver starts e's keyserver.
func (e *controlEnv) startKeyserver() {
	e.t.Helper()
	if err := e.ks.Start(); err != nil {
		e.t.Fatal(err)
	}
}

// newControlEnvStopped is newControlEnv with the keyserver not started.
func newControlEnvStopped(t *testing.T) *controlEnv {
	t.Helper()
	e := &controlEnv{t: t, dir: t.TempDir(), listen: freeAddr(t), admin: freeAddr(t)}
	e.openStore()
	var err error
	if e.siteCA, err = testpki.NewCA("site CA"); err != nil {
		t.Fatal(err)
	}
	e.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	mt, err := testpki.NewMutualTLS(e.dir, "ks", "keyserver", []string{"127.0.0.1"}, "l7d")
	if err != nil {
		t.Fatal(err)
	}
	ksAddr := freeAddr(t)
	soft, err := softkey.New(softkey.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := soft.Import("www", e.key); err != nil {
		t.Fatal(err)
	}
	e.ks, err = keyserver.NewServer(keyserver.Config{
		Addr:     ksAddr,
		TLS:      &tls.Config{Certificates: []tls.Certificate{mt.ServerLeaf}, ClientCAs: mt.ClientCA.Pool()},
		Backends: []backend.Backend{soft},
		Clients:  []keyserver.ClientRule{{Name: "l7d", Keys: []string{"*"}}},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.ks.Shutdown(ctx)
	})
	var endpoint string
	for _, u := range e.st.ClientURLs() {
		if strings.HasPrefix(u, "http://") {
			endpoint = u
		}
	}
	e.path = filepath.Join(e.dir, "l7d.yaml")
	writeFile(t, e.path, fmt.Sprintf(`control:
  node: l7-a
  etcd_endpoints: [%s]
  dial_timeout: 1s
keyservers:
  servers: ["%s"]
  cert_file: %s
  key_file: %s
  ca_file: %s
node_listeners:
  web: {addr: "%s"}
state_dir: %s
admin_listen: "%s"
log_level: debug
`, endpoint, ksAddr, mt.ClientCert, mt.ClientKey, mt.ServerCAFile, e.listen, filepath.Join(e.dir, "state"), e.admin))
	return e
}

// openStore opens the embedded store in e.dir/store, serving a loopback URL (the same
// one again after a close).
func (e *controlEnv) openStore() {
	e.t.Helper()
	url := "http://127.0.0.1:0"
	if e.st != nil {
		for _, u := range e.st.ClientURLs() {
			if strings.HasPrefix(u, "http://") {
				url = u
			}
		}
	}
	st, err := store.Open(context.Background(), store.Config{Dir: filepath.Join(e.dir, "store"), ListenClientURL: url,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.st = st
	e.t.Cleanup(func() { st.Close() })
}

// cert returns version version of the certificate "www" (www.example.com), signed for
// key, and its serial.
func (e *controlEnv) cert(version int, key crypto.Signer) (*model.Certificate, *big.Int) {
	e.t.Helper()
	leaf, der, err := e.siteCA.Issue("www", key.Public(), "www.example.com")
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := model.NewCertificate("www", version, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	if err != nil {
		e.t.Fatal(err)
	}
	return c, leaf.SerialNumber
}

// put writes objects in one change set and returns its revision.
func (e *controlEnv) put(objs ...model.Object) int64 {
	e.t.Helper()
	var cs store.ChangeSet
	for _, o := range objs {
		c, err := model.Put(o, store.Any)
		if err != nil {
			e.t.Fatal(err)
		}
		cs.Changes = append(cs.Changes, c)
	}
	rev, err := e.st.Commit(context.Background(), cs)
	if err != nil {
		e.t.Fatal(err)
	}
	return rev
}

// status returns the node's status in the store, or a zero one.
func (e *controlEnv) status() agent.Status {
	e.t.Helper()
	resp, err := e.st.Client().Get(context.Background(), agent.StatusKey("l7-a"))
	if err != nil {
		e.t.Fatal(err)
	}
	var s agent.Status
	if len(resp.Kvs) == 1 {
		if err := json.Unmarshal(resp.Kvs[0].Value, &s); err != nil {
			e.t.Fatal(err)
		}
	}
	return s
}

// waitStatus waits up to 10s for the node's status to satisfy ok.
func (e *controlEnv) waitStatus(what string, ok func(agent.Status) bool) agent.Status {
	e.t.Helper()
	var s agent.Status
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if s = e.status(); ok(s) {
			return s
		}
	}
	e.t.Fatalf("the node's status is %+v, still not %s after 10s", s, what)
	return s
}

// start runs l7d from e.path until stop or the test's end.
func (e *controlEnv) start() (stop func() error, log *testenv.LockedBuffer) {
	stop, log, _ = e.startAdmin()
	return stop, log
}

// startAdmin is start, with a client of the admin endpoint.
func (e *controlEnv) startAdmin() (stop func() error, log *testenv.LockedBuffer, admin adminClient) {
	e.t.Helper()
	log = &testenv.LockedBuffer{}
	d := &Daemon{Path: e.path, Stderr: log}
	stop = daemontest.Start(e.t, daemontest.Options{Name: "l7d", Run: d.Run, Serving: d.Serving(), Log: log})
	return stop, log, adminClient{t: e.t, base: "http://" + e.admin, token: daemontest.Token(e.t, d.TokenFile())}
}

// handshake connects to the node's listener as www.example.com (verifying the site
// CA) and returns the connection and the serial of the leaf served.
func (e *controlEnv) handshake() (*tls.Conn, *big.Int, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", e.listen,
		&tls.Config{ServerName: "www.example.com", RootCAs: e.siteCA.Pool(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		return nil, nil, err
	}
	return c, c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// served returns the serial served to a new handshake, failing the test on an error.
func (e *controlEnv) served() *big.Int {
	e.t.Helper()
	c, serial, err := e.handshake()
	if err != nil {
		e.t.Fatalf("handshake: %v", err)
	}
	c.Close()
	return serial
}

// waitServed waits up to 5s for new handshakes to be served serial.
func (e *controlEnv) waitServed(serial *big.Int) time.Duration {
	e.t.Helper()
	start := time.Now()
	var got *big.Int
	for time.Since(start) < 5*time.Second {
		if got = e.served(); got.Cmp(serial) == 0 {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("serial %x served 5s after the write, want %x", got, serial)
	return 0
}

// get makes an HTTP/1.1 request on c and returns the status and body.
func get(t *testing.T, c *tls.Conn) (int, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: www.example.com\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// siteObjects are a listener "web", its routing (every request answered "hello from
// the store"), and a binding of certificate "www" to it.
func siteObjects() []model.Object {
	return []model.Object{
		&model.Listener{Listener: l7.Listener{Name: "web", Addr: "192.0.2.10:443", DisableHTTP3: true}},
		&model.RoutingPolicy{Listener: route.Listener{Name: "web", VHosts: []route.VHost{{Names: []string{"*"},
			Routes: []route.Route{{Name: "hello", Action: route.Action{Respond: &route.Respond{Status: 200, Body: "hello from the store"}}}}}}}},
		&model.CertBinding{Name: "www", Certificates: []string{"www"}, Listeners: []string{"web"}},
	}
}

// TestControlPlane: l7d with a control section serves what the store holds, a new
// certificate version for new handshakes within seconds (connections made before go
// on), refuses a snapshot it cannot apply (NACK with the error, the old
// configuration still served), and, restarted with the store down, serves its
// cached snapshot.
func TestControlPlane(t *testing.T) {
	e := newControlEnv(t)
	v1, serial1 := e.cert(1, e.key)
	rev := e.put(append(siteObjects(), v1)...)
	stop, _ := e.start()

	if got := e.served(); got.Cmp(serial1) != 0 {
		t.Fatalf("serial %x served, want %x (version 1)", got, serial1)
	}
	st := e.waitStatus(fmt.Sprintf("applied at %d", rev), func(s agent.Status) bool { return s.AppliedRevision >= rev && s.Error == "" })
	if st.Role != "l7d" {
		t.Errorf("role %q", st.Role)
	}
	old, _, err := e.handshake()
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if code, body := get(t, old); code != 200 || body != "hello from the store" {
		t.Fatalf("GET answered %d %q, want the store's routing", code, body)
	}

	// A new version: new handshakes get it within seconds, the connection made
	// before goes on.
	v2, serial2 := e.cert(2, e.key)
	e.put(v2)
	took := e.waitServed(serial2)
	t.Logf("version 2 served %v after its write", took)
	if code, _ := get(t, old); code != 200 {
		t.Fatalf("the connection made before version 2 answered %d", code)
	}
	leaf, _ := pem.Decode([]byte(v2.Chain))
	sum := sha256.Sum256(leaf.Bytes)
	want := agent.CertInUse{Name: "www", Version: 2, SHA256: hex.EncodeToString(sum[:])}
	st = e.waitStatus("reporting version 2", func(s agent.Status) bool { return len(s.Certificates) == 1 && s.Certificates[0] == want })
	if st.Address != e.admin {
		t.Errorf("address %q reported, want the admin address %q", st.Address, e.admin)
	}

	// A certificate whose key the keyservers do not hold: refused, reported, and the
	// configuration in force goes on serving.
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := e.cert(3, otherKey)
	badRev := e.put(bad)
	st = e.waitStatus("refusing the unknown key", func(s agent.Status) bool { return s.RefusedRevision == badRev })
	if !strings.Contains(st.Error, "keyservers do not serve key") || !strings.Contains(st.Error, `certificate "www" (version 3)`) {
		t.Errorf("NACK error %q does not name the certificate and the key", st.Error)
	}
	if got := e.served(); got.Cmp(serial2) != 0 {
		t.Fatalf("after a refused snapshot serial %x is served, want version 2's %x", got, serial2)
	}

	// A listener change that takes a restart is refused with an error that says so.
	e.put(v2)
	restart := siteObjects()[0].(*model.Listener)
	restart.MaxConns = 7
	restartRev := e.put(restart)
	st = e.waitStatus("refusing a listener change", func(s agent.Status) bool { return s.RefusedRevision == restartRev })
	if !strings.Contains(st.Error, "max_conns") || !strings.Contains(st.Error, "restart") {
		t.Errorf("NACK error %q does not say the listener change takes a restart", st.Error)
	}
	good := e.put(siteObjects()[0])
	e.waitStatus("applied again", func(s agent.Status) bool { return s.AppliedRevision >= good && s.Error == "" })

	// Restarted with the store down: the cached snapshot is served.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.st.Close()
	stop2, log2 := e.start()
	defer stop2()
	if got := e.served(); got.Cmp(serial2) != 0 {
		t.Fatalf("restarted with the store down: serial %x served, want the cached version 2's %x", got, serial2)
	}
	if !strings.Contains(log2.String(), "cached snapshot applied") {
		t.Errorf("the log does not say the cached snapshot was applied:\n%s", log2)
	}
}

// TestControlConfig: with a control section the file keeps the node's own settings
// and may not give what the control plane gives; node_listeners are only for it.
func TestControlConfig(t *testing.T) {
	const node = `control: {node: l7-a, etcd_endpoints: ["http://127.0.0.1:2379"]}
keyservers: {servers: ["127.0.0.1:7000"], cert_file: c, key_file: k, ca_file: ca}
state_dir: /var/lib/l7d-test
`
	for _, tc := range []struct{ name, in, err string }{
		{"node file", node + "node_listeners: {web: {addr: \"198.18.0.1:443\", quic_server_id: 7, client_ip: {proxy_protocol: true, proxy_trusted: [198.18.0.0/15]}}}\ncertificates: {ticket_key_files: [t.key]}\nblacklists: {global: {files: [g.txt]}, web: {}}\n", ""},
		{"listeners", node + "listeners: [{addr: x:1, pool: web}]\n", "listeners: given by the control plane when control is set"},
		{"routing and backends", node + "routing: {}\nbackends: {web: {members: [x:1]}}\n", "routing: given by the control plane"},
		{"backends", node + "backends: {web: {members: [x:1]}}\n", "backends: given by the control plane"},
		{"certificate files", node + "certificates: {certificates: [{cert_file: a.pem}]}\n", "certificates.certificates: given by the control plane"},
		{"certificate dir", node + "certificates: {dir: d, default: www}\n", "certificates.dir: given by the control plane"},
		{"default certificate", node + "certificates: {default: www}\n", "certificates.default: given by the control plane when control is set; remove it from the file (a cert-binding with default: true)"},
		{"no keyservers", strings.Replace(node, "keyservers:", "#", 1), "keyservers: required with control"},
		{"no node", strings.Replace(node, "node: l7-a, ", "", 1), "control.node: required"},
		{"bad node listener", node + "node_listeners: {web: {addr: nope, client_ip: {header: X-Real-IP}}}\n", "node_listeners.web.addr"},
		{"node listener client_ip", node + "node_listeners: {web: {client_ip: {header: X-Real-IP}}}\n", "node_listeners.web.client_ip.header"},
		{"node_listeners without control", minimal + "node_listeners: {web: {addr: \"x:1\"}}\n", "node_listeners: only with control"},
	} {
		cfg, err := ParseConfig([]byte(tc.in), "t.yaml")
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.err)
		}
		if tc.err == "" && err == nil && cfg.Control.CacheFile != "/var/lib/l7d-test/control-snapshot.json" {
			t.Errorf("%s: cache file %q, want <state_dir>/control-snapshot.json", tc.name, cfg.Control.CacheFile)
		}
	}
}

// TestControlSample: deploy/l7d-control.yaml parses, with its control section and
// node listener.
func TestControlSample(t *testing.T) {
	s, err := LoadConfig("../../deploy/l7d-control.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Control == nil || s.Control.Node != "l7-a" || s.Control.CacheFile != "/var/lib/tiergate/l7d/control-snapshot.json" ||
		s.NodeListeners["public"].QUICServerID != 11 || s.KeyServers == nil || len(s.Listeners) != 0 {
		t.Errorf("sample parsed as %+v", s)
	}
}

// TestControlKeyserverLate: l7d started before its keyservers serves the store's
// configuration once they come up, rather than refusing it for good.
func TestControlKeyserverLate(t *testing.T) {
	e := newControlEnvStopped(t)
	v1, serial1 := e.cert(1, e.key)
	rev := e.put(append(siteObjects(), v1)...)
	time.AfterFunc(time.Second, func() {
		if err := e.ks.Start(); err != nil {
			t.Errorf("starting the keyserver: %v", err)
		}
	})
	e.start()
	if got := e.served(); got.Cmp(serial1) != 0 {
		t.Fatalf("serial %x served, want %x", got, serial1)
	}
	e.waitStatus("applied", func(s agent.Status) bool { return s.AppliedRevision >= rev && s.Error == "" })
}

// TestControlFileReload: with control, a reload of the file applies the node's own
// settings with the snapshot in force, and refuses what takes a restart (a node
// listener's address, the control section) with the configuration in force kept.
func TestControlFileReload(t *testing.T) {
	e := newControlEnv(t)
	v1, serial1 := e.cert(1, e.key)
	e.put(append(siteObjects(), v1)...)
	_, _, admin := e.startAdmin()
	orig := readFile(t, e.path)

	writeFile(t, e.path, strings.Replace(orig, "log_level: debug", "log_level: info", 1))
	if code, _, body := admin.call("POST", "/reload", ""); code != 200 {
		t.Fatalf("reload of the node's own settings: %d %s", code, body)
	}
	writeFile(t, e.path, strings.Replace(orig, `web: {addr: "`+e.listen+`"}`, `web: {addr: "`+freeAddr(t)+`"}`, 1))
	if code, out, body := admin.call("POST", "/reload", ""); code != 422 || out["code"] != "restart_required" || !strings.Contains(body, "addr") {
		t.Fatalf("reload moving a listener: %d %s, want 422 restart_required naming addr", code, body)
	}
	writeFile(t, e.path, strings.Replace(orig, "node: l7-a", "node: l7-b", 1))
	if code, out, body := admin.call("POST", "/reload", ""); code != 422 || out["code"] != "restart_required" || !strings.Contains(body, "control changed") {
		t.Fatalf("reload changing the control section: %d %s, want 422 restart_required", code, body)
	}
	writeFile(t, e.path, orig+"listeners: [{name: x, addr: \"127.0.0.1:0\", pool: p}]\n")
	if code, _, body := admin.call("POST", "/reload", ""); code != 422 || !strings.Contains(body, "listeners: given by the control plane") {
		t.Fatalf("reload with listeners in the file: %d %s", code, body)
	}
	if got := e.served(); got.Cmp(serial1) != 0 {
		t.Fatalf("after the refused reloads serial %x is served, want %x", got, serial1)
	}
}
