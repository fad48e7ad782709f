// Package testenv lets tests say what they need from the machine (root, a Debian
// package's command or library) and skip with a clear message when it is missing,
// and holds small helpers tests share.
//
// Under `make test` TIERGATE_REQUIRE_ALL=1 is set: a missing requirement then fails the
// test instead of skipping it, so CI can never pass by silently skipping the tests that
// matter.
package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// Strict reports whether missing requirements fail tests rather than skip them.
func Strict() bool { return os.Getenv("TIERGATE_REQUIRE_ALL") == "1" }

func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if Strict() {
		t.Fatalf("TIERGATE_REQUIRE_ALL=1 and "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot skips (or, when strict, fails) t unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "test needs root (run `make test` as root)")
	}
}

// RequireCommand skips (or fails) t unless name is on PATH; pkg is the Debian package
// that provides it (installed by `make deps`).
func RequireCommand(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, "test needs %s (Debian package %s; `make deps` installs it)", name, pkg)
	}
	return p
}

// RequireFile skips (or fails) t unless path exists; pkg is the Debian package that
// provides it.
func RequireFile(t testing.TB, path, pkg string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		missing(t, "test needs %s (Debian package %s; `make deps` installs it)", path, pkg)
	}
}

// SkipShort skips t under `go test -short`: for slow tests. Never fails, even strict.
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow test skipped in -short mode: " + why)
	}
}

// LockedBuffer collects what a process or an in-process daemon writes (its log, say)
// for a test to read while the writer still runs.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
