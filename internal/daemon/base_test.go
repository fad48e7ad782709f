package daemon

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestOwner: closures run one at a time, in the order queued, on the owner
// goroutine; once closed, Do says so; a nil Owner has not started.
func TestOwner(t *testing.T) {
	errGone := errors.New("gone")
	o := NewOwner(errGone)
	o.Start()
	var got []int
	var running, overlap int // touched only by the closures
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := o.Do(func() {
				running++
				if running > 1 {
					overlap++
				}
				got = append(got, i)
				running--
			}); err != nil {
				t.Errorf("Do: %v", err)
			}
		}()
	}
	wg.Wait()
	if err := o.Do(func() {
		if len(got) != 50 || overlap != 0 {
			t.Errorf("%d closures ran, %d overlapping", len(got), overlap)
		}
	}); err != nil {
		t.Fatal(err)
	}
	o.Close()
	o.Close()
	if err := o.Do(func() { t.Error("ran after Close") }); err != errGone {
		t.Errorf("Do after Close: %v, want %v", err, errGone)
	}
	var none *Owner
	if err := none.Do(func() {}); err != ErrNotStarted {
		t.Errorf("Do on nil: %v", err)
	}
}

// TestOwnerOps: a daemon's own loop may be the owner goroutine, taking closures from
// Ops; Close then only ends the queue.
func TestOwnerOps(t *testing.T) {
	o := NewOwner(errors.New("stopping"))
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		defer o.Close()
		for {
			select {
			case op := <-o.Ops():
				op()
			case <-stop:
				return
			}
		}
	}()
	n := 0
	for range 3 {
		if err := o.Do(func() { n++ }); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-loopDone
	if err := o.Do(func() { n++ }); err == nil || n != 3 {
		t.Errorf("after the loop: %v, %d ran", err, n)
	}
}

// TestBaseAdmin: a Base generates a token in the state directory, serves its admin
// handler behind Auth with it, reads the same token again on reload, and serves with
// none when insecure; an endpoint that is off has no token and no listener.
func TestBaseAdmin(t *testing.T) {
	var log strings.Builder
	var b Base
	b.Init(&log, "debug")
	if !b.Log.Enabled(context.Background(), -4) {
		t.Error("log level debug not in force")
	}
	b.SetLevel("error")
	if b.Log.Enabled(context.Background(), 0) {
		t.Error("SetLevel(error) not in force")
	}
	b.SetLevel("info")
	state := filepath.Join(t.TempDir(), "state")
	cfg := AdminConfig{Listen: "127.0.0.1:0", StateDir: state, Hosts: []string{"admin.example"}}
	a, err := b.ReadAdminAccess(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if b.Auth.Enabled() || b.TokenFile() != "" {
		t.Error("ReadAdminAccess put the token in force")
	}
	b.SetAdminAccess(a)
	if want := filepath.Join(state, GeneratedTokenFile); b.TokenFile() != want || !b.Auth.Enabled() {
		t.Fatalf("token file %q (want %q), enabled %v", b.TokenFile(), want, b.Auth.Enabled())
	}
	tok, err := ReadTokenFile(b.TokenFile())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	if err := b.ServeAdmin(cfg.Listen, b.Auth.Wrap(mux), "/status"); err != nil {
		t.Fatal(err)
	}
	defer b.CloseAdmin()
	url := "http://" + b.AdminAddr().String() + "/status"
	get := func(host, token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if host != "" {
			req.Host = host
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("", ""); code != 401 {
		t.Errorf("without the token: %d, want 401", code)
	}
	if code := get("", string(tok)); code != 200 {
		t.Errorf("with the token: %d, want 200", code)
	}
	if code := get("admin.example", string(tok)); code != 200 {
		t.Errorf("Host of admin_hosts: %d, want 200", code)
	}
	if code := get("evil.example", string(tok)); code != 421 {
		t.Errorf("another Host: %d, want 421", code)
	}
	if !strings.Contains(log.String(), "admin token generated") || !strings.Contains(log.String(), "Authorization: Bearer $(cat "+b.TokenFile()+")") {
		t.Errorf("the log does not say where the token is and how to send it:\n%s", log.String())
	}
	if strings.Contains(log.String(), string(tok)) {
		t.Error("the log shows the token")
	}

	// A reload reads the generated token again: the same one.
	a, err = b.ReadAdminAccess(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.SetAdminAccess(a)
	if code := get("", string(tok)); code != 200 {
		t.Errorf("with the token after a reload: %d, want 200", code)
	}
	// Insecure: none.
	cfg.Insecure = true
	if a, err = b.ReadAdminAccess(cfg); err != nil {
		t.Fatal(err)
	}
	b.SetAdminAccess(a)
	if code := get("", ""); code != 200 || b.TokenFile() != "" {
		t.Errorf("admin_insecure: %d, token file %q", code, b.TokenFile())
	}
	// Off: no token read or made, and no listener.
	off := AdminConfig{Listen: "off", StateDir: filepath.Join(t.TempDir(), "nothing")}
	if a, err = b.ReadAdminAccess(off); err != nil || a.token != nil || a.file != "" {
		t.Errorf("off: %v %+v", err, a)
	}
	var b2 Base
	b2.Init(io.Discard, "")
	if err := b2.ServeAdmin("off", mux, "/"); err != nil || b2.AdminAddr() != nil {
		t.Errorf("ServeAdmin(off): %v, %v", err, b2.AdminAddr())
	}
	b2.CloseAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	b2.ShutdownAdmin(ctx)
	cancel()
}

// TestBaseServing: Serving's channel is closed by MarkServing, once.
func TestBaseServing(t *testing.T) {
	var b Base
	ch := b.Serving()
	select {
	case <-ch:
		t.Fatal("serving before MarkServing")
	default:
	}
	b.MarkServing()
	b.MarkServing()
	select {
	case <-ch:
	default:
		t.Fatal("not serving after MarkServing")
	}
}

// TestBaseChanges: CountChange counts by source and result once NewChanges has
// registered the counter, and does nothing before.
func TestBaseChanges(t *testing.T) {
	var b Base
	b.Init(io.Discard, "")
	b.CountChange("reload", nil) // not registered yet: nothing
	b.NewChanges("test_changes_total", "Changes.")
	b.CountChange("reload", nil)
	b.CountChange("reload", errors.New("bad"))
	b.CountChange("api", nil)
	if got := testutil.ToFloat64(b.changes.WithLabelValues("reload", "ok")); got != 1 {
		t.Errorf("reload ok %v", got)
	}
	if got := testutil.ToFloat64(b.changes.WithLabelValues("reload", "error")); got != 1 {
		t.Errorf("reload error %v", got)
	}
	if n := testutil.CollectAndCount(b.Reg, "test_changes_total"); n != 3 {
		t.Errorf("%d series", n)
	}
}

// TestRestart: the settings fixed at start that a file changes, and the error that
// names them.
func TestRestart(t *testing.T) {
	cur := AdminConfig{Listen: "127.0.0.1:1", StateDir: "/a", TokenFile: "/t", Hosts: []string{"x"}}
	next := cur
	next.TokenFile, next.Hosts = "", nil // change on reload
	if d := cur.FixedChanges(next); len(d) != 0 {
		t.Errorf("token file and hosts: %v", d)
	}
	next = AdminConfig{Listen: "127.0.0.1:2", Insecure: true, StateDir: "/b"}
	d := cur.FixedChanges(next)
	if strings.Join(d, ",") != "admin_listen,admin_insecure,state_dir" {
		t.Errorf("FixedChanges %v", d)
	}
	if err := Restart("testd", nil); err != nil {
		t.Errorf("Restart of nothing: %v", err)
	}
	err := Restart("testd", d)
	var re *RestartError
	if !errors.As(err, &re) || err.Error() != "admin_listen, admin_insecure, state_dir cannot change at runtime: restart testd to apply" {
		t.Errorf("Restart: %v", err)
	}
}
