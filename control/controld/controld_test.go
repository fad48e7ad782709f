package controld

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestRunStopsOnCancel starts controld with its embedded store, uses the first admin
// token it generated, and stops it by cancelling its context.
func TestRunStopsOnCancel(t *testing.T) {
	dir := t.TempDir()
	logs := &testenv.LockedBuffer{}
	d := &Daemon{Config: Config{DataDir: dir, Listen: "127.0.0.1:0"}, Stderr: logs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-d.Serving():
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(time.Minute):
		t.Fatalf("not serving after a minute\n%s", logs)
	}
	path := filepath.Join(dir, TokenFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	if !strings.Contains(logs.String(), path) {
		t.Errorf("the token's path is not logged:\n%s", logs)
	}
	tok, _ := os.ReadFile(path)
	if strings.Contains(logs.String(), strings.TrimSpace(string(tok))) {
		t.Errorf("the token itself is logged")
	}
	req, _ := http.NewRequest("GET", "http://"+d.Addr().String()+"/v1/pools", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/pools with the first token: %d", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("not stopped 30s after the cancel")
	}
	if _, err := http.Get("http://" + d.Addr().String() + "/healthz"); err == nil {
		t.Error("still answering after the stop")
	}
}

// TestMainSIGTERM runs "controld run" and stops it with SIGTERM; a second run on
// the same data directory keeps the first token and makes none.
func TestMainSIGTERM(t *testing.T) {
	dir := t.TempDir()
	for i := range 2 {
		var stderr testenv.LockedBuffer
		done := make(chan int, 1)
		go func() {
			done <- Main([]string{"run", "-data-dir", dir, "-listen", "127.0.0.1:0"}, &bytes.Buffer{}, &stderr)
		}()
		deadline := time.Now().Add(time.Minute)
		for !strings.Contains(stderr.String(), "controld serving") {
			select {
			case code := <-done:
				t.Fatalf("run %d exited with %d:\n%s", i, code, stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %d not serving after a minute:\n%s", i, stderr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		generated := strings.Contains(stderr.String(), "generated the first admin token")
		if generated != (i == 0) {
			t.Errorf("run %d: generated a token: %v", i, generated)
		}
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("run %d: exit %d:\n%s", i, code, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("run %d: not stopped 30s after SIGTERM", i)
		}
	}
}

func TestCheck(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"check", "-data-dir", t.TempDir()}, &out, &errb); code != 0 || !strings.Contains(out.String(), "embedded etcd") {
		t.Fatalf("check: %d %s %s", code, out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := Main([]string{"check", "-listen", "0.0.0.0:7443"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "loopback") {
		t.Fatalf("check of a non-loopback address: %d %s", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"check", "-etcd-endpoints", "https://192.0.2.1:2379", "-etcd-cert", "c.pem"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "key_file") {
		t.Fatalf("check of a certificate without its key: %d %s", code, errb.String())
	}
	if code := Main([]string{"frob"}, &out, &errb); code != 2 {
		t.Fatalf("unknown command: %d", code)
	}
}

// TestEtcdListen: with -etcd-listen the embedded etcd serves a loopback URL, which
// controld logs and the nodes reach the store at; a non-loopback URL is refused.
func TestEtcdListen(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"check", "-data-dir", t.TempDir(), "-etcd-listen", "http://127.0.0.1:2379"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "nodes' etcd_endpoints: http://127.0.0.1:2379") {
		t.Fatalf("check: %d %s %s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := Main([]string{"check", "-data-dir", t.TempDir(), "-etcd-listen", "http://0.0.0.0:2379"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "listen_client_url") || !strings.Contains(errb.String(), "loopback") {
		t.Fatalf("check of a non-loopback etcd URL: %d %s", code, errb.String())
	}

	logs := &testenv.LockedBuffer{}
	d := &Daemon{Config: Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", EtcdListen: "http://127.0.0.1:0"}, Stderr: logs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case <-d.Serving():
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(time.Minute):
		t.Fatalf("not serving after a minute\n%s", logs)
	}
	eps := d.NodeEndpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "http://127.0.0.1:") || strings.HasSuffix(eps[0], ":0") {
		t.Fatalf("node endpoints %v", eps)
	}
	if !strings.Contains(logs.String(), eps[0]) {
		t.Errorf("the nodes' endpoint is not logged:\n%s", logs)
	}
	st, err := store.Open(ctx, store.Config{Endpoints: eps, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("a node's store at %v: %v", eps, err)
	}
	st.Close()
}
