package datapath

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/internal/config"
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
//
// It is the L4 forwarding model, with the same names in YAML and JSON (l4d's
// configuration file, its admin API and its state file use it), and Validate names
// each bad field by its path in that form ("pools.web.members[1].address").
type Config struct {
	// External is the LD's address on the external port (clients, routers):
	// the port answers ARP/ND for it and for every VIP, and sends replies to
	// clients through Gateway (or straight to the client when it is on link).
	External Interface `yaml:"external" json:"external"`

	// Internal is the LD's address on the internal port (L7 members): the outer
	// source of tunnelled packets, and where members send replies back. Members
	// must be on link, or reached through Internal.Gateway. When the datapath runs
	// on one port for both sides, Internal may equal External.
	Internal Interface `yaml:"internal" json:"internal"`

	// Tunnel sets the encapsulation towards members.
	Tunnel TunnelConfig `yaml:"tunnel" json:"tunnel"`

	// Rules map (VIP, protocol, port) to a pool. Names and (VIP, protocol, port)
	// must be unique.
	Rules []RuleConfig `yaml:"rules" json:"rules"`

	// Pools are the named pools of L7 members that rules send to.
	Pools map[string]PoolConfig `yaml:"pools" json:"pools"`

	// Conntrack sets the connection table (conntrack.Config: capacity, timeouts). Its
	// Capacity is for the whole LD; each worker gets an equal share. Default
	// 1,000,000 entries; default timeouts are conntrack's (half-open 30 s, established
	// 900 s, FIN 60 s, RST 10 s, UDP 300 s, unconfirmed 10 s: a flow picked up mid-way,
	// by a TCP packet without SYN or a UDP datagram, until its member's reply confirms
	// it).
	Conntrack conntrack.Config `yaml:"conntrack" json:"conntrack"`

	// MaxNeighbours bounds the neighbour table (the ARP and ND entries of both ports),
	// as the kernel's gc_thresh3 does. The gateways and the members' next hops are
	// pinned: always kept, never evicted. When the table is full, resolving another
	// on-link destination evicts the entry that was used least recently; when every
	// entry is pinned, it is refused (tiergate_l4_neighbour_evictions_total and
	// tiergate_l4_neighbour_refused_total count both). Default 1024.
	MaxNeighbours int `yaml:"max_neighbours" json:"max_neighbours,omitempty"`

	// ICMP limits the ICMP errors the LD sends clients, as a router does, when a
	// packet that may not be fragmented (IPv4 with DF set, and every IPv6 packet) does
	// not fit the tunnel: fragmentation needed (IPv4) or packet too big (IPv6), with
	// the largest size that fits.
	ICMP ICMPConfig `yaml:"icmp" json:"icmp"`

	// SynProxy sets the SYN proxy of the rules whose synproxy is on or auto
	// (SynProxyConfig: auto thresholds, the MSS and window scale the LD advertises,
	// the cookie secret and its rotation). Unused when no rule is proxied.
	SynProxy SynProxyConfig `yaml:"synproxy" json:"synproxy,omitzero"`

	// Overload protects the LD past a load watermark with per-rule quotas on new
	// connections (OverloadConfig). Default: on only when overload.capacity_pps is
	// set; the rules' static limits (RuleConfig.Limits) apply either way.
	Overload OverloadConfig `yaml:"overload" json:"overload,omitzero"`

	// Trace records the path of marked probe packets (TGW's trace and drop points):
	// the marker (dscp, sources, tcp_option: a packet meeting every one set is
	// marked), the LD's ID in the records (ld; default the host name, else the
	// external address), and each worker's ring (records, default 1024; sample_bytes,
	// default 128; rate, records a second, default 1000). Read with Distributor.Trace (l4d: GET /trace) and
	// tiergate_l4_trace_points_total / tiergate_l4_trace_drops_total. Default: no
	// criterion, nothing traced.
	Trace TraceConfig `yaml:"trace" json:"trace,omitzero"`
}

// ICMPConfig rate-limits the ICMP errors the LD sends, per worker, with a token
// bucket; the errors it suppresses are counted
// (tiergate_l4_icmp_errors_total{result="suppressed"}).
type ICMPConfig struct {
	// Rate is how many ICMP errors each worker sends per second at most. Default
	// 1000; negative: none is sent (the packets are only dropped, as too_big).
	Rate int `yaml:"rate" json:"rate,omitempty"`
	// Burst is how many a worker may send at once after a quiet spell. Default 50.
	Burst int `yaml:"burst" json:"burst,omitempty"`
}

// Interface is one side of the LD: its own addresses and its next hop.
type Interface struct {
	// Addr is the LD's IPv4 address with its on-link prefix, e.g. 198.18.0.2/24.
	// Addr or Addr6 is required.
	Addr netip.Prefix `yaml:"addr" json:"addr,omitzero"`
	// Addr6 is the LD's optional IPv6 address with its on-link prefix.
	Addr6 netip.Prefix `yaml:"addr6" json:"addr6,omitzero"`
	// Gateway and Gateway6 are the next hops for destinations that are not on
	// link. Default none: only on-link destinations are reachable.
	Gateway  netip.Addr `yaml:"gateway" json:"gateway,omitzero"`
	Gateway6 netip.Addr `yaml:"gateway6" json:"gateway6,omitzero"`
	// GatewayMAC and Gateway6MAC, when set ("02:00:00:00:00:01"), are the gateways'
	// Ethernet addresses, used as is instead of resolving them (static
	// neighbours). Default: resolved.
	GatewayMAC  packet.MAC `yaml:"gateway_mac" json:"gateway_mac,omitzero"`
	Gateway6MAC packet.MAC `yaml:"gateway6_mac" json:"gateway6_mac,omitzero"`
}

// TunnelConfig sets the encapsulation of packets sent to members.
type TunnelConfig struct {
	// Mode is "gre" (default) or "ipip".
	Mode string `yaml:"mode" json:"mode,omitempty"`
	// MTU is the largest outer IP packet the internal network carries. TCP SYNs
	// have their MSS clamped so that full-sized segments fit once encapsulated,
	// and larger packets are dropped (reason too_big). Default 1500.
	MTU int `yaml:"mtu" json:"mtu,omitempty"`
	// TTL of the outer header. Default 64.
	TTL uint8 `yaml:"ttl" json:"ttl,omitempty"`
	// Key, when not 0, is the GRE key (RFC 2890) of the tunnel: every packet sent
	// to a member carries it (an 8-byte GRE header instead of 4, which the MSS
	// clamp and the MTU of too-big answers take off mtu), and a member's reply
	// without it or with another is dropped (reason return_bad_key). Only with mode
	// gre: IPIP has no field for a key, and Validate refuses one. Default 0: packets
	// are sent without a key and replies are not checked for one.
	Key uint32 `yaml:"key" json:"key,omitempty"`
}

// RuleConfig is one virtual service: packets to VIP:Port over Protocol go to Pool.
type RuleConfig struct {
	// Name identifies the rule in metrics and the admin API. Required, unique.
	Name string `yaml:"name" json:"name"`
	// VIP is the virtual address (IPv4 or IPv6). Required.
	VIP netip.Addr `yaml:"vip" json:"vip"`
	// Protocol is "tcp" or "udp". Required.
	Protocol string `yaml:"protocol" json:"protocol"`
	// Port is the destination port. Required.
	Port uint16 `yaml:"port" json:"port"`
	// Pool names the pool of members. Required.
	Pool string `yaml:"pool" json:"pool"`
	// Scheduler picks members for new flows: "maglev" (consistent hashing,
	// default), "wrr" (weighted round robin) or "wlc" (weighted least connections).
	Scheduler string `yaml:"scheduler" json:"scheduler,omitempty"`
	// QUIC routes UDP packets by the connection ID the member issued (its QUICID)
	// so a client that changes address keeps its member. Only with Protocol "udp".
	// Default false.
	QUIC bool `yaml:"quic" json:"quic,omitempty"`
	// SynProxy is the rule's SYN proxy (TCP only): "on", the LD answers every SYN
	// with a SYN cookie and opens the connection to the member only on a valid ACK;
	// "auto", it does so while its connection table passes synproxy.auto_on
	// half-open; "off" (default, also ""), never.
	SynProxy string `yaml:"synproxy" json:"synproxy,omitempty"`
	// Limits are the rule's static limits (new connections per second, concurrent
	// connections) and its weight in overload quotas (RuleLimits). Default: no
	// limit, weight 1.
	Limits RuleLimits `yaml:"limits" json:"limits,omitzero"`
}

// PoolConfig is a set of L7 members with a health check.
type PoolConfig struct {
	// Members of the pool. Names must be unique within the pool.
	Members []MemberConfig `yaml:"members" json:"members"`
	// Health is the active health check. Default: TCP connect to each member's
	// address on port 443 every 2 s, 1 s timeout, down after 3 failures, up
	// after 2 successes.
	Health HealthConfig `yaml:"health" json:"health"`
}

// MemberConfig is one L7 node.
type MemberConfig struct {
	// Name identifies the member in metrics and the admin API. Required, unique
	// within the pool.
	Name string `yaml:"name" json:"name"`
	// Address is the member's tunnel address (outer destination). Required; same
	// family as the internal address that reaches it.
	Address netip.Addr `yaml:"address" json:"address"`
	// Weight for scheduling. Default 1 (use Drain to stop sending new flows).
	Weight uint32 `yaml:"weight" json:"weight,omitempty"`
	// QUICID is the server ID the member's l7d puts in the QUIC connection IDs it
	// issues (in wire's layout). Default 0: none.
	QUICID uint16 `yaml:"quic_id" json:"quic_id,omitempty"`
	// Drained members get no new flows; their existing flows stay until they end.
	// Default false.
	Drained bool `yaml:"drained" json:"drained,omitempty"`
	// HealthAddr is where the health check connects, "ip:port". Default the
	// member's Address and the pool's Health.Port.
	HealthAddr string `yaml:"health_addr" json:"health_addr,omitempty"`
	// MAC, when set ("02:00:00:00:00:11"), is the member's (or its next hop's)
	// Ethernet address, used as is instead of resolving it with ARP/ND (a static
	// neighbour). Default: resolved.
	MAC packet.MAC `yaml:"mac" json:"mac,omitzero"`
}

// HealthConfig is an active health check.
type HealthConfig struct {
	// Type is "tcp" (connect, default), "http" (GET Path, 2xx/3xx is up) or
	// "none" (always up).
	Type string `yaml:"type" json:"type,omitempty"`
	// Port of the check when a member has no HealthAddr. Default 443.
	Port uint16 `yaml:"port" json:"port,omitempty"`
	// Path for "http". Default "/healthz".
	Path string `yaml:"path" json:"path,omitempty"`
	// Interval between checks, at least 10ms. Default 2s.
	Interval config.Duration `yaml:"interval" json:"interval,omitempty"`
	// Timeout of one check, at most Interval. Default 1s.
	Timeout config.Duration `yaml:"timeout" json:"timeout,omitempty"`
	// Rise successes make a down member up; Fall failures make an up member down.
	// Defaults 2 and 3. Members start up.
	Rise int `yaml:"rise" json:"rise,omitempty"`
	Fall int `yaml:"fall" json:"fall,omitempty"`
}

const (
	defaultMTU           = 1500
	defaultTTL           = 64
	defaultHealthInt     = 2 * time.Second
	defaultMaxNeighbours = 1024
	defaultICMPRate      = 1000
	defaultICMPBurst     = 50
)

func (c *Config) withDefaults() Config {
	out := *c
	out.Tunnel.Mode = strings.ToLower(out.Tunnel.Mode)
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
		out.Conntrack.Capacity = conntrack.DefaultCapacity
	}
	if out.MaxNeighbours == 0 {
		out.MaxNeighbours = defaultMaxNeighbours
	}
	if out.ICMP.Rate == 0 {
		out.ICMP.Rate = defaultICMPRate
	}
	if out.ICMP.Burst == 0 {
		out.ICMP.Burst = defaultICMPBurst
	}
	out.Overload = out.Overload.withDefaults()
	ext := out.External.Addr.Addr()
	if !ext.IsValid() {
		ext = out.External.Addr6.Addr()
	}
	out.Trace = out.Trace.WithDefaults(ext)
	out.Rules = slices.Clone(c.Rules)
	for i := range out.Rules {
		out.Rules[i].Scheduler = strings.ToLower(out.Rules[i].Scheduler)
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
		h.Type = strings.ToLower(h.Type)
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
			h.Interval = config.Duration(defaultHealthInt)
		}
		if h.Timeout == 0 {
			h.Timeout = config.Duration(time.Second)
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

// Validate reports every problem of the configuration, each a config.FieldError
// naming its field by its YAML/JSON path ("pools.web.members[1].address").
func (c *Config) Validate() error {
	d := c.withDefaults()
	var ck config.Checker
	bad := ck.Addf
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
		checkMAC(&ck, field+".gateway_mac", in.GatewayMAC)
		checkMAC(&ck, field+".gateway6_mac", in.Gateway6MAC)
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
	if d.Tunnel.Key != 0 && d.Tunnel.Mode != ModeGRE {
		bad("tunnel.key", "needs mode gre")
	}
	if d.MaxNeighbours < 0 {
		bad("max_neighbours", "%d is negative", d.MaxNeighbours)
	}
	if d.ICMP.Burst < 0 {
		bad("icmp.burst", "%d is negative", d.ICMP.Burst)
	}
	ck.Nest("conntrack", d.Conntrack.Validate())
	d.SynProxy = d.SynProxy.withDefaults()
	validateSynProxy(&ck, &d)
	validateOverload(&ck, &d)
	ck.Nest("trace", c.Trace.Validate())
	names := map[string]bool{}
	keys := map[ruleKey]string{}
	for i, r := range d.Rules {
		f := config.Index("rules", i)
		if r.Name == "" {
			bad(f+".name", "required")
		} else if names[r.Name] {
			bad(f+".name", "%q is used twice", r.Name)
		}
		names[r.Name] = true
		if !r.VIP.IsValid() {
			bad(f+".vip", "required")
		} else if r.VIP.Zone() != "" || r.VIP.IsUnspecified() || r.VIP.IsMulticast() {
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
		f := config.At("pools", pn)
		if pn == "" {
			bad("pools", "a pool has an empty name")
		}
		mnames := map[string]bool{}
		qids := map[uint16]string{}
		for i, m := range p.Members {
			mf := config.Index(config.At(f, "members"), i)
			if m.Name == "" {
				bad(mf+".name", "required")
			} else if mnames[m.Name] {
				bad(mf+".name", "%q is used twice", m.Name)
			}
			mnames[m.Name] = true
			if !m.Address.IsValid() {
				bad(mf+".address", "required")
			} else if m.Address.Zone() != "" || m.Address.IsUnspecified() || m.Address.IsMulticast() {
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
			checkMAC(&ck, mf+".mac", m.MAC)
		}
		switch p.Health.Type {
		case "tcp", "http", "none":
		default:
			bad(f+".health.type", "%q is not tcp, http or none", p.Health.Type)
		}
		if p.Health.Rise < 0 {
			bad(f+".health.rise", "%d is negative", p.Health.Rise)
		}
		if p.Health.Fall < 0 {
			bad(f+".health.fall", "%d is negative", p.Health.Fall)
		}
		if p.Health.Interval.D() < 10*time.Millisecond {
			bad(f+".health.interval", "%v is below 10ms", p.Health.Interval)
		}
		if p.Health.Timeout <= 0 || p.Health.Timeout > p.Health.Interval {
			bad(f+".health.timeout", "%v must be positive and at most the interval", p.Health.Timeout)
		}
	}
	return ck.Err()
}

// checkMAC reports a static neighbour's Ethernet address that is set but not a
// unicast one.
func checkMAC(ck *config.Checker, field string, m packet.MAC) {
	if !m.IsZero() && (m.IsBroadcast() || m.IsMulticast()) {
		ck.Addf(field, "%s is not a unicast Ethernet address (02:00:00:00:00:11)", m)
	}
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
