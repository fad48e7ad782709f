// Package controld is the control plane's daemon: the /v1 API (control/api) over
// the cluster configuration's store (control/store), an embedded single-node etcd
// in its data directory by default or an external etcd cluster with
// -etcd-endpoints.
//
// Its settings come from flags and from a YAML file (-config, Config's fields by
// their YAML names); a flag given overrides the file. The API serves TLS with
// -tls-cert and -tls-key, and must: a -listen address that is not loopback is
// refused without them.
package controld

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/control/api"
	"github.com/tiergate/tiergate/control/certupload"
	"github.com/tiergate/tiergate/control/crowdsec"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/control/ui"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
)

const usage = `usage: controld <command> [flags]

commands:
  run    [flags]   serve the API until SIGINT/SIGTERM
  check  [flags]   validate the flags, then exit

flags (both commands; each overrides the -config file's setting):
  -config FILE           a YAML file of these settings (data_dir, listen, tls_cert_file,
                         tls_key_file, etcd_endpoints, etcd_cert_file, etcd_key_file,
                         etcd_ca_file, etcd_listen, log_level, lame_duck, keyservers,
                         crowdsec)
  -data-dir DIR          state: the embedded etcd (DIR/store) and the first admin token
                         (DIR/admin.token); default /var/lib/tiergate/controld
  -listen ADDR           the API's address; default 127.0.0.1:7443. Not loopback: only
                         with -tls-cert and -tls-key
  -tls-cert FILE         the API's TLS certificate chain (PEM), with -tls-key
  -tls-key FILE          its private key (PEM)
  -etcd-endpoints URLS   an external etcd cluster (comma-separated) instead of the embedded one
  -etcd-cert FILE        client certificate for it (with -etcd-key)
  -etcd-key FILE         its private key
  -etcd-ca FILE          CA its server certificate chains to
  -etcd-listen URL       a loopback URL the embedded etcd also serves, for the nodes on
                         this machine (their control.etcd_endpoints), e.g.
                         http://127.0.0.1:2379; default none (its unix socket only)
  -log-level LEVEL       debug, info, warn or error; default info
  -lame-duck DURATION    on SIGTERM, answer /healthz 503 this long before stopping; default 0
  -prometheus URL        the /ui dashboard's figures from this Prometheus server (PromQL over
                         its HTTP API) instead of scraping the nodes; default none
  -ui-scrape-interval D  the /ui dashboard's scrape interval of the nodes; default 2s
`

// DefaultListen is the API's address unless -listen says otherwise.
const DefaultListen = "127.0.0.1:7443"

// TokenFile is the name of the first admin token's file in the data directory.
const TokenFile = "admin.token"

// Config is controld's settings, from its -config file (by the YAML names) and
// its flags, which override the file.
type Config struct {
	// DataDir holds the embedded etcd (DataDir/store) and the first admin token
	// (DataDir/admin.token). Default /var/lib/tiergate/controld.
	DataDir string `yaml:"data_dir,omitempty" json:"data_dir,omitempty"`
	// Listen is the API's address. A loopback address, or any with TLSCertFile and
	// TLSKeyFile. Default DefaultListen.
	Listen string `yaml:"listen,omitempty" json:"listen,omitempty"`
	// TLSCertFile and TLSKeyFile are the API's TLS certificate chain and private
	// key (PEM): with them the API serves HTTPS (TLS 1.2 and up). Both or neither;
	// required when Listen is not a loopback address. Default none: plain HTTP on
	// loopback.
	TLSCertFile string `yaml:"tls_cert_file,omitempty" json:"tls_cert_file,omitempty"`
	TLSKeyFile  string `yaml:"tls_key_file,omitempty" json:"tls_key_file,omitempty"`
	// Endpoints, CertFile, KeyFile and CAFile name an external etcd cluster and the
	// client TLS files for it (store.Config). Default none: the embedded etcd.
	Endpoints []string `yaml:"etcd_endpoints,omitempty" json:"etcd_endpoints,omitempty"`
	CertFile  string   `yaml:"etcd_cert_file,omitempty" json:"etcd_cert_file,omitempty"`
	KeyFile   string   `yaml:"etcd_key_file,omitempty" json:"etcd_key_file,omitempty"`
	CAFile    string   `yaml:"etcd_ca_file,omitempty" json:"etcd_ca_file,omitempty"`
	// EtcdListen is a loopback URL (http://127.0.0.1:2379) the embedded etcd also
	// serves its clients on, which the nodes on this machine use as their
	// control.etcd_endpoints (store.Config.ListenClientURL). Only embedded. Default
	// none.
	EtcdListen string `yaml:"etcd_listen,omitempty" json:"etcd_listen,omitempty"`
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `yaml:"log_level,omitempty" json:"log_level,omitempty"`
	// LameDuck is how long /healthz answers 503 before the stop ("5s"). Default 0.
	LameDuck config.Duration `yaml:"lame_duck,omitempty" json:"lame_duck,omitempty"`
	// Keyservers are the keyservers a certificate upload imports its key into,
	// every one of the cluster, and controld's client TLS files for them (the
	// keyservers section: servers, server_name, cert_file, key_file, ca_file and
	// keyserver/client's timeouts; certupload.KeyserversConfig). Default none:
	// uploads are refused.
	Keyservers *certupload.KeyserversConfig `yaml:"keyservers" json:"keyservers,omitempty"`
	// CrowdSec makes controld a bouncer of CrowdSec's Local API keeping a
	// blacklist in step with its decisions (the crowdsec section: lapi_url,
	// api_key_file, list, poll_interval, resync_interval, types, origins,
	// scenarios_containing, scenarios_not_containing, ca_file, timeout,
	// max_answer_bytes;
	// crowdsec.Config). Default none.
	CrowdSec *crowdsec.Config `yaml:"crowdsec" json:"crowdsec,omitempty"`
	// Prometheus is a Prometheus server's URL the /ui dashboard queries (control/ui)
	// instead of scraping the nodes' metrics itself. Default none.
	Prometheus string `yaml:"prometheus,omitempty" json:"prometheus,omitempty"`
	// UIScrapeInterval is how often the /ui dashboard scrapes the nodes ("2s").
	// Default 2s (ui.DefaultInterval).
	UIScrapeInterval config.Duration `yaml:"ui_scrape_interval,omitempty" json:"ui_scrape_interval,omitempty"`
}

// Defaults fills in the default of every field left zero.
func (c *Config) Defaults() {
	if c.DataDir == "" {
		c.DataDir = daemon.DefaultStateDir("controld")
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.CrowdSec != nil {
		c.CrowdSec.Defaults()
	}
}

// LoadFile reads a YAML file of settings into c (fields it does not name are left
// as they are; a field c does not have is refused).
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-config: %w", err)
	}
	if err := config.Decode(data, path, c); err != nil {
		return fmt.Errorf("-config: %w", err)
	}
	return nil
}

// loadTLS returns the API's TLS configuration, nil without TLS files.
func (c *Config) loadTLS() (*tls.Config, error) {
	if c.TLSCertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("the API's TLS certificate (tls_cert_file, tls_key_file): %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// StoreConfig returns the store's configuration.
func (c *Config) StoreConfig() store.Config {
	sc := store.Config{Endpoints: c.Endpoints, CertFile: c.CertFile, KeyFile: c.KeyFile, CAFile: c.CAFile, ListenClientURL: c.EtcdListen}
	if len(c.Endpoints) == 0 {
		sc.Dir = filepath.Join(c.DataDir, "store")
	}
	sc.Defaults()
	return sc
}

// Validate checks c (after Defaults).
func (c *Config) Validate() error {
	var errs []error
	if _, err := daemon.LogLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("-log-level: %w", err))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, fmt.Errorf("-tls-cert and -tls-key (tls_cert_file, tls_key_file) go together"))
	}
	if !daemon.IsLoopbackListen(c.Listen) && c.TLSCertFile == "" {
		errs = append(errs, fmt.Errorf("-listen %q: not a loopback address, so the API needs TLS there: give -tls-cert and -tls-key (tls_cert_file, tls_key_file), or listen on a loopback address", c.Listen))
	}
	if c.LameDuck < 0 {
		errs = append(errs, fmt.Errorf("-lame-duck: must not be negative"))
	}
	if c.Prometheus != "" {
		if _, err := ui.NewPrometheus(ui.PrometheusConfig{URL: c.Prometheus}); err != nil {
			errs = append(errs, err)
		}
	}
	if c.UIScrapeInterval < 0 || (c.UIScrapeInterval > 0 && c.UIScrapeInterval.D() < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("-ui-scrape-interval %s: at least 100ms", c.UIScrapeInterval.D()))
	}
	sc := c.StoreConfig()
	if err := sc.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("store: %w", err))
	}
	if c.Keyservers != nil {
		if err := c.Keyservers.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("keyservers: %w", err))
		}
	}
	if c.CrowdSec != nil {
		var ck config.Checker
		ck.Nest("crowdsec", c.CrowdSec.Validate())
		if err := ck.Err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Main runs controld with args (without the program name) and returns the exit
// status: 0 done, 1 the command failed, 2 a usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run", "check":
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "controld: unknown command %q\n%s", args[0], usage)
		return 2
	}
	c, err := ParseArgs(args[0], args[1:], stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) && !errors.Is(err, errFlags) {
			fmt.Fprintf(stderr, "controld: %v\n", err)
		}
		return 2
	}
	d := &Daemon{Config: c, Stderr: stderr}
	if command := args[0]; command == "check" {
		err = d.Check(stdout)
	} else {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = d.Run(ctx)
		stop()
	}
	if err != nil {
		fmt.Fprintf(stderr, "controld: %v\n", err)
		return 1
	}
	return 0
}

// errFlags is a flag error the flag package has already reported.
var errFlags = errors.New("bad flags")

// ParseArgs returns the settings of command's flags (without the command): the
// -config file's, if one is given, with every flag given over them. Errors of
// the flags are written to stderr.
func ParseArgs(command string, args []string, stderr io.Writer) (Config, error) {
	// The flags are parsed twice: first for -config, whose file gives the settings;
	// then over them, so that a flag given overrides the file.
	var c Config
	var file string
	first, _ := flagSet(command, &Config{}, &file, io.Discard)
	if first.Parse(args) == nil && file != "" {
		if err := c.LoadFile(file); err != nil {
			return Config{}, err
		}
	}
	fs, after := flagSet(command, &c, &file, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, errFlags
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%s: unexpected arguments %q", command, fs.Args())
	}
	after()
	return c, nil
}

// flagSet returns the flags of command over c, each defaulting to c's setting
// (the file's), and the function that puts the comma-separated -etcd-endpoints
// into c after parsing.
func flagSet(command string, c *Config, file *string, out io.Writer) (*flag.FlagSet, func()) {
	endpoints := strings.Join(c.Endpoints, ",")
	listen := c.Listen
	if listen == "" {
		listen = DefaultListen
	}
	level := c.LogLevel
	if level == "" {
		level = "info"
	}
	fs := flag.NewFlagSet("controld "+command, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(file, "config", *file, "YAML `file` of the settings")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "data `directory`")
	fs.StringVar(&c.Listen, "listen", listen, "API `address`")
	fs.StringVar(&c.TLSCertFile, "tls-cert", c.TLSCertFile, "API TLS certificate `file`")
	fs.StringVar(&c.TLSKeyFile, "tls-key", c.TLSKeyFile, "API TLS key `file`")
	fs.StringVar(&endpoints, "etcd-endpoints", endpoints, "external etcd `URLs`, comma-separated")
	fs.StringVar(&c.CertFile, "etcd-cert", c.CertFile, "etcd client certificate `file`")
	fs.StringVar(&c.KeyFile, "etcd-key", c.KeyFile, "etcd client key `file`")
	fs.StringVar(&c.CAFile, "etcd-ca", c.CAFile, "etcd CA `file`")
	fs.StringVar(&c.EtcdListen, "etcd-listen", c.EtcdListen, "loopback `URL` the embedded etcd also serves, for nodes")
	fs.StringVar(&c.LogLevel, "log-level", level, "log `level`")
	fs.TextVar(&c.LameDuck, "lame-duck", c.LameDuck, "lame-duck `duration`")
	fs.StringVar(&c.Prometheus, "prometheus", c.Prometheus, "Prometheus server `URL` for the /ui dashboard")
	fs.TextVar(&c.UIScrapeInterval, "ui-scrape-interval", c.UIScrapeInterval, "/ui scrape `interval`")
	return fs, func() {
		c.Endpoints = nil
		for _, e := range strings.Split(endpoints, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.Endpoints = append(c.Endpoints, e)
			}
		}
	}
}

// Daemon is a running controld.
type Daemon struct {
	// Config is its settings.
	Config Config
	// Stderr receives logs. Default os.Stderr.
	Stderr io.Writer

	daemon.Base
	addr          net.Addr
	nodeEndpoints []string
	crowdsec      *crowdsec.Bouncer
}

// nodeEndpoints returns the URLs of the store nodes use: an external cluster's
// endpoints, or the embedded etcd's loopback URL (not its unix socket, which only
// controld's user may open).
func nodeEndpoints(st *store.Store, external bool) []string {
	var out []string
	for _, u := range st.ClientURLs() {
		if external || strings.HasPrefix(u, "http://") {
			out = append(out, u)
		}
	}
	return out
}

// NodeEndpoints returns the etcd_endpoints the nodes use to reach the store, once
// Serving is closed: an external cluster's, or the embedded etcd's -etcd-listen
// URL with the port it got; none when the embedded etcd serves no address.
func (d *Daemon) NodeEndpoints() []string { return d.nodeEndpoints }

// Check validates the configuration and writes a summary to stdout.
func (d *Daemon) Check(stdout io.Writer) error {
	d.Config.Defaults()
	if err := d.Config.Validate(); err != nil {
		return err
	}
	if _, err := d.Config.loadTLS(); err != nil {
		return err
	}
	scheme := "http"
	if d.Config.TLSCertFile != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "listen %s (%s)\ndata dir %s\n", d.Config.Listen, scheme, d.Config.DataDir)
	if len(d.Config.Endpoints) > 0 {
		fmt.Fprintf(stdout, "store: external etcd %s\n", strings.Join(d.Config.Endpoints, ", "))
		fmt.Fprintf(stdout, "nodes' etcd_endpoints: %s\n", strings.Join(d.Config.Endpoints, ", "))
	} else {
		sc := d.Config.StoreConfig()
		fmt.Fprintf(stdout, "store: embedded etcd in %s (quota %d bytes, keeping %d revisions)\n", sc.Dir, sc.QuotaBackendBytes, sc.CompactionRetention)
		if d.Config.EtcdListen != "" {
			fmt.Fprintf(stdout, "nodes' etcd_endpoints: %s\n", d.Config.EtcdListen)
		} else {
			fmt.Fprintf(stdout, "nodes' etcd_endpoints: none (the embedded etcd serves its unix socket only; -etcd-listen for nodes)\n")
		}
	}
	fmt.Fprintf(stdout, "first admin token: %s, generated when the store has no token\n", filepath.Join(d.Config.DataDir, TokenFile))
	if ks := d.Config.Keyservers; ks != nil {
		if _, err := ks.TLS(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "keyservers (a certificate's key is imported into each): %s\n", strings.Join(ks.Servers, ", "))
	} else {
		fmt.Fprintf(stdout, "keyservers: none (certificate uploads are refused)\n")
	}
	if d.Config.Prometheus != "" {
		fmt.Fprintf(stdout, "/ui dashboard: figures from Prometheus at %s\n", d.Config.Prometheus)
	} else {
		fmt.Fprintf(stdout, "/ui dashboard: the nodes' metrics scraped every %s\n", cmp.Or(d.Config.UIScrapeInterval.D(), ui.DefaultInterval))
	}
	if cs := d.Config.CrowdSec; cs != nil {
		fmt.Fprintf(stdout, "crowdsec: a bouncer of %s keeping blacklist %s in step with its %s decisions, pulled every %s\n",
			cs.LAPIURL, cs.List, strings.Join(cs.Types, ", "), cs.PollInterval)
	}
	return nil
}

// Addr returns the API's address once Serving is closed.
func (d *Daemon) Addr() net.Addr { return d.addr }

// Run serves the API until ctx is done, then stops: /healthz unhealthy for the
// lame-duck period, the requests in progress finished, the store closed.
func (d *Daemon) Run(ctx context.Context) error {
	d.Config.Defaults()
	if err := d.Config.Validate(); err != nil {
		return err
	}
	if d.Stderr == nil {
		d.Stderr = os.Stderr
	}
	tlsConf, err := d.Config.loadTLS()
	if err != nil {
		return err
	}
	d.Init(d.Stderr, d.Config.LogLevel)
	d.Lame.Delay = d.Config.LameDuck.D()
	if err := os.MkdirAll(d.Config.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	sc := d.Config.StoreConfig()
	sc.Logger = d.Log
	st, err := store.Open(ctx, sc)
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	defer st.Close()
	d.nodeEndpoints = nodeEndpoints(st, len(d.Config.Endpoints) > 0)
	if len(d.nodeEndpoints) > 0 {
		d.Log.Info("nodes reach the store at these etcd_endpoints", "etcd_endpoints", strings.Join(d.nodeEndpoints, ","))
	} else {
		d.Log.Info("the embedded store serves no address for nodes (-etcd-listen to give one)")
	}
	srv := api.New(st, d.Log)
	if ksc := d.Config.Keyservers; ksc != nil {
		ksc.Logger = d.Log
		ks, err := ksc.Open()
		if err != nil {
			return err
		}
		defer ks.Close()
		srv.SetKeyservers(ks)
	}
	tok, err := srv.EnsureAdminToken(ctx)
	if err != nil {
		return fmt.Errorf("the first admin token: %w", err)
	}
	if tok != "" {
		path := filepath.Join(d.Config.DataDir, TokenFile)
		if err := daemon.WriteFileAtomic(path, 0o600, func(w io.Writer) error {
			_, err := io.WriteString(w, tok+"\n")
			return err
		}); err != nil {
			return fmt.Errorf("writing the first admin token: %w", err)
		}
		d.Log.Warn("generated the first admin token (role admin); keep it, it is not stored in clear anywhere else", "path", path)
	}
	if d.Config.CrowdSec != nil {
		stop, err := d.startCrowdSec(ctx, st)
		if err != nil {
			return err
		}
		defer stop()
	}
	ln, err := net.Listen("tcp", d.Config.Listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	d.addr = ln.Addr()
	mux := http.NewServeMux()
	health := d.Lame.Healthy(nil)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := health(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.Handle("/", srv)
	if err := ui.Mount(ctx, mux, ui.Config{Tokens: srv.Tokens(), Store: st, Prometheus: d.Config.Prometheus, Interval: d.Config.UIScrapeInterval.D(), Logger: d.Log}); err != nil {
		return fmt.Errorf("the /ui dashboard: %w", err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, TLSConfig: tlsConf}
	served := make(chan error, 1)
	if tlsConf != nil {
		go func() { served <- hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { served <- hs.Serve(ln) }()
	}
	d.Log.Info("controld serving", "listen", d.addr.String(), "tls", tlsConf != nil, "embedded_store", len(d.Config.Endpoints) == 0)
	d.MarkServing()
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	}
	err = d.Lame.Stop(context.Background(), hs.Shutdown)
	d.Log.Info("controld stopped")
	return err
}
