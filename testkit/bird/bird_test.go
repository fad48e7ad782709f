package bird

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestConfig renders a router's configuration with every kind of peer, and bird
// itself parses it (`bird -p`).
func TestConfig(t *testing.T) {
	conf := Config{RouterID: "198.18.0.1", Address: "198.18.0.1", AS: 65000, Peers: []Peer{
		{Name: "lda", Address: "198.18.0.12", AS: 65001, Password: "s3cret-key"},
		{Name: "ldb", Address: "198.18.0.13", AS: 65001, TTLSecurity: true, BFD: true},
	}, BFD: &BFD{MinRx: 300 * time.Millisecond, MinTx: 300 * time.Millisecond, Multiplier: 3},
		Static: []Static{{Prefix: "203.0.113.20/32", Via: "198.18.0.14", BFD: true}}}.config()
	for _, want := range []string{"merge paths on;", "hold time 3;", "local 198.18.0.1 as 65000;",
		"protocol bgp lda from ld {\n\tneighbor 198.18.0.12 as 65001;\n\tpassword \"s3cret-key\";\n}",
		"protocol bgp ldb from ld {\n\tneighbor 198.18.0.13 as 65001;\n\tttl security on;\n\tbfd on;\n}",
		"min rx interval 300 ms;", "min tx interval 300 ms;", "multiplier 3;",
		"route 203.0.113.20/32 via 198.18.0.14 bfd;"} {
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
	if err := (Config{Peers: []Peer{{Name: "lda", BFD: true}}}).check(); err == nil {
		t.Error("a peer with BFD and a router without: accepted")
	}
	if err := (Config{BFD: &BFD{MinRx: time.Millisecond, MinTx: time.Millisecond}}).check(); err == nil {
		t.Error("BFD multiplier 0: accepted")
	}
}

// TestParseBFDSessions reads birdc's table of BFD sessions.
func TestParseBFDSessions(t *testing.T) {
	out := `BIRD 2.0.12 ready.
bfd1:
IP address                Interface  State      Since         Interval  Timeout
198.19.53.2               e0         Up         19:58:01.123    0.100    0.300
2001:db8::2               e1         Down       19:58:01.123    1.000    0.000
`
	got := ParseBFDSessions(out)
	if len(got) != 2 || got["198.19.53.2"] != "Up" || got["2001:db8::2"] != "Down" {
		t.Errorf("got %v", got)
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
