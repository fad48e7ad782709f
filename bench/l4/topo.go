package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tiergate/tiergate/internal/nsenter"
	"github.com/tiergate/tiergate/l4/packet"
)

// nsPrefix starts the name of every namespace this program makes; the process ID
// follows, so a later run can tell a crashed run's namespaces and remove them.
const nsPrefix = "tgl4b"

// vethCli is the client end's address in the veth measurement: the LD's external
// gateway, through which the flows' clients (198.19.0.0/16) come. The members'
// addresses are all on the sink end, with prefix length vethSinkBits, so its kernel
// answers for them.
var vethCli = netip.MustParsePrefix("198.18.2.2/24")

const vethSinkBits = 24

// vethFlows is how many flows the veth client cycles through.
const vethFlows = 4096

// Interface names inside the namespaces.
const (
	ifCli  = "cli0"
	ifSink = "snk0"
)

// topo is the veth measurement's network: two namespaces joined to this one by two
// veth pairs,
//
//	client ns (cli0) ── (ext) this namespace (int) ── (snk0) sink ns
//
// The ends in this namespace are the ones net_af_packet binds: the EAL opens its
// sockets on a thread the DPDK binding starts itself, in the process's namespace. They have no addresses, no IPv6, and IPv4
// forwarding off, so the kernel routes nothing that arrives on them: whatever the
// client sends reaches only the LD, and the LD's frames reach only the sink. close
// deletes the namespaces, and with them the pairs.
type topo struct {
	cli, sink string // namespace names
	ext, int  string // the LD's ends, in this namespace
	cliMAC    packet.MAC
	sinkMAC   packet.MAC
}

// newTopo builds the network.
func newTopo() (t *topo, err error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("the veth measurement needs ip (Debian package iproute2; `make deps` installs it)")
	}
	base := fmt.Sprintf("%s%d", nsPrefix, os.Getpid())
	t = &topo{cli: base + "-cli", sink: base + "-sink", ext: base + "e", int: base + "i"}
	defer func() {
		if err != nil {
			t.close()
			t = nil
		}
	}()
	for _, ns := range []string{t.cli, t.sink} {
		if err := addNetns(ns); err != nil {
			return t, err
		}
	}
	if err := ipCmd("link", "add", t.ext, "type", "veth", "peer", "name", ifCli, "netns", t.cli); err != nil {
		return t, err
	}
	if err := ipCmd("link", "add", t.int, "type", "veth", "peer", "name", ifSink, "netns", t.sink); err != nil {
		return t, err
	}
	for _, dev := range []string{t.ext, t.int} {
		for _, f := range []string{"ipv6/conf/" + dev + "/disable_ipv6=1", "ipv4/conf/" + dev + "/forwarding=0"} {
			k, v, _ := strings.Cut(f, "=")
			if err := os.WriteFile("/proc/sys/net/"+k, []byte(v), 0); err != nil {
				return t, fmt.Errorf("setting %s: %w", k, err)
			}
		}
	}
	steps := [][]string{{"-n", t.cli, "addr", "add", vethCli.String(), "dev", ifCli}}
	for _, a := range memberAddr {
		steps = append(steps, []string{"-n", t.sink, "addr", "add", netip.PrefixFrom(a, vethSinkBits).String(), "dev", ifSink})
	}
	steps = append(steps,
		[]string{"link", "set", t.ext, "up"},
		[]string{"link", "set", t.int, "up"},
		[]string{"-n", t.cli, "link", "set", ifCli, "up"},
		[]string{"-n", t.sink, "link", "set", ifSink, "up"},
	)
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return t, err
		}
	}
	if t.cliMAC, err = linkMAC(t.cli, ifCli); err != nil {
		return t, err
	}
	if t.sinkMAC, err = linkMAC(t.sink, ifSink); err != nil {
		return t, err
	}
	return t, nil
}

// close deletes the veth pairs and the namespaces. Sockets still open in a namespace
// keep it alive, unnamed, until they close.
func (t *topo) close() {
	for _, dev := range []string{t.ext, t.int} {
		_ = exec.Command("ip", "link", "del", dev).Run()
	}
	for _, ns := range []string{t.cli, t.sink} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// nsPath is the bind mount of namespace ns.
func nsPath(ns string) string { return filepath.Join("/run/netns", ns) }

// removeStale deletes the namespaces and EAL run directories left by runs of this
// program whose process is gone (killed before it could clean up).
func removeStale() {
	dead := func(name, sep string) bool {
		rest, ok := strings.CutPrefix(name, nsPrefix)
		if !ok {
			return false
		}
		if sep != "" {
			if rest, _, ok = strings.Cut(rest, sep); !ok {
				return false
			}
		}
		pid, err := strconv.Atoi(rest)
		if err != nil || pid == os.Getpid() {
			return false
		}
		_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
		return errors.Is(err, os.ErrNotExist)
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && dead(f[0], "-") {
				_ = exec.Command("ip", "netns", "del", f[0]).Run()
			}
		}
	}
	if ifs, err := net.Interfaces(); err == nil {
		for _, ifi := range ifs {
			if n := ifi.Name; len(n) > 1 && (n[len(n)-1] == 'e' || n[len(n)-1] == 'i') && dead(n[:len(n)-1], "") {
				_ = exec.Command("ip", "link", "del", n).Run()
			}
		}
	}
	if ents, err := os.ReadDir(ealRunBase); err == nil {
		for _, e := range ents {
			if dead(e.Name(), "") {
				_ = os.RemoveAll(filepath.Join(ealRunBase, e.Name()))
			}
		}
	}
}

// ealRunBase holds the EAL's run directories, one per file prefix.
const ealRunBase = "/var/run/dpdk"

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func nsSysctl(ns, kv string) error {
	k, v, _ := strings.Cut(kv, "=")
	return inNetns(nsPath(ns), func() error {
		// /proc/sys/net shows the namespace of the thread that opens it.
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(k, ".", "/"), []byte(v), 0)
	})
}

// linkMAC returns the MAC of dev in namespace ns.
func linkMAC(ns, dev string) (packet.MAC, error) {
	var links []struct {
		Address string `json:"address"`
	}
	if err := ipJSON(&links, "-n", ns, "-j", "link", "show", "dev", dev); err != nil {
		return packet.MAC{}, err
	}
	if len(links) != 1 {
		return packet.MAC{}, fmt.Errorf("ip link show %s in %s: %d links", dev, ns, len(links))
	}
	mac, err := packet.ParseMAC(links[0].Address)
	if err != nil {
		return packet.MAC{}, fmt.Errorf("the MAC of %s in %s: %w", dev, ns, err)
	}
	return mac, nil
}

func ipJSON(v any, args ...string) error {
	out, err := exec.Command("ip", args...).Output()
	if err != nil {
		return fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// inNetns runs f on an OS thread that has entered the network namespace at path, then
// returns the thread to its own namespace. If it cannot, the thread is left locked and
// ends with its goroutine, so no other goroutine runs in the wrong namespace. Sockets
// f opens stay in the namespace.
func inNetns(path string, f func() error) error { return nsenter.Do(path, f) }

// vethResult is the end-to-end measurement through veth.
type vethResult struct {
	Sent       uint64            `json:"client_sent"`
	Refused    uint64            `json:"client_refused"`
	Seconds    float64           `json:"seconds"`
	Received   uint64            `json:"ld_received"`
	Forwarded  uint64            `json:"ld_forwarded"`
	SinkRx     uint64            `json:"sink_received"`
	RxMissed   uint64            `json:"ld_rx_missed"`
	SentKpps   float64           `json:"client_kpps"`
	Kpps       float64           `json:"forwarded_kpps"`
	OtherCount map[string]uint64 `json:"other_counts,omitempty"`
}

// addNetns makes the namespace ns, IPv6 off, its loopback up.
func addNetns(ns string) error {
	if err := ipCmd("netns", "add", ns); err != nil {
		return err
	}
	for _, kv := range []string{"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"} {
		if err := nsSysctl(ns, kv); err != nil {
			return err
		}
	}
	return ipCmd("-n", ns, "link", "set", "lo", "up")
}
