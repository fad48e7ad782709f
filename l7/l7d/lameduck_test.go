package l7d

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/daemontest"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// tlsRequest makes one HTTP/1.1 request over TLS (SNI www.example.com) to addr and
// returns the status answered.
func tlsRequest(addr string) (int, error) {
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{ServerName: "www.example.com", InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestLameDuck: on stop, /healthz answers 503 "shutting down" for lame_duck while the
// listener still serves TLS requests; then l7d stops accepting and Run returns.
func TestLameDuck(t *testing.T) {
	dir := t.TempDir()
	admin, listen := freeAddr(t), freeAddr(t)
	path := testConfig(t, dir, admin, "lame_duck: 3s\nshutdown_grace: 2s\n")
	cfg := strings.Replace(readFile(t, path), `addr: "127.0.0.1:0"`, `addr: "`+listen+`"`, 1)
	writeFile(t, path, cfg)

	var log testenv.LockedBuffer
	d := &Daemon{Path: path, Stderr: &log}
	stop := daemontest.Start(t, daemontest.Options{Name: "l7d", Run: d.Run, Serving: d.Serving(), Log: &log})
	c := adminClient{t: t, base: "http://" + admin}
	if code, _, body := c.call("GET", "/healthz", ""); code != http.StatusOK {
		t.Fatalf("/healthz before the stop: %d %s", code, body)
	}
	if _, err := tlsRequest(listen); err != nil {
		t.Fatalf("a request before the stop: %v", err)
	}

	stopped := make(chan error, 1)
	begun := time.Now()
	go func() { stopped <- stop() }()
	for {
		code, _, body := c.call("GET", "/healthz", "")
		if code == http.StatusServiceUnavailable {
			if !strings.Contains(body, "shutting down") {
				t.Fatalf("/healthz in the lame-duck period: %d %q, want 503 shutting down", code, body)
			}
			break
		}
		if time.Since(begun) > 2*time.Second {
			t.Fatalf("/healthz still answers %d %q 2s into the stop", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, err := tlsRequest(listen); err != nil || code == 0 {
		t.Fatalf("a TLS request in the lame-duck period: %d %v", code, err)
	}
	select {
	case err := <-stopped:
		t.Fatalf("l7d stopped %v after the stop began, within lame_duck (3s): %v", time.Since(begun), err)
	default:
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("stop: %v", err)
		}
	case <-time.After(daemontest.Timeout):
		t.Fatal("l7d did not stop after lame_duck")
	}
	if e := time.Since(begun); e < 3*time.Second {
		t.Errorf("l7d stopped %v after the stop began, before lame_duck (3s) ended", e)
	}
	if _, err := tlsRequest(listen); err == nil {
		t.Error("the listener still serves after the stop")
	}
	if !strings.Contains(log.String(), "lame duck") {
		t.Errorf("the log does not tell of the lame-duck period:\n%s", log.String())
	}
}

// TestReloadLogLevel: a reload that changes log_level changes what is logged.
func TestReloadLogLevel(t *testing.T) {
	dir := t.TempDir()
	admin := freeAddr(t)
	path := testConfig(t, dir, admin, "log_level: info\n")
	var log testenv.LockedBuffer
	d := &Daemon{Path: path, Stderr: &log}
	daemontest.Start(t, daemontest.Options{Name: "l7d", Run: d.Run, Serving: d.Serving(), Log: &log})
	c := adminClient{t: t, base: "http://" + admin, token: daemontest.Token(t, d.TokenFile())}
	ctx := context.Background()
	if d.Log.Enabled(ctx, slog.LevelDebug) || !d.Log.Enabled(ctx, slog.LevelInfo) {
		t.Fatalf("at start with log_level info: debug %v, info %v", d.Log.Enabled(ctx, slog.LevelDebug), d.Log.Enabled(ctx, slog.LevelInfo))
	}
	for _, tc := range []struct {
		level       string
		debug, info bool
	}{{"debug", true, true}, {"error", false, false}, {"info", false, true}} {
		writeFile(t, path, strings.Replace(readFile(t, path), "log_level: ", "log_level: "+tc.level+" #", 1))
		if code, _, body := c.call("POST", "/reload", ""); code != http.StatusOK {
			t.Fatalf("reload to log_level %s: %d %s", tc.level, code, body)
		}
		if got := d.Log.Enabled(ctx, slog.LevelDebug); got != tc.debug {
			t.Errorf("after a reload to log_level %s: debug enabled %v, want %v", tc.level, got, tc.debug)
		}
		if got := d.Log.Enabled(ctx, slog.LevelInfo); got != tc.info {
			t.Errorf("after a reload to log_level %s: info enabled %v, want %v", tc.level, got, tc.info)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
