package bird

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestConfig renders a router's configuration with every kind of peer, and bird
// itself parses it (`bird -p`).
func TestConfig(t *testing.T) {
	conf := Config{RouterID: "198.18.0.1", Address: "198.18.0.1", AS: 65000, Peers: []Peer{
		{Name: "lda", Address: "198.18.0.12", AS: 65001, Password: "s3cret-key"},
		{Name: "ldb", Address: "198.18.0.13", AS: 65001, TTLSecurity: true},
	}}.config()
	for _, want := range []string{"merge paths on;", "hold time 3;", "local 198.18.0.1 as 65000;",
		"protocol bgp lda from ld {\n\tneighbor 198.18.0.12 as 65001;\n\tpassword \"s3cret-key\";\n}",
		"protocol bgp ldb from ld {\n\tneighbor 198.18.0.13 as 65001;\n\tttl security on;\n}"} {
		if !strings.Contains(conf, want) {
			t.Errorf("configuration lacks %q:\n%s", want, conf)
		}
	}
	testenv.RequireCommand(t, "bird", "bird2")
	path := filepath.Join(t.TempDir(), "bird.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("bird", "-p", "-c", path).CombinedOutput(); err != nil {
		t.Fatalf("bird -p: %v: %s\n%s", err, out, conf)
	}
}

// TestCheck refuses what bird's configuration cannot carry.
func TestCheck(t *testing.T) {
	for _, p := range []Peer{{Name: "ld-a"}, {Name: ""}, {Name: "lda", Password: `se"cret`}, {Name: "lda", Password: `a\b`}} {
		if err := (Config{Peers: []Peer{p}}).check(); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	if err := (Config{Peers: []Peer{{Name: "ld_a1", Password: "ok-key"}}}).check(); err != nil {
		t.Error(err)
	}
}

// TestParseNextHops: a plain route, a multipath one (sorted), none.
func TestParseNextHops(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want []string
	}{
		{`[{"dst":"203.0.113.10","gateway":"198.18.0.2","dev":"br0"}]`, []string{"198.18.0.2"}},
		{`[{"dst":"203.0.113.10","nexthops":[{"gateway":"198.18.0.3"},{"gateway":"198.18.0.2"}]}]` + "\n", []string{"198.18.0.2", "198.18.0.3"}},
		{"[ ]\n", nil},
		{"", nil},
	} {
		got, err := ParseNextHops([]byte(tc.out))
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.out, got, err, tc.want)
		}
	}
	if _, err := ParseNextHops([]byte("Error: ipv4: FIB table does not exist.")); err == nil {
		t.Error("text that is not JSON: no error")
	}
}
