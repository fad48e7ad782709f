// Package netns builds throw-away network topologies for tests: named network
// namespaces, veth pairs and bridges between them, and a way to run a command or a Go
// function inside one. Everything a test creates is removed in t.Cleanup, even when the
// test fails, and every name is unique to the test process so tests may run in parallel.
//
// It drives iproute2 (`ip`), so tests using it call testenv.RequireRoot and
// testenv.RequireCommand(t, "ip", "iproute2") first; New does both.
package netns

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/internal/nsenter"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// runDir is where iproute2 keeps the bind mounts of named namespaces.
const runDir = "/run/netns"

// prefix is the part of every namespace name shared by this test process: "tg" and six
// random hex digits.
var prefix = func() string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("netns: reading random name prefix: " + err.Error())
	}
	return "tg" + hex.EncodeToString(b[:])
}()

var seq atomic.Uint32

// NS is a named network namespace owned by one test.
type NS struct {
	t    testing.TB
	name string
}

// New creates a network namespace for t and brings its loopback up. Its name is unique
// to the test process and contains label (which should be short, like "ld" or "l7"), so
// it is recognisable in `ip netns list`. When t ends, every process running in the
// namespace is killed and the namespace is deleted, with the interfaces inside it.
func New(t testing.TB, label string) *NS {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	name := fmt.Sprintf("%s%d-%s", prefix, seq.Add(1), label)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("creating network namespace %s: %v: %s", name, err, trim(out))
	}
	ns := &NS{t: t, name: name}
	t.Cleanup(ns.destroy)
	ns.MustRun("ip", "link", "set", "lo", "up")
	return ns
}

// Name is the namespace's name, as `ip netns` knows it.
func (ns *NS) Name() string { return ns.name }

// Path is the namespace's bind mount, usable with setns(2) or `nsenter --net=`.
func (ns *NS) Path() string { return filepath.Join(runDir, ns.name) }

func (ns *NS) String() string { return ns.name }

// destroy kills what runs in the namespace, then deletes it.
func (ns *NS) destroy() {
	for range 3 {
		if ns.killAll() == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, err := exec.Command("ip", "netns", "del", ns.name).CombinedOutput(); err != nil {
		ns.t.Errorf("deleting network namespace %s: %v: %s", ns.name, err, trim(out))
	}
}

// killAll sends SIGKILL to every process in the namespace but this one, and returns how
// many there were.
func (ns *NS) killAll() int {
	out, err := exec.Command("ip", "netns", "pids", ns.name).Output()
	if err != nil {
		return 0
	}
	n := 0
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid == os.Getpid() {
			continue
		}
		_ = unix.Kill(pid, unix.SIGKILL)
		n++
	}
	return n
}

// Command returns a command that runs name with args inside the namespace (through `ip
// netns exec`). The caller starts and waits for it as for any exec.Cmd; whatever is still
// running in the namespace when the test ends is killed.
func (ns *NS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns.name, name}, args...)...)
}

// Run runs args[0] with args[1:] inside the namespace and returns its combined output,
// with an error that includes the output when it fails.
func (ns *NS) Run(args ...string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("netns: Run without a command")
	}
	out, err := ns.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("running %q in %s: %w: %s", strings.Join(args, " "), ns.name, err, trim(out))
	}
	return string(out), nil
}

// MustRun is Run that fails the test on error.
func (ns *NS) MustRun(args ...string) string {
	ns.t.Helper()
	out, err := ns.Run(args...)
	if err != nil {
		ns.t.Fatal(err)
	}
	return out
}

// Addr assigns cidr (like "198.18.1.1/24" or "2001:db8::1/64") to dev. IPv6 addresses
// skip duplicate address detection, so they are usable at once.
func (ns *NS) Addr(dev, cidr string) {
	ns.t.Helper()
	args := []string{"ip", "addr", "add", cidr, "dev", dev}
	if strings.Contains(cidr, ":") {
		args = append(args, "nodad")
	}
	ns.MustRun(args...)
}

// Up sets dev up.
func (ns *NS) Up(dev string) {
	ns.t.Helper()
	ns.MustRun("ip", "link", "set", dev, "up")
}

// Route runs `ip route <args>` in the namespace, such as Route("add", "default", "via",
// "198.18.1.1").
func (ns *NS) Route(args ...string) {
	ns.t.Helper()
	ns.MustRun(append([]string{"ip", "route"}, args...)...)
}

// Sysctl sets key (like "net.ipv4.ip_forward") to value in the namespace.
func (ns *NS) Sysctl(key, value string) {
	ns.t.Helper()
	ns.MustRun("sysctl", "-q", "-w", key+"="+value)
}

// Do runs f on an OS thread that has entered the namespace, and returns f's error.
// Sockets, TUN devices and netlink handles that f opens belong to the namespace and stay
// there after Do returns; goroutines that f starts run in the test's own namespace. The
// thread returns to the original namespace afterwards (or is discarded if it cannot).
func (ns *NS) Do(f func() error) error { return nsenter.Do(ns.Path(), f) }

// MustDo is Do that fails the test on error.
func (ns *NS) MustDo(f func() error) {
	ns.t.Helper()
	if err := ns.Do(f); err != nil {
		ns.t.Fatal(err)
	}
}

// Listen opens a TCP listener on addr inside the namespace, closed when the test
// ends; it fails the test when it cannot.
func (ns *NS) Listen(addr string) net.Listener {
	ns.t.Helper()
	var ln net.Listener
	ns.MustDo(func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	ns.t.Cleanup(func() { ln.Close() })
	return ln
}

// Veth creates a veth pair with end aName in a and end bName in b, and sets both up. A
// nil namespace means the test process's own one; such an end is deleted in t.Cleanup
// (ends inside an NS go with it), and its name must not collide with the host's.
func Veth(t testing.TB, a *NS, aName string, b *NS, bName string) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	if a == nil && b == nil {
		t.Fatal("netns.Veth: at least one end must be in a test namespace")
	}
	if a == nil { // create from b's side so the pair never exists only in the host
		a, aName, b, bName = b, bName, a, aName
	}
	peer := []string{"peer", "name", bName}
	if b != nil {
		peer = append(peer, "netns", b.name)
	} else {
		// The pair is made inside a: its peer goes to the namespace of this
		// process, the host's.
		peer = append(peer, "netns", strconv.Itoa(os.Getpid()))
	}
	a.MustRun(append([]string{"ip", "link", "add", aName, "type", "veth"}, peer...)...)
	if b == nil {
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", bName).Run() })
		if out, err := exec.Command("ip", "link", "set", bName, "up").CombinedOutput(); err != nil {
			t.Fatalf("setting %s up: %v: %s", bName, err, trim(out))
		}
	} else {
		b.Up(bName)
	}
	a.Up(aName)
}

// Bridge creates bridge name in ns, enslaves the interfaces members (already in ns) to
// it, and sets it up.
func Bridge(t testing.TB, ns *NS, name string, members ...string) {
	t.Helper()
	ns.MustRun("ip", "link", "add", name, "type", "bridge")
	for _, m := range members {
		ns.MustRun("ip", "link", "set", m, "master", name)
	}
	ns.Up(name)
}

func trim(b []byte) string { return strings.TrimSpace(string(b)) }
