package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/bird"
	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// The L4 cluster's BGP test network, all in namespaces:
//
//	rt: bird2 (AS 65000) on bridge br0, 198.18.0.1/24
//	 ├── lda: x0 (l4d's DPDK net_af_packet port, 198.18.0.2 in the datapath)
//	 │        k0 (the kernel's 198.18.0.12: l4d's BGP session, TCP MD5)
//	 └── ldb: x0 (198.18.0.3 in the datapath)
//	          k0 (198.18.0.13: BGP session with TTL security)
//
// Each l4d (AS 65001) announces VIP 203.0.113.10/32 with its datapath's address as
// next hop; bird merges the two paths into one multipath route in rt's kernel.
const (
	clusterVIP    = "203.0.113.10"
	clusterPrefix = clusterVIP + "/32"
)

// clusterLD is one LD of the cluster test.
type clusterLD struct {
	name    string
	ns      *netns.NS
	nextHop string // the datapath's address, announced as next hop
	session string // the kernel's address, the BGP session's
	d       *daemon
	http    *http.Client
}

func (ld *clusterLD) post(t *testing.T, path string) string {
	t.Helper()
	resp, err := ld.http.Post("http://127.0.0.1:9180"+path, "application/json", nil)
	if err != nil {
		t.Fatalf("%s: POST %s: %v", ld.name, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: POST %s: %s: %s", ld.name, path, resp.Status, body)
	}
	return string(body)
}

func (ld *clusterLD) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := ld.http.Get("http://127.0.0.1:9180" + path)
	if err != nil {
		t.Fatalf("%s: GET %s: %v", ld.name, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// TestL4ClusterBGP: two l4d peer with a real router (bird2); the router's kernel
// table gets one multipath route for the VIP via both LDs; a drained LD's path is
// withdrawn (over a session that stays up) and comes back on undrain; an LD stopped
// with SIGTERM withdraws its path while it still runs.
func TestL4ClusterBGP(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "ethtool", "ethtool")
	testenv.RequireCommand(t, "bird", "bird2")
	testenv.RequireFile(t, "/usr/include/dpdk/rte_eal.h", "libdpdk-dev")
	bin := binaries(t)

	rt := netns.New(t, "rt")
	lds := []*clusterLD{
		{name: "lda", ns: netns.New(t, "lda"), nextHop: "198.18.0.2", session: "198.18.0.12"},
		{name: "ldb", ns: netns.New(t, "ldb"), nextHop: "198.18.0.3", session: "198.18.0.13"},
	}
	var ports []string
	for i, ld := range lds {
		x, k := fmt.Sprintf("r%dx", i), fmt.Sprintf("r%dk", i)
		netns.Veth(t, ld.ns, "x0", rt, x)
		netns.Veth(t, ld.ns, "k0", rt, k)
		ports = append(ports, x, k)
		// x0 is the datapath's: no kernel address, no IPv6 chatter, no ARP
		// answers from the kernel for k0's address, whole checksummed frames.
		ld.ns.Sysctl("net.ipv6.conf.x0.disable_ipv6", "1")
		ld.ns.Sysctl("net.ipv4.conf.x0.arp_ignore", "1")
		ld.ns.MustRun("ethtool", "-K", "x0", "tx", "off", "tso", "off", "gso", "off", "gro", "off")
		ld.ns.Addr("k0", ld.session+"/24")
	}
	netns.Bridge(t, rt, "br0", ports...)
	rt.Addr("br0", "198.18.0.1/24")

	// Hold time 6 s, not BGP's shortest 3 s: nothing here measures failover, and a
	// session must not drop on a loaded machine between two checks.
	const password = "tiergate-bgp-md5"
	router := bird.Start(t, rt, bird.Config{RouterID: "198.18.0.1", Address: "198.18.0.1", AS: 65000, HoldTime: 6,
		Peers: []bird.Peer{
			{Name: "lda", Address: lds[0].session, AS: 65001, Password: password},
			{Name: "ldb", Address: lds[1].session, AS: 65001, TTLSecurity: true},
		}})

	for i, ld := range lds {
		dir := t.TempDir()
		security := "ttl_security: true"
		if i == 0 {
			pw := filepath.Join(dir, "bgp.key")
			if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			security = "password_file: " + pw
		}
		cfg := filepath.Join(dir, "l4d.yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
admin_listen: "127.0.0.1:9180"
admin_insecure: true           # the LD's own namespace
state_dir: "%s"
dpdk:
  eal_args: ["--no-pci", "--no-huge", "-m", "256", "--no-telemetry", "--log-level=warning", "--vdev=net_af_packet0,iface=x0"]
conntrack: {capacity: 4096}
ports:
  external: {device: net_af_packet0, addr: "%s/24", gateway: "198.18.0.1"}
rules:
  - {name: https, vip: "%s", protocol: tcp, port: 443, pool: l7}
pools:
  l7:
    members: [{name: a, address: "198.18.1.11"}]
    health: {type: none}
bgp:
  asn: 65001
  withdraw_delay: 5s             # ample for the test to see the session up after the withdrawal
  check_interval: 200ms
  peers:
    - {address: 198.18.0.1, as: 65000, hold_time: 6s, connect_retry: 1s, %s}
`, dir, ld.nextHop, clusterVIP, security)), 0o600); err != nil {
			t.Fatal(err)
		}
		ld.d = nsDaemon(t, ld.ns, ld.name, "http://127.0.0.1:9180/healthz", filepath.Join(bin, "l4d"), "run", "-config", cfg)
		ld.http = nsClient(ld.ns, nil, false)
	}

	// waitNextHops waits until the router's kernel route for the VIP goes via
	// exactly want (none: no route).
	waitNextHops := func(what string, want ...string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := router.NextHops(clusterPrefix)
			if err == nil && slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the router's route for %s goes via %v (%v), want %v\nip route:\n%s\nbird:\n%s\nlda:\n%s\nldb:\n%s",
					what, clusterPrefix, got, err, want, router.Routes(), router.LogTail(), lds[0].d.logTail(), lds[1].d.logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitNextHops("both LDs announcing", "198.18.0.2", "198.18.0.3")
	out, _ := rt.Run("ip", "route", "show", "exact", clusterPrefix)
	if strings.Count(out, clusterVIP) != 1 || !strings.Contains(out, "nexthop via 198.18.0.2") || !strings.Contains(out, "nexthop via 198.18.0.3") {
		t.Fatalf("want one multipath route for %s:\n%s", clusterPrefix, out)
	}
	for _, ld := range lds {
		if st := ld.get(t, "/bgp"); !strings.Contains(st, `"state": "established"`) || !strings.Contains(st, `"announced": true`) {
			t.Fatalf("%s: GET /bgp:\n%s", ld.name, st)
		}
	}

	// Drain: lda's path goes, over a session that stays up; undrain brings it back.
	if st := lds[0].post(t, "/drain"); !strings.Contains(st, `"reason": "drain"`) {
		t.Fatalf("POST /drain:\n%s", st)
	}
	waitNextHops("lda drained", "198.18.0.3")
	if !router.Established("lda") {
		t.Fatalf("the drain took lda's session down:\n%s", router.LogTail())
	}
	lds[0].post(t, "/undrain")
	waitNextHops("lda undrained", "198.18.0.2", "198.18.0.3")

	// SIGTERM: ldb withdraws its path while it still runs (its session up, the
	// process alive), then stops within withdraw_delay and a few seconds.
	ldb := lds[1]
	ldb.d.signal(syscall.SIGTERM)
	waitNextHops("ldb stopping", "198.18.0.2")
	select {
	case <-ldb.d.proc.Done():
		t.Fatalf("ldb exited before the router saw its path withdrawn:\n%s", ldb.d.logTail())
	default:
	}
	if !router.Established("ldb") {
		t.Errorf("ldb's path went with its session, not by a withdrawal:\n%s", router.LogTail())
	}
	select {
	case <-ldb.d.proc.Done():
		if err := ldb.d.proc.ExitErr(); err != nil {
			t.Errorf("ldb exited with %v\n%s", err, ldb.d.logTail())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("ldb did not stop after SIGTERM:\n%s", ldb.d.logTail())
	}
	ldb.d.proc = nil
	if !strings.Contains(ldb.d.logTail(), "VIPs withdrawn from BGP") {
		t.Errorf("ldb's log does not say it withdrew:\n%s", ldb.d.logTail())
	}
	waitNextHops("ldb stopped", "198.18.0.2")
}
