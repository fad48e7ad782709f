package l7d

import (
	"os"
	"testing"
)

// TestMain keeps the admin tokens the tests' daemons generate out of
// /var/lib/tiergate: without state_dir they go to a directory of the test run's.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "l7d-test-state-")
	if err != nil {
		panic(err)
	}
	defaultTokenDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
