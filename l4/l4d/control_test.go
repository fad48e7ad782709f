package l4d

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/packet"
)

// controlConfig is testConfig with its rules and pools from the control plane at
// endpoint, as node l4-a, keeping its state (the cache file) in stateDir.
func controlConfig(endpoint, stateDir string) string {
	cfg, _, _ := strings.Cut(testConfig, "rules:\n")
	return cfg + fmt.Sprintf("state_dir: %q\ncontrol:\n  node: l4-a\n  etcd_endpoints: [%q]\n  dial_timeout: 1s\n", stateDir, endpoint)
}

// openControlStore opens an embedded store in a directory of the test's and returns
// it with the endpoint nodes reach it at.
func openControlStore(t *testing.T) (*store.Store, string) {
	t.Helper()
	s, err := store.Open(context.Background(), store.Config{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, s.Client().Endpoints()[0]
}

// putObjects writes objs in one change set and returns its revision.
func putObjects(t *testing.T, s *store.Store, objs ...model.Object) int64 {
	t.Helper()
	var cs store.ChangeSet
	for _, o := range objs {
		c, err := model.Put(o, store.Any)
		if err != nil {
			t.Fatal(err)
		}
		cs.Changes = append(cs.Changes, c)
	}
	rev, err := s.Commit(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func l4Rule(name, vip string, port uint16, pool string) *model.L4Rule {
	return &model.L4Rule{RuleConfig: datapath.RuleConfig{Name: name, VIP: netip.MustParseAddr(vip), Protocol: "tcp", Port: port, Pool: pool}}
}

// l4Pool is a pool of members m0, m1, ... at addresses, with static MACs (no ARP).
func l4Pool(name string, members ...string) *model.L4Pool {
	p := &model.L4Pool{Name: name}
	for i, m := range members {
		p.Members = append(p.Members, datapath.MemberConfig{Name: fmt.Sprintf("m%d", i), Address: netip.MustParseAddr(m),
			MAC: packet.MAC{2, 0, 0, 0, 1, byte(i)}})
	}
	p.Health.Type = "none"
	return p
}

// nodeStatus reads node's status from the store; ok is false while there is none.
func nodeStatus(t *testing.T, s *store.Store, node string) (st agent.Status, ok bool) {
	t.Helper()
	resp, err := s.Client().Get(context.Background(), agent.StatusKey(node))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return st, false
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &st); err != nil {
		t.Fatalf("status of %s: %v: %s", node, err, resp.Kvs[0].Value)
	}
	return st, true
}

// waitStatus waits until node's status in the store satisfies ok.
func waitStatus(t *testing.T, s *store.Store, node string, ok func(agent.Status) bool) agent.Status {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, found := nodeStatus(t, s, node)
		if found && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("status of %s in the store: %+v (found %v), not the one awaited", node, st, found)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// forwards injects a client's SYN to vip:port on the external port and reports
// whether the datapath tunnels it (GRE) to one of the members at addresses within
// 5s.
func (td *testDaemon) forwards(vip string, port uint16, members ...string) bool {
	td.t.Helper()
	return td.forwardsFrom("198.18.0.50", 40000+port%1000, vip, port, members...)
}

// forwardsFrom is forwards for a SYN from src:sport.
func (td *testDaemon) forwardsFrom(src string, sport uint16, vip string, port uint16, members ...string) bool {
	td.t.Helper()
	td.injectSYN(src, sport, vip, port)
	return td.tunnelled(5*time.Second, members...)
}

// injectSYN injects a client's SYN on the external port, the internal port's frames
// sent so far discarded.
func (td *testDaemon) injectSYN(src string, sport uint16, vip string, port uint16) {
	td.t.Helper()
	ip := &layers.IPv4{Version: 4, TTL: 60, Protocol: layers.IPProtocolTCP,
		SrcIP: netip.MustParseAddr(src).AsSlice(), DstIP: netip.MustParseAddr(vip).AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(port), SYN: true, Seq: 1000, Window: 64240}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 9}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, EthernetType: layers.EthernetTypeIPv4}
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, tcp); err != nil {
		td.t.Fatal(err)
	}
	td.ports.dev("internal").Drain()
	td.ports.dev("external").Inject(buf.Bytes())
}

// tunnelled reports whether the internal port sent GRE to one of members within wait.
func (td *testDaemon) tunnelled(wait time.Duration, members ...string) bool {
	internal := td.ports.dev("internal")
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		for _, f := range internal.Sent() {
			pk := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
			outer, _ := pk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
			if outer != nil && outer.Protocol == layers.IPProtocolGRE && slices.Contains(members, outer.DstIP.String()) {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// ruleNames returns the names of the rules the datapath forwards by, sorted.
func (td *testDaemon) ruleNames() []string {
	var names []string
	for _, r := range td.status().Rules {
		names = append(names, r.Name)
	}
	slices.Sort(names)
	return names
}

// TestControlRules: with a control section, l4d forwards by the rules and pools in
// the store: a change set is in force in the datapath and reported as applied; a
// snapshot l4d cannot apply (a VIP of a family it has no address of, which the
// cluster's own check lets through) is reported refused with the object named, and
// the rules in force stay; the admin API does not change rules or pools.
func TestControlRules(t *testing.T) {
	s, ep := openControlStore(t)
	rev := putObjects(t, s, l4Pool("l7", "10.0.0.11", "10.0.0.12"), l4Rule("web", "203.0.113.10", 443, "l7"))
	td := startWith(t, controlConfig(ep, t.TempDir()))

	st := waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.AppliedRevision >= rev })
	if st.Role != "l4d" || st.Address != td.AdminAddr().String() || st.Error != "" || st.Started.IsZero() {
		t.Errorf("status %+v: want role l4d, address %s (admin), a start time, no error", st, td.AdminAddr())
	}
	if got := td.ruleNames(); fmt.Sprint(got) != "[web]" {
		t.Errorf("datapath rules %v, want [web]", got)
	}
	if f := td.config(); len(f.Pools["l7"].Members) != 2 {
		t.Errorf("pools in force: %+v", f.Pools)
	}
	if !td.forwards("203.0.113.10", 443, "10.0.0.11", "10.0.0.12") {
		t.Error("a SYN to web's VIP was not tunnelled to a member")
	}
	td.want("GET", "/healthz", "", 200, "ok")
	td.want("GET", "/control", "", 200, `"node": "l4-a"`, `"role": "l4d"`, fmt.Sprintf(`"applied_revision": %d`, st.AppliedRevision))

	// A second rule and a third member.
	rev = putObjects(t, s, l4Pool("l7", "10.0.0.11", "10.0.0.12", "10.0.0.13"), l4Rule("alt", "203.0.113.11", 8443, "l7"))
	waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.AppliedRevision >= rev })
	if got := td.ruleNames(); fmt.Sprint(got) != "[alt web]" {
		t.Errorf("datapath rules %v, want [alt web]", got)
	}
	if n := len(td.member("l7", "m2").Name); n == 0 {
		t.Error("member m2 not in the datapath")
	}
	if !td.forwards("203.0.113.11", 8443, "10.0.0.11", "10.0.0.12", "10.0.0.13") {
		t.Error("a SYN to alt's VIP was not tunnelled to a member")
	}

	// l4d has no IPv6 address: the rule passes the cluster's check, not l4d's.
	bad := putObjects(t, s, l4Rule("v6", "2001:db8::10", 443, "l7"))
	st = waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.RefusedRevision == bad })
	if st.AppliedRevision != rev || !strings.Contains(st.Error, "l4-rules/v6.vip: 2001:db8::10 has no external address of its family") {
		t.Errorf("status after a snapshot l4d cannot apply: %+v", st)
	}
	if got := td.ruleNames(); fmt.Sprint(got) != "[alt web]" {
		t.Errorf("datapath rules after a refused snapshot: %v, want [alt web]", got)
	}
	td.want("GET", "/healthz", "", 200, "ok")
	td.want("GET", "/control", "", 200, fmt.Sprintf(`"refused_revision": %d`, bad), "has no external address")

	// The admin API reads rules and pools and changes none.
	before := td.config()
	for _, req := range []struct{ method, path, body string }{
		{"PUT", "/rules/dns", `{"vip": "203.0.113.12", "protocol": "udp", "port": 53, "pool": "l7"}`},
		{"DELETE", "/rules/web", ""},
		{"POST", "/pools/l7/members/m0/drain", ""},
		{"PUT", "/config", `{"rules": [], "pools": {}}`},
	} {
		apiErr(t, td.want(req.method, req.path, req.body, 409, "come from the control plane"), 409, codeControlPlane)
	}
	if after := td.config(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the admin API changed the configuration:\n%+v\n%+v", before, after)
	}

	// The fix is in force; a reload keeps the control plane's rules.
	rev = putObjects(t, s, l4Rule("v6", "203.0.113.16", 443, "l7"))
	waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.AppliedRevision >= rev && st.Error == "" })
	td.want("POST", "/reload", "", 200, `"name": "v6"`)
	if got := td.ruleNames(); fmt.Sprint(got) != "[alt v6 web]" {
		t.Errorf("datapath rules after a reload: %v, want [alt v6 web]", got)
	}
	td.want("GET", "/metrics", "", 200, `tiergate_l4_config_changes_total{result="error",source="control"} 1`)
}

// TestControlCache: l4d restarted while the store is out of reach forwards by the
// last snapshot it applied, kept in state_dir.
func TestControlCache(t *testing.T) {
	s, ep := openControlStore(t)
	rev := putObjects(t, s, l4Pool("l7", "10.0.0.11"), l4Rule("web", "203.0.113.10", 443, "l7"), l4Rule("alt", "203.0.113.11", 443, "l7"))
	state := t.TempDir()
	cfg := controlConfig(ep, state)
	td := startWith(t, cfg)
	waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.AppliedRevision >= rev })
	if err := td.stop(); err != nil {
		t.Fatal(err)
	}
	if _, found := nodeStatus(t, s, "l4-a"); found {
		t.Error("the status key stayed after the stop")
	}
	s.Close()

	td = startWith(t, cfg)
	deadline := time.Now().Add(20 * time.Second)
	for fmt.Sprint(td.ruleNames()) != "[alt web]" {
		if time.Now().After(deadline) {
			t.Fatalf("rules %v with the store down, want the cached [alt web]", td.ruleNames())
		}
		time.Sleep(20 * time.Millisecond)
	}
	td.want("GET", "/healthz", "", 200, "ok")
	td.want("GET", "/control", "", 200, filepath.Join(state, agent.CacheFileName), fmt.Sprintf(`"applied_revision": %d`, rev))
}

// TestControlNotYet: before a first snapshot l4d forwards nothing and says so on
// /healthz.
func TestControlNotYet(t *testing.T) {
	// Nothing listens there: the store is out of reach, and there is no cache.
	td := startWith(t, controlConfig("unix://"+filepath.Join(t.TempDir(), "none.sock"), t.TempDir()))
	td.want("GET", "/healthz", "", 503, "no configuration from the control plane yet")
	if got := td.ruleNames(); len(got) != 0 {
		t.Errorf("rules %v before any snapshot", got)
	}
}

// TestDPDKControl runs the l4d binary over DPDK fed by the control plane: the rules
// in the store reach its datapath, one it cannot apply is refused with the rules in
// force kept, and restarted with the store gone it forwards by its cached snapshot.
func TestDPDKControl(t *testing.T) {
	dir := t.TempDir()
	bin := requireDPDKBinary(t, dir)
	s, ep := openControlStore(t)
	rev := putObjects(t, s, l4Pool("l7", "10.0.0.11"), l4Rule("web", "198.18.0.10", 443, "l7"))

	cfg, _, _ := strings.Cut(dpdkConfig, "rules:")
	path := filepath.Join(dir, "l4d.yaml")
	writeFile(t, path, fmt.Sprintf("state_dir: %s\n%scontrol: {node: l4-dpdk, etcd_endpoints: [%q], dial_timeout: 1s}\n", dir, cfg, ep))
	var out strings.Builder
	check := exec.Command(bin, "check", "-config", path)
	check.Stdout = &out
	if err := check.Run(); err != nil || !strings.Contains(out.String(), "rules and pools from the control plane: node l4-dpdk") {
		t.Fatalf("l4d check: %v\n%s", err, out.String())
	}

	p := runL4d(t, bin, dir, path)
	st := waitStatus(t, s, "l4-dpdk", func(st agent.Status) bool { return st.AppliedRevision >= rev })
	// The revision a snapshot is read at may be past rev: the node's own status
	// write can come first.
	applied := st.AppliedRevision
	if st.Role != "l4d" || st.Address != strings.TrimPrefix(p.base, "http://") {
		t.Errorf("status %+v: want role l4d at %s", st, p.base)
	}
	p.waitHealthy()
	if _, body := p.get("/status"); !strings.Contains(body, `"name": "web"`) {
		t.Errorf("/status lacks the rule from the store:\n%s", body)
	}

	bad := putObjects(t, s, l4Rule("v6", "2001:db8::10", 443, "l7"))
	st = waitStatus(t, s, "l4-dpdk", func(st agent.Status) bool { return st.RefusedRevision == bad })
	if st.AppliedRevision != applied || !strings.Contains(st.Error, "l4-rules/v6.vip") {
		t.Errorf("status after a snapshot l4d cannot apply: %+v", st)
	}
	if _, body := p.get("/status"); !strings.Contains(body, `"name": "web"`) || strings.Contains(body, `"name": "v6"`) {
		t.Errorf("/status after a refused snapshot:\n%s", body)
	}
	p.terminate()

	// The store is gone: the restarted l4d forwards by the last snapshot it applied.
	s.Close()
	p = runL4d(t, bin, dir, path)
	p.waitHealthy()
	if _, body := p.get("/status"); !strings.Contains(body, `"name": "web"`) {
		t.Errorf("/status with the store gone lacks the cached rule:\n%s", body)
	}
	if _, body := p.get("/control"); !strings.Contains(body, fmt.Sprintf(`"applied_revision": %d`, applied)) {
		t.Errorf("/control with the store gone:\n%s", body)
	}
	p.terminate()
}
