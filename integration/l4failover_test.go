package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/testkit/bird"
	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// The LD-loss test's network, all in namespaces (the BGP test's, with session sync
// and a third L7 node):
//
//	cl (client 198.18.2.10) ── c0 ─ rc (198.18.2.1)
//	rt: router, bird2 (AS 65000, hold time 3 s, BFD 300 ms x 3), ECMP on L4; bridge br0 198.18.0.1/24
//	 ├── lda: x0 (DPDK, 198.18.0.2), k0 (kernel 198.18.0.12: BGP)
//	 └── ldb: x0 (DPDK, 198.18.0.3), k0 (kernel 198.18.0.13: BGP)
//	sw: bridge br1 (backend 198.18.1.100:8080)
//	 ├── lda: i0 (DPDK, 198.18.1.1: the tunnel), m0 (kernel 198.18.1.21: session sync)
//	 ├── ldb: i0 (DPDK, 198.18.1.2), m0 (kernel 198.18.1.22)
//	 └── l7a, l7b, l7c (198.18.1.11..13, l7d + tunnel endpoint, QUIC server IDs 1..3)
//
// Both LDs start with the pool {a, b}; c joins it (a reload of both) once the long
// connections are synced, so consistent hashing alone would move some of them to c.

// Environment of the benchmark (bench/l4cluster runs this test as a child): the
// number of long connections, a file the figures are written to as JSON, and the
// BFD interval ("off": none, the router drops a dead LD at the hold timer).
const (
	failoverConnsEnv = "TIERGATE_FAILOVER_CONNS"
	failoverOutEnv   = "TIERGATE_FAILOVER_OUT"
	failoverBFDEnv   = "TIERGATE_FAILOVER_BFD"
)

// failoverHoldTime is the BGP hold time of the router and the LDs: 3 s, the
// shortest BGP allows.
const failoverHoldTime = 3 * time.Second

// failoverBFD is the BFD interval (min tx and min rx, at the router and the LDs)
// and multiplier: l4d's defaults, which a loaded 2-core machine keeps without
// flapping; the router drops a dead LD 0.9 s after its last packet.
const (
	failoverBFD     = 300 * time.Millisecond
	failoverBFDMult = 3
)

// FailoverResult is what the LD-loss scenario measured; bench/l4cluster reads it.
type FailoverResult struct {
	Conns            int     `json:"conns"`
	ConnsByProto     string  `json:"conns_by_proto"`
	HoldTimeS        float64 `json:"hold_time_s"`
	RouteDropS       float64 `json:"route_drop_s"`  // kill to the router's route via the survivor only
	FailoverS        float64 `json:"failover_s"`    // kill to the last long connection served again
	StalledP50S      float64 `json:"stalled_p50_s"` // of the connections stalled by the loss (served again > 0.5 s after it): the median
	Stalled          int     `json:"stalled_conns"`
	SurvivedPct      float64 `json:"long_conns_survived_pct"` // of the long connections, none redialled, none failed
	LongReqFailed    int     `json:"long_requests_failed"`    // requests on the long connections that failed, kill to the end
	NewConnFailed    int     `json:"new_conn_requests_failed"`
	NewConnFailedOut int     `json:"new_conn_failed_outside_window"`
	RejoinS          float64 `json:"rejoin_s"` // restart to the route via both again
	MovedByPool      int     `json:"pool_change_new_conns_to_c"`
	BFDIntervalMs    float64 `json:"bfd_interval_ms"` // 0: no BFD
	BFDMultiplier    int     `json:"bfd_multiplier"`
}

// foLD is one LD of the failover test.
type foLD struct {
	name, nextHop, session, internal, syncAddr string
	ns                                         *netns.NS
	cfg                                        string
	d                                          *daemon
	http                                       *http.Client
}

func (ld *foLD) metric(name string, matchers ...string) float64 {
	return scrapeWith(ld.http, "http://127.0.0.1:9180/metrics", name, matchers...)
}

// foConn is one long-lived client connection making a request every 200 ms.
type foConn struct {
	proto  string // h1, h2, h3
	client *http.Client
	close  func()
	dials  atomic.Int32
	redial []string // when the connection was made again, and with which local port

	mu      sync.Mutex
	node    string      // the L7 node that serves it
	lastOK  time.Time   // when its last request was answered
	okTimes []time.Time // answers, kept from mark on
	mark    time.Time
	errs    []string
	served  int
}

func (c *foConn) run(stop <-chan struct{}, url string, done *sync.WaitGroup) {
	defer done.Done()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		start := time.Now()
		node, err := c.get(url)
		now := time.Now()
		c.mu.Lock()
		switch {
		case err != nil:
			c.errs = append(c.errs, fmt.Sprintf("%s started %s: %v", c.proto, start.Format("15:04:05.000"), err))
		case c.node != "" && node != c.node:
			c.errs = append(c.errs, fmt.Sprintf("%s served by %s, before by %s", c.proto, node, c.node))
		default:
			c.node, c.lastOK = node, now
			c.served++
			if !c.mark.IsZero() && now.After(c.mark) {
				c.okTimes = append(c.okTimes, now)
			}
		}
		c.mu.Unlock()
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

func (c *foConn) get(url string) (string, error) {
	resp, err := c.client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if want := map[string]int{"h1": 1, "h2": 2, "h3": 3}[c.proto]; resp.ProtoMajor != want {
		return "", fmt.Errorf("answered in HTTP/%d", resp.ProtoMajor)
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %s: %s", resp.Status, body)
	}
	for _, f := range strings.Fields(string(body)) {
		if v, ok := strings.CutPrefix(f, "node="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("no node in %q", body)
}

// firstOKAfter returns the first answer after the mark, if any.
func (c *foConn) firstOKAfter() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.okTimes) == 0 {
		return time.Time{}, false
	}
	return c.okTimes[0], true
}

func (c *foConn) setMark(t time.Time) {
	c.mu.Lock()
	c.mark, c.okTimes = t, nil
	c.mu.Unlock()
}

func (c *foConn) servedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.served
}

// nsDialCounting dials inside ns and counts the dials: a long connection dialled
// more than once broke.
func nsDialCounting(ns *netns.NS, fc *foConn) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		n := fc.dials.Add(1)
		var c net.Conn
		err := ns.Do(func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		if n > 1 {
			fc.mu.Lock()
			local := "?"
			if c != nil {
				local = c.LocalAddr().String()
			}
			fc.redial = append(fc.redial, fmt.Sprintf("%s from %s", time.Now().Format("15:04:05.000"), local))
			fc.mu.Unlock()
		}
		return c, err
	}
}

// newFoConn makes a long connection's client; its connection is made at the first
// request. A request waits up to 60 s: through an LD's loss, TCP and QUIC retransmit
// into the window until the router moves the flow, and a connection whose client had
// nothing left to send (its request acknowledged, the answer lost in the dead LD)
// waits for the server's retransmissions, which go to the dead LD until a packet of
// the client's (its TCP keepalive, 15 s in Go) moves the flow's replies at the L7
// node: some 30 s at worst.
func newFoConn(t *testing.T, cl *netns.NS, proto string, tlsCfg *tls.Config) *foConn {
	c := &foConn{proto: proto}
	switch proto {
	case "h1", "h2":
		tr := &http.Transport{
			DialContext:       nsDialCounting(cl, c),
			TLSClientConfig:   tlsCfg.Clone(),
			MaxConnsPerHost:   1,
			ForceAttemptHTTP2: proto == "h2",
		}
		if proto == "h1" {
			tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		c.client = &http.Client{Transport: tr, Timeout: 60 * time.Second}
		c.close = tr.CloseIdleConnections
	case "h3":
		var conn *net.UDPConn
		cl.MustDo(func() error {
			var err error
			conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("198.18.2.10")})
			return err
		})
		qt := &quic.Transport{Conn: conn}
		h3 := &http3.Transport{
			TLSClientConfig: tlsCfg.Clone(),
			QUICConfig:      &quic.Config{MaxIdleTimeout: 30 * time.Second, KeepAlivePeriod: 5 * time.Second},
			Dial: func(ctx context.Context, addr string, tlsConf *tls.Config, qc *quic.Config) (*quic.Conn, error) {
				if c.dials.Add(1) > 1 {
					c.mu.Lock()
					c.redial = append(c.redial, time.Now().Format("15:04:05.000"))
					c.mu.Unlock()
				}
				ua, err := net.ResolveUDPAddr("udp", addr)
				if err != nil {
					return nil, err
				}
				return qt.DialEarly(ctx, ua, tlsConf, qc)
			},
		}
		c.client = &http.Client{Transport: h3, Timeout: 60 * time.Second}
		c.close = func() { h3.Close(); qt.Close() }
	}
	t.Cleanup(c.close)
	return c
}

// TestL4ClusterFailover: long-lived client connections (HTTP/1.1, HTTP/2 and
// HTTP/3, a request every 200 ms each), spread over two LDs and synced between
// them, survive a pool change that would move some of them by hashing alone, then
// the loss of an LD (kill -9: the router drops it when BFD times out) and its
// return (after its warm-up); new connections fail only between the kill and the
// router's dropping the dead LD.
func TestL4ClusterFailover(t *testing.T) {
	conns := 42
	if v := os.Getenv(failoverConnsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 3 {
			t.Fatalf("%s=%q: want a number ≥ 3", failoverConnsEnv, v)
		}
		conns = n
	}
	bfdInterval := failoverBFD
	switch v := os.Getenv(failoverBFDEnv); v {
	case "":
	case "off":
		bfdInterval = 0
	default:
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Millisecond {
			t.Fatalf("%s=%q: want a duration of at least 10ms, or off", failoverBFDEnv, v)
		}
		bfdInterval = d
	}
	res := runFailover(t, conns, bfdInterval)
	t.Logf("failover: %+v", res)
	if out := os.Getenv(failoverOutEnv); out != "" {
		data, _ := json.Marshal(res)
		if err := os.WriteFile(out, data, 0o644); err != nil {
			t.Error(err)
		}
	}
}

func runFailover(t *testing.T, conns int, bfdInterval time.Duration) FailoverResult {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "ethtool", "ethtool")
	testenv.RequireCommand(t, "bird", "bird2")
	testenv.RequireFile(t, "/usr/include/dpdk/rte_eal.h", "libdpdk-dev")
	bin := binaries(t)
	res := FailoverResult{Conns: conns, HoldTimeS: failoverHoldTime.Seconds()}
	var routerBFD *bird.BFD
	ldBFD := "{enabled: false}"
	if bfdInterval > 0 {
		routerBFD = &bird.BFD{MinRx: bfdInterval, MinTx: bfdInterval, Multiplier: failoverBFDMult}
		ldBFD = fmt.Sprintf("{enabled: true, min_tx: %v, min_rx: %v, multiplier: %d}", bfdInterval, bfdInterval, failoverBFDMult)
		res.BFDIntervalMs, res.BFDMultiplier = float64(bfdInterval.Milliseconds()), failoverBFDMult
	}

	rt, cl, sw := netns.New(t, "rt"), netns.New(t, "cl"), netns.New(t, "sw")
	l7 := []*netns.NS{netns.New(t, "l7a"), netns.New(t, "l7b"), netns.New(t, "l7c")}
	lds := []*foLD{
		{name: "lda", ns: netns.New(t, "lda"), nextHop: "198.18.0.2", session: "198.18.0.12", internal: "198.18.1.1", syncAddr: "198.18.1.21"},
		{name: "ldb", ns: netns.New(t, "ldb"), nextHop: "198.18.0.3", session: "198.18.0.13", internal: "198.18.1.2", syncAddr: "198.18.1.22"},
	}
	buildClusterNet(t, rt, cl, sw, l7, []clusterLDNet{{lds[0].ns, lds[0].session, lds[0].syncAddr}, {lds[1].ns, lds[1].session, lds[1].syncAddr}})

	site := newSite(t)
	cert := site.cert(t, "failover", ecKey(t), true, "l4.test")
	key := strings.TrimSuffix(cert, ".pem") + ".key"
	for i, ns := range l7 {
		cfg := filepath.Join(t.TempDir(), "l7d.yaml")
		// A dead LD's flows: their replies are copied to the live LD once the dead one
		// has been silent for ld_dead_after (1 s, the default), and follow a packet of
		// theirs through the live LD at once; move_idle 2s is only the fallback for a
		// flow whose LD still sends other traffic.
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
listeners: [{addr: "0.0.0.0:443", pool: web, quic_server_id: %d}]
backends: {web: {members: ["%s"]}}
certificates: {certificates: [{cert_file: "%s", key_file: "%s"}]}
tunnel: {vips: [%s], lds: ["198.18.1.1", "198.18.1.2"], move_idle: 2s}
admin_listen: "127.0.0.1:9241"
admin_insecure: true           # the node's own namespace
shutdown_grace: 2s
`, i+1, l4BackendAddr, cert, key, clusterVIP)), 0o600); err != nil {
			t.Fatal(err)
		}
		nsDaemon(t, ns, fmt.Sprintf("l7d-%c", 'a'+i), "http://127.0.0.1:9241/healthz", filepath.Join(bin, "l7d"), "run", "-config", cfg)
	}

	router := bird.Start(t, rt, bird.Config{RouterID: "198.18.0.1", Address: "198.18.0.1", AS: 65000, HoldTime: int(failoverHoldTime / time.Second),
		BFD: routerBFD,
		Peers: []bird.Peer{
			{Name: "lda", Address: lds[0].session, AS: 65001, BFD: routerBFD != nil},
			{Name: "ldb", Address: lds[1].session, AS: 65001, BFD: routerBFD != nil},
		}})

	syncKey := filepath.Join(t.TempDir(), "sync.key")
	if err := os.WriteFile(syncKey, []byte("tiergate failover test: a shared key of 32+ bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	members := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "      - {name: %c, address: \"198.18.1.%d\", quic_id: %d}\n", 'a'+i, 11+i, i+1)
		}
		return b.String()
	}
	writeLDConfig := func(ld *foLD, peer *foLD, nMembers int) {
		if err := os.WriteFile(ld.cfg, []byte(fmt.Sprintf(`
admin_listen: "127.0.0.1:9180"
admin_insecure: true           # the LD's own namespace
state_dir: "%s"
hash_seed: 16                  # the same on every LD of the cluster
dpdk:
  eal_args: ["--no-pci", "--no-huge", "-m", "256", "--no-telemetry", "--log-level=warning",
             "--vdev=net_af_packet0,iface=x0", "--vdev=net_af_packet1,iface=i0"]
conntrack: {capacity: 8192}
ports:
  external: {device: net_af_packet0, addr: "%s/24", gateway: "198.18.0.1"}
  internal: {device: net_af_packet1, addr: "%s/24"}
rules:
  - {name: https, vip: "%s", protocol: tcp, port: 443, pool: l7}
  - {name: quic, vip: "%s", protocol: udp, port: 443, pool: l7, quic: true}
pools:
  l7:
    members:
%s    health: {type: none}
sync:
  cluster_id: 16
  key_file: "%s"
  listen: "%s:9187"
  peers: ["%s:9187"]
  warmup_timeout: 5s           # the first LD up has no peer to sync from
bgp:
  asn: 65001
  withdraw_delay: 1s
  check_interval: 200ms
  bfd: %s
  peers:
    - {address: 198.18.0.1, as: 65000, hold_time: %ds, connect_retry: 1s}
`, filepath.Dir(ld.cfg), ld.nextHop, ld.internal, clusterVIP, clusterVIP, members(nMembers),
			syncKey, ld.syncAddr, peer.syncAddr, ldBFD, int(failoverHoldTime/time.Second))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i, ld := range lds {
		ld.cfg = filepath.Join(t.TempDir(), "l4d.yaml")
		writeLDConfig(ld, lds[1-i], 2)
		ld.d = nsDaemon(t, ld.ns, ld.name, "http://127.0.0.1:9180/healthz", filepath.Join(bin, "l4d"), "run", "-config", ld.cfg)
		ld.http = nsClient(ld.ns, nil, false)
	}
	logs := func() string {
		return fmt.Sprintf("ip route:\n%s\nbird:\n%s\nlda:\n%s\nldb:\n%s", router.Routes(), router.LogTail(), lds[0].d.logTail(), lds[1].d.logTail())
	}
	waitNextHops := func(what string, limit time.Duration, want ...string) time.Time {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			got, err := router.NextHops(clusterPrefix)
			if err == nil && slices.Equal(got, want) {
				return time.Now()
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the router's route for %s goes via %v (%v), want %v\n%s", what, clusterPrefix, got, err, want, logs())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitNextHops("both LDs announcing", 40*time.Second, "198.18.0.2", "198.18.0.3")
	if routerBFD != nil {
		waitFor(t, 30*time.Second, "BFD up with both LDs", func() bool {
			sessions, _ := router.BFDSessions()
			return sessions[lds[0].session] == "Up" && sessions[lds[1].session] == "Up"
		})
	}

	tlsCfg := &tls.Config{RootCAs: site.pool(), ServerName: "l4.test"}
	url := "https://" + clusterVIP + "/"
	fresh := nsClient(cl, tlsCfg, false)
	waitFor(t, 30*time.Second, "the first request through the VIP", func() bool {
		_, _, err := l4Get(fresh, url)
		return err == nil
	})

	// The long connections, a third of each protocol, started together.
	protos := []string{"h1", "h2", "h3"}
	long := make([]*foConn, conns)
	byProto := map[string]int{}
	for i := range long {
		long[i] = newFoConn(t, cl, protos[i%len(protos)], tlsCfg)
		byProto[long[i].proto]++
	}
	res.ConnsByProto = fmt.Sprintf("h1=%d h2=%d h3=%d", byProto["h1"], byProto["h2"], byProto["h3"])
	stop := make(chan struct{})
	var running sync.WaitGroup
	stopped := false
	stopLong := func() {
		if !stopped {
			stopped = true
			close(stop)
			running.Wait()
		}
	}
	t.Cleanup(stopLong)
	for _, c := range long {
		running.Add(1)
		go c.run(stop, url, &running)
	}
	waitFor(t, 60*time.Second, "every long connection served", func() bool {
		for _, c := range long {
			if c.servedCount() == 0 {
				return false
			}
		}
		return true
	})
	started := time.Now()
	newFlows := func(ld *foLD, rule string) float64 {
		return ld.metric("tiergate_l4_rule_new_flows_total", `rule="`+rule+`"`)
	}
	for _, rule := range []string{"https", "quic"} {
		if a, b := newFlows(lds[0], rule), newFlows(lds[1], rule); a <= 0 || b <= 0 {
			t.Fatalf("rule %s: new flows at lda %v, ldb %v: the long connections are not spread over both LDs", rule, a, b)
		}
	}
	// Older than sync_after (3 s) and sent: each LD has sent the other its
	// connections (each LD's own, at least one each way).
	waitFor(t, 30*time.Second, "the long connections synced both ways", func() bool {
		return time.Since(started) > 4*time.Second &&
			lds[0].metric("tiergate_l4_sync_installed_total") > 0 && lds[1].metric("tiergate_l4_sync_installed_total") > 0
	})
	synced := lds[0].metric("tiergate_l4_sync_installed_total") + lds[1].metric("tiergate_l4_sync_installed_total")
	t.Logf("entries installed from the peer: %v (lda %v, ldb %v)", synced, lds[0].metric("tiergate_l4_sync_installed_total"), lds[1].metric("tiergate_l4_sync_installed_total"))

	// The pool change: c joins the pool at both LDs. New connections reach c, so
	// hashing alone now maps some flows to c; the long ones stay where they are.
	for i, ld := range lds {
		writeLDConfig(ld, lds[1-i], 3)
		resp, err := ld.http.Post("http://127.0.0.1:9180/reload", "application/json", nil)
		if err != nil {
			t.Fatalf("%s: POST /reload: %v", ld.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: POST /reload: %s\n%s", ld.name, resp.Status, ld.d.logTail())
		}
	}
	waitFor(t, 30*time.Second, "a new connection served by l7c after the pool change", func() bool {
		node, _, err := l4Get(fresh, url)
		if err == nil && node == "198.18.1.13" {
			res.MovedByPool++
		}
		return res.MovedByPool > 0
	})

	// kill -9 lda with new connections going on. Every long connection is served
	// again through ldb once the router has dropped lda.
	load := startClusterLoad(fresh, url)
	waitFor(t, 30*time.Second, "new connections through the VIP", func() bool { return load.ok.Load() >= 5 })
	killed := time.Now()
	for _, c := range long {
		c.setMark(killed)
	}
	// The LD's machine is lost, not only its process: its kernel, which would
	// close the BGP session at once, goes with it (k0 down), so the router drops
	// it when BFD times out (or, without BFD, by the hold timer).
	routes := watchRoutes(t, rt, clusterVIP)
	lds[0].ns.MustRun("ip", "link", "set", "k0", "down")
	lds[0].d.kill()
	seen := waitNextHops("lda killed", 4*failoverHoldTime, "198.18.0.3")
	// When the route changed, to the millisecond (the poll above may lag behind
	// on a loaded machine): the router's own route event.
	dropped := routes.firstWithout("198.18.0.2", killed, seen)
	res.RouteDropS = dropped.Sub(killed).Seconds()
	waitFor(t, 90*time.Second, "every long connection served after the kill", func() bool {
		for _, c := range long {
			if _, ok := c.firstOKAfter(); !ok {
				return false
			}
		}
		return true
	})
	var last time.Time
	delays := map[string][]string{}
	var stalled []float64
	for _, c := range long {
		at, _ := c.firstOKAfter()
		if at.After(last) {
			last = at
		}
		if d := at.Sub(killed); d > 500*time.Millisecond {
			delays[c.proto] = append(delays[c.proto], fmt.Sprintf("%.2f", d.Seconds()))
			stalled = append(stalled, d.Seconds())
		}
	}
	t.Logf("long connections served again later than 0.5s after the kill (s): %v", delays)
	res.FailoverS = last.Sub(killed).Seconds()
	if res.Stalled = len(stalled); len(stalled) > 0 {
		slices.Sort(stalled)
		res.StalledP50S = stalled[len(stalled)/2]
	}
	if res.FailoverS > failoverHoldTime.Seconds()+1 {
		// Where the slow ones waited: the survivor's drops, the L7 nodes' tunnels.
		dumpMetrics(t, "ldb", lds[1].http, "http://127.0.0.1:9180/metrics", "tiergate_l4_packets_total", "tiergate_l4_sync", "tiergate_l4_connections")
		for i, ns := range l7 {
			dumpMetrics(t, fmt.Sprintf("l7d-%c", 'a'+i), nsClient(ns, nil, false), "http://127.0.0.1:9241/metrics", "tiergate_l7_tunnel_flow_moves", "tiergate_l7_tunnel_packets")
		}
	}
	// New connections succeed again after the window.
	okAt := load.ok.Load()
	waitFor(t, 30*time.Second, "new connections after the router dropped lda", func() bool { return load.ok.Load() >= okAt+5 })
	t.Logf("kill at %s, route via ldb only after %.2fs (seen by polling after %.2fs), the last long connection served again after %.2fs (hold time %v, BFD %v x %d)",
		killed.Format("15:04:05.000"), res.RouteDropS, seen.Sub(killed).Seconds(), res.FailoverS, failoverHoldTime, bfdInterval, res.BFDMultiplier)

	// Restart lda: after its warm-up (ldb's full sync) it announces again and
	// takes back the flows the router hashes to it.
	restarted := time.Now()
	t.Logf("restarting lda at %s", restarted.Format("15:04:05.000"))
	lds[0].ns.MustRun("ip", "link", "set", "k0", "up")
	lds[0].d.start()
	rejoined := waitNextHops("lda restarted", 60*time.Second, "198.18.0.2", "198.18.0.3")
	res.RejoinS = rejoined.Sub(restarted).Seconds()
	if v := lds[0].metric("tiergate_l4_sync_warmed_up"); v != 1 {
		t.Errorf("lda announces without being warmed up (tiergate_l4_sync_warmed_up %v)", v)
	}
	for _, c := range long {
		c.setMark(rejoined.Add(2 * time.Second))
	}
	waitFor(t, 60*time.Second, "every long connection served 2s after lda rejoined", func() bool {
		for _, c := range long {
			if _, ok := c.firstOKAfter(); !ok {
				return false
			}
		}
		return true
	})
	// lda was warmed up by ldb's full sync (every TCP long connection, lda's own
	// included, came back to it) and forwards again.
	if got, want := lds[0].metric("tiergate_l4_sync_installed_total"), byProto["h1"]+byProto["h2"]; got < float64(want) {
		t.Errorf("lda installed %v entries from ldb's full sync, want at least the %d TCP long connections", got, want)
	}
	if fwd := lds[0].metric("tiergate_l4_packets_total", `dir="in"`, `result="forwarded"`); fwd <= 0 {
		t.Errorf("lda took no traffic back after its restart (tiergate_l4_packets_total{dir=\"in\"} %v)", fwd)
	}
	load.end()
	stopLong()

	// The verdict.
	survived := 0
	for i, c := range long {
		c.mu.Lock()
		broke := c.dials.Load() != 1 || len(c.errs) > 0
		res.LongReqFailed += len(c.errs)
		if broke {
			t.Errorf("long connection %d (%s, node %s): dialled %d times (again at %s); failures: %s",
				i, c.proto, c.node, c.dials.Load(), strings.Join(c.redial, ", "), strings.Join(c.errs, "; "))
		} else {
			survived++
		}
		c.mu.Unlock()
	}
	res.SurvivedPct = 100 * float64(survived) / float64(len(long))
	if survived < len(long) {
		for _, ld := range lds {
			dumpMetrics(t, ld.name, ld.http, "http://127.0.0.1:9180/metrics", "tiergate_l4_packets_total", "tiergate_l4_sync_refused", "tiergate_l4_sync_dropped", "tiergate_l4_sync_installed", "tiergate_l4_connections")
		}
		for i, ns := range l7 {
			dumpMetrics(t, fmt.Sprintf("l7d-%c", 'a'+i), nsClient(ns, nil, false), "http://127.0.0.1:9241/metrics", "tiergate_l7_tunnel_flow_moves", "tiergate_l7_tunnel_packets")
		}
	}
	from, window := killed.Add(-500*time.Millisecond), dropped.Add(500*time.Millisecond)
	load.mu.Lock()
	res.NewConnFailed = len(load.failed)
	for i, at := range load.failed {
		if at.Before(from) || at.After(window) {
			res.NewConnFailedOut++
			t.Errorf("a new connection failed outside the window %s..%s: %s", from.Format("15:04:05.000"), window.Format("15:04:05.000"), load.errs[i])
		}
	}
	load.mu.Unlock()
	t.Logf("%d of %d new connections failed, all between the kill and the router's dropping lda", res.NewConnFailed, res.NewConnFailed+int(load.ok.Load()))
	if t.Failed() {
		t.Logf("%s", logs())
	}
	return res
}

// routeWatch records the route events of one destination in a namespace (`ip -ts
// monitor route`), with their times.
type routeWatch struct {
	mu     sync.Mutex
	events []routeEvent
}

type routeEvent struct {
	at   time.Time
	line string
}

func watchRoutes(t *testing.T, ns *netns.NS, dst string) *routeWatch {
	w := &routeWatch{}
	cmd := ns.Command("ip", "-ts", "monitor", "route")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("ip monitor in %s: %v", ns, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, dst) {
				continue
			}
			at := time.Now()
			// "[2026-12-01T17:57:05.013456] 203.0.113.10 via ..."
			if ts, rest, ok := strings.Cut(strings.TrimPrefix(line, "["), "]"); ok {
				if p, err := time.ParseInLocation("2006-01-02T15:04:05.000000", ts, time.Local); err == nil {
					at, line = p, strings.TrimSpace(rest)
				}
			}
			w.mu.Lock()
			w.events = append(w.events, routeEvent{at, line})
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-done
	})
	return w
}

// firstWithout returns the time of the first event after from that leaves gw out
// of the route (a deletion, or a route without it); fallback if there is none.
func (w *routeWatch) firstWithout(gw string, from, fallback time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.events {
		if e.at.After(from) && (strings.HasPrefix(e.line, "Deleted") || !strings.Contains(e.line, gw)) {
			return e.at
		}
	}
	return fallback
}
