// Package certs is the certificate model the L7 terminator serves TLS from: it loads
// certificate chains whose private keys are local files or held by the keyservers,
// validates them, indexes them by name for SNI, and holds the session ticket keys an
// L7 cluster shares so that a client resumes on any node.
//
// A Store holds an immutable Set behind an atomic pointer: handshakes read it without
// a lock, and a reload builds the next Set beside it (Store.Prepare, which can fail
// and changes nothing) and swaps it in whole with the ticket keys (Store.Commit,
// which cannot fail), so a daemon commits certificates only once everything else of
// its reload was good too. Store.Load does both.
//
// # Certificates held in memory
//
// Fed by the control plane, l7d has no certificate files: Store.PrepareMem takes the
// chains in memory (MemConfig), whose private keys only the keyservers hold, and
// bindings that say which certificates each listener serves for which server names
// (Set.Listener; Store.TLSConfigFor gives a listener its TLS config). It refuses the
// whole configuration when any part of it cannot be served, where Prepare leaves a
// bad file out.
//
// # Ticket keys and cloned configs
//
// crypto/tls copies the session ticket keys set with tls.Config.SetSessionTicketKeys
// into a Clone at the time of cloning, so keys rotated later would never reach a
// listener that cloned its config earlier (every listener does, to set its ALPN).
// Store.TLSConfig therefore leaves the config's own keys alone and seals and opens
// tickets in WrapSession and UnwrapSession, which read the Store's current keys on
// every call. Clones copy those two functions, so every listener, TCP or QUIC (quic-go
// and its http3 package wrap them rather than replace them), follows each reload.
package certs

import (
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/certs/chain"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/client"
)

// Config is the certificate part of l7d's configuration, with the same names in YAML
// and JSON. The zero value of every field means its documented default, but a Config
// that yields no certificate at all does not load.
type Config struct {
	// Certificates lists certificate files one by one. Default: none.
	Certificates []CertConfig `yaml:"certificates" json:"certificates,omitempty"`

	// Dir is a directory of certificates: every <name>.pem in it is a chain (leaf
	// first) named <name>, whose private key is <name>.key beside it or, when there is
	// no such file, a private key block in <name>.pem itself or, when there is none, a
	// key held by the keyservers under the leaf's key ID. Files whose name starts with
	// a dot are skipped. Default: none.
	Dir string `yaml:"dir" json:"dir,omitempty"`

	// Default names the certificate served when the client's server name (SNI)
	// matches no certificate, or when it sent none and the connection's local address
	// matches no IP address certificate either. Default: none, and such handshakes
	// fail with ErrNoCertificate.
	Default string `yaml:"default" json:"default,omitempty"`

	// TicketKeyFiles are files of 32 random bytes each (raw, 64 hex digits, or the
	// base64 of 32 bytes) that seal and open TLS session tickets. The first is the
	// newest and seals new tickets; all of them open tickets. Every L7 node of a
	// cluster shares the same files, so a client resumes its session on any node. To
	// rotate, put a new key first and keep the old one second for a ticket lifetime
	// (7 days in crypto/tls), then drop it. Default: none, and tickets are sealed with
	// per-process random keys that crypto/tls rotates daily, so a client resumes only
	// on the process that issued its ticket.
	TicketKeyFiles []string `yaml:"ticket_key_files" json:"ticket_key_files,omitempty"`

	// TicketKeyMaxAge is how old the newest of TicketKeyFiles (by its modification
	// time: NewestTicketKeyAge) may be before l7d warns, at start and on reload, that
	// rotation seems to have stopped. Rotated daily, the newest key is never more than
	// a day old; the default, DefaultTicketKeyMaxAge (48h), warns once a rotation has
	// been missed. Not negative.
	TicketKeyMaxAge config.Duration `yaml:"ticket_key_max_age" json:"ticket_key_max_age,omitempty"`
}

// DefaultTicketKeyMaxAge is Config.TicketKeyMaxAge's default: two days, twice the
// rotation period the README suggests.
const DefaultTicketKeyMaxAge = config.Duration(48 * time.Hour)

// CertConfig is one certificate.
type CertConfig struct {
	// Name identifies the certificate in Config.Default, reports, logs and metrics.
	// Names are unique. Default: the base name of CertFile without its extension.
	Name string `yaml:"name" json:"name,omitempty"`

	// CertFile is the PEM certificate chain: the leaf first, then each issuer in
	// order (the root may be left out). Private key blocks in it are ignored, so one
	// combined file may serve as both CertFile and KeyFile. Required.
	CertFile string `yaml:"cert_file" json:"cert_file"`

	// KeyFile is the PEM private key of the leaf (PKCS #8, PKCS #1 or SEC 1; not
	// encrypted). Default: none, and the key is held by the keyservers under the
	// leaf's key ID (Options.KeyServer is then required).
	KeyFile string `yaml:"key_file" json:"key_file,omitempty"`
}

// Options are a Store's dependencies.
type Options struct {
	// KeyServer serves the private keys of certificates without a key file. Default:
	// none, and such certificates are rejected.
	KeyServer *client.Client

	// KeyTimeout bounds the lookup of one remote key when loading. Default 5s.
	KeyTimeout time.Duration

	// Registerer receives the Store's metrics: tiergate_tls_certificate_expiry_seconds
	// {name,subject} (the leaf's NotAfter as a Unix time), tiergate_tls_certificates,
	// tiergate_tls_certificates_rejected and tiergate_tls_certificate_loads_total
	// {result}. Use one Store per registry. Default: none registered.
	Registerer prometheus.Registerer

	// Logger receives load reports and rejections. Default slog.Default().
	Logger *slog.Logger

	// Now tells the time for validity checks. Default time.Now.
	Now func() time.Time
}

// DefaultKeyTimeout is the default Options.KeyTimeout.
const DefaultKeyTimeout = 5 * time.Second

// MaxChainLen bounds the certificates in one chain file (chain.MaxLen).
const MaxChainLen = chain.MaxLen

// ErrNoCertificate is returned, wrapped with the server name, by GetCertificate when no
// certificate matches and there is no default.
var ErrNoCertificate = errors.New("no certificate for the server name")

// LoadReport says what a Load did with each configured certificate.
type LoadReport struct {
	// Loaded names the certificates of the new Set, in configuration order (the
	// Certificates list, then Dir in file name order).
	Loaded []string
	// Rejected lists the certificates left out, each with the reason.
	Rejected []Rejection
}

// Rejection is a certificate that could not be loaded.
type Rejection struct {
	Name string
	Err  error // names the file and the reason
}

func (r Rejection) Error() string { return r.Err.Error() }

func (o *Options) populate() {
	if o.KeyTimeout <= 0 {
		o.KeyTimeout = DefaultKeyTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}
