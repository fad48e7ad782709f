package l7d

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/certs"
	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/internal/autoprocs"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/internal/gcgoal"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/l7/tunnel"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/clientip"
)

const usage = `usage: l7d <command> [flags]

commands:
  run    -config FILE   serve until SIGINT/SIGTERM; SIGHUP or POST /reload reloads
  check  -config FILE   validate the configuration and load every certificate, then exit
`

// Main runs l7d with args (without the program name) and returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	cmd := daemon.Command{
		Name: "l7d", Usage: usage, DefaultConfig: "/etc/tiergate/l7d.yaml",
		New: func(path string, stderr io.Writer) daemon.Runner { return &Daemon{Path: path, Stderr: stderr} },
	}
	return cmd.Main(args, stdout, stderr)
}

// Daemon is a running l7d: the L7 server, its certificate store, its keyserver client,
// its blacklists and its admin endpoint, built from a configuration file that can be
// reloaded.
type Daemon struct {
	// Path is the configuration file. Required.
	Path string
	// Stderr receives logs. Default os.Stderr.
	Stderr io.Writer

	// Base holds the logger, the metrics registry and the admin endpoint (its
	// listener and its guard: token and Host check), as in every daemon; Serving is
	// closed once Run serves the listeners and the admin endpoint.
	daemon.Base

	// One goroutine, the owner, makes every change of configuration and state: file
	// reloads (SIGHUP, POST /reload) and admin pushes queue to it as closures (do) and
	// run one after the other. It alone touches ctl, and calls the changing methods of
	// store, srv and bl. What the admin API and the data path read, the owner
	// publishes as immutable snapshots: cur here, the certificate set, the L7
	// server's snapshot, each blacklist's Set and where it came from.
	owner *daemon.Owner
	ctl   *control
	cur   atomic.Pointer[FileConfig] // the configuration in force

	lists         *blacklist.Lists
	bl            *blacklist.Store // the lists' files and pushed state
	listenerNames []string         // fixed at start
	ks            *client.Client
	store         *certs.Store
	srv           *l7.Server
	ticketKeys    ticketKeyAge // the age of the newest ticket key in force

	reloads *prometheus.CounterVec
	procs   *autoprocs.Controller // nil unless GOMAXPROCS is sized to the load

	// started is closed once the L7 server serves: at once in the file form, at the
	// first snapshot applied with control.
	started chan struct{}
	// agent is the node agent with control, nil without; set before the first
	// snapshot is applied.
	agent *agent.Agent
	// blsync feeds the lists from the store with control, nil without; set with agent.
	blsync *storeLists
}

// DefaultTokenDir is where l7d generates its admin token (admin.token) when neither
// admin_token_file nor state_dir is set (systemd: StateDirectory=tiergate/l7d).
const DefaultTokenDir = daemon.StateRoot + "/l7d"

// defaultTokenDir is DefaultTokenDir; tests point it elsewhere.
var defaultTokenDir = DefaultTokenDir

// admin returns the admin endpoint's settings of c: the token is generated in
// state_dir, or in defaultTokenDir without one.
func (c *FileConfig) admin() daemon.AdminConfig {
	dir := c.StateDir
	if dir == "" {
		dir = defaultTokenDir
	}
	return daemon.AdminConfig{Listen: c.AdminListen, TokenFile: c.AdminTokenFile, Insecure: c.AdminInsecure,
		Hosts: c.AdminHosts, StateDir: dir}
}

// setProcs applies the gomaxprocs setting: a Controller to run for 0, nil otherwise.
// A GOMAXPROCS environment variable wins.
func setProcs(n int, reg prometheus.Registerer, log *slog.Logger, work func() uint64) (*autoprocs.Controller, error) {
	switch {
	case os.Getenv("GOMAXPROCS") != "" || n == -1:
		return nil, nil
	case n > 0:
		runtime.GOMAXPROCS(n)
		return nil, nil
	}
	return autoprocs.New(autoprocs.Config{Work: work, Registerer: reg, Logger: log})
}

// setup builds the daemon from its configuration file, without serving: Run's first
// half, and Check's (check: a configured admin token file is read, but none is
// generated).
func (d *Daemon) setup(check bool) error {
	if d.Stderr == nil {
		d.Stderr = os.Stderr
	}
	cfg, err := LoadConfig(d.Path)
	if err != nil {
		return err
	}
	d.Init(d.Stderr, cfg.LogLevel)
	ac := cfg.admin()
	if check {
		ac.Insecure = true
	}
	access, err := d.ReadAdminAccess(ac)
	if err != nil {
		return err
	}
	d.SetAdminAccess(access)
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(cfg.GCPercent)
	}
	// The controller runs once d.srv is set (Run), and keeps a P it adds only when
	// the server answers more for it.
	served := func() uint64 { return d.srv.Served() }
	if d.procs, err = setProcs(cfg.GOMAXPROCS, d.Reg, d.Log, served); err != nil {
		return err
	}
	d.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tiergate_l7_reloads_total", Help: "Configuration reloads, by result.",
	}, []string{"result"})
	d.Reg.MustRegister(d.reloads)
	if ks := cfg.KeyServers; ks != nil {
		cc := ks.Config
		if cc.TLS, err = ks.keyserverTLS(); err != nil {
			return err
		}
		cc.Registerer, cc.Logger = d.Reg, d.Log
		if d.ks, err = client.New(cc); err != nil {
			return err
		}
	}
	d.store = certs.NewStore(certs.Options{KeyServer: d.ks, Registerer: d.Reg, Logger: d.Log})
	if cfg.Control == nil {
		if err := d.loadCerts(cfg); err != nil {
			return err
		}
	}
	d.ticketKeys.check(cfg.Certificates, d.Log)
	d.Reg.MustRegister(&d.ticketKeys)
	d.lists = blacklist.NewLists(blacklist.Options{Registerer: d.Reg})
	if err := d.lists.Global().MetricsError(); err != nil {
		return err
	}
	d.bl = blacklist.NewStore(d.lists, cfg.StateDir, d.Log)
	d.started = make(chan struct{})
	c := &control{d: d, file: cfg}
	if cfg.Control == nil {
		for _, l := range cfg.Listeners {
			d.listenerNames = append(d.listenerNames, l.Name)
		}
		lists, err := d.bl.Prepare(cfg.Blacklists, listNames(cfg))
		if err != nil {
			return err
		}
		d.bl.Commit(lists)
	}
	c.setConfig(cfg)
	d.startOwner(c)
	return nil
}

// listNames returns the lists cfg has: the global one, each listener's, and any
// named under blacklists, sorted.
func listNames(cfg *FileConfig) []string {
	names := []string{blacklist.GlobalName}
	for _, l := range cfg.Listeners {
		names = append(names, l.Name)
	}
	for name := range cfg.Blacklists {
		names = append(names, name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// control is the state that the owner goroutine alone reads and writes.
type control struct {
	d   *Daemon
	cfg *FileConfig // the configuration in force
	// file is the configuration file as read; with control, snap is the snapshot in
	// force (nil before the first) and cfg is file with snap (withSnapshot).
	file *FileConfig
	snap *model.Snapshot
}

// startOwner starts the goroutine that owns c; close stops it.
func (d *Daemon) startOwner(c *control) {
	d.ctl = c
	d.owner = daemon.NewOwner(errStopped)
	d.owner.Start()
}

// errStopped is the error of a change asked of a Daemon that is stopping.
var errStopped = errors.New("l7d is stopping")

// errNotStarted is the error of a change asked of a Daemon that has not started.
var errNotStarted = errors.New("l7d has not started")

// do runs op on the owner goroutine, after the changes queued before it, and waits
// for it.
func (d *Daemon) do(op func(*control)) error {
	if d.owner == nil {
		return errNotStarted
	}
	return d.owner.Do(func() { op(d.ctl) })
}

func (c *control) setConfig(cfg *FileConfig) {
	c.cfg = cfg
	c.d.cur.Store(cfg)
}

// current returns the configuration in force, for readers other than the owner.
func (d *Daemon) current() *FileConfig { return d.cur.Load() }

func (d *Daemon) loadCerts(cfg *FileConfig) error {
	if _, err := d.store.Load(cfg.Certificates); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	return nil
}

// l7Config is the L7 server's configuration for cfg, with pol as its Decider and
// AcceptFilter.
func (d *Daemon) l7Config(cfg *FileConfig, pol decider) l7.Config {
	c := l7.Config{
		Routing:         cfg.Routing,
		Decider:         pol,
		AcceptFilter:    pol.p.Accept,
		IsNoCertificate: func(err error) bool { return errors.Is(err, certs.ErrNoCertificate) },
		MaxBodyMemory:   cfg.MaxBodyMemory,
		Registerer:      d.Reg,
		Logger:          d.Log,
	}
	if cfg.Routing == nil {
		c.Backends = cfg.Backends
	}
	for _, l := range cfg.Listeners {
		var wrap func(net.Listener) (net.Listener, error)
		if l.ClientIP.ProxyProtocol {
			res := pol.p.Resolver(l.Name)
			name := l.Name
			wrap = func(ln net.Listener) (net.Listener, error) {
				return clientip.NewListenerWithOptions(ln, res, clientip.Options{Name: name, Registerer: d.Reg, Logger: d.Log})
			}
		}
		c.Listeners = append(c.Listeners, l7.ListenerConfig{Listener: l.Listener, TLS: d.store.TLSConfigFor(l.Name), WrapListener: wrap})
	}
	return c
}

// Check validates the configuration and loads every certificate (reaching the
// keyservers for remote keys), then reports.
func (d *Daemon) Check(out io.Writer) error {
	if err := d.setup(true); err != nil {
		return err
	}
	defer d.close()
	if nc := d.current().Control; nc != nil {
		fmt.Fprintf(out, "listeners, routing and certificates from the control plane: node %s, etcd %v, cache %s\n",
			nc.Node, nc.EtcdEndpoints, nc.CacheFile)
	}
	var served []*certs.Cert
	if set := d.store.Set(); set != nil {
		served = set.Certs()
	}
	for _, c := range served {
		where := "local key"
		if c.Remote {
			where = "remote key " + c.KeyID.Short()
		}
		fmt.Fprintf(out, "%-24s %-6s %-18s expires %s  %v\n", c.Name, c.KeyType, where, c.NotAfter.Format(time.DateOnly), c.Names)
	}
	fmt.Fprintf(out, "admin %s (%s)\n", d.current().AdminListen, d.current().admin().TokenSummary())
	fmt.Fprintln(out, "configuration OK")
	return nil
}

func (d *Daemon) close() {
	if d.owner != nil {
		d.owner.Close()
	}
	if d.ks != nil {
		d.ks.Close()
	}
}

// Run serves until ctx is done, reloading on SIGHUP and POST /reload.
func (d *Daemon) Run(ctx context.Context) error {
	if err := d.setup(false); err != nil {
		return err
	}
	defer d.close()
	cfg := d.current()
	// The tunnel comes first: it puts the VIPs on its device, which listeners may
	// bind to. It goes last, after the requests in flight have been answered through it.
	tunErr := make(chan error, 1)
	if cfg.Tunnel != nil {
		stop, err := d.startTunnel(cfg.Tunnel, tunErr)
		if err != nil {
			return err
		}
		defer stop()
	}
	if cfg.Control == nil {
		if err := d.startFile(cfg); err != nil {
			return err
		}
	} else {
		// The agent's first snapshot applied starts the server (control.start).
		stopAgent, err := d.runAgent(ctx, cfg)
		if err != nil {
			return err
		}
		defer stopAgent()
		d.Log.Info("waiting for the configuration from the control plane", "node", cfg.Control.Node,
			"etcd", cfg.Control.EtcdEndpoints, "cache", cfg.Control.CacheFile)
		select {
		case <-d.started:
		case <-ctx.Done():
			return nil
		case err := <-tunErr:
			return fmt.Errorf("tunnel: %w", err)
		}
		cfg = d.current()
	}
	srv := d.srv
	// The runtime's controllers run until Run returns.
	rctx, stopRuntime := context.WithCancel(context.Background())
	var runtimeWG sync.WaitGroup
	defer func() { stopRuntime(); runtimeWG.Wait() }()
	if d.procs != nil {
		runtimeWG.Go(func() { d.procs.Run(rctx) })
	}
	if gov, err := gcgoal.New(gcgoal.Config{Load: srv.Connections, Registerer: d.Reg, Logger: d.Log}); err != nil {
		d.Log.Warn("heap goal not kept in step with the load", "err", err)
	} else {
		runtimeWG.Go(func() { gov.Run(rctx) })
	}
	for name, a := range srv.Addrs() {
		d.Log.Info("listening", "listener", name, "addr", a.String())
	}
	if err := d.ServeAdmin(cfg.AdminListen, d.adminHandler(), "/blacklists"); err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		srv.Shutdown(sctx)
		cancel()
		return err
	}
	d.MarkServing()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return d.stop(srv)
		case err := <-tunErr:
			d.Log.Error("tunnel endpoint failed; stopping", "err", err)
			sctx, cancel := context.WithTimeout(context.Background(), d.current().ShutdownGrace.D())
			srv.Shutdown(sctx)
			cancel()
			d.CloseAdmin()
			return fmt.Errorf("tunnel: %w", err)
		case <-hup:
			if err := d.Reload(); err != nil {
				d.Log.Error("reload failed; the running configuration stays", "err", err)
			}
		}
	}
}

// startFile starts the L7 server of the file form.
func (d *Daemon) startFile(cfg *FileConfig) error {
	if err := d.bl.PrepareDir(listNames(cfg)); err != nil {
		return err
	}
	pol, err := newDecider(cfg, d.lists, d.Log)
	if err != nil {
		return err
	}
	srv, err := l7.NewServer(d.l7Config(cfg, pol))
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	d.srv = srv
	close(d.started)
	return nil
}

// stop is the lame-duck stop: /healthz answers 503 "shutting down" for lame_duck
// while the listeners go on serving, then the L7 server stops accepting and lets
// in-flight requests finish for up to shutdown_grace, then the admin endpoint closes.
func (d *Daemon) stop(srv *l7.Server) error {
	cfg := d.current()
	d.Lame.Delay, d.Lame.Grace = cfg.LameDuck.D(), cfg.ShutdownGrace.D()
	d.Log.Info("stopping", "lame_duck", d.Lame.Delay, "grace", d.Lame.Grace)
	err := d.Lame.Stop(context.Background(), srv.Shutdown)
	d.CloseAdmin()
	return err
}

// startTunnel creates the tunnel endpoint and runs it in the background; a failure of
// the running endpoint is sent on failed. stop ends it and removes its device and
// rules.
func (d *Daemon) startTunnel(t *tunnel.Config, failed chan<- error) (stop func(), err error) {
	cfg := *t
	cfg.Registerer, cfg.Logger = d.Reg, d.Log
	ep, err := tunnel.New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ep.Run(ctx); err != nil {
			failed <- err
		}
	}()
	return func() {
		cancel()
		<-done
		if err := ep.Close(); err != nil {
			d.Log.Error("closing the tunnel endpoint", "err", err)
		}
	}, nil
}

// Reload re-reads the configuration file and applies it, all of it or nothing: see
// prepare and commitReload. A failure leaves the running configuration in force. It
// runs on the owner goroutine, queued with the admin API's pushes.
func (d *Daemon) Reload() error {
	var err error
	if e := d.do(func(c *control) { err = c.reload() }); e != nil {
		return e
	}
	return err
}

func (c *control) reload() (err error) {
	defer func() { c.d.countReload(err) }()
	next, err := c.prepare()
	if err != nil {
		return err
	}
	c.commitReload(next)
	c.d.Log.Info("reloaded", "config", c.d.Path)
	if c.d.agent != nil {
		c.d.agent.Report()
	}
	return nil
}

// countReload counts a reload, or a snapshot applied, by its result.
func (d *Daemon) countReload(err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	d.reloads.WithLabelValues(result).Inc()
}

// reload is a configuration read, checked and built by prepare, ready for commit:
// nothing of it is in force yet.
type reload struct {
	file   *FileConfig // the file as read; cfg is it with the snapshot in force
	cfg    *FileConfig
	admin  daemon.AdminAccess
	certs  *certs.Prepared
	server *l7.Prepared
	lists  *blacklist.Prepared
}

// prepare does everything of a reload that can fail, and changes nothing: it parses
// and validates the file (routing and client-IP rules included), refuses changes that
// take a restart, reads the admin token, reads the blacklist state files and the files
// that changed, builds the certificate set and ticket keys (reaching the keyservers
// for remote keys) and has the L7 server check its new configuration (listeners,
// routing). With control, the file is read with the snapshot in force; before the
// first one, only the file's own settings are checked, then put in force.
func (c *control) prepare() (*reload, error) {
	file, err := LoadConfig(c.d.Path)
	if err != nil {
		return nil, err
	}
	if !reflect.DeepEqual(file.Control, c.file.Control) {
		return nil, &restartError{"control"}
	}
	cfg := file
	if c.snap != nil {
		if cfg, err = file.withSnapshot(c.snap); err != nil {
			return nil, err
		}
	}
	r, err := c.prepareConfig(cfg)
	if err != nil {
		return nil, err
	}
	r.file = file
	return r, nil
}

// prepareConfig is prepare of a configuration cfg, from the file or the file with a
// snapshot.
func (c *control) prepareConfig(cfg *FileConfig) (*reload, error) {
	d, cur := c.d, c.cfg
	if !sameKeyServers(cfg.KeyServers, cur.KeyServers) {
		return nil, &restartError{"keyservers"}
	}
	if !reflect.DeepEqual(cfg.Tunnel, cur.Tunnel) {
		return nil, &restartError{"tunnel"}
	}
	if fixed := cur.admin().FixedChanges(cfg.admin()); len(fixed) > 0 {
		return nil, &restartError{strings.Join(fixed, ", ")}
	}
	if cfg.GOMAXPROCS != cur.GOMAXPROCS || cfg.GCPercent != cur.GCPercent {
		return nil, &restartError{"gomaxprocs or gc_percent"}
	}
	if err := checkProxyProtocol(cur, cfg); err != nil {
		return nil, err
	}
	r := &reload{file: c.file, cfg: cfg}
	var err error
	if r.admin, err = d.ReadAdminAccess(cfg.admin()); err != nil {
		return nil, err
	}
	if d.srv == nil {
		return r, nil // with control, before the first snapshot: the file's own settings only
	}
	pol, err := newDecider(cfg, d.lists, d.Log)
	if err != nil {
		return nil, err
	}
	if r.lists, err = d.bl.Prepare(cfg.Blacklists, listNames(cfg)); err != nil {
		return nil, err
	}
	if cfg.mem != nil {
		r.certs, err = d.store.PrepareMem(*cfg.mem)
	} else {
		r.certs, _, err = d.store.Prepare(cfg.Certificates)
	}
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	if r.server, err = d.srv.Prepare(d.l7Config(cfg, pol)); err != nil {
		return nil, err
	}
	return r, nil
}

// commitReload puts a prepared reload in force, which cannot fail: the certificates
// and ticket keys, then the L7 server's routing, client-IP rules and blacklist actions
// in one snapshot, then the blacklists that changed, the admin token and hosts, the log
// level and the configuration the admin API reports (lame_duck and shutdown_grace
// with it); then it warns when the newest ticket key is
// older than ticket_key_max_age.
func (c *control) commitReload(r *reload) {
	if r.server != nil {
		c.d.store.Commit(r.certs)
		c.d.srv.Commit(r.server)
		c.d.bl.Commit(r.lists)
	}
	c.file = r.file
	c.d.SetAdminAccess(r.admin)
	c.d.SetLevel(r.cfg.LogLevel)
	c.setConfig(r.cfg)
	c.d.ticketKeys.check(r.cfg.Certificates, c.d.Log)
}

// restartError is a reload refused because it changes what only a restart applies.
type restartError struct{ what string }

func (e *restartError) Error() string { return e.what + " changed: restart l7d to apply" }

// checkProxyProtocol refuses a reload that changes a listener's PROXY protocol
// settings, which are bound to its socket at start.
func checkProxyProtocol(cur, next *FileConfig) error {
	for _, n := range next.Listeners {
		for _, c := range cur.Listeners {
			if c.Name != n.Name {
				continue
			}
			a, b := c.ClientIP, n.ClientIP
			if a.ProxyProtocol != b.ProxyProtocol || a.ProxyTimeout != b.ProxyTimeout || !slices.Equal(a.ProxyTrusted, b.ProxyTrusted) {
				return &restartError{fmt.Sprintf("listener %q: client_ip.proxy_protocol, proxy_trusted or proxy_timeout", n.Name)}
			}
		}
	}
	return nil
}

func sameKeyServers(a, b *KeyServersFile) bool {
	if a == nil || b == nil {
		return a == b
	}
	return reflect.DeepEqual(*a, *b)
}
