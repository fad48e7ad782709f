package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tiergate/tiergate/internal/proc"
	"github.com/tiergate/tiergate/internal/promtext"
	"github.com/tiergate/tiergate/testkit/bird"
)

// The L4 mode's network, every part in a namespace of its own (names: the prefix and
// the label), nothing reaching the host:
//
//	cl: client 198.18.2.10, route to the VIPs via the router
//	 └ c0 ══ rc 198.18.2.1
//	rt: router, Debian's bird2 (AS 65000, hold time 3 s) putting the LDs' BGP paths
//	    into its kernel as one multipath route (ECMP hashing on the 5-tuple);
//	    bridge br0 198.18.0.1 over rax, rak, rbx, rbk
//	 ├ rax ══ x0, rak ══ k0 ┐
//	 │          lda: l4d (AS 65001), DPDK net_af_packet on x0 (198.18.0.2, the next hop
//	 │          it announces) and i0 (198.18.1.1); the kernel's k0 198.18.0.12 (BGP) and
//	 │          m0 198.18.1.2 (health checks, session sync); admin on 127.0.0.1:9180
//	 └ rbx ══ x0, rbk ══ k0: ldb, the same with 198.18.0.3, 198.18.0.13, 198.18.1.3, 198.18.1.4
//	sw: bridge br0 198.18.1.100 over the LDs' i0 and m0 ends (sia sma sib smb):
//	    keyserverd :2407 (metrics 127.0.0.1:9240), backend :8080, controld (API
//	    127.0.0.1:7443, relayed by tgdemo to the host's 127.0.0.1:7443)
//	 ├ sa ══ a0: l7a 198.18.1.11, l7d with the tunnel endpoint, QUIC server ID 1, admin :9241
//	 └ sb ══ b0: l7b 198.18.1.12, the same, QUIC server ID 2
//
// The client reaches VIP 203.0.113.10 through the router, whose ECMP route sends
// each flow to one of the LDs announcing it; the LD tunnels it in GRE to an L7 node,
// and the node answers through an LD, so the backend sees the client's address. The
// LDs send each other the connections older than 3 s (session sync, over m0), so
// that when one dies and the router drops its path at the hold timer, the other
// carries its connections on to the same L7 nodes. controld sits with keyserverd,
// whose key imports it makes; every node reaches its embedded etcd through the etcd's
// unix socket (control.go says why).
const (
	l4VIP          = "203.0.113.10"
	l4ClientIP     = "198.18.2.10"
	l4RouterClient = "198.18.2.1" // the router's address on the client's side
	l4RouterIP     = "198.18.0.1" // the router's address on the LDs' side: their gateway and BGP peer
	l4RouterAS     = 65000
	l4LDAS         = 65001
	// l4HoldTime is the BGP hold time, in seconds: the shortest BGP allows, so that
	// the router drops a dead LD's path within 3 s.
	l4HoldTime    = 3
	l4SyncPort    = "9187"
	l4ClusterID   = 16
	l4KeyserverIP = "198.18.1.100" // the switch's bridge: keyserverd and the backend
	l4AdminAt     = "127.0.0.1:9180"
	l4KSMetricsAt = "127.0.0.1:9240"
	l4L7AdminPort = "9241"
	// l4TunnelKey is the GRE key of the tunnel between the LDs and the L7 nodes, set
	// on both ends (l4d's tunnel.key, l7d's tunnel.key): the nodes take only packets
	// carrying it, and the LDs only replies carrying it.
	l4TunnelKey = 0x74670001
)

// l4LD is one LD of the L4 mode.
type l4LD struct {
	label             string // the namespace's label and the node's name in controld
	external, session string // x0's address (the datapath's, the next hop announced), k0's (the kernel's: BGP)
	internal, health  string // i0's address (the datapath's, the tunnel), m0's (the kernel's: health checks, sync)
	rtX, rtK          string // the router's ends of x0 and k0
	swI, swM          string // the switch's ends of i0 and m0
	relay             string // where the switch's namespace relays the LD's admin endpoint, for Prometheus
}

var l4LDs = []l4LD{
	{"lda", "198.18.0.2", "198.18.0.12", "198.18.1.1", "198.18.1.2", "rax", "rak", "sia", "sma", "127.0.0.1:9180"},
	{"ldb", "198.18.0.3", "198.18.0.13", "198.18.1.3", "198.18.1.4", "rbx", "rbk", "sib", "smb", "127.0.0.1:9181"},
}

// l4Node is one L7 node of the L4 mode.
type l4Node struct {
	label, dev, swDev, ip string
	quicID                int
}

var l4Nodes = []l4Node{
	{"l7a", "a0", "sa", "198.18.1.11", 1},
	{"l7b", "b0", "sb", "198.18.1.12", 2},
}

// l4Net is the L4 mode's namespaces.
type l4Net struct {
	cl, rt, sw *netNS
	ld         []*netNS // in the order of l4LDs
	l7         []*netNS // in the order of l4Nodes
}

// l4Unavailable says why the L4 mode cannot run here, or "" when it can.
func l4Unavailable(binDir string) string {
	if os.Geteuid() != 0 {
		return "not root (network namespaces and DPDK need it)"
	}
	for _, c := range []struct{ cmd, pkg string }{{"ip", "iproute2"}, {"ethtool", "ethtool"}, {"sysctl", "procps"}, {"bird", "bird2"}, {"birdc", "bird2"}} {
		if _, err := exec.LookPath(c.cmd); err != nil {
			return fmt.Sprintf("%s not found (Debian package %s; `make deps` installs it)", c.cmd, c.pkg)
		}
	}
	l4d := filepath.Join(binDir, "l4d")
	if _, err := os.Stat(l4d); err != nil {
		return fmt.Sprintf("%s not built (it needs libdpdk-dev; `make deps build`)", l4d)
	}
	if out, err := exec.Command(l4d, "help").CombinedOutput(); err != nil {
		first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return fmt.Sprintf("%s does not start (libdpdk missing? `make deps`): %v: %s", l4d, err, first)
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return "no /dev/net/tun (l7d's tunnel endpoint needs TUN)"
	}
	return ""
}

// buildL4Net creates the namespaces and links of the L4 mode, and adds their removal to
// s's tear-down. Namespaces with the prefix left by an earlier run are removed first.
func buildL4Net(prefix string, s *stack) (*l4Net, error) {
	if left := listNetNS(prefix); len(left) > 0 {
		fmt.Fprintf(s.out, "removing network namespaces left by an earlier run: %s\n", strings.Join(left, " "))
		if err := removeNetNS(left...); err != nil {
			return nil, err
		}
	}
	var created []string
	s.onClose(func() {
		if len(created) == 0 {
			return
		}
		if err := removeNetNS(created...); err != nil {
			fmt.Fprintf(s.out, "tgdemo: %v\n", err)
			return
		}
		fmt.Fprintf(s.out, "network namespaces %s* removed\n", prefix)
	})
	mk := func(label string) (*netNS, error) {
		ns, err := newNetNS(prefix + label)
		if err == nil {
			created = append(created, ns.name)
		}
		return ns, err
	}
	n := &l4Net{}
	var err error
	for _, x := range []struct {
		ns    **netNS
		label string
	}{{&n.cl, "cl"}, {&n.rt, "rt"}, {&n.sw, "sw"}} {
		if *x.ns, err = mk(x.label); err != nil {
			return nil, err
		}
	}
	for _, ld := range l4LDs {
		ns, err := mk(ld.label)
		if err != nil {
			return nil, err
		}
		n.ld = append(n.ld, ns)
	}
	for _, node := range l4Nodes {
		ns, err := mk(node.label)
		if err != nil {
			return nil, err
		}
		n.l7 = append(n.l7, ns)
	}

	var errs []error
	run := func(ns *netNS, args ...string) {
		if len(errs) == 0 {
			if err := ns.run(args...); err != nil {
				errs = append(errs, err)
			}
		}
	}
	veth := func(a *netNS, aDev string, b *netNS, bDev string) {
		run(a, "ip", "link", "add", aDev, "type", "veth", "peer", "name", bDev, "netns", b.name)
		run(a, "ip", "link", "set", aDev, "up")
		run(b, "ip", "link", "set", bDev, "up")
	}
	// Offloads off on every veth: the LDs' packet sockets must get whole, checksummed
	// frames no larger than an mbuf, and the kernel must not merge what they send.
	offloads := func(ns *netNS, dev string) {
		run(ns, "ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off")
	}
	bridge := func(ns *netNS, addr string, devs ...string) {
		run(ns, "ip", "link", "add", "br0", "type", "bridge")
		for _, dev := range devs {
			run(ns, "ip", "link", "set", dev, "master", "br0")
			offloads(ns, dev)
		}
		run(ns, "ip", "addr", "add", addr+"/24", "dev", "br0")
		run(ns, "ip", "link", "set", "br0", "up")
	}

	veth(n.cl, "c0", n.rt, "rc")
	var rtPorts, swPorts []string
	for i, ld := range l4LDs {
		veth(n.ld[i], "x0", n.rt, ld.rtX)
		veth(n.ld[i], "k0", n.rt, ld.rtK)
		veth(n.ld[i], "i0", n.sw, ld.swI)
		veth(n.ld[i], "m0", n.sw, ld.swM)
		rtPorts = append(rtPorts, ld.rtX, ld.rtK)
		swPorts = append(swPorts, ld.swI, ld.swM)
	}
	for i, node := range l4Nodes {
		veth(n.l7[i], node.dev, n.sw, node.swDev)
		swPorts = append(swPorts, node.swDev)
	}
	bridge(n.rt, l4RouterIP, rtPorts...)
	bridge(n.sw, l4KeyserverIP, swPorts...)

	run(n.cl, "ip", "addr", "add", l4ClientIP+"/24", "dev", "c0")
	run(n.cl, "ip", "route", "add", "203.0.113.0/24", "via", l4RouterClient)
	offloads(n.cl, "c0")
	run(n.rt, "ip", "addr", "add", l4RouterClient+"/24", "dev", "rc")
	offloads(n.rt, "rc")
	run(n.rt, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	// ECMP by the 5-tuple, so that one client's connections spread over the LDs.
	run(n.rt, "sysctl", "-q", "-w", "net.ipv4.fib_multipath_hash_policy=1")
	for i, ld := range l4LDs {
		// The DPDK ports: no kernel addresses, no IPv6 chatter, no ARP answers from
		// the kernel for k0's and m0's addresses.
		for _, dev := range []string{"x0", "i0"} {
			run(n.ld[i], "sysctl", "-q", "-w", "net.ipv6.conf."+dev+".disable_ipv6=1")
			run(n.ld[i], "sysctl", "-q", "-w", "net.ipv4.conf."+dev+".arp_ignore=1")
			offloads(n.ld[i], dev)
		}
		run(n.ld[i], "ip", "addr", "add", ld.session+"/24", "dev", "k0")
		run(n.ld[i], "ip", "addr", "add", ld.health+"/24", "dev", "m0")
	}
	for i, node := range l4Nodes {
		run(n.l7[i], "ip", "addr", "add", node.ip+"/24", "dev", node.dev)
		offloads(n.l7[i], node.dev)
	}
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return n, nil
}

// runL4 runs the whole stack in network namespaces: the client loop targets the VIP
// through the router and the LDs.
func runL4(ctx context.Context, o Options, st *site, out io.Writer) error {
	s := newStack(out, o.BinDir)
	defer s.close()
	s.onClose(func() { fmt.Fprintln(out, "state kept in", st.dir) })

	fmt.Fprintf(out, "setting up the demo network in namespaces %s*\n", o.NetnsPrefix)
	n, err := buildL4Net(o.NetnsPrefix, s)
	if err != nil {
		return &notAvailableError{err}
	}

	// controld, keyserverd and the backend on the switch's bridge; controld's API
	// relayed to the host, for tgctl.
	ksAt := net.JoinHostPort(l4KeyserverIP, "2407")
	ctld, err := st.startControld(ctx, s, n.sw, controldAt, ksAt)
	if err != nil {
		return err
	}
	if err := forwardAPI(s, o.APIAt, n.sw, controldAt); err != nil {
		return err
	}
	ks, err := st.startKeyserverd(ctx, s, n.sw, ksAt, l4KSMetricsAt)
	if err != nil {
		return err
	}
	backendAt := net.JoinHostPort(l4KeyserverIP, "8080")
	var backendLn net.Listener
	if err := n.sw.do(func() error {
		var err error
		backendLn, err = net.Listen("tcp", backendAt)
		return err
	}); err != nil {
		return fmt.Errorf("listening for the backend in %s: %w", n.sw, err)
	}
	serveBackend(s, backendLn)

	// The configuration, through controld: the site certificate, the listener with
	// its routing, pool and binding, the L4 rules and pool.
	tg, err := st.newTgctl(o.BinDir, o.APIAt, out)
	if err != nil {
		return err
	}
	if err := st.configure(ctx, tg, stackYAML("0.0.0.0:443", backendAt, true)); err != nil {
		return err
	}

	// The router.
	birdSock := filepath.Join(st.dir, "bird.ctl")
	if err := st.startBird(ctx, s, n.rt, birdSock); err != nil {
		return err
	}

	// The L7 nodes: l7d with the tunnel endpoint towards both LDs, the site key in
	// keyserverd.
	var ldInternal []string
	for _, ld := range l4LDs {
		ldInternal = append(ldInternal, ld.internal)
	}
	l7s := make([]*proc.Process, len(l4Nodes))
	for i, node := range l4Nodes {
		cfg := filepath.Join(st.dir, "l7d-"+node.label+".yaml")
		if err := st.writeL7Config(cfg, l7Config{
			node: node.label, admin: net.JoinHostPort(node.ip, l4L7AdminPort), adminInsecure: true,
			keyserver: ksAt, quicID: node.quicID, tunnelLDs: ldInternal, stateDir: filepath.Join(st.dir, "l7d-"+node.label+"-state"),
		}); err != nil {
			return err
		}
		l7s[i], err = s.start("l7d "+node.label, filepath.Join(st.dir, "l7d-"+node.label+".log"), nil, n.l7[i],
			filepath.Join(o.BinDir, "l7d"), "run", "-config", cfg)
		if err != nil {
			return err
		}
	}
	for i, p := range l7s {
		if err := p.WaitHTTP(ctx, nsHTTP(n.l7[i], time.Second), "http://"+net.JoinHostPort(l4Nodes[i].ip, l4L7AdminPort)+"/healthz", healthWait); err != nil {
			return err
		}
	}

	// The two LDs: l4d on each LD's two veths, peering with the router, syncing
	// sessions with the other. Their death does not end the demo: people are invited
	// to kill one.
	syncKey := filepath.Join(st.dir, "sync.key")
	if err := writeSyncKey(syncKey); err != nil {
		return err
	}
	lds := make([]*proc.Process, len(l4LDs))
	ldHTTP := make([]*http.Client, len(l4LDs))
	ldCfgs := make([]string, len(l4LDs))
	for i, ld := range l4LDs {
		ldCfgs[i] = filepath.Join(st.dir, "l4d-"+ld.label+".yaml")
		state := filepath.Join(st.dir, "l4d-"+ld.label+"-state") // its generated admin token, its cache of the store
		if err := os.WriteFile(ldCfgs[i], []byte(st.l4dConfig(ld, l4LDs[1-i], state, syncKey)), 0o600); err != nil {
			return err
		}
		lds[i], err = s.startExpendable("l4d "+ld.label, filepath.Join(st.dir, "l4d-"+ld.label+".log"), nil, n.ld[i],
			filepath.Join(o.BinDir, "l4d"), "run", "-config", ldCfgs[i])
		if err != nil {
			return err
		}
		ldHTTP[i] = nsHTTP(n.ld[i], 2*time.Second)
	}
	for i, p := range lds {
		if err := p.WaitHTTP(ctx, ldHTTP[i], "http://"+l4AdminAt+"/healthz", healthWait); err != nil {
			return err
		}
	}
	if err := st.rolledOut(ctx, tg); err != nil {
		return err
	}
	// Every member up by both LDs' health checks, both paths in the router's kernel
	// route, then a first request through the VIP (the LDs resolve their neighbours
	// on the way).
	tgt := target{
		addr: net.JoinHostPort(l4VIP, "443"), ns: n.cl, roots: st.roots, interval: o.Interval,
		nodes: map[string]string{},
	}
	for _, node := range l4Nodes {
		tgt.nodes[node.ip] = node.label
	}
	if err := waitL4Ready(ctx, s, ldHTTP, n.rt, tgt); err != nil {
		return fmt.Errorf("%w (logs in %s)", err, st.dir)
	}
	tryDir, err := st.writeTryFiles(true)
	if err != nil {
		return err
	}

	// Prometheus in the switch's namespace, which reaches every node's metrics (the
	// LDs' loopback admin endpoints through relays), answering on the host's loopback.
	promURL := ""
	if o.PrometheusAt != "off" {
		var ldAdmins []string
		for i, ld := range l4LDs {
			if err := relayNS(s, n.sw, ld.relay, n.ld[i], l4AdminAt); err != nil {
				return err
			}
			ldAdmins = append(ldAdmins, ld.relay)
		}
		var l7Admins []string
		for _, node := range l4Nodes {
			l7Admins = append(l7Admins, net.JoinHostPort(node.ip, l4L7AdminPort))
		}
		jobs := []promJob{{"l7d", l7Admins}, {"keyserverd", []string{l4KSMetricsAt}}, {"l4d", ldAdmins}}
		const promIn = "127.0.0.1:9090" // in the switch's namespace
		if ok, err := st.startPrometheus(ctx, s, n.sw, promIn, jobs, out); err != nil {
			return err
		} else if ok {
			if err := forwardAPI(s, o.PrometheusAt, n.sw, promIn); err != nil {
				return err
			}
			promURL = "http://" + o.PrometheusAt
		}
	}

	p := o.NetnsPrefix
	fmt.Fprintf(out, `
Tiergate demo: client → router (bird2, ECMP) → two l4d (DPDK, BGP, session sync) → GRE → two l7d nodes → backend,
in network namespaces %[1]s*, configured through controld
  state directory     %[2]s (SoftHSM2 token %[3]q, configs, logs)
  site key            %[4]s, RSA-2048, imported into the token as non-extractable by controld's upload (source PEM: site.key)
  client              %[1]scl %[5]s → https://%[6]s (TCP: TLS 1.2/1.3, h2 + http/1.1; UDP: QUIC, HTTP/3)
  router              %[1]srt %[7]s, bird2 AS %[8]d (hold time %[9]ds, BFD 300 ms × 3), log bird.log; one multipath route for %[6]s via both LDs
  l4d                 %[1]slda: pid %[10]d, x0 %[11]s, log l4d-lda.log; %[1]sldb: pid %[12]d, x0 %[13]s, log l4d-ldb.log
                      (AS %[14]d, session sync on m0 port %[15]s, admin 127.0.0.1:9180 in each LD's namespace)
  l7d                 %[1]sl7a %[16]s (QUIC server ID 1), %[1]sl7b %[17]s (ID 2), tunnel endpoint + remote key, logs l7d-l7a.log l7d-l7b.log
  keyserverd          %[1]ssw %[18]s:2407 (mutual TLS), pid %[19]d, log keyserverd.log; backend %[20]s
  controld            %[1]ssw 127.0.0.1:7443 relayed to the host's %[21]s, pid %[22]d, log controld.log; its store %[23]s, which the nodes reach at %[24]s
%[25]s%[26]s  drain a node        %[27]s apply -f %[28]s   (l7a drained: new connections all go to l7b; apply -f %[29]s undoes it)
  admin token         T="Authorization: Bearer $(cat %[30]s)" (lda's; ldb's: %[31]s), sent by admin requests but /metrics and /healthz
  l4d BGP, status     ip netns exec %[1]slda curl -s -H "$T" 127.0.0.1:9180/bgp   (and /status)
  l4d metrics         ip netns exec %[1]slda curl -s 127.0.0.1:9180/metrics | grep -E 'tiergate_l4_(member|bgp|sync)'
  other metrics       ip netns exec %[1]ssw curl -s %[32]s/metrics (keyserverd)   ip netns exec %[1]sl7a curl -s %[16]s:%[33]s/metrics (l7d)
  try                 ip netns exec %[1]scl curl --cacert %[34]s --resolve demo.tiergate.test:443:%[6]s https://demo.tiergate.test/

  lose an LD, keep the connections:
    1. a long connection: one request every 500 ms on one kept-alive connection (num_connects 0 after the first: no new connection)
       ip netns exec %[1]scl curl -s --rate 2/s --cacert %[34]s --resolve demo.tiergate.test:443:%[6]s -o /dev/null \
         -w '%%{http_code} num_connects %%{num_connects} %%{time_total}s\n' 'https://demo.tiergate.test/[1-600]'
    2. after 3 s (the LDs sync connections older than that), in another shell: kill -9 %[10]d   (lda; ldb is %[12]d)
       the router drops lda's path as soon as its BGP session closes (kill -STOP instead: a hung LD, dropped when
       its BFD session with the router times out, 0.9 s), and the curl's requests go on through ldb on the same connection after a pause
       (l7d sends the replies through ldb too once lda has been silent for ld_dead_after, 1 s); new connections that
       ECMP sends to lda fail only in that window
    3. watch the router     birdc -s %[35]s show protocols; birdc -s %[35]s show bfd sessions; birdc -s %[35]s show route
                            ip netns exec %[1]srt ip route show %[6]s
    4. start lda again      ip netns exec %[1]slda %[36]s run -config %[37]s >>%[38]s 2>&1 &
       (it takes traffic back after its warm-up: a full sync from ldb, then BGP)

  stop                Ctrl-C (or kill -INT %[39]d): daemons stopped, namespaces removed

`, p, st.dir, st.tok.Label, st.keyID, l4ClientIP, l4VIP, l4RouterIP, l4RouterAS, l4HoldTime,
		lds[0].PID(), l4LDs[0].external, lds[1].PID(), l4LDs[1].external, l4LDAS, l4SyncPort,
		l4Nodes[0].ip, l4Nodes[1].ip, l4KeyserverIP, ks.PID(), backendAt,
		o.APIAt, ctld.PID(), filepath.Join(st.controlDir(), "store"), st.etcdEndpoint(),
		st.tryText(tg, tryDir, "ip netns exec "+p+"cl ", net.JoinHostPort(l4VIP, "443")), st.dashboardText(tg, o.APIAt, promURL),
		tg.bin, filepath.Join(tryDir, "drain-l7a.yaml"), filepath.Join(tryDir, "undrain-l7a.yaml"),
		filepath.Join(st.dir, "l4d-lda-state", "admin.token"), filepath.Join(st.dir, "l4d-ldb-state", "admin.token"),
		l4KSMetricsAt, l4L7AdminPort, st.siteCA, birdSock, filepath.Join(o.BinDir, "l4d"), ldCfgs[0],
		filepath.Join(st.dir, "l4d-lda.log"), os.Getpid())

	swHTTP := nsHTTP(n.sw, 2*time.Second)
	tgt.summary = func() []string {
		lines := []string{"keyserverd: " + keyserverOps(swHTTP, "http://"+l4KSMetricsAt+"/metrics")}
		for i, ld := range l4LDs {
			lines = append(lines, ld.label+": "+l4Members(ldHTTP[i]))
		}
		return append(lines, "router: "+routerHops(n.rt))
	}
	return clientLoop(ctx, s, tgt, out)
}

// startBird writes the router's bird configuration (testkit/bird's: the LDs'
// sessions, merge paths on in the kernel protocol) and runs bird in ns with its
// control socket at sock; it returns once bird answers there.
func (st *site) startBird(ctx context.Context, s *stack, ns *netNS, sock string) error {
	c := bird.Config{RouterID: l4RouterIP, Address: l4RouterIP, AS: l4RouterAS, HoldTime: l4HoldTime,
		BFD: &bird.BFD{MinRx: 300 * time.Millisecond, MinTx: 300 * time.Millisecond, Multiplier: 3}}
	for _, ld := range l4LDs {
		c.Peers = append(c.Peers, bird.Peer{Name: ld.label, Address: ld.session, AS: l4LDAS, BFD: true})
	}
	text, err := c.Render()
	if err != nil {
		return err
	}
	conf := filepath.Join(st.dir, "bird.conf")
	if err := os.WriteFile(conf, []byte("# Written by tgdemo on every run: the router's BGP sessions with the LDs.\n"+text), 0o600); err != nil {
		return err
	}
	if out, err := exec.Command("bird", "-p", "-c", conf).CombinedOutput(); err != nil {
		return fmt.Errorf("bird rejects %s: %v: %s", conf, err, strings.TrimSpace(string(out)))
	}
	os.Remove(sock)
	p, err := s.start("bird", filepath.Join(st.dir, "bird.log"), nil, ns, "bird", "-f", "-c", conf, "-s", sock, "-P", filepath.Join(st.dir, "bird.pid"))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(healthWait)
	for {
		if exec.Command("birdc", "-s", sock, "show", "status").Run() == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bird did not answer on %s within %v (log bird.log)", sock, healthWait)
		}
		select {
		case <-p.Done():
			return p.Exited()
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writeSyncKey writes a fresh session sync key, shared by the LDs.
func writeSyncKey(path string) error {
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(hex.EncodeToString(k[:])+"\n"), 0o600)
}

// l4dConfig is the configuration of the LD ld, whose cluster peer is peer: the
// node's own settings (ports, BGP, session sync), the rules and pools coming from
// controld.
func (st *site) l4dConfig(ld, peer l4LD, stateDir, syncKey string) string {
	return fmt.Sprintf(`# Written by tgdemo on every run. The rules and pools come from controld
# (l4-rules and l4-pools in %s).
state_dir: %q   # l4d's generated admin token (admin.token) and control-snapshot.json
%sadmin_listen: %q
hash_seed: %d   # the same on both LDs: a flow ECMP moves hashes to the same member
dpdk:
  # No NIC, no huge pages: the LD reads and writes its two veths through packet sockets.
  eal_args: ["--no-pci", "--no-huge", "-m", "512", "--no-telemetry", "--log-level=warning",
             "--vdev=net_af_packet0,iface=x0", "--vdev=net_af_packet1,iface=i0"]
  workers: 1
ports:
  external: {device: net_af_packet0, addr: "%s/24", gateway: %q}
  internal: {device: net_af_packet1, addr: "%s/24"}
tunnel: {mode: gre, key: %d}   # the L7 nodes' tunnel.key is the same
conntrack: {capacity: 65536}
sync:   # connections older than 3 s sent to the other LD, which carries them on if this one dies
  cluster_id: %d
  key_file: %q
  listen: "%s:%s"   # m0, the kernel's address on the internal network
  peers: ["%s:%s"]
  warmup_timeout: 5s   # the first LD up has no peer to sync from
bgp:   # the rules' VIPs announced, next hop x0's address; asn and peers until controld's l4-bgp replaces them
  asn: %d
  withdraw_delay: 1s
  check_interval: 200ms
  bfd: {enabled: true, min_tx: 300ms, min_rx: 300ms, multiplier: 3}   # the router drops a dead or hung LD in 0.9 s
  peers:
    - {address: %s, as: %d, hold_time: %ds, connect_retry: 1s}
`, filepath.Join(st.dir, "stack.yaml"), stateDir, st.controlSection(ld.label), l4AdminAt, l4ClusterID,
		ld.external, l4RouterIP, ld.internal, l4TunnelKey,
		l4ClusterID, syncKey, ld.health, l4SyncPort, peer.health, l4SyncPort,
		l4LDAS, l4RouterIP, l4RouterAS, l4HoldTime)
}

// waitL4Ready waits until every LD reports every member up, the router's route for
// the VIP goes via both LDs and a request through the VIP succeeds.
func waitL4Ready(ctx context.Context, s *stack, ldHTTP []*http.Client, rt *netNS, t target) error {
	deadline := time.Now().Add(45 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case p := <-s.died:
			return p.Exited()
		case p := <-s.lost:
			return p.Exited()
		case <-ctx.Done():
			return fmt.Errorf("waiting for the first request through the VIP: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		var down []string
		for i, hc := range ldHTTP {
			ss, err := promtext.Get(ctx, hc, "http://"+l4AdminAt+"/metrics")
			if err != nil {
				down = append(down, fmt.Sprintf("%s's metrics: %v", l4LDs[i].label, err))
				continue
			}
			up := ss.By("tiergate_l4_member_up", "member")
			for _, node := range l4Nodes {
				if up[node.label] != 1 {
					down = append(down, l4LDs[i].label+" sees "+node.label+" down")
				}
			}
		}
		if len(down) > 0 {
			last = fmt.Errorf("l4d's health checks: %s", strings.Join(down, ", "))
			continue
		}
		hops, err := nextHops(rt, l4VIP+"/32")
		if err != nil {
			last = err
			continue
		}
		if len(hops) != len(l4LDs) {
			last = fmt.Errorf("the router's route for %s goes via %v, not yet via every LD (birdc, bird.log)", l4VIP, hops)
			continue
		}
		if _, err := modes[0].fetch(ctx, t.ns, t.addr, t.roots); err != nil {
			last = fmt.Errorf("a request through the VIP: %w", err)
			continue
		}
		return nil
	}
	if last == nil {
		last = errors.New("timed out")
	}
	return fmt.Errorf("the L4 tier did not become ready in 45s: %w", last)
}

// nextHops returns the gateways of the kernel's route for prefix in ns: one for a
// plain route, several for a multipath one, none without a route.
func nextHops(ns *netNS, prefix string) ([]string, error) {
	out, err := ns.command("ip", "-j", "route", "show", "exact", prefix).Output()
	if err != nil {
		return nil, fmt.Errorf("ip route in %s: %w", ns, err)
	}
	gws, err := bird.ParseNextHops(out)
	if err != nil {
		return nil, fmt.Errorf("in %s: %w", ns, err)
	}
	return gws, nil
}

// routerHops says where the router's route for the VIP goes, by LD.
func routerHops(rt *netNS) string {
	hops, err := nextHops(rt, l4VIP+"/32")
	if err != nil {
		return err.Error()
	}
	if len(hops) == 0 {
		return l4VIP + ": no route"
	}
	var via []string
	for _, h := range hops {
		name := h
		for _, ld := range l4LDs {
			if ld.external == h {
				name = ld.label + " " + h
			}
		}
		via = append(via, name)
	}
	return l4VIP + " via " + strings.Join(via, ", ")
}

// l4Members summarises an LD's per-member metrics.
func l4Members(hc *http.Client) string {
	ss, err := promtext.Get(context.Background(), hc, "http://"+l4AdminAt+"/metrics")
	if err != nil {
		return "metrics unavailable: " + err.Error()
	}
	pkts := ss.By("tiergate_l4_member_packets_total", "member")
	conns := ss.By("tiergate_l4_member_connections", "member")
	drained := ss.By("tiergate_l4_member_drained", "member")
	var parts []string
	for _, node := range l4Nodes {
		p := fmt.Sprintf("%s %.0f packets, %.0f connections", node.label, pkts[node.label], conns[node.label])
		if drained[node.label] == 1 {
			p += " (drained)"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}
