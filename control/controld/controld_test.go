package controld

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
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
	"github.com/tiergate/tiergate/testkit/testpki"
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

// TestConfigFile: the -config file gives the settings, and a flag given overrides
// the file's; a field controld does not have is refused, named.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "controld.yaml")
	yaml := "data_dir: " + dir + "/data\nlisten: 127.0.0.1:7555\nlog_level: debug\nlame_duck: 2s\n" +
		"etcd_listen: http://127.0.0.1:2379\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := ParseArgs("check", []string{"-config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != dir+"/data" || c.Listen != "127.0.0.1:7555" || c.LogLevel != "debug" || c.LameDuck.D() != 2*time.Second || c.EtcdListen != "http://127.0.0.1:2379" {
		t.Fatalf("from the file: %+v", c)
	}
	c, err = ParseArgs("check", []string{"-listen", "127.0.0.1:7666", "-config", path, "-lame-duck", "5s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:7666" || c.LameDuck.D() != 5*time.Second || c.LogLevel != "debug" || c.DataDir != dir+"/data" {
		t.Fatalf("flags over the file: %+v", c)
	}
	var out, errb bytes.Buffer
	if code := Main([]string{"check", "-config", path}, &out, &errb); code != 0 || !strings.Contains(out.String(), "listen 127.0.0.1:7555") {
		t.Fatalf("check -config: %d %s %s", code, out.String(), errb.String())
	}
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:7555\nlisten_addr: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := Main([]string{"check", "-config", path}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "listen_addr") {
		t.Fatalf("a field controld does not have: %d %s", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"check", "-config", filepath.Join(dir, "missing.yaml")}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "missing.yaml") {
		t.Fatalf("a missing file: %d %s", code, errb.String())
	}
}

// TestAPITLS: with -tls-cert and -tls-key the API serves HTTPS only; a
// non-loopback -listen is taken with them and refused without, saying why.
func TestAPITLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewCA("controld test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf("controld", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.WriteFiles(dir, "api", leaf); err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, "controld.pem"), filepath.Join(dir, "controld.key")

	var out, errb bytes.Buffer
	if code := Main([]string{"check", "-data-dir", dir, "-listen", "198.18.0.1:7443"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "loopback") || !strings.Contains(errb.String(), "-tls-cert") {
		t.Fatalf("a non-loopback listen without TLS: %d %s", code, errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := Main([]string{"check", "-data-dir", dir, "-listen", "198.18.0.1:7443", "-tls-cert", cert, "-tls-key", key}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "(https)") {
		t.Fatalf("a non-loopback listen with TLS: %d %s %s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := Main([]string{"check", "-data-dir", dir, "-tls-cert", cert}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "go together") {
		t.Fatalf("a certificate without its key: %d %s", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"check", "-data-dir", dir, "-tls-cert", key, "-tls-key", key}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "TLS certificate") {
		t.Fatalf("a certificate file that is none: %d %s", code, errb.String())
	}

	logs := &testenv.LockedBuffer{}
	d := &Daemon{Config: Config{DataDir: filepath.Join(dir, "data"), Listen: "127.0.0.1:0", TLSCertFile: cert, TLSKeyFile: key}, Stderr: logs}
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
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}, Timeout: 10 * time.Second}
	resp, err := hc.Get("https://" + d.Addr().String() + "/healthz")
	if err != nil {
		t.Fatalf("https: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		t.Fatalf("https /healthz: %d", resp.StatusCode)
	}
	plain := &http.Client{Timeout: 10 * time.Second}
	if resp, err := plain.Get("http://" + d.Addr().String() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP answered 200 on the TLS listener")
		}
	}
}
