// Package keyserverd is the keyserverd command as a library: its configuration file,
// its commands (run, check, import, keys), reload on SIGHUP and POST /reload, the
// admin endpoint and the lame-duck stop, so that tests drive it in-process and
// cmd/keyserverd stays a one-line main.
package keyserverd

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/hsm"
	"github.com/tiergate/tiergate/keyserver/softkey"
)

// FileConfig is the YAML configuration file of keyserverd: the keyserver's own model
// (listen, limits, clients; keyserver.Config) and what is the daemon's (the admin
// endpoint, TLS files, key backends, process settings). Every field may be left out
// unless marked required; its default is given beside it. deploy/keyserverd.yaml is
// a full example.
//
// On reload (SIGHUP, POST /reload) clients, allow_all_clients, deny, log_level,
// admin_token_file, admin_hosts, lame_duck,
// shutdown_grace and the key backends (pkcs11, software: the keys offered) change;
// listen, limits, tls, admin_listen, admin_insecure, state_dir and control are
// fixed at start, and a reload that changes them is refused.
type FileConfig struct {
	// Server is the keyserver's configuration: listen (default "127.0.0.1:2407":
	// set the address the L7 nodes reach), limits, clients (required, or
	// allow_all_clients), allow_all_clients and deny, written at the top level of
	// the file.
	Server keyserver.Config `yaml:",inline"`

	// AdminListen serves /metrics (Prometheus), /healthz, GET /status and POST
	// /reload. Default "127.0.0.1:9240"; "off" disables it.
	AdminListen string `yaml:"admin_listen"`

	// MetricsListen is the former name of AdminListen, still read. Set one of the
	// two.
	MetricsListen string `yaml:"metrics_listen"`

	// AdminTokenFile holds the bearer token of the admin endpoint: every request
	// but GET /healthz and /metrics needs "Authorization: Bearer <token>". The
	// token is the file's content less surrounding white space, at least 16 bytes
	// of visible ASCII; the file must exist, and is warned about when its group or
	// others may read it. Read at start and on reload. Default: the token in
	// <state_dir>/admin.token, generated there (0600) at the first start and logged
	// with its path.
	AdminTokenFile string `yaml:"admin_token_file"`

	// AdminInsecure serves the admin endpoint with no token when AdminTokenFile is
	// not set: whoever reaches admin_listen may reload keyserverd and read its
	// status. Only where nothing else runs on the host and the network keeps others
	// out. Fixed at start. Default false: a token is required.
	AdminInsecure bool `yaml:"admin_insecure"`

	// AdminHosts lists the host names (or addresses) by which the admin endpoint is
	// reached, besides a loopback address, "localhost" and the address it listens
	// on: a request whose Host header names anything else is refused (421), which
	// keeps web pages out by DNS rebinding. Changes on reload. Default none.
	AdminHosts []string `yaml:"admin_hosts"`

	// StateDir is keyserverd's own directory: the admin token it generates lives
	// there. Created (0700) when missing. Fixed at start. Default
	// /var/lib/tiergate/keyserverd (systemd: StateDirectory=tiergate/keyserverd).
	StateDir string `yaml:"state_dir"`

	// TLS: the server's certificate and the CA that client certificates must chain to.
	// All three files are required to run (not to import).
	TLS TLSFiles `yaml:"tls"`

	// ShutdownGrace is how long in-flight requests may take to finish on SIGTERM or
	// SIGINT (after LameDuck) before connections are closed. Default 10s.
	ShutdownGrace config.Duration `yaml:"shutdown_grace"`

	// LameDuck is how long keyserverd goes on serving after SIGTERM or SIGINT with
	// /healthz answering 503 "shutting down", so that health checkers take it out of
	// rotation before it stops accepting. Default 0: stop at once.
	LameDuck config.Duration `yaml:"lame_duck"`

	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level"`

	// PKCS11 configures the PKCS#11 (HSM) backend; see keyserver/hsm.Config for each
	// field. Default: no HSM backend. When present it comes first: it serves a key
	// that both backends hold, and imports go to it.
	PKCS11 *hsm.Config `yaml:"pkcs11"`

	// Software configures the software (PEM file) backend, for development. Default:
	// none.
	Software *softkey.Config `yaml:"software"`

	// Control, when set, makes keyserverd a node of the control plane: the node
	// agent (control/agent) reports it in the store with role keyserverd and its
	// listen address, so that controld and `tgctl nodes` list it. It takes nothing
	// from the cluster configuration yet: each snapshot is accepted and its
	// revision reported. The section is agent.NodeConfig: node (required),
	// etcd_endpoints (required), ca_file, cert_file, key_file, username,
	// password_file, dial_timeout (default 5s) and cache_file (default
	// <state_dir>/control-snapshot.json). Fixed at start. Default none.
	Control *agent.NodeConfig `yaml:"control"`
}

// TLSFiles are the PEM files of keyserverd's mutual TLS.
type TLSFiles struct {
	// CertFile is the server certificate chain (PEM). Required.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the server certificate's private key (PEM). Required.
	KeyFile string `yaml:"key_file"`
	// ClientCAFile holds the CA certificates (PEM) that issue client certificates.
	// Required.
	ClientCAFile string `yaml:"client_ca_file"`
}

// Defaults of the file's own settings.
const (
	// DefaultAdminListen is where the admin endpoint is served by default.
	DefaultAdminListen = "127.0.0.1:9240"
	// DefaultMetricsListen is DefaultAdminListen under its former name.
	DefaultMetricsListen = DefaultAdminListen
	// DefaultShutdownGrace is ShutdownGrace's default.
	DefaultShutdownGrace = 10 * time.Second
)

// LoadConfig reads and checks a configuration file. Unknown fields are errors.
func LoadConfig(path string) (*FileConfig, error) {
	return daemon.ReadConfig(path, (*FileConfig).validate)
}

// ParseConfig decodes a configuration; name is used in errors.
func ParseConfig(data []byte, name string) (*FileConfig, error) {
	return daemon.ParseConfig(data, name, (*FileConfig).validate)
}

// validate fills in c's defaults and reports every problem, each by its path.
func (c *FileConfig) validate() error {
	if c.PKCS11 == nil && c.Software == nil {
		return errors.New("no key backend: set pkcs11 or software")
	}
	var ck config.Checker
	switch {
	case c.MetricsListen == "":
	case c.AdminListen == "":
		c.AdminListen = c.MetricsListen
	case c.AdminListen != c.MetricsListen:
		ck.Addf("metrics_listen", "%q differs from admin_listen %q: metrics_listen is admin_listen's former name; set one", c.MetricsListen, c.AdminListen)
	}
	c.MetricsListen = ""
	if c.AdminListen == "" {
		c.AdminListen = DefaultAdminListen
	}
	if c.StateDir == "" {
		c.StateDir = daemon.DefaultStateDir("keyserverd")
	}
	if c.Control != nil {
		c.Control.Defaults(c.StateDir)
		ck.Nest("control", c.Control.Validate())
	}
	for i, h := range c.AdminHosts {
		if h == "" || strings.ContainsAny(h, "/ \t") {
			ck.Addf(config.Index("admin_hosts", i), "%q: want a host name or address", h)
		}
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = config.Duration(DefaultShutdownGrace)
	}
	if c.ShutdownGrace < 0 {
		ck.Addf("shutdown_grace", "%v is negative", c.ShutdownGrace)
	}
	if c.LameDuck < 0 {
		ck.Addf("lame_duck", "%v is negative", c.LameDuck)
	}
	if _, err := daemon.LogLevel(c.LogLevel); err != nil {
		ck.Addf("log_level", "%q: want debug, info, warn or error", c.LogLevel)
	}
	ck.Nest("", c.Server.Validate())
	c.Server.Defaults()
	if c.PKCS11 != nil {
		ck.Nest("pkcs11", c.PKCS11.Validate())
	}
	if c.Software != nil {
		ck.Nest("software", c.Software.Validate())
	}
	return ck.Err()
}

// warnSecrets logs a warning for each file of c holding a secret (the TLS key, the
// software keys, the token's PIN file; the admin token is AdminToken's) that its
// group or others may read.
func (c *FileConfig) warnSecrets(log *slog.Logger) {
	if c.TLS.KeyFile != "" {
		daemon.WarnIfExposed(log, "keyserverd's TLS private key", c.TLS.KeyFile)
	}
	if c.PKCS11 != nil && c.PKCS11.PINFile != "" {
		daemon.WarnIfExposed(log, "the token's user PIN", c.PKCS11.PINFile)
	}
	if c.PKCS11 != nil && c.PKCS11.URI != "" {
		if u, err := hsm.ParseURI(c.PKCS11.URI); err == nil && u.PINSource != "" && !strings.HasPrefix(u.PINSource, "|") {
			path := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(u.PINSource, "file://localhost"), "file://"), "file:")
			daemon.WarnIfExposed(log, "the token's user PIN", path)
		}
	}
	if s := c.Software; s != nil {
		files := s.Files
		if s.Dir != "" {
			for _, pat := range []string{"*.key", "*.pem"} {
				m, _ := filepath.Glob(filepath.Join(s.Dir, pat))
				files = append(files, m...)
			}
		}
		for _, f := range files {
			daemon.WarnIfExposed(log, "a software private key", f)
		}
	}
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
