package tgctl

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tiergate/tiergate/control/certupload"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
	ksclient "github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/softkey"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// withKeyserver starts a keyserver on a software backend that lets controld
// import keys, and gives the API a client of it.
func (f *fixture) withKeyserver(t *testing.T) {
	t.Helper()
	mt, err := testpki.NewMutualTLS(t.TempDir(), "ks", "keyserver", []string{"127.0.0.1"}, "controld")
	if err != nil {
		t.Fatal(err)
	}
	soft, err := softkey.New(softkey.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := keyserver.NewServer(keyserver.Config{
		Addr:     "127.0.0.1:0",
		TLS:      &tls.Config{Certificates: []tls.Certificate{mt.ServerLeaf}, ClientCAs: mt.ClientCA.Pool()},
		Backends: []backend.Backend{soft},
		Clients:  []keyserver.ClientRule{{Name: "controld", Keys: []string{"*"}, Admin: true}},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ks.Shutdown(ctx)
	})
	k, err := certupload.NewKeyservers(ksclient.Config{
		Servers: []string{ks.Addr().String()},
		TLS:     &tls.Config{Certificates: []tls.Certificate{mt.ClientLeaf}, RootCAs: mt.ServerCA.Pool()},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	f.srv.SetKeyservers(k)
}

// siteCert issues a certificate for names under ca and writes its chain and key
// files; it returns their paths.
func (f *fixture) siteCert(t *testing.T, ca *testpki.CA, file string, names ...string) (chainFile, keyFile string, key crypto.Signer) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, der, err := ca.Issue(names[0], k.Public(), names...)
	if err != nil {
		t.Fatal(err)
	}
	chain := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.DER})...)
	keyPEM, err := testpki.KeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	return f.file(t, file+".pem", string(chain)), f.file(t, file+".key", string(keyPEM)), k
}

func TestCertUploadListVersionsRollback(t *testing.T) {
	f := newFixture(t)
	if !f.served("POST /v1/certificates/{name}/versions") {
		t.Fatal("the API has no certificate uploads")
	}
	f.withKeyserver(t)
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	chain1, key1, _ := f.siteCert(t, ca, "www1", "www.example.com", "example.com")
	chain2, key2, _ := f.siteCert(t, ca, "www2", "www.example.com", "example.com")

	r := f.run(t, "cert", "upload", "--name", "www", "--cert", chain1, "--key", key1, "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "dry run") {
		t.Fatalf("cert upload --dry-run: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if objs, _, _ := f.st.List(context.Background(), "certificates"); len(objs) != 0 {
		t.Fatalf("a dry run stored %v", objs)
	}
	r = f.run(t, "cert", "upload", "--name", "www", "--cert", chain1, "--key", key1)
	if r.code != 0 || !strings.Contains(r.stdout, "certificate www version 1 stored at revision") || !strings.Contains(r.stdout, "verified") {
		t.Fatalf("cert upload: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.run(t, "cert", "upload", "--name", "www", "--cert", chain2, "--key", key2, "-o", "json"); r.code != 0 {
		t.Fatalf("cert upload of a second version: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var up struct {
		Certificate struct{ Version int }
		Revision    int64
	}
	if json.Unmarshal([]byte(r.stdout), &up) != nil || up.Certificate.Version != 2 || up.Revision == 0 {
		t.Fatalf("cert upload -o json: %s", r.stdout)
	}

	// list: names, SANs, key type, key ID, not-after, days left.
	r = f.run(t, "cert", "list")
	if r.code != 0 {
		t.Fatalf("cert list: %d %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "DAYS LEFT") || !strings.HasPrefix(lines[1], "www ") ||
		!strings.Contains(lines[1], "ecdsa") || !strings.Contains(lines[1], "www.example.com,example.com") {
		t.Fatalf("cert list:\n%s", r.stdout)
	}
	r = f.run(t, "cert", "list", "-o", "json")
	var certs []struct {
		Name     string
		KeyID    string `json:"key_id"`
		DaysLeft int    `json:"days_left"`
		Chain    string
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &certs) != nil || len(certs) != 1 || len(certs[0].KeyID) != 64 || certs[0].DaysLeft < 0 || certs[0].Chain != "" {
		t.Fatalf("cert list -o json: %d %s", r.code, r.stdout)
	}

	r = f.run(t, "cert", "versions", "www", "-o", "yaml")
	var vers struct {
		Current  int
		Versions []struct {
			Version    int
			UploadedBy string `yaml:"uploaded_by"`
		}
	}
	if r.code != 0 || yaml.Unmarshal([]byte(r.stdout), &vers) != nil || vers.Current != 2 || len(vers.Versions) != 2 || vers.Versions[0].UploadedBy != "admin" {
		t.Fatalf("cert versions -o yaml: %d %+v\n%s%s", r.code, vers, r.stdout, r.stderr)
	}
	if r = f.run(t, "cert", "versions", "www"); r.code != 0 || !strings.Contains(r.stdout, "UPLOADED") {
		t.Fatalf("cert versions: %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	if r = f.run(t, "cert", "rollback", "www", "1"); r.code != 0 || !strings.Contains(r.stdout, "certificate www is version 1") {
		t.Fatalf("cert rollback: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.run(t, "get", "certificates", "www", "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"version": 1`) {
		t.Fatalf("after the rollback: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.run(t, "cert", "rollback", "www", "9"); r.code != ExitNotFound {
		t.Fatalf("rollback to a version that is not there: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = f.run(t, "cert", "versions", "nope"); r.code != ExitNotFound {
		t.Fatalf("versions of no certificate: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestCertUploadRefused(t *testing.T) {
	f := newFixture(t)
	f.withKeyserver(t)
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	chain1, _, _ := f.siteCert(t, ca, "a", "a.example.com")
	_, key2, _ := f.siteCert(t, ca, "b", "b.example.com")

	// The key is not the leaf's: 4, the field on its own line.
	r := f.run(t, "cert", "upload", "--name", "a", "--cert", chain1, "--key", key2)
	if r.code != ExitInvalid || !strings.Contains(r.stderr, "key_mismatch") || !strings.Contains(r.stderr, "\n  key: ") {
		t.Fatalf("a key that is not the leaf's: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Not a chain.
	notPEM := f.file(t, "junk.pem", "junk")
	if r := f.run(t, "cert", "upload", "--name", "a", "--cert", notPEM, "--key", key2); r.code != ExitInvalid || !strings.Contains(r.stderr, "bad_chain") {
		t.Fatalf("a chain that is not one: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A certificate is not stored by apply.
	if r := f.run(t, "apply", "-f", f.file(t, "c.yaml", "kind: certificates\nname: a\nversion: 1\n")); r.code != ExitError || !strings.Contains(r.stderr, "tgctl cert upload") {
		t.Fatalf("apply of a certificate: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A role that does not write certificates.
	pol := f.token(t, "pol", "policy-operator")
	if r := f.run(t, "--token", pol, "cert", "upload", "--name", "a", "--cert", chain1, "--key", key2); r.code != ExitAuth {
		t.Fatalf("an upload by a policy-operator: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Usage.
	if r := f.run(t, "cert", "upload", "--name", "a"); r.code != ExitUsage {
		t.Fatalf("an upload without files: %d %s", r.code, r.stderr)
	}
	if objs, _, _ := f.st.List(context.Background(), "certificates"); len(objs) != 0 {
		t.Fatalf("refused uploads stored %v", objs)
	}
}
