package controld

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/control/crowdsec/crowdsectest"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// TestCrowdSecSection runs controld with a crowdsec section (from its -config
// file) against Debian's crowdsec's Local API, and a node's follower of the
// store: the decisions made before controld started are in the list, one added
// arrives with its expiry, one deleted goes, and a type not enforced never comes.
func TestCrowdSecSection(t *testing.T) {
	lapi := crowdsectest.Start(t)
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.7", "-d", "1h")
	lapi.Cscli("decisions", "add", "--range", "203.0.113.0/24", "-d", "2h")
	lapi.Cscli("decisions", "add", "--ip", "198.51.100.20", "-d", "1h", "-t", "captcha")

	dir := t.TempDir()
	path := filepath.Join(dir, "controld.yaml")
	yaml := "data_dir: " + dir + "/data\nlisten: 127.0.0.1:0\netcd_listen: http://127.0.0.1:0\n" +
		"crowdsec:\n  lapi_url: " + lapi.URL + "\n  api_key_file: " + lapi.KeyFile + "\n  list: risk\n  poll_interval: 200ms\n" +
		// The Local API never streams a decision written while a pull runs (about one
		// in a few hundred, at this poll interval): a resync brings it within the wait.
		"  resync_interval: 3s\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := Main([]string{"check", "-config", path}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "crowdsec: a bouncer of "+lapi.URL+" keeping blacklist risk in step with its ban decisions, pulled every 200ms") {
		t.Fatalf("check: %d\n%s%s", code, out.String(), errb.String())
	}
	c, err := ParseArgs("run", []string{"-config", path}, &errb)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.LockedBuffer{}
	d := &Daemon{Config: c, Stderr: logs}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	select {
	case <-d.Serving():
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(time.Minute):
		t.Fatalf("not serving after a minute\n%s", logs)
	}

	// A node: the store at controld's etcd URL, the list "risk" followed.
	st, err := store.Open(ctx, store.Config{Endpoints: d.NodeEndpoints(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	list := blacklist.NewList("risk", blacklist.Options{})
	f, err := blsync.NewFollower(blsync.FollowerConfig{Store: st, Logger: slog.New(slog.DiscardHandler), List: func(name string) *blacklist.List {
		if name == "risk" {
			return list
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	fctx, stopF := context.WithCancel(ctx)
	fdone := make(chan struct{})
	go func() {
		defer close(fdone)
		f.Run(fctx)
	}()
	defer func() {
		stopF()
		<-fdone
	}()

	has := func(a string) bool { return list.Contains(netip.MustParseAddr(a)) }
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s; bouncer %+v; follower %v %v\ncontrold's log:\n%s\ncrowdsec's log:\n%s",
					what, d.CrowdSec().Stats(), f.Versions(), f.Errors(), logs, lapi.Log())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("the decisions made before controld started", func() bool { return has("198.51.100.7") && has("203.0.113.200") })
	if has("198.51.100.20") {
		t.Error("a captcha decision is listed (only ban is enforced)")
	}

	lapi.Cscli("decisions", "add", "--ip", "2001:db8::8", "-d", "1m", "-R", "tiergate test")
	waitFor("a decision added", func() bool { return has("2001:db8::8") })
	// The delta in the store says who wrote it and why: the decision's scenario.
	v := f.Versions()["risk"]
	resp, err := st.Client().Get(ctx, blsync.DeltaKey("risk", v))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the delta of version %d: %v %v", v, resp, err)
	}
	_, rec, err := blsync.DecodeDelta(v, resp.Kvs[0].Value)
	if err != nil || rec.Who != "crowdsec" || len(rec.Add) != 1 || rec.Add[0].Prefix != "2001:db8::8/128" || rec.Add[0].Reason != "tiergate test" {
		t.Errorf("the delta of version %d: %+v, %v; want who crowdsec adding 2001:db8::8/128 for \"tiergate test\"", v, rec, err)
	}
	var ends time.Time
	for e := range list.Snapshot().All() {
		if e.Prefix == netip.MustParsePrefix("2001:db8::8/128") {
			ends = e.Expires
		}
	}
	if left := time.Until(ends); left < 50*time.Second || left > 61*time.Second {
		t.Errorf("a decision of 1m: the node's entry ends in %v", left)
	}

	lapi.Cscli("decisions", "delete", "--ip", "198.51.100.7")
	waitFor("a decision deleted", func() bool { return !has("198.51.100.7") })
	if !has("203.0.113.200") || !has("2001:db8::8") {
		t.Error("a decision deleted: the others went too")
	}
	if v := f.Versions()["risk"]; v < 3 {
		t.Errorf("the node enforces version %d of the list; want at least 3 (replace, addition, deletion)", v)
	}
}

// A crowdsec section that is not valid is refused by check, naming its field.
func TestCrowdSecSectionRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "controld.yaml")
	if err := os.WriteFile(path, []byte("data_dir: "+dir+"\ncrowdsec:\n  lapi_url: 127.0.0.1:8080\n  poll_interval: 1ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := Main([]string{"check", "-config", path}, &out, &errb)
	for _, want := range []string{"crowdsec.lapi_url: ", "crowdsec.api_key_file: required", "crowdsec.poll_interval: 1ms: at least 100ms"} {
		if code != 1 || !strings.Contains(errb.String(), want) {
			t.Errorf("check: exit %d, %q; want 1 naming %s", code, errb.String(), want)
		}
	}
}
