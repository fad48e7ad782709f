package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	tgctlcmd "github.com/tiergate/tiergate/control/tgctl"
	"github.com/tiergate/tiergate/keyserver/keyserverd"
	"github.com/tiergate/tiergate/l4/l4d"
	"github.com/tiergate/tiergate/l7/l7d"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testenv"
)

func TestParseAnswer(t *testing.T) {
	for _, tc := range []struct {
		body, node, client string
	}{
		{"hello from the backend: l7d=198.18.1.11 client=198.18.0.1 proto=https\n", "198.18.1.11", "198.18.0.1"},
		{"l7d=127.0.0.1 client=127.0.0.1", "127.0.0.1", "127.0.0.1"},
		{"client=::1 l7d=::1", "::1", "::1"},
		{"no fields here", "", ""},
		{"", "", ""},
	} {
		node, client := parseAnswer(tc.body)
		if node != tc.node || client != tc.client {
			t.Errorf("parseAnswer(%q) = %q, %q; want %q, %q", tc.body, node, client, tc.node, tc.client)
		}
	}
}

// TestBackendAnswer: what the backend writes, parseAnswer reads back.
func TestBackendAnswer(t *testing.T) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "198.18.1.12:40000"
	req.Header.Set("X-Real-IP", "198.18.0.1")
	backendHandler().ServeHTTP(rec, req)
	if node, client := parseAnswer(rec.Body.String()); node != "198.18.1.12" || client != "198.18.0.1" {
		t.Errorf("answer %q read as node %q client %q", rec.Body.String(), node, client)
	}
}

func TestKeyserverOps(t *testing.T) {
	const body = `# HELP tiergate_keyserver_ops_total Operations.
# TYPE tiergate_keyserver_ops_total counter
tiergate_keyserver_ops_total{op="rsa_sign_pss",result="ok"} 9
tiergate_keyserver_ops_total{op="ping",result="ok"} 0
tiergate_keyserver_ops_total{op="rsa_decrypt",result="error"} 1234567
tiergate_plain 3
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
	defer srv.Close()
	want := `tiergate_keyserver_ops_total {op="rsa_decrypt",result="error"} 1234567 {op="rsa_sign_pss",result="ok"} 9`
	if got := keyserverOps(srv.Client(), srv.URL); got != want {
		t.Errorf("keyserverOps = %q, want %q", got, want)
	}
	idle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tiergate_plain 3\n") }))
	defer idle.Close()
	if got := keyserverOps(idle.Client(), idle.URL); got != "no operations yet" {
		t.Errorf("keyserverOps without operations = %q", got)
	}
	if got := keyserverOps(srv.Client(), "http://127.0.0.1:1/metrics"); !strings.HasPrefix(got, "metrics unavailable") {
		t.Errorf("keyserverOps without a server = %q", got)
	}
}

// TestL7Configs: the l7d configurations the demo writes are ones l7d accepts: node
// settings only, with the control section reaching controld's etcd through its unix
// socket, and the tunnel and QUIC server ID in the L4 mode only.
func TestL7Configs(t *testing.T) {
	st := &site{dir: "/s", siteCert: "/s/site.pem", l7Cert: "/s/l7.pem", l7Key: "/s/l7.key", ksCA: "/s/ca.pem"}
	for _, tc := range []struct {
		name   string
		c      l7Config
		tunnel bool
	}{
		{"loopback", l7Config{node: "l7d", admin: "127.0.0.1:9241", keyserver: "127.0.0.1:2407", stateDir: "/s/l7d-state"}, false},
		{"l4", l7Config{node: "l7a", admin: "198.18.1.11:9241", adminInsecure: true, keyserver: "198.18.1.100:2407", quicID: 1,
			tunnelLDs: []string{l4LDs[0].internal, l4LDs[1].internal}, stateDir: "/s/l7d-l7a-state"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "l7d.yaml")
			if err := st.writeL7Config(path, tc.c); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(path)
			cfg, err := l7d.LoadConfig(path)
			if err != nil {
				t.Fatalf("l7d refuses the demo's configuration: %v\n%s", err, b)
			}
			if cfg.AdminListen != tc.c.admin {
				t.Errorf("admin_listen %q, want %q", cfg.AdminListen, tc.c.admin)
			}
			if cfg.Control == nil || cfg.Control.Node != tc.c.node || !reflect.DeepEqual(cfg.Control.EtcdEndpoints, []string{"unix:///s/controld/store/etcd.sock"}) {
				t.Errorf("control section %+v, want node %q at controld's socket", cfg.Control, tc.c.node)
			}
			if cfg.Control != nil && cfg.Control.CacheFile != filepath.Join(tc.c.stateDir, "control-snapshot.json") {
				t.Errorf("cache file %q, want it in the node's state directory %s", cfg.Control.CacheFile, tc.c.stateDir)
			}
			if len(cfg.Listeners) != 0 || cfg.Routing != nil || len(cfg.Certificates.Certificates) != 0 {
				t.Errorf("the file gives what controld gives:\n%s", b)
			}
			if cfg.KeyServers == nil || !strings.Contains(string(b), tc.c.keyserver) {
				t.Errorf("keyservers %+v, want %s:\n%s", cfg.KeyServers, tc.c.keyserver, b)
			}
			if got := cfg.Tunnel != nil && cfg.NodeListeners[listenerName].QUICServerID == 1; got != tc.tunnel {
				t.Errorf("tunnel and QUIC server ID present = %v, want %v:\n%s", got, tc.tunnel, b)
			}
			if tc.tunnel && cfg.Tunnel.Key != l4TunnelKey {
				t.Errorf("tunnel key %#x, want l4d's, %#x", cfg.Tunnel.Key, l4TunnelKey)
			}
			if tc.tunnel && len(cfg.Tunnel.LDs) != len(l4LDs) {
				t.Errorf("tunnel from LDs %v, want both LDs' %v", cfg.Tunnel.LDs, tc.c.tunnelLDs)
			}
		})
	}
}

// TestKeyserverdConfig: keyserverd takes the demo's file, a node of the control plane
// whose client rules let controld import keys and l7d sign, and nothing more.
func TestKeyserverdConfig(t *testing.T) {
	st := &site{dir: "/s", ksCert: "/s/ks.pem", ksKey: "/s/ks.key", l7ClientCA: "/s/client-ca.pem", pinFile: "/s/token.pin",
		tok: &softhsm.Token{Module: "/usr/lib/softhsm/libsofthsm2.so", Label: "tiergate-demo"}}
	data := st.keyserverdConfig("127.0.0.1:2407", "127.0.0.1:9240")
	cfg, err := keyserverd.ParseConfig([]byte(data), "keyserverd.yaml")
	if err != nil {
		t.Fatalf("keyserverd refuses the demo's configuration: %v\n%s", err, data)
	}
	if cfg.Control == nil || cfg.Control.Node != "keyserverd" {
		t.Errorf("control section %+v, want node keyserverd", cfg.Control)
	}
	admins := map[string]bool{}
	for _, c := range cfg.Server.Clients {
		admins[c.Name] = c.Admin
	}
	if want := map[string]bool{"l7-demo": false, "tiergate-controld": true}; !reflect.DeepEqual(admins, want) {
		t.Errorf("clients (name: admin) %v, want %v", admins, want)
	}
}

// TestStackYAML: what the demo applies through tgctl parses as tgctl reads it, each
// object is one the model takes, and together (with the uploaded certificate) they
// are a consistent configuration: a listener routed to the backend's pool with its
// certificate bound, and in the L4 mode both rules to the pool of both L7 nodes. The
// change to try, and the drain, are consistent over it too.
func TestStackYAML(t *testing.T) {
	snapshot := func(t *testing.T, base *model.Snapshot, name, data string) *model.Snapshot {
		t.Helper()
		docs, err := tgctlcmd.ParseDocuments(name, []byte(data))
		if err != nil {
			t.Fatalf("tgctl cannot read %s: %v\n%s", name, err, data)
		}
		s := model.NewSnapshot(1)
		if base != nil {
			s = model.NewSnapshot(1, base.Objects()...)
		}
		for _, d := range docs {
			o, err := model.Decode(store.Object{Kind: d.Kind, Name: d.Name, Value: d.Object})
			if err != nil {
				t.Fatalf("%s: %v", d.Source, err)
			}
			if err := o.Validate(); err != nil {
				t.Fatalf("%s: %s/%s: %v", d.Source, d.Kind, d.Name, err)
			}
			s.Add(o)
		}
		if err := s.Consistent(); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, data)
		}
		return s
	}
	// The certificates as uploads store them (their own checks are certupload's).
	certs := model.NewSnapshot(1,
		&model.Certificate{Name: siteCertName, Version: 1, KeyType: "rsa", SANs: []string{"demo.tiergate.test"}},
		&model.Certificate{Name: ecdsaCertName, Version: 1, KeyType: "ecdsa", SANs: []string{"demo.tiergate.test"}})
	for _, tc := range []struct {
		name, listen string
		l4           bool
	}{
		{"loopback", "127.0.0.1:8443", false},
		{"l4", "0.0.0.0:443", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snapshot(t, certs, "stack.yaml", stackYAML(tc.listen, "198.18.1.100:8080", tc.l4))
			if l := s.Listeners[listenerName]; l == nil || l.Addr != tc.listen {
				t.Errorf("listener %+v, want %s", l, tc.listen)
			}
			if p := s.Pools[listenerName]; p == nil || len(p.Members) != 1 || p.Members[0].Addr != "198.18.1.100:8080" {
				t.Errorf("pool %+v, want the backend", p)
			}
			if b := s.CertBindings[listenerName]; b == nil || !reflect.DeepEqual(b.Certificates, []string{siteCertName}) {
				t.Errorf("binding %+v, want %s", b, siteCertName)
			}
			rules, pools := s.L4()
			pools0 := pools
			if !tc.l4 {
				if len(rules)+len(pools) != 0 || s.BGP() != nil {
					t.Errorf("L4 objects in the loopback mode: %v %v", rules, pools)
				}
			} else {
				if len(rules) != 2 || len(pools[l4PoolName].Members) != 2 {
					t.Fatalf("L4 rules %+v, pools %+v: want https and quic to two members", rules, pools)
				}
				for i, m := range pools[l4PoolName].Members {
					if m.Name != l4Nodes[i].label || m.QUICID != uint16(l4Nodes[i].quicID) || m.Drained {
						t.Errorf("member %d: %+v", i, m)
					}
				}
				if b := s.BGP(); b == nil || b.ASN != l4LDAS || len(b.Peers) != 1 || b.Peers[0].Address.String() != l4RouterIP {
					t.Errorf("l4-bgp %+v, want AS %d peering with the router %s", b, l4LDAS, l4RouterIP)
				}
				drained := snapshot(t, s, "drain-l7a.yaml", l4PoolYAML("l7a"))
				_, pools = drained.L4()
				if m := pools[l4PoolName].Members; !m[0].Drained || m[1].Drained {
					t.Errorf("drain-l7a.yaml drains %+v, want l7a only", m)
				}
				undrained := snapshot(t, drained, "undrain-l7a.yaml", l4PoolYAML(""))
				if _, p := undrained.L4(); !reflect.DeepEqual(p, pools0) {
					t.Errorf("undrain-l7a.yaml makes %+v, want the pool as stack.yaml has it, %+v", p, pools0)
				}
			}
			web := snapshot(t, s, "web.yaml", webYAML())
			if b := web.CertBindings[listenerName]; !reflect.DeepEqual(b.Certificates, []string{ecdsaCertName, siteCertName}) {
				t.Errorf("web.yaml binds %v", b.Certificates)
			}
			if r := web.Routing[listenerName].VHosts[0].Routes; len(r) != 2 || r[0].Action.Redirect == nil || r[1].Action.Pool != listenerName {
				t.Errorf("web.yaml routes %+v, want the redirect before the pool", r)
			}
		})
	}
}

// TestL4dConfig: l4d takes each LD's file, its own settings only, the rules and pools
// coming from controld: the EAL on the two veths without huge pages, the tunnel key
// of the L7 nodes, BGP with the router (next hop x0's address) and session sync with
// the other LD on m0.
func TestL4dConfig(t *testing.T) {
	dir := t.TempDir()
	st := &site{dir: dir}
	key := filepath.Join(dir, "sync.key")
	if err := writeSyncKey(key); err != nil {
		t.Fatal(err)
	}
	for i, ld := range l4LDs {
		peer := l4LDs[1-i]
		c := st.l4dConfig(ld, peer, filepath.Join(dir, "l4d-"+ld.label+"-state"), key)
		for _, want := range []string{
			"control:", "node: " + ld.label, fmt.Sprintf(`etcd_endpoints: ["unix://%s/controld/store/etcd.sock"]`, dir),
			`"--no-pci", "--no-huge", "-m", "512"`, `iface=x0`, `iface=i0`,
			fmt.Sprintf("tunnel: {mode: gre, key: %d}", l4TunnelKey),
		} {
			if !strings.Contains(c, want) {
				t.Errorf("%s: l4d configuration lacks %q:\n%s", ld.label, want, c)
			}
		}
		for _, not := range []string{"\nrules:", "\npools:"} {
			if strings.Contains(c, not) {
				t.Errorf("%s: l4d configuration gives %q, which controld gives:\n%s", ld.label, not, c)
			}
		}
		cfg, err := l4d.ParseConfig([]byte(c), ld.label+".yaml")
		if err != nil {
			t.Fatalf("%s: l4d refuses the demo's configuration: %v\n%s", ld.label, err, c)
		}
		if cfg.AdminListen != l4AdminAt || cfg.StateDir != filepath.Join(dir, "l4d-"+ld.label+"-state") {
			t.Errorf("%s: admin_listen %q, state_dir %q", ld.label, cfg.AdminListen, cfg.StateDir)
		}
		b := cfg.BGP
		if b == nil || b.ASN != l4LDAS || b.NextHop.String() != ld.external || len(b.Peers) != 1 ||
			b.Peers[0].Address.String() != l4RouterIP || b.Peers[0].AS != l4RouterAS || b.Peers[0].HoldTime.D() != l4HoldTime*time.Second {
			t.Errorf("%s: bgp %+v, want AS %d next hop %s, the router %s AS %d hold %ds", ld.label, b, l4LDAS, ld.external, l4RouterIP, l4RouterAS, l4HoldTime)
		}
		sy := cfg.Sync
		if sy == nil || sy.ClusterID != l4ClusterID || sy.Listen != ld.health+":"+l4SyncPort ||
			!reflect.DeepEqual(sy.Peers, []string{peer.health + ":" + l4SyncPort}) {
			t.Errorf("%s: sync %+v, want cluster %d on %s, peer %s", ld.label, sy, l4ClusterID, ld.health, peer.health)
		}
		if cfg.HashSeed != l4ClusterID {
			t.Errorf("%s: hash_seed %d, want the same on both LDs", ld.label, cfg.HashSeed)
		}
	}
}

func TestRunRejectsMode(t *testing.T) {
	err := Run(context.Background(), Options{L4: "sometimes", Dir: t.TempDir()}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `-l4 "sometimes"`) {
		t.Fatalf("Run with -l4 sometimes: %v", err)
	}
}

// TestL4Unavailable: each missing piece is named; with all of them, nothing is.
func TestL4Unavailable(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	testenv.RequireCommand(t, "ethtool", "ethtool")
	testenv.RequireCommand(t, "sysctl", "procps")
	testenv.RequireCommand(t, "bird", "bird2")
	testenv.RequireCommand(t, "birdc", "bird2")
	testenv.RequireFile(t, "/dev/net/tun", "the kernel's tun module")
	for _, tc := range []struct {
		name, l4d, want string
	}{
		{"no l4d", "", "not built"},
		{"l4d does not start", "#!/bin/sh\necho 'error while loading shared libraries: librte_eal.so.23' >&2\nexit 127\n", "does not start"},
		{"l4d starts", "#!/bin/sh\nexit 0\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.l4d != "" {
				if err := os.WriteFile(filepath.Join(dir, "l4d"), []byte(tc.l4d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			got := l4Unavailable(dir)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("l4Unavailable = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestNetNS: sockets made in a namespace are there and not on the host; removal stops
// what runs inside and deletes the namespaces with their links.
func TestNetNS(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	var r [3]byte
	rand.Read(r[:])
	prefix := "tgdu" + hex.EncodeToString(r[:]) + "-"
	t.Cleanup(func() { removeNetNS(listNetNS(prefix)...) })
	a, err := newNetNS(prefix + "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := newNetNS(prefix + "b")
	if err != nil {
		t.Fatal(err)
	}
	if got := listNetNS(prefix); !reflect.DeepEqual(got, []string{prefix + "a", prefix + "b"}) {
		t.Errorf("listNetNS = %v", got)
	}
	if err := a.run("ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", b.name); err != nil {
		t.Fatal(err)
	}
	if err := a.run("ip", "link", "set", "no-such-link", "up"); err == nil || !strings.Contains(err.Error(), prefix+"a") {
		t.Errorf("a failing command's error does not name the namespace: %v", err)
	}

	var ln net.Listener
	if err := a.do(func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	dialIn := func(ns *netNS) error {
		c, err := nsDialer(ns)(context.Background(), "tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dialIn(a); err != nil {
		t.Errorf("dialling inside the namespace: %v", err)
	}
	for _, ns := range []*netNS{nil, b} {
		if err := dialIn(ns); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dialling from %s reached the namespace's listener: %v", ns, err)
		}
	}
	if err := (&netNS{name: prefix + "absent"}).do(func() error { return nil }); err == nil {
		t.Error("do in a namespace that does not exist succeeded")
	}

	// A process inside that ignores SIGTERM still goes, once the grace has passed.
	defer func(g time.Duration) { netnsGrace = g }(netnsGrace)
	netnsGrace = 300 * time.Millisecond
	sleeper := a.command("sh", "-c", "trap '' TERM; sleep 300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sleeper.Wait() }()
	waitFor(t, func() bool { return len(netNSPids(a.name)) > 0 })
	start := time.Now()
	if err := removeNetNS(a.name, b.name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the process inside survived the namespace's removal")
	}
	t.Logf("removal took %v", time.Since(start).Round(time.Millisecond))
	if got := listNetNS(prefix); len(got) != 0 {
		t.Errorf("namespaces left: %v", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
	}
}
