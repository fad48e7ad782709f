package controld

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/certupload"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/softkey"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// TestKeyserversChecked: the keyservers section is checked with the rest, each
// bad field named under keyservers.
func TestKeyserversChecked(t *testing.T) {
	c := Config{DataDir: t.TempDir(), LogLevel: "info", Keyservers: &certupload.KeyserversConfig{
		Config:   client.Config{Servers: []string{"198.18.0.1"}},
		CertFile: "controld.pem",
	}}
	c.Defaults()
	err := c.Validate()
	for _, want := range []string{"keyservers", "servers[0]", "key_file: required", "ca_file: required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want %q named", err, want)
		}
	}
	c.Keyservers = &certupload.KeyserversConfig{
		Config:   client.Config{Servers: []string{"198.18.0.1:2407", "198.18.0.2:2407"}},
		CertFile: "controld.pem", KeyFile: "controld.key", CAFile: "ca.pem",
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("a whole keyservers section: %v", err)
	}
	// Its files are read at the start: missing ones stop controld.
	if _, err := c.Keyservers.Open(); err == nil || !strings.Contains(err.Error(), "client certificate") {
		t.Fatalf("Open with missing files: %v", err)
	}
}

// TestKeyserversFromConfigFile: the -config file's keyservers section, client.Config's
// settings inline, is read, its files loaded by check, and said.
func TestKeyserversFromConfigFile(t *testing.T) {
	dir := t.TempDir()
	m, err := testpki.NewMutualTLS(dir, "keyservers", "keyserver", []string{"198.18.0.1"}, "controld")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "controld.yaml")
	yaml := "data_dir: " + filepath.Join(dir, "data") + "\nkeyservers:\n  servers: [198.18.0.1:2407, 198.18.0.2:2407]\n  server_name: keyserver\n  timeout: 5s\n" +
		"  cert_file: " + m.ClientCert + "\n  key_file: " + m.ClientKey + "\n  ca_file: " + m.ServerCAFile + "\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	if code := Main([]string{"check", "-config", file}, &out, &errOut); code != 0 {
		t.Fatalf("check = %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "keyservers (a certificate's key is imported into each): 198.18.0.1:2407, 198.18.0.2:2407") {
		t.Fatalf("check does not name the keyservers:\n%s", out.String())
	}
	// A missing file is found by check.
	os.WriteFile(file, []byte(strings.Replace(yaml, m.ServerCAFile, filepath.Join(dir, "missing.pem"), 1)), 0o600)
	out.Reset()
	errOut.Reset()
	if code := Main([]string{"check", "-config", file}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "missing.pem") {
		t.Fatalf("check with a missing CA file = %d: %s", code, errOut.String())
	}
}

// TestUploadThroughControld: controld run with a keyservers section imports an
// uploaded certificate's key into its keyserver (software keys here; the API's tests
// use two on SoftHSM tokens) before storing the chain, and its log never holds the
// key.
func TestUploadThroughControld(t *testing.T) {
	dir := t.TempDir()
	m, err := testpki.NewMutualTLS(dir, "keyservers", "keyserver", []string{"127.0.0.1"}, "controld")
	if err != nil {
		t.Fatal(err)
	}
	b, err := softkey.New(softkey.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := keyserver.NewServer(keyserver.Config{
		TLS:      &tls.Config{Certificates: []tls.Certificate{m.ServerLeaf}, ClientCAs: m.ClientCA.Pool()},
		Backends: []backend.Backend{b},
		Clients:  []keyserver.ClientRule{{Name: "controld", Keys: []string{"*"}, Admin: true}},
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Serve(ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ks.Shutdown(context.Background()) })

	logs := &testenv.LockedBuffer{}
	d := &Daemon{Config: Config{DataDir: filepath.Join(dir, "data"), Listen: "127.0.0.1:0", Keyservers: &certupload.KeyserversConfig{
		Config:   client.Config{Servers: []string{ln.Addr().String()}},
		CertFile: m.ClientCert, KeyFile: m.ClientKey, CAFile: m.ServerCAFile,
	}}, Stderr: logs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case <-d.Serving():
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(time.Minute):
		t.Fatalf("not serving after a minute\n%s", logs)
	}
	tok, _ := os.ReadFile(filepath.Join(d.Config.DataDir, TokenFile))

	ca, err := testpki.NewCA("Upload CA")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, der, err := ca.Issue("www.example.com", key.Public(), "www.example.com")
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := testpki.KeyPEM(key)
	chain := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	body, _ := json.Marshal(map[string]string{"chain": string(chain), "key": string(keyPEM)})
	req, _ := http.NewRequest("POST", "http://"+d.Addr().String()+"/v1/certificates/www/versions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	ans, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var res struct {
		Certificate struct {
			KeyID string `json:"key_id"`
		} `json:"certificate"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(ans, &res) != nil {
		t.Fatalf("upload through controld: %d %s\n%s", resp.StatusCode, ans, logs)
	}
	if keys := ks.Keys(); len(keys) != 1 || keys[0].ID.String() != res.Certificate.KeyID {
		t.Fatalf("the keyserver offers %+v, want the key %s", keys, res.Certificate.KeyID)
	}
	blk, _ := pem.Decode(keyPEM)
	if strings.Contains(logs.String(), base64.StdEncoding.EncodeToString(blk.Bytes)[64:128]) {
		t.Fatal("the key is in controld's log")
	}
}
