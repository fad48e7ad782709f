package keyserverd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
)

// retireDelay is how long backends replaced by a reload stay open, so that requests
// that took their keys just before the reload still finish on them.
const retireDelay = 5 * time.Second

// Daemon is a running keyserverd: the keyserver, its key backends and the admin
// endpoint, built from a configuration file that can be reloaded.
//
// Run's goroutine owns what changes (the file in force, the backends): SIGHUP is
// handled there, and the admin endpoint's changes are closures queued to it (do),
// so reloads run one after another.
type Daemon struct {
	// Path is the configuration file. Required.
	Path string
	// Stderr receives logs. Default os.Stderr.
	Stderr io.Writer

	// ready, when set, is closed once Run serves clients and the admin endpoint.
	ready chan struct{}

	ops  chan func()   // changes queued to Run's goroutine
	done chan struct{} // closed when Run stops taking changes

	// Owned by Run's goroutine.
	file    *FileConfig
	srv     *keyserver.Server
	retired sync.WaitGroup // backends replaced by reloads, closed after retireDelay
	stopped chan struct{}  // closed at stop: retired backends close at once

	log     *slog.Logger
	level   slog.LevelVar
	reg     *prometheus.Registry
	changes *prometheus.CounterVec
	auth    daemon.AdminAuth
	lame    daemon.LameDuck
	admin   net.Listener
	// tokenFile is where the admin token in force came from; "" for none.
	tokenFile string
}

// setup reads the configuration and prepares logging and metrics.
func (d *Daemon) setup() error {
	if d.Stderr == nil {
		d.Stderr = os.Stderr
	}
	cfg, err := LoadConfig(d.Path)
	if err != nil {
		return err
	}
	lvl, _ := daemon.LogLevel(cfg.LogLevel)
	d.level.Set(lvl)
	d.log = slog.New(slog.NewTextHandler(d.Stderr, &slog.HandlerOptions{Level: &d.level}))
	cfg.warnSecrets(d.log)
	if cfg.AdminListen != "off" {
		token, path, err := daemon.AdminToken(cfg.AdminTokenFile, cfg.AdminInsecure, cfg.StateDir, d.log)
		if err != nil {
			return err
		}
		d.tokenFile = path
		d.auth.SetToken(token)
	}
	d.auth.Logger = d.log
	d.auth.SetHosts(cfg.AdminHosts)
	d.lame.Logger = d.log
	d.file = cfg
	d.ops, d.done, d.stopped = make(chan func()), make(chan struct{}), make(chan struct{})
	d.reg = prometheus.NewRegistry()
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d.changes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tiergate_keyserver_config_changes_total",
		Help: "Reloads of keyserverd's configuration (SIGHUP, POST /reload), by result (ok, error).",
	}, []string{"source", "result"})
	d.reg.MustRegister(d.changes)
	return nil
}

// Check validates the configuration file, loads the TLS files and opens the key
// backends, and reports what would be served.
func (d *Daemon) Check(out io.Writer) error {
	cfg, err := LoadConfig(d.Path)
	if err != nil {
		return err
	}
	if _, err := cfg.serverTLS(); err != nil {
		return err
	}
	if _, err := daemon.ReadAdminTokenFile(cfg.AdminTokenFile); err != nil {
		return err
	}
	stderr := d.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	log := daemon.NewLogger(cfg.LogLevel, stderr)
	cfg.warnSecrets(log)
	backends, err := openBackends(cfg, log, false)
	if err != nil {
		return err
	}
	defer closeAll(backends)
	fmt.Fprintf(out, "listen %s; admin %s (%s); %d client rules\n", cfg.Server.Addr, cfg.AdminListen, adminTokenSummary(cfg), len(cfg.Server.Clients))
	if err := listKeys(out, backends); err != nil {
		return err
	}
	fmt.Fprintln(out, "configuration OK")
	return nil
}

// adminTokenSummary says where the admin endpoint's token comes from.
func adminTokenSummary(cfg *FileConfig) string {
	switch {
	case cfg.AdminListen == "off":
		return "off"
	case cfg.AdminTokenFile != "":
		return "token from " + cfg.AdminTokenFile
	case cfg.AdminInsecure:
		return "no token: admin_insecure"
	}
	return "token in " + filepath.Join(cfg.StateDir, daemon.GeneratedTokenFile) + ", generated if missing"
}

// Run serves until ctx is done, reloading on SIGHUP and POST /reload; then it stops
// with the lame-duck delay: /healthz answers 503 for lame_duck, then the keyserver
// stops accepting and drains for up to shutdown_grace, and the backends close.
func (d *Daemon) Run(ctx context.Context) error {
	if err := d.setup(); err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	defer close(d.done)

	tlsCfg, err := d.file.serverTLS()
	if err != nil {
		return err
	}
	backends, err := openBackends(d.file, d.log, false)
	if err != nil {
		return err
	}
	cfg := d.file.Server
	cfg.TLS, cfg.Backends, cfg.Registerer, cfg.Logger = tlsCfg, backends, d.reg, d.log
	d.srv, err = keyserver.NewServer(cfg)
	if err != nil {
		closeAll(backends)
		return err
	}
	d.reg.MustRegister(extractableCollector{d.srv})
	var admin *http.Server
	if d.file.AdminListen != "off" {
		ln, err := net.Listen("tcp", d.file.AdminListen)
		if err != nil {
			d.srv.Shutdown(context.Background())
			closeAll(backends)
			return fmt.Errorf("admin listener: %w", err)
		}
		d.admin = ln
		admin = &http.Server{Handler: d.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go admin.Serve(ln)
		d.log.Info("admin", "addr", ln.Addr().String(), "token_file", d.tokenFile,
			"example", fmt.Sprintf("curl -H \"Authorization: Bearer $(cat %s)\" http://%s/status", d.tokenFile, ln.Addr()))
	}
	if err := d.srv.Start(); err != nil {
		if admin != nil {
			admin.Close()
		}
		d.srv.Shutdown(context.Background())
		closeAll(backends)
		return err
	}
	if d.ready != nil {
		close(d.ready)
	}
	for {
		select {
		case <-ctx.Done():
			return d.stop(admin)
		case <-hup:
			if err := d.reload(); err != nil {
				d.log.Error("reload failed; the running configuration stays", "err", err)
			}
		case op := <-d.ops:
			op()
		}
	}
}

// stop is the lame-duck stop: unhealthy for lame_duck, then the keyserver drains
// for up to shutdown_grace, then the admin endpoint and the backends close.
func (d *Daemon) stop(admin *http.Server) error {
	d.lame.Delay, d.lame.Grace = d.file.LameDuck.D(), d.file.ShutdownGrace.D()
	d.log.Info("stopping", "lame_duck", d.lame.Delay, "grace", d.lame.Grace)
	err := d.lame.Stop(context.Background(), func(ctx context.Context) error {
		err := d.srv.Shutdown(ctx)
		if admin != nil {
			admin.Close()
		}
		return err
	})
	close(d.stopped)
	d.retired.Wait()
	closeAll(d.srv.Backends())
	d.log.Info("stopped")
	return err
}

// do runs op on Run's goroutine and waits for it; once Run has stopped, it returns
// an error instead.
func (d *Daemon) do(op func()) error {
	done := make(chan struct{})
	select {
	case d.ops <- func() { op(); close(done) }:
	case <-d.done:
		return errStopping
	}
	<-done
	return nil
}

var errStopping = errors.New("keyserverd is stopping")

// AdminAddr returns the admin listener's address, or nil.
func (d *Daemon) AdminAddr() net.Addr {
	if d.admin == nil {
		return nil
	}
	return d.admin.Addr()
}

// Addr returns the address clients connect to, or nil before Run serves.
func (d *Daemon) Addr() net.Addr {
	if d.srv == nil {
		return nil
	}
	return d.srv.Addr()
}

// extractableCollector reports tiergate_keyserver_extractable_keys{action}: the
// keys of the PKCS#11 backends in force whose value can leave the token, refused or
// served (pkcs11.allow_extractable).
type extractableCollector struct{ srv *keyserver.Server }

var extractableDesc = prometheus.NewDesc("tiergate_keyserver_extractable_keys",
	"Keys on the token whose value can leave it (CKA_EXTRACTABLE true or CKA_SENSITIVE false), by action: refused, or served under pkcs11.allow_extractable.",
	[]string{"action"}, nil)

func (extractableCollector) Describe(ch chan<- *prometheus.Desc) { ch <- extractableDesc }

func (c extractableCollector) Collect(ch chan<- prometheus.Metric) {
	var refused, served int
	for _, b := range c.srv.Backends() {
		if h, ok := b.(interface{ ExtractableKeys() (int, int) }); ok {
			r, s := h.ExtractableKeys()
			refused, served = refused+r, served+s
		}
	}
	ch <- prometheus.MustNewConstMetric(extractableDesc, prometheus.GaugeValue, float64(refused), "refused")
	ch <- prometheus.MustNewConstMetric(extractableDesc, prometheus.GaugeValue, float64(served), "served")
}

// restartError is a change of settings that are fixed at start.
type restartError struct{ fields []string }

func (e *restartError) Error() string {
	return strings.Join(e.fields, ", ") + " cannot change at runtime: restart keyserverd to apply"
}

// fixedChanges returns a restartError naming the start-time settings that differ
// between cur and next, or nil.
func fixedChanges(cur, next *FileConfig) error {
	var diff []string
	if cur.Server.Addr != next.Server.Addr {
		diff = append(diff, "listen")
	}
	if cur.Server.Limits != next.Server.Limits {
		diff = append(diff, "limits")
	}
	if cur.TLS != next.TLS {
		diff = append(diff, "tls")
	}
	if cur.AdminListen != next.AdminListen {
		diff = append(diff, "admin_listen")
	}
	if cur.AdminInsecure != next.AdminInsecure {
		diff = append(diff, "admin_insecure")
	}
	if cur.StateDir != next.StateDir {
		diff = append(diff, "state_dir")
	}
	if len(diff) == 0 {
		return nil
	}
	return &restartError{fields: diff}
}

// reload re-reads the configuration file and applies what may change at runtime
// (clients, the key backends, log level, admin token, lame_duck, shutdown_grace),
// all of it or, when any part fails, none. New backends are opened only when the
// pkcs11 or software section changed; the ones they replace close after
// retireDelay. It runs on Run's goroutine.
func (d *Daemon) reload() (err error) {
	defer func() { d.count("reload", err) }()
	cfg, err := LoadConfig(d.Path)
	if err != nil {
		return err
	}
	if err := fixedChanges(d.file, cfg); err != nil {
		return err
	}
	var token []byte
	var tokenFile string
	if cfg.AdminListen != "off" {
		if token, tokenFile, err = daemon.AdminToken(cfg.AdminTokenFile, cfg.AdminInsecure, cfg.StateDir, d.log); err != nil {
			return err
		}
	}
	cfg.warnSecrets(d.log)
	var backends []backend.Backend
	if !reflect.DeepEqual(cfg.PKCS11, d.file.PKCS11) || !reflect.DeepEqual(cfg.Software, d.file.Software) {
		if backends, err = openBackends(cfg, d.log, false); err != nil {
			return err
		}
	}
	replaced, err := d.srv.Apply(keyserver.Update{Clients: cfg.Server.Clients, AllowAllClients: cfg.Server.AllowAllClients,
		Deny: cfg.Server.Deny, Backends: backends})
	if err != nil {
		closeAll(backends)
		return err
	}
	d.retire(replaced)
	lvl, _ := daemon.LogLevel(cfg.LogLevel)
	d.level.Set(lvl)
	d.auth.SetToken(token)
	d.auth.SetHosts(cfg.AdminHosts)
	d.tokenFile = tokenFile
	d.file = cfg
	d.log.Info("reloaded", "config", d.Path, "client_rules", len(cfg.Server.Clients), "keys", len(d.srv.Keys()), "backends_reopened", backends != nil)
	return nil
}

// retire closes backends a reload replaced after retireDelay, or at stop.
func (d *Daemon) retire(bs []backend.Backend) {
	if len(bs) == 0 {
		return
	}
	d.retired.Add(1)
	go func() {
		defer d.retired.Done()
		t := time.NewTimer(retireDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-d.stopped:
		}
		closeAll(bs)
	}()
}

func (d *Daemon) count(source string, err error) {
	d.changes.WithLabelValues(source, daemon.Result(err)).Inc()
}
