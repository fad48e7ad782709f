package l4d

import (
	"bytes"
	"os"
	"testing"

	"github.com/tiergate/tiergate/internal/daemon"
)

// FuzzParseConfig feeds arbitrary bytes to the configuration parser: it must return
// a configuration or an error, never panic, and whatever it accepts must map to the
// datapath's configuration.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte(twoPorts))
	f.Add([]byte(testConfig))
	f.Add([]byte(controlled))
	for _, path := range []string{"../../deploy/l4d.yaml", "../../deploy/l4d-control.yaml"} {
		if sample, err := os.ReadFile(path); err == nil {
			f.Add(sample)
		}
	}
	f.Add([]byte("pools: {\"\": {members: [{name: a, address: \"::ffff:1.2.3.4\"}]}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "fuzz")
		if err != nil {
			return
		}
		if _, err := c.Datapath(); err != nil {
			t.Fatalf("accepted configuration does not map to the datapath's: %v", err)
		}
	})
}

// FuzzForwardingJSON feeds arbitrary bytes to the admin API's and the state file's
// decoder and to the mapping to the datapath's configuration: no panic.
func FuzzForwardingJSON(f *testing.F) {
	f.Add([]byte(`{"rules": [{"name": "web", "vip": "203.0.113.10", "protocol": "tcp", "port": 443, "pool": "l7"}],
		"pools": {"l7": {"members": [{"name": "a", "address": "10.0.0.11", "weight": 2}], "health": {"interval": "1s"}}}}`))
	f.Add([]byte(`{"tunnel": {"mode": "ipip", "mtu": 9000}, "conntrack": {"timeouts": {"udp": "-5s"}}}`))
	f.Add([]byte(`{"rules": [{"vip": "x"}]} {}`))
	base, err := ParseConfig([]byte(twoPorts), "base")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fw Forwarding
		if err := daemon.DecodeJSON(bytes.NewReader(data), &fw); err != nil {
			return
		}
		base.with(fw).Datapath()
	})
}
