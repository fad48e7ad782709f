package l4d

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// bgpRouter is a plain gobgp speaker standing for the LD's router, on 127.0.0.2; it
// accepts the LD's session from 127.0.0.1.
type bgpRouter struct {
	srv  *server.BgpServer
	port int
}

func freeTCPPort(t *testing.T, addr string) int {
	t.Helper()
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func newBGPRouter(t *testing.T, ldPort int) *bgpRouter {
	t.Helper()
	r := &bgpRouter{srv: server.NewBgpServer(), port: freeTCPPort(t, "127.0.0.2")}
	go r.srv.Serve()
	ctx := context.Background()
	if err := r.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: 65000, RouterId: "192.0.2.254",
		ListenPort: int32(r.port), ListenAddresses: []string{"127.0.0.2"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.srv.StopBgp(context.Background(), &api.StopBgpRequest{})
		r.srv.Stop()
	})
	if err := r.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
		Conf:      &api.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: 65001},
		Timers:    &api.Timers{Config: &api.TimersConfig{HoldTime: 3, KeepaliveInterval: 1, ConnectRetry: 1}},
		Transport: &api.Transport{PassiveMode: true, RemotePort: uint32(ldPort), LocalAddress: "127.0.0.2"},
	}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// state is the router's view: the VIP's next hop ("" when it has no route) and
// whether the session is established.
func (r *bgpRouter) state(t *testing.T) (nextHop string, up bool) {
	t.Helper()
	err := r.srv.ListPath(context.Background(), &api.ListPathRequest{TableType: api.TableType_GLOBAL,
		Family: &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}}, func(d *api.Destination) {
		for _, p := range d.Paths {
			if d.Prefix != "203.0.113.10/32" || !p.Best || p.IsWithdraw {
				continue
			}
			for _, a := range p.Pattrs {
				var nh api.NextHopAttribute
				if a.UnmarshalTo(&nh) == nil {
					nextHop = nh.NextHop
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.srv.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
		up = p.State != nil && p.State.SessionState == api.PeerState_ESTABLISHED
	})
	return nextHop, up
}

// waitRoute waits until the router has the VIP via nextHop ("" for withdrawn) over
// an established session.
func (r *bgpRouter) waitRoute(t *testing.T, nextHop string, td *testDaemon) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		nh, up := r.state(t)
		if nh == nextHop && up {
			return
		}
		if time.Now().After(deadline) {
			_, body := td.do("GET", "/bgp", "")
			t.Fatalf("the router has the VIP via %q (session up %v), want %q; GET /bgp:\n%s", nh, up, nextHop, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func bgpConfig(t *testing.T) (cfg string, r *bgpRouter) {
	ldPort := freeTCPPort(t, "127.0.0.1")
	r = newBGPRouter(t, ldPort)
	return testConfig + fmt.Sprintf(`lame_duck: 0s
bgp:
  asn: 65001
  listen_port: %d
  listen_addresses: [127.0.0.1]
  check_interval: 50ms
  withdraw_delay: 3s
  peers:
    - {address: 127.0.0.2, as: 65000, port: %d, local_address: 127.0.0.1, hold_time: 3s, connect_retry: 1s}
`, ldPort, r.port), r
}

// TestBGPAnnounce: l4d announces its VIP with the external address as next hop and
// withdraws it, with the reason in GET /bgp and the metrics, when a port goes down,
// when no member can take new flows, while an announce gate is closed, on POST
// /drain, and on stop before the datapath stops.
func TestBGPAnnounce(t *testing.T) {
	cfg, r := bgpConfig(t)
	td := startWith(t, cfg)
	var warm atomic.Bool
	warm.Store(true)
	td.AddAnnounceGate("warmup", func() (bool, string) { return warm.Load(), "waiting for the full sync" })
	r.waitRoute(t, "198.18.0.2", td)
	td.want("GET", "/bgp", "", 200, `"state": "established"`, `"vip": "203.0.113.10"`, `"announced": true`, `"drained": false`)

	withdrawnFor := func(reason string) {
		t.Helper()
		r.waitRoute(t, "", td)
		td.want("GET", "/bgp", "", 200, `"announced": false`, `"reason": "`+reason+`"`)
	}
	td.ports.dev("internal").down.Store(true)
	withdrawnFor("ports_down")
	td.ports.dev("internal").down.Store(false)
	r.waitRoute(t, "198.18.0.2", td)

	td.want("POST", "/pools/l7/members/a/drain", "", 200)
	td.want("POST", "/pools/l7/members/b/drain", "", 200)
	withdrawnFor("no_healthy_member")
	td.want("POST", "/pools/l7/members/b/undrain", "", 200)
	r.waitRoute(t, "198.18.0.2", td)

	warm.Store(false)
	withdrawnFor("warmup")
	td.want("GET", "/bgp", "", 200, `"why": "waiting for the full sync"`)
	warm.Store(true)
	r.waitRoute(t, "198.18.0.2", td)

	// POST /drain answers once the VIP is withdrawn.
	td.want("POST", "/drain", "", 200, `"drained": true`, `"reason": "drain"`)
	withdrawnFor("drain")
	td.want("GET", "/metrics", "", 200,
		`tiergate_l4_bgp_session_up{peer="127.0.0.2"} 1`,
		`tiergate_l4_bgp_prefixes_withdrawn{reason="drain"} 1`,
		`tiergate_l4_bgp_withdrawals_total{reason="drain"} 1`,
		`tiergate_l4_bgp_withdrawals_total{reason="ports_down"} 1`,
		`tiergate_l4_bgp_withdrawals_total{reason="no_healthy_member"} 1`,
		`tiergate_l4_bgp_withdrawals_total{reason="warmup"} 1`,
		`tiergate_l4_bgp_vip_announced{reason="drain",vip="203.0.113.10"} 0`)
	td.want("POST", "/undrain", "", 200, `"drained": false`)
	r.waitRoute(t, "198.18.0.2", td)
	td.want("GET", "/metrics", "", 200, `tiergate_l4_bgp_announcements_total 5`, `tiergate_l4_bgp_prefixes_announced 1`)

	// Stop: withdrawn over the live session, while the datapath still forwards.
	stopped := make(chan error, 1)
	go func() { stopped <- td.stop() }()
	r.waitRoute(t, "", td)
	select {
	case err := <-stopped:
		t.Fatalf("l4d stopped (%v) before the router saw the withdrawal", err)
	default:
	}
	// The workers still forward: a frame injected now is counted.
	truncated := func() bool {
		_, m := td.do("GET", "/metrics", "")
		return strings.Contains(m, `tiergate_l4_packets_total{dir="in",result="truncated"} 1`)
	}
	td.ports.dev("external").Inject([]byte{1, 2, 3})
	for deadline := time.Now().Add(5 * time.Second); !truncated(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the datapath did not take a frame during withdraw_delay")
		}
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// TestBGPReload: the bgp section is fixed at start; a reload of the same file keeps
// it, one that changes it is refused.
func TestBGPReload(t *testing.T) {
	const section = "bgp: {asn: 65001, listen_port: -1, peers: [{address: 127.0.0.9, as: 65000, passive: true}]}\n"
	td := startWith(t, testConfig+section)
	td.want("GET", "/bgp", "", 200, `"address": "127.0.0.9"`, `"asn": 65001`, `"announced": true`)
	td.want("POST", "/reload", "", 200)
	writeFile(t, td.Path, testConfig+strings.Replace(section, "65001", "65002", 1))
	apiErr(t, td.want("POST", "/reload", "", 409, "bgp cannot change at runtime"), 409, "restart_required")
}

func TestBGPConfig(t *testing.T) {
	td := startWith(t, testConfig)
	apiErr(t, td.want("GET", "/bgp", "", 404), 404, "not_found")
	td.want("POST", "/drain", "", 404)

	for _, c := range []struct{ yaml, want string }{
		{"bgp: {asn: 65001, peers: [{address: 198.18.0.1}]}", "bgp.peers[0].as: required"},
		{"bgp: {asn: 65001, peers: [{address: 198.18.0.1, as: 1, hold_time: 1s}]}", "bgp.peers[0].hold_time: 1s is outside 3s..65535s"},
		{"bgp: {asn: 65001}", "bgp.peers: at least one peer"},
		{"bgp: {peers: [{address: 198.18.0.1, as: 1}], next_hop6: 198.18.0.9}", "bgp.next_hop6: 198.18.0.9 is not an IPv6 address"},
		{"bgp: {asn: 65001, peers: [{address: 198.18.0.1, as: 1}], bfd: {enabled: true, min_tx: 1ms}}", "bgp.bfd.min_tx: 1ms is outside 10ms..1m"},
	} {
		_, err := ParseConfig([]byte(testConfig+c.yaml+"\n"), "l4d.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.yaml, err, c.want)
		}
	}
	v6 := strings.Replace(testConfig, "vip: 203.0.113.10", `vip: "2001:db8::10"`, 1) + "bgp: {asn: 65001, peers: [{address: 198.18.0.1, as: 1}]}\n"
	if _, err := ParseConfig([]byte(v6), "l4d.yaml"); err == nil || !strings.Contains(err.Error(), "rules[0].vip: 2001:db8::10 cannot be announced") {
		t.Errorf("IPv6 VIP without an IPv6 next hop: %v", err)
	}
	c, err := ParseConfig([]byte(testConfig+"bgp: {asn: 65001, peers: [{address: 198.18.0.1, as: 65000}]}\n"), "l4d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if b := c.BGP; b.NextHop.String() != "198.18.0.2" || b.RouterID != b.NextHop || b.Peers[0].HoldTime.D() != 9*time.Second {
		t.Errorf("defaults: %+v", b)
	}
	if got, want := c.bgpSummary(), "BGP: AS 65001, router id 198.18.0.2, next hop 198.18.0.2; peers 198.18.0.1 AS 65000 (hold 9s); withdraw_delay 3s"; got != want {
		t.Errorf("l4d check says %q, want %q", got, want)
	}
	c, err = ParseConfig([]byte(testConfig+"bgp: {asn: 65001, bfd: {enabled: true}, peers: [{address: 198.18.0.1, as: 65000}, {address: 198.18.0.9, as: 65000, bfd: false}]}\n"), "l4d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.bgpSummary(), "BGP: AS 65001, router id 198.18.0.2, next hop 198.18.0.2; peers 198.18.0.1 AS 65000 (hold 9s, BFD 300ms x 3), 198.18.0.9 AS 65000 (hold 9s); withdraw_delay 3s"; got != want {
		t.Errorf("l4d check says %q, want %q", got, want)
	}
}
