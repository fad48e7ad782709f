// Package keyserverd is the keyserverd command as a library: its configuration file,
// its subcommands (run, import, keys) and its signal handling, so that tests drive it
// in-process and cmd/keyserverd stays a one-line main.
package keyserverd

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/hsm"
	"github.com/tiergate/tiergate/keyserver/softkey"
)

// FileConfig is the YAML configuration file of keyserverd. Every field may be left out;
// its default is given beside it. docs: deploy/keyserverd.yaml is a full example.
type FileConfig struct {
	// Listen is the address clients connect to. Default ":2407".
	Listen string `yaml:"listen"`
	// MetricsListen serves /metrics (Prometheus) and /healthz. Default
	// "127.0.0.1:9240"; "off" disables it.
	MetricsListen string `yaml:"metrics_listen"`

	// TLS: the server's certificate and the CA that client certificates must chain to.
	// All three files are required to run (not to import).
	TLS struct {
		// CertFile is the server certificate chain (PEM). Required.
		CertFile string `yaml:"cert_file"`
		// KeyFile is the server certificate's private key (PEM). Required.
		KeyFile string `yaml:"key_file"`
		// ClientCAFile holds the CA certificates (PEM) that issue client certificates.
		// Required.
		ClientCAFile string `yaml:"client_ca_file"`
	} `yaml:"tls"`

	// Limits on clients.
	Limits struct {
		// MaxInFlightPerConn bounds requests being worked on per connection; more are
		// answered "overloaded" at once. Default 1024.
		MaxInFlightPerConn int `yaml:"max_in_flight_per_conn"`
		// MaxConns bounds client connections. Default 4096.
		MaxConns int `yaml:"max_conns"`
		// HandshakeTimeout bounds a client's TLS handshake. Default 10s.
		HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
		// IdleTimeout closes connections on which no frame arrives. Default 5m.
		IdleTimeout time.Duration `yaml:"idle_timeout"`
		// WriteTimeout bounds one write to a client. Default 10s.
		WriteTimeout time.Duration `yaml:"write_timeout"`
	} `yaml:"limits"`

	// ShutdownGrace is how long in-flight requests may take to finish on SIGTERM or
	// SIGINT before connections are closed. Default 10s.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`

	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`

	// PKCS11 configures the PKCS#11 (HSM) backend; see keyserver/hsm.Config for each
	// field. Default: no HSM backend. When present it comes first: it serves a key
	// that both backends hold, and imports go to it.
	PKCS11 *hsm.Config `yaml:"pkcs11"`

	// Software configures the software (PEM file) backend, for development. Default:
	// none.
	Software *softkey.Config `yaml:"software"`

	// Clients authorizes clients for keys by certificate name. Default (empty): any
	// client with a valid certificate may use every key and none may import.
	Clients []keyserver.ClientRule `yaml:"clients"`
}

// DefaultMetricsListen is where /metrics and /healthz are served by default.
const DefaultMetricsListen = "127.0.0.1:9240"

// LoadConfig reads and checks a configuration file. Unknown fields are errors.
func LoadConfig(path string) (*FileConfig, error) {
	return daemon.ReadConfig(path, (*FileConfig).validate)
}

// ParseConfig decodes a configuration; name is used in errors.
func ParseConfig(data []byte, name string) (*FileConfig, error) {
	return daemon.ParseConfig(data, name, (*FileConfig).validate)
}

// validate checks c and fills in its defaults.
func (c *FileConfig) validate() error {
	if c.PKCS11 == nil && c.Software == nil {
		return errors.New("no key backend: set pkcs11 or software")
	}
	if c.MetricsListen == "" {
		c.MetricsListen = DefaultMetricsListen
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if _, err := daemon.LogLevel(c.LogLevel); err != nil {
		return err
	}
	for i, r := range c.Clients {
		if r.Name == "" {
			return fmt.Errorf("clients[%d]: name is empty", i)
		}
	}
	return nil
}

// serverTLS loads the certificate, key and client CA files.
func (c *FileConfig) serverTLS() (*tls.Config, error) {
	t := c.TLS
	if t.CertFile == "" || t.KeyFile == "" || t.ClientCAFile == "" {
		return nil, errors.New("tls: cert_file, key_file and client_ca_file are required")
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: loading server certificate: %w", err)
	}
	caPEM, err := os.ReadFile(t.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("tls: loading client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("tls: client CA %s holds no PEM certificate", t.ClientCAFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool}, nil
}
