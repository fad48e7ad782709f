package l7

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Server. The zero value of every optional field means its
// documented default; at least one listener is required, and every listener's pool.
type Config struct {
	// Listeners are the addresses the server terminates TLS and QUIC on. Names must be
	// unique. Required.
	Listeners []ListenerConfig

	// Backends are the named backend pools requests are proxied to. Every listener's
	// Pool must be here. Default none.
	Backends map[string]PoolConfig

	// Decider takes the one per-request decision (pool, direct answer, client IP) that
	// routing policies, client-IP rules and blacklists plug into. Default: every request
	// goes to its listener's Pool and the client IP is the packet source.
	Decider Decider

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

	// Pool names the backend pool (a key of Config.Backends) that requests on this
	// listener go to unless the Decider says otherwise. Required.
	Pool string

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
		if err := l.validate(c.Backends); err != nil {
			return fmt.Errorf("l7: listener %q: %w", l.Name, err)
		}
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

func (l *ListenerConfig) validate(pools map[string]PoolConfig) error {
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
	if l.Pool == "" {
		return errors.New("pool is empty")
	}
	if _, ok := pools[l.Pool]; !ok {
		return fmt.Errorf("pool %q is not among the backends", l.Pool)
	}
	if l.HandshakeTimeout < 0 || l.ReadHeaderTimeout < 0 || l.ReadTimeout < 0 || l.IdleTimeout < 0 || l.WriteTimeout < 0 {
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

// reloadable lists the ListenerConfig fields Reload may change; the others are bound
// to sockets and protocol servers made at Start.
var reloadable = map[string]bool{"TLS": true, "Pool": true}

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
