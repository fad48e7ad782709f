package keyserverd

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name, in, err string
	}{
		{"software only", "software: {files: [a.key]}\nallow_all_clients: true\n", ""},
		{"pkcs11 only", "pkcs11: {token_label: t, pin_env: PIN}\nclients: [{name: l7, keys: ['*']}]\n", ""},
		{"no client rules", "software: {}\n", "clients: no rules: name the clients"},
		{"rules and allow all", "software: {}\nallow_all_clients: true\nclients: [{name: l7}]\n", "allow_all_clients: set together with client rules"},
		{"unknown op", "software: {}\nclients: [{name: l7, ops: [sign, decrypt]}]\n", `clients[0].ops[1]: unknown operation "decrypt"`},
		{"bad rate", "software: {}\nclients: [{name: l7, rate_limit: {burst: 4}}]\n", "clients[0].rate_limit.burst: set without per_second"},
		{"bad deny", "software: {}\nallow_all_clients: true\ndeny: {serials: ['0g'], spki_sha256: [abc]}\n", "deny.serials[0]: serial \"0g\""},
		{"rules with ops, rate and deny", "software: {}\nclients: [{name: l7, keys: ['*'], ops: [sign, rsa_decrypt], rate_limit: {per_second: 100, burst: 200}}]\n" +
			"deny: {serials: ['01:AB'], spki_sha256: ['" + strings.Repeat("ab", 32) + "']}\n", ""},
		{"no backend", "listen: :1\n", "no key backend"},
		{"empty", "", "no key backend"},
		{"unknown field", "software: {}\nlisten_addr: :1\n", "field listen_addr not found"},
		{"unknown nested field", "software: {}\nlimits: {max_inflight: 3}\n", "field max_inflight not found"},
		{"bad duration", "software: {}\nshutdown_grace: soon\n", `time: invalid duration "soon"`},
		{"negative lame duck", "software: {}\nlame_duck: -1s\n", "lame_duck: -1s is negative"},
		{"negative limit", "software: {}\nlimits: {max_conns: -1}\n", "limits.max_conns: must not be negative"},
		{"two admin addresses", "software: {}\nadmin_listen: 127.0.0.1:1\nmetrics_listen: 127.0.0.1:2\n", `metrics_listen: "127.0.0.1:2" differs from admin_listen`},
		{"admin everywhere, generated token", "software: {}\nallow_all_clients: true\nadmin_listen: :9240\n", ""},
		{"bad admin host", "software: {}\nallow_all_clients: true\nadmin_hosts: ['a b']\n", `admin_hosts[0]: "a b"`},
		{"admin everywhere, insecure", "software: {}\nallow_all_clients: true\nadmin_listen: :9240\nadmin_insecure: true\n", ""},
		{"admin everywhere, token", "software: {}\nallow_all_clients: true\nadmin_listen: :9240\nadmin_token_file: /x\n", ""},
		{"bad log level", "software: {}\nlog_level: loud\n", `log_level: "loud": want debug, info, warn or error`},
		{"unnamed client", "software: {}\nclients: [{keys: ['*']}]\n", "clients[0].name: required"},
		{"not yaml", "software: [\n", "configuration test.yaml"},
		{"pkcs11 bad key id", "pkcs11: {token_label: t, pin_env: PIN, keys: [{label: a}, {id: xyz}]}\nallow_all_clients: true\n", `pkcs11.keys[1].id: "xyz" is not hex`},
		{"pkcs11 two PINs", "pkcs11: {token_label: t, pin_env: PIN, pin_file: /p}\nallow_all_clients: true\n", "pkcs11.pin_env: pin_file, pin_env and pin are mutually exclusive"},
		{"pkcs11 negative sessions", "pkcs11: {token_label: t, sessions: -1}\nallow_all_clients: true\n", "pkcs11.sessions: -1: must not be negative"},
		{"control", "software: {}\nallow_all_clients: true\ncontrol: {node: ks-a, etcd_endpoints: [\"http://127.0.0.1:2379\"]}\n", ""},
		{"control without node", "software: {}\nallow_all_clients: true\ncontrol: {etcd_endpoints: [\"http://127.0.0.1:2379\"]}\n", "control.node: required"},
		{"control bad endpoint", "software: {}\nallow_all_clients: true\ncontrol: {node: ks-a, etcd_endpoints: [\"ftp://x\"]}\n", "control.etcd_endpoints[0]"},
		{"software empty file", "software: {files: [a.key, \"\"]}\nallow_all_clients: true\n", "software.files[1]: empty"},
	}
	for _, tc := range cases {
		_, err := ParseConfig([]byte(tc.in), "test.yaml")
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.err)
		}
	}
}

func TestDefaults(t *testing.T) {
	c, err := ParseConfig([]byte("software: {}\nallow_all_clients: true\n"), "x")
	if err != nil {
		t.Fatal(err)
	}
	l := c.Server.Limits
	if c.AdminListen != DefaultAdminListen || c.ShutdownGrace.D() != 10*time.Second || c.LameDuck != 0 || c.StateDir != "/var/lib/tiergate/keyserverd" ||
		c.Server.Addr != "127.0.0.1:2407" || l.MaxConns != 4096 || l.IdleTimeout.D() != 5*time.Minute ||
		l.MaxHandshakes != 64 || l.MaxHandshakesPerSource != 8 || l.HandshakeTimeout.D() != 3*time.Second || l.BackendWait.D() != time.Second {
		t.Errorf("defaults not filled: %+v", c)
	}
	// metrics_listen, admin_listen's former name, is still read.
	c, err = ParseConfig([]byte("software: {}\nallow_all_clients: true\nmetrics_listen: 127.0.0.1:9999\n"), "x")
	if err != nil || c.AdminListen != "127.0.0.1:9999" {
		t.Errorf("metrics_listen: %v %+v", err, c)
	}
}

// The sample in deploy/ must stay valid.
func TestSampleConfig(t *testing.T) {
	c, err := LoadConfig("../../deploy/keyserverd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.PKCS11 == nil || c.PKCS11.TokenLabel != "tiergate" || c.Server.Limits.MaxInFlightPerConn != 1024 ||
		c.Server.Limits.IdleTimeout.D() != 5*time.Minute || len(c.Server.Clients) != 2 || !c.Server.Clients[1].Admin ||
		c.AdminListen != DefaultAdminListen || c.Server.Addr != "127.0.0.1:2407" || c.Server.Limits.MaxHandshakes != 64 {
		t.Errorf("sample parsed as %+v", c)
	}
}

// TestSampleControl: the control section the sample shows commented out is valid.
func TestSampleControl(t *testing.T) {
	data, err := os.ReadFile("../../deploy/keyserverd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	for l := range strings.SplitSeq(string(data), "\n") {
		switch {
		case l == "# control:":
			in = true
			l = "control:"
		case in && strings.HasPrefix(l, "#   "):
			l = strings.TrimPrefix(l, "# ")
		default:
			in = false
		}
		out = append(out, l)
	}
	c, err := ParseConfig([]byte(strings.Join(out, "\n")), "keyserverd.yaml with its control section")
	if err != nil {
		t.Fatal(err)
	}
	if c.Control == nil || c.Control.Node != "ks-a" || c.Control.Username != "ks-a" || c.Control.DialTimeout.D() != 5*time.Second {
		t.Errorf("control section: %+v", c.Control)
	}
}
