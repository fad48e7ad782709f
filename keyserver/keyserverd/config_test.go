package keyserverd

import (
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name, in, err string
	}{
		{"software only", "software: {files: [a.key]}\n", ""},
		{"pkcs11 only", "pkcs11: {token_label: t, pin_env: PIN}\n", ""},
		{"no backend", "listen: :1\n", "no key backend"},
		{"empty", "", "no key backend"},
		{"unknown field", "software: {}\nlisten_addr: :1\n", "field listen_addr not found"},
		{"unknown nested field", "software: {}\nlimits: {max_inflight: 3}\n", "field max_inflight not found"},
		{"bad duration", "software: {}\nshutdown_grace: soon\n", `time: invalid duration "soon"`},
		{"negative lame duck", "software: {}\nlame_duck: -1s\n", "lame_duck: -1s is negative"},
		{"negative limit", "software: {}\nlimits: {max_conns: -1}\n", "limits.max_conns: must not be negative"},
		{"two admin addresses", "software: {}\nadmin_listen: 127.0.0.1:1\nmetrics_listen: 127.0.0.1:2\n", `metrics_listen: "127.0.0.1:2" differs from admin_listen`},
		{"admin everywhere", "software: {}\nadmin_listen: :9240\n", `admin_listen: ":9240": other hosts can reach it`},
		{"admin everywhere, insecure", "software: {}\nadmin_listen: :9240\nadmin_insecure: true\n", ""},
		{"admin everywhere, token", "software: {}\nadmin_listen: :9240\nadmin_token_file: /x\n", ""},
		{"bad log level", "software: {}\nlog_level: loud\n", `log_level: "loud": want debug, info, warn or error`},
		{"unnamed client", "software: {}\nclients: [{keys: ['*']}]\n", "clients[0].name: required"},
		{"not yaml", "software: [\n", "configuration test.yaml"},
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
	c, err := ParseConfig([]byte("software: {}\n"), "x")
	if err != nil {
		t.Fatal(err)
	}
	if c.AdminListen != DefaultAdminListen || c.ShutdownGrace.D() != 10*time.Second || c.LameDuck != 0 ||
		c.Server.Addr != ":2407" || c.Server.Limits.MaxConns != 4096 || c.Server.Limits.IdleTimeout.D() != 5*time.Minute {
		t.Errorf("defaults not filled: %+v", c)
	}
	// metrics_listen, admin_listen's former name, is still read.
	c, err = ParseConfig([]byte("software: {}\nmetrics_listen: 127.0.0.1:9999\n"), "x")
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
		c.AdminListen != DefaultAdminListen || c.Server.Addr != ":2407" {
		t.Errorf("sample parsed as %+v", c)
	}
}
