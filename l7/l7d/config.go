// Package l7d is the l7d command as a library: its YAML configuration, its run loop
// with reload on SIGHUP and on the admin endpoint, and graceful shutdown, so tests drive
// it in-process and cmd/l7d stays a one-line main. With a control section in its file,
// l7d takes its listeners, routing and certificates from the control plane's store
// through the node agent (controlmode.go; deploy/l7d-control.yaml).
package l7d

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/certs"
	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/l7/tunnel"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/clientip"
	"github.com/tiergate/tiergate/policy/route"
)

// FileConfig is l7d's configuration file, with the same names in YAML and JSON: the
// components' models (l7.Listener, clientip.Config, route.Config, l7.PoolConfig,
// blacklist.ListConfig, certs.Config, keyserver/client.Config, tunnel.Config) and what
// is the daemon's own (files, the admin endpoint, process settings). Every field may
// be left out unless marked required; its default is given beside it. Validation
// names a bad field by its path from the top ("listeners[0].client_ip.proxy_timeout",
// "tunnel.one_way_idle"). deploy/l7d.yaml is a full example.
type FileConfig struct {
	// Control, when set, has l7d take its listeners, routing, pools, certificates and
	// certificate bindings from the control plane's store (package control/agent):
	// this node's name there, the store's etcd endpoints and credentials, and the
	// cache file of the last configuration applied (default
	// <state_dir>/control-snapshot.json, or control-snapshot.json in
	// /var/lib/tiergate/l7d without a state_dir). The file then keeps only what is
	// the node's own (keyservers, which are required, tunnel, admin endpoint,
	// state_dir, blacklists, ticket key files, process settings, node_listeners)
	// and must not give listeners, routing, backends or certificates (their files,
	// dir or default). See controlmode.go. Changing it takes a restart. Default none:
	// everything comes from this file.
	Control *agent.NodeConfig `yaml:"control" json:"control,omitempty"`

	// NodeListeners are this node's own settings of the listeners the control plane
	// gives, by listener name (only with control): the address it binds, its QUIC
	// server ID and where its clients' addresses come from. A name the control
	// plane does not have is ignored. Default: the listener as the control plane
	// gives it, with random QUIC connection IDs and the packet's source as client
	// address.
	NodeListeners map[string]NodeListener `yaml:"node_listeners" json:"node_listeners,omitempty"`

	// Listeners terminate TLS (TCP) and QUIC (UDP) on the same address. Required
	// without control, refused with it.
	Listeners []ListenerFile `yaml:"listeners" json:"listeners"`

	// Routing is the routing policy (package policy/route): per listener, virtual
	// hosts and ordered routes that proxy to pools, redirect or answer; the pools
	// with their members, weights, balancing, health checks and passive ejection.
	// Default: the simple form, Backends and each listener's pool. Excludes both.
	Routing *route.Config `yaml:"routing" json:"routing,omitempty"`

	// Backends are named pools of HTTP/1.1 servers that listeners proxy to, the
	// simple form of Routing: each listener sends every request to its pool.
	// Required without routing, refused with it.
	Backends map[string]l7.PoolConfig `yaml:"backends" json:"backends,omitempty"`

	// Blacklists are the IP blacklists loaded from files, by list name: "global"
	// (every listener) or a listener's name (that listener only). Lists may also be
	// pushed at runtime through the admin endpoint, whether they are named here or
	// not. Default none.
	Blacklists map[string]blacklist.ListConfig `yaml:"blacklists" json:"blacklists,omitempty"`

	// Certificates: files or a directory, the default name, and the ticket keys shared
	// by the cluster. Required (at least one certificate) without control; with it,
	// only ticket_key_files and ticket_key_max_age may be given.
	Certificates certs.Config `yaml:"certificates" json:"certificates"`

	// KeyServers is where remote private keys live. Default: none (every certificate
	// needs a local key_file).
	KeyServers *KeyServersFile `yaml:"keyservers" json:"keyservers,omitempty"`

	// Tunnel is this node's end of the tunnel from the L4 distributors (package
	// l7/tunnel, whose Config gives each field and its default: device, vips, lds,
	// ld_ranges, key, local, flow_idle, one_way_idle, move_idle, ld_dead_after,
	// max_flows, mtu, table): GRE or IPIP from them in, the clients' packets delivered to the
	// listeners on the VIPs, the replies sent back to the distributor each flow came
	// from. It needs CAP_NET_ADMIN and CAP_NET_RAW. Changing it takes a restart.
	// Default: none (the node is reached directly, or through a kernel tunnel device;
	// see deploy/tunnel.md).
	Tunnel *tunnel.Config `yaml:"tunnel" json:"tunnel,omitempty"`

	// AdminListen serves /metrics, /healthz, POST /reload and the blacklist API.
	// Changing it takes a restart. Default "127.0.0.1:9241"; "off" disables it.
	AdminListen string `yaml:"admin_listen" json:"admin_listen,omitempty"`

	// AdminTokenFile holds the bearer token of the admin endpoint: every request but
	// GET /healthz and GET /metrics must carry "Authorization: Bearer <token>" or is
	// answered 401. The token is the file's content less surrounding white space, at
	// least 16 bytes of visible ASCII (openssl rand -hex 32); the file must exist. It
	// is read at start and on reload. Default: the token in admin.token of the state
	// directory (StateDir, or /var/lib/tiergate/l7d without one), generated there
	// (mode 0600) at the first start; the log names the file.
	AdminTokenFile string `yaml:"admin_token_file" json:"admin_token_file,omitempty"`

	// AdminInsecure serves the admin endpoint with no token when AdminTokenFile is
	// not set. Whoever reaches the admin endpoint can replace the blacklists (unblock
	// an attacker, or block every client) and reload the configuration; set it only
	// where nothing else runs on the host and something else keeps everyone else out
	// (a management network, a firewall). Changing it takes a restart. Default false:
	// a token is required.
	AdminInsecure bool `yaml:"admin_insecure" json:"admin_insecure,omitempty"`

	// AdminHosts lists the host names (or addresses) by which the admin endpoint is
	// reached, besides a loopback address, "localhost" and the address it listens
	// on: a request whose Host header names anything else is refused (421), which
	// keeps web pages out by DNS rebinding. Changes on reload. Default none.
	AdminHosts []string `yaml:"admin_hosts" json:"admin_hosts,omitempty"`

	// AdminBlacklistUploads bounds what one upload to PUT /blacklists/{name} or POST
	// /blacklists/{name}/delta may make l7d read and hold, and uploads are read one
	// at a time: max_body_bytes, the body as sent, default 256 MiB; max_binary_bytes
	// and max_text_bytes, after gunzip, defaults 128 MiB and 512 MiB; max_entries,
	// default 16,777,216 (the defaults take 10M IPv4 entries in either format); and
	// wait, how long an upload waits for the one being read, default 5s. An upload
	// over a limit is answered 413, code too_large, naming the limit; one that waited
	// too long, 429, code busy. See blacklist.UploadLimits.
	AdminBlacklistUploads blacklist.UploadLimits `yaml:"admin_blacklist_uploads" json:"admin_blacklist_uploads,omitzero"`

	// StateDir keeps what is pushed to the blacklists through the admin endpoint
	// across restarts and reloads. Every accepted push or delta writes the list's
	// entries (expired ones left out) to <state_dir>/blacklist-<list>.bin in the
	// binary format, atomically and synced, before it is answered; a list with such
	// a file is loaded from it at start and on reload instead of from its files,
	// until DELETE /blacklists/<list>/state removes it. The admin token l7d generates
	// (without AdminTokenFile) is kept there too, as admin.token. Created (0700) if
	// missing; one l7d per directory. Changing it takes a restart. Default: none,
	// pushes live in memory only and a restart loads the files again; the generated
	// admin token is kept in /var/lib/tiergate/l7d (DefaultTokenDir).
	StateDir string `yaml:"state_dir" json:"state_dir,omitempty"`

	// MaxBodyMemory bounds, for all listeners together, the buffers request and
	// response bodies are copied through: bodies are streamed, never held whole, and
	// each HTTP/2 or HTTP/3 request with a body, or response being streamed to such a
	// client, holds 32 KiB of it while it is copied (HTTP/1.1 bodies use their
	// connection's buffers). A request that finds it spent is answered 503, counted in
	// tiergate_l7_body_memory_refused_total. Changing it takes a restart. Default
	// 256 MiB. See l7.Config.MaxBodyMemory.
	MaxBodyMemory int64 `yaml:"max_body_memory" json:"max_body_memory,omitempty"`

	// ShutdownGrace is how long in-flight requests may take on SIGTERM/SIGINT, after
	// LameDuck, before connections are closed. Default 10s.
	ShutdownGrace config.Duration `yaml:"shutdown_grace" json:"shutdown_grace,omitempty"`

	// LameDuck is how long l7d goes on serving after SIGTERM or SIGINT with /healthz
	// answering 503 "shutting down", so that load balancers and health checkers take
	// it out of rotation before it stops accepting; then ShutdownGrace runs. A reload
	// changes it. Default 0: stop accepting at once.
	LameDuck config.Duration `yaml:"lame_duck" json:"lame_duck,omitempty"`

	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level" json:"log_level,omitempty"`

	// GCPercent is the Go garbage collector's target (GOGC): the heap may grow this many
	// percent over live data before a collection. l7d's live heap is small and every
	// handshake allocates tens of KB inside crypto/tls, so the runtime's default of 100
	// collects every few dozen handshakes; 400 trades a few MB for ~10% less CPU per
	// handshake. A GOGC environment variable wins over this. Default 400. When the
	// connections fall far below their number at the last collection, l7d collects
	// at once, so the goal follows the load down (internal/gcgoal).
	GCPercent int `yaml:"gc_percent" json:"gc_percent,omitempty"`

	// GOMAXPROCS is how many Ps (threads running Go code at once) l7d uses. 0, the
	// default, sizes them to the load (internal/autoprocs): one P at light load, up to
	// the CPUs the process may use as they fill, because every idle P costs the Go
	// scheduler wakeups and spinning that, at moderate load, cost more CPU per request
	// than l7d's own code. N > 0 fixes N; -1 leaves the runtime's own setting. A
	// GOMAXPROCS environment variable wins over this.
	GOMAXPROCS int `yaml:"gomaxprocs" json:"gomaxprocs,omitempty"`

	// mem, with control, is the certificates of the snapshot in force and their
	// bindings (withSnapshot); nil for the file form. revision is the snapshot's.
	mem      *certs.MemConfig
	revision int64
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
	ClientIP clientip.Config `yaml:"client_ip" json:"client_ip,omitzero"`
}

// KeyServersFile is where remote private keys live: the keyserver client's settings
// (keyserver/client.Config: servers, required; server_name; conns_per_server,
// default 2; max_in_flight_per_conn, default 1024; request_timeout, 1s; timeout, 3s;
// dial_timeout, 2s; ping_interval, 5s; reconnect_min and reconnect_max, 100ms and
// 10s), and the files of this node's mutual TLS, which are l7d's own.
type KeyServersFile struct {
	client.Config `yaml:",inline"`

	// CertFile and KeyFile are this node's client certificate and its private key
	// (PEM). Required.
	CertFile string `yaml:"cert_file" json:"cert_file"`
	KeyFile  string `yaml:"key_file" json:"key_file"`

	// CAFile holds the CA certificates (PEM) that verify the keyservers. Required.
	CAFile string `yaml:"ca_file" json:"ca_file"`
}

// Validate checks ks and returns every problem, each a *config.FieldError named by
// its path within ks ("servers[0]", "cert_file").
func (ks *KeyServersFile) Validate() error {
	var ck config.Checker
	ck.Nest("", ks.Config.Validate())
	for _, f := range []struct{ path, v string }{{"cert_file", ks.CertFile}, {"key_file", ks.KeyFile}, {"ca_file", ks.CAFile}} {
		if f.v == "" {
			ck.Addf(f.path, "required")
		}
	}
	return ck.Err()
}

// DefaultShutdownGrace is how long in-flight requests may take on SIGTERM/SIGINT
// unless shutdown_grace says otherwise.
const DefaultShutdownGrace = config.Duration(10 * time.Second)

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
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.GCPercent == 0 {
		c.GCPercent = DefaultGCPercent
	}
	var ck config.Checker
	if c.ShutdownGrace < 0 {
		ck.Addf("shutdown_grace", "%v is negative", c.ShutdownGrace)
	}
	if c.LameDuck < 0 {
		ck.Addf("lame_duck", "%v is negative", c.LameDuck)
	}
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
	for i, h := range c.AdminHosts {
		if h == "" || strings.ContainsAny(h, "/ \t") {
			ck.Addf(config.Index("admin_hosts", i), "%q: want a host name or address", h)
		}
	}
	if c.Control != nil {
		c.validateControl(&ck)
		return ck.Err()
	}
	if len(c.NodeListeners) > 0 {
		ck.Addf("node_listeners", "only with control: a listener's own settings are under listeners")
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
		ck.Nest(config.At(path, "client_ip"), l.ClientIP.Validate())
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
	c.validateNode(&ck)
	return ck.Err()
}

// validateNode checks what is the node's own in both forms: ticket keys, tunnel,
// keyservers.
func (c *FileConfig) validateNode(ck *config.Checker) {
	if c.Certificates.TicketKeyMaxAge == 0 {
		c.Certificates.TicketKeyMaxAge = certs.DefaultTicketKeyMaxAge
	}
	if c.Certificates.TicketKeyMaxAge < 0 {
		ck.Addf("certificates.ticket_key_max_age", "%v is negative", c.Certificates.TicketKeyMaxAge)
	}
	if c.Tunnel != nil {
		ck.Nest("tunnel", c.Tunnel.Validate())
	}
	if c.KeyServers != nil {
		ck.Nest("keyservers", c.KeyServers.Validate())
	}
}

// keyserverTLS loads the client certificate and the keyservers' CA (the client
// applies server_name).
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
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}, nil
}
