package l7d

import (
	"encoding/json"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/certs"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l7"
)

// simpleForm turns the sample configuration into its simple form: the routing
// section out, and the lines marked "#simple: " in.
func simpleForm(sample string) string {
	var out []string
	inRouting := false
	for _, line := range strings.Split(sample, "\n") {
		if i := strings.Index(line, "#simple: "); i >= 0 {
			line = line[:i] + line[i+len("#simple: "):]
		}
		switch {
		case strings.HasPrefix(line, "routing:"):
			inRouting = true
			continue
		case inRouting && line != "" && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "#"):
			inRouting = false
		}
		if inRouting {
			continue
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

const minimal = `
listeners: [{addr: "127.0.0.1:8443", pool: web}]
backends: {web: {members: ["127.0.0.1:8080"]}}
certificates: {certificates: [{cert_file: a.pem, key_file: a.key}]}
`

const routed = `
listeners: [{name: a, addr: x:1}]
certificates: {dir: d}
routing:
  pools: [{name: p, members: [{addr: "127.0.0.1:8080", weight: 2}], balance: least_request}]
  listeners: [{name: a, vhosts: [{names: ["*"], routes: [{action: {pool: p}}]}]}]
`

// withListener returns minimal with fields added to its listener.
func withListener(fields string) string {
	return strings.Replace(minimal, `pool: web}`, `pool: web, `+fields+`}`, 1)
}

func TestParseConfig(t *testing.T) {
	cases := []struct{ name, in, err string }{
		{"minimal", minimal, ""},
		{"no listeners", "backends: {web: {members: [x:1]}}\ncertificates: {dir: d}\n", "listeners: at least one is required"},
		{"no backends", "listeners: [{addr: x:1, pool: web}]\ncertificates: {dir: d}\n", "backends: at least one pool is required"},
		{"routing", routed, ""},
		{"routing and backends", routed + "backends: {web: {members: [x:1]}}\n", "give routing or backends, not both"},
		{"routing and pool", strings.Replace(routed, "addr: x:1", "addr: x:1, pool: web", 1), "listeners[0].pool: routing says where requests go"},
		{"bad routing", strings.Replace(routed, "pool: p}", "pool: q}", 1), `routing.listeners[0].vhosts[0].routes[0].action.pool: no pool is named "q"`},
		{"routing duration", strings.Replace(routed, "pool: p}", "pool: p}, timeout: 2x", 1), `time: unknown unit "x"`},
		{"routing unknown listener", strings.Replace(routed, "name: a, vhosts", "name: b, vhosts", 1), `routing.listeners[0].name: no listener "b"`},
		{"routing unknown field", strings.Replace(routed, "balance: least_request", "balanse: x", 1), "field balanse not found"},
		{"client_ip", minimal + "", ""},
		{"client_ip header", withListener(`client_ip: {trusted_proxies: [192.0.2.0/24], header: X-Real-IP}`), ""},
		{"client_ip proxy", withListener(`client_ip: {proxy_protocol: true, proxy_trusted: [10.0.0.1], proxy_timeout: 2s}`), ""},
		{"client_ip header untrusted", withListener(`client_ip: {header: X-Real-IP}`), "listeners[0].client_ip.header:"},
		{"client_ip bad cidr", withListener(`client_ip: {trusted_proxies: [10.0.0.0/33]}`), "listeners[0].client_ip.trusted_proxies[0]"},
		{"client_ip proxy untrusted", withListener(`client_ip: {proxy_protocol: true}`), "listeners[0].client_ip.proxy_trusted: required"},
		{"client_ip unknown field", withListener(`client_ip: {trusted: [x]}`), "field trusted not found"},
		{"blacklists", minimal + "blacklists: {global: {files: [a.txt], action: close}, listener0: {}}\n", ""},
		{"blacklist unknown list", minimal + "blacklists: {api: {files: [a.txt]}}\n", `blacklists.api: a list is "global" or a listener's name`},
		{"blacklist bad action", minimal + "blacklists: {global: {action: deny}}\n", `blacklists.global.action: "deny": want forbid or close`},
		{"blacklist empty file", minimal + "blacklists: {global: {files: [\"\"]}}\n", "blacklists.global.files[0]: empty"},
		{"empty pool", "listeners: [{addr: x:1, pool: web}]\nbackends: {web: {}}\ncertificates: {dir: d}\n", "backends.web.members"},
		{"unknown pool", "listeners: [{addr: x:1, pool: api}]\nbackends: {web: {members: [x:1]}}\ncertificates: {dir: d}\n", `listeners[0].pool: no backend pool "api"`},
		{"no addr", "listeners: [{pool: web}]\nbackends: {web: {members: [x:1]}}\ncertificates: {dir: d}\n", "listeners[0].addr: required"},
		{"duplicate names", "listeners: [{name: a, addr: x:1, pool: web}, {name: a, addr: x:2, pool: web}]\nbackends: {web: {members: [x:1]}}\ncertificates: {dir: d}\n", `listeners[1].name: "a" used twice`},
		{"no certificates", "listeners: [{addr: x:1, pool: web}]\nbackends: {web: {members: [x:1]}}\n", "certificates: give certificates or dir"},
		{"partial keyservers", minimal + "keyservers: {servers: [x:1]}\n", "keyservers.cert_file: required\nkeyservers.key_file: required\nkeyservers.ca_file: required"},
		{"unknown field", minimal + "listen: x\n", "field listen not found"},
		{"bad log level", minimal + "log_level: chatty\n", `log_level: "chatty": want debug`},
		{"bad gc percent", minimal + "gc_percent: -5\n", "gc_percent: -5: want"},
		{"bad gomaxprocs", minimal + "gomaxprocs: -2\n", "gomaxprocs: -2: want"},
		{"negative body memory", minimal + "max_body_memory: -1\n", "max_body_memory: -1: limits must not be negative"},
		{"admin loopback", minimal + "admin_listen: \"127.0.0.2:9241\"\n", ""},
		{"admin IPv6 loopback", minimal + "admin_listen: \"[::1]:9241\"\n", ""},
		{"admin localhost", minimal + "admin_listen: \"localhost:9241\"\n", ""},
		{"admin off", minimal + "admin_listen: \"off\"\n", ""},
		{"admin every address (generated token)", minimal + "admin_listen: \":9241\"\n", ""},
		{"admin any (generated token)", minimal + "admin_listen: \"0.0.0.0:9241\"\n", ""},
		{"admin host name (generated token)", minimal + "admin_listen: \"admin.example:9241\"\n", ""},
		{"admin hosts", minimal + "admin_hosts: [l7a.mgmt.example, \"198.18.0.7\"]\n", ""},
		{"admin hosts bad", minimal + "admin_hosts: [\"\", \"a b\"]\n", `admin_hosts[1]: "a b": want a host name or address`},
		{"ticket key max age", strings.Replace(minimal, "a.key}]}", "a.key}], ticket_key_max_age: 36h}", 1), ""},
		{"ticket key max age negative", strings.Replace(minimal, "a.key}]}", "a.key}], ticket_key_max_age: -1h}", 1), "certificates.ticket_key_max_age: -1h0m0s is negative"},
		{"admin public with token", minimal + "admin_listen: \"0.0.0.0:9241\"\nadmin_token_file: /etc/t\n", ""},
		{"admin public insecure", minimal + "admin_listen: \"[::]:9241\"\nadmin_insecure: true\n", ""},
		{"state_dir", minimal + "state_dir: /var/lib/tiergate/l7d\n", ""},
		{"state_dir listener name", withListener(`name: "a/b"`) + "state_dir: /x\n", `listeners[0].name: "a/b" names its blacklist's file in state_dir`},
		{"listener name without state_dir", withListener(`name: "a/b"`), ""},
		{"quic server id", withListener(`quic_server_id: 4242`), ""},
		{"quic server id too big", withListener(`quic_server_id: 70000`), "cannot unmarshal !!int `70000` into uint16"},
		{"tunnel", minimal + "tunnel: {vips: [203.0.113.10, \"2001:db8::10\"], lds: [198.18.1.1], ld_ranges: [198.18.2.0/24], key: 4242, move_idle: -1s, local: 198.18.1.11, flow_idle: 20m, mtu: 1400, table: 100}\n", ""},
		{"tunnel no vips", minimal + "tunnel: {lds: [198.18.1.1]}\n", "tunnel.vips: required"},
		{"tunnel no lds", minimal + "tunnel: {vips: [203.0.113.10]}\n", "tunnel.lds: required unless ld_ranges"},
		{"tunnel bad vip", minimal + "tunnel: {vips: [203.0.113.300], lds: [198.18.1.1]}\n", "tunnel.vips[0]"},
		{"tunnel bad ld", minimal + "tunnel: {vips: [203.0.113.10], lds: [198.18.1.1/40]}\n", "tunnel.lds[0]"},
		{"tunnel range in lds", minimal + "tunnel: {vips: [203.0.113.10], lds: [198.18.1.1, 198.18.2.0/24]}\n", "tunnel.lds[1]: line 5: \"198.18.2.0/24\": ParseAddr"},
		{"tunnel bad ld range", minimal + "tunnel: {vips: [203.0.113.10], ld_ranges: [198.18.2.1]}\n", "tunnel.ld_ranges[0]"},
		{"tunnel ld range anywhere", minimal + "tunnel: {vips: [203.0.113.10], ld_ranges: [0.0.0.0/0]}\n", "would take packets from anywhere"},
		{"tunnel bad local", minimal + "tunnel: {vips: [203.0.113.10], lds: [198.18.1.1], local: here}\n", "tunnel.local"},
		{"tunnel local family", minimal + "tunnel: {vips: [203.0.113.10], lds: [198.18.1.1], local: \"2001:db8::1\"}\n", "family no LD uses"},
		{"tunnel reserved table", minimal + "tunnel: {vips: [203.0.113.10], lds: [198.18.1.1], table: 254}\n", "tunnel.table: 254 is reserved"},
		{"tunnel unknown field", minimal + "tunnel: {vip: [203.0.113.10]}\n", "field vip not found"},
		{"tunnel bad duration", minimal + "tunnel: {vips: [203.0.113.10], lds: [198.18.1.1], one_way_idle: -5s}\n", "tunnel.one_way_idle: -5s is negative"},
		{"tunnel text duration", minimal + "tunnel: {vips: [203.0.113.10], lds: [198.18.1.1], one_way_idle: 5y}\n", `tunnel.one_way_idle: line 5: "5y": time: unknown unit`},
		{"client_ip bad timeout", withListener(`client_ip: {proxy_timeout: 3s}`), "listeners[0].client_ip.proxy_timeout: set but proxy_protocol is off"},
		{"client_ip negative timeout", withListener(`client_ip: {proxy_protocol: true, proxy_trusted: [10.0.0.1], proxy_timeout: -3s}`), "listeners[0].client_ip.proxy_timeout: -3s is negative"},
		{"keyservers", minimal + "keyservers: {servers: [x:1], cert_file: c, key_file: k, ca_file: ca, server_name: ks, conns_per_server: 3, timeout: 2s, dial_timeout: 1s}\n", ""},
		{"keyservers bad conns", minimal + "keyservers: {servers: [x:1], cert_file: c, key_file: k, ca_file: ca, conns_per_server: -1}\n", "keyservers.conns_per_server: -1 is negative"},
		{"keyservers bad server", minimal + "keyservers: {servers: [x:1, \"y\"], cert_file: c, key_file: k, ca_file: ca}\n", `keyservers.servers[1]: "y"`},
		{"keyservers bad timeout", minimal + "keyservers: {servers: [x:1], cert_file: c, key_file: k, ca_file: ca, request_timeout: 1x}\n", `keyservers.request_timeout: line 5: "1x"`},
		{"keyservers program field", minimal + "keyservers: {servers: [x:1], cert_file: c, key_file: k, ca_file: ca, tls: {}}\n", "field tls not found"},
		{"negative shutdown grace", minimal + "shutdown_grace: -1s\n", "shutdown_grace: -1s is negative"},
	}
	for _, tc := range cases {
		_, err := ParseConfig([]byte(tc.in), "t.yaml")
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestDefaultsAndSample(t *testing.T) {
	c, err := ParseConfig([]byte(minimal), "t")
	if err != nil {
		t.Fatal(err)
	}
	if c.AdminListen != DefaultAdminListen || c.ShutdownGrace.D() != 10*time.Second || c.Listeners[0].Name != "listener0" ||
		c.StateDir != "" || c.AdminTokenFile != "" || c.AdminInsecure || c.Certificates.TicketKeyMaxAge != certs.DefaultTicketKeyMaxAge {
		t.Errorf("defaults: %+v", c)
	}
	if l := c.Listeners[0]; l.IdleTimeout != l7.DefaultIdleTimeout || l.MaxConns != l7.DefaultMaxConns || l.DeferAccept != l7.DefaultDeferAccept ||
		c.Backends["web"].ConnsPerMember != l7.DefaultConnsPerMember || c.Backends["web"].Timeout != l7.DefaultPoolTimeout {
		t.Errorf("listener and pool defaults (l7's, filled in once): %+v %+v", l, c.Backends["web"])
	}
	s, err := LoadConfig("../../deploy/l7d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Listeners) != 1 || s.Listeners[0].MaxConns != 10000 || s.KeyServers == nil || len(s.KeyServers.Servers) != 2 ||
		s.Certificates.Default != "www" || len(s.Certificates.TicketKeyFiles) != 2 {
		t.Errorf("sample parsed as %+v", s)
	}
	if s.MaxBodyMemory != l7.DefaultMaxBodyMemory {
		t.Errorf("sample's max_body_memory: %d", s.MaxBodyMemory)
	}
	if s.StateDir != "/var/lib/tiergate/l7d" || s.AdminTokenFile != "" || s.AdminInsecure || s.Certificates.TicketKeyMaxAge != certs.DefaultTicketKeyMaxAge {
		t.Errorf("sample's admin and state: %q %q %v", s.StateDir, s.AdminTokenFile, s.AdminInsecure)
	}
	if s.Tunnel == nil || len(s.Tunnel.VIPs) != 1 || len(s.Tunnel.LDs) != 2 || s.Tunnel.Table != 4242 {
		t.Errorf("sample's tunnel parsed as %+v", s.Tunnel)
	}
	if s.Routing == nil || len(s.Routing.Pools) == 0 || s.Routing.Pools[0].HealthCheck == nil ||
		s.Routing.Pools[0].HealthCheck.Interval.D() != 5*time.Second || len(s.Blacklists) == 0 ||
		len(s.Listeners[0].ClientIP.TrustedProxies) == 0 {
		t.Errorf("sample's policy parsed as %+v %+v %+v", s.Routing, s.Blacklists, s.Listeners[0].ClientIP)
	}

	// The sample's commented-out simple form parses too, in place of routing.
	data, err := os.ReadFile("../../deploy/l7d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	simple := simpleForm(string(data))
	c, err = ParseConfig([]byte(simple), "simple")
	if err != nil {
		t.Fatalf("the sample's simple form: %v\n%s", err, simple)
	}
	if c.Routing != nil || len(c.Backends["web"].Members) != 2 || c.Listeners[0].Pool != "web" {
		t.Errorf("the sample's simple form parsed as %+v", c)
	}
}

func TestSetProcs(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(orig)
	reg := prometheus.NewRegistry()
	c, err := setProcs(0, reg, nil, nil)
	if err != nil || c == nil {
		t.Fatalf("gomaxprocs 0: %v, %v; want a controller", c, err)
	}
	if c, err := setProcs(-1, reg, nil, nil); c != nil || err != nil || runtime.GOMAXPROCS(0) != orig {
		t.Fatalf("gomaxprocs -1: %v, %v, GOMAXPROCS %d; want the runtime's %d left alone", c, err, runtime.GOMAXPROCS(0), orig)
	}
	if c, err := setProcs(3, reg, nil, nil); c != nil || err != nil || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("gomaxprocs 3: %v, %v, GOMAXPROCS %d; want 3 fixed", c, err, runtime.GOMAXPROCS(0))
	}
	t.Setenv("GOMAXPROCS", "2")
	if c, err := setProcs(0, reg, nil, nil); c != nil || err != nil || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("GOMAXPROCS set: %v, %v; want the environment to win", c, err)
	}
}

// TestConfigJSON: the whole file reads the same from JSON as from YAML, with the same
// names (the models' and the daemon's own), durations and addresses as text: the
// sample, read, written as JSON and read again, is what was read.
func TestConfigJSON(t *testing.T) {
	s, err := LoadConfig("../../deploy/l7d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s.Tunnel.OneWayIdle = config.Duration(15 * time.Second)
	s.KeyServers.PingInterval = config.Duration(4 * time.Second)
	s.Listeners[0].ClientIP.ProxyTimeout = config.Duration(2 * time.Second)
	s.Listeners[0].ClientIP.ProxyProtocol, s.Listeners[0].ClientIP.ProxyTrusted = true, []string{"198.18.0.0/15"}
	js, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"one_way_idle":"15s"`, `"ping_interval":"4s"`, `"proxy_timeout":"2s"`, `"shutdown_grace":"10s"`,
		`"client_ip":{`, `"keyservers":{"servers":[`, `"cert_file":`, `"tunnel":{`, `"vips":["`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("JSON lacks %s:\n%s", want, js)
		}
	}
	back, err := ParseConfig(js, "t.json")
	if err != nil {
		t.Fatalf("the sample as JSON: %v\n%s", err, js)
	}
	var std FileConfig
	if err := json.Unmarshal(js, &std); err != nil {
		t.Fatal(err)
	}
	// An empty list in the YAML ("files: []") comes back nil: compare as JSON, and
	// the sections of this package's models exactly.
	for _, c := range []*FileConfig{back, &std} {
		if again, err := json.Marshal(c); err != nil || string(again) != string(js) {
			t.Errorf("the sample through JSON:\n%s\nwant\n%s", again, js)
		}
		if !reflect.DeepEqual(c.Tunnel, s.Tunnel) || !reflect.DeepEqual(c.KeyServers, s.KeyServers) ||
			!reflect.DeepEqual(c.Listeners, s.Listeners) || !reflect.DeepEqual(c.Certificates, s.Certificates) {
			t.Errorf("through JSON: %+v %+v %+v %+v\nwant %+v %+v %+v %+v", c.Tunnel, c.KeyServers, c.Listeners, c.Certificates,
				s.Tunnel, s.KeyServers, s.Listeners, s.Certificates)
		}
	}
}
