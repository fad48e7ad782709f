// Package l4d is the l4d command as a library: its YAML configuration, DPDK start-up,
// the datapath's run loop with reload on SIGHUP, the admin API that changes rules and
// pools at runtime, and graceful shutdown. With a control section its rules and pools
// come from the control plane instead, through the node agent (control.go). Tests
// drive it in-process over in-memory ports, and cmd/l4d stays a one-line main.
package l4d

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/bgp"
	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/dpdk"
	"github.com/tiergate/tiergate/l4/sessionsync"
	"github.com/tiergate/tiergate/policy/blacklist"
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

	// AdminTokenFile holds the bearer token of the admin endpoint: every request
	// but GET /healthz and /metrics needs "Authorization: Bearer <token>". The
	// token is the file's content less surrounding white space, at least 16 bytes
	// of visible ASCII; the file must exist, and is warned about when its group or
	// others may read it. Read at start and on reload. Default: the token in
	// <state_dir>/admin.token, generated there (0600) at the first start and logged
	// with its path.
	AdminTokenFile string `yaml:"admin_token_file" json:"admin_token_file,omitempty"`

	// AdminInsecure serves the admin API with no token when AdminTokenFile is not
	// set: whoever reaches admin_listen can take every member out of service. Only
	// where nothing else runs on the host and the network keeps others out. Fixed
	// at start. Default false: a token is required.
	AdminInsecure bool `yaml:"admin_insecure" json:"admin_insecure,omitempty"`

	// AdminHosts lists the host names (or addresses) by which the admin endpoint is
	// reached, besides a loopback address, "localhost" and the address it listens
	// on: a request whose Host header names anything else is refused (421), which
	// keeps web pages out by DNS rebinding. Changes on reload. Default none.
	AdminHosts []string `yaml:"admin_hosts" json:"admin_hosts,omitempty"`

	// StateDir is l4d's own directory: the admin token it generates lives there.
	// Created (0700) when missing. Fixed at start. Default /var/lib/tiergate/l4d
	// (systemd: StateDirectory=tiergate/l4d).
	StateDir string `yaml:"state_dir" json:"state_dir,omitempty"`

	// StateFile, when set, keeps changes made through the admin API: after each one
	// the forwarding configuration in force is written there (atomically), and at
	// start and on reload, when the file exists, it is used instead of this file's
	// tunnel, conntrack timeouts, rules and pools. Delete it and reload to go back to
	// this file's. Default none: API changes last until the next reload or restart.
	StateFile string `yaml:"state_file" json:"state_file,omitempty"`

	// Control, when set, takes the rules and pools from the control plane: the
	// node agent (control/agent) reads the cluster configuration's L4 rules and L4
	// pools from the store, and each snapshot is applied as a reload applies the
	// file's, all or nothing; one l4d refuses (a VIP of a family it has no address
	// of) is reported as refused and the rules in force stay. The file then keeps
	// the ports, addresses, tunnel, conntrack, DPDK and admin settings, and must not
	// give rules, pools or state_file; the admin API reads rules and pools but does
	// not change them (409 control_plane). The section is agent.NodeConfig: node
	// (required), etcd_endpoints (required), ca_file, cert_file, key_file,
	// username, password_file, dial_timeout (default 5s) and cache_file (default
	// <state_dir>/control-snapshot.json), from which l4d starts when the store is
	// out of reach. Fixed at start. Default none: rules and pools from this file.
	Control *agent.NodeConfig `yaml:"control" json:"control,omitempty"`

	// Blacklists names the control plane's blacklists (tgctl blacklist, stored by
	// control/blsync) that l4d enforces, with a control section only: a packet to a
	// VIP from a source on one of them is dropped before it is tunnelled (result
	// blacklisted in tiergate_l4_packets_total and GET /status), so a listed client
	// never costs an L7 node a handshake. The lists follow the store (only what
	// changed is fetched), their versions are reported in the node's status, and the
	// last version of each is kept in BlacklistDir. Fixed at start. Default [global]
	// with a control section; [] enforces none.
	Blacklists []string `yaml:"blacklists" json:"blacklists,omitempty"`

	// BlacklistDir keeps the last version of each list in Blacklists, loaded at start
	// so that l4d started while the store is out of reach drops what it dropped
	// before. Fixed at start. Default <state_dir>/blacklists.
	BlacklistDir string `yaml:"blacklist_dir" json:"blacklist_dir,omitempty"`

	// BGP, when set, announces the rules' VIPs to the routers (l4/bgp.Config):
	// asn and peers (address, as, hold_time, password_file, ttl_security, ...) are
	// required; next_hop and next_hop6 default to ports.external's addresses. A VIP
	// is announced while the LD can serve it and withdrawn, with the reason in GET
	// /bgp and tiergate_l4_bgp_*, on POST /drain, SIGTERM (then l4d forwards for
	// withdraw_delay, default 3s, before it stops), datapath stopped, a port down,
	// no member up and undrained in any of its rules (withdraw_unhealthy, default
	// true), or an announce gate closed (warm-up). With bfd.enabled (min_tx,
	// min_rx 300ms, multiplier 3 by default; a peer's bfd: false leaves it out) a
	// BFD session runs beside each BGP session, so that a router with BFD on drops
	// a dead LD's routes in under a second; its state is in GET /bgp and
	// tiergate_l4_bfd_*, and it stops after the BGP sessions, so a graceful stop
	// never relies on it. Fixed at start. Default none: no BGP.
	BGP *bgp.Config `yaml:"bgp" json:"bgp,omitempty"`

	// Sync, when set, shares the long-lived connections with the cluster's other
	// LDs (l4/sessionsync.Config), so that a flow ECMP moves here from a failed LD
	// keeps its L7 node: cluster_id and key_file (at least 32 bytes, the same on
	// every LD) are required; listen (default ":9187", the internal address),
	// peers (the other LDs' listen addresses), sync_after (default 3s),
	// flush_interval (100ms), full_sync_every (4m), full_sync_rate (250000 entries
	// a second), warmup_timeout (30s: with bgp, the VIPs are announced once every
	// peer's full sync arrived or after it) and mtu (1500). Datagrams that are
	// forged, replayed, of another cluster or from other addresses are dropped and
	// counted (tiergate_l4_sync_*). Fixed at start. Default none: no sync.
	Sync *sessionsync.Config `yaml:"sync" json:"sync,omitempty"`

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

	// MaxNeighbours bounds the neighbour (ARP and ND) table
	// (datapath.Config.MaxNeighbours): the gateways and members are pinned, other
	// entries go least recently used first. Changes on reload. Default 1024.
	MaxNeighbours int `yaml:"max_neighbours" json:"max_neighbours,omitempty"`

	// ICMP rate-limits the fragmentation-needed and packet-too-big errors sent to
	// clients whose packets do not fit the tunnel (datapath.ICMPConfig). Changes on
	// reload. Default rate 1000 per second per worker, burst 50.
	ICMP datapath.ICMPConfig `yaml:"icmp" json:"icmp,omitzero"`

	// Trace records the path of marked probe packets (datapath.TraceConfig, TGW's
	// trace and drop points): a packet meeting every criterion set (dscp 1..63,
	// sources: the probe servers' prefixes, tcp_option: an option kind) is
	// recorded by each worker with ld (this LD's ID; default the host name, else
	// the external address), readable from GET /trace and
	// tiergate_l4_trace_points_total / tiergate_l4_trace_drops_total; records
	// (per worker, default 1024) and sample_bytes (default 128) bound the memory,
	// rate (records a second per worker, default 1000) the work of a marked flood.
	// Changes on reload. Default none: nothing traced.
	Trace datapath.TraceConfig `yaml:"trace" json:"trace,omitzero"`

	// SynProxy sets the SYN proxy of the rules whose synproxy is on or auto
	// (datapath.SynProxyConfig: auto_on, auto_off, auto_hold, mss, wscale, secret,
	// rotate). Changes on reload. Default: the defaults, used only when a rule is
	// proxied.
	SynProxy datapath.SynProxyConfig `yaml:"synproxy" json:"synproxy,omitzero"`

	// Overload protects the LD past a load watermark with per-rule quotas on new
	// connections (datapath.OverloadConfig: mode, capacity_pps, high, low, hold,
	// interval, signals, quotas, share_window, packets, min_quota, keep_share); the rules' own
	// static limits are their limits section. State in GET /status (overload) and
	// tiergate_l4_overload_state. Changes on reload. Default: on only when
	// capacity_pps is set.
	Overload datapath.OverloadConfig `yaml:"overload" json:"overload,omitzero"`

	// Forwarding is what the datapath forwards; it changes at runtime.
	Forwarding `yaml:",inline"`
}

// Forwarding is the part of the configuration that changes without a restart: the
// tunnel, the connection timeouts, the rules and the pools. It is also the body of
// GET and PUT /config and the content of the state file. Its sections are the
// datapath's model (datapath.Config), with the datapath's names and defaults.
type Forwarding struct {
	// Tunnel is the encapsulation towards members (datapath.TunnelConfig).
	Tunnel datapath.TunnelConfig `yaml:"tunnel" json:"tunnel"`
	// Conntrack is the connection table (conntrack.Config): capacity, the
	// connections the LD tracks, shared equally by the workers, fixed at start,
	// default 1,000,000; timeouts by state (syn_recv 30s, established 15m, fin 1m,
	// close 10s, udp 5m, unconfirmed 10s by default).
	Conntrack conntrack.Config `yaml:"conntrack" json:"conntrack"`
	// Rules map (VIP, protocol, port) to a pool (datapath.RuleConfig).
	Rules []datapath.RuleConfig `yaml:"rules" json:"rules"`
	// Pools are the L7 members that rules send to, by pool name
	// (datapath.PoolConfig).
	Pools map[string]datapath.PoolConfig `yaml:"pools" json:"pools"`
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
	IdleSleep config.Duration `yaml:"idle_sleep" json:"idle_sleep,omitempty"`
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
	// Interface holds the LD's addresses on the port (addr, addr6: one is
	// required), its gateways and their static MACs (datapath.Interface).
	datapath.Interface `yaml:",inline"`
	// MTU of the device. Default: the device's own.
	MTU int `yaml:"mtu" json:"mtu,omitempty"`
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

// defaultStateDir is StateDir's default; tests point it elsewhere.
var defaultStateDir = daemon.DefaultStateDir("l4d")

// ParseConfig decodes and validates a configuration, filling in the defaults of the
// sections fixed at start; name is used in errors. Errors name the field by its YAML
// path ("pools.web.members[1].address: ...").
func ParseConfig(data []byte, name string) (*FileConfig, error) {
	return daemon.ParseConfig(data, name, (*FileConfig).validate)
}

// validate fills the defaults of the start-time sections and checks everything,
// the forwarding section included (as the datapath would), naming each bad field by
// its path in the file.
func (c *FileConfig) validate() error {
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	var ck config.Checker
	bad := ck.Addf
	if _, err := daemon.LogLevel(c.LogLevel); err != nil {
		bad("log_level", "%q: want debug, info, warn or error", c.LogLevel)
	}
	if c.LameDuck < 0 {
		bad("lame_duck", "%v is negative", c.LameDuck)
	}
	if c.StateDir == "" {
		c.StateDir = defaultStateDir
	}
	if c.Control != nil {
		c.controlled(&ck)
	} else {
		if c.Blacklists != nil {
			bad("blacklists", "needs a control section: the blacklists come from the control plane")
		}
		if c.BlacklistDir != "" {
			bad("blacklist_dir", "needs a control section: the blacklists come from the control plane")
		}
	}
	for i, h := range c.AdminHosts {
		if h == "" || strings.ContainsAny(h, "/ \t") {
			bad(config.Index("admin_hosts", i), "%q: want a host name or address", h)
		}
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
			bad(config.Index("dpdk.eal_args", i), "empty")
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
	c.validateBGP(&ck)
	c.validateSync(&ck)
	if err := ck.Err(); err != nil {
		return err
	}
	_, err := c.Datapath()
	return err
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
		p.IdleSleep = config.Duration(DefaultIdleSleep)
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
// forwarding section, validated. Errors name fields by their path in the file: the
// datapath's own paths, with its interfaces ("external", "internal") under "ports".
func (c *FileConfig) Datapath() (datapath.Config, error) {
	cfg := datapath.Config{
		External:  c.Ports.External.Interface,
		Tunnel:    c.Tunnel,
		Rules:     c.Rules,
		Pools:     c.Pools,
		Conntrack: c.Conntrack,

		MaxNeighbours: c.MaxNeighbours,
		ICMP:          c.ICMP,
		Trace:         c.Trace,
		SynProxy:      c.SynProxy,
		Overload:      c.Overload,
	}
	cfg.Internal = cfg.External
	if c.Ports.Internal != nil {
		cfg.Internal = c.Ports.Internal.Interface
	}
	if err := cfg.Validate(); err != nil {
		return cfg, underPorts(err)
	}
	return cfg, nil
}

// underPorts puts the datapath's interface fields ("external.addr") where the file
// has them ("ports.external.addr"); its other paths are the file's already.
func underPorts(err error) error {
	var ck config.Checker
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var fe *config.FieldError
		if errors.As(e, &fe) {
			if first, _, _ := strings.Cut(fe.Path, "."); first == "external" || first == "internal" {
				ck.Nest("ports", fe)
				continue
			}
		}
		ck.Nest("", e)
	}
	return ck.Err()
}

// controlled checks the control section and what it excludes, and fills in its
// cache file's default.
func (c *FileConfig) controlled(ck *config.Checker) {
	c.Control.Defaults(c.StateDir)
	ck.Nest("control", c.Control.Validate())
	if len(c.Rules) > 0 {
		ck.Addf("rules", "not with control: the rules come from the control plane (its l4-rules); remove them from the file")
	}
	if len(c.Pools) > 0 {
		ck.Addf("pools", "not with control: the pools come from the control plane (its l4-pools); remove them from the file")
	}
	if c.StateFile != "" {
		ck.Addf("state_file", "not with control: the rules and pools come from the control plane, whose last snapshot is kept in control.cache_file")
	}
	if c.Blacklists == nil {
		c.Blacklists = []string{blacklist.GlobalName}
	}
	for i, n := range c.Blacklists {
		if err := blsync.CheckName(n); err != nil {
			ck.Add(config.Index("blacklists", i), err)
		} else if slices.Index(c.Blacklists, n) < i {
			ck.Addf(config.Index("blacklists", i), "%q is named twice", n)
		}
	}
	if c.BlacklistDir == "" {
		c.BlacklistDir = filepath.Join(c.StateDir, "blacklists")
	}
}
