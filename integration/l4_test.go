package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// The L4 test network, all in namespaces:
//
//	cl (client 198.18.0.1) ── x0 ┐
//	                             ld: l4d (DPDK net_af_packet on x0 and i0; m0 198.18.1.2 for health checks)
//	       sw: bridge br0 ── i0 ┘, m0
//	       (backend 198.18.1.100:8080 on br0)
//	       ├── l7a (198.18.1.11, l7d + tunnel endpoint, QUIC server ID 1)
//	       └── l7b (198.18.1.12, l7d + tunnel endpoint, QUIC server ID 2)
//
// The client reaches VIP 203.0.113.10 through the LD at 198.18.0.2; the LD tunnels
// each flow to an L7 node in GRE; the L7 nodes answer through the LD.
const (
	l4VIP         = "203.0.113.10"
	l4Client      = "198.18.0.1"
	l4BackendAddr = "198.18.1.100:8080"
)

type l4Net struct {
	cl, ld, sw *netns.NS
	l7         [2]*netns.NS
}

func newL4Net(t *testing.T) *l4Net {
	n := &l4Net{
		cl: netns.New(t, "cl"), ld: netns.New(t, "ld"), sw: netns.New(t, "sw"),
		l7: [2]*netns.NS{netns.New(t, "l7a"), netns.New(t, "l7b")},
	}
	netns.Veth(t, n.cl, "c0", n.ld, "x0")
	netns.Veth(t, n.ld, "i0", n.sw, "si")
	netns.Veth(t, n.ld, "m0", n.sw, "sm")
	netns.Veth(t, n.l7[0], "a0", n.sw, "sa")
	netns.Veth(t, n.l7[1], "b0", n.sw, "sb")
	netns.Bridge(t, n.sw, "br0", "si", "sm", "sa", "sb")
	n.sw.Addr("br0", "198.18.1.100/24")

	n.cl.Addr("c0", l4Client+"/24")
	n.cl.Route("add", "203.0.113.0/24", "via", "198.18.0.2")
	// The client's kernel must hand the LD whole, checksummed frames (a veth would
	// otherwise leave checksums to an offload that a packet socket never does).
	for _, ns := range []*netns.NS{n.cl, n.sw, n.l7[0], n.l7[1]} {
		for _, dev := range []string{"c0", "si", "sm", "sa", "sb", "a0", "b0"} {
			if _, err := ns.Run("ip", "link", "show", dev); err == nil {
				ns.MustRun("ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off")
			}
		}
	}
	// The LD's DPDK ports: no kernel addresses, no IPv6 chatter.
	for _, dev := range []string{"x0", "i0"} {
		n.ld.Sysctl("net.ipv6.conf."+dev+".disable_ipv6", "1")
		n.ld.MustRun("ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off")
	}
	n.ld.Addr("m0", "198.18.1.2/24")
	n.ld.Up("lo")
	n.l7[0].Addr("a0", "198.18.1.11/24")
	n.l7[1].Addr("b0", "198.18.1.12/24")
	for _, ns := range []*netns.NS{n.cl, n.sw, n.l7[0], n.l7[1]} {
		ns.Up("lo")
	}
	return n
}

// nsClient is an HTTP client whose connections are made inside ns.
func nsClient(ns *netns.NS, tlsCfg *tls.Config, keepAlive bool) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.Do(func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
		TLSClientConfig:   tlsCfg,
		DisableKeepAlives: !keepAlive,
		MaxConnsPerHost:   1,
		ForceAttemptHTTP2: false,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// l4Backend answers every request with the address it came from (the L7 node) and
// the X-Real-IP the L7 node set.
type l4Backend struct {
	mu   sync.Mutex
	seen map[string]int // "node realIP" → requests
}

func startL4Backend(t *testing.T, ns *netns.NS) *l4Backend {
	b := &l4Backend{seen: map[string]int{}}
	ln := ns.Listen(l4BackendAddr)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, _, _ := net.SplitHostPort(r.RemoteAddr)
		b.mu.Lock()
		b.seen[node+" "+r.Header.Get("X-Real-IP")]++
		b.mu.Unlock()
		fmt.Fprintf(w, "node=%s real=%s\n", node, r.Header.Get("X-Real-IP"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return b
}

// get fetches url and returns the node that served it (from the backend's answer).
func l4Get(c *http.Client, url string) (node, real string, err error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", "", err
	}
	if resp.StatusCode != 200 {
		return "", "", fmt.Errorf("status %s: %s", resp.Status, body)
	}
	for _, f := range strings.Fields(string(body)) {
		if v, ok := strings.CutPrefix(f, "node="); ok {
			node = v
		}
		if v, ok := strings.CutPrefix(f, "real="); ok {
			real = v
		}
	}
	return node, real, nil
}

// nsDaemon starts a daemon inside ns, with its health checked from inside ns.
func nsDaemon(t *testing.T, ns *netns.NS, name, health string, args ...string) *daemon {
	dir := t.TempDir()
	d := &daemon{t: t, name: name, args: append([]string{"ip", "netns", "exec", ns.Name()}, args...),
		health: health, log: filepath.Join(dir, name+".log"), client: nsClient(ns, nil, false)}
	d.start()
	t.Cleanup(d.stop)
	return d
}

func TestL4EndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "ethtool", "ethtool")
	testenv.RequireCommand(t, "tshark", "tshark")
	testenv.RequireCommand(t, "curl", "curl")
	testenv.RequireFile(t, "/usr/include/dpdk/rte_eal.h", "libdpdk-dev")
	bin := binaries(t)
	n := newL4Net(t)
	backend := startL4Backend(t, n.sw)

	site := newSite(t)
	cert := site.cert(t, "l4", ecKey(t), true, "l4.test")
	key := strings.TrimSuffix(cert, ".pem") + ".key"
	for i, ns := range n.l7 {
		cfg := filepath.Join(t.TempDir(), "l7d.yaml")
		yaml := fmt.Sprintf(`
listeners: [{addr: "0.0.0.0:443", pool: web, quic_server_id: %d}]
backends: {web: {members: ["%s"]}}
certificates: {certificates: [{cert_file: "%s", key_file: "%s"}]}
tunnel: {vips: [%s], lds: ["198.18.1.1"]}
admin_listen: "0.0.0.0:9241"
admin_insecure: true           # the node's own namespace: the LD health-checks it
shutdown_grace: 2s
`, i+1, l4BackendAddr, cert, key, l4VIP)
		if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		addr := []string{"198.18.1.11", "198.18.1.12"}[i]
		nsDaemon(t, ns, fmt.Sprintf("l7d-%c", 'a'+i), "http://"+addr+":9241/healthz",
			filepath.Join(bin, "l7d"), "run", "-config", cfg)
	}

	l4dir := t.TempDir()
	l4cfg := filepath.Join(l4dir, "l4d.yaml")
	if err := os.WriteFile(l4cfg, []byte(`
admin_listen: "127.0.0.1:9180"
state_dir: "`+l4dir+`"           # the admin token l4d generates
dpdk:
  eal_args: ["--no-pci", "--no-huge", "-m", "512", "--no-telemetry", "--log-level=warning",
             "--vdev=net_af_packet0,iface=x0,qpairs=2", "--vdev=net_af_packet1,iface=i0,qpairs=2"]
  workers: 2                    # two lcores, each with its queue pair and table shard
conntrack: {capacity: 1024}   # small, so that the SYN flood below fills it
ports:
  external: {device: net_af_packet0, addr: "198.18.0.2/24", gateway: "198.18.0.1"}
  internal: {device: net_af_packet1, addr: "198.18.1.1/24"}
rules:
  - {name: https, vip: "`+l4VIP+`", protocol: tcp, port: 443, pool: l7}
  - {name: quic, vip: "`+l4VIP+`", protocol: udp, port: 443, pool: l7, quic: true}
pools:
  l7:
    members:
      - {name: a, address: "198.18.1.11", quic_id: 1, health_addr: "198.18.1.11:9241"}
      - {name: b, address: "198.18.1.12", quic_id: 2, health_addr: "198.18.1.12:9241"}
    health: {type: http, path: /healthz, interval: 500ms, timeout: 400ms}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	l4d := nsDaemon(t, n.ld, "l4d", "http://127.0.0.1:9180/healthz", filepath.Join(bin, "l4d"), "run", "-config", l4cfg)
	ldHTTP := nsClient(n.ld, nil, false)
	l4metric := func(name string, filters ...string) float64 {
		return scrapeWith(ldHTTP, "http://127.0.0.1:9180/metrics", name, filters...)
	}

	// Capture the tunnel on the internal link while the first requests pass.
	capture := n.sw.Command("tshark", "-i", "si", "-n", "-l", "-f", "ip proto 47", "-c", "4", "-a", "duration:60",
		"-T", "fields", "-e", "ip.src", "-e", "ip.dst", "-e", "gre.proto")
	capOut, err := capture.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	capErr := &testenv.LockedBuffer{}
	capture.Stderr = capErr
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	capLines := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(capOut)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		capLines <- lines
	}()
	waitFor(t, 20*time.Second, "tshark to start capturing", func() bool { return strings.Contains(capErr.String(), "Capturing on") })

	tlsCfg := &tls.Config{RootCAs: site.pool(), ServerName: "l4.test"}
	url := "https://" + l4VIP + "/"

	// 1. curl through the VIP, HTTP/1.1 and HTTP/2, each a new connection; wait
	// for the LD to have resolved its neighbours first.
	waitFor(t, 20*time.Second, "the first request through the VIP", func() bool {
		_, err := n.cl.Run("curl", "-sS", "--max-time", "3", "--cacert", site.caFile(), "--resolve", "l4.test:443:"+l4VIP, "https://l4.test/")
		return err == nil
	})
	for _, flag := range []string{"--http1.1", "--http2"} {
		out, err := n.cl.Run("curl", "-sS", flag, "--max-time", "5", "--cacert", site.caFile(),
			"--resolve", "l4.test:443:"+l4VIP, "-w", " proto=%{http_version}", "https://l4.test/")
		if err != nil {
			t.Fatalf("curl %s through the VIP: %v\n%s\nl4d:\n%s", flag, err, out, l4d.logTail())
		}
		if !strings.Contains(out, "real="+l4Client) {
			t.Errorf("curl %s: backend saw %q, want X-Real-IP %s", flag, out, l4Client)
		}
	}

	// 2. The tunnel as tshark decodes it: GRE from the LD carrying the client's packet.
	select {
	case lines := <-capLines:
		ok := false
		for _, l := range lines {
			// ip.src lists the outer then the inner source.
			if strings.Contains(l, "198.18.1.1,"+l4Client) || strings.Contains(l, "198.18.1.1,198.18.0.1") {
				ok = true
			}
		}
		if !ok {
			t.Errorf("tshark did not see GRE from the LD carrying %s: %q", l4Client, lines)
		}
	case <-time.After(30 * time.Second):
		t.Error("tshark captured nothing")
	}
	capture.Process.Kill()
	capture.Wait()

	// 3. New connections spread over both L7 nodes; every one sees the client's address.
	fresh := nsClient(n.cl, tlsCfg, false)
	nodes := map[string]int{}
	for i := range 24 {
		node, real, err := l4Get(fresh, url)
		if err != nil {
			t.Fatalf("request %d: %v\nl4d:\n%s", i, err, l4d.logTail())
		}
		if real != l4Client {
			t.Fatalf("request %d: X-Real-IP %q, want %s", i, real, l4Client)
		}
		nodes[node]++
	}
	if len(nodes) != 2 {
		t.Fatalf("new connections reached %v: want both L7 nodes", nodes)
	}

	// 4. HTTP/3 through the VIP (routed by the connection IDs the nodes issue).
	for i := range 4 {
		node, real, err := h3Get(t, n.cl, tlsCfg, url)
		if err != nil {
			t.Fatalf("HTTP/3 request %d: %v\nl4d:\n%s", i, err, l4d.logTail())
		}
		if real != l4Client || node == "" {
			t.Fatalf("HTTP/3 request %d: node %q real %q", i, node, real)
		}
	}
	// Workers publish their counters every 100 ms.
	waitFor(t, 5*time.Second, "packets counted for the QUIC rule", func() bool {
		return l4metric("tiergate_l4_rule_packets_total", `rule="quic"`) > 0
	})

	// 5. A long-lived connection, then its node drained: new connections all go to
	// the other node; the long-lived one keeps working on its node.
	long := nsClient(n.cl, tlsCfg, true)
	longNode, _, err := l4Get(long, url)
	if err != nil {
		t.Fatal(err)
	}
	member := map[string]string{"198.18.1.11": "a", "198.18.1.12": "b"}[longNode]
	token, err := os.ReadFile(filepath.Join(l4dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	drain, _ := http.NewRequest("POST", "http://127.0.0.1:9180/pools/l7/members/"+member+"/drain", nil)
	drain.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := ldHTTP.Do(drain)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("drain: %s", resp.Status)
	}
	for i := range 16 {
		node, _, err := l4Get(fresh, url)
		if err != nil {
			t.Fatalf("request %d after the drain: %v", i, err)
		}
		if node == longNode {
			t.Fatalf("new connection %d reached drained node %s", i, node)
		}
		if i%4 == 0 {
			got, _, err := l4Get(long, url)
			if err != nil || got != longNode {
				t.Fatalf("long-lived connection after the drain: node %s, err %v; want %s", got, err, longNode)
			}
		}
	}

	// 6. Counters: forwarded both ways, nothing dropped for lack of a member or room.
	if v := l4metric("tiergate_l4_packets_total", `dir="in"`, `result="forwarded"`); v < 50 {
		t.Errorf("in/forwarded = %v", v)
	}
	if v := l4metric("tiergate_l4_packets_total", `dir="out"`, `result="forwarded"`); v < 50 {
		t.Errorf("out/forwarded = %v", v)
	}
	for _, r := range []string{"no_member", "table_full", "no_neighbor", "bad_tunnel"} {
		if v := l4metric("tiergate_l4_packets_total", `result="`+r+`"`); v > 3 {
			t.Errorf("%s drops: %v", r, v)
		}
	}
	// 7. Garbage on both ports: random, truncated and corrupted frames are dropped
	// and counted; l4d keeps forwarding.
	before := l4metric("tiergate_l4_packets_total", `!result="forwarded"`, `!result="local"`)
	sent := sendGarbage(t, n.cl, "c0", 2000) + sendGarbage(t, n.sw, "si", 2000)
	waitFor(t, 10*time.Second, "garbage counted as drops", func() bool {
		return l4metric("tiergate_l4_packets_total", `!result="forwarded"`, `!result="local"`)-before >= float64(sent)/2
	})
	if _, _, err := l4Get(fresh, url); err != nil {
		t.Fatalf("request after garbage: %v\nl4d:\n%s", err, l4d.logTail())
	}
	for _, r := range []string{"truncated", "malformed", "unsupported"} {
		if v := l4metric("tiergate_l4_packets_total", `result="`+r+`"`); v <= 0 {
			t.Errorf("no %s drops counted after garbage", r)
		}
	}

	// 8. A SYN flood from spoofed sources fills the connection table with half-open
	// entries; the oldest are evicted (TGW's LRU half-open queue), so real clients
	// still connect, and nothing is dropped for a full table.
	sendSYNFlood(t, n.cl, "c0", 5000)
	waitFor(t, 10*time.Second, "half-open evictions", func() bool {
		return l4metric("tiergate_l4_conntrack_evictions_total") > 0
	})
	for i := range 8 {
		if _, real, err := l4Get(fresh, url); err != nil || real != l4Client {
			t.Fatalf("request %d during the flood's aftermath: real %q, err %v", i, real, err)
		}
	}
	if v := l4metric("tiergate_l4_packets_total", `result="table_full"`); v > 0 {
		t.Errorf("table_full drops during a SYN flood: %v (half-open entries should have been evicted)", v)
	}

	backend.mu.Lock()
	defer backend.mu.Unlock()
	for k := range backend.seen {
		if !strings.HasSuffix(k, " "+l4Client) {
			t.Errorf("backend saw a request with %q, want every one from %s", k, l4Client)
		}
	}
}

// h3Get makes one HTTP/3 request from inside ns.
func h3Get(t *testing.T, ns *netns.NS, tlsCfg *tls.Config, url string) (node, real string, err error) {
	var conn *net.UDPConn
	ns.MustDo(func() error {
		var err error
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(l4Client)})
		return err
	})
	tr := &quic.Transport{Conn: conn}
	defer tr.Close()
	h3 := &http3.Transport{
		TLSClientConfig: tlsCfg,
		Dial: func(ctx context.Context, addr string, tlsConf *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			ua, err := net.ResolveUDPAddr("udp", addr)
			if err != nil {
				return nil, err
			}
			return tr.DialEarly(ctx, ua, tlsConf, qc)
		},
	}
	defer h3.Close()
	return l4Get(&http.Client{Transport: h3, Timeout: 10 * time.Second}, url)
}

// packetSocket opens a raw packet socket and the address that sends on dev (in the
// calling thread's namespace), which carries dev's MAC.
func packetSocket(dev string) (int, *unix.SockaddrLinklayer, error) {
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		return -1, nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		return -1, nil, err
	}
	addr := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
	copy(addr.Addr[:], ifi.HardwareAddr)
	return fd, addr, nil
}

// sendGarbage writes count random, truncated and corrupted Ethernet frames on dev
// in ns through a packet socket, and returns how many it sent.
func sendGarbage(t *testing.T, ns *netns.NS, dev string, count int) int {
	t.Helper()
	sent := 0
	ns.MustDo(func() error {
		fd, addr, err := packetSocket(dev)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		rng := mrand.New(mrand.NewPCG(uint64(count), 7))
		// A valid TCP SYN to the VIP to cut and corrupt.
		valid := []byte{
			0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00,
			0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 198, 18, 0, 1, 203, 0, 113, 10,
			0x9c, 0x40, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
		}
		copy(valid[0:6], addr.Addr[:6]) // any MAC: the LD's port reads every frame
		for i := range count {
			var f []byte
			switch i % 4 {
			case 0: // random bytes, at least an Ethernet header
				f = make([]byte, 14+rng.IntN(120))
				for j := range f {
					f[j] = byte(rng.Uint32())
				}
			case 1: // an IPv4 frame cut short
				f = append([]byte(nil), valid[:14+rng.IntN(20)]...)
			case 2: // corrupted header fields
				f = append([]byte(nil), valid...)
				f[14+rng.IntN(20)] ^= byte(1 + rng.IntN(255))
			default: // an unknown EtherType
				f = append([]byte(nil), valid...)
				f[12], f[13] = 0x88, 0xb5
			}
			if len(f) < 60 && i%4 != 1 {
				f = append(f, make([]byte, 60-len(f))...)
			}
			if err := unix.Sendto(fd, f, 0, addr); err == nil {
				sent++
			}
		}
		return nil
	})
	return sent
}

// sendSYNFlood writes count TCP SYNs to the VIP from spoofed sources in
// 192.0.2.0/24 and 198.51.100.0/24, through a packet socket on dev in ns.
func sendSYNFlood(t *testing.T, ns *netns.NS, dev string, count int) {
	t.Helper()
	ns.MustDo(func() error {
		fd, addr, err := packetSocket(dev)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		f := []byte{
			0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00,
			0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 192, 0, 2, 0, 203, 0, 113, 10,
			0, 0, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
			0, 0, 0, 0, 0, 0,
		}
		for i := range count {
			ip := f[14:34]
			ip[12], ip[13], ip[14], ip[15] = 192, 0, 2, byte(i)
			if i&256 != 0 {
				ip[12], ip[13], ip[14] = 198, 51, 100
			}
			f[34], f[35] = byte(1024+i>>8), byte(i) // source port
			ip[10], ip[11] = 0, 0
			var sum uint32
			for j := 0; j < 20; j += 2 {
				sum += uint32(ip[j])<<8 | uint32(ip[j+1])
			}
			for sum > 0xffff {
				sum = sum&0xffff + sum>>16
			}
			ip[10], ip[11] = byte(^sum>>8), byte(^sum)
			if err := unix.Sendto(fd, f, 0, addr); err != nil {
				return err
			}
		}
		return nil
	})
}
