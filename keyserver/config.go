package keyserver

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Config configures a Server. Its settings (listen, limits, clients) are the
// keyserver's configuration model, with the same names in YAML and JSON; the fields
// tagged "-" are the objects a program hands over (TLS, backends, metrics, logs).
// The zero value of every field means its documented default; TLS and at least one
// backend are required.
type Config struct {
	// Addr is the TCP address to listen on. Default ":2407".
	Addr string `yaml:"listen,omitempty" json:"listen,omitempty"`

	// Limits bound what clients may hold.
	Limits Limits `yaml:"limits,omitempty" json:"limits,omitzero"`

	// Clients says which client may use which keys. A client is matched by its
	// certificate's common name or a DNS/URI SAN; the first matching rule applies.
	// They can be replaced while the server runs (Server.Apply). Default (no rules):
	// every client with a valid certificate may use every key, and none may import.
	Clients []ClientRule `yaml:"clients,omitempty" json:"clients,omitempty"`

	// TLS holds the server certificate and ClientCAs, the pool client certificates must
	// chain to. The server forces TLS 1.3 and RequireAndVerifyClientCert. Required.
	TLS *tls.Config `yaml:"-" json:"-"`

	// Backends supply the keys. A key ID found in several backends is served by the
	// first. Imports go to the first backend. They can be replaced while the server
	// runs (Server.Apply). Required.
	Backends []backend.Backend `yaml:"-" json:"-"`

	// Registerer receives the server's metrics. Default: none registered.
	Registerer prometheus.Registerer `yaml:"-" json:"-"`

	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger `yaml:"-" json:"-"`
}

// Limits bound the connections and requests of clients. They are fixed when the
// server is made.
type Limits struct {
	// MaxInFlightPerConn bounds the requests being worked on for one connection; a
	// request beyond it is answered at once with CodeOverloaded. Default 1024.
	MaxInFlightPerConn int `yaml:"max_in_flight_per_conn,omitempty" json:"max_in_flight_per_conn,omitempty"`

	// MaxConns bounds concurrent client connections; more are closed after accept and
	// counted as rejections. Default 4096.
	MaxConns int `yaml:"max_conns,omitempty" json:"max_conns,omitempty"`

	// HandshakeTimeout bounds the TLS handshake. Default 10s.
	HandshakeTimeout config.Duration `yaml:"handshake_timeout,omitempty" json:"handshake_timeout,omitempty"`

	// IdleTimeout closes a connection on which no whole frame arrived for this long
	// (clients ping more often). It also bounds how long a partial frame may take.
	// Default 5m.
	IdleTimeout config.Duration `yaml:"idle_timeout,omitempty" json:"idle_timeout,omitempty"`

	// WriteTimeout bounds one write of responses to a client. Default 10s.
	WriteTimeout config.Duration `yaml:"write_timeout,omitempty" json:"write_timeout,omitempty"`
}

// ClientRule authorizes one client (or all) for a set of keys.
type ClientRule struct {
	// Name is matched against the client certificate's common name, DNS SANs and URI
	// SANs; "*" matches every client. Required.
	Name string `yaml:"name" json:"name"`
	// Keys lists key IDs (64 hex digits) or key labels the client may use; "*" means
	// all keys. Default: none.
	Keys []string `yaml:"keys,omitempty" json:"keys,omitempty"`
	// Admin lets the client import keys. Default false.
	Admin bool `yaml:"admin,omitempty" json:"admin,omitempty"`
}

// Defaults of Config.
const (
	DefaultAddr               = ":2407"
	DefaultMaxInFlightPerConn = 1024
	DefaultMaxConns           = 4096
	DefaultHandshakeTimeout   = 10 * time.Second
	DefaultIdleTimeout        = 5 * time.Minute
	DefaultWriteTimeout       = 10 * time.Second
)

// Defaults fills in the default of every setting left at its zero value.
func (c *Config) Defaults() {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	c.Limits.Defaults()
}

// Defaults fills in the default of every limit left at its zero value.
func (l *Limits) Defaults() {
	if l.MaxInFlightPerConn == 0 {
		l.MaxInFlightPerConn = DefaultMaxInFlightPerConn
	}
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = config.Duration(DefaultHandshakeTimeout)
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = config.Duration(DefaultIdleTimeout)
	}
	if l.WriteTimeout == 0 {
		l.WriteTimeout = config.Duration(DefaultWriteTimeout)
	}
}

// Validate reports every problem of the settings (listen, limits, clients), each
// naming its field by its YAML/JSON path ("clients[1].name: required"). It does not
// look at TLS or the backends, which NewServer checks.
func (c *Config) Validate() error {
	var ck config.Checker
	ck.Nest("limits", c.Limits.Validate())
	ck.Nest("", ValidateClients(c.Clients))
	return ck.Err()
}

// Validate reports every negative limit by its field.
func (l *Limits) Validate() error {
	var ck config.Checker
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"max_in_flight_per_conn", int64(l.MaxInFlightPerConn)},
		{"max_conns", int64(l.MaxConns)},
		{"handshake_timeout", int64(l.HandshakeTimeout)},
		{"idle_timeout", int64(l.IdleTimeout)},
		{"write_timeout", int64(l.WriteTimeout)},
	} {
		if f.v < 0 {
			ck.Addf(f.name, "must not be negative")
		}
	}
	return ck.Err()
}

// ValidateClients reports every problem of the client rules, by path
// ("clients[0].name: required").
func ValidateClients(rules []ClientRule) error {
	var ck config.Checker
	for i, r := range rules {
		at := config.Index("clients", i)
		if r.Name == "" {
			ck.Addf(config.At(at, "name"), "required")
		}
		for j, k := range r.Keys {
			if k == "" {
				ck.Addf(config.Index(config.At(at, "keys"), j), "empty")
			}
		}
	}
	return ck.Err()
}

// validate checks what NewServer needs: the settings, TLS and a backend.
func (c *Config) validate() error {
	var errs []error
	if c.TLS == nil || (len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil) {
		errs = append(errs, errors.New("TLS with a server certificate is required"))
	} else if c.TLS.ClientCAs == nil {
		errs = append(errs, errors.New("TLS.ClientCAs is required (clients authenticate with certificates)"))
	}
	if len(c.Backends) == 0 {
		errs = append(errs, errors.New("at least one key backend is required"))
	}
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return &configError{err}
	}
	return nil
}

// configError is a Config that NewServer refuses.
type configError struct{ err error }

func (e *configError) Error() string { return "keyserver: " + e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// populate fills in the defaults, and the TLS settings the protocol requires.
func (c *Config) populate() {
	c.Defaults()
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
