package l4d

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// setOf is a blacklist of addrs.
func setOf(addrs ...string) *blacklist.Set {
	var b blacklist.Builder
	for _, a := range addrs {
		b.AddAddr(netip.MustParseAddr(a), time.Time{})
	}
	return b.Build()
}

// blacklisted returns the datapath's count of packets dropped as blacklisted.
func (td *testDaemon) blacklisted() uint64 {
	td.t.Helper()
	return td.status().Packets["in/blacklisted"]
}

// dropsFrom injects a SYN from src to vip:port and reports whether it was dropped as
// blacklisted (the count went up within 5s and nothing was tunnelled).
func (td *testDaemon) dropsFrom(src string, sport uint16, vip string, port uint16) bool {
	td.t.Helper()
	before := td.blacklisted()
	td.injectSYN(src, sport, vip, port)
	deadline := time.Now().Add(5 * time.Second)
	for td.blacklisted() <= before {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return !td.tunnelled(0, "10.0.0.11", "10.0.0.12")
}

// TestControlBlacklist: l4d enforces the store's global list (the default of
// blacklists): a listed client's SYN is dropped and counted as blacklisted, an
// unlisted one's is tunnelled; a delta lists the second; the versions in force are in
// the node's status; restarted with the store down, l4d drops what it dropped before,
// from blacklist_dir.
func TestControlBlacklist(t *testing.T) {
	s, ep := openControlStore(t)
	rev := putObjects(t, s, l4Pool("l7", "10.0.0.11", "10.0.0.12"), l4Rule("web", "203.0.113.10", 443, "l7"))
	w := blsync.NewWriter(s, blsync.WriterConfig{Logger: slog.New(slog.DiscardHandler)})
	defer w.Wait()
	ctx := context.Background()
	v1, err := w.Replace(ctx, blacklist.GlobalName, setOf("192.0.2.66", "198.51.100.0"), "test")
	if err != nil {
		t.Fatal(err)
	}
	// A list l4d does not enforce.
	if _, err := w.Replace(ctx, "other", setOf("192.0.2.77"), "test"); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	cfg := controlConfig(ep, state)
	td := startWith(t, cfg)
	st := waitStatus(t, s, "l4-a", func(st agent.Status) bool {
		return st.AppliedRevision >= rev && st.Blacklists[blacklist.GlobalName] == v1
	})
	if _, ok := st.Blacklists["other"]; ok {
		t.Errorf("status reports list other, which l4d does not enforce: %v", st.Blacklists)
	}

	if !td.dropsFrom("192.0.2.66", 41000, "203.0.113.10", 443) {
		t.Error("a listed client's SYN was not dropped as blacklisted")
	}
	if !td.forwardsFrom("192.0.2.77", 41001, "203.0.113.10", 443, "10.0.0.11", "10.0.0.12") {
		t.Error("an unlisted client's SYN was not tunnelled")
	}
	td.want("GET", "/metrics", "", 200, `tiergate_l4_packets_total{dir="in",result="blacklisted"} 1`,
		`tiergate_blacklist_hits_total{list="global",source="packet"} 1`)
	td.want("GET", "/control", "", 200, fmt.Sprintf(`"global": %d`, v1))
	// The hit reported in the node's status (read every 5s).
	waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.BlacklistHits[blacklist.GlobalName] == 1 })

	// A delta lists the second client: its next new connection is dropped.
	v2, err := w.Delta(ctx, blacklist.GlobalName, &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("192.0.2.77/32")}}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.Blacklists[blacklist.GlobalName] == v2 })
	if !td.dropsFrom("192.0.2.77", 41002, "203.0.113.10", 443) {
		t.Error("a client listed by a delta: its SYN was not dropped")
	}
	if err := td.stop(); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// The store is down: the restarted l4d drops by the lists kept on disk.
	td = startWith(t, cfg)
	deadline := time.Now().Add(20 * time.Second)
	for fmt.Sprint(td.ruleNames()) != "[web]" {
		if time.Now().After(deadline) {
			t.Fatalf("rules %v with the store down, want the cached [web]", td.ruleNames())
		}
		time.Sleep(20 * time.Millisecond)
	}
	td.want("GET", "/control", "", 200, fmt.Sprintf(`"global": %d`, v2))
	if !td.dropsFrom("192.0.2.77", 41003, "203.0.113.10", 443) {
		t.Error("with the store down, a client on the list kept on disk: its SYN was not dropped")
	}
	if !td.forwardsFrom("192.0.2.99", 41004, "203.0.113.10", 443, "10.0.0.11", "10.0.0.12") {
		t.Error("with the store down, an unlisted client's SYN was not tunnelled")
	}
	if kept, _ := filepath.Glob(filepath.Join(state, "blacklists", "global.*")); len(kept) == 0 {
		t.Error("nothing of the global list kept in <state_dir>/blacklists")
	}
}

// TestBlacklistsConfig: blacklists and blacklist_dir need a control section, names
// are checked, [global] and <state_dir>/blacklists are the defaults, [] enforces none,
// and both are fixed at start.
func TestBlacklistsConfig(t *testing.T) {
	base := controlConfig("unix:///nowhere.sock", "/var/lib/x")
	c, err := ParseConfig([]byte(base), "l4d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(c.Blacklists) != "[global]" || c.BlacklistDir != "/var/lib/x/blacklists" {
		t.Errorf("defaults: blacklists %v, blacklist_dir %q", c.Blacklists, c.BlacklistDir)
	}
	none, err := ParseConfig([]byte(base+"blacklists: []\n"), "l4d.yaml")
	if err != nil || len(none.Blacklists) != 0 {
		t.Errorf("blacklists: []: %v, %v", none.Blacklists, err)
	}
	for _, tc := range []struct{ cfg, want string }{
		{strings.Replace(testConfig, "rules:", "blacklists: [global]\nrules:", 1), "blacklists: needs a control section"},
		{strings.Replace(testConfig, "rules:", "blacklist_dir: /tmp/x\nrules:", 1), "blacklist_dir: needs a control section"},
		{base + "blacklists: [global, global]\n", `blacklists[1]: "global" is named twice`},
		{base + "blacklists: [\"a/b\"]\n", "blacklists[0]: blacklist name"},
	} {
		if _, err := ParseConfig([]byte(tc.cfg), "l4d.yaml"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.cfg[max(0, len(tc.cfg)-60):], err, tc.want)
		}
	}
	path := filepath.Join(t.TempDir(), "l4d.yaml")
	writeFile(t, path, base)
	var out strings.Builder
	if err := (&Daemon{Path: path}).Check(&out); err != nil || !strings.Contains(out.String(), "blacklists from the control plane: global; last versions kept in /var/lib/x/blacklists") {
		t.Errorf("l4d check: %v\n%s", err, out.String())
	}
	other, _ := ParseConfig([]byte(base+"blacklists: [global, crowdsec]\n"), "l4d.yaml")
	if err := fixedChanges(c, other); err == nil || !strings.Contains(err.Error(), "blacklists") {
		t.Errorf("a changed blacklists: %v, want a restart asked for", err)
	}
}
