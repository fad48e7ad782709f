package api

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"

	certchain "github.com/tiergate/tiergate/certs/chain"
	"github.com/tiergate/tiergate/control/certupload"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/hsm"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// The SoftHSM tokens of the two keyservers, made once: SoftHSM reads SOFTHSM2_CONF
// once per process, at the module's first C_Initialize.
var hsmTokens struct {
	once   sync.Once
	labels [2]string
	err    error
}

const hsmPIN = "pin-certs-1"

func tokens(t *testing.T) [2]string {
	t.Helper()
	testenv.RequireFile(t, softhsm.DefaultModule, "softhsm2")
	testenv.RequireCommand(t, softhsm.Util, "softhsm2")
	hsmTokens.once.Do(func() {
		dir, err := os.MkdirTemp("", "tiergate-certs-test-")
		if err != nil {
			hsmTokens.err = err
			return
		}
		var tok *softhsm.Token
		for i, label := range []string{"certs-ks-a", "certs-ks-b"} {
			if tok, err = softhsm.CreateToken(dir, label, "so-pin-1", hsmPIN); err != nil {
				hsmTokens.err = err
				return
			}
			hsmTokens.labels[i] = label
		}
		hsmTokens.err = tok.Setenv()
	})
	if hsmTokens.err != nil {
		t.Fatalf("SoftHSM tokens: %v", hsmTokens.err)
	}
	return hsmTokens.labels
}

var quiet = slog.New(slog.NewTextHandler(ioDiscard{}, &slog.HandlerOptions{Level: slog.LevelError}))

type ioDiscard struct{}

func (ioDiscard) Write(p []byte) (int, error) { return len(p), nil }

// keyserverNode is a keyserver.Server over a SoftHSM token, on a loopback port.
type keyserverNode struct {
	srv  *keyserver.Server
	addr string
}

func (k *keyserverNode) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	k.srv.Shutdown(ctx)
}

// has reports whether the keyserver offers key id under label.
func (k *keyserverNode) has(id string, label string) bool {
	return slices.ContainsFunc(k.srv.Keys(), func(ki protocol.KeyInfo) bool { return ki.ID.String() == id && ki.Label == label })
}

// certEnv is the API with two keyservers on SoftHSM tokens.
type certEnv struct {
	*fixture
	ks   [2]*keyserverNode
	keys *certupload.Keyservers
	ca   *testpki.CA
}

func newCertEnv(t *testing.T) *certEnv {
	t.Helper()
	labels := tokens(t)
	dir := t.TempDir()
	m, err := testpki.NewMutualTLS(dir, "keyservers", "keyserver", []string{"127.0.0.1"}, "controld")
	if err != nil {
		t.Fatal(err)
	}
	e := &certEnv{fixture: newFixture(t)}
	for i, label := range labels {
		b, err := hsm.New(hsm.Config{TokenLabel: label, PIN: hsmPIN, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		srv, err := keyserver.NewServer(keyserver.Config{
			TLS:      &tls.Config{Certificates: []tls.Certificate{m.ServerLeaf}, ClientCAs: m.ClientCA.Pool()},
			Backends: []backend.Backend{b},
			Clients:  []keyserver.ClientRule{{Name: "controld", Keys: []string{"*"}, Ops: []string{"*"}, Admin: true}},
			Logger:   quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Serve(ln); err != nil {
			t.Fatal(err)
		}
		e.ks[i] = &keyserverNode{srv: srv, addr: ln.Addr().String()}
		t.Cleanup(e.ks[i].stop)
	}
	// controld's keyservers section, from its files.
	cfg := certupload.KeyserversConfig{
		Config: client.Config{
			Servers:        []string{e.ks[0].addr, e.ks[1].addr},
			RequestTimeout: 500 * 1e6, Timeout: 1500 * 1e6, DialTimeout: 500 * 1e6,
			Logger: quiet,
		},
		CertFile: m.ClientCert, KeyFile: m.ClientKey, CAFile: m.ServerCAFile,
	}
	if e.keys, err = cfg.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.keys.Close() })
	e.srv.SetKeyservers(e.keys)
	if e.ca, err = testpki.NewCA("Upload Test CA"); err != nil {
		t.Fatal(err)
	}
	return e
}

var (
	rsaOnce sync.Once
	rsaKey  *rsa.PrivateKey
)

func testRSAKey(t *testing.T) *rsa.PrivateKey {
	rsaOnce.Do(func() {
		var err error
		if rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
	})
	return rsaKey
}

func newECKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// leafPEM issues a leaf for key under the CA, changed by mod, and returns it
// (its DER) and its key as PEM.
func (e *certEnv) leafPEM(t *testing.T, key crypto.Signer, mod func(*x509.Certificate), names ...string) (leaf []byte, keyPEM []byte) {
	t.Helper()
	if len(names) == 0 {
		names = []string{"www.example.com", "example.com"}
	}
	sn, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(60 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     names,
	}
	if mod != nil {
		mod(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, e.ca.Cert, key.Public(), e.ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := testpki.KeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return der, kp
}

func pemChain(ders ...[]byte) []byte {
	var b bytes.Buffer
	for _, d := range ders {
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: d})
	}
	return b.Bytes()
}

func (e *certEnv) upload(t *testing.T, tok, name string, chain, key []byte, dry bool, hdr ...string) (answer, UploadResult) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"chain": string(chain), "key": string(key), "dry_run": dry})
	a := e.do(t, tok, "POST", "/v1/certificates/"+name+"/versions", string(body), hdr...)
	var res UploadResult
	if a.status < 300 {
		if err := json.Unmarshal(a.body, &res); err != nil {
			t.Fatalf("upload answer: %v: %s", err, a.body)
		}
	}
	return a, res
}

func (e *certEnv) versions(t *testing.T, name string) VersionList {
	t.Helper()
	a := e.do(t, e.admin, "GET", "/v1/certificates/"+name+"/versions", "")
	var vl VersionList
	if a.status != http.StatusOK || json.Unmarshal(a.body, &vl) != nil {
		t.Fatalf("versions of %s: %d %s", name, a.status, a.body)
	}
	return vl
}

// storeHolds reports whether any value in etcd holds any of needles.
func (e *certEnv) storeHolds(t *testing.T, needles ...[]byte) string {
	t.Helper()
	resp, err := e.st.Client().Get(context.Background(), "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		for _, n := range needles {
			if bytes.Contains(kv.Value, n) || bytes.Contains(kv.Key, n) {
				return string(kv.Key)
			}
		}
	}
	return ""
}

// keyTraces are pieces of a PEM key that must appear nowhere: a line of its base64
// and its DER.
func keyTraces(keyPEM []byte) [][]byte {
	blk, _ := pem.Decode(keyPEM)
	b64 := base64.StdEncoding.EncodeToString(blk.Bytes)
	return [][]byte{[]byte(b64[64:128]), blk.Bytes[len(blk.Bytes)-40:]}
}

// keyCounts returns the number of keys each keyserver offers (the tokens are
// shared by the tests of the process).
func (e *certEnv) keyCounts() [2]int {
	return [2]int{len(e.ks[0].srv.Keys()), len(e.ks[1].srv.Keys())}
}

func (e *certEnv) certCount(t *testing.T) int {
	t.Helper()
	objs, _, err := e.st.List(context.Background(), model.KindCertificate)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.st.Client().Get(context.Background(), model.CertVersionPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return len(objs) + int(resp.Count)
}

func TestCertUploadIntoEveryKeyserver(t *testing.T) {
	e := newCertEnv(t)
	certOp := e.token(t, "certs", RoleCertOperator)
	key := newECKey(t)
	leaf, keyPEM := e.leafPEM(t, key, nil)
	a, res := e.upload(t, certOp, "www", pemChain(leaf, e.ca.DER), keyPEM, false)
	if a.status != http.StatusCreated {
		t.Fatalf("upload: %d %s", a.status, a.body)
	}
	c := res.Certificate
	if c.Version != 1 || c.KeyType != certchain.KeyECDSA || res.Reordered || res.Revision == 0 || a.header.Get("ETag") != etag(res.Revision) {
		t.Fatalf("upload answer: %s", a.body)
	}
	if len(res.Keyservers) != 2 {
		t.Fatalf("keyservers in the answer: %+v", res.Keyservers)
	}
	for i, k := range e.ks {
		if r := res.Keyservers[i]; r.Address != k.addr || !r.Verified || r.Error != "" {
			t.Errorf("keyserver %d: %+v", i, r)
		}
		if !k.has(c.KeyID, "www.v1") {
			t.Errorf("keyserver %s does not offer the key %s as www.v1: %+v", k.addr, c.KeyID, k.srv.Keys())
		}
	}
	// Stored: the certificate in force and its version, beside it, at one revision.
	g := e.do(t, e.admin, "GET", "/v1/certificates/www", "")
	var stored model.Certificate
	if g.status != http.StatusOK || json.Unmarshal(g.body, &stored) != nil || stored.Chain != c.Chain || g.header.Get("ETag") != etag(res.Revision) {
		t.Fatalf("stored certificate: %d %s", g.status, g.body)
	}
	vl := e.versions(t, "www")
	if vl.Current != 1 || vl.Revision != res.Revision || len(vl.Versions) != 1 || !vl.Versions[0].Current ||
		vl.Versions[0].UploadedBy != "certs" || len(vl.Versions[0].Keyservers) != 2 || vl.Versions[0].DaysLeft != 59 {
		t.Fatalf("versions: %+v", vl)
	}
	vkey, err := e.st.Client().Get(context.Background(), model.CertVersionKey("www", 1))
	if err != nil || len(vkey.Kvs) != 1 || vkey.Kvs[0].ModRevision != res.Revision {
		t.Fatalf("the version's key is not written with the certificate: %v %v", err, vkey)
	}
	// The key is nowhere in the store or the log; the nodes' prefix has no version.
	if k := e.storeHolds(t, keyTraces(keyPEM)...); k != "" {
		t.Fatalf("the private key is in the store at %s", k)
	}
	for _, tr := range keyTraces(keyPEM) {
		if bytes.Contains([]byte(e.audit.String()), tr) {
			t.Fatal("the private key is in the log")
		}
	}
	if !strings.Contains(e.audit.String(), "certificate version uploaded") {
		t.Errorf("the upload is not audit-logged: %s", e.audit.String())
	}
	snap, err := e.st.Snapshot(context.Background())
	if err != nil || snap.Len() != 1 {
		t.Fatalf("the nodes' snapshot holds %d objects (%v), want the certificate only", snap.Len(), err)
	}
	// The revision records who uploaded it.
	rv := e.do(t, e.admin, "GET", "/v1/revisions/"+strconv.FormatInt(res.Revision, 10), "")
	if rv.status != http.StatusOK || !strings.Contains(string(rv.body), `"who": "certs"`) || !strings.Contains(string(rv.body), `"certificates"`) {
		t.Errorf("the upload's revision: %d %s", rv.status, rv.body)
	}
	// The list gives the summary and days left.
	l := e.do(t, e.admin, "GET", "/v1/certificates", "")
	var list CertList
	if l.status != http.StatusOK || json.Unmarshal(l.body, &list) != nil || len(list.Items) != 1 {
		t.Fatalf("list: %d %s", l.status, l.body)
	}
	if it := list.Items[0]; it.Name != "www" || it.KeyID != c.KeyID || it.KeyType != "ecdsa" || it.DaysLeft != 59 ||
		!slices.Equal(it.SANs, []string{"www.example.com", "example.com"}) || it.Version != 1 || !it.NotAfter.Equal(c.NotAfter) {
		t.Fatalf("list item: %s", l.body)
	}
	// A second version of the same key: imported again (the keyservers answer its
	// ID), version 2.
	leaf2, _ := e.leafPEM(t, key, nil)
	a, res = e.upload(t, certOp, "www", pemChain(leaf2, e.ca.DER), keyPEM, false)
	if a.status != http.StatusCreated || res.Certificate.Version != 2 {
		t.Fatalf("second upload: %d %s", a.status, a.body)
	}
}

func TestCertUploadKeyserverDown(t *testing.T) {
	e := newCertEnv(t)
	e.ks[1].stop()
	leaf, keyPEM := e.leafPEM(t, newECKey(t), nil)
	a, _ := e.upload(t, e.admin, "www", pemChain(leaf, e.ca.DER), keyPEM, false)
	if a.status != http.StatusBadGateway || a.err.Code != CodeKeyserverFailed || !strings.Contains(a.err.Message, e.ks[1].addr) {
		t.Fatalf("upload with a keyserver down: %d %s", a.status, a.body)
	}
	var details struct {
		Keyserver  string              `json:"keyserver"`
		Keyservers []certupload.Result `json:"keyservers"`
	}
	if json.Unmarshal(a.body, &details) != nil || details.Keyserver != e.ks[1].addr || len(details.Keyservers) != 2 ||
		!details.Keyservers[0].Verified || details.Keyservers[1].Verified || details.Keyservers[1].Error == "" {
		t.Fatalf("the answer does not say which keyserver failed: %s", a.body)
	}
	if n := e.certCount(t); n != 0 {
		t.Fatalf("%d certificates or versions stored after a failed upload", n)
	}
	// A dry run says so too, and imports nothing.
	leaf2, keyPEM2 := e.leafPEM(t, newECKey(t), nil)
	before := len(e.ks[0].srv.Keys())
	a, _ = e.upload(t, e.admin, "www", pemChain(leaf2, e.ca.DER), keyPEM2, true)
	if a.status != http.StatusBadGateway || a.err.Code != CodeKeyserverFailed || !strings.Contains(a.err.Message, e.ks[1].addr) {
		t.Fatalf("dry run with a keyserver down: %d %s", a.status, a.body)
	}
	if len(e.ks[0].srv.Keys()) != before {
		t.Fatal("a dry run imported a key")
	}
}

func TestCertUploadRefused(t *testing.T) {
	e := newCertEnv(t)
	key := newECKey(t)
	leaf, keyPEM := e.leafPEM(t, key, nil)
	_, otherKey := e.leafPEM(t, newECKey(t), nil)
	expired, _ := e.leafPEM(t, key, func(c *x509.Certificate) {
		c.NotBefore, c.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
	})
	otherCA, err := testpki.NewCA("Another CA")
	if err != nil {
		t.Fatal(err)
	}
	before := e.keyCounts()
	for _, tc := range []struct {
		name        string
		chain, key  []byte
		code, field string
	}{
		{"bad chain", pemChain(leaf, otherCA.DER), keyPEM, CodeBadChain, "chain[1]"},
		{"garbage", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), keyPEM, CodeBadChain, "chain[0]"},
		{"mismatched key", pemChain(leaf, e.ca.DER), otherKey, CodeKeyMismatch, "key"},
		{"expired", pemChain(expired, e.ca.DER), keyPEM, CodeExpired, "chain[0]"},
		{"no key", pemChain(leaf, e.ca.DER), nil, "invalid", "key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, dry := range []bool{false, true} {
				a, _ := e.upload(t, e.admin, "www", tc.chain, tc.key, dry)
				if a.status != http.StatusUnprocessableEntity || a.err.Code != tc.code || len(a.err.Errors) != 1 || a.err.Errors[0].Path != tc.field {
					t.Fatalf("dry run %v: %d %s, want 422 %s at %s", dry, a.status, a.body, tc.code, tc.field)
				}
				var d struct {
					Field string `json:"field"`
				}
				if json.Unmarshal(a.body, &d) != nil || d.Field != tc.field {
					t.Fatalf("no field in %s", a.body)
				}
			}
		})
	}
	if n := e.certCount(t); n != 0 || e.keyCounts() != before {
		t.Fatalf("a refused upload stored %d objects or imported keys", n)
	}
}

func TestCertUploadReordersAndDryRun(t *testing.T) {
	e := newCertEnv(t)
	leaf, keyPEM := e.leafPEM(t, newECKey(t), nil)
	before := e.keyCounts()
	// A dry run checks and answers what it would store, and stores nothing.
	a, res := e.upload(t, e.admin, "www", pemChain(e.ca.DER, leaf), keyPEM, true)
	if a.status != http.StatusOK || !res.DryRun || !res.Reordered || res.Certificate.Version != 1 || len(res.Keyservers) != 2 ||
		!res.Keyservers[0].Reachable || !res.Keyservers[1].Reachable || res.Keyservers[0].Verified {
		t.Fatalf("dry run: %d %s", a.status, a.body)
	}
	if n := e.certCount(t); n != 0 || e.keyCounts() != before {
		t.Fatalf("a dry run stored %d objects or imported keys", n)
	}
	a, res = e.upload(t, e.admin, "www", pemChain(e.ca.DER, leaf), keyPEM, false)
	if a.status != http.StatusCreated || !res.Reordered || len(res.Notes) == 0 || !strings.Contains(res.Notes[0], "another order") {
		t.Fatalf("upload of a chain in the wrong order: %d %s", a.status, a.body)
	}
	if res.Certificate.Chain != string(pemChain(leaf, e.ca.DER)) {
		t.Fatalf("the chain stored is not leaf first:\n%s", res.Certificate.Chain)
	}
	// Without keyservers nothing is uploaded, not even a dry run.
	e.srv.SetKeyservers(nil)
	if a, _ := e.upload(t, e.admin, "www2", pemChain(leaf, e.ca.DER), keyPEM, true); a.status != http.StatusServiceUnavailable || a.err.Code != CodeKeyserverFailed {
		t.Fatalf("upload without keyservers: %d %s", a.status, a.body)
	}
}

// TestCertECDSAAndRSASideBySide binds an ECDSA and an RSA certificate of the same
// names in one binding, and a bound certificate cannot be deleted.
func TestCertECDSAAndRSASideBySide(t *testing.T) {
	e := newCertEnv(t)
	certOp := e.token(t, "certs", RoleCertOperator)
	ecLeaf, ecKeyPEM := e.leafPEM(t, newECKey(t), nil)
	rsaLeaf, rsaKeyPEM := e.leafPEM(t, testRSAKey(t), nil)
	revs := map[string]int64{}
	for name, up := range map[string][2][]byte{"www-ec": {ecLeaf, ecKeyPEM}, "www-rsa": {rsaLeaf, rsaKeyPEM}} {
		a, res := e.upload(t, certOp, name, pemChain(up[0], e.ca.DER), up[1], false)
		if a.status != http.StatusCreated {
			t.Fatalf("%s: %d %s", name, a.status, a.body)
		}
		revs[name] = res.Revision
		for _, k := range e.ks {
			if !k.has(res.Certificate.KeyID, name+".v1") {
				t.Errorf("%s: keyserver %s lacks the key", name, k.addr)
			}
		}
	}
	// Ed25519 too, where the keyservers' tokens have CKM_EDDSA (SoftHSM 2.6 has).
	bound := `"www-ec","www-rsa"`
	_, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	edLeaf, edKeyPEM := e.leafPEM(t, edPriv, nil)
	switch a, res := e.upload(t, certOp, "www-ed", pemChain(edLeaf, e.ca.DER), edKeyPEM, false); {
	case a.status == http.StatusCreated && res.Certificate.KeyType == "ed25519":
		bound += `,"www-ed"`
	case a.status == http.StatusBadGateway && a.err.Code == CodeKeyserverFailed:
		t.Logf("the keyservers' tokens take no Ed25519 key: %s", a.err.Message)
	default:
		t.Fatalf("Ed25519 upload: %d %s", a.status, a.body)
	}
	cs := `{"changes":[
		{"kind":"listeners","name":"web","object":{"name":"web","addr":"198.51.100.1:443"},"if_revision":0},
		{"kind":"cert-bindings","name":"www","object":{"name":"www","certificates":[` + bound + `],"listeners":["web"],"default":true},"if_revision":0}]}`
	if a := e.do(t, e.admin, "POST", "/v1/changesets", cs); a.status != http.StatusOK {
		t.Fatalf("binding both: %d %s", a.status, a.body)
	}
	l := e.do(t, e.admin, "GET", "/v1/certificates", "")
	var list CertList
	if json.Unmarshal(l.body, &list) != nil || len(list.Items) < 2 || list.Items[0].KeyType != "ecdsa" || list.Items[len(list.Items)-1].KeyType != "rsa" {
		t.Fatalf("list: %s", l.body)
	}
	// A bound certificate cannot be deleted: the snapshot check refuses it.
	d := e.do(t, certOp, "DELETE", "/v1/certificates/www-rsa", "", "If-Match", etag(revs["www-rsa"]))
	if d.status != http.StatusUnprocessableEntity || !strings.Contains(string(d.body), "cert-bindings/www.certificates[1]") {
		t.Fatalf("deleting a bound certificate: %d %s", d.status, d.body)
	}
	// A new version must serve the names bound: one without example.com is refused
	// whole, nothing stored.
	narrow, narrowKey := e.leafPEM(t, newECKey(t), nil, "www.example.com")
	before := e.keyCounts()
	a, _ := e.upload(t, certOp, "www-ec", pemChain(narrow, e.ca.DER), narrowKey, false)
	if a.status != http.StatusUnprocessableEntity || a.err.Code != CodeInvalid {
		t.Fatalf("a version that no longer serves a bound name: %d %s", a.status, a.body)
	}
	if e.keyCounts() != before {
		t.Fatal("the key of a version the configuration refuses was imported")
	}
	if vl := e.versions(t, "www-ec"); len(vl.Versions) != 1 {
		t.Fatalf("a refused version was kept: %+v", vl)
	}
}

func TestCertRollback(t *testing.T) {
	e := newCertEnv(t)
	certOp := e.token(t, "certs", RoleCertOperator)
	key := newECKey(t)
	leaf1, keyPEM := e.leafPEM(t, key, nil)
	a, v1 := e.upload(t, certOp, "www", pemChain(leaf1, e.ca.DER), keyPEM, false)
	if a.status != http.StatusCreated {
		t.Fatalf("v1: %d %s", a.status, a.body)
	}
	leaf2, keyPEM2 := e.leafPEM(t, newECKey(t), nil)
	a, v2 := e.upload(t, certOp, "www", pemChain(leaf2, e.ca.DER), keyPEM2, false)
	if a.status != http.StatusCreated || v2.Certificate.Version != 2 {
		t.Fatalf("v2: %d %s", a.status, a.body)
	}
	// An upload with a stale If-Match is refused.
	if a, _ := e.upload(t, certOp, "www", pemChain(leaf2, e.ca.DER), keyPEM2, false, "If-Match", etag(v1.Revision)); a.status != http.StatusPreconditionFailed {
		t.Fatalf("upload with a stale If-Match: %d %s", a.status, a.body)
	}
	if a := e.do(t, certOp, "POST", "/v1/certificates/www/rollback", `{"version":1}`); a.status != http.StatusPreconditionRequired {
		t.Fatalf("rollback without If-Match: %d %s", a.status, a.body)
	}
	if a := e.do(t, certOp, "POST", "/v1/certificates/www/rollback", `{"version":1}`, "If-Match", etag(v1.Revision)); a.status != http.StatusPreconditionFailed || a.err.Code != CodeConflict {
		t.Fatalf("rollback with a stale If-Match: %d %s", a.status, a.body)
	}
	if a := e.do(t, certOp, "POST", "/v1/certificates/www/rollback", `{"version":7}`, "If-Match", etag(v2.Revision)); a.status != http.StatusNotFound {
		t.Fatalf("rollback to a missing version: %d %s", a.status, a.body)
	}
	a = e.do(t, certOp, "POST", "/v1/certificates/www/rollback", `{"version":1}`, "If-Match", etag(v2.Revision))
	var rb UploadResult
	if a.status != http.StatusOK || json.Unmarshal(a.body, &rb) != nil || rb.Certificate.Version != 1 || rb.Certificate.Chain != v1.Certificate.Chain ||
		len(rb.Keyservers) != 2 || !rb.Keyservers[0].Verified || !rb.Keyservers[1].Verified {
		t.Fatalf("rollback: %d %s", a.status, a.body)
	}
	g := e.do(t, e.admin, "GET", "/v1/certificates/www", "")
	var cur model.Certificate
	if json.Unmarshal(g.body, &cur) != nil || cur.Version != 1 || cur.KeyID != v1.Certificate.KeyID || g.header.Get("ETag") != etag(rb.Revision) {
		t.Fatalf("after the rollback: %s", g.body)
	}
	vl := e.versions(t, "www")
	if vl.Current != 1 || len(vl.Versions) != 2 || !vl.Versions[0].Current || vl.Versions[1].Current {
		t.Fatalf("versions after the rollback: %+v", vl)
	}
	// The next upload is version 3: versions are never reused.
	a, v3 := e.upload(t, certOp, "www", pemChain(leaf2, e.ca.DER), keyPEM2, false)
	if a.status != http.StatusCreated || v3.Certificate.Version != 3 {
		t.Fatalf("upload after a rollback: %d %s", a.status, a.body)
	}
	// A rollback to a version whose key a keyserver no longer reaches is refused.
	e.ks[0].stop()
	a = e.do(t, certOp, "POST", "/v1/certificates/www/rollback", `{"version":1}`, "If-Match", etag(v3.Revision))
	if a.status != http.StatusBadGateway || a.err.Code != CodeKeyserverFailed || !strings.Contains(a.err.Message, e.ks[0].addr) {
		t.Fatalf("rollback with a keyserver down: %d %s", a.status, a.body)
	}
	if vl := e.versions(t, "www"); vl.Current != 3 {
		t.Fatalf("a refused rollback changed the certificate: %+v", vl)
	}
}

func TestCertRoles(t *testing.T) {
	e := newCertEnv(t)
	viewer := e.token(t, "viewer", RoleViewer)
	policy := e.token(t, "policy", RolePolicyOperator)
	risk := e.token(t, "risk", RoleRiskEngine)
	leaf, keyPEM := e.leafPEM(t, newECKey(t), nil)
	before := e.keyCounts()
	for _, tok := range []string{viewer, policy, risk} {
		if a, _ := e.upload(t, tok, "www", pemChain(leaf, e.ca.DER), keyPEM, false); a.status != http.StatusForbidden || a.err.Code != CodeForbidden {
			t.Fatalf("upload by %s: %d %s", tok[:4], a.status, a.body)
		}
		if a := e.do(t, tok, "POST", "/v1/certificates/www/rollback", `{"version":1}`, "If-Match", `"1"`); a.status != http.StatusForbidden {
			t.Fatalf("rollback by %s: %d %s", tok[:4], a.status, a.body)
		}
	}
	if a, _ := e.upload(t, "", "www", pemChain(leaf, e.ca.DER), keyPEM, false); a.status != http.StatusUnauthorized {
		t.Fatalf("upload without a token: %d %s", a.status, a.body)
	}
	if e.keyCounts() != before || e.certCount(t) != 0 {
		t.Fatal("a refused upload imported or stored")
	}
	if a, _ := e.upload(t, e.admin, "www", pemChain(leaf, e.ca.DER), keyPEM, false); a.status != http.StatusCreated {
		t.Fatalf("upload by admin: %d %s", a.status, a.body)
	}
	if a := e.do(t, viewer, "GET", "/v1/certificates/www/versions", ""); a.status != http.StatusOK {
		t.Fatalf("versions read by a viewer: %d %s", a.status, a.body)
	}
}

// TestCertWrittenOnlyByUpload: the generic PUT and a change set's put of a
// certificate are refused; its deletion is not.
func TestCertWrittenOnlyByUpload(t *testing.T) {
	f := newFixture(t)
	ca, err := testpki.NewCA("CA")
	if err != nil {
		t.Fatal(err)
	}
	_, der, err := ca.Issue("www.example.com", newECKey(t).Public(), "www.example.com")
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.NewCertificate("www", 1, pemChain(der))
	if err != nil {
		t.Fatal(err)
	}
	obj, _ := json.Marshal(c)
	if a := f.do(t, f.admin, "PUT", "/v1/certificates/www", string(obj), "If-None-Match", "*"); a.status != http.StatusMethodNotAllowed || a.err.Code != CodeUseUpload {
		t.Fatalf("PUT of a certificate: %d %s", a.status, a.body)
	}
	cs := `{"changes":[{"kind":"certificates","name":"www","object":` + string(obj) + `,"if_revision":0}]}`
	if a := f.do(t, f.admin, "POST", "/v1/changesets", cs); a.status != http.StatusMethodNotAllowed || a.err.Code != CodeUseUpload {
		t.Fatalf("change set putting a certificate: %d %s", a.status, a.body)
	}
	// Written around the API (as an old controld did), it is deleted by the API.
	rev, err := f.st.Put(context.Background(), model.KindCertificate, "www", obj, 0)
	if err != nil {
		t.Fatal(err)
	}
	cs = `{"changes":[{"kind":"certificates","name":"www","delete":true,"if_revision":` + etag(rev)[1:len(etag(rev))-1] + `}]}`
	if a := f.do(t, f.admin, "POST", "/v1/changesets", cs); a.status != http.StatusOK {
		t.Fatalf("change set deleting a certificate: %d %s", a.status, a.body)
	}
	// Without keyservers an upload is refused.
	key := newECKey(t)
	_, der, _ = ca.Issue("www.example.com", key.Public(), "www.example.com")
	kp, _ := testpki.KeyPEM(key)
	body, _ := json.Marshal(map[string]any{"chain": string(pemChain(der)), "key": string(kp)})
	if a := f.do(t, f.admin, "POST", "/v1/certificates/www/versions", string(body)); a.status != http.StatusServiceUnavailable || a.err.Code != CodeKeyserverFailed {
		t.Fatalf("upload without keyservers: %d %s", a.status, a.body)
	}
}

func TestSecretPEMDecode(t *testing.T) {
	for in, want := range map[string]string{
		`"a\nb"`:                      "a\nb",
		`"\"\\\/\b\f\r\t"`:            "\"\\/\b\f\r\t",
		`"\u0041\u00e9"`:              "Aé",
		`"\ud83d\ude00"`:              "😀",
		`"plain -----BEGIN KEY-----"`: "plain -----BEGIN KEY-----",
	} {
		var p secretPEM
		if err := json.Unmarshal([]byte(in), &p); err != nil || string(p) != want {
			t.Errorf("%s: %q, %v; want %q", in, p, err, want)
		}
		var s string
		json.Unmarshal([]byte(in), &s)
		if s != want {
			t.Errorf("%s: encoding/json reads %q", in, s)
		}
	}
	for _, bad := range []string{`"\x"`, `"\u12"`, `12`, `"a\`} {
		var p secretPEM
		if err := json.Unmarshal([]byte(bad), &p); err == nil {
			t.Errorf("%s: accepted as %q", bad, p)
		}
	}
}

// FuzzSecretPEM: the key's JSON string, decoded without a Go string, reads as
// encoding/json reads it, and never panics on what the decoder hands it.
func FuzzSecretPEM(f *testing.F) {
	for _, s := range []string{`"a\nb"`, `"\"\\\/\b\f\r\t"`, `"\u0041\u00e9"`, `"\ud83d\ude00"`, `"\ud800\u0041"`, `"\ud800"`, `null`, `12`, `"a\`, `"\u12"`, `"-----BEGIN PRIVATE KEY-----\nMIG\n-----END PRIVATE KEY-----\n"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var direct secretPEM
		_ = direct.UnmarshalJSON(data)
		var s string
		errS := json.Unmarshal(data, &s)
		var p secretPEM
		errP := json.Unmarshal(data, &p)
		if !utf8.Valid(data) || errS != nil {
			return
		}
		if errP != nil || string(p) != s {
			t.Fatalf("%q: secretPEM reads %q (%v), encoding/json %q", data, p, errP, s)
		}
	})
}
