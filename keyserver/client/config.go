package client

import (
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// MaxServers bounds Config.Servers.
const MaxServers = 64

// Defaults of Config.
const (
	DefaultConnsPerServer     = 2
	DefaultMaxInFlightPerConn = 1024
	DefaultRequestTimeout     = config.Duration(time.Second)
	DefaultTimeout            = config.Duration(3 * time.Second)
	DefaultDialTimeout        = config.Duration(2 * time.Second)
	DefaultPingInterval       = config.Duration(5 * time.Second)
	DefaultReconnectMin       = config.Duration(100 * time.Millisecond)
	DefaultReconnectMax       = config.Duration(10 * time.Second)
)

// Config configures a Client. Its settings (servers, limits, timeouts) are the
// keyserver client's model, l7d's keyservers section, with the same names in YAML and
// JSON; the fields tagged "-" are the objects a program hands over (TLS material,
// fallback keys, metrics, logs). The zero value of every optional field means the
// default its comment gives; Defaults fills them in and Validate checks them, naming
// fields by path ("servers[1]", "timeout").
type Config struct {
	// Servers lists the keyservers as "host:port", at most MaxServers of them. Every
	// server is expected to hold the same keys; requests are spread over all of them and
	// fail over from one to another. Required.
	Servers []string `yaml:"servers" json:"servers"`

	// ServerName is the name verified in every keyserver's certificate. Default:
	// TLS.ServerName, or when that is empty the host of each server's address.
	ServerName string `yaml:"server_name" json:"server_name,omitempty"`

	// ConnsPerServer is the number of long-lived connections kept to each server.
	// Default 2.
	ConnsPerServer int `yaml:"conns_per_server" json:"conns_per_server,omitempty"`

	// MaxInFlightPerConn bounds the requests in flight on one connection. Beyond it a
	// request waits for a free slot (within its deadline) unless another
	// connection has room. Keep it at or below the server's per-connection limit.
	// Default 1024, the server's default.
	MaxInFlightPerConn int `yaml:"max_in_flight_per_conn" json:"max_in_flight_per_conn,omitempty"`

	// RequestTimeout is how long a request waits for its answer before its
	// connection is checked by a health ping, and how long that ping may take. A ping
	// unanswered within it, while nothing else came on the connection nor waits unread
	// in its socket, fails the connection: its requests fail over to another server,
	// and the server comes last in the choice until it answers again. A request
	// otherwise waits for its answer as long as its caller does (its deadline, within
	// Timeout): a server busy with a burst is waited for, a stalled one failed over.
	// Default 1s.
	RequestTimeout config.Duration `yaml:"request_timeout" json:"request_timeout,omitempty"`

	// Timeout bounds a whole request across fail-over attempts, and is the deadline
	// of a caller that gave none. Default 3s.
	Timeout config.Duration `yaml:"timeout" json:"timeout,omitempty"`

	// DialTimeout bounds the TCP connect and TLS handshake to a server. Default 2s.
	DialTimeout config.Duration `yaml:"dial_timeout" json:"dial_timeout,omitempty"`

	// PingInterval is the period of the health ping on each connection. A ping that
	// fails, or takes longer than RequestTimeout while nothing else comes on the
	// connection, closes it, and it is redialled. A request unanswered after
	// RequestTimeout triggers an early ping. Default 5s.
	PingInterval config.Duration `yaml:"ping_interval" json:"ping_interval,omitempty"`

	// ReconnectMin and ReconnectMax bound the exponential backoff, with jitter,
	// between attempts to (re)connect to a server. Defaults 100ms and 10s; a
	// ReconnectMax below ReconnectMin is taken as ReconnectMin.
	ReconnectMin config.Duration `yaml:"reconnect_min" json:"reconnect_min,omitempty"`
	ReconnectMax config.Duration `yaml:"reconnect_max" json:"reconnect_max,omitempty"`

	// TLS carries the client certificate (Certificates or GetClientCertificate) and the
	// CA pool that verifies the keyservers (RootCAs; nil means the system pool).
	// ServerName, when empty, is ServerName above or each server's host; NextProtos,
	// when empty, is ALPN. The config is cloned and MinVersion is forced to TLS 1.3.
	// Required.
	TLS *tls.Config `yaml:"-" json:"-"`

	// Fallback holds local keys, by key ID, used only when every keyserver failed to
	// serve an operation on that key (unreachable, timed out, overloaded, internal
	// error or key not found). A refusal (not authorized, bad request, crypto failure)
	// is never retried locally. Default none.
	Fallback map[protocol.KeyID]crypto.Signer `yaml:"-" json:"-"`

	// Registerer receives the client's metrics. Nil means the metrics are not
	// registered.
	Registerer prometheus.Registerer `yaml:"-" json:"-"`

	// Logger receives connection state changes and fall-backs. Default slog.Default().
	Logger *slog.Logger `yaml:"-" json:"-"`
}

// Validate checks the model's fields of c (not TLS, Fallback and the others tagged
// "-", which New checks) and returns every problem, each a *config.FieldError named by
// its path within c ("servers[1]", "conns_per_server").
func (cfg *Config) Validate() error {
	var ck config.Checker
	if len(cfg.Servers) == 0 {
		ck.Addf("servers", "required: at least one keyserver")
	}
	if len(cfg.Servers) > MaxServers {
		ck.Addf("servers", "%d servers, at most %d are supported", len(cfg.Servers), MaxServers)
	}
	seen := make(map[string]bool, len(cfg.Servers))
	for i, s := range cfg.Servers {
		path := config.Index("servers", i)
		host, port, err := net.SplitHostPort(s)
		switch {
		case err != nil:
			ck.Addf(path, "%q: %w", s, err)
		case host == "" || port == "":
			ck.Addf(path, "%q: want host:port", s)
		case seen[s]:
			ck.Addf(path, "%q is listed twice", s)
		}
		seen[s] = true
	}
	for _, f := range []struct {
		path string
		v    int
	}{
		{"conns_per_server", cfg.ConnsPerServer},
		{"max_in_flight_per_conn", cfg.MaxInFlightPerConn},
	} {
		if f.v < 0 {
			ck.Addf(f.path, "%d is negative", f.v)
		}
	}
	for _, f := range []struct {
		path string
		v    config.Duration
	}{
		{"request_timeout", cfg.RequestTimeout},
		{"timeout", cfg.Timeout},
		{"dial_timeout", cfg.DialTimeout},
		{"ping_interval", cfg.PingInterval},
		{"reconnect_min", cfg.ReconnectMin},
		{"reconnect_max", cfg.ReconnectMax},
	} {
		if f.v < 0 {
			ck.Addf(f.path, "%v is negative", f.v)
		}
	}
	return ck.Err()
}

// Defaults fills in the default of every field left zero.
func (cfg *Config) Defaults() {
	setDefault(&cfg.ConnsPerServer, DefaultConnsPerServer)
	setDefault(&cfg.MaxInFlightPerConn, DefaultMaxInFlightPerConn)
	setDefault(&cfg.RequestTimeout, DefaultRequestTimeout)
	setDefault(&cfg.Timeout, DefaultTimeout)
	setDefault(&cfg.DialTimeout, DefaultDialTimeout)
	setDefault(&cfg.PingInterval, DefaultPingInterval)
	setDefault(&cfg.ReconnectMin, DefaultReconnectMin)
	setDefault(&cfg.ReconnectMax, DefaultReconnectMax)
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = cfg.ReconnectMin
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
}

// validate checks cfg as New needs it: Validate, then the program's parts.
func (cfg *Config) validate() error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("keyserver client: %w", err)
	}
	if cfg.TLS == nil {
		return errors.New("keyserver client: TLS config is required")
	}
	if len(cfg.TLS.Certificates) == 0 && cfg.TLS.GetClientCertificate == nil {
		return errors.New("keyserver client: TLS config has no client certificate (mutual TLS is required)")
	}
	if cfg.TLS.MaxVersion != 0 && cfg.TLS.MaxVersion < tls.VersionTLS13 {
		return errors.New("keyserver client: TLS MaxVersion is below TLS 1.3")
	}
	for id, s := range cfg.Fallback {
		if s == nil {
			return fmt.Errorf("keyserver client: fallback key %s is nil", id.Short())
		}
		got, err := backend.KeyIDOf(s.Public())
		if err != nil {
			return fmt.Errorf("keyserver client: fallback key %s: %w", id.Short(), err)
		}
		if got != id {
			return fmt.Errorf("keyserver client: fallback key listed as %s has key ID %s", id.Short(), got.Short())
		}
	}
	return nil
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}
