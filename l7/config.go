package l7

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	lsn "github.com/tiergate/tiergate/l7/listener"
	"github.com/tiergate/tiergate/policy/route"
)

// Config configures a Server. The zero value of every optional field means its
// documented default; at least one listener is required, and either Routing or, for
// every listener, a Pool among Backends.
type Config struct {
	// Listeners are the addresses the server terminates TLS and QUIC on. Names must be
	// unique. Required.
	Listeners []ListenerConfig

	// Routing is the routing policy (see package route): for each listener, virtual
	// hosts and ordered routes that proxy to a pool, redirect or answer; and the pools,
	// with their balancing, health checks and passive ejection. Listeners it does not
	// name answer every request 404. With Routing, Backends and every listener's Pool
	// must be empty.
	//
	// Default: the simple form, made from Backends and each listener's Pool: one "*"
	// virtual host per listener with one route that takes every request to the
	// listener's Pool, named after the pool, with the pool's Timeout and as many
	// retries as the pool has other members (connection failures only, idempotent
	// methods only).
	Routing *route.Config

	// Backends are the named backend pools of the simple form (no Routing). Every
	// listener's Pool must be here. Default none.
	Backends map[string]PoolConfig

	// Decider takes the one per-request decision (client IP, direct answer, pool)
	// that client-IP rules and blacklists plug into; it runs before routing. Default:
	// every request is routed, and the client IP is ConnInfo.Remote.
	Decider Decider

	// AcceptFilter, when set, is asked about every connection before any TLS work:
	// each TCP connection as it is accepted (after its PROXY header, when the
	// listener's WrapListener reads one, so remote is the address the header names),
	// and each QUIC connection at its first packet. When it returns false the
	// connection is closed (TCP, with a reset) or refused (QUIC) at once and counted
	// in tiergate_l7_connections_rejected_total{reason="filtered"}. It is called from
	// the accept loop: it must be fast and must not block. Default: all accepted.
	AcceptFilter func(listener string, remote netip.AddrPort) bool

	// IsNoCertificate tells which errors of a TLS config's GetCertificate mean "no
	// certificate for this name" (the certs package's ErrNoCertificate), counted as
	// result="no_certificate"; other errors count as "other". Keyserver errors are
	// recognised without it. Default: every GetCertificate error that is not a
	// keyserver error means no certificate.
	IsNoCertificate func(error) bool

	// MaxBodyMemory bounds the memory of the buffers request and response bodies are
	// copied through, for the whole server. Bodies are streamed, never held whole:
	// each HTTP/2 or HTTP/3 request with a body, and each response streamed to an
	// HTTP/2 or HTTP/3 client, holds one 32 KiB buffer from this budget while it is
	// copied (HTTP/1.1 bodies pass through each connection's own buffers, which
	// MaxConns bounds). A request that finds it spent is answered 503 and counted in
	// tiergate_l7_body_memory_refused_total; tiergate_l7_body_memory_bytes shows what
	// is in use. Changing it takes a restart. Default 256 MiB.
	MaxBodyMemory int64

	// Registerer receives the server's metrics. Default: none registered.
	Registerer prometheus.Registerer

	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger
}

// ListenerConfig is one listener as a program hands it to NewServer: its settings
// (Listener, the model a configuration file or the control plane holds), and what only
// a program can give, a TLS configuration and a listener wrapper.
type ListenerConfig struct {
	Listener

	// TLS is the base TLS configuration: a certificate (GetCertificate or
	// Certificates) and session ticket keys. It is cloned once per protocol and its
	// NextProtos replaced; MinVersion is raised to TLS 1.2 (TLS 1.3 over QUIC). It is
	// read again on Reload, so a new certificate set takes effect for new handshakes.
	// Required.
	TLS *tls.Config

	// WrapListener, when set, wraps the listener's TCP socket once, at Start, before
	// any connection is accepted; TLS runs over the connections the wrapper returns.
	// It is how a PROXY protocol reader (clientip.NewListenerWithOptions) goes in
	// front of TLS: ConnInfo.Remote is then the RemoteAddr of its connections, and
	// ConnInfo.Source what clientip.ConnPeer tells. The wrapper owns the socket: its
	// Close must close it. Reload does not look at this field. Default none.
	WrapListener func(net.Listener) (net.Listener, error)
}

// Listener is the settings of one address served over TCP (TLS 1.2 and 1.3, HTTP/1.1
// and HTTP/2 by ALPN) and, on the same port, UDP (QUIC v1, HTTP/3): listener.Listener,
// the model l7d's file and the control plane hold. Only Pool may change on Reload; the
// others take a restart.
type Listener = lsn.Listener

// PoolConfig is a backend pool of the simple form of routing: HTTP/1.1 servers that
// receive requests in turn, over kept-alive connections. The zero value of every
// optional field means the default its comment gives; Defaults fills them in.
type PoolConfig struct {
	// Members are the backends as "host:port". Required.
	Members []string `yaml:"members" json:"members"`

	// ConnsPerMember bounds the connections open to each member; a request that finds
	// them all busy waits for one within Timeout, then gets 503. Default 512.
	ConnsPerMember int `yaml:"conns_per_member,omitempty" json:"conns_per_member,omitempty"`

	// Timeout bounds one request to the pool, from the first connection attempt to
	// the whole response; beyond it the answer is 504, or, once the response's
	// headers are passed on, its body is cut (responses are streamed to the client
	// as they arrive, so a slow client's download counts here too). Default 30s.
	Timeout config.Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`

	// ConnectTimeout bounds connecting to one member; a member that cannot be reached
	// is skipped for the next one, and when none can, the answer is 502. Default 3s.
	ConnectTimeout config.Duration `yaml:"connect_timeout,omitempty" json:"connect_timeout,omitempty"`
}

// Defaults of Listener and PoolConfig.
const (
	DefaultAddr                   = lsn.DefaultAddr
	DefaultDeferAccept            = lsn.DefaultDeferAccept
	DefaultHandshakeTimeout       = lsn.DefaultHandshakeTimeout
	DefaultReadHeaderTimeout      = lsn.DefaultReadHeaderTimeout
	DefaultReadTimeout            = lsn.DefaultReadTimeout
	DefaultIdleTimeout            = lsn.DefaultIdleTimeout
	DefaultWriteTimeout           = lsn.DefaultWriteTimeout
	DefaultMaxHeaderBytes         = lsn.DefaultMaxHeaderBytes
	DefaultMaxConns               = lsn.DefaultMaxConns
	DefaultMaxHandshakes          = lsn.DefaultMaxHandshakes
	DefaultMaxHandshakesPerSource = lsn.DefaultMaxHandshakesPerSource
	DefaultQUICRetryAbove         = lsn.DefaultQUICRetryAbove
	DefaultMaxConcurrentStreams   = lsn.DefaultMaxConcurrentStreams
	DefaultMaxRequestBody         = lsn.DefaultMaxRequestBody

	DefaultMaxBodyMemory = 256 << 20

	DefaultConnsPerMember = 512
	DefaultPoolTimeout    = config.Duration(30 * time.Second)
	DefaultConnectTimeout = config.Duration(3 * time.Second)
)

func (c *Config) validate() error {
	var ck config.Checker
	if len(c.Listeners) == 0 {
		ck.Addf("listeners", "at least one listener is required")
	}
	names := map[string]bool{}
	for i := range c.Listeners {
		l := &c.Listeners[i]
		path := config.Index("listeners", i)
		switch {
		case l.Name == "":
			ck.Addf(config.At(path, "name"), "name is empty")
		case names[l.Name]:
			ck.Addf(config.At(path, "name"), "%q: name used twice", l.Name)
		}
		names[l.Name] = true
		ck.Nest(path, l.Listener.Validate())
		if l.TLS == nil || (len(l.TLS.Certificates) == 0 && l.TLS.GetCertificate == nil && l.TLS.GetConfigForClient == nil) {
			ck.Addf(config.At(path, "tls"), "TLS with a certificate (Certificates, GetCertificate or GetConfigForClient) is required")
		}
		switch {
		case c.Routing != nil && l.Pool != "":
			ck.Addf(config.At(path, "pool"), "pool %q is set with routing, which says where requests go", l.Pool)
		case c.Routing != nil:
		case l.Pool == "":
			ck.Addf(config.At(path, "pool"), "pool is empty")
		default:
			if _, ok := c.Backends[l.Pool]; !ok {
				ck.Addf(config.At(path, "pool"), "pool %q is not among the backends", l.Pool)
			}
		}
	}
	if c.Routing != nil {
		if len(c.Backends) > 0 {
			ck.Addf("backends", "the simple form of routing: give routing or backends, not both")
		}
		ck.Nest("routing", c.Routing.Validate())
		for i, rl := range c.Routing.Listeners {
			if !names[rl.Name] {
				ck.Addf(config.At(config.Index("routing.listeners", i), "name"), "%q is not a listener", rl.Name)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Backends)) {
		if name == "" {
			ck.Addf("backends", "a backend pool has an empty name")
			continue
		}
		p := c.Backends[name]
		ck.Nest(config.At("backends", name), p.Validate())
	}
	if c.MaxBodyMemory < 0 {
		ck.Addf("max_body_memory", "%d: limits must not be negative", c.MaxBodyMemory)
	}
	if err := ck.Err(); err != nil {
		return fmt.Errorf("l7: %w", err)
	}
	return nil
}

// Validate checks p and returns every problem, each a *config.FieldError named by its
// path within p ("members[0]").
func (p *PoolConfig) Validate() error {
	var ck config.Checker
	if len(p.Members) == 0 {
		ck.Addf("members", "no members: at least one is required")
	}
	for i, m := range p.Members {
		host, port, err := net.SplitHostPort(m)
		if err != nil {
			ck.Addf(config.Index("members", i), "member %q: %w", m, err)
			continue
		}
		if n, err := strconv.ParseUint(port, 10, 16); host == "" || err != nil || n == 0 {
			ck.Addf(config.Index("members", i), "member %q: want host:port with a port from 1 to 65535", m)
		}
	}
	if p.ConnsPerMember < 0 {
		ck.Addf("conns_per_member", "%d: limits must not be negative", p.ConnsPerMember)
	}
	if p.Timeout < 0 {
		ck.Addf("timeout", "%v: limits must not be negative", p.Timeout)
	}
	if p.ConnectTimeout < 0 {
		ck.Addf("connect_timeout", "%v: limits must not be negative", p.ConnectTimeout)
	}
	return ck.Err()
}

func (c *Config) populate() {
	for i := range c.Listeners {
		c.Listeners[i].Defaults()
	}
	pools := make(map[string]PoolConfig, len(c.Backends))
	for name, p := range c.Backends {
		p.Members = append([]string(nil), p.Members...)
		p.Defaults()
		pools[name] = p
	}
	c.Backends = pools
	setDefault(&c.MaxBodyMemory, DefaultMaxBodyMemory)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Defaults fills in the default of every optional field left zero.
func (p *PoolConfig) Defaults() {
	setDefault(&p.ConnsPerMember, DefaultConnsPerMember)
	setDefault(&p.Timeout, DefaultPoolTimeout)
	setDefault(&p.ConnectTimeout, DefaultConnectTimeout)
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// simpleRouting makes the routing policy of the simple form from a populated
// Config: one pool per backend pool, and per listener one "*" virtual host whose
// one route, named after the listener's pool, takes every request there. A member
// listed twice in a pool gets twice the weight.
func simpleRouting(c *Config) *route.Config {
	rc := &route.Config{}
	names := make([]string, 0, len(c.Backends))
	for name := range c.Backends {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		pc := c.Backends[name]
		p := route.Pool{
			Name:              name,
			ConnectTimeout:    route.Duration(pc.ConnectTimeout),
			MaxConnsPerMember: pc.ConnsPerMember,
		}
		at := map[string]int{}
		for _, addr := range pc.Members {
			if i, ok := at[addr]; ok {
				p.Members[i].Weight++
				continue
			}
			at[addr] = len(p.Members)
			p.Members = append(p.Members, route.PoolMember{Addr: addr, Weight: 1})
		}
		rc.Pools = append(rc.Pools, p)
	}
	for _, l := range c.Listeners {
		pc := c.Backends[l.Pool]
		members := 0
		for _, p := range rc.Pools {
			if p.Name == l.Pool {
				members = len(p.Members)
			}
		}
		rc.Listeners = append(rc.Listeners, route.Listener{
			Name: l.Name,
			VHosts: []route.VHost{{
				Names: []string{"*"},
				Routes: []route.Route{{
					Name:    l.Pool,
					Action:  route.Action{Pool: l.Pool},
					Timeout: route.Duration(pc.Timeout),
					Retries: simpleRetries(members),
				}},
			}},
		})
	}
	return rc
}

// simpleRetries is how many other members a request of the simple form is tried on
// after a connection failure: all of them, within route's bound.
func simpleRetries(members int) int { return min(max(members-1, 0), maxRouteRetries) }

// maxRouteRetries is the most retries a route may have.
const maxRouteRetries = 10

// reloadable lists the Listener fields Reload may change; the others are bound to
// sockets and protocol servers made at Start. Of ListenerConfig's own fields, TLS is
// reloaded and WrapListener ignored (functions cannot be compared).
var reloadable = map[string]bool{"Pool": true}

// ErrRestartRequired is wrapped by the errors of a Reload refused because it changes
// what only a restart applies (the listeners, their addresses, timeouts and limits).
var ErrRestartRequired = errors.New("it takes a restart")

// checkReload returns an error naming the first listener setting of next that differs
// from cur and cannot change without a restart. Both are populated.
func checkReload(cur, next []ListenerConfig) error {
	if len(cur) != len(next) {
		return fmt.Errorf("l7: reload: %d listeners instead of %d; adding or removing listeners: %w", len(next), len(cur), ErrRestartRequired)
	}
	for i := range cur {
		if cur[i].Name != next[i].Name {
			return fmt.Errorf("l7: reload: listener %d is %q, was %q; renaming or reordering listeners: %w", i, next[i].Name, cur[i].Name, ErrRestartRequired)
		}
		a, b := reflect.ValueOf(cur[i].Listener), reflect.ValueOf(next[i].Listener)
		for f := 0; f < a.NumField(); f++ {
			field := a.Type().Field(f)
			if reloadable[field.Name] {
				continue
			}
			if !a.Field(f).Equal(b.Field(f)) {
				name, _, _ := strings.Cut(field.Tag.Get("yaml"), ",")
				return fmt.Errorf("l7: reload: listeners[%d].%s (listener %q) changed (%v → %v); %w",
					i, name, cur[i].Name, a.Field(f), b.Field(f), ErrRestartRequired)
			}
		}
	}
	return nil
}
