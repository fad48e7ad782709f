// Package bgp announces an LD's VIPs to its routers over BGP, with gobgp/v3 as a
// library inside l4d (no external daemon). A Speaker holds sessions with the
// configured peers and announces each VIP as a host route (/32 or /128) with the LD's
// own address as next hop while l4d says the LD can serve it, and withdraws it with a
// reason when it cannot (Reason...). The routers' ECMP spreads a VIP's flows over the
// LDs that announce it; a withdrawn path moves them to the others.
//
// The Speaker knows nothing of the datapath: l4d decides, for every VIP, whether it
// is announced and why not (l4/l4d/bgp.go), and calls Set. Status and the
// tiergate_l4_bgp_* metrics report the sessions and the VIPs. With bfd enabled, a BFD
// session (l4/bfd) runs beside each BGP session, from before the BGP server starts to
// after it stops, so a router with BFD drops a dead LD's routes in under a second;
// tiergate_l4_bfd_* report them.
package bgp

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// Config is the BGP speaker's configuration, l4d's `bgp:` section. Every field may be
// left out unless marked required; its default is given beside it.
type Config struct {
	// ASN is the LD's own autonomous system number (1..4294967295). Required.
	ASN uint32 `yaml:"asn" json:"asn"`
	// RouterID is the BGP identifier, an IPv4 address unique among the routers'
	// peers. Default: NextHop; required when there is no IPv4 next hop.
	RouterID netip.Addr `yaml:"router_id" json:"router_id,omitzero"`
	// ListenPort is the TCP port on which sessions the peers open are accepted; the
	// speaker also connects out to each peer (on the peer's port). -1 accepts none.
	// Default 179.
	ListenPort int32 `yaml:"listen_port" json:"listen_port,omitempty"`
	// ListenAddresses are the local addresses accepted on. Default every address
	// (0.0.0.0 and ::).
	ListenAddresses []netip.Addr `yaml:"listen_addresses" json:"listen_addresses,omitempty"`
	// NextHop is the next hop announced with IPv4 VIPs: the address at which the
	// LD's datapath receives their traffic, on a network the routers share with it.
	// Default (l4d): ports.external.addr.
	NextHop netip.Addr `yaml:"next_hop" json:"next_hop,omitzero"`
	// NextHop6 is the next hop announced with IPv6 VIPs. Default (l4d):
	// ports.external.addr6.
	NextHop6 netip.Addr `yaml:"next_hop6" json:"next_hop6,omitzero"`
	// Peers are the routers the VIPs are announced to. At least one is required.
	Peers []PeerConfig `yaml:"peers" json:"peers"`
	// WithdrawDelay is how long l4d goes on forwarding after it withdrew its VIPs
	// on SIGTERM (or SIGINT), so that the routers move the traffic to the other LDs
	// before it stops. Default 3s.
	WithdrawDelay config.Duration `yaml:"withdraw_delay" json:"withdraw_delay,omitempty"`
	// WithdrawUnhealthy withdraws a VIP when none of its rules has a member that is
	// up and not drained, so that the routers send its traffic to an LD that can
	// still serve it. Default true.
	WithdrawUnhealthy *bool `yaml:"withdraw_unhealthy" json:"withdraw_unhealthy,omitempty"`
	// CheckInterval is how often l4d re-evaluates what it can serve (ports, datapath,
	// members' health, gates); a drain or undrain acts at once. Default 500ms.
	CheckInterval config.Duration `yaml:"check_interval" json:"check_interval,omitempty"`
	// BFD runs a BFD session (l4/bfd: RFC 5880/5881 single hop, asynchronous) with
	// each peer beside its BGP session, so that a router set up for it (bird2:
	// `bfd on`) drops this LD's routes within min_tx x multiplier of the LD's
	// death instead of at the hold timer. Default off.
	BFD BFDConfig `yaml:"bfd" json:"bfd,omitzero"`
}

// BFDConfig is the BFD sessions' setting: the same timers for every peer.
type BFDConfig struct {
	// Enabled opens a BFD session with every peer whose own bfd is not false.
	// Default false.
	Enabled bool `yaml:"enabled" json:"enabled,omitempty"`
	// MinTx is the interval this LD wishes to send its packets at once a session
	// is up (one a second before); the router sends at the longer of it and its
	// own min rx. Default 300ms, at least 10ms.
	MinTx config.Duration `yaml:"min_tx" json:"min_tx,omitempty"`
	// MinRx is the shortest interval between the router's packets this LD takes:
	// the router sends at the longer of it and its min tx. Default 300ms, at least
	// 10ms.
	MinRx config.Duration `yaml:"min_rx" json:"min_rx,omitempty"`
	// Multiplier is how many of the agreed intervals without a packet take a
	// session down, at either end: the router takes this LD for dead after
	// multiplier x max(min_tx, its min rx). Default 3 (0.9 s with the default
	// intervals, which a loaded 2-core machine keeps without flapping), 1..255.
	Multiplier int `yaml:"multiplier" json:"multiplier,omitempty"`
}

// PeerConfig is one router.
type PeerConfig struct {
	// Address is the peer's address (IPv4 or IPv6). Required; unique.
	Address netip.Addr `yaml:"address" json:"address"`
	// AS is the peer's AS number; equal to asn makes an iBGP session. Required.
	AS uint32 `yaml:"as" json:"as"`
	// Port is the peer's TCP port. Default 179.
	Port uint16 `yaml:"port" json:"port,omitempty"`
	// LocalAddress is the source address of the session. Default: the kernel's
	// choice for Address.
	LocalAddress netip.Addr `yaml:"local_address" json:"local_address,omitzero"`
	// HoldTime is the hold time offered, in whole seconds, at least 3s (the
	// shortest BGP allows): a peer silent that long is taken down. Default 9s.
	HoldTime config.Duration `yaml:"hold_time" json:"hold_time,omitempty"`
	// KeepaliveInterval is the time between keepalives, in whole seconds, at least
	// 1s and below HoldTime. Default a third of HoldTime.
	KeepaliveInterval config.Duration `yaml:"keepalive_interval" json:"keepalive_interval,omitempty"`
	// ConnectRetry is how long to wait before connecting again to a peer that is
	// not reachable, in whole seconds (gobgp waits between one and two of them).
	// Default 5s.
	ConnectRetry config.Duration `yaml:"connect_retry" json:"connect_retry,omitempty"`
	// PasswordFile holds the TCP MD5 signature key (RFC 2385) of the session: the
	// file's content less surrounding white space, 1..80 bytes. Read at start.
	// Default none: no signature.
	PasswordFile string `yaml:"password_file" json:"password_file,omitempty"`
	// TTLSecurity is GTSM (RFC 5082): packets are sent with TTL 255 and only
	// those that arrive with a TTL of at least 256-TTLHops are accepted, so a
	// spoofer further away cannot reach the session. The peer must do the same.
	// Default false.
	TTLSecurity bool `yaml:"ttl_security" json:"ttl_security,omitempty"`
	// TTLHops is how many hops away the peer is, with TTLSecurity. Default 1
	// (directly connected), at most 254.
	TTLHops int `yaml:"ttl_hops" json:"ttl_hops,omitempty"`
	// Passive waits for the peer to connect and never connects out. Default false.
	Passive bool `yaml:"passive" json:"passive,omitempty"`
	// BFD opens (true) or not (false) a BFD session with this peer, with the
	// timers of the bfd section. Default: bfd.enabled.
	BFD *bool `yaml:"bfd" json:"bfd,omitempty"`
}

// BFDOn reports whether peer p has a BFD session under c.
func (c *Config) BFDOn(p PeerConfig) bool {
	if p.BFD != nil {
		return *p.BFD
	}
	return c.BFD.Enabled
}

// Defaults.
const (
	DefaultPort          = 179
	DefaultHoldTime      = 9 * time.Second
	DefaultConnectRetry  = 5 * time.Second
	DefaultWithdrawDelay = 3 * time.Second
	DefaultCheckInterval = 500 * time.Millisecond
	DefaultBFDInterval   = 300 * time.Millisecond
	DefaultBFDMultiplier = 3
	// MinHoldTime is the shortest hold time BGP allows (RFC 4271 4.2), zero aside.
	MinHoldTime = 3 * time.Second
)

// Defaults fills in the defaults that do not depend on the LD's addresses; l4d fills
// NextHop and NextHop6 from its ports first.
func (c *Config) Defaults() {
	if c.ListenPort == 0 {
		c.ListenPort = DefaultPort
	}
	if !c.RouterID.IsValid() && c.NextHop.Is4() {
		c.RouterID = c.NextHop
	}
	if c.WithdrawDelay == 0 {
		c.WithdrawDelay = config.Duration(DefaultWithdrawDelay)
	}
	if c.WithdrawUnhealthy == nil {
		t := true
		c.WithdrawUnhealthy = &t
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = config.Duration(DefaultCheckInterval)
	}
	if c.BFD.MinTx == 0 {
		c.BFD.MinTx = config.Duration(DefaultBFDInterval)
	}
	if c.BFD.MinRx == 0 {
		c.BFD.MinRx = config.Duration(DefaultBFDInterval)
	}
	if c.BFD.Multiplier == 0 {
		c.BFD.Multiplier = DefaultBFDMultiplier
	}
	for i := range c.Peers {
		p := &c.Peers[i]
		if p.Port == 0 {
			p.Port = DefaultPort
		}
		if p.HoldTime == 0 {
			p.HoldTime = config.Duration(DefaultHoldTime)
		}
		if p.KeepaliveInterval == 0 {
			p.KeepaliveInterval = config.Duration(max(time.Second, (p.HoldTime.D() / 3).Truncate(time.Second)))
		}
		if p.ConnectRetry == 0 {
			p.ConnectRetry = config.Duration(DefaultConnectRetry)
		}
		if p.TTLSecurity && p.TTLHops == 0 {
			p.TTLHops = 1
		}
	}
}

// Validate reports every problem by its path inside the section ("peers[0].as").
// Call Defaults first.
func (c *Config) Validate() error {
	var ck config.Checker
	if c.ASN == 0 {
		ck.Addf("asn", "required (1..4294967295)")
	}
	if c.NextHop.IsValid() && !c.NextHop.Is4() {
		ck.Addf("next_hop", "%v is not an IPv4 address (next_hop6 is IPv6's)", c.NextHop)
	}
	if c.NextHop6.IsValid() && !c.NextHop6.Is6() {
		ck.Addf("next_hop6", "%v is not an IPv6 address", c.NextHop6)
	}
	if !c.NextHop.IsValid() && !c.NextHop6.IsValid() {
		ck.Addf("next_hop", "required: the LD has no address to announce as next hop")
	}
	switch {
	case !c.RouterID.IsValid():
		ck.Addf("router_id", "required when there is no IPv4 next hop")
	case !c.RouterID.Is4() || c.RouterID.IsUnspecified():
		ck.Addf("router_id", "%v: want a non-zero IPv4 address", c.RouterID)
	}
	if c.ListenPort < -1 || c.ListenPort > 65535 {
		ck.Addf("listen_port", "%d is outside 1..65535 (-1: accept no session)", c.ListenPort)
	}
	for i, a := range c.ListenAddresses {
		if !a.IsValid() {
			ck.Addf(config.Index("listen_addresses", i), "empty")
		}
	}
	if c.WithdrawDelay < 0 {
		ck.Addf("withdraw_delay", "%v is negative", c.WithdrawDelay)
	}
	if c.CheckInterval.D() < 10*time.Millisecond {
		ck.Addf("check_interval", "%v is shorter than 10ms", c.CheckInterval)
	}
	for _, d := range []struct {
		field string
		v     config.Duration
	}{{"bfd.min_tx", c.BFD.MinTx}, {"bfd.min_rx", c.BFD.MinRx}} {
		if d.v.D() < 10*time.Millisecond || d.v.D() > time.Minute {
			ck.Addf(d.field, "%v is outside 10ms..1m", d.v)
		}
	}
	if c.BFD.Multiplier < 1 || c.BFD.Multiplier > 255 {
		ck.Addf("bfd.multiplier", "%d is outside 1..255", c.BFD.Multiplier)
	}
	if len(c.Peers) == 0 {
		ck.Addf("peers", "at least one peer is required")
	}
	seen := map[netip.Addr]int{}
	for i, p := range c.Peers {
		at := func(f string) string { return config.Index("peers", i) + "." + f }
		if !p.Address.IsValid() {
			ck.Addf(at("address"), "required")
		} else if j, dup := seen[p.Address]; dup {
			ck.Addf(at("address"), "%v is peers[%d]'s too", p.Address, j)
		} else {
			seen[p.Address] = i
		}
		if p.AS == 0 {
			ck.Addf(at("as"), "required (1..4294967295)")
		}
		if p.LocalAddress.IsValid() && p.Address.IsValid() && p.LocalAddress.Is4() != p.Address.Is4() {
			ck.Addf(at("local_address"), "%v is not of the family of address %v", p.LocalAddress, p.Address)
		}
		checkSeconds(&ck, at("hold_time"), p.HoldTime.D())
		if p.HoldTime.D() < MinHoldTime || p.HoldTime.D() > 65535*time.Second {
			ck.Addf(at("hold_time"), "%v is outside 3s..65535s", p.HoldTime)
		}
		checkSeconds(&ck, at("keepalive_interval"), p.KeepaliveInterval.D())
		if p.KeepaliveInterval.D() < time.Second || p.KeepaliveInterval >= p.HoldTime {
			ck.Addf(at("keepalive_interval"), "%v: want at least 1s and less than hold_time %v", p.KeepaliveInterval, p.HoldTime)
		}
		checkSeconds(&ck, at("connect_retry"), p.ConnectRetry.D())
		if p.ConnectRetry.D() < time.Second {
			ck.Addf(at("connect_retry"), "%v is shorter than 1s", p.ConnectRetry)
		}
		if p.TTLHops < 0 || p.TTLHops > 254 {
			ck.Addf(at("ttl_hops"), "%d is outside 1..254", p.TTLHops)
		} else if p.TTLHops != 0 && !p.TTLSecurity {
			ck.Addf(at("ttl_hops"), "needs ttl_security: true")
		}
	}
	return ck.Err()
}

// checkSeconds reports a duration BGP cannot carry (its timers are whole seconds).
func checkSeconds(ck *config.Checker, path string, d time.Duration) {
	if d%time.Second != 0 {
		ck.Add(path, fmt.Errorf("%v is not a whole number of seconds", d))
	}
}
