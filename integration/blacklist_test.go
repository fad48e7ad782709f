package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/control/crowdsec/crowdsectest"
	"github.com/tiergate/tiergate/internal/proc"
	"github.com/tiergate/tiergate/testkit/cluster"
	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// The blacklist test's clients, as the l7d nodes see them (in PROXY headers from
// loopback) and as l4d sees them (sources of packets from namespace cl).
const (
	blListed   = "198.18.0.1" // listed and unlisted by CrowdSec's decisions
	blUnlisted = "198.18.0.3" // never listed: its requests must all pass
	blBulk     = "198.18.0.5" // in the 1M-entry push
	blVIP      = "198.18.2.10"
	blL4Addr   = "198.18.0.2"
	blL4In     = "198.18.1.2"     // l4d's internal port
	blMember   = "198.18.1.11"    // l7-t, the l7d behind l4d's tunnel
	blTunnel   = "l7-t"           // its node name
	blBound    = 15 * time.Second // a decision enforced (or lifted) everywhere within
)

// blCluster is the blacklist test's cluster: controld a bouncer of a CrowdSec
// Local API, two l7d taking PROXY headers from loopback (the path that reaches
// l7d directly), and an l4d whose external port is a veth to namespace cl and its
// internal one a veth to namespace l7t (DPDK net_af_packet both), where a third
// l7d, l7-t, is the end of l4d's GRE tunnel: cl's clients reach it through l4d.
//
//	cl (clients 198.18.0.1, .3, .5) ── c0 ═ tgbl<pid> ─ l4d (198.18.0.2 | 198.18.1.2) ─ tgbi<pid> ═ t0 ── l7t (198.18.1.11, l7-t: tunnel, VIP 198.18.2.10)
type blCluster struct {
	*controlCluster
	lapi *crowdsectest.LAPI
	cl   *netns.NS
	l4   *cluster.L4
	l7t  *netns.NS
	tun  *daemon // l7-t
}

func startBlacklistCluster(t *testing.T) *blCluster {
	t.Helper()
	requireSoftHSM(t)
	lapi := crowdsectest.Start(t)
	bin := binaries(t)
	dir, err := os.MkdirTemp("", "tg-bl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("TIERGATE_KEEP") != "" {
			t.Logf("TIERGATE_KEEP: the cluster's files are in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{Bin: bin, Dir: dir, EtcdListen: true,
		ControldExtra: fmt.Sprintf("crowdsec:\n  lapi_url: %q\n  api_key_file: %q\n  list: global\n  poll_interval: 200ms\n", lapi.URL, lapi.KeyFile),
		L7ClientIP:    `{proxy_protocol: true, proxy_trusted: ["127.0.0.1"]}`})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	b := &blCluster{controlCluster: &controlCluster{Cluster: c, t: t, tgctl: filepath.Join(bin, "tgctl"), dir: t.TempDir(), backend: newEchoBackend(t)}, lapi: lapi}

	_, v1Cert, v1Key := b.site("v1", time.Time{}, time.Time{})
	b.upload(v1Cert, v1Key)
	b.admin(0, "apply", "-f", b.file("web.yaml", []byte(b.siteObjects(""))))
	for _, node := range []string{"l7-a", "l7-b"} {
		if _, err := c.AddL7(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range c.L7 {
		waitFor(t, 20*time.Second, l.Name+" serving through PROXY headers", func() bool { return b.get(l, blUnlisted) == nil })
	}
	b.startL4(ctx)
	return b
}

// startL4 starts l4d on a veth whose other end is in namespace cl, where the
// clients' three addresses are, and applies a rule for the VIP; it is nil (and
// the L4 checks skipped) without root or libdpdk.
func (b *blCluster) startL4(ctx context.Context) {
	t := b.t
	if os.Geteuid() != 0 || exec.Command("pkg-config", "--exists", "libdpdk").Run() != nil {
		if testenv.Strict() {
			t.Fatal("TIERGATE_REQUIRE_ALL=1 and the l4d node needs root and libdpdk (Debian package libdpdk-dev)")
		}
		t.Log("no l4d node: it needs root and libdpdk (Debian package libdpdk-dev)")
		return
	}
	testenv.RequireCommand(t, "ethtool", "ethtool")
	b.cl = netns.New(t, "cl")
	// The host's end, named after the process so that two runs do not collide.
	host := fmt.Sprintf("tgbl%d", os.Getpid()%100000)
	// Made from the host's side: its end stays in the test process's namespace.
	if out, err := exec.Command("ip", "link", "add", host, "type", "veth", "peer", "name", "c0", "netns", b.cl.Name()).CombinedOutput(); err != nil {
		t.Fatalf("veth %s to %s: %v\n%s", host, b.cl, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	if out, err := exec.Command("ip", "link", "set", host, "up").CombinedOutput(); err != nil {
		t.Fatalf("setting %s up: %v\n%s", host, err, out)
	}
	b.cl.Up("c0")
	for _, a := range []string{blListed, blUnlisted, blBulk} {
		b.cl.Addr("c0", a+"/24")
	}
	b.cl.Route("add", blVIP+"/32", "via", blL4Addr)
	b.cl.MustRun("ethtool", "-K", "c0", "tx", "off", "tso", "off", "gso", "off", "gro", "off")
	for _, args := range [][]string{
		{"sysctl", "-qw", "net.ipv6.conf." + host + ".disable_ipv6=1"},
		{"ethtool", "-K", host, "tx", "off", "tso", "off", "gso", "off", "gro", "off"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	// The internal port: a veth to namespace l7t, where l7-t ends the tunnel.
	in := fmt.Sprintf("tgbi%d", os.Getpid()%100000)
	b.l7t = netns.New(t, "l7t")
	netns.Veth(t, nil, in, b.l7t, "t0")
	b.l7t.Addr("t0", blMember+"/24")
	b.l7t.MustRun("ethtool", "-K", "t0", "tx", "off", "tso", "off", "gso", "off", "gro", "off")
	for _, args := range [][]string{
		{"sysctl", "-qw", "net.ipv6.conf." + in + ".disable_ipv6=1"},
		{"ethtool", "-K", in, "tx", "off", "tso", "off", "gso", "off", "gro", "off"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	b.startTunnelNode()
	l4, err := b.AddL4On(ctx, "l4-a", cluster.L4Ports{
		VDevs:    []string{"net_af_packet0,iface=" + host, "net_af_packet1,iface=" + in},
		External: "net_af_packet0", ExternalAddr: blL4Addr + "/24", Gateway: blUnlisted,
		Internal: "net_af_packet1", InternalAddr: blL4In + "/24",
		Blacklists: "[global, web]",
	})
	if err != nil {
		t.Fatal(err)
	}
	b.l4 = l4
	r := b.admin(0, "apply", "-o", "json", "-f", b.file("l4.yaml", []byte(`kind: l4-pools
name: l7
members: [{name: t, address: `+blMember+`}]
health: {type: none}
---
kind: l4-rules
name: https
vip: `+blVIP+`
protocol: tcp
port: 443
pool: l7
`)))
	var applied struct {
		Revision int64 `json:"revision"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &applied); err != nil || applied.Revision == 0 {
		t.Fatalf("apply -o json: %v\n%s", err, r)
	}
	b.waitNodes("l4-a applying the L4 rule", func(n map[string]nodeRow) bool {
		return n["l4-a"].State == "ok" && n["l4-a"].AppliedRevision >= applied.Revision
	})
	// The l4d sees the unlisted client's SYNs (and answers ARP for its address),
	// and tunnels its requests to l7-t, which answers through it.
	waitFor(t, 10*time.Second, "l4d counting the client's packets", func() bool {
		b.l4SYN(blUnlisted)
		return b.l4Packets(`!result="blacklisted"`) > 0
	})
	waitFor(t, 20*time.Second, "a request of the unlisted client through l4d and the tunnel to l7-t", func() bool {
		return b.getL4(blUnlisted) == nil
	})
}

// startTunnelNode starts l7-t in namespace l7t: an l7d fed by controld's store
// (its unix socket, which the namespace reaches), the end of l4d's tunnel for
// the VIP, serving listener web there with the clients' own addresses. What it
// reaches on the host's loopback (the keyservers, the backend) it reaches through
// relays listening on the same addresses in l7t.
func (b *blCluster) startTunnelNode() {
	t := b.t
	var servers []string
	for _, ks := range b.Keyservers {
		relayInto(t, b.l7t, ks.Addr)
		servers = append(servers, fmt.Sprintf("%q", ks.Addr))
	}
	relayInto(t, b.l7t, b.backend.addr)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "l7d.yaml")
	pki := b.KeyserverPKI
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`control:
  node: %s
  etcd_endpoints: [%q]
  dial_timeout: 1s
keyservers:
  servers: [%s]
  cert_file: %q
  key_file: %q
  ca_file: %q
node_listeners:
  web: {addr: "0.0.0.0:443"}
tunnel: {vips: [%s], lds: [%q]}
state_dir: %q
admin_listen: "127.0.0.1:9241"
log_level: debug
`, blTunnel, b.StoreEndpoint, strings.Join(servers, ", "), pki.ClientCert, pki.ClientKey, pki.ServerCAFile, blVIP, blL4In, filepath.Join(dir, "state"))), 0o600); err != nil {
		t.Fatal(err)
	}
	b.tun = nsDaemon(t, b.l7t, "l7d "+blTunnel, "http://127.0.0.1:9241/healthz", filepath.Join(binaries(t), "l7d"), "run", "-config", cfg)
	b.waitNodes(blTunnel+" applying the configuration", func(n map[string]nodeRow) bool { return n[blTunnel].State == "ok" })
}

// relayInto listens on addr (host:port) inside ns and relays each connection to
// addr as the test's own namespace reaches it, until the test ends.
func relayInto(t *testing.T, ns *netns.NS, addr string) {
	t.Helper()
	ln := ns.Listen(addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{})
				go func() {
					io.Copy(up, c)
					up.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				io.Copy(c, up)
				c.(*net.TCPConn).CloseWrite()
				<-done
			}()
		}
	}()
}

// getL4 sends one request from src in namespace cl to the VIP, through l4d and
// its tunnel to l7-t, on a new connection: nil when the backend answered it and
// l7-t saw src as the client.
func (b *blCluster) getL4(src string) error {
	var conn net.Conn
	if err := b.cl.Do(func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
		var err error
		conn, err = d.Dial("tcp", blVIP+":443")
		return err
	}); err != nil {
		return fmt.Errorf("through l4d for %s: %w", src, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(conn, &tls.Config{RootCAs: b.SiteCA.Pool(), ServerName: controlSite, NextProtos: []string{"http/1.1"}})
	if _, err := io.WriteString(tc, "GET /bl HTTP/1.1\r\nHost: "+controlSite+"\r\nConnection: close\r\n\r\n"); err != nil {
		return fmt.Errorf("through l4d for %s: %w", src, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return fmt.Errorf("through l4d for %s: %w", src, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e echo
	if resp.StatusCode != 200 || json.Unmarshal(body, &e) != nil || e.Path != "/bl" || e.XRealIP != src {
		return fmt.Errorf("through l4d for %s: %s %q", src, resp.Status, body)
	}
	return nil
}

// get sends one request through l with a PROXY header naming src as the client,
// on a new connection: nil when the backend answered it.
func (b *blCluster) get(l *cluster.L7, src string) error {
	conn, err := net.DialTimeout("tcp", l.Listen, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "PROXY TCP4 %s 127.0.0.1 40000 443\r\n", src); err != nil {
		return err
	}
	tc := tls.Client(conn, &tls.Config{RootCAs: b.SiteCA.Pool(), ServerName: controlSite, NextProtos: []string{"http/1.1"}})
	if _, err := io.WriteString(tc, "GET /bl HTTP/1.1\r\nHost: "+controlSite+"\r\nConnection: close\r\n\r\n"); err != nil {
		return fmt.Errorf("%s for %s: %w", l.Name, src, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return fmt.Errorf("%s for %s: %w", l.Name, src, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e echo
	if resp.StatusCode != 200 || json.Unmarshal(body, &e) != nil || e.Path != "/bl" {
		return fmt.Errorf("%s for %s: %s %q", l.Name, src, resp.Status, body)
	}
	return nil
}

// l7Hits is the blacklist hits l's metrics count.
func l7Hits(l *cluster.L7) float64 {
	return scrape("http://"+l.Admin+"/metrics", "tiergate_blacklist_hits_total")
}

// l4Packets is l4d's packets of the matchers' results (tiergate_l4_packets_total).
func (b *blCluster) l4Packets(matchers ...string) float64 {
	return scrape("http://"+b.l4.Admin+"/metrics", "tiergate_l4_packets_total", matchers...)
}

// l4SYN opens a TCP connection to the VIP from src in namespace cl, which sends
// one SYN; no answer comes (the members are behind a null device).
func (b *blCluster) l4SYN(src string) {
	b.cl.MustDo(func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 100 * time.Millisecond}
		if c, err := d.Dial("tcp", blVIP+":443"); err == nil {
			c.Close()
		}
		return nil
	})
}

// l4Blocks sends a SYN from src and reports whether l4d counted it as
// blacklisted (the workers publish their counters every 100ms).
func (b *blCluster) l4Blocks(src string) bool {
	before := b.l4Packets(`result="blacklisted"`)
	b.l4SYN(src)
	deadline := time.Now().Add(600 * time.Millisecond)
	for time.Now().Before(deadline) {
		if b.l4Packets(`result="blacklisted"`) > before {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// waitEnforced waits until src is refused (listed) or served (not) by every l7d
// running and by l4d, and returns how long that took.
func (b *blCluster) waitEnforced(what, src string, listed bool) time.Duration {
	b.t.Helper()
	start := time.Now()
	for _, l := range b.L7 {
		if !l.Running() {
			continue
		}
		waitFor(b.t, blBound, fmt.Sprintf("%s: %s %s by %s", what, src, map[bool]string{true: "refused", false: "served"}[listed], l.Name), func() bool {
			return (b.get(l, src) != nil) == listed
		})
	}
	if b.l4 != nil {
		waitFor(b.t, blBound, fmt.Sprintf("%s: %s's SYNs counted blacklisted (%v) by l4d", what, src, listed), func() bool {
			return b.l4Blocks(src) == listed
		})
		if !listed {
			waitFor(b.t, blBound, fmt.Sprintf("%s: %s served through l4d and l7-t", what, src), func() bool {
				return b.getL4(src) == nil
			})
		}
	}
	return time.Since(start)
}

// waitHits waits until the show of list name reports hits of each of nodes, and
// a total of at least their sum (the nodes write their hits every 5s).
func (b *blCluster) waitHits(name string, nodes ...string) blacklistShow {
	b.t.Helper()
	var s blacklistShow
	waitFor(b.t, blBound, fmt.Sprintf("hits of list %s reported by %v", name, nodes), func() bool {
		s = b.show(name)
		var sum uint64
		for _, want := range nodes {
			found := false
			for _, n := range s.Nodes {
				if n.Node == want && n.Hits > 0 {
					found = true
					sum += n.Hits
				}
			}
			if !found {
				return false
			}
		}
		return s.Hits >= sum
	})
	return s
}

// show is GET /v1/blacklists/{name}.
func (b *blCluster) show(name string) blacklistShow {
	b.t.Helper()
	var s blacklistShow
	if err := b.Call(context.Background(), "GET", "/v1/blacklists/"+name, nil, &s); err != nil {
		b.t.Fatal(err)
	}
	return s
}

type blacklistShow struct {
	Version int64  `json:"version"`
	Entries int64  `json:"entries"`
	Hits    uint64 `json:"hits"`
	Nodes   []struct {
		Node    string `json:"node"`
		Version int64  `json:"version"`
		State   string `json:"state"`
		Hits    uint64 `json:"hits"`
	} `json:"nodes"`
}

// nodeVersion is the version node reports of list name (0: none).
func (b *blCluster) nodeVersion(name, node string) int64 {
	for _, n := range b.show(name).Nodes {
		if n.Node == node {
			return n.Version
		}
	}
	return 0
}

// TestBlacklistsEndToEnd runs controld (embedded etcd) as a bouncer of Debian's
// crowdsec, two l7d reached directly, and an l4d tunnelling to a third l7d, all
// as processes fed by controld's store: CrowdSec's decisions made, deleted and
// expiring are enforced at L4 and L7 and counted there, each node's hits
// reported in the list's show; a 1M-entry push loses no request of unlisted clients; an l7d
// stopped during a push catches up; a corrupt chunk is refused and the old list
// stays; a viewer cannot push.
func TestBlacklistsEndToEnd(t *testing.T) {
	start := time.Now()
	b := startBlacklistCluster(t)
	t.Logf("crowdsec, controld, two keyserverd, two l7d and l4d (%v) started in %v", b.l4 != nil, time.Since(start).Round(time.Millisecond))
	l7a, l7b := b.L7[0], b.L7[1]
	b.waitEnforced("before any decision", blListed, false)

	// A CrowdSec decision: the client's new connections refused at L4, its
	// requests at L7, both counted; the other client served.
	hits := l7Hits(l7a) + l7Hits(l7b)
	b.lapi.Cscli("decisions", "add", "--ip", blListed, "-d", "1m", "-R", "integration")
	took := b.waitEnforced("cscli decisions add", blListed, true)
	t.Logf("cscli decisions add: enforced by both l7d and l4d within %v", took.Round(time.Millisecond))
	if got := l7Hits(l7a) + l7Hits(l7b); got <= hits {
		t.Errorf("the l7d count %v blacklist hits after refusing %s, %v before", got, blListed, hits)
	}
	for _, l := range b.L7 {
		if err := b.get(l, blUnlisted); err != nil {
			t.Errorf("the unlisted client, with %s listed: %v", blListed, err)
		}
	}
	if b.l4 != nil {
		if b.l4Blocks(blUnlisted) {
			t.Errorf("l4d counts the unlisted client's SYN as blacklisted")
		}
		if err := b.getL4(blUnlisted); err != nil {
			t.Errorf("the unlisted client through l4d, with %s listed: %v", blListed, err)
		}
		if err := b.getL4(blListed); err == nil {
			t.Errorf("the listed client served through l4d")
		}
		if n := scrape("http://"+b.l4.Admin+"/metrics", "tiergate_blacklist_hits_total", `list="global"`, `source="packet"`); n <= 0 {
			t.Errorf("l4d's tiergate_blacklist_hits_total of list global: %v", n)
		}
	}
	// Each node's hits of the list, and their total, in its show.
	hitNodes := []string{l7a.Node, l7b.Node}
	if b.l4 != nil {
		hitNodes = append(hitNodes, b.l4.Node)
	}
	s := b.waitHits("global", hitNodes...)
	t.Logf("hits of list global: %d in all, by node %+v", s.Hits, s.Nodes)
	if r := b.admin(0, "blacklist", "show", "global"); !strings.Contains(r.stdout, "HITS") {
		t.Errorf("tgctl blacklist show global prints no hits:\n%s", r.stdout)
	}

	// The decision deleted: served again.
	b.lapi.Cscli("decisions", "delete", "--id", b.lapi.DecisionID("Ip:"+blListed))
	took = b.waitEnforced("cscli decisions delete", blListed, false)
	t.Logf("cscli decisions delete: lifted by both l7d and l4d within %v", took.Round(time.Millisecond))

	// A decision of 6s lifts itself.
	b.lapi.Cscli("decisions", "add", "--ip", blListed, "-d", "6s")
	added := time.Now()
	b.waitEnforced("a decision of 6s", blListed, true)
	b.waitEnforced("the decision of 6s expired", blListed, false)
	t.Logf("a decision of 6s: lifted everywhere %v after it was made", time.Since(added).Round(time.Millisecond))

	// l7-b stopped; a 1M-entry list pushed to listener web's list while the
	// unlisted client's requests flow through l7-a: none lost.
	if err := l7b.Stop(); err != nil {
		t.Fatal(err)
	}
	big := b.bigList(1_000_000)
	var sent, lost atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				if err := b.get(l7a, blUnlisted); err != nil {
					lost.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	pushed := time.Now()
	r := b.admin(0, "blacklist", "push", "web", "-f", big, "-o", "json")
	var push struct {
		Operation string `json:"operation"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &push); err != nil || push.Operation == "" {
		t.Fatalf("blacklist push -o json: %v\n%s", err, r)
	}
	var version int64
	waitFor(t, 60*time.Second, "the 1M-entry list stored and applied by l7-a and l4-a", func() bool {
		var op struct {
			Version int64  `json:"version"`
			State   string `json:"state"`
			Error   string `json:"error"`
		}
		if err := b.Call(context.Background(), "GET", "/v1/operations/"+push.Operation, nil, &op); err != nil || op.Version == 0 {
			return false
		}
		version = op.Version
		return b.nodeVersion("web", "l7-a") >= version && (b.l4 == nil || b.nodeVersion("web", "l4-a") >= version && b.nodeVersion("web", blTunnel) >= version)
	})
	applied := time.Since(pushed)
	b.waitEnforced("the 1M-entry push", blBulk, true)
	close(stop)
	wg.Wait()
	t.Logf("1M-entry push: version %d applied by l7-a and l4-a %v after tgctl started; %d requests of the unlisted client meanwhile, %d lost",
		version, applied.Round(time.Millisecond), sent.Load(), lost.Load())
	if lost.Load() != 0 || sent.Load() < 10 {
		t.Errorf("during the 1M-entry push: %d of %d requests of the unlisted client lost (first: %v)", lost.Load(), sent.Load(), firstErr.Load())
	}

	// l7-b started again catches up.
	restarted := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l7b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "l7-b reporting the pushed version", func() bool { return b.nodeVersion("web", "l7-b") >= version })
	b.waitEnforced("l7-b started again", blBulk, true)
	t.Logf("l7-b started after the push: enforcing version %d %v later", version, time.Since(restarted).Round(time.Millisecond))
	if err := b.get(l7b, blUnlisted); err != nil {
		t.Errorf("l7-b after catching up, the unlisted client: %v", err)
	}

	// A viewer's token cannot push.
	viewer := strings.TrimSpace(b.admin(0, "token", "create", "watcher", "--role", "viewer").stdout)
	small := b.file("small.txt", []byte(blUnlisted+"\n"))
	if r := b.tg(viewer, "blacklist", "push", "web", "-f", small); r.code != 6 {
		t.Errorf("a viewer pushing a blacklist: want exit 6, got %v", r)
	}
	if r := b.tg(viewer, "blacklist", "add", "--ip", blUnlisted, "-d", "1h"); r.code != 6 {
		t.Errorf("a viewer adding to a blacklist: want exit 6, got %v", r)
	}
	if v := b.show("web").Version; v != version {
		t.Errorf("list web at version %d after the viewer's pushes, want %d", v, version)
	}

	// A corrupt chunk written in etcd, named by a manifest: every node refuses
	// it and says so, and the list in force stays.
	b.corruptChunk("web", version)
	waitFor(t, 20*time.Second, "each node logging the corrupt version refused", func() bool {
		for _, l := range b.L7 {
			if !strings.Contains(l.LogTail(400), "a blacklist version is refused") {
				return false
			}
		}
		return b.l4 == nil || strings.Contains(b.l4.LogTail(400), "a blacklist version is refused") && strings.Contains(proc.Tail(b.tun.log, 400), "a blacklist version is refused")
	})
	s = b.show("web")
	for _, n := range s.Nodes {
		if n.Version != version || n.State == "applied" {
			t.Errorf("after the corrupt chunk: %s reports version %d (%s), want %d, behind version %d", n.Node, n.Version, n.State, version, s.Version)
		}
	}
	b.waitEnforced("with the corrupt version refused", blBulk, true)
	for _, l := range b.L7 {
		if err := b.get(l, blUnlisted); err != nil {
			t.Errorf("with the corrupt version refused, the unlisted client: %v", err)
		}
	}
	t.Logf("the whole test took %v", time.Since(start).Round(time.Millisecond))
}

// bigList writes a list of n entries: blBulk and n-1 addresses of the
// documentation prefix 2001:db8::/32.
func (b *blCluster) bigList(n int) string {
	b.t.Helper()
	p := filepath.Join(b.dir, "big.txt")
	f, err := os.Create(p)
	if err != nil {
		b.t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	fmt.Fprintln(w, blBulk)
	for i := 1; i < n; i++ {
		fmt.Fprintf(w, "2001:db8:%x:%x::1\n", i>>16, i&0xffff)
	}
	if err := w.Flush(); err != nil {
		b.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.t.Fatal(err)
	}
	return p
}

// corruptChunk writes, straight into etcd, a chunk whose bytes are not those its
// key names and a manifest of version+1 whose base is that chunk.
func (b *blCluster) corruptChunk(name string, version int64) {
	b.t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{b.L7Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		b.t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bad := make([]byte, 4096)
	binary.BigEndian.PutUint64(bad, uint64(time.Now().UnixNano()))
	sum := sha256.Sum256([]byte("not these bytes"))
	ref := blsync.ChunkRef{SHA256: hex.EncodeToString(sum[:]), Entries: 1, Bytes: len(bad)}
	m := blsync.Manifest{Name: name, Version: version + 1, Base: blsync.Base{Version: version + 1, Entries: 1, Bytes: int64(len(bad)), Chunks: []blsync.ChunkRef{ref}},
		Entries: 1, Updated: time.Now().UTC(), Who: "integration"}
	data, err := json.Marshal(m)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := cli.Put(ctx, blsync.ChunkKey(name, ref.SHA256), string(bad)); err != nil {
		b.t.Fatal(err)
	}
	if _, err := cli.Put(ctx, blsync.ManifestKey(name), string(data)); err != nil {
		b.t.Fatal(err)
	}
}
