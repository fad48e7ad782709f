package l7

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

	// Registerer receives the server's metrics. Default: none registered.
	Registerer prometheus.Registerer

	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger
}

// ListenerConfig is one address served over TCP (TLS 1.2 and 1.3, HTTP/1.1 and HTTP/2
// by ALPN) and, on the same port, UDP (QUIC v1, HTTP/3).
type ListenerConfig struct {
	// Name identifies the listener in metrics and logs. Required, unique.
	Name string

	// Addr is the "ip:port" to listen on, over TCP and, unless DisableHTTP3, UDP on the
	// same port. Port 0 picks a free port (the same for both). Default ":443".
	Addr string

	// TLS is the base TLS configuration: a certificate (GetCertificate or
	// Certificates) and session ticket keys. It is cloned once per protocol and its
	// NextProtos replaced; MinVersion is raised to TLS 1.2 (TLS 1.3 over QUIC). It is
	// read again on Reload, so a new certificate set takes effect for new handshakes.
	// Required.
	TLS *tls.Config

	// DisableHTTP3 turns the UDP side off: no QUIC listener and no Alt-Svc header.
	// Default false (HTTP/3 on).
	DisableHTTP3 bool

	// TCPKeepAlive is the idle time after which the kernel probes an accepted TCP
	// connection (TCP keepalive, with Go's default interval and count). Default 0:
	// off, as in nginx and haproxy: IdleTimeout already closes idle connections,
	// and turning keepalive on costs four setsockopt calls per accepted connection,
	// which is measurable on full handshakes.
	TCPKeepAlive time.Duration

	// DeferAccept is how long the kernel keeps a new TCP connection that has sent
	// nothing from accept (TCP_DEFER_ACCEPT, in whole seconds): a connection reaches
	// l7d with its ClientHello (or PROXY header) already there, so the first read
	// never waits, which saves a read and a wakeup per connection. A connection still
	// silent after it is accepted then, and HandshakeTimeout runs from there; the
	// client sees its connection open from the start either way. Default 0: one
	// second; negative turns it off.
	DeferAccept time.Duration

	// QUICServerID, when not 0, makes the QUIC side issue 8-byte connection IDs that
	// carry this server ID in clear (package l4/quiccid, QUIC-LB's plaintext format),
	// so L4 distributors send all of a connection's packets to this node by its
	// connection ID, even after the client's address changes. It must be unique among
	// the nodes behind the same distributors and equal this node's quic_id in their
	// pools. Default 0: quic-go's random connection IDs.
	QUICServerID uint16

	// Pool names the backend pool (a key of Config.Backends) that requests on this
	// listener go to, in the simple form. Required without Config.Routing, refused
	// with it.
	Pool string

	// WrapListener, when set, wraps the listener's TCP socket once, at Start, before
	// any connection is accepted; TLS runs over the connections the wrapper returns.
	// It is how a PROXY protocol reader (clientip.NewListenerWithOptions) goes in
	// front of TLS: ConnInfo.Remote is then the RemoteAddr of its connections, and
	// ConnInfo.Source what clientip.ConnPeer tells. The wrapper owns the socket: its
	// Close must close it. Reload does not look at this field. Default none.
	WrapListener func(net.Listener) (net.Listener, error)

	// HandshakeTimeout bounds the TLS handshake over TCP, and the QUIC handshake.
	// Default 10s.
	HandshakeTimeout time.Duration

	// ReadHeaderTimeout bounds reading a request's headers (HTTP/1.1, HTTP/2), and
	// on HTTP/1.1 the wait for the first request of a new connection. Default 10s.
	ReadHeaderTimeout time.Duration

	// ReadTimeout bounds reading a whole request, body included (HTTP/1.1, HTTP/2).
	// Default 60s.
	ReadTimeout time.Duration

	// IdleTimeout closes a connection with no request in progress for this long.
	// Default 60s.
	IdleTimeout time.Duration

	// WriteTimeout bounds writing a response to a client that stops reading: one
	// response on HTTP/1.1; on HTTP/2 the connection is closed when no byte could be
	// written for this long. HTTP/3 relies on QUIC's idle timeout. Default 30s.
	WriteTimeout time.Duration

	// MaxHeaderBytes bounds a request's header block; beyond it the answer is 431.
	// On HTTP/1.1 it is also the size of the connection's read buffer. Default 64 KiB.
	MaxHeaderBytes int

	// MaxConns bounds the connections open on this listener, TCP and QUIC together;
	// beyond it a new connection is closed at accept (refused, for QUIC) and counted
	// in tiergate_l7_connections_rejected_total. Default 10000.
	MaxConns int

	// MaxConcurrentStreams bounds the requests in flight on one HTTP/2 or HTTP/3
	// connection. Default 250.
	MaxConcurrentStreams int

	// MaxRequestBody bounds a request body; beyond it the answer is 413. Default 16 MiB.
	MaxRequestBody int
}

// PoolConfig is a backend pool: HTTP/1.1 servers that receive requests in turn, over
// kept-alive connections.
type PoolConfig struct {
	// Members are the backends as "host:port". Required.
	Members []string

	// ConnsPerMember bounds the connections open to each member; a request that finds
	// them all busy waits for one within Timeout, then gets 503. Default 512.
	ConnsPerMember int

	// Timeout bounds one request to the pool, from the first connection attempt to
	// the whole response; beyond it the answer is 504. Default 30s.
	Timeout time.Duration

	// ConnectTimeout bounds connecting to one member; a member that cannot be reached
	// is skipped for the next one, and when none can, the answer is 502. Default 3s.
	ConnectTimeout time.Duration
}

const (
	defaultAddr                 = ":443"
	defaultHandshakeTimeout     = 10 * time.Second
	defaultReadHeaderTimeout    = 10 * time.Second
	defaultReadTimeout          = 60 * time.Second
	defaultIdleTimeout          = 60 * time.Second
	defaultWriteTimeout         = 30 * time.Second
	defaultMaxHeaderBytes       = 64 << 10
	defaultMaxConns             = 10000
	defaultMaxConcurrentStreams = 250
	defaultMaxRequestBody       = 16 << 20

	defaultConnsPerMember = 512
	defaultPoolTimeout    = 30 * time.Second
	defaultConnectTimeout = 3 * time.Second
)

func (c *Config) validate() error {
	if len(c.Listeners) == 0 {
		return errors.New("l7: at least one listener is required")
	}
	names := map[string]bool{}
	for i := range c.Listeners {
		l := &c.Listeners[i]
		if l.Name == "" {
			return fmt.Errorf("l7: listener %d: name is empty", i)
		}
		if names[l.Name] {
			return fmt.Errorf("l7: listener %q: name used twice", l.Name)
		}
		names[l.Name] = true
		if err := l.validate(c.Backends, c.Routing != nil); err != nil {
			return fmt.Errorf("l7: listener %q: %w", l.Name, err)
		}
	}
	if c.Routing != nil {
		if len(c.Backends) > 0 {
			return errors.New("l7: Backends are the simple form of Routing: give one or the other")
		}
		if err := c.Routing.Validate(); err != nil {
			return fmt.Errorf("l7: routing: %w", err)
		}
		for i, rl := range c.Routing.Listeners {
			if !names[rl.Name] {
				return fmt.Errorf("l7: routing: listeners[%d].name: %q is not a listener", i, rl.Name)
			}
		}
		return nil
	}
	for name, p := range c.Backends {
		if name == "" {
			return errors.New("l7: a backend pool has an empty name")
		}
		if err := p.validate(); err != nil {
			return fmt.Errorf("l7: pool %q: %w", name, err)
		}
	}
	return nil
}

func (l *ListenerConfig) validate(pools map[string]PoolConfig, routing bool) error {
	if l.Addr != "" {
		_, port, err := net.SplitHostPort(l.Addr)
		if err != nil {
			return fmt.Errorf("address %q: %w", l.Addr, err)
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fmt.Errorf("address %q: port is not a number from 0 to 65535", l.Addr)
		}
	}
	if l.TLS == nil || (len(l.TLS.Certificates) == 0 && l.TLS.GetCertificate == nil && l.TLS.GetConfigForClient == nil) {
		return errors.New("TLS with a certificate (Certificates, GetCertificate or GetConfigForClient) is required")
	}
	switch {
	case routing && l.Pool != "":
		return fmt.Errorf("pool %q is set with Routing, which says where requests go", l.Pool)
	case routing:
	case l.Pool == "":
		return errors.New("pool is empty")
	default:
		if _, ok := pools[l.Pool]; !ok {
			return fmt.Errorf("pool %q is not among the backends", l.Pool)
		}
	}
	if l.HandshakeTimeout < 0 || l.ReadHeaderTimeout < 0 || l.ReadTimeout < 0 || l.IdleTimeout < 0 || l.WriteTimeout < 0 || l.TCPKeepAlive < 0 {
		return errors.New("timeouts must not be negative")
	}
	if l.MaxHeaderBytes < 0 || l.MaxConns < 0 || l.MaxConcurrentStreams < 0 || l.MaxRequestBody < 0 {
		return errors.New("limits must not be negative")
	}
	if l.MaxHeaderBytes > 0 && l.MaxHeaderBytes < 1024 {
		return errors.New("MaxHeaderBytes below 1 KiB would refuse ordinary requests")
	}
	return nil
}

func (p *PoolConfig) validate() error {
	if len(p.Members) == 0 {
		return errors.New("no members")
	}
	for _, m := range p.Members {
		host, port, err := net.SplitHostPort(m)
		if err != nil {
			return fmt.Errorf("member %q: %w", m, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); host == "" || err != nil || n == 0 {
			return fmt.Errorf("member %q: want host:port with a port from 1 to 65535", m)
		}
	}
	if p.ConnsPerMember < 0 || p.Timeout < 0 || p.ConnectTimeout < 0 {
		return errors.New("limits must not be negative")
	}
	return nil
}

func (c *Config) populate() {
	for i := range c.Listeners {
		c.Listeners[i].populate()
	}
	pools := make(map[string]PoolConfig, len(c.Backends))
	for name, p := range c.Backends {
		p.populate()
		pools[name] = p
	}
	c.Backends = pools
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func (l *ListenerConfig) populate() {
	if l.Addr == "" {
		l.Addr = defaultAddr
	}
	setDefault(&l.HandshakeTimeout, defaultHandshakeTimeout)
	setDefault(&l.ReadHeaderTimeout, defaultReadHeaderTimeout)
	setDefault(&l.ReadTimeout, defaultReadTimeout)
	setDefault(&l.IdleTimeout, defaultIdleTimeout)
	setDefault(&l.WriteTimeout, defaultWriteTimeout)
	setDefault(&l.MaxHeaderBytes, defaultMaxHeaderBytes)
	setDefault(&l.MaxConns, defaultMaxConns)
	setDefault(&l.MaxConcurrentStreams, defaultMaxConcurrentStreams)
	setDefault(&l.MaxRequestBody, defaultMaxRequestBody)
}

func (p *PoolConfig) populate() {
	p.Members = append([]string(nil), p.Members...)
	setDefault(&p.ConnsPerMember, defaultConnsPerMember)
	setDefault(&p.Timeout, defaultPoolTimeout)
	setDefault(&p.ConnectTimeout, defaultConnectTimeout)
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

// reloadable lists the ListenerConfig fields Reload may change; the others are bound
// to sockets and protocol servers made at Start, apart from WrapListener, which
// Reload ignores (functions cannot be compared).
var reloadable = map[string]bool{"TLS": true, "Pool": true, "WrapListener": true}

// checkReload returns an error naming the first listener setting of next that differs
// from cur and cannot change without a restart. Both are populated.
func checkReload(cur, next []ListenerConfig) error {
	if len(cur) != len(next) {
		return fmt.Errorf("l7: reload: %d listeners instead of %d; adding or removing listeners takes a restart", len(next), len(cur))
	}
	for i := range cur {
		a, b := reflect.ValueOf(cur[i]), reflect.ValueOf(next[i])
		if cur[i].Name != next[i].Name {
			return fmt.Errorf("l7: reload: listener %d is %q, was %q; renaming or reordering listeners takes a restart", i, next[i].Name, cur[i].Name)
		}
		for f := 0; f < a.NumField(); f++ {
			name := a.Type().Field(f).Name
			if reloadable[name] {
				continue
			}
			if !a.Field(f).Equal(b.Field(f)) {
				return fmt.Errorf("l7: reload: listener %q: %s changed (%v → %v); it takes a restart",
					cur[i].Name, name, a.Field(f), b.Field(f))
			}
		}
	}
	return nil
}
