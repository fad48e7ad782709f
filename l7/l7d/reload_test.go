package l7d

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// writeLeaf issues a new www.example.com certificate from a CA of its own and writes
// it, with its key, over dir/www.pem and dir/www.key. It returns the serial.
func writeLeaf(t *testing.T, dir string) *big.Int {
	t.Helper()
	ca, err := testpki.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf("www", "www.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.WriteFiles(dir, "t", leaf); err != nil {
		t.Fatal(err)
	}
	return leaf.Leaf.SerialNumber
}

// servedSerial connects to addr with openssl s_client (SNI www.example.com) and
// returns the serial of the leaf certificate it was sent.
func servedSerial(t *testing.T, addr string) *big.Int {
	t.Helper()
	openssl := testenv.RequireCommand(t, "openssl", "openssl")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", addr, "-servername", "www.example.com", "-showcerts")
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("openssl s_client -connect %s: %v\n%s", addr, err, out)
	}
	block, _ := pem.Decode(out[strings.Index(string(out), "-----BEGIN CERTIFICATE-----"):])
	if block == nil {
		t.Fatalf("openssl s_client -connect %s showed no certificate:\n%s", addr, out)
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return leaf.SerialNumber
}

// TestReloadRefusedKeepsCertificate: a reload that brings a good new certificate (a
// new serial in the same files) with something the L7 server refuses is refused
// whole: the old certificate stays on the wire. Once the configuration is good again,
// a reload serves the new one.
func TestReloadRefusedKeepsCertificate(t *testing.T) {
	testenv.RequireCommand(t, "openssl", "openssl")
	for _, tc := range []struct {
		name string
		bad  string // the listener's and backends' lines of a refused configuration
		code string // the error's code
	}{
		{"backend member without a port",
			`listeners: [{name: web, addr: "LISTEN", pool: app, disable_http3: true}]
backends: {app: {members: ["127.0.0.1"]}}`, "reload_failed"},
		{"listener limit that takes a restart",
			`listeners: [{name: web, addr: "LISTEN", pool: app, disable_http3: true, max_conns: 7}]
backends: {app: {members: ["127.0.0.1:9"]}}`, "restart_required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			admin, listen := freeAddr(t), freeAddr(t)
			certs := `certificates: {certificates: [{name: www, cert_file: ` + filepath.Join(dir, "www.pem") +
				`, key_file: ` + filepath.Join(dir, "www.key") + `}]}
admin_listen: "` + admin + `"
log_level: error
`
			good := `listeners: [{name: web, addr: "LISTEN", pool: app, disable_http3: true}]
backends: {app: {members: ["127.0.0.1:9"]}}
`
			path := filepath.Join(dir, "l7d.yaml")
			write := func(listeners string) {
				writeFile(t, path, strings.ReplaceAll(listeners, "LISTEN", listen)+"\n"+certs)
			}
			oldSerial := writeLeaf(t, dir)
			write(good)
			c, _ := runDaemon(t, path, admin)
			if got := servedSerial(t, listen); got.Cmp(oldSerial) != 0 {
				t.Fatalf("serving serial %x, want %x", got, oldSerial)
			}

			newSerial := writeLeaf(t, dir)
			write(tc.bad)
			if code, out, body := c.call("POST", "/reload", ""); code != 422 || out["status"] != 422.0 || out["code"] != tc.code ||
				!strings.Contains(body, "the running configuration stays") {
				t.Fatalf("the bad reload was answered %d %s, want 422 in the JSON error shape, code %s", code, body, tc.code)
			}
			if got := servedSerial(t, listen); got.Cmp(oldSerial) != 0 {
				t.Errorf("after a refused reload the listener serves serial %x (the new certificate), want the old %x", got, oldSerial)
			}

			write(good)
			if code, _, body := c.call("POST", "/reload", ""); code != 200 {
				t.Fatalf("the good reload was answered %d %s", code, body)
			}
			if got := servedSerial(t, listen); got.Cmp(newSerial) != 0 {
				t.Errorf("after a good reload the listener serves serial %x, want the new %x", got, newSerial)
			}
		})
	}
}

// TestConcurrentReloadsAndPushes: file reloads and blacklist pushes made at once queue
// behind each other on the daemon's owner: no push is lost to a reload, every reload
// is applied, and the state file ends equal to the list in force (run with -race).
func TestConcurrentReloadsAndPushes(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	files := writeList(t, dir, "global.txt", "192.0.2.1\n")
	admin := freeAddr(t)
	extra := "state_dir: " + stateDir + "\nblacklists: {global: {files: [" + files + "]}, web: {action: close}}\nlog_level: error\n"
	path := testConfig(t, dir, admin, extra)
	c, _ := runDaemon(t, path, admin)

	const pushers, each, reloads = 4, 15, 20
	var wg sync.WaitGroup
	for w := range pushers {
		wg.Go(func() {
			for i := range each {
				// Addresses two apart, so that none merge into a range.
				if code, _, body := c.call("POST", "/blacklists/global/delta", fmt.Sprintf("+10.%d.0.%d\n", w, 2*i)); code != 200 {
					t.Errorf("delta: %d %s", code, body)
				}
			}
		})
	}
	wg.Go(func() {
		for i := range reloads {
			// Each reload changes the file, so each is a real change.
			testConfig(t, dir, admin, extra+fmt.Sprintf("shutdown_grace: %ds\n", 10+i%2))
			if code, _, body := c.call("POST", "/reload", ""); code != 200 {
				t.Errorf("reload: %d %s", code, body)
			}
		}
	})
	wg.Go(func() {
		for range reloads {
			if code, _, body := c.call("PUT", "/blacklists/web", "198.51.100.0/24\n"); code != 200 {
				t.Errorf("PUT: %d %s", code, body)
			}
		}
	})
	wg.Wait()

	want := pushers*each + 1 // and the file's
	code, out, body := c.call("GET", "/blacklists/global", "")
	if code != 200 || out["entries"] != float64(want) || out["state_file"] != blacklist.StatePath(stateDir, "global") {
		t.Fatalf("after the storm: %d %s; want %d entries, from the state file", code, body, want)
	}
	disk := readStateFile(t, blacklist.StatePath(stateDir, "global"))
	if disk.Len() != want || !has(disk, "192.0.2.1") {
		t.Errorf("the state file holds %d entries, the list %d", disk.Len(), want)
	}
	for w := range pushers {
		for i := range each {
			if a := fmt.Sprintf("10.%d.0.%d", w, 2*i); !has(disk, a) {
				t.Errorf("%s lost", a)
			}
		}
	}
	if _, out, _ := c.call("GET", "/blacklists/web", ""); out["entries"] != 1.0 || out["action"] != "close" {
		t.Errorf("web after the storm: %v", out)
	}
	if _, _, metrics := c.call("GET", "/metrics", ""); !strings.Contains(metrics, fmt.Sprintf("tiergate_l7_reloads_total{result=\"ok\"} %d\n", reloads)) {
		t.Errorf("not %d reloads counted ok", reloads)
	}
}

// TestReloadBeforeStart: a Daemon that has not started refuses a reload instead of
// waiting for an owner that is not there.
func TestReloadBeforeStart(t *testing.T) {
	done := make(chan error, 1)
	go func() { done <- (&Daemon{Path: "unused.yaml"}).Reload() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not started") {
			t.Errorf("Reload before start: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Reload before start hangs")
	}
}
