package controld

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/control/certupload"
	"github.com/tiergate/tiergate/keyserver/client"
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
