package l7d

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminTokenFileExposedWarned: an admin token file its group or others can read
// is warned about (with its mode) at start; a 0600 one is not.
func TestAdminTokenFileExposedWarned(t *testing.T) {
	for _, tc := range []struct {
		mode os.FileMode
		warn bool
	}{{0o644, true}, {0o600, false}} {
		dir := t.TempDir()
		tokFile := filepath.Join(dir, "admin.token")
		writeFile(t, tokFile, tokenA+"\n")
		if err := os.Chmod(tokFile, tc.mode); err != nil {
			t.Fatal(err)
		}
		admin := freeAddr(t)
		_, log := runDaemon(t, testConfig(t, dir, admin, "admin_token_file: "+tokFile+"\n"), admin)
		warned := strings.Contains(log.String(), "readable by others than its owner") && strings.Contains(log.String(), "file="+tokFile)
		if warned != tc.warn {
			t.Errorf("token file mode %v: warned %v, want %v\n%s", tc.mode, warned, tc.warn, log)
		}
	}
}
