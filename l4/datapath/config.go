package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/packet"
)

// Scheduler names accepted in RuleConfig.Scheduler.
const (
	SchedMaglev = "maglev" // consistent hashing on the flow (default)
	SchedWRR    = "wrr"    // smooth weighted round robin, per lcore
	SchedWLC    = "wlc"    // weighted least connections, per lcore
)

// Encapsulation names accepted in TunnelConfig.Mode.
const (
	ModeGRE  = "gre"  // default
	ModeIPIP = "ipip" // IPIP (IPv4 inner) or IPv6-in-IP (protocol 41)
)

// Config is what the datapath forwards: the LD's own addresses, the rules (VIP,
// protocol, port → pool) and the pools of L7 members. It is applied as a whole
// (Distributor.Apply) and swapped in atomically; the zero value of every optional
// field means its documented default.
type Config struct {
	// External is the LD's address on the external port (clients, routers):
	// the port answers ARP/ND for it and for every VIP, and sends replies to
	// clients through Gateway (or straight to the client when it is on link).
	External Interface

	// Internal is the LD's address on the internal port (L7 members): the outer
	// source of tunnelled packets, and where members send replies back. Members
	// must be on link, or reached through Internal.Gateway. When the datapath runs
	// on one port for both sides, Internal may equal External.
	Internal Interface

	// Tunnel sets the encapsulation towards members.
	Tunnel TunnelConfig

	// Rules map (VIP, protocol, port) to a pool. Names and (VIP, protocol, port)
	// must be unique.
	Rules []RuleConfig

	// Pools are the named pools of L7 members that rules send to.
	Pools map[string]PoolConfig

	// Conntrack sets the connection table. Its Capacity is for the whole LD; each
	// worker gets an equal share. Default 1,000,000 entries; default timeouts are
	// conntrack's (half-open 30 s, established 900 s, FIN 60 s, RST 10 s, UDP 300 s).
	Conntrack conntrack.Config
}

// Interface is one side of the LD: its own addresses and its next hop.
type Interface struct {
	// Addr is the LD's IPv4 address with its on-link prefix, e.g. 198.18.0.2/24.
	Addr netip.Prefix
	// Addr6 is the LD's optional IPv6 address with its on-link prefix.
	Addr6 netip.Prefix
	// Gateway and Gateway6 are the next hops for destinations that are not on
	// link. Optional: without them only on-link destinations are reachable.
	Gateway, Gateway6 netip.Addr
	// GatewayMAC and Gateway6MAC, when set, are the gateways' Ethernet addresses,
	// used as is instead of resolving them (static neighbours).
	GatewayMAC, Gateway6MAC packet.MAC
}

// TunnelConfig sets the encapsulation of packets sent to members.
type TunnelConfig struct {
	// Mode is "gre" (default) or "ipip".
	Mode string
	// MTU is the largest outer IP packet the internal network carries. TCP SYNs
	// have their MSS clamped so that full-sized segments fit once encapsulated,
	// and larger packets are dropped (reason too_big). Default 1500.
	MTU int
	// TTL of the outer header. Default 64.
	TTL uint8
}

// RuleConfig is one virtual service: packets to VIP:Port over Protocol go to Pool.
type RuleConfig struct {
	// Name identifies the rule in metrics and the admin API. Required, unique.
	Name string
	// VIP is the virtual address (IPv4 or IPv6). Required.
	VIP netip.Addr
	// Protocol is "tcp" or "udp". Required.
	Protocol string
	// Port is the destination port. Required.
	Port uint16
	// Pool names the pool of members. Required.
	Pool string
	// Scheduler picks members for new flows: "maglev" (default), "wrr" or "wlc".
	Scheduler string
	// QUIC routes UDP packets by the connection ID the member issued (its QUICID)
	// so a client that changes address keeps its member. Only with Protocol "udp".
	QUIC bool
}

// PoolConfig is a set of L7 members with a health check.
type PoolConfig struct {
	// Members of the pool. Names must be unique within the pool.
	Members []MemberConfig
	// Health is the active health check. Default: TCP connect to each member's
	// address on port 443 every 2 s, 1 s timeout, down after 3 failures, up
	// after 2 successes.
	Health HealthConfig
}

// MemberConfig is one L7 node.
type MemberConfig struct {
	// Name identifies the member in metrics and the admin API. Required.
	Name string
	// Address is the member's tunnel address (outer destination). Required; same
	// family as the internal address that reaches it.
	Address netip.Addr
	// Weight for scheduling. Default 1 (use Drain to stop sending new flows).
	Weight uint32
	// QUICID is the server ID the member's l7d puts in the QUIC connection IDs it
	// issues (in wire's layout). 0: none.
	QUICID uint16
	// Drained members get no new flows; their existing flows stay until they end.
	Drained bool
	// HealthAddr is where the health check connects, "ip:port". Default the
	// member's Address and the pool's Health.Port.
	HealthAddr string
	// MAC, when set, is the member's (or its next hop's) Ethernet address, used
	// as is instead of resolving it with ARP/ND (a static neighbour).
	MAC packet.MAC
}

// HealthConfig is an active health check.
type HealthConfig struct {
	// Type is "tcp" (connect, default), "http" (GET Path, 2xx/3xx is up) or
	// "none" (always up).
	Type string
	// Port of the check when a member has no HealthAddr. Default 443.
	Port uint16
	// Path for "http". Default "/healthz".
	Path string
	// Interval between checks. Default 2 s.
	Interval time.Duration
	// Timeout of one check. Default 1 s.
	Timeout time.Duration
	// Rise successes make a down member up; Fall failures make an up member down.
	// Defaults 2 and 3. Members start up.
	Rise, Fall int
}

const (
	defaultMTU       = 1500
	defaultTTL       = 64
	defaultCapacity  = 1_000_000
	defaultHealthInt = 2 * time.Second
)

func (c *Config) withDefaults() Config {
	out := *c
	if out.Tunnel.Mode == "" {
		out.Tunnel.Mode = ModeGRE
	}
	if out.Tunnel.MTU == 0 {
		out.Tunnel.MTU = defaultMTU
	}
	if out.Tunnel.TTL == 0 {
		out.Tunnel.TTL = defaultTTL
	}
	if out.Conntrack.Capacity == 0 {
		out.Conntrack.Capacity = defaultCapacity
	}
	out.Rules = slices.Clone(c.Rules)
	for i := range out.Rules {
		if out.Rules[i].Scheduler == "" {
			out.Rules[i].Scheduler = SchedMaglev
		}
		out.Rules[i].Protocol = strings.ToLower(out.Rules[i].Protocol)
	}
	out.Pools = make(map[string]PoolConfig, len(c.Pools))
	for name, p := range c.Pools {
		p.Members = slices.Clone(p.Members)
		for i := range p.Members {
			if p.Members[i].Weight == 0 {
				p.Members[i].Weight = 1
			}
		}
		h := &p.Health
		if h.Type == "" {
			h.Type = "tcp"
		}
		if h.Port == 0 {
			h.Port = 443
		}
		if h.Path == "" {
			h.Path = "/healthz"
		}
		if h.Interval == 0 {
			h.Interval = defaultHealthInt
		}
		if h.Timeout == 0 {
			h.Timeout = time.Second
		}
		if h.Rise == 0 {
			h.Rise = 2
		}
		if h.Fall == 0 {
			h.Fall = 3
		}
		out.Pools[name] = p
	}
	return out
}

// Validate reports every problem of the configuration, each naming its field.
func (c *Config) Validate() error {
	d := c.withDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	checkIf := func(field string, in Interface) {
		if !in.Addr.IsValid() && !in.Addr6.IsValid() {
			bad(field, "an address (addr or addr6) is required")
		}
		if in.Addr.IsValid() && !in.Addr.Addr().Is4() {
			bad(field+".addr", "%s is not IPv4", in.Addr)
		}
		if in.Addr6.IsValid() && !in.Addr6.Addr().Is6() {
			bad(field+".addr6", "%s is not IPv6", in.Addr6)
		}
		if in.Gateway.IsValid() && (!in.Gateway.Is4() || !in.Addr.IsValid() || !in.Addr.Contains(in.Gateway)) {
			bad(field+".gateway", "%s is not an IPv4 address on link of %s", in.Gateway, in.Addr)
		}
		if in.Gateway6.IsValid() && (!in.Gateway6.Is6() || !in.Addr6.IsValid() || !in.Addr6.Contains(in.Gateway6)) {
			bad(field+".gateway6", "%s is not an IPv6 address on link of %s", in.Gateway6, in.Addr6)
		}
	}
	checkIf("external", d.External)
	checkIf("internal", d.Internal)
	switch d.Tunnel.Mode {
	case ModeGRE, ModeIPIP:
	default:
		bad("tunnel.mode", "%q is not gre or ipip", d.Tunnel.Mode)
	}
	if d.Tunnel.MTU < 1280 || d.Tunnel.MTU > 9216 {
		bad("tunnel.mtu", "%d is outside 1280..9216", d.Tunnel.MTU)
	}
	if d.Conntrack.Capacity < 0 {
		bad("conntrack.capacity", "%d is negative", d.Conntrack.Capacity)
	}
	if err := d.Conntrack.Timeouts.Check(); err != nil {
		bad("conntrack.timeouts", "%v", err)
	}
	names := map[string]bool{}
	keys := map[ruleKey]string{}
	for i, r := range d.Rules {
		f := fmt.Sprintf("rules[%d]", i)
		if r.Name == "" {
			bad(f+".name", "required")
		} else if names[r.Name] {
			bad(f+".name", "%q is used twice", r.Name)
		}
		names[r.Name] = true
		if !r.VIP.IsValid() || r.VIP.Zone() != "" || r.VIP.IsUnspecified() || r.VIP.IsMulticast() {
			bad(f+".vip", "%v is not a unicast address", r.VIP)
		}
		proto := protoNumber(r.Protocol)
		if proto == 0 {
			bad(f+".protocol", "%q is not tcp or udp", r.Protocol)
		}
		if r.Port == 0 {
			bad(f+".port", "required")
		}
		if r.QUIC && proto != packet.ProtoUDP {
			bad(f+".quic", "needs protocol udp")
		}
		switch r.Scheduler {
		case SchedMaglev, SchedWRR, SchedWLC:
		default:
			bad(f+".scheduler", "%q is not maglev, wrr or wlc", r.Scheduler)
		}
		if _, ok := d.Pools[r.Pool]; !ok {
			bad(f+".pool", "%q is not a pool", r.Pool)
		}
		if r.VIP.IsValid() {
			k := ruleKey{addr: r.VIP.Unmap().As16(), proto: proto, port: r.Port}
			if prev, dup := keys[k]; dup {
				bad(f, "%s %s:%d is also rule %q", r.Protocol, r.VIP, r.Port, prev)
			}
			keys[k] = r.Name
			if r.VIP.Unmap().Is4() && !d.External.Addr.IsValid() || r.VIP.Is6() && !r.VIP.Is4In6() && !d.External.Addr6.IsValid() {
				bad(f+".vip", "%s has no external address of its family", r.VIP)
			}
		}
	}
	poolNames := slices.Sorted(func(yield func(string) bool) {
		for n := range d.Pools {
			if !yield(n) {
				return
			}
		}
	})
	for _, pn := range poolNames {
		p := d.Pools[pn]
		f := fmt.Sprintf("pools[%q]", pn)
		mnames := map[string]bool{}
		qids := map[uint16]string{}
		for i, m := range p.Members {
			mf := fmt.Sprintf("%s.members[%d]", f, i)
			if m.Name == "" {
				bad(mf+".name", "required")
			} else if mnames[m.Name] {
				bad(mf+".name", "%q is used twice", m.Name)
			}
			mnames[m.Name] = true
			if !m.Address.IsValid() || m.Address.Zone() != "" || m.Address.IsUnspecified() || m.Address.IsMulticast() {
				bad(mf+".address", "%v is not a unicast address", m.Address)
			} else if a := m.Address.Unmap(); a.Is4() && !d.Internal.Addr.IsValid() || a.Is6() && !d.Internal.Addr6.IsValid() {
				bad(mf+".address", "%s has no internal address of its family", m.Address)
			}
			if m.QUICID != 0 {
				if prev, dup := qids[m.QUICID]; dup {
					bad(mf+".quic_id", "%d is also member %q", m.QUICID, prev)
				}
				qids[m.QUICID] = m.Name
			}
			if m.HealthAddr != "" {
				if _, err := netip.ParseAddrPort(m.HealthAddr); err != nil {
					bad(mf+".health_addr", "%v", err)
				}
			}
		}
		switch p.Health.Type {
		case "tcp", "http", "none":
		default:
			bad(f+".health.type", "%q is not tcp, http or none", p.Health.Type)
		}
		if p.Health.Interval < 10*time.Millisecond {
			bad(f+".health.interval", "%v is below 10ms", p.Health.Interval)
		}
		if p.Health.Timeout <= 0 || p.Health.Timeout > p.Health.Interval {
			bad(f+".health.timeout", "%v must be positive and at most the interval", p.Health.Timeout)
		}
	}
	return errors.Join(errs...)
}

func protoNumber(s string) uint8 {
	switch strings.ToLower(s) {
	case "tcp":
		return packet.ProtoTCP
	case "udp":
		return packet.ProtoUDP
	}
	return 0
}

// ruleKey is what a packet's destination is matched on.
type ruleKey struct {
	addr  [16]byte
	port  uint16
	proto uint8
}
