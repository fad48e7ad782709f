package l4d

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/l4/dpdk"
	"github.com/tiergate/tiergate/l4/port"
)

// portSet is what opening the devices yields: the datapath's two ports (the same
// one twice when one device serves both sides) and what the daemon needs around
// them.
type portSet struct {
	external, internal port.Port
	// devices are the distinct devices, external first, for /metrics and /healthz.
	devices []device
	// workerInit runs on each worker's locked thread (datapath.Options.WorkerInit).
	workerInit func(worker int) (func(), error)
	// close releases the ports, the pool and DPDK; called once no worker polls.
	close func()
}

// device is a port's link state and counters. *dpdk.Port is one.
type device interface {
	Name() string
	Link() (up bool, speedMbps uint32, err error)
	Stats() (dpdk.Stats, error)
}

// ealArgs returns the EAL arguments for given: `--in-memory` (no hugepage or
// runtime files) is added unless `--in-memory` or `--file-prefix` is there (a prefix
// means the operator wants the runtime directory, for dpdk-proc-info and the like)
// or `--no-huge` or `--legacy-mem` is (EAL refuses those with `--in-memory`), and
// `--file-prefix=l4d-<pid>` unless `--file-prefix` is there, so instances never share
// runtime files; it also returns that prefix, or "" when the operator gave one.
func ealArgs(given []string, pid int) (args []string, prefix string) {
	has := func(flag string) bool {
		return slices.ContainsFunc(given, func(a string) bool { return a == flag || strings.HasPrefix(a, flag+"=") })
	}
	args = slices.Clone(given)
	if !has("--in-memory") && !has("--file-prefix") && !has("--no-huge") && !has("--legacy-mem") {
		args = append(args, "--in-memory")
	}
	if !has("--file-prefix") {
		prefix = fmt.Sprintf("l4d-%d", pid)
		args = append(args, "--file-prefix="+prefix)
	}
	return args, prefix
}

// runtimeDir is where EAL keeps the runtime files of a file prefix (as
// eal_create_runtime_dir does): /var/run/dpdk/<prefix> for root, else under
// $XDG_RUNTIME_DIR or /tmp.
func runtimeDir(prefix string) string {
	dir := "/var/run"
	if os.Getuid() != 0 {
		dir = os.Getenv("XDG_RUNTIME_DIR")
		if dir == "" {
			dir = "/tmp"
		}
	}
	return filepath.Join(dir, "dpdk", prefix)
}

// dataRoom is the mbuf size (headroom included) that holds a frame of the largest
// MTU of the ports in one segment (plus Ethernet and VLAN headers and the FCS).
func dataRoom(cfg *FileConfig) uint {
	mtu := cfg.Ports.External.MTU
	if in := cfg.Ports.Internal; in != nil {
		mtu = max(mtu, in.MTU)
	}
	frame := (mtu + 14 + 4 + 4 + 63) &^ 63
	return max(uint(dpdk.DefaultDataRoom), uint(dpdk.Headroom+frame))
}

// openDPDK initialises the EAL, creates the one mbuf pool and opens the configured
// devices, each with one RX and one TX queue per worker (worker 0 also sends the
// control goroutine's ARP and ND frames), not promiscuous: the LD answers ARP and ND
// with the device's MAC (for net_af_packet, the kernel interface's).
func openDPDK(cfg *FileConfig, log *slog.Logger) (ps *portSet, err error) {
	args, prefix := ealArgs(cfg.DPDK.EALArgs, os.Getpid())
	// A prefix of l4d's own names a runtime directory nobody else uses: remove it
	// when done (with --no-huge, EAL leaves megabytes of files there).
	removeRuntime := func() {
		if prefix != "" {
			os.RemoveAll(runtimeDir(prefix))
		}
	}
	log.Info("initialising DPDK", "eal_args", args)
	if err := dpdk.Init(args); err != nil {
		removeRuntime()
		return nil, err
	}
	var opened []*dpdk.Port
	var pool *dpdk.Mempool
	release := func() {
		for _, p := range slices.Backward(opened) {
			if err := p.Close(); err != nil {
				log.Error("closing port", "port", p.Name(), "err", err)
			}
		}
		if pool != nil {
			pool.Free()
		}
		if err := dpdk.Cleanup(); err != nil {
			log.Error("cleaning up DPDK", "err", err)
		}
		removeRuntime()
	}
	defer func() {
		if err != nil {
			release()
		}
	}()

	type side struct {
		role string
		pf   PortFile
	}
	sides := []side{{"external", cfg.Ports.External}}
	if !cfg.sameDevice() {
		sides = append(sides, side{"internal", *cfg.Ports.Internal})
	}
	p := &cfg.DPDK
	n := p.MbufsPerPort() * len(sides)
	pool, err = dpdk.NewMempool("l4d", uint(n), uint(p.MbufCache), dataRoom(cfg), -1)
	if err != nil {
		return nil, err
	}
	for _, s := range sides {
		id, err := dpdk.PortByName(s.pf.Device)
		if err != nil {
			return nil, fmt.Errorf("ports.%s.device %q: %w (is it given in dpdk.eal_args?)", s.role, s.pf.Device, err)
		}
		dp, err := dpdk.OpenPort(id, s.role, dpdk.PortConfig{
			RxQueues: p.Workers,
			TxQueues: p.Workers,
			RxDesc:   uint16(p.RxDesc),
			TxDesc:   uint16(p.TxDesc),
			MTU:      s.pf.MTU,
		}, pool)
		if err != nil {
			return nil, fmt.Errorf("ports.%s: %w", s.role, err)
		}
		opened = append(opened, dp)
		mac := dp.MAC()
		log.Info("port open", "port", s.role, "device", s.pf.Device, "id", id, "mac", fmt.Sprintf("%x", mac[:]))
	}
	ps = &portSet{
		external: opened[0],
		internal: opened[len(opened)-1],
		workerInit: func(int) (func(), error) {
			if _, err := dpdk.RegisterThread(); err != nil {
				return nil, err
			}
			return dpdk.UnregisterThread, nil
		},
		close: release,
	}
	for _, dp := range opened {
		ps.devices = append(ps.devices, dp)
	}
	return ps, nil
}

var (
	descPortPackets = prometheus.NewDesc("tiergate_l4_port_packets_total",
		"Frames received (rx) and transmitted (tx) by a port, as its driver counts them.", []string{"port", "dir"}, nil)
	descPortBytes = prometheus.NewDesc("tiergate_l4_port_bytes_total",
		"Bytes received (rx) and transmitted (tx) by a port.", []string{"port", "dir"}, nil)
	descPortMissed = prometheus.NewDesc("tiergate_l4_port_missed_total",
		"Frames the device dropped because a receive queue was full (the workers fell behind).", []string{"port"}, nil)
	descPortErrors = prometheus.NewDesc("tiergate_l4_port_errors_total",
		"Erroneous frames received (rx) and frames the device failed to send (tx).", []string{"port", "dir"}, nil)
	descPortNoMbuf = prometheus.NewDesc("tiergate_l4_port_nombuf_total",
		"Receive buffer allocation failures (the mbuf pool ran dry).", []string{"port"}, nil)
	descPortMultiSeg = prometheus.NewDesc("tiergate_l4_port_multiseg_total",
		"Multi-segment frames dropped at receive (larger than one mbuf).", []string{"port"}, nil)
	descPortLink = prometheus.NewDesc("tiergate_l4_port_link_up",
		"1 when the port's link is up, else 0.", []string{"port"}, nil)
)

// portCollector reads the ports' counters at scrape time.
type portCollector struct{ d *Daemon }

func (c *portCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPortPackets, descPortBytes, descPortMissed, descPortErrors,
		descPortNoMbuf, descPortMultiSeg, descPortLink} {
		ch <- d
	}
}

func (c *portCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.d.running.Load() {
		return
	}
	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	for _, dev := range c.d.ports.devices {
		name := dev.Name()
		if up, _, err := dev.Link(); err == nil {
			ch <- prometheus.MustNewConstMetric(descPortLink, prometheus.GaugeValue, b2f(up), name)
		}
		s, err := dev.Stats()
		if err != nil {
			ch <- prometheus.NewInvalidMetric(descPortPackets, err)
			continue
		}
		counter(descPortPackets, s.RxPackets, name, "rx")
		counter(descPortPackets, s.TxPackets, name, "tx")
		counter(descPortBytes, s.RxBytes, name, "rx")
		counter(descPortBytes, s.TxBytes, name, "tx")
		counter(descPortMissed, s.RxMissed, name)
		counter(descPortErrors, s.RxErrors, name, "rx")
		counter(descPortErrors, s.TxErrors, name, "tx")
		counter(descPortNoMbuf, s.RxNoMbuf, name)
		counter(descPortMultiSeg, s.MultiSeg, name)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
