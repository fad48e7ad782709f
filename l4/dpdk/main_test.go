//go:build cgo && !nodpdk

package dpdk

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// The EAL can be initialised once per process, so TestMain does it for every test,
// with one virtual device per test that needs one (a closed vdev is gone for good):
//
//   - net_ring0..2: ring devices. Given no arguments, the ring driver creates one
//     ring per queue pair ("ETH_RXTX<q>_<name>") and uses it for both RX and TX queue
//     q, so what a port transmits on queue q it receives on queue q, untouched.
//   - net_null0..2: null devices: RX makes 64-byte packets, TX frees.
//   - net_af_packet0: an AF_PACKET socket on one end of a veth pair made for the run,
//     with nothing attached and no addresses, so nothing leaves it.
//
// TestAFPacket attaches its af_packet device to a second veth pair: two devices on one
// interface would share a fanout group and each see a boot-dependent share of the
// frames (ErrSharedInterface).
var env struct {
	skip     string // why the DPDK tests cannot run here ("" if they can)
	vethDPDK string // the veth end net_af_packet0 binds
	vethPeer string // the other end, for raw sockets
	vethAF   string // the veth end TestAFPacket's device binds
	vethAFP  string // its other end
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	cleanup, err := setUp()
	if err != nil {
		if testenv.Strict() {
			fmt.Fprintf(os.Stderr, "TIERGATE_REQUIRE_ALL=1 and the DPDK tests cannot run: %v\n", err)
			return 1
		}
		env.skip = "DPDK tests cannot run: " + err.Error()
	}
	code := m.Run()
	if cleanup != nil {
		cleanup()
	}
	return code
}

func setUp() (cleanup func(), err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("they need root (run `make test` as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("they need ip (Debian package iproute2; `make deps` installs it)")
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	env.vethDPDK = "tgdp" + hex.EncodeToString(rnd[:])
	env.vethPeer = env.vethDPDK + "p"
	env.vethAF = "tgda" + hex.EncodeToString(rnd[:])
	env.vethAFP = env.vethAF + "p"
	delVeth := func() {
		_ = exec.Command("ip", "link", "del", env.vethDPDK).Run()
		_ = exec.Command("ip", "link", "del", env.vethAF).Run()
	}
	for _, pair := range [][2]string{{env.vethDPDK, env.vethPeer}, {env.vethAF, env.vethAFP}} {
		if out, err := exec.Command("ip", "link", "add", pair[0], "type", "veth", "peer", "name", pair[1]).CombinedOutput(); err != nil {
			delVeth()
			return nil, fmt.Errorf("creating veth %s: %v: %s", pair[0], err, out)
		}
		for _, ifc := range pair {
			// No IPv6 autoconfiguration chatter on the pair.
			_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+ifc+"/disable_ipv6", []byte("1"), 0)
			if out, err := exec.Command("ip", "link", "set", ifc, "up").CombinedOutput(); err != nil {
				delVeth()
				return nil, fmt.Errorf("ip link set %s up: %v: %s", ifc, err, out)
			}
		}
	}
	// --in-memory does not go with --no-huge; --no-shconf keeps EAL from writing its
	// shared config, and the run directory it still makes is removed after the run.
	prefix := fmt.Sprintf("tgdp%d", os.Getpid())
	runDir := filepath.Join("/var/run/dpdk", prefix)
	args := []string{
		"-l", "0", "--no-pci", "--no-huge", "-m", "512", "--no-shconf", "--no-telemetry",
		"--log-level=error", "--file-prefix=" + prefix,
		"--vdev=net_ring0", "--vdev=net_ring1", "--vdev=net_ring2",
		"--vdev=net_null0", "--vdev=net_null1", "--vdev=net_null2",
		"--vdev=net_af_packet0,iface=" + env.vethDPDK,
	}
	if err := Init(args); err != nil {
		delVeth()
		_ = os.RemoveAll(runDir)
		return nil, err
	}
	return func() {
		open.mu.Lock()
		ports := make([]*Port, 0, len(open.ports))
		for _, p := range open.ports {
			ports = append(ports, p)
		}
		open.mu.Unlock()
		for _, p := range ports {
			_ = p.Close()
		}
		if err := Cleanup(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		delVeth()
		_ = os.RemoveAll(runDir)
	}, nil
}

// requireEAL skips t (TestMain already failed the run if strict) unless the EAL is up.
func requireEAL(t testing.TB) {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
}
