package l4d

import (
	"os"
	"testing"
)

// TestMain keeps the admin tokens the tests' daemons generate out of
// /var/lib/tiergate: state_dir defaults to a directory of the test run's.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "l4d-test-state-")
	if err != nil {
		panic(err)
	}
	defaultStateDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
