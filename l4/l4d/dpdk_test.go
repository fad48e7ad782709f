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

// requireDPDKBinary builds the l4d binary into dir, or skips the test where it
// cannot run over DPDK.
func requireDPDKBinary(t *testing.T, dir string) string {
	t.Helper()
	testenv.RequireRoot(t)
	goCmd := testenv.RequireCommand(t, "go", "golang")
	if err := exec.Command("pkg-config", "--exists", "libdpdk").Run(); err != nil {
		if testenv.Strict() {
			t.Fatalf("TIERGATE_REQUIRE_ALL=1 and the test needs libdpdk (Debian package libdpdk-dev): %v", err)
		}
		t.Skipf("test needs libdpdk (Debian package libdpdk-dev): %v", err)
	}
	bin := filepath.Join(dir, "l4d")
	build := exec.Command(goCmd, "build", "-o", bin, "github.com/tiergate/tiergate/cmd/l4d")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building l4d: %v\n%s", err, out)
	}
	return bin
}

// l4dProcess is the l4d binary running with a configuration whose state_dir is dir.
type l4dProcess struct {
	t       *testing.T
	cmd     *exec.Cmd
	base    string // the admin endpoint's URL
	authz   string // its Authorization header
	out     *strings.Builder
	exited  chan struct{} // closed after Wait; waitErr is its result
	waitErr error
}

// runL4d runs bin with the configuration at path until the test ends, and waits for
// its admin endpoint (its token generated in dir).
func runL4d(t *testing.T, bin, dir, path string) *l4dProcess {
	t.Helper()
	p := &l4dProcess{t: t, cmd: exec.Command(bin, "run", "-config", path), out: &strings.Builder{}, exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	adminAddr := make(chan string, 1)
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		re := regexp.MustCompile(`msg=admin addr=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.out.WriteString(line + "\n")
			if m := re.FindStringSubmatch(line); m != nil {
				adminAddr <- m[1]
			}
		}
	}()
	go func() {
		<-logDone
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("l4d's log:\n%s", p.out.String())
		}
	})

	select {
	case a := <-adminAddr:
		p.base = "http://" + a
	case <-p.exited:
		t.Fatalf("l4d exited before serving: %v", p.waitErr)
	case <-time.After(60 * time.Second):
		t.Fatal("l4d did not serve its admin endpoint in 60s")
	}
	token, err := os.ReadFile(filepath.Join(dir, "admin.token")) // generated at start
	if err != nil {
		t.Fatal(err)
	}
	p.authz = "Bearer " + strings.TrimSpace(string(token))
	return p
}

// get sends an admin GET and returns the status and body.
func (p *l4dProcess) get(path string) (int, string) {
	p.t.Helper()
	req, _ := http.NewRequest("GET", p.base+path, nil)
	req.Header.Set("Authorization", p.authz)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitHealthy waits until /healthz answers 200.
func (p *l4dProcess) waitHealthy() {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := p.get("/healthz")
		if code == 200 {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("/healthz: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// terminate stops l4d with SIGTERM and checks it stopped cleanly.
func (p *l4dProcess) terminate() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	select {
	case <-p.exited:
		if p.waitErr != nil {
			p.t.Errorf("l4d after SIGTERM: %v", p.waitErr)
		}
	case <-time.After(30 * time.Second):
		p.t.Fatal("l4d did not stop in 30s after SIGTERM")
	}
	if !strings.Contains(p.out.String(), "msg=stopping") {
		p.t.Errorf("no stopping in the log")
	}
	if _, err := os.Stat(runtimeDir(fmt.Sprintf("l4d-%d", p.cmd.Process.Pid))); !errors.Is(err, os.ErrNotExist) {
		p.t.Errorf("EAL runtime directory left behind: %v", err)
	}
}

// TestDPDK runs the l4d binary over DPDK, as a user does: EAL can be initialised only
// once per process, so it runs as a subprocess.
func TestDPDK(t *testing.T) {
	dir := t.TempDir()
	bin := requireDPDKBinary(t, dir)
	path := filepath.Join(dir, "l4d.yaml")
	writeFile(t, path, "state_dir: "+dir+"\n"+dpdkConfig)

	if err := exec.Command(bin, "check", "-config", path).Run(); err != nil {
		t.Fatalf("l4d check: %v", err)
	}
	p := runL4d(t, bin, dir, path)
	p.waitHealthy()

	// The workers poll the ports: net_null's frames are received, counted by the port
	// and dropped by the datapath as unsupported.
	var metrics string
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, metrics = p.get("/metrics")
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
	req, _ := http.NewRequestWithContext(context.Background(), "PUT", p.base+"/rules/dns",
		strings.NewReader(`{"vip": "198.18.0.10", "protocol": "udp", "port": 53, "pool": "l7"}`))
	req.Header.Set("Authorization", p.authz)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Errorf("PUT /rules/dns: %d", resp.StatusCode)
	}
	if _, st := p.get("/status"); !strings.Contains(st, `"name": "dns"`) {
		t.Errorf("/status after PUT /rules/dns:\n%s", st)
	}

	// SIGTERM: a clean stop, and EAL's runtime files gone with it.
	p.terminate()
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
