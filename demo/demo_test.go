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

	"github.com/tiergate/tiergate/l7/l7d"
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

// TestL7Configs: the l7d configurations the demo writes are ones l7d accepts, with the
// tunnel and QUIC server ID in the L4 mode only.
func TestL7Configs(t *testing.T) {
	st := &site{siteCert: "/s/site.pem", l7Cert: "/s/l7.pem", l7Key: "/s/l7.key", ksCA: "/s/ca.pem"}
	for _, tc := range []struct {
		name   string
		c      l7Config
		tunnel bool
	}{
		{"loopback", l7Config{listen: "127.0.0.1:8443", admin: "127.0.0.1:9241", backend: "127.0.0.1:8080", keyserver: "127.0.0.1:2407", stateDir: "/s/l7d-state"}, false},
		{"l4", l7Config{listen: "0.0.0.0:443", admin: "198.18.1.11:9241", adminInsecure: true, backend: "198.18.1.100:8080",
			keyserver: "198.18.1.100:2407", quicID: 1, tunnelLD: l4LDInternal}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "l7d.yaml")
			if err := st.writeL7Config(path, tc.c); err != nil {
				t.Fatal(err)
			}
			cfg, err := l7d.LoadConfig(path)
			if err != nil {
				b, _ := os.ReadFile(path)
				t.Fatalf("l7d refuses the demo's configuration: %v\n%s", err, b)
			}
			if cfg.AdminListen != tc.c.admin {
				t.Errorf("admin_listen %q, want %q", cfg.AdminListen, tc.c.admin)
			}
			b, _ := os.ReadFile(path)
			for _, want := range []string{tc.c.listen, tc.c.backend, tc.c.keyserver} {
				if !strings.Contains(string(b), want) {
					t.Errorf("configuration lacks %q:\n%s", want, b)
				}
			}
			if got := strings.Contains(string(b), "tunnel:") && strings.Contains(string(b), "quic_server_id: 1"); got != tc.tunnel {
				t.Errorf("tunnel and QUIC server ID present = %v, want %v:\n%s", got, tc.tunnel, b)
			}
			if tc.tunnel && cfg.Tunnel.Key != l4TunnelKey {
				t.Errorf("tunnel key %#x, want l4d's, %#x", cfg.Tunnel.Key, l4TunnelKey)
			}
		})
	}
}

// TestL4dConfig: one member per L7 node with its QUIC ID and health address, both
// rules on the VIP, the EAL on the two veths without huge pages.
func TestL4dConfig(t *testing.T) {
	c := l4dConfig()
	for _, want := range []string{
		`{name: l7a, address: "198.18.1.11", quic_id: 1, health_addr: "198.18.1.11:9241"}`,
		`{name: l7b, address: "198.18.1.12", quic_id: 2, health_addr: "198.18.1.12:9241"}`,
		`{name: https, vip: "203.0.113.10", protocol: tcp, port: 443, pool: l7}`,
		`{name: quic, vip: "203.0.113.10", protocol: udp, port: 443, pool: l7, quic: true}`,
		`"--no-pci", "--no-huge", "-m", "512"`, `iface=x0`, `iface=i0`,
		`admin_listen: "127.0.0.1:9180"`,
		fmt.Sprintf("tunnel: {mode: gre, key: %d}", l4TunnelKey),
	} {
		if !strings.Contains(c, want) {
			t.Errorf("l4d configuration lacks %q:\n%s", want, c)
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
