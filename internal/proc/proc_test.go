package proc

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestStopGraceful(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	// The shell says when its trap is set, so the SIGTERM cannot come before it.
	p, err := Start("sh", log, exec.Command("sh", "-c", `trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done`))
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "ready")
	if err := p.Stop(5 * time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if got := p.LogTail(10); got != "ready\nbye" {
		t.Errorf("log %q, want ready and bye", got)
	}
	if err := p.Stop(time.Second); err != nil {
		t.Errorf("Stop of a stopped process: %v", err)
	}
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Errorf("Signal after exit: %v", err)
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	p, err := Start("stubborn", filepath.Join(t.TempDir(), "p.log"),
		exec.Command("sh", "-c", `trap '' TERM; echo ready; while :; do sleep 0.05; done`))
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "ready")
	start := time.Now()
	err = p.Stop(300 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "stubborn did not stop within 300ms") {
		t.Fatalf("Stop = %v, want it killed after the grace", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 5*time.Second {
		t.Errorf("Stop took %v", d)
	}
	select {
	case <-p.Done():
	default:
		t.Error("Done not closed after Stop")
	}
}

func TestExitBeforeHealthy(t *testing.T) {
	p, err := Start("failing", filepath.Join(t.TempDir(), "p.log"), exec.Command("sh", "-c", "echo cannot bind; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	err = p.WaitHTTP(context.Background(), nil, "http://127.0.0.1:1/healthz", 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "failing exited: exit status 3") || !strings.Contains(err.Error(), "    cannot bind") {
		t.Fatalf("WaitHTTP = %v, want the exit and the log's end", err)
	}
	if err := p.Stop(time.Second); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Stop of a process that had failed = %v", err)
	}
}

func TestWaitHTTP(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	p, err := Start("sleeper", filepath.Join(t.TempDir(), "p.log"), exec.Command("sleep", "30"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Second)
	if err := p.WaitHTTP(context.Background(), srv.Client(), srv.URL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}

	// Never 200: the timeout says what it saw last.
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusBadGateway) }))
	defer bad.Close()
	err = p.WaitHTTP(context.Background(), nil, bad.URL, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "502 Bad Gateway") {
		t.Errorf("WaitHTTP = %v, want the 502", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.WaitHTTP(ctx, nil, bad.URL, time.Minute); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("WaitHTTP with an ended context = %v", err)
	}
}

func TestAppendLogAndKill(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	for i := range 2 {
		p, err := Start("echo", log, exec.Command("sh", "-c", fmt.Sprintf("echo run %d; exec sleep 30", i)), AppendLog())
		if err != nil {
			t.Fatal(err)
		}
		waitLog(t, p, fmt.Sprintf("run %d", i))
		p.Kill()
		if err := p.ExitErr(); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("ExitErr after Kill = %v", err)
		}
	}
	if got := Tail(log, 10); got != "run 0\nrun 1" {
		t.Errorf("log %q, want both runs", got)
	}
	// Without AppendLog the log starts afresh.
	p, err := Start("true", log, exec.Command("true"))
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if got := Tail(log, 10); got != "" {
		t.Errorf("log %q after a run that wrote nothing", got)
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := Start("missing", filepath.Join(t.TempDir(), "p.log"), exec.Command("/nonexistent/binary")); err == nil || !strings.Contains(err.Error(), "starting missing") {
		t.Errorf("Start of a missing binary = %v", err)
	}
	if _, err := Start("nolog", "/nonexistent/dir/p.log", exec.Command("true")); err == nil || !strings.Contains(err.Error(), "nolog's log") {
		t.Errorf("Start with no place for the log = %v", err)
	}
}

func TestTail(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "big.log")
	var b strings.Builder
	for i := range 20000 { // about 330 KiB: more than Tail reads
		fmt.Fprintf(&b, "line %05d\n", i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := Tail(path, 3); got != "line 19997\nline 19998\nline 19999" {
		t.Errorf("Tail = %q", got)
	}
	if got := Tail(filepath.Join(dir, "absent"), 3); got != "" {
		t.Errorf("Tail of no file = %q", got)
	}
}

// waitLog waits until p's log holds want.
func waitLog(t *testing.T, p *Process, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.LogTail(100), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's log has no %q: %q", p.Name, want, p.LogTail(100))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
