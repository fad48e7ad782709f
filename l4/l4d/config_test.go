package l4d

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

const minimal = `
ports:
  external: {device: net_null0, addr: 198.18.0.2/24}
rules: [{name: web, vip: 198.18.0.10, protocol: tcp, port: 443, pool: l7}]
pools:
  l7:
    members: [{name: a, address: 198.18.0.11}]
`

const twoPorts = `
ports:
  external: {device: net_null0, addr: 198.18.0.2/24, gateway: 198.18.0.1}
  internal: {device: net_null1, addr: 10.0.0.2/24}
rules: [{name: web, vip: 203.0.113.10, protocol: tcp, port: 443, pool: l7}]
pools:
  l7:
    members: [{name: a, address: 10.0.0.11}]
`

// controlled is minimal with its rules and pools from the control plane.
const controlled = `
ports:
  external: {device: net_null0, addr: 198.18.0.2/24}
control: {node: l4-a, etcd_endpoints: ["unix:///run/etcd.sock"]}
`

func TestParseConfig(t *testing.T) {
	repl := func(in, old, new string) string {
		if !strings.Contains(in, old) {
			t.Fatalf("test input lacks %q", old)
		}
		return strings.Replace(in, old, new, 1)
	}
	cases := []struct{ name, in, err string }{
		{"minimal", minimal, ""},
		{"two ports", twoPorts, ""},
		{"empty", "", "ports.external.device: required"},
		{"unknown field", minimal + "listen: x\n", "field listen not found"},
		{"unknown nested field", repl(minimal, "name: a,", "nme: a,"), "field nme not found"},
		{"bad log level", minimal + "log_level: chatty\n", `log_level: "chatty": want debug, info, warn or error`},
		{"bad duration", minimal + "dpdk: {idle_sleep: 5x}\n", `dpdk.idle_sleep: line 8: "5x": time: unknown unit "x"`},
		{"negative lame duck", minimal + "lame_duck: -1s\n", "lame_duck: -1s is negative"},
		{"negative idle", minimal + "dpdk: {idle_sleep: -1s}\n", "dpdk.idle_sleep: -1s is negative"},
		{"workers", minimal + "dpdk: {workers: 65}\n", "dpdk.workers: 65 is outside 1..64"},
		{"burst", minimal + "dpdk: {burst: 300}\n", "dpdk.burst: 300 is outside 1..256"},
		{"cache", minimal + "dpdk: {mbuf_cache: 1000}\n", "dpdk.mbuf_cache: 1000 is outside 0..512"},
		{"rx desc", minimal + "dpdk: {rx_desc: 8}\n", "dpdk.rx_desc: 8 is outside 64..32768"},
		{"few mbufs", minimal + "dpdk: {mbufs: 100}\n", "dpdk.mbufs: 100 is too few: the queues' descriptors and bursts need 2112"},
		{"empty eal arg", minimal + "dpdk: {eal_args: [\"\"]}\n", "dpdk.eal_args[0]: empty"},
		{"af_packet interface twice", minimal + "dpdk: {eal_args: [\"--vdev=net_af_packet0,iface=x0\", \"--vdev=net_af_packet1,iface=x0\"]}\n", "dpdk.eal_args: dpdk: interface already bound by another net_af_packet device: net_af_packet0 and net_af_packet1 both on \"x0\""},
		{"no device", repl(minimal, "device: net_null0, ", ""), "ports.external.device: required"},
		{"no address", repl(minimal, ", addr: 198.18.0.2/24", ""), "ports.external: an address (addr or addr6) is required"},
		{"bad prefix", repl(minimal, "198.18.0.2/24", "198.18.0.2"), `ports.external.addr: line 3: "198.18.0.2": netip.ParsePrefix("198.18.0.2"): no '/'`},
		{"v6 as v4", repl(minimal, "addr: 198.18.0.2/24", "addr: 2001:db8::2/64"), "ports.external.addr: 2001:db8::2/64 is not IPv4"},
		{"bad gateway", repl(twoPorts, "gateway: 198.18.0.1", "gateway: 10.9.9.9"), "ports.external.gateway: 10.9.9.9 is not an IPv4 address on link"},
		{"gateway syntax", repl(twoPorts, "gateway: 198.18.0.1", "gateway: router"), `ports.external.gateway: line 3: "router": ParseAddr("router"): unable to parse IP`},
		{"internal address", repl(twoPorts, "addr: 10.0.0.2/24", "addr: 10.0.0.2/33"), `ports.internal.addr: line 4: "10.0.0.2/33": netip.ParsePrefix("10.0.0.2/33"): prefix length out of range`},
		{"mtu", repl(minimal, "addr: 198.18.0.2/24", "addr: 198.18.0.2/24, mtu: 100"), "ports.external.mtu: 100 is outside 576..9600"},
		{"same device mtus", repl(twoPorts, "device: net_null1", "device: net_null0, mtu: 9000"), `ports.internal.mtu: 9000 differs from the external port's 0 on the same device "net_null0"`},
		{"vip syntax", repl(minimal, "vip: 198.18.0.10", "vip: www"), `rules[0].vip: line 4: "www": ParseAddr("www"): unable to parse IP`},
		{"no vip", repl(minimal, "vip: 198.18.0.10, ", ""), "rules[0].vip: required"},
		{"vip family", repl(minimal, "vip: 198.18.0.10", "vip: \"2001:db8::10\""), "rules[0].vip: 2001:db8::10 has no external address of its family"},
		{"protocol", repl(minimal, "protocol: tcp", "protocol: sctp"), `rules[0].protocol: "sctp" is not tcp or udp`},
		{"port", repl(minimal, "port: 443", "port: 0"), "rules[0].port: required"},
		{"port range", repl(minimal, "port: 443", "port: 70000"), "cannot unmarshal"},
		{"unknown pool", repl(minimal, "pool: l7}", "pool: l8}"), `rules[0].pool: "l8" is not a pool`},
		{"scheduler", repl(minimal, "pool: l7}", "pool: l7, scheduler: random}"), `rules[0].scheduler: "random" is not maglev, wrr or wlc`},
		{"quic on tcp", repl(minimal, "pool: l7}", "pool: l7, quic: true}"), "rules[0].quic: needs protocol udp"},
		{"duplicate rule", repl(minimal, "rules: [", "rules: [{name: web, vip: 198.18.0.11, protocol: tcp, port: 80, pool: l7}, "), `rules[1].name: "web" is used twice`},
		{"member address", repl(minimal, "address: 198.18.0.11", "address: l7-a"), `pools.l7.members[0].address: line 7: "l7-a": ParseAddr("l7-a"): unable to parse IP`},
		{"member no address", repl(minimal, ", address: 198.18.0.11", ""), "pools.l7.members[0].address: required"},
		{"member family", repl(minimal, "address: 198.18.0.11", "address: \"2001:db8::11\""), "pools.l7.members[0].address: 2001:db8::11 has no internal address of its family"},
		{"member name", repl(minimal, "name: a, ", ""), "pools.l7.members[0].name: required"},
		{"duplicate quic id", repl(minimal, "{name: a, address: 198.18.0.11}", "{name: a, address: 198.18.0.11, quic_id: 7}, {name: b, address: 198.18.0.12, quic_id: 7}"), `pools.l7.members[1].quic_id: 7 is also member "a"`},
		{"health addr", repl(minimal, "address: 198.18.0.11}", "address: 198.18.0.11, health_addr: x}"), "pools.l7.members[0].health_addr:"},
		{"member mac", repl(minimal, "address: 198.18.0.11}", "address: 198.18.0.11, mac: \"ff:ff:ff:ff:ff:ff\"}"), `pools.l7.members[0].mac: ff:ff:ff:ff:ff:ff is not a unicast Ethernet address`},
		{"gateway multicast mac", repl(minimal, "addr: 198.18.0.2/24", "addr: 198.18.0.2/24, gateway_mac: \"01:00:5e:00:00:01\""), `ports.external.gateway_mac: 01:00:5e:00:00:01 is not a unicast Ethernet address`},
		{"gateway mac", repl(minimal, "addr: 198.18.0.2/24", "addr: 198.18.0.2/24, gateway_mac: nope"), `ports.external.gateway_mac: line 3: "nope": packet: parsing MAC address "nope"`},
		{"health type", minimal + "    health: {type: icmp}\n", `pools.l7.health.type: "icmp" is not tcp, http or none`},
		{"health timeout", minimal + "    health: {interval: 1s, timeout: 2s}\n", "pools.l7.health.timeout: 2s must be positive and at most the interval"},
		{"health rise", minimal + "    health: {rise: -1}\n", "pools.l7.health.rise: -1 is negative"},
		{"tunnel mode", minimal + "tunnel: {mode: vxlan}\n", `tunnel.mode: "vxlan" is not gre or ipip`},
		{"tunnel mtu", minimal + "tunnel: {mtu: 100}\n", "tunnel.mtu: 100 is outside 1280..9216"},
		{"tunnel key with ipip", minimal + "tunnel: {mode: ipip, key: 7}\n", "tunnel.key: needs mode gre"},
		{"tunnel key", minimal + "tunnel: {mode: gre, key: 7}\n", ""},
		{"timeouts", minimal + "conntrack: {timeouts: {established: 1h, udp: -1s}}\n", "conntrack.timeouts.udp: -1s is outside 0..8760h0m0s"},
		{"capacity", minimal + "conntrack: {capacity: -1}\n", "conntrack.capacity: -1 is negative"},
		{"control", controlled, ""},
		{"control with rules", controlled + "rules: [{name: web, vip: 198.18.0.10, protocol: tcp, port: 443, pool: l7}]\n",
			"rules: not with control: the rules come from the control plane"},
		{"control with pools", controlled + "pools: {l7: {members: [{name: a, address: 198.18.0.11}]}}\n", "pools: not with control"},
		{"control with state file", controlled + "state_file: /tmp/x.json\n", "state_file: not with control"},
		{"control without node", repl(controlled, "node: l4-a, ", ""), "control.node"},
		{"control without endpoints", repl(controlled, "etcd_endpoints: [\"unix:///run/etcd.sock\"]", ""), "control.etcd_endpoints"},
		{"control unknown field", repl(controlled, "node: l4-a", "nodes: l4-a"), "field nodes not found"},
		{"several errors", repl(repl(minimal, "protocol: tcp", "protocol: x"), "port: 443", "port: 0"), "rules[0].protocol: \"x\" is not tcp or udp\nrules[0].port: required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.in), "t.yaml")
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("got %v, want %q", err, tc.err)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(minimal), "t")
	if err != nil {
		t.Fatal(err)
	}
	want := DPDKFile{Workers: 1, MbufCache: 256, RxDesc: 1024, TxDesc: 1024, Burst: 32, IdleSleep: config.Duration(50 * time.Microsecond)}
	if c.AdminListen != DefaultAdminListen || !reflect.DeepEqual(c.DPDK, want) {
		t.Errorf("defaults: %q %+v", c.AdminListen, c.DPDK)
	}
	if n := c.DPDK.MbufsPerPort(); n != 4095 { // 1024+1024+2*32+2*256+1024 = 3648
		t.Errorf("default mbufs per port %d, want 4095", n)
	}
	c.DPDK.Mbufs = 5000
	if n := c.DPDK.MbufsPerPort(); n != 5000 {
		t.Errorf("configured mbufs per port %d, want 5000", n)
	}
	c.DPDK = DPDKFile{Workers: 2, MbufCache: 512, RxDesc: 4096, TxDesc: 4096, Burst: 64}
	if n := c.DPDK.MbufsPerPort(); n != 32767 { // 2*4096+2*4096+3*64+3*512+1024 = 19136
		t.Errorf("mbufs per port for 2 workers %d, want 32767", n)
	}
	if !c.sameDevice() {
		t.Error("no internal port is the external one")
	}
	dc, err := c.Datapath()
	if err != nil {
		t.Fatal(err)
	}
	if dc.Internal != dc.External || dc.External.Addr != netip.MustParsePrefix("198.18.0.2/24") {
		t.Errorf("interfaces %+v %+v", dc.External, dc.Internal)
	}
}

// TestControlDefaults: the control plane's cache file is in state_dir by default,
// and a reload may not change the control section.
func TestControlDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(controlled+"state_dir: /var/lib/x\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	if c.Control.CacheFile != "/var/lib/x/control-snapshot.json" {
		t.Errorf("cache file %q", c.Control.CacheFile)
	}
	next, err := ParseConfig([]byte(strings.Replace(controlled, "l4-a", "l4-b", 1)+"state_dir: /var/lib/x\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := fixedChanges(c, next); err == nil || !strings.Contains(err.Error(), "control cannot change") {
		t.Errorf("a reload changing the control section: %v", err)
	}
}

// TestControlSample: deploy/l4d-control.yaml, the example of l4d fed by the
// control plane, is valid and has no rules or pools of its own.
func TestControlSample(t *testing.T) {
	c, err := LoadConfig("../../deploy/l4d-control.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Control == nil || c.Control.Node != "l4-a" || c.Control.CacheFile != "/var/lib/tiergate/l4d/control-snapshot.json" ||
		len(c.Rules) != 0 || len(c.Pools) != 0 {
		t.Errorf("control sample: %+v %+v", c.Control, c.Forwarding)
	}
}

func TestSample(t *testing.T) {
	s, err := LoadConfig("../../deploy/l4d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.sameDevice() || s.DPDK.MbufsPerPort() != 4095 || len(s.DPDK.EALArgs) != 3 {
		t.Errorf("sample's ports and dpdk parsed as %+v %+v", s.Ports, s.DPDK)
	}
	dc, err := s.Datapath()
	if err != nil {
		t.Fatal(err)
	}
	if len(dc.Rules) != 3 || !dc.Rules[1].QUIC || len(dc.Pools["l7"].Members) != 2 || dc.Pools["l7"].Members[1].QUICID != 2 ||
		dc.Pools["l7"].Health.Interval.D() != 2*time.Second || dc.Conntrack.Timeouts.Established.D() != 15*time.Minute ||
		dc.Tunnel.Mode != "gre" || dc.Internal.Addr != netip.MustParsePrefix("10.0.0.2/24") {
		t.Errorf("sample parsed as %+v", dc)
	}
}

func TestEALArgs(t *testing.T) {
	cases := []struct {
		in, want []string
	}{
		{nil, []string{"--in-memory", "--file-prefix=l4d-7"}},
		{[]string{"--no-pci"}, []string{"--no-pci", "--in-memory", "--file-prefix=l4d-7"}},
		{[]string{"--in-memory"}, []string{"--in-memory", "--file-prefix=l4d-7"}},
		{[]string{"--file-prefix=lb"}, []string{"--file-prefix=lb"}},
		{[]string{"--file-prefix", "lb"}, []string{"--file-prefix", "lb"}},
		{[]string{"--no-huge", "-m", "256"}, []string{"--no-huge", "-m", "256", "--file-prefix=l4d-7"}},
		{[]string{"--legacy-mem"}, []string{"--legacy-mem", "--file-prefix=l4d-7"}},
	}
	for _, tc := range cases {
		got, prefix := ealArgs(tc.in, 7)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ealArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if ours := slices.Contains(got, "--file-prefix=l4d-7"); ours != (prefix == "l4d-7") || !ours && prefix != "" {
			t.Errorf("ealArgs(%q): prefix %q", tc.in, prefix)
		}
	}
}

func TestUnderPorts(t *testing.T) {
	var ck config.Checker
	ck.Addf("external.addr", "x")
	ck.Addf("internal", "an address is required")
	ck.Addf(`pools.a "b".members[0].name`, "required")
	ck.Addf("rules[0].vip", "x")
	ck.Addf("externally", "untouched")
	want := strings.Join([]string{
		"ports.external.addr: x",
		"ports.internal: an address is required",
		`pools.a "b".members[0].name: required`,
		"rules[0].vip: x",
		"externally: untouched",
	}, "\n")
	if got := underPorts(ck.Err()).Error(); got != want {
		t.Errorf("underPorts:\n%s\nwant\n%s", got, want)
	}
	var fe *config.FieldError
	if !errors.As(underPorts(ck.Err()), &fe) || fe.Path != "ports.external.addr" {
		t.Errorf("not field errors: %v", fe)
	}
}
