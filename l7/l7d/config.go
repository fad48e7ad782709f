// Package l7d is the l7d command as a library: its YAML configuration, its run loop
// with reload on SIGHUP and on the admin endpoint, and graceful shutdown, so tests drive
// it in-process and cmd/l7d stays a one-line main.
package l7d

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/certs"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/l7/tunnel"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/clientip"
	"github.com/tiergate/tiergate/policy/route"
)

// FileConfig is l7d's configuration file. Every field may be left out unless marked
// required; its default is given beside it. deploy/l7d.yaml is a full example.
type FileConfig struct {
	// Listeners terminate TLS (TCP) and QUIC (UDP) on the same address. Required.
	Listeners []ListenerFile `yaml:"listeners"`

	// Routing is the routing policy (package policy/route): per listener, virtual
	// hosts and ordered routes that proxy to pools, redirect or answer; the pools
	// with their members, weights, balancing, health checks and passive ejection.
	// Default: the simple form, Backends and each listener's pool. Excludes both.
	Routing *route.Config `yaml:"routing"`

	// Backends are named pools of HTTP/1.1 servers that listeners proxy to, the
	// simple form of Routing: each listener sends every request to its pool.
	// Required without routing, refused with it.
	Backends map[string]l7.PoolConfig `yaml:"backends"`

	// Blacklists are the IP blacklists loaded from files, by list name: "global"
	// (every listener) or a listener's name (that listener only). Lists may also be
	// pushed at runtime through the admin endpoint, whether they are named here or
	// not. Default none.
	Blacklists map[string]blacklist.ListConfig `yaml:"blacklists"`

	// Certificates: files or a directory, the default name, and the ticket keys shared
	// by the cluster. Required (at least one certificate).
	Certificates certs.Config `yaml:"certificates"`

	// KeyServers is where remote private keys live. Default: none (every certificate
	// needs a local key_file).
	KeyServers *KeyServersFile `yaml:"keyservers"`

	// Tunnel is this node's end of the tunnel from the L4 distributors: GRE or IPIP
	// from them in, the clients' packets delivered to the listeners on the VIPs, the
	// replies sent back to the distributor each flow came from. Changing it takes a
	// restart. Default: none (the node is reached directly, or through a kernel tunnel
	// device; see deploy/tunnel.md).
	Tunnel *TunnelFile `yaml:"tunnel"`

	// AdminListen serves /metrics, /healthz, POST /reload and the blacklist API.
	// Default "127.0.0.1:9241"; "off" disables it. An address other hosts can reach
	// (anything but a loopback address or localhost) needs AdminTokenFile, or
	// AdminInsecure.
	AdminListen string `yaml:"admin_listen"`

	// AdminTokenFile holds the bearer token of the admin endpoint: with it, every
	// request but GET /healthz and GET /metrics must carry "Authorization: Bearer
	// <token>" or is answered 401. The token is the file's content less surrounding
	// white space, at least 16 bytes of visible ASCII (openssl rand -hex 32). It is
	// read at start and on reload. Default: none, no authentication.
	AdminTokenFile string `yaml:"admin_token_file"`

	// AdminInsecure lets AdminListen be an address other hosts reach with no
	// AdminTokenFile; without it l7d refuses that configuration. Whoever reaches the
	// admin endpoint can replace the blacklists (unblock an attacker, or block every
	// client) and reload the configuration; set it only when something else keeps
	// everyone else out (a management network, a firewall). Default false.
	AdminInsecure bool `yaml:"admin_insecure"`

	// AdminBlacklistUploads bounds what one upload to PUT /blacklists/{name} or POST
	// /blacklists/{name}/delta may make l7d read and hold, and uploads are read one
	// at a time: max_body_bytes, the body as sent, default 256 MiB; max_binary_bytes
	// and max_text_bytes, after gunzip, defaults 128 MiB and 512 MiB; max_entries,
	// default 16,777,216 (the defaults take 10M IPv4 entries in either format); and
	// wait, how long an upload waits for the one being read, default 5s. An upload
	// over a limit is answered 413, code too_large, naming the limit; one that waited
	// too long, 429, code busy. See blacklist.UploadLimits.
	AdminBlacklistUploads blacklist.UploadLimits `yaml:"admin_blacklist_uploads"`

	// StateDir keeps what is pushed to the blacklists through the admin endpoint
	// across restarts and reloads. Every accepted push or delta writes the list's
	// entries (expired ones left out) to <state_dir>/blacklist-<list>.bin in the
	// binary format, atomically and synced, before it is answered; a list with such
	// a file is loaded from it at start and on reload instead of from its files,
	// until DELETE /blacklists/<list>/state removes it. Created (0700) if missing;
	// one l7d per directory. Changing it takes a restart. Default: none, pushes live
	// in memory only and a restart loads the files again.
	StateDir string `yaml:"state_dir"`

	// MaxBodyMemory bounds, for all listeners together, the buffers request and
	// response bodies are copied through: bodies are streamed, never held whole, and
	// each HTTP/2 or HTTP/3 request with a body, or response being streamed to such a
	// client, holds 32 KiB of it while it is copied (HTTP/1.1 bodies use their
	// connection's buffers). A request that finds it spent is answered 503, counted in
	// tiergate_l7_body_memory_refused_total. Changing it takes a restart. Default
	// 256 MiB. See l7.Config.MaxBodyMemory.
	MaxBodyMemory int64 `yaml:"max_body_memory"`

	// ShutdownGrace is how long in-flight requests may take on SIGTERM/SIGINT.
	// Default 10s.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`

	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`

	// GCPercent is the Go garbage collector's target (GOGC): the heap may grow this many
	// percent over live data before a collection. l7d's live heap is small and every
	// handshake allocates tens of KB inside crypto/tls, so the runtime's default of 100
	// collects every few dozen handshakes; 400 trades a few MB for ~10% less CPU per
	// handshake. A GOGC environment variable wins over this. Default 400.
	GCPercent int `yaml:"gc_percent"`

	// GOMAXPROCS is how many Ps (threads running Go code at once) l7d uses. 0, the
	// default, sizes them to the load (internal/autoprocs): one P at light load, up to
	// the CPUs the process may use as they fill, because every idle P costs the Go
	// scheduler wakeups and spinning that, at moderate load, cost more CPU per request
	// than l7d's own code. N > 0 fixes N; -1 leaves the runtime's own setting. A
	// GOMAXPROCS environment variable wins over this.
	GOMAXPROCS int `yaml:"gomaxprocs"`
}

// ListenerFile is one listener: its settings (l7.Listener: name, address, pool,
// HTTP/3, QUIC server ID, timeouts and limits, each with its default), and where its
// clients' addresses may come from. In this file the name defaults to "listener<N>"
// and the address is required.
type ListenerFile struct {
	l7.Listener `yaml:",inline"`

	// ClientIP says where the client address may come from: PROXY protocol headers
	// from trusted load balancers, and X-Forwarded-For (or a single-value header)
	// from trusted proxies. Default: the packet's source, headers ignored.
	ClientIP clientip.Config `yaml:"client_ip" json:"client_ip"`
}

// TunnelFile configures the tunnel endpoint (package l7/tunnel). It needs
// CAP_NET_ADMIN and CAP_NET_RAW.
type TunnelFile struct {
	// Device is the TUN device created for the VIPs. Default tg0.
	Device string `yaml:"device"`
	// VIPs are the addresses this node serves, assigned to the device; listeners
	// bind to them (or to 0.0.0.0 / ::). Required.
	VIPs []string `yaml:"vips"`
	// LDs are the distributors' tunnel addresses, each exactly; packets from
	// anywhere else are dropped (unknown_ld). Required unless LDRanges.
	LDs []string `yaml:"lds"`
	// LDRanges are CIDR prefixes whose every address is taken as a distributor's,
	// only as safe as the L7 network's filtering of spoofed sources
	// (deploy/tunnel.md). Default none.
	LDRanges []string `yaml:"ld_ranges"`
	// Key is the GRE key the distributors send (l4d's tunnel.key, the same number):
	// packets without it, with another or over IPIP are dropped (bad_key), and
	// replies carry it. Default 0: none.
	Key uint32 `yaml:"key"`
	// Local is this node's tunnel address: packets to other addresses are not taken
	// and replies leave from it. Default: any address, source chosen by route.
	Local string `yaml:"local"`
	// FlowIdle is how long a flow's return path is remembered after its last
	// packet; longer than the distributors' established timeout. Default 10m.
	FlowIdle time.Duration `yaml:"flow_idle"`
	// OneWayIdle is how long a flow that has had no reply yet is remembered after
	// its last packet; such flows are the first evicted from a full table.
	// Default 30s.
	OneWayIdle time.Duration `yaml:"one_way_idle"`
	// MoveIdle is how long a flow must have been quiet on its distributor before a
	// packet of it from another moves its replies there; -1s: never. Default 10s.
	MoveIdle time.Duration `yaml:"move_idle"`
	// MaxFlows bounds the flows remembered (about 150 bytes each). Default 1048576.
	MaxFlows int `yaml:"max_flows"`
	// MTU of the device, which sizes the replies: path MTU to the distributors less
	// 24 (IPv4) or 44 (IPv6), 4 more with a key. Default 1476, or 1456 with an IPv6
	// distributor; 1472 and 1452 with a key.
	MTU int `yaml:"mtu"`
	// Table is the policy routing table that sends replies from the VIPs into the
	// device. Default 4242.
	Table int `yaml:"table"`
}

// config converts t to the endpoint's configuration, checking every field.
func (t *TunnelFile) config() (tunnel.Config, error) {
	c := tunnel.Config{Device: t.Device, Key: t.Key, FlowIdle: t.FlowIdle, OneWayIdle: t.OneWayIdle,
		MoveIdle: t.MoveIdle, MaxFlows: t.MaxFlows, MTU: t.MTU, Table: t.Table}
	for i, s := range t.VIPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return c, fmt.Errorf("tunnel.vips[%d]: %w", i, err)
		}
		c.VIPs = append(c.VIPs, a)
	}
	for i, s := range t.LDs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			if _, perr := netip.ParsePrefix(s); perr == nil {
				return c, fmt.Errorf("tunnel.lds[%d]: %q is a range: lds takes addresses, ranges go in ld_ranges", i, s)
			}
			return c, fmt.Errorf("tunnel.lds[%d]: %w", i, err)
		}
		c.LDs = append(c.LDs, a)
	}
	for i, s := range t.LDRanges {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return c, fmt.Errorf("tunnel.ld_ranges[%d]: %w", i, err)
		}
		c.LDRanges = append(c.LDRanges, p)
	}
	if t.Local != "" {
		a, err := netip.ParseAddr(t.Local)
		if err != nil {
			return c, fmt.Errorf("tunnel.local: %w", err)
		}
		c.Local = a
	}
	if err := c.Validate(); err != nil {
		return c, err // says "tunnel: ..."
	}
	return c, nil
}

// KeyServersFile configures the keyserver client.
type KeyServersFile struct {
	// Servers are "host:port" of keyserverd. Required.
	Servers []string `yaml:"servers"`
	// CertFile and KeyFile are this node's client certificate. Required.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// CAFile verifies the keyservers. Required.
	CAFile string `yaml:"ca_file"`
	// ServerName overrides the name verified in keyserver certificates. Default: the
	// host of each server address.
	ServerName string `yaml:"server_name"`
	// ConnsPerServer, RequestTimeout and Timeout: see keyserver/client.Config.
	// Defaults 2, 1s, 3s.
	ConnsPerServer int           `yaml:"conns_per_server"`
	RequestTimeout time.Duration `yaml:"request_timeout"`
	Timeout        time.Duration `yaml:"timeout"`
}

// DefaultGCPercent is l7d's garbage collector target unless configured or GOGC is set.
const DefaultGCPercent = 400

// DefaultAdminListen is where the admin endpoint (/metrics, /healthz, /reload and the
// blacklist API) listens by default.
const DefaultAdminListen = "127.0.0.1:9241"

// LoadConfig reads and checks a configuration file. Unknown fields are errors.
func LoadConfig(path string) (*FileConfig, error) {
	return daemon.ReadConfig(path, (*FileConfig).validate)
}

// ParseConfig decodes and validates a configuration; name is used in errors.
func ParseConfig(data []byte, name string) (*FileConfig, error) {
	return daemon.ParseConfig(data, name, (*FileConfig).validate)
}

func (c *FileConfig) validate() error {
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.GCPercent == 0 {
		c.GCPercent = DefaultGCPercent
	}
	var ck config.Checker
	if c.MaxBodyMemory < 0 {
		ck.Addf("max_body_memory", "%d: limits must not be negative", c.MaxBodyMemory)
	}
	if c.GCPercent < -1 {
		ck.Addf("gc_percent", "%d: want -1 (off) or a positive percentage", c.GCPercent)
	}
	if c.GOMAXPROCS < -1 {
		ck.Addf("gomaxprocs", "%d: want 0 (sized to the load), -1 (the runtime's own) or a number of Ps", c.GOMAXPROCS)
	}
	if _, err := daemon.LogLevel(c.LogLevel); err != nil {
		ck.Addf("log_level", "%q: want debug, info, warn or error", c.LogLevel)
	}
	ck.Nest("admin_blacklist_uploads", c.AdminBlacklistUploads.Validate())
	c.AdminBlacklistUploads.Defaults()
	if c.AdminListen != "off" && c.AdminTokenFile == "" && !c.AdminInsecure && !daemon.IsLoopbackListen(c.AdminListen) {
		ck.Addf("admin_listen", "%q: other hosts can reach it and the admin API would serve them unauthenticated: "+
			"set admin_token_file (or admin_insecure: true when the network keeps them out)", c.AdminListen)
	}
	if len(c.Listeners) == 0 {
		ck.Addf("listeners", "at least one is required")
	}
	switch {
	case c.Routing != nil && len(c.Backends) > 0:
		ck.Addf("backends", "the simple form of routing; give routing or backends, not both")
	case c.Routing == nil && len(c.Backends) == 0:
		ck.Addf("backends", "at least one pool is required (or routing)")
	}
	for _, name := range slices.Sorted(maps.Keys(c.Backends)) {
		p := c.Backends[name]
		ck.Nest(config.At("backends", name), p.Validate())
		p.Defaults()
		c.Backends[name] = p
	}
	seen := map[string]bool{}
	for i := range c.Listeners {
		l := &c.Listeners[i]
		path := config.Index("listeners", i)
		if l.Name == "" {
			l.Name = fmt.Sprintf("listener%d", i)
		}
		if seen[l.Name] {
			ck.Addf(config.At(path, "name"), "%q used twice", l.Name)
		}
		seen[l.Name] = true
		if c.StateDir != "" && strings.ContainsAny(l.Name, "/\x00") {
			ck.Addf(config.At(path, "name"), "%q names its blacklist's file in state_dir: no '/'", l.Name)
		}
		if l.Addr == "" {
			ck.Addf(config.At(path, "addr"), "required")
		}
		ck.Nest(path, l.Listener.Validate())
		l.Listener.Defaults()
		if c.Routing != nil {
			if l.Pool != "" {
				ck.Addf(config.At(path, "pool"), "routing says where requests go; remove pool")
			}
		} else if _, ok := c.Backends[l.Pool]; !ok && len(c.Backends) > 0 {
			ck.Addf(config.At(path, "pool"), "no backend pool %q", l.Pool)
		}
		if _, err := clientip.New(l.ClientIP); err != nil {
			ck.Nest(config.At(path, "client_ip"), err)
		}
	}
	if c.Routing != nil {
		ck.Nest("routing", c.Routing.Validate())
		for i, rl := range c.Routing.Listeners {
			if !seen[rl.Name] {
				ck.Addf(config.At(config.Index("routing.listeners", i), "name"), "no listener %q", rl.Name)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Blacklists)) {
		b := c.Blacklists[name]
		if name != blacklist.GlobalName && !seen[name] {
			ck.Addf(config.At("blacklists", name), "a list is %q or a listener's name", blacklist.GlobalName)
		}
		ck.Nest(config.At("blacklists", name), b.Validate())
	}
	if len(c.Certificates.Certificates) == 0 && c.Certificates.Dir == "" {
		ck.Addf("certificates", "give certificates or dir")
	}
	var tunnelErr error // names its fields itself
	if c.Tunnel != nil {
		_, tunnelErr = c.Tunnel.config()
	}
	if ks := c.KeyServers; ks != nil {
		if len(ks.Servers) == 0 || ks.CertFile == "" || ks.KeyFile == "" || ks.CAFile == "" {
			ck.Addf("keyservers", "servers, cert_file, key_file and ca_file are required")
		}
	}
	return errors.Join(ck.Err(), tunnelErr)
}

// keyserverTLS loads the client certificate and the keyservers' CA.
func (ks *KeyServersFile) keyserverTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(ks.CertFile, ks.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("keyservers: client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(ks.CAFile)
	if err != nil {
		return nil, fmt.Errorf("keyservers: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("keyservers: %s holds no PEM certificate", ks.CAFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: ks.ServerName}, nil
}
