// Package controld is the control plane's daemon: the /v1 API (control/api) over
// the cluster configuration's store (control/store), an embedded single-node etcd
// in its data directory by default or an external etcd cluster with
// -etcd-endpoints.
package controld

import (
	"context"
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
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/daemon"
)

const usage = `usage: controld <command> [flags]

commands:
  run    [flags]   serve the API until SIGINT/SIGTERM
  check  [flags]   validate the flags, then exit

flags (both commands):
  -data-dir DIR          state: the embedded etcd (DIR/store) and the first admin token
                         (DIR/admin.token); default /var/lib/tiergate/controld
  -listen ADDR           the API's address, loopback only for now; default 127.0.0.1:7443
  -etcd-endpoints URLS   an external etcd cluster (comma-separated) instead of the embedded one
  -etcd-cert FILE        client certificate for it (with -etcd-key)
  -etcd-key FILE         its private key
  -etcd-ca FILE          CA its server certificate chains to
  -etcd-listen URL       a loopback URL the embedded etcd also serves, for the nodes on
                         this machine (their control.etcd_endpoints), e.g.
                         http://127.0.0.1:2379; default none (its unix socket only)
  -log-level LEVEL       debug, info, warn or error; default info
  -lame-duck DURATION    on SIGTERM, answer /healthz 503 this long before stopping; default 0
`

// DefaultListen is the API's address unless -listen says otherwise.
const DefaultListen = "127.0.0.1:7443"

// TokenFile is the name of the first admin token's file in the data directory.
const TokenFile = "admin.token"

// Config is controld's settings, from its flags.
type Config struct {
	// DataDir holds the embedded etcd (DataDir/store) and the first admin token
	// (DataDir/admin.token). Default /var/lib/tiergate/controld.
	DataDir string
	// Listen is the API's address. Only a loopback address for now (the API has no
	// TLS yet). Default DefaultListen.
	Listen string
	// Endpoints, CertFile, KeyFile and CAFile name an external etcd cluster and the
	// client TLS files for it (store.Config). Default none: the embedded etcd.
	Endpoints                 []string
	CertFile, KeyFile, CAFile string
	// EtcdListen is a loopback URL (http://127.0.0.1:2379) the embedded etcd also
	// serves its clients on, which the nodes on this machine use as their
	// control.etcd_endpoints (store.Config.ListenClientURL). Only embedded. Default
	// none.
	EtcdListen string
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// LameDuck is how long /healthz answers 503 before the stop. Default 0.
	LameDuck time.Duration
	// Keyservers are the keyservers a certificate upload imports its key into,
	// every one of the cluster, and controld's client TLS files for them (the
	// keyservers section: servers, server_name, cert_file, key_file, ca_file and
	// keyserver/client's timeouts; certupload.KeyserversConfig). Default none:
	// uploads are refused.
	Keyservers *certupload.KeyserversConfig `yaml:"keyservers" json:"keyservers,omitempty"`
}

// Defaults fills in the default of every field left zero.
func (c *Config) Defaults() {
	if c.DataDir == "" {
		c.DataDir = daemon.DefaultStateDir("controld")
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
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
	if !daemon.IsLoopbackListen(c.Listen) {
		errs = append(errs, fmt.Errorf("-listen %q: only a loopback address, until the API serves TLS", c.Listen))
	}
	if c.LameDuck < 0 {
		errs = append(errs, fmt.Errorf("-lame-duck: must not be negative"))
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
	var c Config
	var endpoints string
	fs := flag.NewFlagSet("controld "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.DataDir, "data-dir", "", "data `directory`")
	fs.StringVar(&c.Listen, "listen", DefaultListen, "API `address`")
	fs.StringVar(&endpoints, "etcd-endpoints", "", "external etcd `URLs`, comma-separated")
	fs.StringVar(&c.CertFile, "etcd-cert", "", "etcd client certificate `file`")
	fs.StringVar(&c.KeyFile, "etcd-key", "", "etcd client key `file`")
	fs.StringVar(&c.CAFile, "etcd-ca", "", "etcd CA `file`")
	fs.StringVar(&c.EtcdListen, "etcd-listen", "", "loopback `URL` the embedded etcd also serves, for nodes")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log `level`")
	fs.DurationVar(&c.LameDuck, "lame-duck", 0, "lame-duck `duration`")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "controld %s: unexpected arguments %q\n", args[0], fs.Args())
		return 2
	}
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			c.Endpoints = append(c.Endpoints, e)
		}
	}
	d := &Daemon{Config: c, Stderr: stderr}
	var err error
	if args[0] == "check" {
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

// Daemon is a running controld.
type Daemon struct {
	// Config is its settings.
	Config Config
	// Stderr receives logs. Default os.Stderr.
	Stderr io.Writer

	daemon.Base
	addr          net.Addr
	nodeEndpoints []string
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
	fmt.Fprintf(stdout, "listen %s\ndata dir %s\n", d.Config.Listen, d.Config.DataDir)
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
	d.Init(d.Stderr, d.Config.LogLevel)
	d.Lame.Delay = d.Config.LameDuck
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
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	d.Log.Info("controld serving", "listen", d.addr.String(), "embedded_store", len(d.Config.Endpoints) == 0)
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
