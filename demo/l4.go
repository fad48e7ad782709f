package demo

import (
	"context"
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
)

// The L4 mode's network, every part in a namespace of its own (names: the prefix and
// the label), nothing reaching the host:
//
//	cl: client 198.18.0.1, route to the VIPs via the LD
//	 └ c0 ══ x0 ┐
//	            ld: l4d, DPDK net_af_packet on x0 (198.18.0.2) and i0 (198.18.1.1); m0
//	            198.18.1.2 is the kernel's, for health checks; admin on 127.0.0.1:9180
//	 ┌ si ══ i0 ┘, sm ══ m0
//	sw: bridge br0 198.18.1.100: keyserverd :2407 (metrics 127.0.0.1:9240), backend :8080,
//	    controld (API 127.0.0.1:7443, relayed by tgdemo to the host's 127.0.0.1:7443)
//	 ├ sa ══ a0: l7a 198.18.1.11, l7d with the tunnel endpoint, QUIC server ID 1, admin :9241
//	 └ sb ══ b0: l7b 198.18.1.12, the same, QUIC server ID 2
//
// The client reaches VIP 203.0.113.10 through the LD, which tunnels each flow in GRE to
// an L7 node; the nodes answer through the LD, so the backend sees the client's address.
// controld sits with keyserverd, whose key imports it makes; every node reaches its
// embedded etcd through the etcd's unix socket (control.go says why).
const (
	l4VIP         = "203.0.113.10"
	l4ClientIP    = "198.18.0.1"
	l4LDExternal  = "198.18.0.2"
	l4LDInternal  = "198.18.1.1"
	l4LDHealth    = "198.18.1.2"
	l4KeyserverIP = "198.18.1.100" // the switch's bridge: keyserverd and the backend
	l4AdminAt     = "127.0.0.1:9180"
	l4KSMetricsAt = "127.0.0.1:9240"
	l4L7AdminPort = "9241"
	// l4TunnelKey is the GRE key of the tunnel between the LD and the L7 nodes, set on
	// both ends (l4d's tunnel.key, l7d's tunnel.key): the nodes take only packets
	// carrying it, and the LD only replies carrying it.
	l4TunnelKey = 0x74670001
)

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
	cl, ld, sw *netNS
	l7         []*netNS
}

// l4Unavailable says why the L4 mode cannot run here, or "" when it can.
func l4Unavailable(binDir string) string {
	if os.Geteuid() != 0 {
		return "not root (network namespaces and DPDK need it)"
	}
	for _, c := range []struct{ cmd, pkg string }{{"ip", "iproute2"}, {"ethtool", "ethtool"}, {"sysctl", "procps"}} {
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
	}{{&n.cl, "cl"}, {&n.ld, "ld"}, {&n.sw, "sw"}} {
		if *x.ns, err = mk(x.label); err != nil {
			return nil, err
		}
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
	// Offloads off on every veth: the LD's packet sockets must get whole, checksummed
	// frames no larger than an mbuf, and the kernel must not merge what they send.
	offloads := func(ns *netNS, dev string) {
		run(ns, "ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off")
	}
	veth(n.cl, "c0", n.ld, "x0")
	veth(n.ld, "i0", n.sw, "si")
	veth(n.ld, "m0", n.sw, "sm")
	for i, node := range l4Nodes {
		veth(n.l7[i], node.dev, n.sw, node.swDev)
	}
	run(n.sw, "ip", "link", "add", "br0", "type", "bridge")
	for _, dev := range []string{"si", "sm", "sa", "sb"} {
		run(n.sw, "ip", "link", "set", dev, "master", "br0")
		offloads(n.sw, dev)
	}
	run(n.sw, "ip", "addr", "add", l4KeyserverIP+"/24", "dev", "br0")
	run(n.sw, "ip", "link", "set", "br0", "up")

	run(n.cl, "ip", "addr", "add", l4ClientIP+"/24", "dev", "c0")
	run(n.cl, "ip", "route", "add", "203.0.113.0/24", "via", l4LDExternal)
	offloads(n.cl, "c0")
	// The LD's DPDK ports: no kernel addresses, no IPv6 chatter.
	for _, dev := range []string{"x0", "i0"} {
		run(n.ld, "sysctl", "-q", "-w", "net.ipv6.conf."+dev+".disable_ipv6=1")
		offloads(n.ld, dev)
	}
	run(n.ld, "ip", "addr", "add", l4LDHealth+"/24", "dev", "m0")
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
// through l4d.
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

	// The L7 nodes: l7d with the tunnel endpoint, the site key in keyserverd.
	l7s := make([]*proc.Process, len(l4Nodes))
	for i, node := range l4Nodes {
		cfg := filepath.Join(st.dir, "l7d-"+node.label+".yaml")
		if err := st.writeL7Config(cfg, l7Config{
			node: node.label, admin: net.JoinHostPort(node.ip, l4L7AdminPort), adminInsecure: true,
			keyserver: ksAt, quicID: node.quicID, tunnelLD: l4LDInternal, stateDir: filepath.Join(st.dir, "l7d-"+node.label+"-state"),
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

	// l4d on the LD's two veths.
	l4Cfg := filepath.Join(st.dir, "l4d.yaml")
	l4State := filepath.Join(st.dir, "l4d-state") // its generated admin token, its cache of the store
	if err := os.WriteFile(l4Cfg, []byte(st.l4dConfig(l4State)), 0o600); err != nil {
		return err
	}
	l4d, err := s.start("l4d", filepath.Join(st.dir, "l4d.log"), nil, n.ld, filepath.Join(o.BinDir, "l4d"), "run", "-config", l4Cfg)
	if err != nil {
		return err
	}
	ldHTTP := nsHTTP(n.ld, 2*time.Second)
	if err := l4d.WaitHTTP(ctx, ldHTTP, "http://"+l4AdminAt+"/healthz", healthWait); err != nil {
		return err
	}
	if err := st.rolledOut(ctx, tg); err != nil {
		return err
	}
	// Both members up by l4d's health checks, then a first request through the VIP (the
	// LD resolves its neighbours on the way).
	tgt := target{
		addr: net.JoinHostPort(l4VIP, "443"), ns: n.cl, roots: st.roots, interval: o.Interval,
		nodes: map[string]string{},
	}
	for _, node := range l4Nodes {
		tgt.nodes[node.ip] = node.label
	}
	if err := waitL4Ready(ctx, s, ldHTTP, tgt); err != nil {
		return fmt.Errorf("%w (logs in %s)", err, st.dir)
	}
	tryDir, err := st.writeTryFiles(true)
	if err != nil {
		return err
	}

	// Prometheus in the switch's namespace, which reaches every node's metrics (l4d's
	// loopback admin endpoint through a relay), answering on the host's loopback.
	promURL := ""
	if o.PrometheusAt != "off" {
		if err := relayNS(s, n.sw, l4AdminAt, n.ld, l4AdminAt); err != nil {
			return err
		}
		var l7Admins []string
		for _, node := range l4Nodes {
			l7Admins = append(l7Admins, net.JoinHostPort(node.ip, l4L7AdminPort))
		}
		jobs := []promJob{{"l7d", l7Admins}, {"keyserverd", []string{l4KSMetricsAt}}, {"l4d", []string{l4AdminAt}}}
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
Tiergate demo: client → l4d (DPDK) → GRE → two l7d nodes → backend, in network namespaces %[1]s*, configured through controld
  state directory     %[2]s (SoftHSM2 token %[3]q, configs, logs)
  site key            %[4]s, RSA-2048, imported into the token as non-extractable by controld's upload (source PEM: site.key)
  client              %[1]scl %[5]s → https://%[6]s (TCP: TLS 1.2/1.3, h2 + http/1.1; UDP: QUIC, HTTP/3)
  l4d                 %[1]sld, DPDK net_af_packet on x0 %[7]s (clients) and i0 %[8]s (L7 side), pid %[9]d, log l4d.log
  l7d                 %[1]sl7a %[10]s (QUIC server ID 1), %[1]sl7b %[11]s (ID 2), tunnel endpoint + remote key, logs l7d-l7a.log l7d-l7b.log
  keyserverd          %[1]ssw %[12]s:2407 (mutual TLS), pid %[13]d, log keyserverd.log; backend %[14]s
  controld            %[1]ssw 127.0.0.1:7443 relayed to the host's %[22]s, pid %[21]d, log controld.log; its store %[28]s, which the nodes reach at %[23]s
%[24]s%[29]s  drain a node        %[25]s apply -f %[26]s   (l7a drained: new connections all go to l7b; apply -f %[27]s undoes it)
  admin token         l4d: %[20]s (admin requests but /metrics and /healthz send it: T="Authorization: Bearer $(cat %[20]s)")
  l4d status          ip netns exec %[1]sld curl -s -H "$T" %[15]s/status
  l4d metrics         ip netns exec %[1]sld curl -s %[15]s/metrics | grep tiergate_l4_member
  other metrics       ip netns exec %[1]ssw curl -s %[16]s/metrics (keyserverd)   ip netns exec %[1]sl7a curl -s %[10]s:%[17]s/metrics (l7d)
  try                 ip netns exec %[1]scl curl --cacert %[18]s --resolve demo.tiergate.test:443:%[6]s https://demo.tiergate.test/
  stop                Ctrl-C (or kill -INT %[19]d): daemons stopped, namespaces removed

`, p, st.dir, st.tok.Label, st.keyID, l4ClientIP, l4VIP, l4LDExternal, l4LDInternal, l4d.PID(),
		l4Nodes[0].ip, l4Nodes[1].ip, l4KeyserverIP, ks.PID(), backendAt, l4AdminAt, l4KSMetricsAt, l4L7AdminPort,
		st.siteCA, os.Getpid(), filepath.Join(l4State, "admin.token"),
		ctld.PID(), o.APIAt, st.etcdEndpoint(), st.tryText(tg, tryDir, "ip netns exec "+p+"cl ", net.JoinHostPort(l4VIP, "443")),
		tg.bin, filepath.Join(tryDir, "drain-l7a.yaml"), filepath.Join(tryDir, "undrain-l7a.yaml"), filepath.Join(st.controlDir(), "store"),
		st.dashboardText(tg, o.APIAt, promURL))

	swHTTP := nsHTTP(n.sw, 2*time.Second)
	tgt.summary = func() []string {
		return []string{
			"keyserverd: " + keyserverOps(swHTTP, "http://"+l4KSMetricsAt+"/metrics"),
			"l4d: " + l4Members(ldHTTP),
		}
	}
	return clientLoop(ctx, s, tgt, out)
}

// l4dConfig is l4d's configuration in the L4 mode: the node's own settings, the
// rules and pools coming from controld.
func (st *site) l4dConfig(stateDir string) string {
	return fmt.Sprintf(`# Written by tgdemo on every run. The rules and pools come from controld
# (l4-rules and l4-pools in %s).
state_dir: %q   # l4d's generated admin token (admin.token) and control-snapshot.json
%sadmin_listen: %q
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
`, filepath.Join(st.dir, "stack.yaml"), stateDir, st.controlSection("l4d"), l4AdminAt, l4LDExternal, l4ClientIP, l4LDInternal, l4TunnelKey)
}

// waitL4Ready waits until l4d reports every member up and a request through the VIP
// succeeds.
func waitL4Ready(ctx context.Context, s *stack, ldHTTP *http.Client, t target) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case p := <-s.died:
			return p.Exited()
		case <-ctx.Done():
			return fmt.Errorf("waiting for the first request through the VIP: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		ss, err := promtext.Get(ctx, ldHTTP, "http://"+l4AdminAt+"/metrics")
		if err != nil {
			last = fmt.Errorf("reading l4d's metrics: %w", err)
			continue
		}
		up := ss.By("tiergate_l4_member_up", "member")
		var down []string
		for _, node := range l4Nodes {
			if up[node.label] != 1 {
				down = append(down, node.label)
			}
		}
		if len(down) > 0 {
			last = fmt.Errorf("l4d's health checks: %s not up", strings.Join(down, ", "))
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
	return fmt.Errorf("the L4 tier did not become ready in 30s: %w", last)
}

// l4Members summarises l4d's per-member metrics.
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
