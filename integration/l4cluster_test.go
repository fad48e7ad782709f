package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/bird"
	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// The L4 cluster's test network, all in namespaces:
//
//	cl (client 198.18.2.10) ── c0 ─ rc (198.18.2.1)
//	rt: router, bird2 (AS 65000), ECMP hashing on L4; bridge br0 198.18.0.1/24
//	 ├── lda: x0 (l4d's DPDK net_af_packet port, 198.18.0.2 in the datapath)
//	 │        k0 (the kernel's 198.18.0.12: l4d's BGP session, TCP MD5)
//	 │        i0 (DPDK, 198.18.1.1: the tunnel to the L7 nodes)
//	 └── ldb: x0 (198.18.0.3), k0 (198.18.0.13: BGP with TTL security), i0 (198.18.1.2)
//	sw: bridge br1 (backend 198.18.1.100:8080) ── the LDs' i0,
//	    l7a (198.18.1.11, l7d + tunnel endpoint), l7b (198.18.1.12)
//
// Each l4d (AS 65001) announces VIP 203.0.113.10/32 with its datapath's address as
// next hop; bird merges the two paths into one multipath route in rt's kernel, which
// spreads the client's connections over both LDs.
const (
	clusterVIP    = "203.0.113.10"
	clusterPrefix = clusterVIP + "/32"
)

// clusterLDNet is what buildClusterNet needs of an LD: its namespace, its kernel
// address towards the router (the BGP session's) and, with session sync, its
// kernel address on the switch (none: no sync port).
type clusterLDNet struct {
	ns                *netns.NS
	session, syncAddr string
}

// buildClusterNet wires the L4 cluster tests' network (drawn above): each LD's
// DPDK port x0 and BGP port k0 on the router's bridge, its DPDK port i0 (and its
// sync port m0) on the switch's, the client behind the router (ECMP by the
// 5-tuple), the L7 nodes at 198.18.1.11 and up on the switch, and the backend.
func buildClusterNet(t *testing.T, rt, cl, sw *netns.NS, l7 []*netns.NS, lds []clusterLDNet) {
	t.Helper()
	// Frames the LDs receive must be whole and checksummed (a packet socket sees
	// no offload): offloads off wherever their frames come from.
	offloadsOff := func(ns *netns.NS, devs ...string) {
		for _, dev := range devs {
			ns.MustRun("ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off")
		}
	}
	var rtPorts, swPorts []string
	for i, ld := range lds {
		x, k, s := fmt.Sprintf("r%dx", i), fmt.Sprintf("r%dk", i), fmt.Sprintf("s%d", i)
		netns.Veth(t, ld.ns, "x0", rt, x)
		netns.Veth(t, ld.ns, "k0", rt, k)
		netns.Veth(t, ld.ns, "i0", sw, s)
		rtPorts = append(rtPorts, x, k)
		swPorts = append(swPorts, s)
		offloadsOff(rt, x)
		offloadsOff(sw, s)
		// x0 and i0 are the datapath's: no kernel address, no IPv6 chatter, no
		// ARP answers from the kernel for k0's address.
		for _, dev := range []string{"x0", "i0"} {
			ld.ns.Sysctl("net.ipv6.conf."+dev+".disable_ipv6", "1")
			ld.ns.Sysctl("net.ipv4.conf."+dev+".arp_ignore", "1")
			offloadsOff(ld.ns, dev)
		}
		ld.ns.Addr("k0", ld.session+"/24")
		if ld.syncAddr != "" {
			m := fmt.Sprintf("m%d", i)
			netns.Veth(t, ld.ns, "m0", sw, m)
			swPorts = append(swPorts, m)
			ld.ns.Addr("m0", ld.syncAddr+"/24")
		}
	}
	netns.Bridge(t, rt, "br0", rtPorts...)
	rt.Addr("br0", "198.18.0.1/24")
	netns.Veth(t, cl, "c0", rt, "rc")
	offloadsOff(cl, "c0")
	offloadsOff(rt, "rc")
	cl.Addr("c0", "198.18.2.10/24")
	cl.Route("add", "203.0.113.0/24", "via", "198.18.2.1")
	rt.Addr("rc", "198.18.2.1/24")
	rt.Sysctl("net.ipv4.ip_forward", "1")
	// ECMP by the 5-tuple, so one client's connections spread over the LDs.
	rt.Sysctl("net.ipv4.fib_multipath_hash_policy", "1")
	for i, ns := range l7 {
		dev := fmt.Sprintf("l%d", i)
		netns.Veth(t, ns, "e0", sw, dev)
		offloadsOff(ns, "e0")
		offloadsOff(sw, dev)
		ns.Addr("e0", fmt.Sprintf("198.18.1.%d/24", 11+i))
		swPorts = append(swPorts, dev)
	}
	netns.Bridge(t, sw, "br1", swPorts...)
	sw.Addr("br1", "198.18.1.100/24")
	startL4Backend(t, sw)
}

// clusterLD is one LD of the cluster test.
type clusterLD struct {
	name     string
	ns       *netns.NS
	nextHop  string // the datapath's address, announced as next hop
	session  string // the kernel's address, the BGP session's
	internal string // the datapath's address towards the L7 nodes
	d        *daemon
	http     *http.Client
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
// table gets one multipath route for the VIP via both LDs, and the client's
// connections spread over both; a drained LD's path is withdrawn (over a session
// that stays up) and comes back on undrain; an LD stopped with SIGTERM withdraws its
// path while it still runs, and forwards for withdraw_delay, so that no request
// fails during either, not even one whose connection ECMP moved half-way. Started
// again it announces again; an LD that hangs loses its path to the router's hold
// timer.
func TestL4ClusterBGP(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "ethtool", "ethtool")
	testenv.RequireCommand(t, "bird", "bird2")
	testenv.RequireFile(t, "/usr/include/dpdk/rte_eal.h", "libdpdk-dev")
	bin := binaries(t)

	rt, cl, sw := netns.New(t, "rt"), netns.New(t, "cl"), netns.New(t, "sw")
	l7 := []*netns.NS{netns.New(t, "l7a"), netns.New(t, "l7b")}
	lds := []*clusterLD{
		{name: "lda", ns: netns.New(t, "lda"), nextHop: "198.18.0.2", session: "198.18.0.12", internal: "198.18.1.1"},
		{name: "ldb", ns: netns.New(t, "ldb"), nextHop: "198.18.0.3", session: "198.18.0.13", internal: "198.18.1.2"},
	}
	buildClusterNet(t, rt, cl, sw, l7, []clusterLDNet{{lds[0].ns, lds[0].session, ""}, {lds[1].ns, lds[1].session, ""}})

	site := newSite(t)
	cert := site.cert(t, "cluster", ecKey(t), true, "l4.test")
	key := strings.TrimSuffix(cert, ".pem") + ".key"
	for i, ns := range l7 {
		cfg := filepath.Join(t.TempDir(), "l7d.yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
listeners: [{addr: "0.0.0.0:443", pool: web}]
backends: {web: {members: ["%s"]}}
certificates: {certificates: [{cert_file: "%s", key_file: "%s"}]}
tunnel: {vips: [%s], lds: ["198.18.1.1", "198.18.1.2"]}
admin_listen: "127.0.0.1:9241"
admin_insecure: true           # the node's own namespace
shutdown_grace: 2s
`, l4BackendAddr, cert, key, clusterVIP)), 0o600); err != nil {
			t.Fatal(err)
		}
		nsDaemon(t, ns, fmt.Sprintf("l7d-%c", 'a'+i), "http://127.0.0.1:9241/healthz", filepath.Join(bin, "l7d"), "run", "-config", cfg)
	}

	// Hold time 6 s, not BGP's shortest 3 s: nothing here measures failover, and a
	// session must not drop on a loaded machine between two checks. BFD (l4d's
	// defaults, 300 ms x 3) beside each session takes a hung LD out in about a
	// second.
	const password = "tiergate-bgp-md5"
	const holdTime = 6 * time.Second
	bfdTimers := &bird.BFD{MinRx: 300 * time.Millisecond, MinTx: 300 * time.Millisecond, Multiplier: 3}
	bfdDetect := time.Duration(bfdTimers.Multiplier) * bfdTimers.MinRx
	router := bird.Start(t, rt, bird.Config{RouterID: "198.18.0.1", Address: "198.18.0.1", AS: 65000, HoldTime: 6,
		BFD: bfdTimers,
		Peers: []bird.Peer{
			{Name: "lda", Address: lds[0].session, AS: 65001, Password: password, BFD: true},
			{Name: "ldb", Address: lds[1].session, AS: 65001, TTLSecurity: true, BFD: true},
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
  eal_args: ["--no-pci", "--no-huge", "-m", "256", "--no-telemetry", "--log-level=warning",
             "--vdev=net_af_packet0,iface=x0", "--vdev=net_af_packet1,iface=i0"]
conntrack: {capacity: 4096}
ports:
  external: {device: net_af_packet0, addr: "%s/24", gateway: "198.18.0.1"}
  internal: {device: net_af_packet1, addr: "%s/24"}
rules:
  - {name: https, vip: "%s", protocol: tcp, port: 443, pool: l7}
pools:
  l7:
    members:
      - {name: a, address: "198.18.1.11"}
      - {name: b, address: "198.18.1.12"}
    health: {type: none}
bgp:
  asn: 65001
  withdraw_delay: 5s             # ample for the test to see the session up after the withdrawal
  check_interval: 200ms
  bfd: {enabled: true}           # 300ms x 3
  peers:
    - {address: 198.18.0.1, as: 65000, hold_time: 6s, connect_retry: 1s, %s}
`, dir, ld.nextHop, ld.internal, clusterVIP, security)), 0o600); err != nil {
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
	// BFD is up at both ends of both sessions.
	waitFor(t, 30*time.Second, "BFD up with both LDs", func() bool {
		sessions, _ := router.BFDSessions()
		return sessions[lds[0].session] == "Up" && sessions[lds[1].session] == "Up" &&
			scrapeWith(lds[0].http, "http://127.0.0.1:9180/metrics", "tiergate_l4_bfd_session_up") == 1 &&
			scrapeWith(lds[1].http, "http://127.0.0.1:9180/metrics", "tiergate_l4_bfd_session_up") == 1
	})
	if st := lds[0].get(t, "/bgp"); !strings.Contains(st, `"bfd": {`) || !strings.Contains(st, `"detect_time_ms": 900`) {
		t.Errorf("lda: GET /bgp shows no BFD session up with 300 ms x 3:\n%s", st)
	}

	// The client's new connections spread over both LDs (and through them to the
	// L7 nodes), each served with the client's address.
	tlsCfg := &tls.Config{RootCAs: site.pool(), ServerName: "l4.test"}
	url := "https://" + clusterVIP + "/"
	fresh := nsClient(cl, tlsCfg, false)
	waitFor(t, 30*time.Second, "the first request through the VIP", func() bool {
		_, _, err := l4Get(fresh, url)
		return err == nil
	})
	for i := range 32 {
		if _, real, err := l4Get(fresh, url); err != nil || real != "198.18.2.10" {
			t.Fatalf("request %d: %v (X-Real-IP %q)\nlda:\n%s\nldb:\n%s", i, err, real, lds[0].d.logTail(), lds[1].d.logTail())
		}
	}
	newFlows := func(ld *clusterLD) float64 {
		return scrapeWith(ld.http, "http://127.0.0.1:9180/metrics", "tiergate_l4_rule_new_flows_total", `rule="https"`)
	}
	waitFor(t, 10*time.Second, "new flows counted at both LDs", func() bool { return newFlows(lds[0]) > 0 && newFlows(lds[1]) > 0 })

	// Drain: lda's path goes, over a session that stays up; undrain brings it back.
	// Requests go on meanwhile, each on a new connection, and none fails.
	load := startClusterLoad(fresh, url)
	load.waitOK(t, 5)
	if st := lds[0].post(t, "/drain"); !strings.Contains(st, `"reason": "drain"`) {
		t.Fatalf("POST /drain:\n%s", st)
	}
	waitNextHops("lda drained", "198.18.0.3")
	if !router.Established("lda") {
		t.Fatalf("the drain took lda's session down:\n%s", router.LogTail())
	}
	load.waitOK(t, 5)
	lds[0].post(t, "/undrain")
	waitNextHops("lda undrained", "198.18.0.2", "198.18.0.3")
	load.waitOK(t, 5)
	load.finish(t, "during the drain")

	// SIGTERM: ldb withdraws its path while it still runs (its session up, the
	// process alive), then stops within withdraw_delay and a few seconds.
	ldb := lds[1]
	load = startClusterLoad(fresh, url)
	load.waitOK(t, 5)
	sigterm := time.Now()
	ldb.d.signal(syscall.SIGTERM)
	waitNextHops("ldb stopping", "198.18.0.2")
	t.Logf("ldb's path withdrawn %v after SIGTERM", time.Since(sigterm).Round(time.Millisecond))
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
	t.Logf("ldb exited %v after SIGTERM", time.Since(sigterm).Round(time.Millisecond))
	if !strings.Contains(ldb.d.logTail(), "VIPs withdrawn from BGP") {
		t.Errorf("ldb's log does not say it withdrew:\n%s", ldb.d.logTail())
	}
	waitNextHops("ldb stopped", "198.18.0.2")
	load.waitOK(t, 5)
	if !load.finish(t, "while ldb stopped") {
		dumpMetrics(t, "lda", lds[0].http, "http://127.0.0.1:9180/metrics", "tiergate_l4_packets_total", "tiergate_l4_rule_new_flows_total")
		for i, ns := range l7 {
			dumpMetrics(t, fmt.Sprintf("l7d-%c", 'a'+i), nsClient(ns, nil, false), "http://127.0.0.1:9241/metrics", "tiergate_l7_tunnel")
		}
	}

	// ldb started again announces again.
	ldb.d.start()
	waitNextHops("ldb restarted", "198.18.0.2", "198.18.0.3")

	// An LD that hangs (stopped: no keepalives, no BFD packets, its session never
	// closed) loses its path when the router's BFD session times out, well before
	// the hold timer would have it, and the other LD serves.
	lda := lds[0]
	waitFor(t, 30*time.Second, "BFD up with lda", func() bool {
		sessions, _ := router.BFDSessions()
		return sessions[lda.session] == "Up"
	})
	if err := lda.d.proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	hung := time.Now()
	waitNextHops("lda hung", "198.18.0.3")
	took := time.Since(hung)
	t.Logf("lda's path gone %v after it hung (BFD detection time %v, hold time %v)", took.Round(time.Millisecond), bfdDetect, holdTime)
	if took > bfdDetect+3*time.Second {
		t.Errorf("lda's path went %v after it hung, more than BFD's detection time %v and 3 s (hold time %v)\n%s", took, bfdDetect, holdTime, router.LogTail())
	}
	lda.d.kill()
	if _, _, err := l4Get(fresh, url); err != nil {
		t.Errorf("request through ldb alone: %v", err)
	}
}

// dumpMetrics logs the samples at url whose names begin with one of prefixes.
func dumpMetrics(t *testing.T, who string, c *http.Client, url string, prefixes ...string) {
	resp, err := c.Get(url)
	if err != nil {
		t.Logf("%s: %v", who, err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var keep []string
	for line := range strings.SplitSeq(string(body), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				keep = append(keep, line)
			}
		}
	}
	t.Logf("%s metrics:\n%s", who, strings.Join(keep, "\n"))
}

// clusterLoad makes requests through the VIP one after the other, each on a new
// connection, until stopped, and keeps what failed and when it started (after a
// failure it pauses 20 ms, so a window of failures is not a busy loop).
type clusterLoad struct {
	stop, done chan struct{}
	ok         atomic.Int64
	mu         sync.Mutex
	errs       []string
	failed     []time.Time // when each of errs started
	slowest    time.Duration
}

func startClusterLoad(c *http.Client, url string) *clusterLoad {
	l := &clusterLoad{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			start := time.Now()
			_, _, err := l4Get(c, url)
			took := time.Since(start)
			l.mu.Lock()
			l.slowest = max(l.slowest, took)
			if err != nil {
				l.errs = append(l.errs, fmt.Sprintf("started %s: %v", start.Format("15:04:05.000"), err))
				l.failed = append(l.failed, start)
			}
			l.mu.Unlock()
			if err != nil {
				time.Sleep(20 * time.Millisecond)
			} else {
				l.ok.Add(1)
			}
		}
	}()
	return l
}

// end stops the requests and waits for the last one.
func (l *clusterLoad) end() {
	close(l.stop)
	<-l.done
}

// waitOK waits for n more requests to succeed.
func (l *clusterLoad) waitOK(t *testing.T, n int64) {
	t.Helper()
	want := l.ok.Load() + n
	waitFor(t, 30*time.Second, fmt.Sprintf("%d more requests through the VIP", n), func() bool { return l.ok.Load() >= want })
}

// finish stops the requests and fails the test if any failed; it reports whether
// none did.
func (l *clusterLoad) finish(t *testing.T, when string) bool {
	t.Helper()
	l.end()
	if len(l.errs) > 0 {
		t.Errorf("%d of %d requests failed %s: %s", len(l.errs), int(l.ok.Load())+len(l.errs), when, strings.Join(l.errs, "; "))
		return false
	}
	t.Logf("%d requests %s, none failed; the slowest took %v", l.ok.Load(), when, l.slowest.Round(time.Millisecond))
	return true
}
