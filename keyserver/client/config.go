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

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// MaxServers bounds Config.Servers.
const MaxServers = 64

// Config configures a Client. The zero value of every optional field means its
// documented default.
type Config struct {
	// Servers lists the keyservers as "host:port", at most MaxServers of them. Every
	// server is expected to hold the same keys; requests are spread over all of them and
	// fail over from one to another. Required.
	Servers []string

	// TLS carries the client certificate (Certificates or GetClientCertificate) and the
	// CA pool that verifies the keyservers (RootCAs; nil means the system pool).
	// ServerName, when empty, is taken from each server's host; NextProtos, when
	// empty, is ALPN. The config is cloned and MinVersion is forced to TLS 1.3.
	// Required.
	TLS *tls.Config

	// ConnsPerServer is the number of long-lived connections kept to each server.
	// Default 2.
	ConnsPerServer int

	// MaxInFlightPerConn bounds the requests in flight on one connection. Beyond it a
	// request waits for a free slot (within its RequestTimeout) unless another
	// connection has room. Keep it at or below the server's per-connection limit.
	// Default 1024, the server's default.
	MaxInFlightPerConn int

	// RequestTimeout bounds one attempt on one server, and a health ping. Default 1s.
	RequestTimeout time.Duration

	// Timeout bounds a whole request across fail-over attempts. Default 3s.
	Timeout time.Duration

	// DialTimeout bounds the TCP connect and TLS handshake to a server. Default 2s.
	DialTimeout time.Duration

	// PingInterval is the period of the health ping on each connection. A ping that
	// fails or takes longer than RequestTimeout closes the connection, which is then
	// redialled. A request that times out triggers an early ping. Default 5s.
	PingInterval time.Duration

	// ReconnectMin and ReconnectMax bound the exponential backoff, with jitter,
	// between attempts to (re)connect to a server. Defaults 100ms and 10s.
	ReconnectMin time.Duration
	ReconnectMax time.Duration

	// Fallback holds local keys, by key ID, used only when every keyserver failed to
	// serve an operation on that key (unreachable, timed out, overloaded, internal
	// error or key not found). A refusal (not authorized, bad request, crypto failure)
	// is never retried locally. Default none.
	Fallback map[protocol.KeyID]crypto.Signer

	// Registerer receives the client's metrics. Nil means the metrics are not
	// registered.
	Registerer prometheus.Registerer

	// Logger receives connection state changes and fall-backs. Default slog.Default().
	Logger *slog.Logger
}

func (cfg *Config) validate() error {
	if len(cfg.Servers) == 0 {
		return errors.New("keyserver client: no servers configured")
	}
	if len(cfg.Servers) > MaxServers {
		return fmt.Errorf("keyserver client: %d servers configured, at most %d are supported", len(cfg.Servers), MaxServers)
	}
	seen := make(map[string]bool, len(cfg.Servers))
	for _, s := range cfg.Servers {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			return fmt.Errorf("keyserver client: server %q: %w", s, err)
		}
		if host == "" || port == "" {
			return fmt.Errorf("keyserver client: server %q: want host:port", s)
		}
		if seen[s] {
			return fmt.Errorf("keyserver client: server %q listed twice", s)
		}
		seen[s] = true
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
	for _, f := range []struct {
		name string
		v    int
	}{
		{"ConnsPerServer", cfg.ConnsPerServer},
		{"MaxInFlightPerConn", cfg.MaxInFlightPerConn},
	} {
		if f.v < 0 {
			return fmt.Errorf("keyserver client: %s is negative (%d)", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"RequestTimeout", cfg.RequestTimeout},
		{"Timeout", cfg.Timeout},
		{"DialTimeout", cfg.DialTimeout},
		{"PingInterval", cfg.PingInterval},
		{"ReconnectMin", cfg.ReconnectMin},
		{"ReconnectMax", cfg.ReconnectMax},
	} {
		if f.v < 0 {
			return fmt.Errorf("keyserver client: %s is negative (%s)", f.name, f.v)
		}
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

// populate fills in the defaults. It runs after validate.
func (cfg *Config) populate() {
	setDefault(&cfg.ConnsPerServer, 2)
	setDefault(&cfg.MaxInFlightPerConn, 1024)
	setDefault(&cfg.RequestTimeout, time.Second)
	setDefault(&cfg.Timeout, 3*time.Second)
	setDefault(&cfg.DialTimeout, 2*time.Second)
	setDefault(&cfg.PingInterval, 5*time.Second)
	setDefault(&cfg.ReconnectMin, 100*time.Millisecond)
	setDefault(&cfg.ReconnectMax, 10*time.Second)
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = cfg.ReconnectMin
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
}

func setDefault[T int | time.Duration](p *T, v T) {
	if *p == 0 {
		*p = v
	}
}
