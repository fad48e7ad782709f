package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLameDuck runs an admin endpoint through a stop with a lame-duck delay:
// /healthz answers 503 "shutting down" while the endpoint still serves, and only
// after the delay does the shutdown run.
func TestLameDuck(t *testing.T) {
	ld := &LameDuck{Delay: 300 * time.Millisecond, Grace: time.Second}
	mux := AdminMux(prometheus.NewRegistry(), ld.Healthy(func() error { return nil }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	url := "http://" + ln.Addr().String() + "/healthz"
	health := func() (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := health(); code != 200 || body != "ok" {
		t.Fatalf("before the stop: %d %q", code, body)
	}

	start := time.Now()
	shutAt := make(chan time.Duration, 1)
	stopped := make(chan error, 1)
	go func() {
		stopped <- ld.Stop(context.Background(), func(ctx context.Context) error {
			shutAt <- time.Since(start)
			if _, ok := ctx.Deadline(); !ok {
				t.Error("the shutdown context has no deadline")
			}
			return srv.Shutdown(ctx)
		})
	}()
	for !ld.Stopping() {
		time.Sleep(time.Millisecond)
	}
	if code, body := health(); code != http.StatusServiceUnavailable || body != "shutting down" {
		t.Errorf("during the lame-duck delay: %d %q, want 503 \"shutting down\"", code, body)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if d := <-shutAt; d < ld.Delay {
		t.Errorf("shut down after %v, before the lame-duck delay of %v", d, ld.Delay)
	}
	if code, _ := health(); code != 0 {
		t.Errorf("still serving after the stop: %d", code)
	}
}

func TestLameDuckDefaults(t *testing.T) {
	var ld LameDuck
	check := errors.New("link down")
	h := ld.Healthy(func() error { return check })
	if err := h(); err != check {
		t.Errorf("health before the stop: %v", err)
	}
	start := time.Now()
	err := ld.Stop(context.Background(), func(ctx context.Context) error {
		dl, _ := ctx.Deadline()
		if left := time.Until(dl); left <= DefaultGrace-time.Second || left > DefaultGrace {
			t.Errorf("grace %v, want about %v", left, DefaultGrace)
		}
		return errors.New("shutdown failed")
	})
	if err == nil || err.Error() != "shutdown failed" {
		t.Errorf("Stop returned %v, want the shutdown's error", err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("zero delay waited %v", time.Since(start))
	}
	if err := h(); !errors.Is(err, ErrShuttingDown) {
		t.Errorf("health after the stop: %v", err)
	}
	if err := (&LameDuck{}).Healthy(nil)(); err != nil {
		t.Errorf("nil check: %v", err)
	}

	// A context that ends cuts the delay short.
	ld2 := LameDuck{Delay: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ld2.Stop(ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
}
