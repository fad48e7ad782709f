// Package daemontest runs a daemon in the background of a test, the way the daemons'
// own tests and the integration tests start them in-process: Start returns once the
// daemon serves, and the daemon is stopped, and its result checked, when the test
// ends.
package daemontest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Timeout bounds the start (until Options.Serving is closed) and the stop of a
// daemon.
const Timeout = 20 * time.Second

// Options say how to run a daemon.
type Options struct {
	// Name is the daemon's name in failures. Required.
	Name string
	// Run serves until its context ends. Required.
	Run func(ctx context.Context) error
	// Serving is closed once the daemon serves (daemon.Base.Serving). Required.
	Serving <-chan struct{}
	// Log, when set, is shown when the daemon does not start and when the test
	// fails.
	Log fmt.Stringer
}

// Start runs o.Run in the background and returns once o.Serving is closed; a daemon
// that returns first, or does not serve within Timeout, fails the test. The daemon is
// stopped (its context canceled) when the test ends, or earlier by calling stop,
// which returns Run's result; a daemon that does not stop within Timeout is an error.
// A failed stop at the test's end fails the test.
func Start(t testing.TB, o Options) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- o.Run(ctx) }()
	select {
	case <-o.Serving:
	case err := <-errc:
		cancel()
		t.Fatalf("%s did not start: %v%s", o.Name, err, logOf(o.Log))
	case <-time.After(Timeout):
		cancel()
		t.Fatalf("%s did not start in %v%s", o.Name, Timeout, logOf(o.Log))
	}
	var once sync.Once
	var stopErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-errc:
			case <-time.After(Timeout):
				stopErr = errors.New(o.Name + " did not stop in " + Timeout.String())
			}
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stopping %s: %v", o.Name, err)
		}
		if t.Failed() && o.Log != nil {
			t.Logf("%s log:\n%s", o.Name, o.Log)
		}
	})
	return stop
}

func logOf(log fmt.Stringer) string {
	if log == nil {
		return ""
	}
	return "\n" + log.String()
}

// Token returns the admin token in file, without surrounding white space; "" when
// file is "" (no token).
func Token(t testing.TB, file string) string {
	t.Helper()
	if file == "" {
		return ""
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("reading the admin token: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// WaitShuttingDown polls healthz (a GET of the daemon's /healthz, returning the status
// code and body) until it answers 503 "shutting down", as daemon.LameDuck has it
// answer during the lame-duck delay, and fails t if that does not come within 5 s or
// the 503 says something else.
func WaitShuttingDown(t testing.TB, healthz func() (int, string)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := healthz()
		if code == 503 {
			if !strings.Contains(body, "shutting down") {
				t.Errorf("healthz during the lame-duck delay: %q", body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("healthz still %d %q", code, body)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
