package benchkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestStopNginx starts a real nginx with two workers, stops it with StopNginx and
// checks that neither the master nor a worker is left.
func TestStopNginx(t *testing.T) {
	path := testenv.RequireCommand(t, "nginx", "nginx")
	dir := t.TempDir()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nginx.conf")
	body := NginxHTTPTop(dir, 2) + fmt.Sprintf("    server {\n        listen %s;\n        return 200 ok;\n    }\n}\n", addr)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := StartProcess("nginx", path, []string{"-c", conf, "-p", dir + "/", "-e", filepath.Join(dir, NginxErrorLog)}, nil,
		filepath.Join(dir, "stderr.log"), DeathSignal(syscall.SIGTERM))
	if err != nil {
		t.Fatal(err)
	}
	var workers []int
	for end := time.Now().Add(10 * time.Second); len(workers) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			_ = StopNginx(p, nil, 5*time.Second)
			t.Fatalf("nginx has workers %v, want 2; log:\n%s", workers, p.LogTail(20))
		}
		if workers, err = ChildPIDs(p.PID()); err != nil {
			t.Fatal(err)
		}
	}
	if err := StopNginx(p, nil, 10*time.Second); err != nil {
		t.Fatalf("StopNginx: %v", err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("the master still runs")
	}
	for _, pid := range append(workers, p.PID()) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.HasPrefix(string(b), "nginx") {
			t.Errorf("nginx process %d (%q) still runs", pid, b)
		}
	}
}
