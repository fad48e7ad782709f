package integration

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// demoResult matches one result line of tgdemo: protocol, serving node, client address.
var demoResult = regexp.MustCompile(`(?m)^#\d+ .* (HTTP/\d\.\d) .* 200  served by (\S+) \((\S+)\), client (\S+)$`)

// demoServed returns, per protocol, the nodes that served a request and the client
// addresses they reported.
func demoServed(out string) (nodes, clients map[string]map[string]int) {
	nodes, clients = map[string]map[string]int{}, map[string]map[string]int{}
	for _, m := range demoResult.FindAllStringSubmatch(out, -1) {
		if nodes[m[1]] == nil {
			nodes[m[1]], clients[m[1]] = map[string]int{}, map[string]int{}
		}
		nodes[m[1]][m[2]]++
		clients[m[1]][m[4]]++
	}
	return nodes, clients
}

func checkDemoOutput(t *testing.T, name, out string, want []string) {
	t.Helper()
	m := regexp.MustCompile(`(\d+) requests completed, 0 failed`).FindStringSubmatch(out)
	if m == nil || m[1] == "0" || strings.Contains(out, "FAILED") {
		t.Fatalf("%s: no successful requests, or some failed:\n%s", name, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: output lacks %q:\n%s", name, w, out)
		}
	}
}

// TestDemo runs what `make demo` runs, twice on one state directory: first with the L4
// tier in network namespaces (creating the token and importing the key), then on the
// loopback interface with -l4=off (reusing them).
func TestDemo(t *testing.T) {
	requireSoftHSM(t)
	bin := binaries(t)
	dir := t.TempDir()

	t.Run("l4", func(t *testing.T) {
		testenv.RequireRoot(t)
		testenv.RequireCommand(t, "ip", "iproute2")
		testenv.RequireCommand(t, "ethtool", "ethtool")
		testenv.RequireCommand(t, "sysctl", "procps")
		testenv.RequireFile(t, "/usr/include/dpdk/rte_eal.h", "libdpdk-dev")
		var r [3]byte
		rand.Read(r[:])
		prefix := "tgdt" + hex.EncodeToString(r[:]) + "-"
		leftovers := func() []string {
			out, _ := exec.Command("ip", "netns", "list").Output()
			var names []string
			for _, f := range strings.Fields(string(out)) {
				if strings.HasPrefix(f, prefix) {
					names = append(names, f)
				}
			}
			return names
		}
		t.Cleanup(func() {
			for _, n := range leftovers() {
				exec.Command("ip", "netns", "del", n).Run()
			}
		})

		// What a killed run leaves: a namespace with a link in it and a process inside.
		stale := prefix + "ld"
		if out, err := exec.Command("ip", "netns", "add", stale).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v: %s", err, out)
		}
		if out, err := exec.Command("ip", "-n", stale, "link", "add", "x0", "type", "veth", "peer", "name", "i0").CombinedOutput(); err != nil {
			t.Fatalf("ip link add: %v: %s", err, out)
		}
		sleeper := exec.Command("ip", "netns", "exec", stale, "sleep", "300")
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		sleeperDone := make(chan error, 1)
		go func() { sleeperDone <- sleeper.Wait() }()
		t.Cleanup(func() { sleeper.Process.Kill() })

		start := time.Now()
		out, err := exec.Command(filepath.Join(bin, "tgdemo"), "-dir", dir, "-bin", bin, "-l4", "on", "-netns-prefix", prefix,
			"-duration", "15s", "-interval", "50ms", "-api", freePort(t), "-prometheus", freePort(t)).CombinedOutput()
		s := string(out)
		if err != nil {
			t.Fatalf("tgdemo -l4 on: %v\n%s", err, s)
		}
		t.Logf("tgdemo -l4 on ran %v", time.Since(start).Round(time.Millisecond))
		checkDemoOutput(t, "l4", s, []string{
			"removing network namespaces left by an earlier run: " + stale,
			"l4d                 " + prefix + "lda: pid ", "router              " + prefix + "rt 198.18.0.1, bird2",
			"one multipath route for 203.0.113.10 via both LDs", "lose an LD, keep the connections:",
			"ip netns exec " + prefix + "lda curl -s -H \"$T\" 127.0.0.1:9180/bgp",
			"$ tgctl cert upload --name demo-site", "l4-pools/l7 created", ": 5 applied, 0 refused, 0 pending, 0 lost",
			"try/drain-l7a.yaml   (l7a drained",
			"l4d-lda-state/admin.token",
			"stop                Ctrl-C",
			"lda: l7a ", "ldb: l7a ", // the per-member summary of each LD
			"router: 203.0.113.10 via lda 198.18.0.2, ldb 198.18.0.3",
			"dashboard (/ui)     http://", "prometheus          http://", "prometheus stopped",
			"l4d lda stopped", "l4d ldb stopped", "bird stopped", "l7d l7a stopped", "l7d l7b stopped", "keyserverd stopped", "controld stopped",
			"network namespaces " + prefix + "* removed",
		})
		select {
		case <-sleeperDone:
		case <-time.After(5 * time.Second):
			t.Error("the process left in a stale namespace still runs")
		}
		if left := leftovers(); len(left) > 0 {
			t.Errorf("namespaces left after the demo: %v", left)
		}
		nodes, clients := demoServed(s)
		for _, proto := range []string{"HTTP/1.1", "HTTP/2.0", "HTTP/3.0"} {
			if nodes[proto]["l7a"] == 0 || nodes[proto]["l7b"] == 0 {
				t.Errorf("%s through the VIP: served by %v, want both l7a and l7b", proto, nodes[proto])
			}
			if len(clients[proto]) != 1 || clients[proto]["198.18.2.10"] == 0 {
				t.Errorf("%s through the VIP: the backend saw clients %v, want only the client behind the router, 198.18.2.10", proto, clients[proto])
			}
		}
		if t.Failed() {
			t.Logf("output:\n%s", s)
		}
	})

	t.Run("loopback", func(t *testing.T) {
		out, err := exec.Command(filepath.Join(bin, "tgdemo"), "-dir", dir, "-bin", bin, "-l4", "off", "-duration", "6s",
			"-interval", "100ms", "-keyserver", freePort(t), "-metrics", freePort(t), "-l7", freePort(t), "-l7-admin", freePort(t), "-api", freePort(t), "-prometheus", freePort(t)).CombinedOutput()
		s := string(out)
		if err != nil {
			t.Fatalf("tgdemo -l4 off: %v\n%s", err, s)
		}
		checkDemoOutput(t, "loopback", s, []string{
			"metrics             keyserverd http://", "stop                Ctrl-C", "HTTP/1.1 TLS 1.3",
			"dashboard (/ui)     http://", "prometheus          http://", "prometheus stopped",
			"l7d stopped", "keyserverd stopped", "controld stopped", ": 2 applied, 0 refused, 0 pending, 0 lost",
		})
		nodes, clients := demoServed(s)
		for _, proto := range []string{"HTTP/1.1", "HTTP/2.0", "HTTP/3.0"} {
			if nodes[proto]["l7d"] == 0 || clients[proto]["127.0.0.1"] == 0 {
				t.Errorf("%s: served by %v for %v, want l7d for 127.0.0.1:\n%s", proto, nodes[proto], clients[proto], s)
			}
		}
		if strings.Contains(s, "namespaces") {
			t.Errorf("-l4 off touched network namespaces:\n%s", s)
		}
	})
	if _, err := os.Stat(filepath.Join(dir, "softhsm")); err != nil {
		t.Errorf("state directory: %v", err)
	}
}
