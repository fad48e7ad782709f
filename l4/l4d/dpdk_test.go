package l4d

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// dpdkConfig runs l4d on two net_null devices: they receive an endless stream of
// zeroed 64-byte frames (dropped as unsupported) and swallow what is sent.
const dpdkConfig = `
admin_listen: "127.0.0.1:0"
dpdk:
  eal_args: [--no-pci, --no-huge, -m, "256", --vdev=net_null0, --vdev=net_null1]
ports:
  external: {device: net_null0, addr: 198.18.0.2/24}
  internal: {device: net_null1, addr: 10.0.0.2/24}
conntrack: {capacity: 10000}
rules: [{name: web, vip: 198.18.0.10, protocol: tcp, port: 443, pool: l7}]
pools:
  l7: {members: [{name: a, address: 10.0.0.11}], health: {type: none}}
`

// TestDPDK runs the l4d binary over DPDK, as a user does: EAL can be initialised only
// once per process, so it runs as a subprocess.
func TestDPDK(t *testing.T) {
	testenv.RequireRoot(t)
	goCmd := testenv.RequireCommand(t, "go", "golang")
	if err := exec.Command("pkg-config", "--exists", "libdpdk").Run(); err != nil {
		if testenv.Strict() {
			t.Fatalf("TIERGATE_REQUIRE_ALL=1 and the test needs libdpdk (Debian package libdpdk-dev): %v", err)
		}
		t.Skipf("test needs libdpdk (Debian package libdpdk-dev): %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "l4d")
	build := exec.Command(goCmd, "build", "-o", bin, "github.com/tiergate/tiergate/cmd/l4d")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building l4d: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "l4d.yaml")
	writeFile(t, path, "state_dir: "+dir+"\n"+dpdkConfig)

	var out strings.Builder
	if err := exec.Command(bin, "check", "-config", path).Run(); err != nil {
		t.Fatalf("l4d check: %v", err)
	}
	cmd := exec.Command(bin, "run", "-config", path)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed after Wait; waitErr is its result
	var waitErr error
	adminAddr := make(chan string, 1)
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		re := regexp.MustCompile(`msg=admin addr=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			out.WriteString(line + "\n")
			if m := re.FindStringSubmatch(line); m != nil {
				adminAddr <- m[1]
			}
		}
	}()
	go func() {
		<-logDone
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("l4d's log:\n%s", out.String())
		}
	})

	var base string
	select {
	case a := <-adminAddr:
		base = "http://" + a
	case <-exited:
		t.Fatalf("l4d exited before serving: %v", waitErr)
	case <-time.After(60 * time.Second):
		t.Fatal("l4d did not serve its admin endpoint in 60s")
	}
	token, err := os.ReadFile(filepath.Join(dir, "admin.token")) // generated at start
	if err != nil {
		t.Fatal(err)
	}
	authz := "Bearer " + strings.TrimSpace(string(token))
	get := func(path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", authz)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := get("/healthz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The workers poll the ports: net_null's frames are received, counted by the port
	// and dropped by the datapath as unsupported.
	var metrics string
	for deadline = time.Now().Add(10 * time.Second); ; {
		_, metrics = get("/metrics")
		if metricValue(metrics, `tiergate_l4_packets_total{dir="in",result="unsupported"}`) > 0 &&
			metricValue(metrics, `tiergate_l4_port_packets_total{dir="rx",port="external"}`) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no packets counted:\n%s", brief(metrics))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, m := range []string{
		`tiergate_l4_packets_total{dir="in",result="forwarded"}`,
		`tiergate_l4_port_packets_total{dir="rx",port="internal"}`,
		`tiergate_l4_port_bytes_total{dir="tx",port="external"}`,
		`tiergate_l4_port_missed_total{port="external"}`,
		`tiergate_l4_port_errors_total{dir="rx",port="internal"}`,
		`tiergate_l4_port_nombuf_total{port="external"}`,
		`tiergate_l4_port_link_up{port="internal"} 1`,
		`tiergate_l4_member_up{member="a",pool="l7"} 1`,
	} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	// A change through the admin API reaches the running datapath.
	req, _ := http.NewRequestWithContext(context.Background(), "PUT", base+"/rules/dns",
		strings.NewReader(`{"vip": "198.18.0.10", "protocol": "udp", "port": 53, "pool": "l7"}`))
	req.Header.Set("Authorization", authz)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Errorf("PUT /rules/dns: %d", resp.StatusCode)
	}
	if _, st := get("/status"); !strings.Contains(st, `"name": "dns"`) {
		t.Errorf("/status after PUT /rules/dns:\n%s", st)
	}

	// SIGTERM: a clean stop, and EAL's runtime files gone with it.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("l4d after SIGTERM: %v", waitErr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("l4d did not stop in 30s after SIGTERM")
	}
	if !strings.Contains(out.String(), "msg=stopping") {
		t.Errorf("no stopping in the log")
	}
	if _, err := os.Stat(runtimeDir(fmt.Sprintf("l4d-%d", cmd.Process.Pid))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("EAL runtime directory left behind: %v", err)
	}
}

// metricValue returns the value of the sample named exactly name (with its labels)
// in a Prometheus text exposition, or -1.
func metricValue(body, name string) float64 {
	for l := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
