package keyserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Config configures a Server. The zero value of every field means its documented
// default; TLS and at least one backend are required.
type Config struct {
	// Addr is the TCP address to listen on. Default ":2407".
	Addr string

	// TLS holds the server certificate and ClientCAs, the pool client certificates must
	// chain to. The server forces TLS 1.3 and RequireAndVerifyClientCert. Required.
	TLS *tls.Config

	// Backends supply the keys. A key ID found in several backends is served by the
	// first. Imports go to the first backend. Required.
	Backends []backend.Backend

	// Clients says which client may use which keys. A client is matched by its
	// certificate's common name or a DNS/URI SAN; the first matching rule applies.
	// Default (no rules): every client with a valid certificate may use every key, and
	// none may import.
	Clients []ClientRule

	// MaxInFlightPerConn bounds the requests being worked on for one connection; a
	// request beyond it is answered at once with CodeOverloaded. Default 1024.
	MaxInFlightPerConn int

	// MaxConns bounds concurrent client connections; more are closed after accept and
	// counted as rejections. Default 4096.
	MaxConns int

	// HandshakeTimeout bounds the TLS handshake. Default 10s.
	HandshakeTimeout time.Duration

	// IdleTimeout closes a connection on which no whole frame arrived for this long
	// (clients ping more often). It also bounds how long a partial frame may take.
	// Default 5m.
	IdleTimeout time.Duration

	// WriteTimeout bounds one write of responses to a client. Default 10s.
	WriteTimeout time.Duration

	// Registerer receives the server's metrics. Default: none registered.
	Registerer prometheus.Registerer

	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger
}

// ClientRule authorizes one client (or all) for a set of keys.
type ClientRule struct {
	// Name is matched against the client certificate's common name, DNS SANs and URI
	// SANs; "*" matches every client.
	Name string `yaml:"name"`
	// Keys lists key IDs (64 hex digits) or key labels the client may use; "*" means
	// all keys. Default: none.
	Keys []string `yaml:"keys"`
	// Admin lets the client import keys. Default false.
	Admin bool `yaml:"admin"`
}

const (
	defaultAddr               = ":2407"
	defaultMaxInFlightPerConn = 1024
	defaultMaxConns           = 4096
	defaultHandshakeTimeout   = 10 * time.Second
	defaultIdleTimeout        = 5 * time.Minute
	defaultWriteTimeout       = 10 * time.Second
)

func (c *Config) validate() error {
	if c.TLS == nil || (len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil) {
		return errors.New("keyserver: TLS with a server certificate is required")
	}
	if c.TLS.ClientCAs == nil {
		return errors.New("keyserver: TLS.ClientCAs is required (clients authenticate with certificates)")
	}
	if len(c.Backends) == 0 {
		return errors.New("keyserver: at least one key backend is required")
	}
	for i, r := range c.Clients {
		if r.Name == "" {
			return fmt.Errorf("keyserver: client rule %d: name is empty", i)
		}
	}
	if c.MaxInFlightPerConn < 0 || c.MaxConns < 0 {
		return errors.New("keyserver: limits must not be negative")
	}
	return nil
}

func (c *Config) populate() {
	if c.Addr == "" {
		c.Addr = defaultAddr
	}
	if c.MaxInFlightPerConn == 0 {
		c.MaxInFlightPerConn = defaultMaxInFlightPerConn
	}
	if c.MaxConns == 0 {
		c.MaxConns = defaultMaxConns
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = defaultHandshakeTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = defaultIdleTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = defaultWriteTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	t := c.TLS.Clone()
	t.MinVersion = tls.VersionTLS13
	t.ClientAuth = tls.RequireAndVerifyClientCert
	t.NextProtos = []string{ALPN}
	c.TLS = t
}

// ALPN is the application protocol name both sides negotiate.
const ALPN = protocol.ALPN
