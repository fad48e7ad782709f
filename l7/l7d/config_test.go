package l7d

import (
	"strings"
	"testing"
	"time"
)

const minimal = `
listeners: [{addr: "127.0.0.1:8443", pool: web}]
backends: {web: {members: ["127.0.0.1:8080"]}}
certificates: {certificates: [{cert_file: a.pem, key_file: a.key}]}
`

func TestParseConfig(t *testing.T) {
	cases := []struct{ name, in, err string }{
		{"minimal", minimal, ""},
		{"no listeners", "backends: {web: {members: [x:1]}}\ncertificates: {dir: d}\n", "listeners: at least one is required"},
		{"no backends", "listeners: [{addr: x:1, pool: web}]\ncertificates: {dir: d}\n", "backends: at least one pool is required"},
		{"empty pool", "listeners: [{addr: x:1, pool: web}]\nbackends: {web: {}}\ncertificates: {dir: d}\n", "backends.web.members"},
		{"unknown pool", "listeners: [{addr: x:1, pool: api}]\nbackends: {web: {members: [x:1]}}\ncertificates: {dir: d}\n", `listeners[0].pool: no backend pool "api"`},
		{"no addr", "listeners: [{pool: web}]\nbackends: {web: {members: [x:1]}}\ncertificates: {dir: d}\n", "listeners[0].addr: required"},
		{"duplicate names", "listeners: [{name: a, addr: x:1, pool: web}, {name: a, addr: x:2, pool: web}]\nbackends: {web: {members: [x:1]}}\ncertificates: {dir: d}\n", `listeners[1].name: "a" used twice`},
		{"no certificates", "listeners: [{addr: x:1, pool: web}]\nbackends: {web: {members: [x:1]}}\n", "certificates: give certificates or dir"},
		{"partial keyservers", minimal + "keyservers: {servers: [x:1]}\n", "keyservers: servers, cert_file, key_file and ca_file are required"},
		{"unknown field", minimal + "listen: x\n", "field listen not found"},
		{"bad log level", minimal + "log_level: chatty\n", `log_level "chatty"`},
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
	if c.AdminListen != DefaultAdminListen || c.ShutdownGrace != 10*time.Second || c.Listeners[0].Name != "listener0" {
		t.Errorf("defaults: %+v", c)
	}
	s, err := LoadConfig("../../deploy/l7d.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Listeners) != 1 || s.Listeners[0].MaxConns != 10000 || s.KeyServers == nil || len(s.KeyServers.Servers) != 2 ||
		s.Certificates.Default != "www" || len(s.Certificates.TicketKeyFiles) != 2 {
		t.Errorf("sample parsed as %+v", s)
	}
}
