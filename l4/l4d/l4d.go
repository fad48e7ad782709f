package l4d

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/datapath"
)

const usage = `usage: l4d <command> [flags]

commands:
  run    -config FILE   forward until SIGINT/SIGTERM; SIGHUP or POST /reload reloads
  check  -config FILE   validate the configuration (and the state file), then exit
`

// shutdownTimeout bounds each step of a graceful stop.
const shutdownTimeout = 5 * time.Second

// Main runs l4d with args (without the program name) and returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	cmd := daemon.Command{
		Name: "l4d", Usage: usage, DefaultConfig: "/etc/tiergate/l4d.yaml",
		New: func(path string, stderr io.Writer) daemon.Runner { return &Daemon{Path: path, Stderr: stderr} },
	}
	return cmd.Main(args, stdout, stderr)
}

// Daemon is a running l4d: the DPDK ports, the datapath over them, and the admin
// endpoint that changes the forwarding configuration, built from a configuration
// file that can be reloaded. Base holds the logger, the metrics, the admin endpoint
// and the stop (/healthz unhealthy, lame_duck, then shut down), as in every daemon;
// Serving is closed once Run forwards and serves the admin endpoint.
type Daemon struct {
	// Path is the configuration file. Required.
	Path string
	// Stderr receives logs. Default os.Stderr.
	Stderr io.Writer

	// openPorts opens the devices the configuration names. Default openDPDK; tests
	// put in-memory ports here.
	openPorts func(cfg *FileConfig, log *slog.Logger) (*portSet, error)

	daemon.Base

	// One goroutine, the owner, makes every change of the configuration: admin API
	// changes, reloads (SIGHUP, POST /reload) queue to it as closures (do) and run one
	// after the other. It alone writes file and fwd, once Run has started it; what
	// others read, it publishes as an immutable snapshot, cur.
	owner *daemon.Owner
	file  *FileConfig             // the file in force; its start-time sections never change
	fwd   Forwarding              // the forwarding configuration in force
	cur   atomic.Pointer[inForce] // file and fwd, for readers other than the owner

	ports   *portSet
	dist    *datapath.Distributor
	running atomic.Bool

	// control is the control plane's agent and what it applied, with a control
	// section.
	control controlState

	// bgp is the BGP speaker and its announce gates, with a bgp section (bgp.go).
	bgp bgpState

	// sync is session sync with the other LDs, with a sync section (sync.go).
	sync syncState
}

// inForce is the configuration in force as the owner publishes it; neither it nor
// what it points to is modified once published.
type inForce struct {
	file *FileConfig
	fwd  Forwarding
}

// setInForce makes file and fwd the configuration in force and publishes them. Only
// the owner calls it, and setup before the owner starts.
func (d *Daemon) setInForce(file *FileConfig, fwd Forwarding) {
	d.file, d.fwd = file, fwd
	d.cur.Store(&inForce{file: file, fwd: fwd})
}

// current returns the configuration in force, for readers other than the owner.
func (d *Daemon) current() *inForce { return d.cur.Load() }

// errStopped is the error of a change asked of an l4d that has stopped.
var errStopped = errors.New("l4d has stopped")

// do runs op on the owner goroutine, after the changes queued before it, and waits
// for it. Before Run has started the owner it returns daemon.ErrNotStarted, once Run
// has returned errStopped.
func (d *Daemon) do(op func()) error { return d.owner.Do(op) }

// admin returns the admin endpoint's settings of c.
func (c *FileConfig) admin() daemon.AdminConfig {
	return daemon.AdminConfig{Listen: c.AdminListen, TokenFile: c.AdminTokenFile, Insecure: c.AdminInsecure,
		Hosts: c.AdminHosts, StateDir: c.StateDir}
}

// setup reads the configuration (and the state file) and prepares logging and
// metrics.
func (d *Daemon) setup() error {
	if d.Stderr == nil {
		d.Stderr = os.Stderr
	}
	cfg, err := LoadConfig(d.Path)
	if err != nil {
		return err
	}
	d.Init(d.Stderr, cfg.LogLevel)
	fwd, fromState, err := forwardingInForce(cfg)
	if err != nil {
		return err
	}
	if fromState {
		d.Log.Info("forwarding configuration from the state file; the configuration file's tunnel, timeouts, rules and pools are not used",
			"state_file", cfg.StateFile, "rules", len(fwd.Rules), "pools", len(fwd.Pools))
	}
	access, err := d.ReadAdminAccess(cfg.admin())
	if err != nil {
		return err
	}
	d.SetAdminAccess(access)
	d.Lame.Grace = shutdownTimeout
	d.setInForce(cfg, fwd)
	d.NewChanges("tiergate_l4_config_changes_total",
		"Changes of the forwarding configuration, by source (api, reload) and result (ok, error).")
	d.Reg.MustRegister(&portCollector{d: d})
	return nil
}

// forwardingInForce returns the forwarding configuration to start or reload with:
// the state file's when one is configured and exists (with the file's connection
// table capacity, which is fixed at start), else the file's. It is validated.
func forwardingInForce(cfg *FileConfig) (Forwarding, bool, error) {
	if cfg.StateFile == "" {
		return cfg.Forwarding, false, nil
	}
	st, err := readState(cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return cfg.Forwarding, false, nil
	}
	if err != nil {
		return Forwarding{}, false, err
	}
	st.Conntrack.Capacity = cfg.Conntrack.Capacity
	if _, err := cfg.with(st).Datapath(); err != nil {
		return Forwarding{}, false, fmt.Errorf("state file %s (delete it to use the configuration file's rules and pools): %w", cfg.StateFile, err)
	}
	return st, true, nil
}

// with returns a copy of c whose forwarding section is f.
func (c *FileConfig) with(f Forwarding) *FileConfig {
	n := *c
	n.Forwarding = f
	return &n
}

// Check validates the configuration file and, when it exists, the state file,
// without touching DPDK, and reports what would be forwarded.
func (d *Daemon) Check(out io.Writer) error {
	cfg, err := LoadConfig(d.Path)
	if err != nil {
		return err
	}
	fwd, fromState, err := forwardingInForce(cfg)
	if err != nil {
		return err
	}
	src := d.Path
	if fromState {
		src = cfg.StateFile
	}
	ports := cfg.Ports.External.Device
	if !cfg.sameDevice() {
		ports += ", " + cfg.Ports.Internal.Device
	}
	fmt.Fprintf(out, "ports %s; %d workers; %d mbufs per port\n", ports, cfg.DPDK.Workers, cfg.DPDK.MbufsPerPort())
	if b := cfg.bgpSummary(); b != "" {
		fmt.Fprintln(out, b)
	}
	if nc := cfg.Control; nc != nil {
		fmt.Fprintf(out, "rules and pools from the control plane: node %s at %s; last snapshot kept in %s\n",
			nc.Node, strings.Join(nc.EtcdEndpoints, ","), nc.CacheFile)
		if len(cfg.Blacklists) > 0 {
			fmt.Fprintf(out, "blacklists from the control plane: %s; last versions kept in %s\n", strings.Join(cfg.Blacklists, ", "), cfg.BlacklistDir)
		} else {
			fmt.Fprintln(out, "no blacklists")
		}
		fmt.Fprintln(out, "configuration OK")
		return nil
	}
	fmt.Fprintf(out, "%d rules and %d pools from %s\n", len(fwd.Rules), len(fwd.Pools), src)
	for _, r := range fwd.Rules {
		fmt.Fprintf(out, "  %-20s %s %s:%d -> %s\n", r.Name, r.Protocol, r.VIP, r.Port, r.Pool)
	}
	fmt.Fprintln(out, "configuration OK")
	return nil
}

// Run forwards until ctx is done, reloading on SIGHUP and POST /reload; then it
// stops the admin endpoint, the datapath, the ports and DPDK, in that order.
func (d *Daemon) Run(ctx context.Context) error {
	if err := d.setup(); err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	runDone, err := d.start(ctx)
	if err != nil {
		return err
	}
	d.owner = daemon.NewOwner(errStopped)
	d.owner.Start()
	defer d.owner.Close()
	if err := d.ServeAdmin(d.file.AdminListen, d.adminHandler(), "/status"); err != nil {
		d.stop(runDone)
		return err
	}
	// The agent applies through the owner, which runs from here on; it stops before
	// the datapath does.
	stopControl, err := d.startControl(ctx)
	if err != nil {
		d.stop(runDone)
		return err
	}
	defer stopControl()
	stopBGP, err := d.startBGP(ctx)
	if err != nil {
		stopControl()
		d.stop(runDone)
		return err
	}
	defer stopBGP()
	d.MarkServing()
	for {
		select {
		case <-ctx.Done():
			// BGP first: the VIPs are withdrawn and l4d forwards for at least
			// withdraw_delay, while the routers move the traffic away.
			d.Lame.Delay = max(d.current().file.LameDuck.D(), d.withdrawForStop())
			d.Log.Info("stopping", "lame_duck", d.Lame.Delay)
			return d.Lame.Stop(context.Background(), func(context.Context) error {
				stopBGP()
				stopControl()
				return d.stop(runDone)
			})
		case err := <-runDone:
			// The datapath stopped by itself: a worker failed to start.
			d.running.Store(false)
			runDone = nil
			stopBGP()
			stopControl()
			d.stop(nil)
			if err == nil {
				err = errors.New("datapath stopped")
			}
			return err
		case <-hup:
			if err := d.Reload(); err != nil {
				d.Log.Error("reload failed; the running configuration stays", "err", err)
			}
		}
	}
}

// start opens the ports and starts the datapath; runDone receives Run's result.
func (d *Daemon) start(ctx context.Context) (runDone chan error, err error) {
	open := d.openPorts
	if open == nil {
		open = openDPDK
	}
	ports, err := open(d.file, d.Log)
	if err != nil {
		return nil, err
	}
	dcfg, err := d.file.with(d.fwd).Datapath()
	if err != nil {
		ports.close()
		return nil, err
	}
	idle := d.file.DPDK.IdleSleep.D()
	if d.file.DPDK.BusyPoll {
		idle = -1
	}
	dist, err := datapath.NewDistributor(dcfg, datapath.Options{
		External:   ports.external,
		Internal:   ports.internal,
		Workers:    d.file.DPDK.Workers,
		Burst:      d.file.DPDK.Burst,
		IdleSleep:  idle,
		WorkerInit: ports.workerInit,
		HashSeed:   d.file.HashSeed,
		Registerer: d.Reg,
		Logger:     d.Log,
	})
	if err != nil {
		ports.close()
		return nil, err
	}
	if err := d.startSync(ctx, dist); err != nil {
		ports.close()
		return nil, err
	}
	d.ports, d.dist = ports, dist
	runDone = make(chan error, 1)
	d.running.Store(true)
	// Not ctx's end but stop ends the datapath: after SIGTERM it forwards through
	// the BGP withdrawal and the lame-duck delay.
	go func() { runDone <- dist.Run(context.WithoutCancel(ctx)) }()
	d.Log.Info("forwarding", "external", ports.external.Name(), "internal", ports.internal.Name(),
		"workers", d.file.DPDK.Workers, "rules", len(d.fwd.Rules), "pools", len(d.fwd.Pools))
	return runDone, nil
}

// stop closes the admin endpoint (if any), stops the datapath and waits for it
// (unless runDone is nil: it has returned), then closes the ports and DPDK.
func (d *Daemon) stop(runDone chan error) error {
	var errs []error
	d.stopSync()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	d.ShutdownAdmin(sctx)
	cancel()
	stopped := true
	if runDone != nil {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		if err := d.dist.Shutdown(sctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping the datapath: %w", err))
		}
		cancel()
		select {
		case err := <-runDone:
			if err != nil {
				errs = append(errs, err)
			}
		case <-time.After(shutdownTimeout):
			errs = append(errs, errors.New("stopping the datapath: timed out"))
			stopped = false
		}
		d.running.Store(false)
	}
	if stopped {
		// Ports may be closed only once no worker polls them; a stuck worker
		// leaves them to the exit of the process.
		d.ports.close()
	}
	return errors.Join(errs...)
}

// healthy reports whether the datapath runs and every port's link is up, and not
// once l4d has begun to stop.
func (d *Daemon) healthy() error {
	if d.Lame.Stopping() {
		return daemon.ErrShuttingDown
	}
	if !d.running.Load() {
		return errors.New("datapath not running")
	}
	if err := d.controlHealth(); err != nil {
		return err
	}
	for _, dev := range d.ports.devices {
		up, _, err := dev.Link()
		if err != nil {
			return err
		}
		if !up {
			return fmt.Errorf("port %s: link down", dev.Name())
		}
	}
	return nil
}

// fixedChanges returns a daemon.RestartError naming the start-time sections that
// differ between cur and next, or nil.
func fixedChanges(cur, next *FileConfig) error {
	var diff []string
	if !reflect.DeepEqual(cur.DPDK, next.DPDK) {
		diff = append(diff, "dpdk")
	}
	if !reflect.DeepEqual(cur.Ports, next.Ports) {
		diff = append(diff, "ports")
	}
	if cur.HashSeed != next.HashSeed {
		diff = append(diff, "hash_seed")
	}
	diff = append(diff, cur.admin().FixedChanges(next.admin())...)
	if cur.StateFile != next.StateFile {
		diff = append(diff, "state_file")
	}
	if !reflect.DeepEqual(cur.Control, next.Control) {
		diff = append(diff, "control")
	}
	if !slices.Equal(cur.Blacklists, next.Blacklists) {
		diff = append(diff, "blacklists")
	}
	if cur.BlacklistDir != next.BlacklistDir {
		diff = append(diff, "blacklist_dir")
	}
	if cur.Conntrack.Capacity != next.Conntrack.Capacity {
		diff = append(diff, "conntrack.capacity")
	}
	if !reflect.DeepEqual(cur.BGP, next.BGP) {
		diff = append(diff, "bgp")
	}
	if !reflect.DeepEqual(cur.Sync, next.Sync) {
		diff = append(diff, "sync")
	}
	sort.Strings(diff)
	return daemon.Restart("l4d", diff)
}

// Reload re-reads the configuration file (and the state file, when configured and
// present) and applies its forwarding section atomically, and its log level. A file
// that changes a section fixed at start, or that the datapath rejects, changes
// nothing. It runs on the owner goroutine, queued with the admin API's changes.
func (d *Daemon) Reload() error {
	var err error
	if e := d.do(func() { err = d.reload() }); e != nil {
		return e
	}
	return err
}

// reload is Reload on the owner goroutine.
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
	fwd, fromState, err := forwardingInForce(cfg)
	if err != nil {
		return err
	}
	if cfg.Control != nil {
		// The rules and pools in force are the control plane's.
		fwd.Rules, fwd.Pools = d.fwd.Rules, d.fwd.Pools
	}
	dcfg, err := cfg.with(fwd).Datapath()
	if err != nil {
		return err
	}
	if err := d.dist.Apply(dcfg); err != nil {
		return err
	}
	d.SetLevel(cfg.LogLevel)
	d.SetAdminAccess(access)
	d.setInForce(cfg, fwd)
	d.Log.Info("reloaded", "config", d.Path, "from_state_file", fromState, "rules", len(fwd.Rules), "pools", len(fwd.Pools))
	return nil
}
