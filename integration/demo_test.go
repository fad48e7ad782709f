package integration

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDemo runs what `make demo` runs, twice on one state directory: the first run
// creates the token and imports the key, the second reuses them.
func TestDemo(t *testing.T) {
	requireSoftHSM(t)
	bin := binaries(t)
	dir := t.TempDir()
	done := regexp.MustCompile(`(\d+) requests completed, 0 failed`)
	for run := 1; run <= 2; run++ {
		out, err := exec.Command(filepath.Join(bin, "tgdemo"), "-dir", dir, "-bin", bin, "-duration", "3s",
			"-interval", "100ms", "-keyserver", freePort(t), "-metrics", freePort(t), "-l7", freePort(t), "-l7-admin", freePort(t)).CombinedOutput()
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out)
		}
		s := string(out)
		m := done.FindStringSubmatch(s)
		if m == nil || m[1] == "0" || strings.Contains(s, "FAILED") {
			t.Fatalf("run %d: no successful handshakes:\n%s", run, s)
		}
		for _, want := range []string{"metrics             keyserverd http://", "stop                Ctrl-C", "HTTP/1.1 TLS 1.3", "HTTP/2.0", "HTTP/3.0", "l7d stopped", "keyserverd stopped"} {
			if !strings.Contains(s, want) {
				t.Errorf("run %d: output lacks %q:\n%s", run, want, s)
			}
		}
	}
}
