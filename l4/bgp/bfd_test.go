package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/testkit/bird"
	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestBFD: a speaker with bfd.enabled opens a BFD session with its peer, a real
// bird2 (in a namespace of its own, with a static route via the LD that follows
// BFD), shows it in Status and tiergate_l4_bfd_*, and closes it with the speaker,
// after the BGP sessions, which takes the route down at the router.
func TestBFD(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "bird", "bird2")
	rt, ld := netns.New(t, "bgpbfdrt"), netns.New(t, "bgpbfdld")
	netns.Veth(t, ld, "e0", rt, "e0")
	rt.Addr("e0", "198.19.54.1/24")
	ld.Addr("e0", "198.19.54.2/24")
	const prefix = "203.0.113.54/32"
	router := bird.Start(t, rt, bird.Config{RouterID: "198.19.54.1", Address: "198.19.54.1", AS: 65000,
		BFD:    &bird.BFD{MinRx: 100 * time.Millisecond, MinTx: 100 * time.Millisecond, Multiplier: 3},
		Static: []bird.Static{{Prefix: prefix, Via: "198.19.54.2", BFD: true}}})

	peer := netip.MustParseAddr("198.19.54.1")
	// Passive, listening nowhere: gobgp's sockets would be made in the test's
	// own namespace, not ld's; BFD's are made by Start, in ld's.
	cfg := Config{ASN: 65001, NextHop: netip.MustParseAddr("198.19.54.2"), ListenPort: -1,
		BFD:   BFDConfig{Enabled: true, MinTx: config.Duration(100 * time.Millisecond), MinRx: config.Duration(100 * time.Millisecond)},
		Peers: []PeerConfig{{Address: peer, AS: 65000, Passive: true}}}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sp, err := New(cfg, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ld.MustDo(func() error { return sp.Start(context.Background()) })
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			sp.Stop(context.Background())
		}
	})
	routed := func() bool {
		gws, err := router.NextHops(prefix)
		return err == nil && len(gws) == 1
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := sp.Status(context.Background())
		b := st.Peers[0].BFD
		sessions, _ := router.BFDSessions()
		if b != nil && b.Up() && b.DetectTimeMs == 300 && sessions["198.19.54.2"] == "Up" && routed() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("BFD not up at both ends with the route in the router: %+v, bird %v\n%s", b, sessions, router.LogTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := metric(t, reg, "tiergate_l4_bfd_session_up", `peer="198.19.54.1"`); v != 1 {
		t.Errorf("tiergate_l4_bfd_session_up %v", v)
	}
	if v := metric(t, reg, "tiergate_l4_bfd_detect_time_seconds", `peer="198.19.54.1"`); v != 0.3 {
		t.Errorf("tiergate_l4_bfd_detect_time_seconds %v", v)
	}
	if v := metric(t, reg, "tiergate_l4_bfd_packets_total", `dir="in",peer="198.19.54.1"`); v < 1 {
		t.Errorf("tiergate_l4_bfd_packets_total in %v", v)
	}

	// Stop: the BFD session ends (AdminDown), and the router's route with it.
	if err := sp.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped = true
	deadline = time.Now().Add(10 * time.Second)
	for routed() {
		if time.Now().After(deadline) {
			t.Fatalf("the router kept the route after the speaker stopped\n%s", router.LogTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b := sp.Status(context.Background()).Peers[0].BFD; b != nil {
		t.Errorf("a stopped speaker reports a BFD session: %+v", b)
	}
}
