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
		{"bad duration", "software: {}\nshutdown_grace: soon\n", "line 2: cannot unmarshal !!str `soon` into time.Duration"},
		{"bad log level", "software: {}\nlog_level: loud\n", `log_level "loud"`},
		{"unnamed client", "software: {}\nclients: [{keys: ['*']}]\n", "clients[0]: name is empty"},
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
	if c.MetricsListen != DefaultMetricsListen || c.ShutdownGrace != 10*time.Second {
		t.Errorf("defaults not filled: %+v", c)
	}
}

// The sample in deploy/ must stay valid.
func TestSampleConfig(t *testing.T) {
	c, err := LoadConfig("../../deploy/keyserverd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.PKCS11 == nil || c.PKCS11.TokenLabel != "tiergate" || c.Limits.MaxInFlightPerConn != 1024 ||
		c.Limits.IdleTimeout != 5*time.Minute || len(c.Clients) != 2 || !c.Clients[1].Admin {
		t.Errorf("sample parsed as %+v", c)
	}
}
