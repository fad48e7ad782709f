package l7d

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/testkit/daemontest"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// freeAddr returns a loopback TCP address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// testCert writes the certificate "www" (www.example.com) and its key into dir as
// www.pem and www.key, unless they are there already.
func testCert(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "www.pem")); err == nil {
		return
	}
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
}

// testConfig writes a certificate and an l7d configuration (one listener "web",
// admin on admin, then extra) into dir, and returns the configuration's path.
func testConfig(t *testing.T, dir, admin, extra string) string {
	t.Helper()
	testCert(t, dir)
	cfg := `
listeners: [{name: web, addr: "127.0.0.1:0", pool: app, disable_http3: true}]
backends: {app: {members: ["127.0.0.1:9"]}}
certificates: {certificates: [{name: www, cert_file: ` + filepath.Join(dir, "www.pem") + `, key_file: ` + filepath.Join(dir, "www.key") + `}]}
admin_listen: "` + admin + `"
` + extra
	path := filepath.Join(dir, "l7d.yaml")
	writeFile(t, path, cfg)
	return path
}

func writeList(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	writeFile(t, path, text)
	return path
}

// adminClient calls an admin endpoint at base with an optional bearer token.
type adminClient struct {
	t     *testing.T
	base  string
	token string
}

// call makes a request and returns the status, the JSON object answered (if any) and
// the raw body.
func (c adminClient) call(method, path, body string) (int, map[string]any, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(b) > 0 && b[0] == '{' {
		if err := json.Unmarshal(b, &out); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode, out, string(b)
}

// setupDaemon builds a Daemon from path as Run does, without serving, and its admin
// handler on a test server with a client that sends the admin token in force; it is
// the first half of a start and may be repeated on the same files to play a restart.
func setupDaemon(t *testing.T, path string) (*Daemon, adminClient, *testenv.LockedBuffer) {
	t.Helper()
	var log testenv.LockedBuffer
	d := &Daemon{Path: path, Stderr: &log}
	if err := d.setup(false); err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(d.close)
	if err := d.bl.PrepareDir(listNames(d.current())); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.adminHandler())
	t.Cleanup(srv.Close)
	return d, adminClient{t: t, base: srv.URL, token: daemontest.Token(t, d.TokenFile())}, &log
}

// runDaemon runs a Daemon from path, whose admin endpoint is at admin, until the test
// ends, and returns a client of that endpoint that sends the admin token in force at
// start, and the daemon's log.
func runDaemon(t *testing.T, path, admin string) (adminClient, *testenv.LockedBuffer) {
	t.Helper()
	var log testenv.LockedBuffer
	d := &Daemon{Path: path, Stderr: &log}
	daemontest.Start(t, daemontest.Options{Name: "l7d", Run: d.Run, Serving: d.Serving(), Log: &log})
	return adminClient{t: t, base: "http://" + admin, token: daemontest.Token(t, d.TokenFile())}, &log
}

// readState reads a state file as a Set.
func readStateFile(t *testing.T, path string) *blacklist.Set {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := blacklist.ReadBinary(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s
}

func has(s interface{ Contains(netip.Addr) bool }, addr string) bool {
	return s.Contains(netip.MustParseAddr(addr))
}

// TestBlacklistStatePushRestartDrop: pushes and deltas are written to the list's state
// file before they are answered; a new daemon on the same files loads the lists from
// their state, not from their files; dropping the state goes back to the files.
func TestBlacklistStatePushRestartDrop(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state") // created at start
	files := writeList(t, dir, "global.txt", "192.0.2.1\n")
	path := testConfig(t, dir, "127.0.0.1:0", "state_dir: "+stateDir+"\nblacklists: {global: {files: ["+files+"]}}\n")
	globalState, webState := blacklist.StatePath(stateDir, "global"), blacklist.StatePath(stateDir, "web")

	d, c, _ := setupDaemon(t, path)
	if code, out, _ := c.call("GET", "/blacklists/global", ""); code != 200 || out["entries"] != 1.0 || out["state_file"] != nil {
		t.Fatalf("before any push: %d %v", code, out)
	}
	if _, err := os.Stat(globalState); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a state file before any push: %v", err)
	}
	if code, out, _ := c.call("PUT", "/blacklists/global", "198.51.100.7\n203.0.113.0/24 ttl=1h\n"); code != 200 || out["entries"] != 2.0 || out["state_file"] != globalState {
		t.Fatalf("PUT: %d %v", code, out)
	}
	s := readStateFile(t, globalState)
	if s.Len() != 2 || !has(s, "198.51.100.7") || !has(s, "203.0.113.9") || has(s, "192.0.2.1") {
		t.Errorf("state file after PUT: %d entries", s.Len())
	}
	for e := range s.All() {
		if e.Prefix.Addr().Is4() && e.Prefix.Bits() == 24 {
			if left := time.Until(e.Expires); left < 59*time.Minute || left > time.Hour+time.Second {
				t.Errorf("the ttl=1h entry expires in %v", left)
			}
		}
	}
	if code, out, _ := c.call("POST", "/blacklists/global/delta", "-198.51.100.7\n+2001:db8::1\n"); code != 200 || out["entries"] != 2.0 {
		t.Fatalf("delta: %d %v", code, out)
	}
	if s := readStateFile(t, globalState); has(s, "198.51.100.7") || !has(s, "2001:db8::1") || !has(s, "203.0.113.9") {
		t.Errorf("state file after the delta does not follow it")
	}
	if code, _, _ := c.call("POST", "/blacklists/web/delta", "+192.0.2.77\n"); code != 200 {
		t.Fatalf("delta to an empty listener list: %d", code)
	}
	if s := readStateFile(t, webState); s.Len() != 1 || !has(s, "192.0.2.77") {
		t.Errorf("listener state file: %d entries", s.Len())
	}
	if !has(d.lists.Global(), "2001:db8::1") || has(d.lists.Global(), "192.0.2.1") {
		t.Errorf("the list in force does not follow the pushes")
	}

	// A restart: the lists come from their state, the configured file is not read.
	d2, c2, log := setupDaemon(t, path)
	g := d2.lists.Global()
	if !has(g, "2001:db8::1") || !has(g, "203.0.113.9") || has(g, "198.51.100.7") || has(g, "192.0.2.1") || g.Len() != 2 {
		t.Errorf("after a restart the global list holds %d entries, not its pushed state", g.Len())
	}
	if !has(d2.lists.Listener("web"), "192.0.2.77") {
		t.Errorf("after a restart the listener list lost its pushed state")
	}
	if !strings.Contains(log.String(), "loaded from its pushed state") || !strings.Contains(log.String(), globalState) {
		t.Errorf("the log does not say where the list came from:\n%s", log)
	}
	if _, out, _ := c2.call("GET", "/blacklists/global", ""); out["state_file"] != globalState {
		t.Errorf("GET after restart: %v", out)
	}

	// Dropping the state: back to the file; a list with no files is emptied.
	if code, out, _ := c2.call("DELETE", "/blacklists/global/state", ""); code != 200 || out["entries"] != 1.0 || out["state_file"] != nil {
		t.Errorf("DELETE state: %d %v", code, out)
	}
	if !has(g, "192.0.2.1") || has(g, "2001:db8::1") {
		t.Errorf("after DELETE state the list is not its file")
	}
	if _, err := os.Stat(globalState); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file left: %v", err)
	}
	if code, out, _ := c2.call("DELETE", "/blacklists/web/state", ""); code != 200 || out["entries"] != 0.0 {
		t.Errorf("DELETE state of a list without files: %d %v", code, out)
	}
	if code, _, _ := c2.call("DELETE", "/blacklists/web/state", ""); code != 200 {
		t.Errorf("DELETE state again: %d", code)
	}
	if code, out, _ := c2.call("DELETE", "/blacklists/nosuch/state", ""); code != 404 || out["code"] != "unknown_list" {
		t.Errorf("DELETE state of an unknown list: %d %v", code, out)
	}
	d3, _, _ := setupDaemon(t, path)
	if !has(d3.lists.Global(), "192.0.2.1") || d3.lists.Global().Len() != 1 || d3.lists.Listener("web").Len() != 0 {
		t.Errorf("after dropping the state, a restart does not load the files")
	}
}

// TestBlacklistStateWithoutStateDir: without state_dir nothing is written, a restart
// loads the files, and DELETE state still goes back to them.
func TestBlacklistStateWithoutStateDir(t *testing.T) {
	dir := t.TempDir()
	files := writeList(t, dir, "global.txt", "192.0.2.1\n")
	path := testConfig(t, dir, "127.0.0.1:0", "blacklists: {global: {files: ["+files+"]}}\n")
	d, c, _ := setupDaemon(t, path)
	if code, out, _ := c.call("PUT", "/blacklists/global", "198.51.100.7\n"); code != 200 || out["state_file"] != nil {
		t.Fatalf("PUT: %d %v", code, out)
	}
	if names, _ := filepath.Glob(filepath.Join(dir, "*.bin")); len(names) != 0 {
		t.Errorf("files written without state_dir: %v", names)
	}
	d2, _, _ := setupDaemon(t, path)
	if !has(d2.lists.Global(), "192.0.2.1") || has(d2.lists.Global(), "198.51.100.7") {
		t.Errorf("without state_dir a restart must load the files")
	}
	if code, _, _ := c.call("DELETE", "/blacklists/global/state", ""); code != 200 || !has(d.lists.Global(), "192.0.2.1") || has(d.lists.Global(), "198.51.100.7") {
		t.Errorf("DELETE state without state_dir: %d", code)
	}
}

// TestBlacklistStateCorrupt: a state file that is not a whole binary list fails the
// start, naming the file.
func TestBlacklistStateCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func([]byte) []byte
		want    string
	}{
		{"flipped byte", func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }, "checksum"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-3] }, "checksum"},
		{"empty", func([]byte) []byte { return nil }, "not a binary blacklist"},
		{"text", func([]byte) []byte { return []byte("192.0.2.1\n") }, "not a binary blacklist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			stateDir := filepath.Join(dir, "state")
			path := testConfig(t, dir, "127.0.0.1:0", "state_dir: "+stateDir+"\n")
			_, c, _ := setupDaemon(t, path)
			if code, _, _ := c.call("PUT", "/blacklists/web", "192.0.2.1\n192.0.2.3\n2001:db8::/64\n"); code != 200 {
				t.Fatalf("PUT: %d", code)
			}
			file := blacklist.StatePath(stateDir, "web")
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, file, string(tc.corrupt(b)))
			d := &Daemon{Path: path, Stderr: io.Discard}
			err = d.setup(false)
			if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "blacklists.web") {
				t.Errorf("start with a corrupt state file: %v; want an error naming %s and %q", err, file, tc.want)
			}
			var check bytes.Buffer
			if err := (&Daemon{Path: path, Stderr: io.Discard}).Check(&check); err == nil {
				t.Errorf("l7d check passed a corrupt state file")
			}
		})
	}
}

// TestBlacklistStateWriteFailure: a push whose state cannot be written is answered 500
// and changes nothing, in memory or on disk.
func TestBlacklistStateWriteFailure(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	path := testConfig(t, dir, "127.0.0.1:0", "state_dir: "+stateDir+"\n")
	d, c, _ := setupDaemon(t, path)
	if code, _, _ := c.call("PUT", "/blacklists/global", "192.0.2.1\n"); code != 200 {
		t.Fatalf("PUT: %d", code)
	}
	// The directory becomes unusable (a file in its place; chmod does not stop root).
	if err := os.RemoveAll(stateDir); err != nil {
		t.Fatal(err)
	}
	writeFile(t, stateDir, "not a directory\n")
	before := d.lists.Global().Snapshot()
	for _, req := range []struct{ method, path, body string }{
		{"PUT", "/blacklists/global", "198.51.100.1\n"},
		{"POST", "/blacklists/global/delta", "+198.51.100.2\n-192.0.2.1\n"},
		{"DELETE", "/blacklists/global/state", ""},
	} {
		code, out, body := c.call(req.method, req.path, req.body)
		if code != 500 || out["code"] != "state_write_failed" || out["status"] != 500.0 || !strings.Contains(body, stateDir) {
			t.Errorf("%s %s with an unwritable state_dir: %d %s", req.method, req.path, code, body)
		}
		if d.lists.Global().Snapshot() != before {
			t.Errorf("%s %s: the list in force changed although its state was not written", req.method, req.path)
		}
	}
	// A bad upload is still a 422, whatever the disk.
	if code, out, _ := c.call("PUT", "/blacklists/global", "bogus\n"); code != 422 || out["code"] != "bad_lines" {
		t.Errorf("bad upload: %d %v", code, out)
	}
	// The directory back: pushes work again.
	os.Remove(stateDir)
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := c.call("PUT", "/blacklists/global", "198.51.100.1\n"); code != 200 || !has(d.lists.Global(), "198.51.100.1") {
		t.Errorf("PUT once the directory is back: %d", code)
	}
	if s := readStateFile(t, blacklist.StatePath(stateDir, "global")); !has(s, "198.51.100.1") || has(s, "192.0.2.1") {
		t.Errorf("state file once the directory is back")
	}
}

// TestBlacklistStateReload: with a running daemon, a reload keeps the pushed state
// whatever the files do, refuses a corrupt state file (the lists in force stay), and
// refuses a change of state_dir.
func TestBlacklistStateReload(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	files := writeList(t, dir, "global.txt", "192.0.2.1\n")
	admin := freeAddr(t)
	extra := "state_dir: " + stateDir + "\nblacklists: {global: {files: [" + files + "]}}\nlog_level: debug\n"
	path := testConfig(t, dir, admin, extra)
	c, log := runDaemon(t, path, admin)
	entries := func() float64 {
		t.Helper()
		_, out, _ := c.call("GET", "/blacklists/global", "")
		return out["entries"].(float64)
	}
	reload := func() (int, string) {
		t.Helper()
		code, _, body := c.call("POST", "/reload", "")
		return code, body
	}

	if code, _, _ := c.call("PUT", "/blacklists/global", "198.51.100.1\n198.51.100.3\n"); code != 200 {
		t.Fatalf("PUT: %d", code)
	}
	writeList(t, dir, "global.txt", "192.0.2.1\n192.0.2.3\n192.0.2.5\n192.0.2.7\n")
	if code, body := reload(); code != 200 || entries() != 2 {
		t.Fatalf("reload with pushed state and a changed file: %d %s, %v entries, want the 2 pushed", code, body, entries())
	}

	// A corrupt state file: the reload is refused, naming it; the list stays.
	file := blacklist.StatePath(stateDir, "global")
	b, _ := os.ReadFile(file)
	b[len(b)-1] ^= 1
	writeFile(t, file, string(b))
	if code, body := reload(); code != 422 || !strings.Contains(body, file) || !strings.Contains(body, "checksum") {
		t.Errorf("reload with a corrupt state file: %d %s", code, body)
	}
	if entries() != 2 {
		t.Errorf("a refused reload changed the list")
	}
	// The state file rewritten by a push; then dropped: the reload loads the file.
	if code, _, _ := c.call("POST", "/blacklists/global/delta", "+198.51.100.5\n"); code != 200 || entries() != 3 {
		t.Fatalf("delta over a corrupt state file: %d", code)
	}
	if code, body := reload(); code != 200 || entries() != 3 {
		t.Errorf("reload after the state was rewritten: %d %s", code, body)
	}
	os.Remove(file)
	if code, body := reload(); code != 200 || entries() != 4 {
		t.Errorf("reload with the state file removed by hand: %d %s, %v entries, want the file's 4", code, body, entries())
	}
	if code, out, _ := c.call("GET", "/blacklists/global", ""); code != 200 || out["state_file"] != nil {
		t.Errorf("after the state file went: %v", out)
	}

	// state_dir cannot change on reload.
	testConfig(t, dir, admin, strings.Replace(extra, stateDir, stateDir+"2", 1))
	if code, body := reload(); code != 422 || !strings.Contains(body, "state_dir changed") {
		t.Errorf("reload changing state_dir: %d %s", code, body)
	}
	if !strings.Contains(log.String(), "blacklist loaded from its files") {
		t.Errorf("the log does not say the list came from its files:\n%s", log)
	}
}

// TestBlacklistStateConcurrentDeltas: deltas pushed at once are applied one after
// the other: none is lost, and the state file ends equal to the list in force.
func TestBlacklistStateConcurrentDeltas(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	d, c, _ := setupDaemon(t, testConfig(t, dir, "127.0.0.1:0", "state_dir: "+stateDir+"\n"))
	const workers, each = 8, 10
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				// Addresses two apart, so that none merge into a range.
				if code, _, body := c.call("POST", "/blacklists/global/delta", fmt.Sprintf("+10.%d.0.%d\n", w, 2*i)); code != 200 {
					t.Errorf("delta: %d %s", code, body)
				}
			}
		})
	}
	wg.Wait()
	mem := d.lists.Global().Snapshot()
	disk := readStateFile(t, blacklist.StatePath(stateDir, "global"))
	if mem.Len() != workers*each || disk.Len() != mem.Len() {
		t.Fatalf("%d entries in force, %d in the state file; want %d", mem.Len(), disk.Len(), workers*each)
	}
	for e := range mem.All() {
		if !disk.Contains(e.Prefix.Addr()) {
			t.Errorf("%v in force, not in the state file", e.Prefix)
		}
	}
}
