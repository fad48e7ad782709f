package keyserverd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
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
// so reloads run one after another. Base holds the logger, the metrics, the admin
// endpoint and the stop, as in every daemon; Serving is closed once Run serves
// clients and the admin endpoint.
type Daemon struct {
	// Path is the configuration file. Required.
	Path string
	// Stderr receives logs. Default os.Stderr.
	Stderr io.Writer

	daemon.Base
	owner *daemon.Owner // changes queued to Run's goroutine

	// Owned by Run's goroutine.
	file    *FileConfig
	srv     *keyserver.Server
	control atomic.Pointer[agent.Agent] // the control plane's agent, with a control section
	retired sync.WaitGroup              // backends replaced by reloads, closed after retireDelay
	stopped chan struct{}               // closed at stop: retired backends close at once
}

// admin returns the admin endpoint's settings of c.
func (c *FileConfig) admin() daemon.AdminConfig {
	return daemon.AdminConfig{Listen: c.AdminListen, TokenFile: c.AdminTokenFile, Insecure: c.AdminInsecure,
		Hosts: c.AdminHosts, StateDir: c.StateDir}
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
	d.Init(d.Stderr, cfg.LogLevel)
	cfg.warnSecrets(d.Log)
	access, err := d.ReadAdminAccess(cfg.admin())
	if err != nil {
		return err
	}
	d.SetAdminAccess(access)
	d.file = cfg
	d.owner, d.stopped = daemon.NewOwner(errStopping), make(chan struct{})
	d.NewChanges("tiergate_keyserver_config_changes_total",
		"Reloads of keyserverd's configuration (SIGHUP, POST /reload), by result (ok, error).")
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
	fmt.Fprintf(out, "listen %s; admin %s (%s); %d client rules\n", cfg.Server.Addr, cfg.AdminListen, cfg.admin().TokenSummary(), len(cfg.Server.Clients))
	if nc := cfg.Control; nc != nil {
		fmt.Fprintf(out, "a node of the control plane: node %s at %s\n", nc.Node, strings.Join(nc.EtcdEndpoints, ","))
	}
	if err := listKeys(out, backends); err != nil {
		return err
	}
	fmt.Fprintln(out, "configuration OK")
	return nil
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
	defer d.owner.Close()

	tlsCfg, err := d.file.serverTLS()
	if err != nil {
		return err
	}
	backends, err := openBackends(d.file, d.Log, false)
	if err != nil {
		return err
	}
	cfg := d.file.Server
	cfg.TLS, cfg.Backends, cfg.Registerer, cfg.Logger = tlsCfg, backends, d.Reg, d.Log
	d.srv, err = keyserver.NewServer(cfg)
	if err != nil {
		closeAll(backends)
		return err
	}
	d.Reg.MustRegister(extractableCollector{d.srv})
	if err := d.ServeAdmin(d.file.AdminListen, d.adminHandler(), "/status"); err != nil {
		d.srv.Shutdown(context.Background())
		closeAll(backends)
		return err
	}
	if err := d.srv.Start(); err != nil {
		d.CloseAdmin()
		d.srv.Shutdown(context.Background())
		closeAll(backends)
		return err
	}
	stopControl, err := d.startControl()
	if err != nil {
		d.CloseAdmin()
		d.srv.Shutdown(context.Background())
		closeAll(backends)
		return err
	}
	defer stopControl()
	d.MarkServing()
	for {
		select {
		case <-ctx.Done():
			return d.stop(stopControl)
		case <-hup:
			if err := d.reload(); err != nil {
				d.Log.Error("reload failed; the running configuration stays", "err", err)
			}
		case op := <-d.owner.Ops():
			op()
		}
	}
}

// stop is the lame-duck stop: unhealthy for lame_duck, then the node leaves the
// control plane (stopControl), the keyserver drains for up to shutdown_grace, then
// the admin endpoint and the backends close.
func (d *Daemon) stop(stopControl func()) error {
	d.Lame.Delay, d.Lame.Grace = d.file.LameDuck.D(), d.file.ShutdownGrace.D()
	d.Log.Info("stopping", "lame_duck", d.Lame.Delay, "grace", d.Lame.Grace)
	err := d.Lame.Stop(context.Background(), func(ctx context.Context) error {
		stopControl()
		err := d.srv.Shutdown(ctx)
		d.CloseAdmin()
		return err
	})
	close(d.stopped)
	d.retired.Wait()
	closeAll(d.srv.Backends())
	d.Log.Info("stopped")
	return err
}

// do runs op on Run's goroutine and waits for it; once Run has stopped, it returns
// errStopping instead.
func (d *Daemon) do(op func()) error { return d.owner.Do(op) }

var errStopping = errors.New("keyserverd is stopping")

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

// fixedChanges returns a daemon.RestartError naming the start-time settings that
// differ between cur and next, or nil.
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
	diff = append(diff, cur.admin().FixedChanges(next.admin())...)
	if !reflect.DeepEqual(cur.Control, next.Control) {
		diff = append(diff, "control")
	}
	return daemon.Restart("keyserverd", diff)
}

// reload re-reads the configuration file and applies what may change at runtime
// (clients, the key backends, log level, admin token, lame_duck, shutdown_grace),
// all of it or, when any part fails, none. New backends are opened only when the
// pkcs11 or software section changed; the ones they replace close after
// retireDelay. It runs on Run's goroutine.
func (d *Daemon) reload() (err error) {
	defer func() { d.CountChange("reload", err) }()
	cfg, err := LoadConfig(d.Path)
	if err != nil {
		return err
	}
	if err := fixedChanges(d.file, cfg); err != nil {
		return err
	}
	access, err := d.ReadAdminAccess(cfg.admin())
	if err != nil {
		return err
	}
	cfg.warnSecrets(d.Log)
	var backends []backend.Backend
	if !reflect.DeepEqual(cfg.PKCS11, d.file.PKCS11) || !reflect.DeepEqual(cfg.Software, d.file.Software) {
		if backends, err = openBackends(cfg, d.Log, false); err != nil {
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
	d.SetLevel(cfg.LogLevel)
	d.SetAdminAccess(access)
	d.file = cfg
	d.Log.Info("reloaded", "config", d.Path, "client_rules", len(cfg.Server.Clients), "keys", len(d.srv.Keys()), "backends_reopened", backends != nil)
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

// startControl starts the node agent when the file has a control section: it
// reports keyserverd in the store with its role and listen address, and accepts
// every snapshot, of which keyserverd uses nothing yet. The returned stop ends it
// (its status key goes) and waits; it is a no-op without a control section.
func (d *Daemon) startControl() (stop func(), err error) {
	nc := d.file.Control
	if nc == nil {
		return func() {}, nil
	}
	metrics := "" // the admin endpoint's, whose /metrics the dashboard scrapes
	if aa := d.AdminAddr(); aa != nil {
		metrics = aa.String()
	}
	a, err := agent.New(agent.Config{
		Open:      nc.OpenWith(d.Log),
		Node:      nc.Node,
		Role:      "keyserverd",
		Address:   d.srv.Addr().String(),
		Metrics:   metrics,
		CacheFile: nc.CacheFile,
		// Nothing of the cluster configuration is keyserverd's yet.
		Apply: func(_ context.Context, _ *model.Snapshot, rev int64) error {
			d.Log.Debug("control plane revision accepted", "revision", rev)
			return nil
		},
		Logger:     d.Log,
		Registerer: d.Reg,
	})
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	d.control.Store(a)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx)
	}()
	d.Log.Info("a node of the control plane", "node", nc.Node, "etcd_endpoints", nc.EtcdEndpoints)
	return func() {
		cancel()
		<-done
	}, nil
}
