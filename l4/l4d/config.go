// Package l4d is the l4d command as a library: its YAML configuration, DPDK start-up,
// the datapath's run loop with reload on SIGHUP, the admin API that changes rules and
// pools at runtime, and graceful shutdown. Tests drive it in-process over in-memory
// ports, and cmd/l4d stays a one-line main.
package l4d

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/dpdk"
	"github.com/tiergate/tiergate/l4/packet"
)

// FileConfig is l4d's configuration file. Every field may be left out unless marked
// required; its default is given beside it. deploy/l4d.yaml is a full example.
//
// Only Forwarding (tunnel, conntrack timeouts, rules, pools) and LogLevel change on
// reload or through the admin API; the other sections are fixed at start, and a reload
// that changes them is refused.
type FileConfig struct {
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level" json:"log_level,omitempty"`

	// AdminListen serves the admin API, /metrics and /healthz. Default
	// "127.0.0.1:9180"; "off" disables it.
	AdminListen string `yaml:"admin_listen" json:"admin_listen,omitempty"`

	// AdminTokenFile holds the bearer token of the admin endpoint: with it, every
	// request but GET /healthz and /metrics needs "Authorization: Bearer <token>".
	// Read at start and on reload. Default none: no token.
	AdminTokenFile string `yaml:"admin_token_file" json:"admin_token_file,omitempty"`

	// AdminInsecure lets AdminListen be an address other hosts reach without
	// AdminTokenFile; without it l4d refuses that configuration, since whoever
	// reaches the API can take every member out of service. Default false.
	AdminInsecure bool `yaml:"admin_insecure" json:"admin_insecure,omitempty"`

	// StateFile, when set, keeps changes made through the admin API: after each one
	// the forwarding configuration in force is written there (atomically), and at
	// start and on reload, when the file exists, it is used instead of this file's
	// tunnel, conntrack timeouts, rules and pools. Delete it and reload to go back to
	// this file's. Default none: API changes last until the next reload or restart.
	StateFile string `yaml:"state_file" json:"state_file,omitempty"`

	// DPDK sets the EAL, the workers and the packet buffers.
	DPDK DPDKFile `yaml:"dpdk" json:"dpdk"`

	// Ports are the DPDK devices and the LD's addresses on them. Required.
	Ports PortsFile `yaml:"ports" json:"ports"`

	// LameDuck is how long l4d goes on forwarding after SIGTERM (or SIGINT) with
	// /healthz answering 503 "shutting down", so that health checkers take it out of
	// rotation before it stops. Changes on reload. Default 0: stop at once.
	LameDuck config.Duration `yaml:"lame_duck" json:"lame_duck,omitempty"`

	// HashSeed seeds the flow hash. Every LD of a cluster must use the same seed so
	// that a flow moved between LDs (an ECMP change) keeps its member. Default a
	// fixed value shared by every l4d.
	HashSeed uint64 `yaml:"hash_seed" json:"hash_seed,omitempty"`

	// Forwarding is what the datapath forwards; it changes at runtime.
	Forwarding `yaml:",inline"`
}

// Forwarding is the part of the configuration that changes without a restart: the
// tunnel, the connection timeouts, the rules and the pools. It is also the body of
// GET and PUT /config and the content of the state file.
type Forwarding struct {
	// Tunnel is the encapsulation towards members.
	Tunnel TunnelFile `yaml:"tunnel" json:"tunnel"`
	// Conntrack sizes the connection table (fixed at start) and sets its timeouts.
	Conntrack ConntrackFile `yaml:"conntrack" json:"conntrack"`
	// Rules map (VIP, protocol, port) to a pool.
	Rules []RuleFile `yaml:"rules" json:"rules"`
	// Pools are the L7 members that rules send to, by pool name.
	Pools map[string]PoolFile `yaml:"pools" json:"pools"`
}

// DPDKFile sets DPDK up. It is fixed at start.
type DPDKFile struct {
	// EALArgs are the DPDK EAL arguments (cores, devices: `--vdev=net_af_packet0,iface=eth1`,
	// `-a 0000:03:00.0`, memory). l4d adds `--in-memory` (no hugepage files left behind,
	// several instances side by side) unless `--in-memory`, `--file-prefix`, `--no-huge`
	// or `--legacy-mem` is given, and `--file-prefix=l4d-<pid>` unless `--file-prefix`
	// is given. Default none.
	EALArgs []string `yaml:"eal_args" json:"eal_args,omitempty"`
	// Workers is the number of run-to-completion loops, each polling one RX queue of
	// every port on its own thread. Default 1, at most 64.
	Workers int `yaml:"workers" json:"workers,omitempty"`
	// Mbufs is the number of packet buffers per port; the one pool holds Mbufs times
	// the number of ports. Default: each port's RX and TX descriptors, a burst per
	// worker and for the control goroutine, the per-thread caches and a margin, rounded
	// up to 2^n-1.
	Mbufs int `yaml:"mbufs" json:"mbufs,omitempty"`
	// MbufCache is the per-thread cache of the pool. Default 256, at most 512.
	MbufCache int `yaml:"mbuf_cache" json:"mbuf_cache,omitempty"`
	// RxDesc and TxDesc are the descriptors per queue. Default 1024 each.
	RxDesc int `yaml:"rx_desc" json:"rx_desc,omitempty"`
	TxDesc int `yaml:"tx_desc" json:"tx_desc,omitempty"`
	// Burst is the most packets a worker receives at once. Default 32, at most 256.
	Burst int `yaml:"burst" json:"burst,omitempty"`
	// IdleSleep is how long a worker sleeps after a run of empty polls, so an idle LD
	// does not spin. Default 50µs. Ignored with BusyPoll.
	IdleSleep Duration `yaml:"idle_sleep" json:"idle_sleep,omitempty"`
	// BusyPoll makes workers poll without ever sleeping: the lowest latency, and a
	// whole core per worker. Default false.
	BusyPoll bool `yaml:"busy_poll" json:"busy_poll,omitempty"`
}

// PortsFile names the two sides of the LD.
type PortsFile struct {
	// External faces clients and routers. Required.
	External PortFile `yaml:"external" json:"external"`
	// Internal faces the L7 members. Default: the external port and addresses (one
	// port for both). With addresses but no device, the external device with
	// these addresses for the internal side.
	Internal *PortFile `yaml:"internal" json:"internal,omitempty"`
}

// PortFile is one DPDK device and the LD's addresses on it.
type PortFile struct {
	// Device is the DPDK device name: a vdev ("net_af_packet0") or a PCI address
	// ("0000:03:00.0") made available through dpdk.eal_args. Required on the external
	// port.
	Device string `yaml:"device" json:"device,omitempty"`
	// Addr is the LD's IPv4 address with its on-link prefix ("198.18.0.2/24"). Addr or
	// Addr6 is required.
	Addr string `yaml:"addr" json:"addr,omitempty"`
	// Addr6 is the LD's IPv6 address with its on-link prefix.
	Addr6 string `yaml:"addr6" json:"addr6,omitempty"`
	// Gateway and Gateway6 are the next hops for destinations that are not on link.
	// Default none: only on-link destinations are reached.
	Gateway  string `yaml:"gateway" json:"gateway,omitempty"`
	Gateway6 string `yaml:"gateway6" json:"gateway6,omitempty"`
	// GatewayMAC and Gateway6MAC, when set, are the gateways' Ethernet addresses,
	// used as is instead of ARP/ND (static neighbours). Default: resolved.
	GatewayMAC  string `yaml:"gateway_mac" json:"gateway_mac,omitempty"`
	Gateway6MAC string `yaml:"gateway6_mac" json:"gateway6_mac,omitempty"`
	// MTU of the device. Default: the device's own.
	MTU int `yaml:"mtu" json:"mtu,omitempty"`
}

// TunnelFile is the encapsulation towards members.
type TunnelFile struct {
	// Mode is gre or ipip. Default gre.
	Mode string `yaml:"mode" json:"mode,omitempty"`
	// MTU is the largest outer packet the internal network carries; SYNs have their
	// MSS clamped to fit. Default 1500.
	MTU int `yaml:"mtu" json:"mtu,omitempty"`
	// TTL of the outer header. Default 64.
	TTL uint8 `yaml:"ttl" json:"ttl,omitempty"`
}

// ConntrackFile is the connection table.
type ConntrackFile struct {
	// Capacity is the number of connections the LD tracks, shared equally by the
	// workers. Fixed at start. Default 1,000,000.
	Capacity int `yaml:"capacity" json:"capacity,omitempty"`
	// Timeouts by connection state.
	Timeouts TimeoutsFile `yaml:"timeouts" json:"timeouts"`
}

// TimeoutsFile are the idle timeouts of connection-table entries by state.
type TimeoutsFile struct {
	SynRecv     Duration `yaml:"syn_recv" json:"syn_recv,omitempty"`       // half-open (SYN seen); default 30s
	Established Duration `yaml:"established" json:"established,omitempty"` // default 15m
	Fin         Duration `yaml:"fin" json:"fin,omitempty"`                 // after a FIN; default 1m
	Close       Duration `yaml:"close" json:"close,omitempty"`             // after a RST; default 10s
	UDP         Duration `yaml:"udp" json:"udp,omitempty"`                 // default 5m
}

// RuleFile is one virtual service.
type RuleFile struct {
	// Name identifies the rule in metrics and the admin API. Required, unique.
	Name string `yaml:"name" json:"name"`
	// VIP is the virtual IPv4 or IPv6 address. Required.
	VIP string `yaml:"vip" json:"vip"`
	// Protocol is tcp or udp. Required.
	Protocol string `yaml:"protocol" json:"protocol"`
	// Port is the destination port. Required.
	Port uint16 `yaml:"port" json:"port"`
	// Pool names the pool. Required.
	Pool string `yaml:"pool" json:"pool"`
	// Scheduler is maglev (consistent hashing), wrr (weighted round robin) or wlc
	// (weighted least connections). Default maglev.
	Scheduler string `yaml:"scheduler" json:"scheduler,omitempty"`
	// QUIC routes the rule's UDP packets by the connection ID the member issued, so a
	// client that changes address keeps its member. Udp only. Default false.
	QUIC bool `yaml:"quic" json:"quic,omitempty"`
}

// PoolFile is a pool of L7 members.
type PoolFile struct {
	// Members of the pool; names unique within the pool.
	Members []MemberFile `yaml:"members" json:"members"`
	// Health is the active health check of every member.
	Health HealthFile `yaml:"health" json:"health"`
}

// MemberFile is one L7 node.
type MemberFile struct {
	// Name identifies the member in metrics and the admin API. Required.
	Name string `yaml:"name" json:"name"`
	// Address is the member's tunnel address (outer destination). Required.
	Address string `yaml:"address" json:"address"`
	// Weight for scheduling. Default 1.
	Weight uint32 `yaml:"weight" json:"weight,omitempty"`
	// QUICID is the server ID the member's l7d encodes in its QUIC connection IDs.
	// Default 0: none.
	QUICID uint16 `yaml:"quic_id" json:"quic_id,omitempty"`
	// Drained members get no new flows; their flows stay until they end.
	Drained bool `yaml:"drained" json:"drained,omitempty"`
	// HealthAddr is "ip:port" where the health check connects. Default the member's
	// address and the pool's health port.
	HealthAddr string `yaml:"health_addr" json:"health_addr,omitempty"`
	// MAC, when set ("02:00:00:00:00:11"), is the Ethernet address of the member (or
	// of the internal gateway that reaches it), used as is instead of ARP/ND: a
	// static neighbour. Default: resolved.
	MAC string `yaml:"mac" json:"mac,omitempty"`
}

// HealthFile is an active health check.
type HealthFile struct {
	// Type is tcp (connect), http (GET Path: 2xx and 3xx are up) or none. Default tcp.
	Type string `yaml:"type" json:"type,omitempty"`
	// Port checked on members without health_addr. Default 443.
	Port uint16 `yaml:"port" json:"port,omitempty"`
	// Path for http. Default /healthz.
	Path string `yaml:"path" json:"path,omitempty"`
	// Interval between checks. Default 2s.
	Interval Duration `yaml:"interval" json:"interval,omitempty"`
	// Timeout of one check, at most Interval. Default 1s.
	Timeout Duration `yaml:"timeout" json:"timeout,omitempty"`
	// Rise successes bring a member up, Fall failures take it down. Defaults 2 and 3.
	Rise int `yaml:"rise" json:"rise,omitempty"`
	Fall int `yaml:"fall" json:"fall,omitempty"`
}

// Duration is a time.Duration written as text ("2s", "500ms") in YAML and JSON.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String returns d in time.Duration's form.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes d as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalYAML reads a duration as time.ParseDuration does, naming the line of a
// bad one.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a duration such as 2s", n.Line)
	}
	if err := d.UnmarshalText([]byte(n.Value)); err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	return nil
}

// UnmarshalText reads a duration as time.ParseDuration does.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Defaults of the sections fixed at start.
const (
	DefaultAdminListen = "127.0.0.1:9180"
	DefaultWorkers     = 1
	DefaultMbufCache   = 256
	DefaultDesc        = 1024
	DefaultBurst       = 32
	DefaultIdleSleep   = 50 * time.Microsecond

	maxWorkers   = 64
	maxBurst     = 256
	maxMbufCache = 512 // RTE_MEMPOOL_CACHE_MAX_SIZE
	maxDesc      = 32768
)

// LoadConfig reads and checks a configuration file. Unknown fields are errors.
func LoadConfig(path string) (*FileConfig, error) {
	return daemon.ReadConfig(path, (*FileConfig).validate)
}

// ParseConfig decodes and validates a configuration, filling in the defaults of the
// sections fixed at start; name is used in errors. Errors name the field by its YAML
// path ("pools.web.members[1].address: ...").
func ParseConfig(data []byte, name string) (*FileConfig, error) {
	return daemon.ParseConfig(data, name, (*FileConfig).validate)
}

// validate fills the defaults of the start-time sections and checks everything,
// the forwarding section included (as the datapath would).
func (c *FileConfig) validate() error {
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if _, err := daemon.LogLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.LameDuck < 0 {
		bad("lame_duck", "%v is negative", c.LameDuck)
	}
	if c.AdminListen != "off" && c.AdminTokenFile == "" && !c.AdminInsecure && !daemon.IsLoopbackListen(c.AdminListen) {
		bad("admin_listen", "%q: other hosts can reach it and the admin API would serve them unauthenticated: "+
			"set admin_token_file (or admin_insecure: true when the network keeps them out)", c.AdminListen)
	}
	c.DPDK.fill()
	p := &c.DPDK
	if p.Workers < 1 || p.Workers > maxWorkers {
		bad("dpdk.workers", "%d is outside 1..%d", p.Workers, maxWorkers)
	}
	if p.Burst < 1 || p.Burst > maxBurst {
		bad("dpdk.burst", "%d is outside 1..%d", p.Burst, maxBurst)
	}
	if p.MbufCache < 0 || p.MbufCache > maxMbufCache {
		bad("dpdk.mbuf_cache", "%d is outside 0..%d", p.MbufCache, maxMbufCache)
	}
	for _, d := range []struct {
		field string
		n     int
	}{{"dpdk.rx_desc", p.RxDesc}, {"dpdk.tx_desc", p.TxDesc}} {
		if d.n < 64 || d.n > maxDesc {
			bad(d.field, "%d is outside 64..%d", d.n, maxDesc)
		}
	}
	if p.Mbufs < 0 {
		bad("dpdk.mbufs", "%d is negative", p.Mbufs)
	} else if p.Mbufs > 0 && p.Mbufs < p.minMbufs() {
		bad("dpdk.mbufs", "%d is too few: the queues' descriptors and bursts need %d", p.Mbufs, p.minMbufs())
	}
	if p.IdleSleep < 0 {
		bad("dpdk.idle_sleep", "%v is negative (busy_poll: true never sleeps)", p.IdleSleep)
	}
	for i, a := range p.EALArgs {
		if a == "" {
			bad(fmt.Sprintf("dpdk.eal_args[%d]", i), "empty")
		}
	}
	if err := dpdk.CheckEALArgs(p.EALArgs); err != nil {
		bad("dpdk.eal_args", "%v", err)
	}
	if c.Ports.External.Device == "" {
		bad("ports.external.device", "required")
	}
	if in := c.Ports.Internal; in != nil && in.Device == c.Ports.External.Device && in.MTU != 0 && in.MTU != c.Ports.External.MTU {
		bad("ports.internal.mtu", "%d differs from the external port's %d on the same device %q", in.MTU, c.Ports.External.MTU, in.Device)
	}
	for _, pf := range []struct {
		field string
		p     *PortFile
	}{{"ports.external", &c.Ports.External}, {"ports.internal", c.Ports.Internal}} {
		if pf.p != nil && pf.p.MTU != 0 && (pf.p.MTU < 576 || pf.p.MTU > 9600) {
			bad(pf.field+".mtu", "%d is outside 576..9600", pf.p.MTU)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if _, err := c.Datapath(); err != nil {
		return err
	}
	return nil
}

// fill sets the defaults of the DPDK section.
func (p *DPDKFile) fill() {
	if len(p.EALArgs) == 0 {
		p.EALArgs = nil
	}
	if p.Workers == 0 {
		p.Workers = DefaultWorkers
	}
	if p.MbufCache == 0 {
		p.MbufCache = DefaultMbufCache
	}
	if p.RxDesc == 0 {
		p.RxDesc = DefaultDesc
	}
	if p.TxDesc == 0 {
		p.TxDesc = DefaultDesc
	}
	if p.Burst == 0 {
		p.Burst = DefaultBurst
	}
	if p.IdleSleep == 0 {
		p.IdleSleep = Duration(DefaultIdleSleep)
	}
}

// minMbufs is what one port's queues can hold at once: every RX descriptor filled,
// every TX descriptor waiting, and a burst in each worker's and the control
// goroutine's hands.
func (p *DPDKFile) minMbufs() int {
	return p.Workers*p.RxDesc + p.Workers*p.TxDesc + (p.Workers+1)*p.Burst
}

// MbufsPerPort is the size of one port's share of the pool: Mbufs, or the minimum
// plus the per-thread caches and a margin of 1024, rounded up to 2^n-1 (the size
// DPDK's ring-backed pools use best).
func (p *DPDKFile) MbufsPerPort() int {
	if p.Mbufs > 0 {
		return p.Mbufs
	}
	n := p.minMbufs() + (p.Workers+1)*p.MbufCache + 1024
	size := 1
	for size-1 < n {
		size <<= 1
	}
	return size - 1
}

// sameDevice reports whether the internal side uses the external device.
func (c *FileConfig) sameDevice() bool {
	in := c.Ports.Internal
	return in == nil || in.Device == "" || in.Device == c.Ports.External.Device
}

// Datapath returns the datapath's configuration: the ports' addresses and the
// forwarding section. Errors name fields by their YAML path.
func (c *FileConfig) Datapath() (datapath.Config, error) {
	var errs []error
	var cfg datapath.Config
	cfg.External = parseInterface("ports.external", &c.Ports.External, &errs)
	if c.Ports.Internal == nil {
		cfg.Internal = cfg.External
	} else {
		cfg.Internal = parseInterface("ports.internal", c.Ports.Internal, &errs)
	}
	c.Forwarding.into(&cfg, &errs)
	if len(errs) > 0 {
		return cfg, errors.Join(errs...)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, yamlPaths(err)
	}
	return cfg, nil
}

func parseInterface(field string, p *PortFile, errs *[]error) datapath.Interface {
	var in datapath.Interface
	prefix := func(name, s string) netip.Prefix {
		if s == "" {
			return netip.Prefix{}
		}
		v, err := netip.ParsePrefix(s)
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s.%s: %q is not an address with its prefix length (198.18.0.2/24)", field, name, s))
		}
		return v
	}
	addr := func(name, s string) netip.Addr {
		if s == "" {
			return netip.Addr{}
		}
		v, err := netip.ParseAddr(s)
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s.%s: %q is not an IP address", field, name, s))
		}
		return v
	}
	in.Addr = prefix("addr", p.Addr)
	in.Addr6 = prefix("addr6", p.Addr6)
	in.Gateway = addr("gateway", p.Gateway)
	in.Gateway6 = addr("gateway6", p.Gateway6)
	in.GatewayMAC = parseMAC(field+".gateway_mac", p.GatewayMAC, errs)
	in.Gateway6MAC = parseMAC(field+".gateway6_mac", p.Gateway6MAC, errs)
	return in
}

// parseMAC parses an optional Ethernet address of the configuration.
func parseMAC(field, s string, errs *[]error) packet.MAC {
	if s == "" {
		return packet.MAC{}
	}
	m, err := packet.ParseMAC(s)
	if err != nil || m.IsBroadcast() || m.IsMulticast() || m.IsZero() {
		*errs = append(*errs, fmt.Errorf("%s: %q is not a unicast Ethernet address (02:00:00:00:00:11)", field, s))
	}
	return m
}

// into adds the forwarding section to cfg, collecting parse errors.
func (f *Forwarding) into(cfg *datapath.Config, errs *[]error) {
	bad := func(field, format string, args ...any) {
		*errs = append(*errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	cfg.Tunnel = datapath.TunnelConfig{Mode: strings.ToLower(f.Tunnel.Mode), MTU: f.Tunnel.MTU, TTL: f.Tunnel.TTL}
	cfg.Conntrack = conntrackConfig(f.Conntrack)
	t := &f.Conntrack.Timeouts
	for _, to := range []struct {
		name string
		d    Duration
	}{{"syn_recv", t.SynRecv}, {"established", t.Established}, {"fin", t.Fin}, {"close", t.Close}, {"udp", t.UDP}} {
		if to.d < 0 || to.d.D() > conntrack.MaxTimeout {
			bad("conntrack.timeouts."+to.name, "%v is outside 0..%v", to.d, conntrack.MaxTimeout)
		}
	}
	if f.Conntrack.Capacity > conntrack.MaxCapacity {
		bad("conntrack.capacity", "%d is above %d", f.Conntrack.Capacity, conntrack.MaxCapacity)
	}
	cfg.Rules = make([]datapath.RuleConfig, len(f.Rules))
	for i, r := range f.Rules {
		field := fmt.Sprintf("rules[%d]", i)
		var vip netip.Addr
		if r.VIP == "" {
			bad(field+".vip", "required")
		} else if v, err := netip.ParseAddr(r.VIP); err != nil {
			bad(field+".vip", "%q is not an IP address", r.VIP)
		} else {
			vip = v
		}
		cfg.Rules[i] = datapath.RuleConfig{Name: r.Name, VIP: vip, Protocol: r.Protocol, Port: r.Port,
			Pool: r.Pool, Scheduler: strings.ToLower(r.Scheduler), QUIC: r.QUIC}
	}
	cfg.Pools = make(map[string]datapath.PoolConfig, len(f.Pools))
	for name, p := range f.Pools {
		field := "pools." + name
		if name == "" {
			bad("pools", "a pool has an empty name")
		}
		pc := datapath.PoolConfig{Health: datapath.HealthConfig{
			Type: strings.ToLower(p.Health.Type), Port: p.Health.Port, Path: p.Health.Path,
			Interval: p.Health.Interval.D(), Timeout: p.Health.Timeout.D(), Rise: p.Health.Rise, Fall: p.Health.Fall,
		}}
		if p.Health.Rise < 0 {
			bad(field+".health.rise", "%d is negative", p.Health.Rise)
		}
		if p.Health.Fall < 0 {
			bad(field+".health.fall", "%d is negative", p.Health.Fall)
		}
		for i, m := range p.Members {
			mf := fmt.Sprintf("%s.members[%d]", field, i)
			var a netip.Addr
			if m.Address == "" {
				bad(mf+".address", "required")
			} else if v, err := netip.ParseAddr(m.Address); err != nil {
				bad(mf+".address", "%q is not an IP address", m.Address)
			} else {
				a = v
			}
			pc.Members = append(pc.Members, datapath.MemberConfig{Name: m.Name, Address: a, Weight: m.Weight,
				QUICID: m.QUICID, Drained: m.Drained, HealthAddr: m.HealthAddr, MAC: parseMAC(mf+".mac", m.MAC, errs)})
		}
		cfg.Pools[name] = pc
	}
}

// conntrackConfig maps the file's connection table to the datapath's.
func conntrackConfig(f ConntrackFile) conntrack.Config {
	return conntrack.Config{
		Capacity: f.Capacity,
		Timeouts: conntrack.Timeouts{
			SynRecv:     f.Timeouts.SynRecv.D(),
			Established: f.Timeouts.Established.D(),
			Fin:         f.Timeouts.Fin.D(),
			Close:       f.Timeouts.Close.D(),
			UDP:         f.Timeouts.UDP.D(),
		},
	}
}

// dpField matches the datapath's names for fields that the file spells otherwise.
var dpField = regexp.MustCompile(`^(external|internal)\b|^pools\[("(?:[^"\\]|\\.)*")\]`)

// yamlPaths rewrites the field names at the start of each of the datapath's
// validation errors into the file's YAML paths: "external.addr" becomes
// "ports.external.addr", `pools["web"]` becomes "pools.web".
func yamlPaths(err error) error {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		msg := e.Error()
		if m := dpField.FindStringSubmatchIndex(msg); m != nil {
			switch {
			case m[2] >= 0:
				msg = "ports." + msg
			case m[4] >= 0:
				if name, uerr := strconv.Unquote(msg[m[4]:m[5]]); uerr == nil {
					msg = "pools." + name + msg[m[1]:]
				}
			}
		}
		out = append(out, errors.New(msg))
	}
	return errors.Join(out...)
}
