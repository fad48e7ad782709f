package demo

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/internal/nsenter"
)

// netnsDir is where iproute2 keeps the bind mounts of named network namespaces.
const netnsDir = "/run/netns"

// netNS is a named network namespace of the demo, created with `ip netns add`. A nil
// *netNS is the host's own namespace: commands and functions run where tgdemo runs.
type netNS struct{ name string }

// newNetNS creates the namespace name and brings its loopback up.
func newNetNS(name string) (*netNS, error) {
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("creating network namespace %s: %v: %s", name, err, trimOut(out))
	}
	ns := &netNS{name: name}
	if err := ns.run("ip", "link", "set", "lo", "up"); err != nil {
		removeNetNS(name)
		return nil, err
	}
	return ns, nil
}

// String is the namespace's name, or "host".
func (ns *netNS) String() string {
	if ns == nil {
		return "host"
	}
	return ns.name
}

// command returns a command running name with args inside the namespace (through `ip
// netns exec`, which execs it: the process's pid is the command's).
func (ns *netNS) command(name string, args ...string) *exec.Cmd {
	if ns == nil {
		return exec.Command(name, args...)
	}
	return exec.Command("ip", append([]string{"netns", "exec", ns.name, name}, args...)...)
}

// run runs args[0] with args[1:] inside the namespace; its error carries the output.
func (ns *netNS) run(args ...string) error {
	if len(args) == 0 {
		return errors.New("running nothing")
	}
	out, err := ns.command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("running %q in %s: %v: %s", strings.Join(args, " "), ns, err, trimOut(out))
	}
	return nil
}

// do runs f on an OS thread that has entered the namespace and returns f's error.
// Sockets that f opens belong to the namespace and stay there; goroutines f starts run
// in the host's namespace. The thread goes back to its namespace afterwards, or is
// discarded by the runtime when it cannot.
func (ns *netNS) do(f func() error) error {
	if ns == nil {
		return f()
	}
	return nsenter.Do(filepath.Join(netnsDir, ns.name), f)
}

// listNetNS returns the named network namespaces whose names start with prefix.
func listNetNS(prefix string) []string {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// netNSPids returns the processes running in namespace name, tgdemo itself excepted.
func netNSPids(name string) []int {
	out, err := exec.Command("ip", "netns", "pids", name).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// netnsGrace is how long what runs in a namespace being removed has between SIGTERM
// and SIGKILL.
var netnsGrace = 5 * time.Second

// removeNetNS stops what still runs in the namespaces (SIGTERM, then SIGKILL after
// netnsGrace), then deletes them with their interfaces; a veth goes with either end's
// namespace. It returns the first deletion error.
func removeNetNS(names ...string) error {
	signalAll := func(sig syscall.Signal) int {
		n := 0
		for _, name := range names {
			for _, pid := range netNSPids(name) {
				if unix.Kill(pid, sig) == nil {
					n++
				}
			}
		}
		return n
	}
	if signalAll(unix.SIGTERM) > 0 {
		for deadline := time.Now().Add(netnsGrace); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if signalAll(0) == 0 {
				break
			}
		}
		for range 10 {
			if signalAll(unix.SIGKILL) == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var first error
	for _, name := range names {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil && first == nil {
			first = fmt.Errorf("deleting network namespace %s: %v: %s", name, err, trimOut(out))
		}
	}
	return first
}

func trimOut(b []byte) string { return strings.TrimSpace(string(b)) }
