// Plain TCP listeners, as cmd/l4d has them: TCP MD5 needs them.
//
//go:debug multipathtcp=0
package bgp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
)

// freePort returns a TCP port nothing listens on at addr now.
func freePort(t *testing.T, addr string) int32 {
	t.Helper()
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

// router is a second, plain gobgp speaker standing for the LD's router: it listens
// on 127.0.0.2 and accepts the LD's session from 127.0.0.1.
type router struct {
	srv  *server.BgpServer
	port int32
}

func newRouter(t *testing.T, ldPort int32, password string) *router {
	t.Helper()
	r := &router{srv: server.NewBgpServer(server.LoggerOption(newLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))),
		port: freePort(t, "127.0.0.2")}
	go r.srv.Serve()
	ctx := context.Background()
	if err := r.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: 65000, RouterId: "192.0.2.254",
		ListenPort: r.port, ListenAddresses: []string{"127.0.0.2"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.srv.StopBgp(context.Background(), &api.StopBgpRequest{})
		r.srv.Stop()
	})
	peer := &api.Peer{
		Conf:      &api.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: 65001, AuthPassword: password},
		Timers:    &api.Timers{Config: &api.TimersConfig{HoldTime: 3, KeepaliveInterval: 1, ConnectRetry: 1}},
		Transport: &api.Transport{PassiveMode: true, RemotePort: uint32(ldPort), LocalAddress: "127.0.0.2"},
		AfiSafis: []*api.AfiSafi{{Config: &api.AfiSafiConfig{Family: familyIPv4, Enabled: true}},
			{Config: &api.AfiSafiConfig{Family: familyIPv6, Enabled: true}}},
	}
	if err := r.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
		t.Fatal(err)
	}
	return r
}

// routes returns the router's best routes: prefix → next hop.
func (r *router) routes(t *testing.T) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, fam := range []*api.Family{familyIPv4, familyIPv6} {
		err := r.srv.ListPath(context.Background(), &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: fam},
			func(d *api.Destination) {
				for _, p := range d.Paths {
					if !p.Best || p.IsWithdraw {
						continue
					}
					got[d.Prefix] = nextHop(t, p)
				}
			})
		if err != nil {
			t.Fatal(err)
		}
	}
	return got
}

func nextHop(t *testing.T, p *api.Path) string {
	for _, a := range p.Pattrs {
		var nh api.NextHopAttribute
		if a.UnmarshalTo(&nh) == nil {
			return nh.NextHop
		}
		var mp api.MpReachNLRIAttribute
		if a.UnmarshalTo(&mp) == nil && len(mp.NextHops) > 0 {
			return mp.NextHops[0]
		}
	}
	t.Errorf("path %v has no next hop", p)
	return ""
}

// waitFor polls cond until it holds or 20 s have passed.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last: %s", what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func writePassword(t *testing.T, pw string) string {
	path := filepath.Join(t.TempDir(), "md5.key")
	if err := os.WriteFile(path, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newSpeaker(t *testing.T, password string, reg prometheus.Registerer) (*Speaker, *router) {
	t.Helper()
	ldPort := freePort(t, "127.0.0.1")
	r := newRouter(t, ldPort, password)
	cfg := Config{
		ASN:             65001,
		ListenPort:      ldPort,
		ListenAddresses: []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		NextHop:         netip.MustParseAddr("198.18.0.2"),
		NextHop6:        netip.MustParseAddr("2001:db8::2"),
		Peers: []PeerConfig{{Address: netip.MustParseAddr("127.0.0.2"), AS: 65000, Port: uint16(r.port),
			LocalAddress: netip.MustParseAddr("127.0.0.1"), HoldTime: config.Duration(3 * time.Second), ConnectRetry: config.Duration(time.Second)}},
	}
	if password != "" {
		cfg.Peers[0].PasswordFile = writePassword(t, password)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s, r
}

func established(s *Speaker) (bool, string) {
	st := s.Status(context.Background())
	return len(st.Peers) == 1 && st.Peers[0].State == "established", fmt.Sprintf("%+v", st.Peers)
}

// TestAnnounceWithdraw: a VIP announced reaches the router with the LD's next hop,
// one withdrawn leaves it, with its reason in the status and the metrics; IPv6 too;
// stopping withdraws everything.
func TestAnnounceWithdraw(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, r := newSpeaker(t, "", reg)
	ctx := context.Background()
	vip4, vip6 := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("2001:db8:10::10")
	// Set before Start: announced once started.
	if err := s.Set(ctx, map[netip.Addr]string{vip4: "", vip6: ""}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	waitFor(t, "the session", func() (bool, string) { return established(s) })
	want := map[string]string{"203.0.113.10/32": "198.18.0.2", "2001:db8:10::10/128": "2001:db8::2"}
	waitFor(t, "both VIPs at the router", func() (bool, string) {
		got := r.routes(t)
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})

	if err := s.Set(ctx, map[netip.Addr]string{vip4: ReasonNoHealthyMember, vip6: ""}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the IPv4 VIP withdrawn", func() (bool, string) {
		got := r.routes(t)
		return len(got) == 1 && got["2001:db8:10::10/128"] == "2001:db8::2", fmt.Sprint(got)
	})
	st := s.Status(ctx)
	if st.Announced != 1 || st.Withdrawn != 1 || st.VIPs[0].VIP != "203.0.113.10" || st.VIPs[0].Reason != ReasonNoHealthyMember ||
		st.Withdrawals[ReasonNoHealthyMember] != 1 || st.Announcements != 2 {
		t.Fatalf("status %+v", st)
	}
	if st.Peers[0].UptimeSeconds <= 0 || st.Peers[0].HoldTime != 3 {
		t.Fatalf("peer %+v", st.Peers[0])
	}
	for _, m := range []struct {
		name   string
		labels string
		want   float64
	}{
		{"tiergate_l4_bgp_session_up", `peer="127.0.0.2"`, 1},
		{"tiergate_l4_bgp_session_state", `peer="127.0.0.2",state="established"`, 1},
		{"tiergate_l4_bgp_prefixes_announced", ``, 1},
		{"tiergate_l4_bgp_prefixes_withdrawn", `reason="no_healthy_member"`, 1},
		{"tiergate_l4_bgp_withdrawals_total", `reason="no_healthy_member"`, 1},
		{"tiergate_l4_bgp_vip_announced", `reason="no_healthy_member",vip="203.0.113.10"`, 0},
		{"tiergate_l4_bgp_vip_announced", `reason="",vip="2001:db8:10::10"`, 1},
	} {
		if got := metric(t, reg, m.name, m.labels); got != m.want {
			t.Errorf("%s{%s} = %v, want %v", m.name, m.labels, got, m.want)
		}
	}

	// The same reason again changes nothing; another reason is reported, not
	// counted as a second withdrawal.
	if err := s.Set(ctx, map[netip.Addr]string{vip4: ReasonDrain, vip6: ""}); err != nil {
		t.Fatal(err)
	}
	if st := s.Status(ctx); st.VIPs[0].Reason != ReasonDrain || st.Withdrawals[ReasonNoHealthyMember] != 1 || st.Withdrawals[ReasonDrain] != 0 {
		t.Fatalf("status %+v", st)
	}
	// Announced again.
	if err := s.Set(ctx, map[netip.Addr]string{vip4: "", vip6: ""}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both VIPs back", func() (bool, string) {
		got := r.routes(t)
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})
	// A VIP no longer given is withdrawn and forgotten.
	if err := s.Set(ctx, map[netip.Addr]string{vip4: ""}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the IPv6 VIP gone", func() (bool, string) {
		got := r.routes(t)
		return len(got) == 1 && got["203.0.113.10/32"] == "198.18.0.2", fmt.Sprint(got)
	})
	if st := s.Status(ctx); len(st.VIPs) != 1 || st.Withdrawals[ReasonRemoved] != 1 {
		t.Fatalf("status %+v", st)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every route gone after Stop", func() (bool, string) {
		got := r.routes(t)
		return len(got) == 0, fmt.Sprint(got)
	})
	if st := s.Status(ctx); st.Running || st.Peers[0].State != "idle" || st.VIPs[0].Reason != ReasonNotStarted {
		t.Fatalf("status after Stop %+v", st)
	}
}

// TestWithdrawAll withdraws every VIP for one reason, and a VIP of a family without
// a next hop is refused.
func TestWithdrawAll(t *testing.T) {
	s, r := newSpeaker(t, "", nil)
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	a, b := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	if err := s.Set(ctx, map[netip.Addr]string{a: "", b: ""}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both VIPs at the router", func() (bool, string) {
		got := r.routes(t)
		return len(got) == 2, fmt.Sprint(got)
	})
	if err := s.WithdrawAll(ctx, ReasonShutdown); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both VIPs withdrawn while the session stays up", func() (bool, string) {
		got := r.routes(t)
		up, peers := established(s)
		return len(got) == 0 && up, fmt.Sprint(got, peers)
	})
	if st := s.Status(ctx); st.Withdrawals[ReasonShutdown] != 2 {
		t.Fatalf("status %+v", st)
	}

	s.cfg.NextHop6 = netip.Addr{}
	err := s.Set(ctx, map[netip.Addr]string{netip.MustParseAddr("2001:db8::10"): ""})
	if err == nil || !strings.Contains(err.Error(), "next_hop6") {
		t.Fatalf("IPv6 VIP without an IPv6 next hop: %v", err)
	}
}

// TestMD5 holds a session signed with TCP MD5 (both ends with the key).
func TestMD5(t *testing.T) {
	s, r := newSpeaker(t, "tiergate-md5-key", nil)
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	if err := s.Set(ctx, map[netip.Addr]string{netip.MustParseAddr("203.0.113.10"): ""}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the VIP over the signed session", func() (bool, string) {
		got := r.routes(t)
		return got["203.0.113.10/32"] == "198.18.0.2", fmt.Sprint(got)
	})
}

func TestPasswordFile(t *testing.T) {
	cfg := Config{ASN: 1, NextHop: netip.MustParseAddr("198.18.0.2"),
		Peers: []PeerConfig{{Address: netip.MustParseAddr("198.18.0.1"), AS: 2, PasswordFile: filepath.Join(t.TempDir(), "missing")}}}
	cfg.Defaults()
	_, err := New(cfg, Options{})
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Path != "peers[0].password_file" {
		t.Fatalf("missing password file: %v", err)
	}
	cfg.Peers[0].PasswordFile = writePassword(t, strings.Repeat("k", 81))
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), "81 bytes") {
		t.Fatalf("long key: %v", err)
	}
}

func TestConfigDefaultsAndErrors(t *testing.T) {
	var c Config
	if err := config.Decode([]byte(`
asn: 65001
next_hop: 198.18.0.2
peers:
  - {address: 198.18.0.1, as: 65000}
  - {address: "2001:db8::1", as: 65000, hold_time: 3s, ttl_security: true}
`), "bgp", &c); err != nil {
		t.Fatal(err)
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p := c.Peers[0]
	if c.RouterID != c.NextHop || c.ListenPort != 179 || c.WithdrawDelay.D() != DefaultWithdrawDelay || !*c.WithdrawUnhealthy ||
		c.CheckInterval.D() != DefaultCheckInterval || p.Port != 179 || p.HoldTime.D() != 9*time.Second ||
		p.KeepaliveInterval.D() != 3*time.Second || p.ConnectRetry.D() != DefaultConnectRetry {
		t.Fatalf("defaults: %+v %+v", c, p)
	}
	if q := c.Peers[1]; q.KeepaliveInterval.D() != time.Second || q.TTLHops != 1 {
		t.Fatalf("defaults: %+v", q)
	}
	if b := c.BFD; b.Enabled || b.MinTx.D() != 300*time.Millisecond || b.MinRx.D() != 300*time.Millisecond || b.Multiplier != 3 || c.BFDOn(p) {
		t.Fatalf("BFD defaults: %+v", b)
	}
	off := false
	c.BFD.Enabled, c.Peers[1].BFD = true, &off
	if !c.BFDOn(c.Peers[0]) || c.BFDOn(c.Peers[1]) {
		t.Fatal("bfd.enabled with a peer's bfd: false")
	}

	bad := Config{
		NextHop6:   netip.MustParseAddr("198.18.0.2"),
		ListenPort: 70000,
		BFD:        BFDConfig{MinTx: config.Duration(5 * time.Millisecond), Multiplier: 256},
		Peers: []PeerConfig{
			{Address: netip.MustParseAddr("198.18.0.1"), HoldTime: config.Duration(2 * time.Second)},
			{Address: netip.MustParseAddr("198.18.0.1"), AS: 1, HoldTime: config.Duration(3500 * time.Millisecond), TTLHops: 3},
		},
	}
	bad.Defaults()
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	var paths []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *config.FieldError
		if errors.As(e, &fe) {
			paths = append(paths, fe.Path)
		}
	}
	for _, want := range []string{"asn", "next_hop6", "router_id", "listen_port", "peers[0].as", "peers[0].hold_time",
		"peers[1].address", "peers[1].hold_time", "peers[1].ttl_hops", "bfd.min_tx", "bfd.multiplier"} {
		if !slices.Contains(paths, want) {
			t.Errorf("no error at %s: %v", want, err)
		}
	}
}

// metric reads one sample of name whose labels are exactly labels (`a="x",b="y"`,
// sorted) from reg.
func metric(t *testing.T, reg *prometheus.Registry, name, labels string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if strings.Join(ls, ",") != labels {
				continue
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Errorf("no sample %s{%s}", name, labels)
	return -1
}
