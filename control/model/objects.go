package model

import (
	"errors"
	"net/netip"
	"strings"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/bgp"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l7/listener"
	"github.com/tiergate/tiergate/policy/route"
)

// Kinds of objects in the store.
const (
	KindListener    = "listeners"
	KindRouting     = "routing"
	KindPool        = "pools"
	KindCertificate = "certificates"
	KindCertBinding = "cert-bindings"
	KindL4Rule      = "l4-rules"
	KindL4Pool      = "l4-pools"
	KindL4BGP       = "l4-bgp"
)

// Kinds lists every kind, in the order Snapshot checks them.
var Kinds = []string{KindListener, KindRouting, KindPool, KindCertificate, KindCertBinding, KindL4Rule, KindL4Pool, KindL4BGP}

// Object is an object of the cluster configuration.
type Object interface {
	// Kind returns the object's kind (KindListener, …).
	Kind() string
	// ObjectName returns the name it is stored under.
	ObjectName() string
	// Validate checks the object alone and returns every problem, each a
	// *config.FieldError named by its path within the object. What it refers to is
	// for Snapshot.Consistent to check.
	Validate() error
}

// Listener is an address l7d terminates TLS and QUIC on: listener.Listener (l7.Listener), stored under
// its Name. Its routing is a RoutingPolicy of the same name, its certificates come
// from CertBindings that name it.
type Listener struct {
	listener.Listener
}

// Kind returns KindListener.
func (*Listener) Kind() string { return KindListener }

// ObjectName returns the listener's name.
func (l *Listener) ObjectName() string { return l.Name }

// Validate checks the listener's settings with l7's own Validate, and that it
// holds nothing a cluster-wide object cannot: no simple-form pool (routing is a
// RoutingPolicy) and no QUIC server ID (which differs from node to node).
func (l *Listener) Validate() error {
	var ck config.Checker
	checkName(&ck, l.Name, true)
	ck.Nest("", l.Listener.Validate())
	if l.Pool != "" {
		ck.Addf("pool", "%q: the control plane routes a listener by its routing policy (routing/%s), not by a pool", l.Pool, l.Name)
	}
	if l.QUICServerID != 0 {
		ck.Addf("quic_server_id", "%d: the QUIC server ID differs from node to node; it is set in each node's own file", l.QUICServerID)
	}
	return ck.Err()
}

// RoutingPolicy is the routing of one listener: route.Listener (its virtual hosts,
// their routes, path mode and strict SNI), stored under the name of the listener it
// routes.
type RoutingPolicy struct {
	route.Listener
}

// Kind returns KindRouting.
func (*RoutingPolicy) Kind() string { return KindRouting }

// ObjectName returns the name of the listener it routes.
func (r *RoutingPolicy) ObjectName() string { return r.Name }

// Validate checks the routing with route's own validation; whether the pools its
// routes name exist is for the snapshot to say.
func (r *RoutingPolicy) Validate() error {
	var ck config.Checker
	checkName(&ck, r.Name, false)
	rc := route.Config{Listeners: []route.Listener{r.Listener}}
	seen := map[string]bool{}
	for _, vh := range r.VHosts {
		for _, rt := range vh.Routes {
			if p := rt.Action.Pool; p != "" && !seen[p] {
				seen[p] = true
				rc.Pools = append(rc.Pools, stubPool(p))
			}
		}
	}
	ck.Nest("", rebase(rc.Validate(), "listeners[0]", ""))
	return ck.Err()
}

// stubPool is a valid pool named name, standing for one a route refers to when a
// RoutingPolicy is validated alone.
func stubPool(name string) route.Pool {
	return route.Pool{Name: name, Members: []route.PoolMember{{Addr: "192.0.2.1:80"}}}
}

// Pool is a pool of HTTP/1.1 backends that routes proxy to: route.Pool, stored under
// its Name.
type Pool struct {
	route.Pool
}

// Kind returns KindPool.
func (*Pool) Kind() string { return KindPool }

// ObjectName returns the pool's name.
func (p *Pool) ObjectName() string { return p.Name }

// Validate checks the pool with route's own validation.
func (p *Pool) Validate() error {
	var ck config.Checker
	checkName(&ck, p.Name, false)
	ck.Nest("", rebase((&route.Config{Pools: []route.Pool{p.Pool}}).Validate(), "pools[0]", ""))
	return ck.Err()
}

// L4Rule is a virtual service of the L4 tier: datapath.RuleConfig (VIP, protocol,
// port → an L4Pool), stored under its Name.
type L4Rule struct {
	datapath.RuleConfig
}

// Kind returns KindL4Rule.
func (*L4Rule) Kind() string { return KindL4Rule }

// ObjectName returns the rule's name.
func (r *L4Rule) ObjectName() string { return r.Name }

// Validate checks the rule with the datapath's own validation; whether its pool
// exists is for the snapshot to say.
func (r *L4Rule) Validate() error {
	var ck config.Checker
	checkName(&ck, r.Name, false)
	dc := l4Config()
	dc.Rules = []datapath.RuleConfig{r.RuleConfig}
	if r.Pool != "" {
		dc.Pools[r.Pool] = datapath.PoolConfig{Members: []datapath.MemberConfig{{Name: "stub", Address: netip.MustParseAddr("198.18.0.10")}}}
	}
	ck.Nest("", rebase(dc.Validate(), "rules[0]", ""))
	return ck.Err()
}

// L4Pool is a pool of L7 nodes that L4 rules send flows to: datapath.PoolConfig
// (members, health check) with the name it is stored under.
type L4Pool struct {
	// Name identifies the pool in rules, metrics and the admin API. Required.
	Name string `yaml:"name" json:"name"`
	datapath.PoolConfig
}

// Kind returns KindL4Pool.
func (*L4Pool) Kind() string { return KindL4Pool }

// ObjectName returns the pool's name.
func (p *L4Pool) ObjectName() string { return p.Name }

// Validate checks the pool with the datapath's own validation.
func (p *L4Pool) Validate() error {
	var ck config.Checker
	checkName(&ck, p.Name, true)
	key := p.Name
	if key == "" {
		key = "unnamed" // the datapath would say only "a pool has an empty name"
	}
	dc := l4Config()
	dc.Pools[key] = p.PoolConfig
	ck.Nest("", rebase(dc.Validate(), config.At("pools", key), ""))
	return ck.Err()
}

// L4BGP is the BGP setting every LD of the cluster shares (l4/bgp.Config's asn,
// peers and withdraw_unhealthy): the LDs' AS and the routers they announce the VIPs
// of the l4-rules to. What differs from LD to LD stays in l4d's file, whose bgp
// section an LD needs to speak BGP at all: router_id, next_hop, next_hop6,
// listen_port, listen_addresses, withdraw_delay, check_interval, and each peer's
// local_address and password_file (under bgp.peers with the peer's address). A
// cluster has at most one (Snapshot.Consistent).
type L4BGP struct {
	// Name identifies the object. Required.
	Name string `yaml:"name" json:"name"`
	// ASN is the LDs' AS number (1..4294967295). Required. An LD refuses a
	// snapshot that changes the AS it runs with: that needs l4d restarted.
	ASN uint32 `yaml:"asn" json:"asn"`
	// Peers are the routers, as in l4d's bgp.peers, less local_address and
	// password_file (each LD's own). At least one is required.
	Peers []bgp.PeerConfig `yaml:"peers" json:"peers"`
	// WithdrawUnhealthy withdraws a VIP none of whose rules has a member able to
	// take new flows. Default: the LD's file's (true when it says nothing).
	WithdrawUnhealthy *bool `yaml:"withdraw_unhealthy" json:"withdraw_unhealthy,omitempty"`
}

// Kind returns KindL4BGP.
func (*L4BGP) Kind() string { return KindL4BGP }

// ObjectName returns the object's name.
func (b *L4BGP) ObjectName() string { return b.Name }

// Validate checks the setting with l4/bgp's own validation, and refuses the
// settings that are each LD's own.
func (b *L4BGP) Validate() error {
	var ck config.Checker
	checkName(&ck, b.Name, true)
	c := b.Config(bgp.Config{NextHop: netip.MustParseAddr("198.18.0.1")})
	c.Defaults()
	ck.Nest("", c.Validate())
	for i, p := range b.Peers {
		at := config.Index("peers", i)
		if p.LocalAddress.IsValid() {
			ck.Addf(at+".local_address", "each LD's own: in l4d's file, under bgp.peers with address %v", p.Address)
		}
		if p.PasswordFile != "" {
			ck.Addf(at+".password_file", "each LD's own: in l4d's file, under bgp.peers with address %v", p.Address)
		}
	}
	return ck.Err()
}

// Config returns node, an LD's bgp section, with the cluster's AS, peers and
// withdraw_unhealthy: each peer takes local_address and password_file from the
// node's peer of the same address, if any. Defaults are left to the caller.
func (b *L4BGP) Config(node bgp.Config) bgp.Config {
	own := map[netip.Addr]bgp.PeerConfig{}
	for _, p := range node.Peers {
		own[p.Address] = p
	}
	node.ASN = b.ASN
	node.Peers = make([]bgp.PeerConfig, len(b.Peers))
	for i, p := range b.Peers {
		if o, ok := own[p.Address]; ok {
			p.LocalAddress, p.PasswordFile = o.LocalAddress, o.PasswordFile
		}
		node.Peers[i] = p
	}
	if b.WithdrawUnhealthy != nil {
		v := *b.WithdrawUnhealthy
		node.WithdrawUnhealthy = &v
	}
	return node
}

// l4Config is a datapath configuration with an LD's own addresses of both families,
// into which cluster objects are put to be validated: what only a node has (its
// addresses, gateways, tunnel) is not theirs to check.
func l4Config() datapath.Config {
	side := datapath.Interface{Addr: netip.MustParsePrefix("198.18.0.1/15"), Addr6: netip.MustParsePrefix("2001:db8::1/32")}
	return datapath.Config{External: side, Internal: side, Pools: map[string]datapath.PoolConfig{}}
}

// checkName records an error unless name can name a stored object. An empty name
// is recorded only when required: the components' own validation says it of theirs.
func checkName(ck *config.Checker, name string, required bool) {
	if name == "" && !required {
		return
	}
	if name == "" {
		ck.Addf("name", "required")
		return
	}
	if err := store.CheckName(name); err != nil {
		ck.Add("name", err)
	}
}

// rebase returns the field errors of err with the paths under from put under to
// instead ("rules[0].pool" from "rules[0]" to "l4-rules/web" is
// "l4-rules/web.pool"); other paths are put under to as they are. Errors that are
// not field errors are kept at to.
func rebase(err error, from, to string) error {
	if err == nil {
		return nil
	}
	var ck config.Checker
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var fe *config.FieldError
		if !errors.As(err, &fe) {
			ck.Add(to, err)
			return
		}
		ck.Add(moved(fe.Path, from, to), fe.Err)
	}
	walk(err)
	return ck.Err()
}

// moved is path with its prefix from replaced by to.
func moved(path, from, to string) string {
	switch {
	case path == from:
		return to
	case strings.HasPrefix(path, from+"."):
		return config.At(to, path[len(from)+1:])
	case strings.HasPrefix(path, from+"["):
		return to + path[len(from):]
	}
	return config.At(to, path)
}

// Interface guards.
var (
	_ Object = (*Listener)(nil)
	_ Object = (*RoutingPolicy)(nil)
	_ Object = (*Pool)(nil)
	_ Object = (*Certificate)(nil)
	_ Object = (*CertBinding)(nil)
	_ Object = (*L4Rule)(nil)
	_ Object = (*L4Pool)(nil)
	_ Object = (*L4BGP)(nil)
)
