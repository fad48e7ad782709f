package controld

import (
	"strings"
	"testing"

	"github.com/tiergate/tiergate/control/certupload"
	"github.com/tiergate/tiergate/keyserver/client"
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
