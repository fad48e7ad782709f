package integration

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/l7/tunnel"
	"github.com/tiergate/tiergate/testkit/netns"
)

// l4Single is the network of the tests of one LD's defences (SYN proxy, overload,
// tracing), each test with its own prefix for the namespaces and its own N for the
// addresses (198.19.N.0/24 outside, 198.19.N+1.0/24 inside):
//
//	<prefix>cl (client 198.19.N.1) ── c0 ─ x0 ┐
//	                                          <prefix>ld: l4d (DPDK net_af_packet on x0 and i0, one worker)
//	<prefix>m (member 198.19.N+1.11) ── m0 ─ i0 ┘     (external 198.19.N.2, internal 198.19.N+1.1)
//
// The client reaches 203.0.113.0/24 (the VIPs) through the LD. Offloads are off on
// every device, so that DPDK's af_packet and the packet sockets of the tests see
// whole, checksummed frames.
type l4Single struct {
	t         *testing.T
	cl, ld, m *netns.NS
	n         int
	dir       string // l4d's state directory and configuration
	// External6 is added to l4d's external port (addr6, gateway6), when set.
	External6 string
}

func newL4Single(t *testing.T, prefix string, n int) *l4Single {
	s := &l4Single{t: t, n: n, dir: t.TempDir(),
		cl: netns.New(t, prefix+"cl"), ld: netns.New(t, prefix+"ld"), m: netns.New(t, prefix+"m")}
	netns.Veth(t, s.cl, "c0", s.ld, "x0")
	netns.Veth(t, s.ld, "i0", s.m, "m0")
	s.cl.Addr("c0", s.client()+"/24")
	s.cl.Route("add", "203.0.113.0/24", "via", s.ldExternal())
	s.m.Addr("m0", s.member()+"/24")
	for _, dev := range []string{"x0", "i0"} {
		s.ld.Sysctl("net.ipv6.conf."+dev+".disable_ipv6", "1")
		s.ld.Up(dev)
	}
	for _, x := range []struct {
		ns  *netns.NS
		dev string
	}{{s.cl, "c0"}, {s.m, "m0"}, {s.ld, "x0"}, {s.ld, "i0"}} {
		x.ns.MustRun("ethtool", "-K", x.dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off")
	}
	return s
}

func (s *l4Single) client() string     { return fmt.Sprintf("198.19.%d.1", s.n) }
func (s *l4Single) ldExternal() string { return fmt.Sprintf("198.19.%d.2", s.n) }
func (s *l4Single) ldInternal() string { return fmt.Sprintf("198.19.%d.1", s.n+1) }
func (s *l4Single) member() string     { return fmt.Sprintf("198.19.%d.11", s.n+1) }

// tunnel runs the member's end of the tunnel (l7/tunnel, in the test process) on
// device dev for vips, until the test ends.
func (s *l4Single) tunnel(dev string, vips ...string) {
	cfg := tunnel.Config{Device: dev, LDs: []netip.Addr{netip.MustParseAddr(s.ldInternal())},
		Local: netip.MustParseAddr(s.member()), Logger: slog.New(slog.DiscardHandler)}
	for _, v := range vips {
		cfg.VIPs = append(cfg.VIPs, netip.MustParseAddr(v))
	}
	var ep *tunnel.Endpoint
	s.m.MustDo(func() error {
		var err error
		ep, err = tunnel.New(cfg)
		return err
	})
	s.t.Cleanup(func() { ep.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ep.Run(ctx) }()
	s.t.Cleanup(func() { cancel(); <-done })
}

// start writes l4d's configuration, the admin API, DPDK on x0 and i0 with one worker
// and the two ports followed by rest (rules, pools and the test's own sections),
// and runs l4d from bin in the LD's namespace until the test ends. It returns the
// daemon and a client of the LD's namespace for its admin API (127.0.0.1:9180).
func (s *l4Single) start(bin, rest string) (*daemon, *http.Client) {
	s.t.Helper()
	ext6 := ""
	if s.External6 != "" {
		ext6 = ",\n             " + s.External6
	}
	cfg := fmt.Sprintf(`
admin_listen: "127.0.0.1:9180"
state_dir: %q
dpdk:
  eal_args: ["--no-pci", "--no-huge", "-m", "512", "--no-telemetry", "--log-level=warning",
             "--vdev=net_af_packet0,iface=x0", "--vdev=net_af_packet1,iface=i0"]
  workers: 1
ports:
  external: {device: net_af_packet0, addr: "%s/24", gateway: "%s"%s}
  internal: {device: net_af_packet1, addr: "%s/24"}
`, s.dir, s.ldExternal(), s.client(), ext6, s.ldInternal()) + rest
	path := filepath.Join(s.dir, "l4d.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		s.t.Fatal(err)
	}
	d := nsDaemon(s.t, s.ld, "l4d", "http://127.0.0.1:9180/healthz", filepath.Join(bin, "l4d"), "run", "-config", path)
	return d, nsClient(s.ld, nil, false)
}

// token is l4d's admin token, for the endpoints that need one.
func (s *l4Single) token() string {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dir, "admin.token"))
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
