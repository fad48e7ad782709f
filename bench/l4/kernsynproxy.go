package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/internal/nsenter"
	"github.com/tiergate/tiergate/testkit/synflood"
)

// The kernel SYN-proxy peer's network: a flood namespace and a proxy namespace joined
// by one veth pair. The proxy end has ksAddr; the spoofed sources come from ksSources,
// routed back through ksGateway, whose neighbour entry is a MAC no interface has
// (ksNoMAC), so the SYN-ACKs cross the veth and are dropped at once on the other side
// as not addressed to it, as a NIC would put them on the wire and forget them.
var (
	ksAddr    = netip.MustParsePrefix("198.18.44.2/24")
	ksGateway = netip.MustParseAddr("198.18.44.1")
	ksSources = netip.MustParsePrefix("198.18.48.0/20")
	ksNoMAC   = "02:00:00:00:44:01"
	ksPort    = uint16(8443)
)

// Interface names of the kernel SYN-proxy network, inside its namespaces.
const (
	ifKFlood = "kfl0"
	ifKProxy = "ksp0"
)

// ksRuleset is the kernel's SYN proxy as the nftables wiki gives it: SYNs to the port
// are not tracked, and what is untracked or invalid there (the SYNs, and the ACKs that
// complete a handshake) goes to the synproxy statement, which answers SYNs with a
// cookie SYN-ACK; other invalid packets are dropped.
var ksRuleset = fmt.Sprintf(`table inet tgbench {
	chain pre {
		type filter hook prerouting priority raw; policy accept;
		tcp dport %[1]d tcp flags syn notrack
	}
	chain in {
		type filter hook input priority filter; policy accept;
		tcp dport %[1]d ct state invalid,untracked counter synproxy mss 1460 wscale 7 timestamp sack-perm
		ct state invalid counter drop
	}
}
`, ksPort)

// kernelSynproxyResult is the kernel peer's measurement.
type kernelSynproxyResult struct {
	// ProxyCPU is the core that received the SYNs (RPS on the proxy's veth end) and
	// so ran the kernel's SYN proxy; FloodCPU the core the flood was sent from.
	ProxyCPU int     `json:"proxy_cpu"`
	FloodCPU int     `json:"flood_cpu"`
	Seconds  float64 `json:"seconds"`
	// FloodSent is the SYNs the flood's socket took during the whole flood, and
	// FloodKpps its rate.
	FloodSent uint64  `json:"flood_sent"`
	FloodKpps float64 `json:"flood_kpps"`
	// In the measured window: SynReceived is /proc/net/stat/synproxy's syn_received
	// (SYNs the synproxy statement handled), SynAcks the packets the proxy's veth end
	// transmitted (the cookie SYN-ACKs), FloodRx those the flood's end received.
	SynReceived uint64 `json:"syn_received"`
	// SynOnProxyCPU is the share of SynReceived counted on ProxyCPU: the SYN proxy
	// ran there (RPS), not on the flood's core.
	SynOnProxyCPU float64 `json:"syn_received_on_proxy_cpu_share"`
	SynAcks       uint64  `json:"synacks_sent"`
	FloodRx       uint64  `json:"flood_end_received"`
	// Softirq, System and Irq are ProxyCPU's time in each state during the window
	// (/proc/stat, tick-sampled), in seconds; BaselineSoftirq its softirq share before
	// the flood, over half a second.
	Softirq         float64 `json:"proxy_cpu_softirq_s"`
	System          float64 `json:"proxy_cpu_system_s"`
	Irq             float64 `json:"proxy_cpu_irq_s"`
	Busy            float64 `json:"proxy_cpu_busy_share"`
	BaselineSoftirq float64 `json:"proxy_cpu_baseline_softirq_share"`
	// KernelCPU is Softirq less the baseline share of the window: the CPU time the
	// SYN proxy's receive path took. MppsPerCore is SynAcks ÷ KernelCPU.
	KernelCPU   float64 `json:"kernel_cpu_s"`
	MppsPerCore float64 `json:"mpps_per_core"`
	// MppsWall is SynAcks ÷ Seconds: what the one core did with the time it had.
	MppsWall float64 `json:"mpps_wall"`
}

// ksTopo is the kernel peer's network.
type ksTopo struct {
	flood, proxy       string // namespace names
	proxyMAC           [6]byte
	floodCPU, proxyCPU int
}

func newKsTopo() (t *ksTopo, err error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, errors.New("the kernel SYN proxy needs nft (Debian package nftables; `make deps` installs it)")
	}
	base := fmt.Sprintf("%s%d", nsPrefix, os.Getpid())
	t = &ksTopo{flood: base + "-kfl", proxy: base + "-ksp"}
	defer func() {
		if err != nil {
			t.close()
			t = nil
		}
	}()
	for _, ns := range []string{t.flood, t.proxy} {
		if err := addNetns(ns); err != nil {
			return t, err
		}
	}
	steps := [][]string{
		{"-n", t.flood, "link", "add", ifKFlood, "type", "veth", "peer", "name", ifKProxy, "netns", t.proxy},
		{"-n", t.proxy, "addr", "add", ksAddr.String(), "dev", ifKProxy},
		{"-n", t.flood, "link", "set", ifKFlood, "up"},
		{"-n", t.proxy, "link", "set", ifKProxy, "up"},
		{"-n", t.proxy, "neigh", "replace", ksGateway.String(), "lladdr", ksNoMAC, "dev", ifKProxy, "nud", "permanent"},
		{"-n", t.proxy, "route", "add", ksSources.String(), "via", ksGateway.String(), "dev", ifKProxy},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return t, err
		}
	}
	nft := exec.Command("ip", "netns", "exec", t.proxy, "nft", "-f", "-")
	nft.Stdin = strings.NewReader(ksRuleset)
	if out, err := nft.CombinedOutput(); err != nil {
		return t, fmt.Errorf("loading the synproxy ruleset: %v: %s", err, strings.TrimSpace(string(out)))
	}
	// With loose tracking off, the ACK completing a handshake is invalid and reaches
	// the synproxy statement (the wiki's first step). Conntrack is loaded by now.
	if err := nsSysctl(t.proxy, "net.netfilter.nf_conntrack_tcp_loose=0"); err != nil {
		return t, err
	}
	if err := nsSysctl(t.proxy, "net.ipv4.tcp_syncookies=1"); err != nil {
		return t, err
	}
	mac, err := linkMAC(t.proxy, ifKProxy)
	if err != nil {
		return t, err
	}
	t.proxyMAC = mac
	return t, nil
}

// setRPS steers what dev receives in namespace ns to the CPUs of mask (RPS): for a
// veth the receive path then runs in that CPU's softirq instead of the sender's.
func setRPS(ns, dev string, mask uint64) error {
	cmd := exec.Command("ip", "netns", "exec", ns, "sh", "-c",
		fmt.Sprintf("echo %x > /sys/class/net/%s/queues/rx-0/rps_cpus", mask, dev))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("setting RPS of %s in %s: %v: %s", dev, ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (t *ksTopo) close() {
	for _, ns := range []string{t.flood, t.proxy} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// cpuTimes is one CPU's line of /proc/stat, in USER_HZ ticks.
type cpuTimes struct {
	user, nice, system, idle, iowait, irq, softirq, steal uint64
}

func (c cpuTimes) busy() uint64 { return c.user + c.nice + c.system + c.irq + c.softirq + c.steal }

// readCPUTimes reads cpu's line of /proc/stat.
func readCPUTimes(cpu int) (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	return parseCPUTimes(string(b), cpu)
}

func parseCPUTimes(stat string, cpu int) (cpuTimes, error) {
	name := "cpu" + strconv.Itoa(cpu)
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != name {
			continue
		}
		var v [8]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("/proc/stat %s: %q: %w", name, f[i+1], err)
			}
			v[i] = n
		}
		return cpuTimes{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}, nil
	}
	return cpuTimes{}, fmt.Errorf("/proc/stat has no %s line", name)
}

// userHZ is the unit of /proc/stat.
const userHZ = 100

func ticks(n uint64) float64 { return float64(n) / userHZ }

// nsCounters are the proxy namespace's counters read at one moment.
type nsCounters struct {
	synReceived uint64 // /proc/net/stat/synproxy syn_received, all CPUs
	synOnProxy  uint64 // the same, on the proxy's CPU
	proxyTx     uint64 // ksp0's transmitted packets
	floodRx     uint64 // kfl0's received packets
}

// readNetDev returns dev's received and transmitted packets from /proc/net/dev text.
func readNetDev(text, dev string) (rx, tx uint64, err error) {
	for _, line := range strings.Split(text, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != dev {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 10 {
			break
		}
		if rx, err = strconv.ParseUint(f[1], 10, 64); err == nil {
			tx, err = strconv.ParseUint(f[9], 10, 64)
		}
		return rx, tx, err
	}
	return 0, 0, fmt.Errorf("/proc/net/dev has no %s", dev)
}

// parseSynproxyStat returns syn_received of each CPU of /proc/net/stat/synproxy (a
// line per possible CPU, in order).
func parseSynproxyStat(text string) ([]uint64, error) {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("/proc/net/stat/synproxy: %q", text)
	}
	head := strings.Fields(lines[0])
	col := -1
	for i, h := range head {
		if h == "syn_received" {
			col = i
		}
	}
	if col < 0 {
		return nil, fmt.Errorf("/proc/net/stat/synproxy has no syn_received column: %q", lines[0])
	}
	var per []uint64
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) <= col {
			return nil, fmt.Errorf("/proc/net/stat/synproxy: short line %q", l)
		}
		n, err := strconv.ParseUint(f[col], 16, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/net/stat/synproxy: %q: %w", f[col], err)
		}
		per = append(per, n)
	}
	return per, nil
}

// counters reads the proxy's and the flood end's counters, each from inside its
// namespace (/proc/thread-self/net is the reading thread's namespace's).
func (t *ksTopo) counters() (c nsCounters, err error) {
	err = nsenter.Do(nsPath(t.proxy), func() error {
		b, err := os.ReadFile("/proc/thread-self/net/stat/synproxy")
		if err != nil {
			return err
		}
		per, err := parseSynproxyStat(string(b))
		if err != nil {
			return err
		}
		for cpu, n := range per {
			c.synReceived += n
			if cpu == t.proxyCPU {
				c.synOnProxy += n
			}
		}
		if b, err = os.ReadFile("/proc/thread-self/net/dev"); err != nil {
			return err
		}
		_, c.proxyTx, err = readNetDev(string(b), ifKProxy)
		return err
	})
	if err != nil {
		return c, fmt.Errorf("reading the proxy's counters: %w", err)
	}
	err = nsenter.Do(nsPath(t.flood), func() error {
		b, err := os.ReadFile("/proc/thread-self/net/dev")
		if err != nil {
			return err
		}
		c.floodRx, _, err = readNetDev(string(b), ifKFlood)
		return err
	})
	if err != nil {
		return c, fmt.Errorf("reading the flood end's counters: %w", err)
	}
	return c, nil
}

// ksSettle is how long the flood runs before the window is measured; the window
// lasts until it holds ksMinCPU of the proxy's CPU time, at most ksMaxWindow.
const (
	ksSettle    = 300 * time.Millisecond
	ksMinCPU    = 100 * time.Millisecond
	ksMaxWindow = 10 * time.Second
)

// openKernelSynproxy builds the kernel peer's network with its SYN proxy, the flood
// sent from CPU 0 and the proxy's receive path steered (RPS) to CPU 1.
func openKernelSynproxy() (*ksTopo, error) {
	if runtime.NumCPU() < 2 {
		return nil, errors.New("the kernel SYN proxy is measured on a core of its own, apart from the flood's: needs 2 CPUs")
	}
	removeStale() // a killed run's namespaces
	t, err := newKsTopo()
	if err != nil {
		return nil, err
	}
	t.floodCPU, t.proxyCPU = 0, 1
	if err := setRPS(t.proxy, ifKProxy, 1<<t.proxyCPU); err != nil {
		t.close()
		return nil, err
	}
	if err := setRPS(t.flood, ifKFlood, 1<<t.floodCPU); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// measureKernelSynproxy builds the kernel peer, measures it once over d and removes it.
func measureKernelSynproxy(ctx context.Context, d time.Duration) (*kernelSynproxyResult, error) {
	t, err := openKernelSynproxy()
	if err != nil {
		return nil, err
	}
	defer t.close()
	return t.measure(ctx, d)
}

// measure floods the kernel's nftables SYN proxy from one core and measures, on the
// other core (where RPS sends the SYNs), the SYN-ACKs it sent and the CPU time it
// took, over d after a settling time.
func (t *ksTopo) measure(ctx context.Context, d time.Duration) (*kernelSynproxyResult, error) {
	res := &kernelSynproxyResult{FloodCPU: t.floodCPU, ProxyCPU: t.proxyCPU}
	// The proxy core's softirq time before the flood.
	b0, err := readCPUTimes(res.ProxyCPU)
	if err != nil {
		return nil, err
	}
	tb := time.Now()
	if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
		return nil, err
	}
	b1, err := readCPUTimes(res.ProxyCPU)
	if err != nil {
		return nil, err
	}
	res.BaselineSoftirq = ticks(b1.softirq-b0.softirq) / time.Since(tb).Seconds()

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type floodDone struct {
		st  synflood.Stats
		err error
	}
	done := make(chan floodDone, 1)
	go func() {
		runtime.LockOSThread() // the thread ends with the goroutine: its affinity goes with it
		var set unix.CPUSet
		set.Set(res.FloodCPU)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			done <- floodDone{err: fmt.Errorf("pinning the flood to CPU %d: %w", res.FloodCPU, err)}
			return
		}
		st, err := synflood.Run(fctx, synflood.Config{
			Iface: ifKFlood, Netns: nsPath(t.flood), DstMAC: t.proxyMAC,
			Sources: ksSources, Dst: netip.AddrPortFrom(ksAddr.Addr(), ksPort),
			Count: synflood.MaxCount, Duration: ksSettle + max(d, ksMaxWindow) + 5*time.Second,
		})
		if errors.Is(err, context.Canceled) && ctx.Err() == nil {
			err = nil
		}
		done <- floodDone{st, err}
	}()
	stop := func() (floodDone, error) {
		cancel()
		select {
		case fd := <-done:
			return fd, fd.err
		case <-time.After(10 * time.Second):
			return floodDone{}, errors.New("the flood did not stop")
		}
	}
	if err := sleepCtx(ctx, ksSettle); err != nil {
		stop()
		return nil, err
	}
	c0, err := t.counters()
	if err != nil {
		stop()
		return nil, err
	}
	p0, err := readCPUTimes(res.ProxyCPU)
	t0 := time.Now()
	if err == nil {
		err = sleepCtx(ctx, d)
	}
	var p1 cpuTimes
	if err == nil {
		p1, err = readCPUTimes(res.ProxyCPU)
	}
	// /proc/stat's softirq time is sampled by the tick: on a loaded machine a short
	// window may hold few samples of the proxy's, or less than the baseline. Measure
	// on, in steps of d, until it holds ksMinCPU of the proxy's net of the baseline
	// (at most ksMaxWindow).
	for err == nil && ticks(p1.softirq-p0.softirq)-res.BaselineSoftirq*time.Since(t0).Seconds() < ksMinCPU.Seconds() &&
		time.Since(t0) < ksMaxWindow {
		if err = sleepCtx(ctx, d); err == nil {
			p1, err = readCPUTimes(res.ProxyCPU)
		}
	}
	el := time.Since(t0)
	var c1 nsCounters
	if err == nil {
		c1, err = t.counters()
	}
	fd, ferr := stop()
	if err = errors.Join(err, ferr); err != nil {
		return nil, err
	}
	res.Seconds = el.Seconds()
	res.FloodSent = fd.st.Sent
	res.FloodKpps = fd.st.Rate() / 1e3
	res.SynReceived = c1.synReceived - c0.synReceived
	if res.SynReceived > 0 {
		res.SynOnProxyCPU = float64(c1.synOnProxy-c0.synOnProxy) / float64(res.SynReceived)
	}
	res.SynAcks = c1.proxyTx - c0.proxyTx
	res.FloodRx = c1.floodRx - c0.floodRx
	res.Softirq = ticks(p1.softirq - p0.softirq)
	res.System = ticks(p1.system - p0.system)
	res.Irq = ticks(p1.irq - p0.irq)
	res.Busy = ticks(p1.busy()-p0.busy()) / res.Seconds
	res.KernelCPU = res.Softirq - res.BaselineSoftirq*res.Seconds
	switch {
	case res.SynAcks == 0 || res.SynReceived == 0:
		return res, fmt.Errorf("the kernel's SYN proxy answered nothing: %d SYNs handled, %d SYN-ACKs sent (%d flood frames sent)",
			res.SynReceived, res.SynAcks, res.FloodSent)
	case res.SynOnProxyCPU < 0.99:
		return res, fmt.Errorf("only %.1f%% of the SYNs were handled on CPU %d, where RPS should steer them all", 100*res.SynOnProxyCPU, res.ProxyCPU)
	case res.KernelCPU <= 0:
		return res, fmt.Errorf("no softirq time on CPU %d while the SYN proxy sent %d SYN-ACKs", res.ProxyCPU, res.SynAcks)
	}
	res.MppsPerCore = float64(res.SynAcks) / res.KernelCPU / 1e6
	res.MppsWall = float64(res.SynAcks) / res.Seconds / 1e6
	return res, nil
}
