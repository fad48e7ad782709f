package client

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// TestConfigYAMLAndJSON: the model reads the same from YAML (l7d's keyservers
// section) and from JSON (the control plane's form), durations as text in both, and
// writes back what it read; the program's parts have no YAML or JSON form.
func TestConfigYAMLAndJSON(t *testing.T) {
	const doc = `
servers: [ks1.example.net:2407, "198.18.0.5:2407"]
server_name: keyserver.example.net
conns_per_server: 3
max_in_flight_per_conn: 512
request_timeout: 800ms
timeout: 2s
dial_timeout: 1s
ping_interval: 4s
reconnect_min: 50ms
reconnect_max: 5s
`
	const js = `{"servers": ["ks1.example.net:2407", "198.18.0.5:2407"], "server_name": "keyserver.example.net",
		"conns_per_server": 3, "max_in_flight_per_conn": 512, "request_timeout": "800ms", "timeout": "2s",
		"dial_timeout": "1s", "ping_interval": "4s", "reconnect_min": "50ms", "reconnect_max": "5s"}`
	var y, j, std Config
	if err := config.Decode([]byte(doc), "YAML", &y); err != nil {
		t.Fatal(err)
	}
	if err := config.Decode([]byte(js), "JSON", &j); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(js), &std); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(y, j) || !reflect.DeepEqual(y, std) {
		t.Fatalf("YAML %+v\nJSON %+v\nencoding/json %+v", y, j, std)
	}
	if y.RequestTimeout.D() != 800*time.Millisecond || y.ConnsPerServer != 3 || len(y.Servers) != 2 {
		t.Fatalf("decoded %+v", y)
	}
	out, err := json.Marshal(y)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, y) {
		t.Fatalf("round trip through %s: %+v, %v", out, back, err)
	}
	if out, _ := json.Marshal(Config{TLS: sharedPKI().clientTLS(), Logger: quietLog}); string(out) != `{"servers":null}` {
		t.Errorf("a Config with only the program's parts as JSON: %s", out)
	}
	if err := config.Decode([]byte("tls: {}\n"), "YAML", &y); err == nil {
		t.Error("the program's TLS field was read from YAML")
	}
	if err := y.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestValidatePaths: Validate names every bad field by its path.
func TestValidatePaths(t *testing.T) {
	c := Config{Servers: []string{"a:1", "b", "a:1"}, ConnsPerServer: -1, PingInterval: config.Duration(-time.Second)}
	want := `servers[1]: "b": address b: missing port in address` + "\n" + `servers[2]: "a:1" is listed twice` + "\n" +
		"conns_per_server: -1 is negative\nping_interval: -1s is negative"
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Fatalf("Validate: %v\nwant %s", err, want)
	}
	if err := (&Config{}).Validate(); err == nil || !strings.HasPrefix(err.Error(), "servers: required") {
		t.Fatalf("no servers: %v", err)
	}
}

// TestServerName: ServerName is the name the client asks for and verifies, over the
// TLS config's.
func TestServerName(t *testing.T) {
	cfg := Config{Servers: []string{"127.0.0.1:1"}, TLS: sharedPKI().clientTLS(), Logger: quietLog, ServerName: "ks.example.net"}
	cfg.TLS.ServerName = "other.example.net"
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.tls.ServerName != "ks.example.net" {
		t.Fatalf("TLS server name %q", c.tls.ServerName)
	}
	cfg.ServerName = ""
	c2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2.tls.ServerName != "other.example.net" {
		t.Fatalf("TLS server name without ServerName: %q", c2.tls.ServerName)
	}
}
