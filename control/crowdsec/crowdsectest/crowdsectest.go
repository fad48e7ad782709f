// Package crowdsectest runs Debian's crowdsec for a test: its Local API alone
// (crowdsec -no-cs -no-capi: no log acquisition, no Central API), on a free
// loopback port, with its configuration and SQLite database in the test's
// temporary directory, a bouncer registered (cscli bouncers add) and a machine
// registered for cscli's decisions add and delete. The process stops when the
// test ends.
package crowdsectest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/proc"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// LAPI is a running CrowdSec Local API.
type LAPI struct {
	// URL is its base URL, http://127.0.0.1:PORT.
	URL string
	// KeyFile holds the API key of the bouncer "tiergate".
	KeyFile string
	// Config is its configuration file, for cscli -c.
	Config string

	t          testing.TB
	bin, cscli string
	dir, addr  string
	p          *proc.Process
}

// Start starts a Local API for t, or skips t (fails it under
// TIERGATE_REQUIRE_ALL=1) when crowdsec or cscli is not installed.
func Start(t testing.TB) *LAPI {
	t.Helper()
	bin := testenv.RequireCommand(t, "crowdsec", "crowdsec")
	cscli := testenv.RequireCommand(t, "cscli", "crowdsec")
	for attempt := 1; ; attempt++ {
		l := setUp(t, bin, cscli)
		err := l.start()
		if err == nil {
			t.Cleanup(l.Stop)
			return l
		}
		// The free port found may be taken before crowdsec binds it.
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
	}
}

// setUp writes a Local API's configuration in a new directory, on a free port,
// with a machine and the bouncer registered.
func setUp(t testing.TB, bin, cscli string) *LAPI {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"etc", "data", "hub"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	addr := freePort(t)
	conf := filepath.Join(dir, "etc", "config.yaml")
	write(t, conf, fmt.Sprintf(configYAML, dir, addr))
	write(t, filepath.Join(dir, "etc", "profiles.yaml"), profilesYAML)
	write(t, filepath.Join(dir, "etc", "simulation.yaml"), "simulation: false\n")
	l := &LAPI{URL: "http://" + addr, KeyFile: filepath.Join(dir, "bouncer.key"), Config: conf, t: t, bin: bin, cscli: cscli, dir: dir, addr: addr}
	l.Cscli("machines", "add", "--auto", "--force", "-f", filepath.Join(dir, "etc", "local_api_credentials.yaml"))
	key := strings.TrimSpace(l.Cscli("bouncers", "add", "tiergate", "-o", "raw"))
	if key == "" || strings.ContainsAny(key, " \n") {
		t.Fatalf("cscli bouncers add printed %q, not one key", key)
	}
	write(t, l.KeyFile, key+"\n")
	return l
}

// start starts crowdsec and waits until it listens.
func (l *LAPI) start() error {
	cmd := exec.Command(l.bin, "-c", l.Config, "-no-cs", "-no-capi")
	cmd.Dir = l.dir
	p, err := proc.Start("crowdsec", filepath.Join(l.dir, "crowdsec.log"), cmd, proc.AppendLog())
	if err != nil {
		return err
	}
	l.p = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", l.addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("crowdsec's Local API did not start: %v", p.Exited())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			l.Stop()
			return fmt.Errorf("crowdsec's Local API did not listen on %s within 30s; its log:\n%s", l.addr, p.LogTail(30))
		}
	}
}

// Stop stops the Local API (its database stays); the test's end stops it too.
func (l *LAPI) Stop() {
	// crowdsec ends on SIGTERM by the signal: not a failure.
	if err := l.p.Stop(10 * time.Second); err != nil && !strings.Contains(err.Error(), "signal: terminated") {
		l.t.Logf("stopping crowdsec: %v", err)
	}
}

// Restart starts the Local API again after Stop, on the same port and database.
func (l *LAPI) Restart() {
	l.t.Helper()
	if err := l.start(); err != nil {
		l.t.Fatal(err)
	}
}

// Cscli runs cscli with args on this Local API's configuration and returns its
// standard output; it fails the test when cscli fails.
//
// cscli writes the database itself, beside the Local API: when SQLite finds it
// locked by the Local API's own write (the transaction was rolled back), cscli is
// run again, a few times.
func (l *LAPI) Cscli(args ...string) string {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for attempt := 1; ; attempt++ {
		cmd := exec.CommandContext(ctx, l.cscli, append([]string{"-c", l.Config}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err == nil {
			return string(out)
		}
		if attempt < 5 && ctx.Err() == nil && strings.Contains(stderr.String(), "database is locked") {
			time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
			continue
		}
		l.t.Fatalf("cscli %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
}

// DecisionID returns the ID of the active decision on target, given as cscli
// lists it ("Ip:198.51.100.7", "Range:203.0.113.0/24"), for cscli decisions
// delete --id: deleting by --ip also deletes the decisions of the ranges that
// hold the address. It fails the test when there is not exactly one.
func (l *LAPI) DecisionID(target string) string {
	l.t.Helper()
	var ids []string
	for _, line := range strings.Split(l.Cscli("decisions", "list", "-o", "raw"), "\n") {
		f := strings.Split(line, ",")
		if len(f) > 2 && f[2] == target {
			ids = append(ids, f[0])
		}
	}
	if len(ids) != 1 {
		l.t.Fatalf("cscli decisions list: decisions %v on %s, want one", ids, target)
	}
	return ids[0]
}

// Log returns the end of crowdsec's log.
func (l *LAPI) Log() string { return l.p.LogTail(40) }

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func write(t testing.TB, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// configYAML is the Local API's configuration: %[1]s the directory, %[2]s the
// address.
const configYAML = `common:
  daemonize: false
  log_media: stdout
  log_level: info
  working_dir: %[1]s
config_paths:
  config_dir: %[1]s/etc/
  data_dir: %[1]s/data/
  simulation_path: %[1]s/etc/simulation.yaml
  hub_dir: %[1]s/hub/
  index_path: %[1]s/hub/.index.json
  notification_dir: %[1]s/etc/notifications/
  plugin_dir: /usr/lib/crowdsec/plugins/
db_config:
  log_level: info
  type: sqlite
  db_path: %[1]s/data/crowdsec.db
  use_wal: true   # cscli and the Local API write the same database
api:
  client:
    credentials_path: %[1]s/etc/local_api_credentials.yaml
  server:
    log_level: info
    listen_uri: %[2]s
    profiles_path: %[1]s/etc/profiles.yaml
    trusted_ips:
      - 127.0.0.1
prometheus:
  enabled: false
`

const profilesYAML = `name: default_ip_remediation
filters:
 - Alert.Remediation == true && Alert.GetScope() == "Ip"
decisions:
 - type: ban
   duration: 4h
on_success: break
`
