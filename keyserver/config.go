package keyserver

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"math"
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
	// Addr is the TCP address to listen on. Default "127.0.0.1:2407", this host
	// only: a deployment sets the address its L7 nodes reach (and no wider).
	Addr string `yaml:"listen,omitempty" json:"listen,omitempty"`

	// Limits bound what clients may hold.
	Limits Limits `yaml:"limits,omitempty" json:"limits,omitzero"`

	// Clients says which client may use which keys and operations. A client is
	// matched by its certificate's common name or a DNS/URI SAN; the first matching
	// rule applies, and a client no rule matches may only ping and list (no) keys.
	// They can be replaced while the server runs (Server.Apply). Required, unless
	// AllowAllClients: with no rules the server refuses to start.
	Clients []ClientRule `yaml:"clients,omitempty" json:"clients,omitempty"`

	// AllowAllClients, with no Clients rules, lets every certificate the client CA
	// issued sign with every key (the operations of a rule without ops: no
	// rsa_decrypt, no import). The server logs a warning at start and on every
	// Apply, and reports it (tiergate_keyserver_allow_all_clients 1, keyserverd's
	// /status). For development; setting it with rules is an error. Default false.
	AllowAllClients bool `yaml:"allow_all_clients,omitempty" json:"allow_all_clients,omitempty"`

	// Deny lists client certificates refused whatever the rules say (a compromised
	// L7 node's, before its certificate expires). Replaced with the rules (Apply).
	// Default none.
	Deny DenyList `yaml:"deny,omitempty" json:"deny,omitzero"`

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

	// MaxConns bounds concurrent authenticated client connections (their TLS
	// handshake done); one more is closed after its handshake and counted as
	// rejections{reason="too_many_conns"}. Connections still in their handshake
	// count against MaxHandshakes instead. Default 4096.
	MaxConns int `yaml:"max_conns,omitempty" json:"max_conns,omitempty"`

	// MaxHandshakes bounds the connections still in their TLS handshake, which are
	// not yet authenticated; more are closed at accept and counted as
	// rejections{reason="too_many_handshakes"}. Default 64.
	MaxHandshakes int `yaml:"max_handshakes,omitempty" json:"max_handshakes,omitempty"`

	// MaxHandshakesPerSource bounds the connections in their TLS handshake from one
	// source: an IPv4 address, or an IPv6 /64. More from that source are closed at
	// accept and counted as rejections{reason="too_many_source_handshakes"}. An L7
	// node opens a few connections (its client's conns per server, default 2).
	// Default 8.
	MaxHandshakesPerSource int `yaml:"max_handshakes_per_source,omitempty" json:"max_handshakes_per_source,omitempty"`

	// HandshakeTimeout bounds the TLS handshake: a connection that has not finished
	// it by then is closed (rejections{reason="handshake"}). Default 3s.
	HandshakeTimeout config.Duration `yaml:"handshake_timeout,omitempty" json:"handshake_timeout,omitempty"`

	// BackendWait bounds how long a request waits for its backend to take it (a
	// free PKCS#11 session) when its client gave no deadline: past it the request
	// is answered overloaded without being done, and counted as
	// rejections{reason="backend_busy"}. A request that carries its own deadline
	// (keyserver/client sends it) waits until that deadline instead, and is then
	// dropped without being done and counted as
	// rejections{reason="deadline_exceeded"}. Default 1s.
	BackendWait config.Duration `yaml:"backend_wait,omitempty" json:"backend_wait,omitempty"`

	// IdleTimeout closes a connection on which no whole frame arrived for this long
	// (clients ping more often). It also bounds how long a partial frame may take.
	// Default 5m.
	IdleTimeout config.Duration `yaml:"idle_timeout,omitempty" json:"idle_timeout,omitempty"`

	// WriteTimeout bounds one write of responses to a client. Default 10s.
	WriteTimeout config.Duration `yaml:"write_timeout,omitempty" json:"write_timeout,omitempty"`
}

// ClientRule authorizes one client (or all) for a set of keys and operations.
type ClientRule struct {
	// Name is matched against the client certificate's common name, DNS SANs and URI
	// SANs; "*" matches every client. Required.
	Name string `yaml:"name" json:"name"`
	// Keys lists key IDs (64 hex digits) or key labels the client may use; "*" means
	// all keys. Default: none.
	Keys []string `yaml:"keys,omitempty" json:"keys,omitempty"`
	// Ops lists the key operations the client may ask for: operation names
	// (rsa_sign_pkcs1, rsa_sign_pss, ecdsa_sign, ed25519_sign, rsa_decrypt,
	// public_key), "sign" for the four signatures, "*" for all six. Ping and
	// list_keys are always allowed; import_key is Admin's. An operation not listed
	// is answered not_authorized. Default (empty): sign and public_key, what a TLS
	// 1.3 (and ECDHE TLS 1.2) terminator needs; rsa_decrypt (TLS 1.2 RSA key
	// exchange) only when listed.
	Ops []string `yaml:"ops,omitempty" json:"ops,omitempty"`
	// Admin lets the client import keys. Default false.
	Admin bool `yaml:"admin,omitempty" json:"admin,omitempty"`
	// RateLimit bounds the key operations (and imports) of each client this rule
	// matches, by its certificate's key: a token bucket per client, shared by its
	// connections. A request over it is answered overloaded (the client tries
	// another server) and counted as rejections{reason="rate_limited"}. Default:
	// none.
	RateLimit RateLimit `yaml:"rate_limit,omitempty" json:"rate_limit,omitzero"`
}

// RateLimit is a token bucket: PerSecond requests a second on average, bursts of up
// to Burst. The zero value is no limit.
type RateLimit struct {
	// PerSecond is the average rate allowed. Default 0: no limit.
	PerSecond float64 `yaml:"per_second,omitempty" json:"per_second,omitempty"`
	// Burst is how many requests may come at once. Default: PerSecond (at least 1).
	Burst int `yaml:"burst,omitempty" json:"burst,omitempty"`
}

// DenyList names client certificates the server refuses. A certificate listed here
// is refused at the handshake's end, and an open connection of one is closed at its
// next request once the list names it.
type DenyList struct {
	// Serials are certificate serial numbers in hex, colons allowed
	// ("0a:1b:2c" or "0A1B2C"). A serial is unique per issuer only: list serials of
	// the client CA's certificates. Default none.
	Serials []string `yaml:"serials,omitempty" json:"serials,omitempty"`
	// SPKISHA256 are SHA-256 digests of certificates' SubjectPublicKeyInfo, 64 hex
	// digits (openssl x509 -pubkey -noout | openssl pkey -pubin -outform DER |
	// sha256sum): every certificate of that key is refused. Default none.
	SPKISHA256 []string `yaml:"spki_sha256,omitempty" json:"spki_sha256,omitempty"`
}

// Defaults of Config.
const (
	DefaultAddr                   = "127.0.0.1:2407"
	DefaultMaxInFlightPerConn     = 1024
	DefaultMaxConns               = 4096
	DefaultMaxHandshakes          = 64
	DefaultMaxHandshakesPerSource = 8
	DefaultHandshakeTimeout       = 3 * time.Second
	DefaultBackendWait            = time.Second
	DefaultIdleTimeout            = 5 * time.Minute
	DefaultWriteTimeout           = 10 * time.Second
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
	if l.MaxHandshakes == 0 {
		l.MaxHandshakes = DefaultMaxHandshakes
	}
	if l.MaxHandshakesPerSource == 0 {
		l.MaxHandshakesPerSource = DefaultMaxHandshakesPerSource
	}
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = config.Duration(DefaultHandshakeTimeout)
	}
	if l.BackendWait == 0 {
		l.BackendWait = config.Duration(DefaultBackendWait)
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
	ck.Nest("", validateAccess(c.Clients, c.AllowAllClients, c.Deny))
	return ck.Err()
}

// validateAccess checks the rules, allow_all_clients and the deny list together.
func validateAccess(rules []ClientRule, allowAll bool, deny DenyList) error {
	var ck config.Checker
	switch {
	case len(rules) == 0 && !allowAll:
		ck.Addf("clients", "no rules: name the clients and the keys they may use "+
			"(or set allow_all_clients: true to let every certificate of the client CA sign with every key)")
	case len(rules) > 0 && allowAll:
		ck.Addf("allow_all_clients", "set together with client rules: the rules would apply; remove one")
	}
	ck.Nest("", ValidateClients(rules))
	ck.Nest("deny", deny.Validate())
	return ck.Err()
}

// Validate reports every serial or digest of the list that does not parse.
func (d DenyList) Validate() error {
	var ck config.Checker
	for i, s := range d.Serials {
		if _, err := parseSerial(s); err != nil {
			ck.Addf(config.Index("serials", i), "%v", err)
		}
	}
	for i, s := range d.SPKISHA256 {
		if _, err := parseSPKIDigest(s); err != nil {
			ck.Addf(config.Index("spki_sha256", i), "%v", err)
		}
	}
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
		{"max_handshakes", int64(l.MaxHandshakes)},
		{"max_handshakes_per_source", int64(l.MaxHandshakesPerSource)},
		{"handshake_timeout", int64(l.HandshakeTimeout)},
		{"backend_wait", int64(l.BackendWait)},
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
		for j, op := range r.Ops {
			if _, err := opsOf(op); err != nil {
				ck.Addf(config.Index(config.At(at, "ops"), j), "%v", err)
			}
		}
		rl, rlAt := r.RateLimit, config.At(at, "rate_limit")
		if rl.PerSecond < 0 || math.IsNaN(rl.PerSecond) || math.IsInf(rl.PerSecond, 0) {
			ck.Addf(config.At(rlAt, "per_second"), "%v: want a rate of 0 (no limit) or more", rl.PerSecond)
		}
		if rl.Burst < 0 {
			ck.Addf(config.At(rlAt, "burst"), "must not be negative")
		}
		if rl.Burst > 0 && rl.PerSecond == 0 {
			ck.Addf(config.At(rlAt, "burst"), "set without per_second")
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
	t.NextProtos = []string{ALPNDeadline, ALPN}
	c.TLS = t
}

// ALPN is the application protocol name both sides negotiate: protocol version 1.
const ALPN = protocol.ALPN

// ALPNDeadline is version 1 with request deadlines, which the server prefers.
const ALPNDeadline = protocol.ALPNDeadline
