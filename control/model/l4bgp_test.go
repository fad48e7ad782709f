package model

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/bgp"
)

// TestL4BGPConfig: the store's object takes the LD's own settings from its file,
// each peer's by address.
func TestL4BGPConfig(t *testing.T) {
	yes := false
	obj := &L4BGP{Name: "c", ASN: 65010, WithdrawUnhealthy: &yes, Peers: []bgp.PeerConfig{
		{Address: netip.MustParseAddr("192.0.2.1"), AS: 65000},
		{Address: netip.MustParseAddr("192.0.2.2"), AS: 65000},
	}}
	file := bgp.Config{ASN: 65001, RouterID: netip.MustParseAddr("198.18.0.2"), NextHop: netip.MustParseAddr("198.18.0.2"),
		Peers: []bgp.PeerConfig{{Address: netip.MustParseAddr("192.0.2.2"), AS: 1, LocalAddress: netip.MustParseAddr("198.18.0.12"), PasswordFile: "/k"},
			{Address: netip.MustParseAddr("192.0.2.9"), AS: 1}}}
	c := obj.Config(file)
	if c.ASN != 65010 || c.RouterID != file.RouterID || len(c.Peers) != 2 || *c.WithdrawUnhealthy {
		t.Fatalf("merged %+v", c)
	}
	if p := c.Peers[1]; p.AS != 65000 || p.LocalAddress.String() != "198.18.0.12" || p.PasswordFile != "/k" {
		t.Errorf("peer 192.0.2.2: %+v, want the store's AS with the file's local address and password", p)
	}
	if p := c.Peers[0]; p.LocalAddress.IsValid() || p.PasswordFile != "" {
		t.Errorf("peer 192.0.2.1: %+v, want no local setting", p)
	}
	if file.ASN != 65001 || file.Peers[0].AS != 1 {
		t.Errorf("the file's configuration changed: %+v", file)
	}
}

// TestL4BGPValidate: l4/bgp's checks with the object's paths, and the settings that
// are each LD's own refused; a cluster has one l4-bgp object.
func TestL4BGPValidate(t *testing.T) {
	peer := bgp.PeerConfig{Address: netip.MustParseAddr("192.0.2.1"), AS: 65000, HoldTime: config.Duration(3 * time.Second)}
	good := &L4BGP{Name: "cluster", ASN: 65001, Peers: []bgp.PeerConfig{peer}}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid object refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(b *L4BGP)
		want string
	}{
		{"no asn", func(b *L4BGP) { b.ASN = 0 }, "asn: required"},
		{"no peers", func(b *L4BGP) { b.Peers = nil }, "peers: at least one peer"},
		{"short hold time", func(b *L4BGP) { b.Peers[0].HoldTime = config.Duration(2 * time.Second) }, "peers[0].hold_time"},
		{"local address", func(b *L4BGP) { b.Peers[0].LocalAddress = netip.MustParseAddr("198.18.0.12") }, "peers[0].local_address: each LD's own"},
		{"password file", func(b *L4BGP) { b.Peers[0].PasswordFile = "/etc/k" }, "peers[0].password_file: each LD's own"},
		{"bad name", func(b *L4BGP) { b.Name = "a/b" }, "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := *good
			b.Peers = []bgp.PeerConfig{peer}
			tc.edit(&b)
			err := b.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
	s := NewSnapshot(1, good, &L4BGP{Name: "second", ASN: 65001, Peers: []bgp.PeerConfig{peer}})
	if err := s.Consistent(); err == nil || !strings.Contains(err.Error(), "l4-bgp/second: a second l4-bgp object") {
		t.Errorf("two l4-bgp objects: Consistent = %v", err)
	}
	if s := NewSnapshot(1, good); s.Consistent() != nil || s.BGP() != good {
		t.Errorf("one l4-bgp object: Consistent %v, BGP %v", s.Consistent(), s.BGP())
	}
	if NewSnapshot(1).BGP() != nil {
		t.Error("BGP of a snapshot without l4-bgp is not nil")
	}
}

// TestL4BGPDecode: the object as tgctl sends it (durations as strings) decodes, and
// a field of the LD's own file that the object does not have is refused.
func TestL4BGPDecode(t *testing.T) {
	o, err := Decode(store.Object{Kind: KindL4BGP, Name: "cluster", Value: []byte(
		`{"name": "cluster", "asn": 65001, "peers": [{"address": "192.0.2.1", "as": 65000, "hold_time": "3s", "ttl_security": true}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	b, ok := o.(*L4BGP)
	if !ok || b.ASN != 65001 || len(b.Peers) != 1 || b.Peers[0].HoldTime.D() != 3*time.Second || !b.Peers[0].TTLSecurity {
		t.Fatalf("decoded %#v", o)
	}
	if err := b.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if _, err := Decode(store.Object{Kind: KindL4BGP, Name: "cluster", Value: []byte(
		`{"name": "cluster", "asn": 65001, "router_id": "198.18.0.2", "peers": [{"address": "192.0.2.1", "as": 65000}]}`)}); err == nil {
		t.Error("router_id, each LD's own, decoded into the cluster's object")
	}
}
