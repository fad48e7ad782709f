package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// TestSetPeers: a peer added beside a live session leaves that session up; a peer
// changed has its session closed and opened again, with the VIPs sent to it; a peer
// removed has its session closed and the router loses the route.
func TestSetPeers(t *testing.T) {
	s, r := newSpeaker(t, "", nil)
	ctx := context.Background()
	vip := netip.MustParseAddr("203.0.113.10")
	if err := s.Set(ctx, map[netip.Addr]string{vip: ""}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	peerState := func(addr string) PeerStatus {
		for _, p := range s.Status(ctx).Peers {
			if p.Address == addr {
				return p
			}
		}
		return PeerStatus{}
	}
	routed := func() (bool, string) {
		got := r.routes(t)
		return got["203.0.113.10/32"] == "198.18.0.2" && peerState("127.0.0.2").State == "established", fmt.Sprintf("%v %+v", got, s.Status(ctx).Peers)
	}
	waitFor(t, "the VIP at the router", routed)
	first := peerState("127.0.0.2")

	// Added: a second router nobody answers for; the first session is kept.
	router := s.Config().Peers[0]
	absent := PeerConfig{Address: netip.MustParseAddr("127.0.0.3"), AS: 65000, Port: uint16(freePort(t, "127.0.0.3")),
		LocalAddress: netip.MustParseAddr("127.0.0.1"), HoldTime: config.Duration(3 * time.Second), ConnectRetry: config.Duration(time.Second)}
	c := Config{ASN: 65001, NextHop: netip.MustParseAddr("198.18.0.2"), Peers: []PeerConfig{router, absent}}
	c.Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPeers(ctx, c.Peers); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Status(ctx).Peers); got != 2 {
		t.Fatalf("%d peers in the status, want 2", got)
	}
	// A peer deleted and added again starts idle at once: no wait needed to see it.
	if now := peerState("127.0.0.2"); now.State != "established" || !now.Since.Equal(first.Since) || now.Flaps != first.Flaps {
		t.Errorf("the session with the unchanged peer: %+v, was %+v", now, first)
	}

	// Changed: its session is opened again and gets the VIP.
	c.Peers[0].HoldTime = config.Duration(4 * time.Second)
	if err := s.SetPeers(ctx, c.Peers); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the changed peer's new session", func() (bool, string) {
		p := peerState("127.0.0.2")
		return p.State == "established" && p.Since.After(first.Since), fmt.Sprintf("%+v", p)
	})
	waitFor(t, "the VIP at the router again", routed)

	// Removed: the router loses the session and the route.
	if err := s.SetPeers(ctx, c.Peers[1:]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the route gone with the session", func() (bool, string) {
		got := r.routes(t)
		return got["203.0.113.10/32"] == "" && peerState("127.0.0.2").Address == "", fmt.Sprintf("%v %+v", got, s.Status(ctx).Peers)
	})
}
