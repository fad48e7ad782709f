package l4d

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/dpdk"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/testkit/daemontest"
)

// testConfig runs two workers over two in-memory ports; members are not health
// checked (type none), so no test reaches the network.
const testConfig = `
admin_listen: "127.0.0.1:0"
log_level: debug
dpdk: {workers: 2, idle_sleep: 1ms}
ports:
  external: {device: mem0, addr: 198.18.0.2/24, gateway: 198.18.0.1}
  internal: {device: mem1, addr: 10.0.0.2/24}
conntrack: {capacity: 4096}
rules:
  - {name: web, vip: 203.0.113.10, protocol: tcp, port: 443, pool: l7}
pools:
  l7:
    members:
      - {name: a, address: 10.0.0.11}
      - {name: b, address: 10.0.0.12, weight: 2}
    health: {type: none}
`

// memDevice is an in-memory port with a link state and counters the test sets.
type memDevice struct {
	*port.Mem
	down  atomic.Bool
	stats dpdk.Stats
}

func (m *memDevice) Link() (bool, uint32, error) { return !m.down.Load(), 10000, nil }
func (m *memDevice) Stats() (dpdk.Stats, error)  { return m.stats, nil }

// testPorts opens in-memory devices in place of DPDK.
type testPorts struct {
	mu       sync.Mutex
	devs     map[string]*memDevice
	closed   atomic.Int32
	initFail error
}

func (tp *testPorts) open(cfg *FileConfig, _ *slog.Logger) (*portSet, error) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	q := cfg.DPDK.Workers
	mk := func(role string, mac byte) *memDevice {
		m := &memDevice{Mem: port.NewMem(role, [6]byte{2, 0, 0, 0, 0, mac}, q, 4096, 2048)}
		m.stats = dpdk.Stats{RxPackets: 10, TxPackets: 20, RxBytes: 1000, TxBytes: 2000, RxMissed: 1, RxNoMbuf: 2}
		return m
	}
	tp.devs = map[string]*memDevice{"external": mk("external", 1)}
	ps := &portSet{external: tp.devs["external"], internal: tp.devs["external"], devices: []device{tp.devs["external"]}}
	if !cfg.sameDevice() {
		tp.devs["internal"] = mk("internal", 2)
		ps.internal = tp.devs["internal"]
		ps.devices = append(ps.devices, tp.devs["internal"])
	}
	ps.workerInit = func(int) (func(), error) { return nil, tp.initFail }
	ps.close = func() { tp.closed.Add(1) }
	return ps, nil
}

func (tp *testPorts) dev(role string) *memDevice {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.devs[role]
}

// testDaemon is a Daemon running in the background over in-memory ports.
type testDaemon struct {
	*Daemon
	t     *testing.T
	url   string
	ports *testPorts
	stop  func() error
	// token is the admin token in force at start, sent with every request.
	token string
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startDaemon runs l4d with the configuration file at path.
func startDaemon(t *testing.T, path string) *testDaemon {
	t.Helper()
	tp := &testPorts{}
	d := &Daemon{Path: path, Stderr: io.Discard, openPorts: tp.open}
	if testing.Verbose() {
		d.Stderr = os.Stderr
	}
	stop := daemontest.Start(t, daemontest.Options{Name: "l4d", Run: d.Run, Serving: d.Serving()})
	return &testDaemon{Daemon: d, t: t, url: "http://" + d.AdminAddr().String(), ports: tp, stop: stop,
		token: daemontest.Token(t, d.TokenFile())}
}

func startWith(t *testing.T, config string) *testDaemon {
	path := filepath.Join(t.TempDir(), "l4d.yaml")
	writeFile(t, path, config)
	return startDaemon(t, path)
}

// do sends a request with an optional JSON body and returns the status and body.
func (td *testDaemon) do(method, path, body string) (int, string) {
	td.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, td.url+path, r)
	if err != nil {
		td.t.Fatal(err)
	}
	if td.token != "" {
		req.Header.Set("Authorization", "Bearer "+td.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		td.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		td.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// want sends a request and checks the status and that the body contains each of
// parts; it returns the body.
func (td *testDaemon) want(method, path, body string, status int, parts ...string) string {
	td.t.Helper()
	got, b := td.do(method, path, body)
	if got != status {
		td.t.Errorf("%s %s: status %d, want %d; body %s", method, path, got, status, b)
		return b
	}
	for _, p := range parts {
		if !strings.Contains(b, p) {
			td.t.Errorf("%s %s: body lacks %q:\n%s", method, path, p, brief(b))
		}
	}
	return b
}

// brief returns the tiergate metrics of a /metrics body, or the whole of another.
func brief(body string) string {
	if !strings.Contains(body, "# HELP") {
		return body
	}
	var keep []string
	for l := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(l, "tiergate_") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// apiErr checks that body is the API's error shape with status and code.
func apiErr(t *testing.T, body string, status int, code string) {
	t.Helper()
	var e struct {
		Status  int    `json:"status"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Status != status || e.Code != code || e.Message == "" {
		t.Errorf("error body %s: want status %d, code %q and a message", body, status, code)
	}
}

func (td *testDaemon) config() Forwarding {
	td.t.Helper()
	_, b := td.do("GET", "/config", "")
	var f Forwarding
	if err := json.Unmarshal([]byte(b), &f); err != nil {
		td.t.Fatalf("GET /config: %v: %s", err, b)
	}
	return f
}

func (td *testDaemon) status() datapath.Status {
	td.t.Helper()
	_, b := td.do("GET", "/status", "")
	var s datapath.Status
	if err := json.Unmarshal([]byte(b), &s); err != nil {
		td.t.Fatalf("GET /status: %v: %s", err, b)
	}
	return s
}

func (td *testDaemon) member(pool, name string) datapath.MemberStatus {
	td.t.Helper()
	for _, m := range td.status().Members {
		if m.Pool == pool && m.Name == name && !m.Retired {
			return m
		}
	}
	td.t.Fatalf("no member %s/%s in /status", pool, name)
	return datapath.MemberStatus{}
}

func TestHealthAndMetrics(t *testing.T) {
	td := startWith(t, testConfig)
	td.want("GET", "/healthz", "", 200, "ok")
	td.ports.dev("internal").down.Store(true)
	td.want("GET", "/healthz", "", 503, "port internal: link down")
	td.ports.dev("internal").down.Store(false)
	td.want("GET", "/healthz", "", 200)

	// A frame the datapath cannot parse is counted by its drop reason.
	td.ports.dev("external").Inject([]byte{1, 2, 3})
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(td.want("GET", "/metrics", "", 200), `tiergate_l4_packets_total{dir="in",result="truncated"} 1`) {
		if time.Now().After(deadline) {
			t.Fatalf("the truncated frame was not counted:\n%s", brief(td.want("GET", "/metrics", "", 200)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	td.want("GET", "/metrics", "", 200,
		`tiergate_l4_port_packets_total{dir="rx",port="external"} 10`,
		`tiergate_l4_port_packets_total{dir="tx",port="internal"} 20`,
		`tiergate_l4_port_bytes_total{dir="rx",port="external"} 1000`,
		`tiergate_l4_port_missed_total{port="external"} 1`,
		`tiergate_l4_port_errors_total{dir="tx",port="external"} 0`,
		`tiergate_l4_port_nombuf_total{port="internal"} 2`,
		`tiergate_l4_port_link_up{port="external"} 1`,
		`tiergate_l4_member_up{member="b",pool="l7"} 1`,
		`tiergate_l4_connections 0`,
		`tiergate_l4_overload_state 0`,
		"go_goroutines")
	td.want("GET", "/status", "", 200, `"name": "web"`, `"vip": "203.0.113.10"`, `"overload": {`, `"state": "normal"`)
}

// TestLameDuck stops l4d with a lame_duck delay: /healthz answers 503 "shutting
// down" while the admin endpoint and the datapath still run, and the stop ends only
// after the delay.
func TestLameDuck(t *testing.T) {
	const delay = 400 * time.Millisecond
	td := startWith(t, testConfig+"lame_duck: 400ms\n")
	td.want("GET", "/healthz", "", 200, "ok")
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- td.stop() }()
	daemontest.WaitShuttingDown(t, func() (int, string) { return td.do("GET", "/healthz", "") })
	if !td.running.Load() {
		t.Errorf("the datapath stopped during the lame-duck delay")
	}
	td.want("GET", "/rules/web", "", 200, `"name": "web"`)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < delay {
		t.Errorf("stopped after %v, before lame_duck (%v)", took, delay)
	}
	if td.ports.closed.Load() != 1 {
		t.Errorf("ports closed %d times", td.ports.closed.Load())
	}
}

func TestRulesAPI(t *testing.T) {
	td := startWith(t, testConfig)
	td.want("GET", "/rules", "", 200, `"name": "web"`)
	td.want("GET", "/rules/web", "", 200, `"vip": "203.0.113.10"`, `"port": 443`)
	apiErr(t, td.want("GET", "/rules/nope", "", 404), 404, codeNotFound)

	td.want("PUT", "/rules/dns", `{"vip": "203.0.113.11", "protocol": "udp", "port": 53, "pool": "l7"}`, 201, `"name": "dns"`)
	td.want("PUT", "/rules/dns", `{"name": "dns", "vip": "203.0.113.11", "protocol": "udp", "port": 53, "pool": "l7", "scheduler": "wrr"}`, 200, `"scheduler": "wrr"`)
	if f := td.config(); len(f.Rules) != 2 || f.Rules[1].Scheduler != "wrr" {
		t.Errorf("config after PUT /rules/dns: %+v", f.Rules)
	}
	if s := td.status(); len(s.Rules) != 2 {
		t.Errorf("datapath rules after PUT: %+v", s.Rules)
	}

	// Rejected changes leave the configuration as it was.
	before := td.config()
	for _, tc := range []struct {
		body, code, msg string
	}{
		{`{"vip": "www", "protocol": "udp", "port": 53, "pool": "l7"}`, codeInvalidConfig, `vip: line 1: \"www\": ParseAddr(\"www\"): unable to parse IP`},
		{`{"vip": "203.0.113.11", "protocol": "udp", "port": 53, "pool": "nope"}`, codeInvalidConfig, `rules[1].pool: \"nope\" is not a pool`},
		{`{"vip": "203.0.113.10", "protocol": "tcp", "port": 443, "pool": "l7"}`, codeInvalidConfig, `is also rule \"web\"`},
		{`{"vip": "2001:db8::1", "protocol": "tcp", "port": 443, "pool": "l7"}`, codeInvalidConfig, "has no external address of its family"},
		{`{"name": "other", "vip": "203.0.113.11", "protocol": "udp", "port": 53, "pool": "l7"}`, codeBadRequest, `the body names rule \"other\"`},
		{`{"vip": "203.0.113.11", "proto": "udp"}`, codeBadRequest, `unknown field \"proto\"`},
		{`{"vip": "203.0.113.11"} {}`, codeBadRequest, "data after the JSON value"},
		{`[`, codeBadRequest, "decoding the request body"},
	} {
		b := td.want("PUT", "/rules/dns", tc.body, 400, tc.msg)
		apiErr(t, b, 400, tc.code)
	}
	if after := td.config(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a rejected change changed the configuration:\n%+v\n%+v", before, after)
	}

	td.want("DELETE", "/rules/dns", "", 204)
	apiErr(t, td.want("DELETE", "/rules/dns", "", 404), 404, codeNotFound)
	if f := td.config(); len(f.Rules) != 1 {
		t.Errorf("rules after DELETE: %+v", f.Rules)
	}
	td.want("GET", "/metrics", "", 200,
		`tiergate_l4_config_changes_total{result="ok",source="api"} 3`,
		`tiergate_l4_config_changes_total{result="error",source="api"} 3`)
}

func TestPoolsAPI(t *testing.T) {
	td := startWith(t, testConfig)
	td.want("GET", "/pools", "", 200, `"l7"`, `"address": "10.0.0.12"`)
	apiErr(t, td.want("GET", "/pools/nope", "", 404), 404, codeNotFound)

	td.want("PUT", "/pools/l7b", `{"members": [{"name": "c", "address": "10.0.0.13"}], "health": {"type": "none"}}`, 201, `"name": "c"`)
	td.want("PUT", "/rules/web", `{"vip": "203.0.113.10", "protocol": "tcp", "port": 443, "pool": "l7b"}`, 200)
	// l7 is unused now and may go; l7b is used and may not.
	b := td.want("DELETE", "/pools/l7b", "", 400, `is not a pool`)
	apiErr(t, b, 400, codeInvalidConfig)
	td.want("DELETE", "/pools/l7", "", 204)
	td.want("PUT", "/pools/l7b", `{"members": [{"name": "c", "address": "10.0.0.13"}], "health": {"type": "http", "interval": "5s", "timeout": "10s"}}`,
		400, "pools.l7b.health.timeout: 10s must be positive and at most the interval")
	td.want("PUT", "/pools/l7b", `{"members": [], "health": {"interval": "5x"}}`, 400, `unknown unit`)

	// Members.
	td.want("PUT", "/pools/l7b/members/d", `{"address": "10.0.0.14", "weight": 3, "quic_id": 4}`, 201, `"quic_id": 4`)
	td.want("PUT", "/pools/l7b/members/d", `{"address": "10.0.0.15", "weight": 3}`, 200)
	apiErr(t, td.want("PUT", "/pools/nope/members/d", `{"address": "10.0.0.14"}`, 404), 404, codeNotFound)
	td.want("PUT", "/pools/l7b/members/e", `{"address": "10.0.0.16", "quic_id": 0}`, 201)
	td.want("PUT", "/pools/l7b/members/f", `{"address": "nope"}`, 400, `address: line 1: \"nope\": ParseAddr(\"nope\"): unable to parse IP`)
	if m := td.member("l7b", "d"); m.Address != "10.0.0.15" || m.Drained {
		t.Errorf("member d: %+v", m)
	}

	td.want("POST", "/pools/l7b/members/d/drain", "", 200, `"drained": true`)
	if m := td.member("l7b", "d"); !m.Drained {
		t.Errorf("member d not drained in the datapath: %+v", m)
	}
	td.want("GET", "/pools/l7b", "", 200, `"drained": true`)
	td.want("POST", "/pools/l7b/members/d/undrain", "", 200, `"name": "d"`)
	if m := td.member("l7b", "d"); m.Drained {
		t.Errorf("member d still drained: %+v", m)
	}
	apiErr(t, td.want("POST", "/pools/l7b/members/zz/drain", "", 404), 404, codeNotFound)
	apiErr(t, td.want("POST", "/pools/zz/members/d/drain", "", 404), 404, codeNotFound)

	td.want("DELETE", "/pools/l7b/members/e", "", 204)
	apiErr(t, td.want("DELETE", "/pools/l7b/members/e", "", 404), 404, codeNotFound)
	f := td.config()
	if len(f.Pools) != 1 || len(f.Pools["l7b"].Members) != 2 || f.Pools["l7b"].Members[1].Weight != 3 {
		t.Errorf("pools after the changes: %+v", f.Pools)
	}
}

func TestPutConfig(t *testing.T) {
	td := startWith(t, testConfig)
	f := td.config()
	f.Rules = append(f.Rules, datapath.RuleConfig{Name: "quic", VIP: netip.MustParseAddr("203.0.113.10"), Protocol: "udp", Port: 443, Pool: "l7", QUIC: true})
	f.Tunnel = datapath.TunnelConfig{Mode: "ipip", MTU: 9000}
	f.Conntrack.Timeouts.UDP = config.Duration(time.Minute)
	body, _ := json.Marshal(f)
	td.want("PUT", "/config", string(body), 200, `"mode": "ipip"`, `"udp": "1m0s"`)
	got := td.config()
	if len(got.Rules) != 2 || !got.Rules[1].QUIC || got.Tunnel.Mode != "ipip" || got.Conntrack.Capacity != 4096 {
		t.Errorf("config after PUT: %+v", got)
	}

	// The whole file as JSON, with the sections fixed at start unchanged, is accepted.
	cfg, err := ParseConfig([]byte(testConfig), "t")
	if err != nil {
		t.Fatal(err)
	}
	whole, _ := json.Marshal(cfg)
	td.want("PUT", "/config", string(whole), 200, `"tunnel": {}`)

	for _, tc := range []struct{ edit, msg string }{
		{`"ports": {"external": {"device": "mem9", "addr": "198.18.0.2/24"}}`, "ports cannot change at runtime"},
		{`"dpdk": {"workers": 4}`, "dpdk cannot change at runtime"},
		{`"hash_seed": 5`, "hash_seed cannot change"},
		{`"conntrack": {"capacity": 99}`, "conntrack.capacity cannot change"},
		{`"state_file": "/tmp/x"`, "state_file cannot change"},
	} {
		b := td.want("PUT", "/config", `{"rules": [], "pools": {}, `+tc.edit+`}`, 409, tc.msg, "restart l4d")
		apiErr(t, b, 409, codeRestartRequired)
	}
	td.want("PUT", "/config", `{"rules": [], "pools": {}, "dpdk": {"workers": 2, "idle_sleep": "1ms"}, "conntrack": {"capacity": 4096}}`, 200)
	if f := td.config(); len(f.Rules) != 0 {
		t.Errorf("rules after an empty PUT: %+v", f.Rules)
	}
	apiErr(t, td.want("PUT", "/config", `{"log_level": "loud"}`, 400), 400, codeInvalidConfig)
	td.want("PUT", "/config", `{"log_level": "warn"}`, 200)
	if td.Level.Level() != slog.LevelWarn {
		t.Errorf("log level %v after PUT /config log_level warn", td.Level.Level())
	}
}

func TestReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "l4d.yaml")
	writeFile(t, path, testConfig)
	td := startDaemon(t, path)
	td.want("PUT", "/rules/api", `{"vip": "203.0.113.12", "protocol": "tcp", "port": 443, "pool": "l7"}`, 201)

	// A reload re-reads the file: the API's change is gone, the file's new rule in.
	writeFile(t, path, strings.Replace(testConfig, "rules:\n", "rules:\n  - {name: dns, vip: 203.0.113.11, protocol: udp, port: 53, pool: l7}\n", 1))
	td.want("POST", "/reload", "", 200, `"name": "dns"`)
	if f := td.config(); len(f.Rules) != 2 || f.Rules[0].Name != "dns" {
		t.Errorf("rules after reload: %+v", f.Rules)
	}

	// Changes of the sections fixed at start are refused; the configuration stays.
	writeFile(t, path, strings.Replace(testConfig, "workers: 2", "workers: 1", 1))
	apiErr(t, td.want("POST", "/reload", "", 409, "dpdk cannot change at runtime"), 409, codeRestartRequired)
	writeFile(t, path, strings.Replace(testConfig, "device: mem1", "device: mem2", 1)+"hash_seed: 3\n")
	td.want("POST", "/reload", "", 409, "hash_seed, ports cannot change")
	writeFile(t, path, strings.Replace(testConfig, "port: 443", "port: 0", 1))
	apiErr(t, td.want("POST", "/reload", "", 400, "rules[0].port: required"), 400, codeInvalidConfig)
	if f := td.config(); len(f.Rules) != 2 {
		t.Errorf("a failed reload changed the rules: %+v", f.Rules)
	}

	// SIGHUP reloads too.
	writeFile(t, path, strings.Replace(testConfig, "log_level: debug", "log_level: error", 1))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(td.config().Rules) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not reload")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if td.Level.Level() != slog.LevelError {
		t.Errorf("log level %v after reload", td.Level.Level())
	}
	td.want("GET", "/metrics", "", 200, `tiergate_l4_config_changes_total{result="ok",source="reload"} 2`,
		`tiergate_l4_config_changes_total{result="error",source="reload"} 3`)
}

func TestStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "l4d.yaml")
	state := filepath.Join(dir, "state.json")
	config := testConfig + "state_file: " + state + "\n"
	writeFile(t, path, config)

	td := startDaemon(t, path)
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file written before any change: %v", err)
	}
	td.want("PUT", "/rules/api", `{"vip": "203.0.113.12", "protocol": "tcp", "port": 443, "pool": "l7"}`, 201)
	td.want("POST", "/pools/l7/members/a/drain", "", 200)
	saved, err := readState(state)
	if err != nil {
		t.Fatal(err)
	}
	if len(saved.Rules) != 2 || !saved.Pools["l7"].Members[0].Drained {
		t.Errorf("state file after two changes: %+v", saved)
	}
	// A rejected change leaves the state file, and no temporary file, behind.
	td.want("PUT", "/rules/bad", `{"vip": "x"}`, 400)
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("files beside the state: %v", entries)
	}

	// A reload keeps the state file's rules.
	td.want("POST", "/reload", "", 200, `"name": "api"`)
	if err := td.stop(); err != nil {
		t.Fatal(err)
	}
	if n := td.ports.closed.Load(); n != 1 {
		t.Errorf("ports closed %d times", n)
	}

	// A restart starts from the state file.
	td = startDaemon(t, path)
	if f := td.config(); len(f.Rules) != 2 || !f.Pools["l7"].Members[0].Drained || f.Conntrack.Capacity != 4096 {
		t.Errorf("config after restart: %+v", f)
	}
	if m := td.member("l7", "a"); !m.Drained {
		t.Errorf("member a not drained after restart: %+v", m)
	}
	var out bytes.Buffer
	if err := (&Daemon{Path: path}).Check(&out); err != nil || !strings.Contains(out.String(), "2 rules and 1 pools from "+state) {
		t.Errorf("check: %v\n%s", err, out.String())
	}

	// Without the state file, a reload goes back to the configuration file's.
	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	td.want("POST", "/reload", "", 200)
	if f := td.config(); len(f.Rules) != 1 || f.Pools["l7"].Members[0].Drained {
		t.Errorf("config after removing the state file: %+v", f)
	}

	// A state file that does not fit the configuration stops the start.
	writeFile(t, state, `{"rules": [{"name": "x", "vip": "2001:db8::1", "protocol": "tcp", "port": 1, "pool": "p"}], "pools": {"p": {"members": []}}}`)
	var buf bytes.Buffer
	if code := Main([]string{"check", "-config", path}, &buf, &buf); code != 1 || !strings.Contains(buf.String(), "delete it") {
		t.Errorf("check with a bad state file: %d %s", code, buf.String())
	}
	writeFile(t, state, `{"rulez": []}`)
	buf.Reset()
	if code := Main([]string{"check", "-config", path}, &buf, &buf); code != 1 || !strings.Contains(buf.String(), `unknown field "rulez"`) {
		t.Errorf("check with an unknown field in the state file: %d %s", code, buf.String())
	}
}

func TestStartFailures(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l4d.yaml")
	writeFile(t, path, testConfig)

	d := &Daemon{Path: path, Stderr: io.Discard, openPorts: func(*FileConfig, *slog.Logger) (*portSet, error) {
		return nil, errors.New("no such device")
	}}
	if err := d.Run(context.Background()); err == nil || err.Error() != "no such device" {
		t.Errorf("Run with ports that do not open: %v", err)
	}

	tp := &testPorts{initFail: errors.New("no lcore")}
	d = &Daemon{Path: path, Stderr: io.Discard, openPorts: tp.open}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Run(ctx); err == nil || !strings.Contains(err.Error(), "no lcore") {
		t.Errorf("Run with workers that cannot start: %v", err)
	}
	if tp.closed.Load() != 1 {
		t.Errorf("ports closed %d times after a failed start", tp.closed.Load())
	}

	writeFile(t, path, strings.Replace(testConfig, `"127.0.0.1:0"`, `"127.0.0.1:99999"`, 1))
	tp = &testPorts{}
	d = &Daemon{Path: path, Stderr: io.Discard, openPorts: tp.open}
	if err := d.Run(ctx); err == nil || !strings.Contains(err.Error(), "admin listener") || tp.closed.Load() != 1 {
		t.Errorf("Run with a bad admin address: %v (ports closed %d)", err, tp.closed.Load())
	}
}

func TestMain_(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l4d.yaml")
	writeFile(t, path, testConfig)
	var out, errb bytes.Buffer
	if code := Main([]string{"check", "-config", path}, &out, &errb); code != 0 || !strings.Contains(out.String(), "configuration OK") ||
		!strings.Contains(out.String(), "ports mem0, mem1; 2 workers") {
		t.Errorf("check: %d %s %s", code, out.String(), errb.String())
	}
	if code := Main([]string{"check", "-config", "../../deploy/l4d.yaml"}, &out, &errb); code != 0 {
		t.Errorf("check of the sample: %d %s", code, errb.String())
	}
	writeFile(t, path, "ports: {}\n")
	errb.Reset()
	if code := Main([]string{"check", "-config", path}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "ports.external.device: required") {
		t.Errorf("check of a bad file: %d %s", code, errb.String())
	}
	for _, args := range [][]string{nil, {"frobnicate"}, {"run", "-bogus"}, {"check", "extra"}} {
		if code := Main(args, &out, &errb); code != 2 {
			t.Errorf("Main(%q) = %d, want 2", args, code)
		}
	}
	if code := Main([]string{"help"}, &out, &errb); code != 0 {
		t.Errorf("help: %d", code)
	}
}

func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	tokenPath := filepath.Join(dir, "token")
	writeFile(t, tokenPath, "first-token-0123456789\n")
	cfgPath := filepath.Join(dir, "l4d.yaml")
	writeFile(t, cfgPath, "admin_token_file: "+tokenPath+"\n"+testConfig)
	td := startDaemon(t, cfgPath)

	get := func(path, token string) int {
		req, _ := http.NewRequest("GET", td.url+path, nil)
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
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/healthz", "", 200},
		{"/metrics", "", 200},
		{"/status", "", 401},
		{"/config", "wrong-token-0123456789", 401},
		{"/config", "first-token-0123456789", 200},
	} {
		if got := get(tc.path, tc.token); got != tc.want {
			t.Errorf("GET %s with token %q: %d, want %d", tc.path, tc.token, got, tc.want)
		}
	}
	// A reload reads the token again.
	writeFile(t, tokenPath, "second-token-0123456789\n")
	if err := td.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := get("/config", "first-token-0123456789"); got != 401 {
		t.Errorf("old token after reload: %d, want 401", got)
	}
	if got := get("/config", "second-token-0123456789"); got != 200 {
		t.Errorf("new token after reload: %d, want 200", got)
	}
}

// TestAdminTokenByDefault: without admin_token_file l4d generates a token in its
// state directory and requires it, on every address; a request naming another host
// is refused; admin_insecure serves without a token.
func TestAdminTokenByDefault(t *testing.T) {
	c, err := ParseConfig([]byte(testConfig), "test")
	if err != nil || c.StateDir != defaultStateDir || c.AdminInsecure || daemon.DefaultStateDir("l4d") != "/var/lib/tiergate/l4d" {
		t.Fatalf("defaults: %v %q", err, c.StateDir)
	}
	state := t.TempDir()
	td := startWith(t, "state_dir: "+state+"\nadmin_hosts: [ld1.mgmt.example]\n"+testConfig)
	if td.TokenFile() != filepath.Join(state, "admin.token") || len(td.token) != 64 {
		t.Fatalf("token file %q, token of %d bytes", td.TokenFile(), len(td.token))
	}
	call := func(path, host, token string) int {
		req, _ := http.NewRequest("GET", td.url+path, nil)
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
	for _, tc := range []struct {
		path, host, token string
		want              int
	}{
		{"/status", "", "", 401},
		{"/status", "", td.token, 200},
		{"/healthz", "", "", 200},
		{"/healthz", "rebound.attacker.example", "", 421},
		{"/status", "rebound.attacker.example:9180", td.token, 421},
		{"/status", "ld1.mgmt.example:9180", td.token, 200},
	} {
		if got := call(tc.path, tc.host, tc.token); got != tc.want {
			t.Errorf("GET %s Host %q token %v: %d, want %d", tc.path, tc.host, tc.token != "", got, tc.want)
		}
	}
	cfg := strings.Replace(testConfig, `admin_listen: "127.0.0.1:0"`, `admin_listen: "0.0.0.0:0"`, 1)
	if _, err := ParseConfig([]byte(cfg), "test"); err != nil {
		t.Errorf("non-loopback admin with the generated token: %v", err)
	}
	open := startWith(t, "admin_insecure: true\n"+testConfig)
	if open.token != "" || call("/status", "", "") != 401 {
		// call goes to td; check open on its own
	}
	req, _ := http.NewRequest("GET", open.url+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || open.token != "" {
		t.Errorf("admin_insecure: %d (token %q)", resp.StatusCode, open.token)
	}
}
