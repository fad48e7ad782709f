package conntrack

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// TestConfigYAMLAndJSON: the model reads the same from YAML (l4d's conntrack
// section) and from JSON (its admin API and state file), timeouts as text in both,
// and writes back what it read.
func TestConfigYAMLAndJSON(t *testing.T) {
	const doc = `
capacity: 65536
timeouts: {syn_recv: 20s, established: 30m, fin: 45s, close: 5s, udp: 2m, unconfirmed: 8s}
`
	const js = `{"capacity": 65536, "timeouts": {"syn_recv": "20s", "established": "30m", "fin": "45s",
		"close": "5s", "udp": "2m", "unconfirmed": "8s"}}`
	var y, j, std Config
	if err := config.Decode([]byte(doc), "YAML", &y); err != nil {
		t.Fatal(err)
	}
	if err := config.Decode([]byte(js), "JSON", &j); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(js), &std); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(y, j) || !reflect.DeepEqual(y, std) {
		t.Fatalf("YAML %+v\nJSON %+v\nencoding/json %+v", y, j, std)
	}
	if y.Capacity != 65536 || y.Timeouts.Established.D() != 30*time.Minute || y.Timeouts.Unconfirmed.D() != 8*time.Second {
		t.Fatalf("decoded %+v", y)
	}
	out, err := json.Marshal(y)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(out, &back); err != nil || back != y {
		t.Fatalf("round trip through %s: %+v, %v", out, back, err)
	}
	if out, _ := json.Marshal(Config{}); string(out) != `{"timeouts":{}}` {
		t.Errorf("zero Config as JSON: %s", out)
	}
	if err := y.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestConfigValidateAndDefaults: Validate names every bad field by its path, and
// Defaults fills in what New would use.
func TestConfigValidateAndDefaults(t *testing.T) {
	c := Config{Capacity: -1, Timeouts: Timeouts{UDP: config.Duration(-time.Second), Fin: config.Duration(MaxTimeout + time.Hour)}}
	err := c.Validate()
	want := "capacity: -1 is negative\ntimeouts.fin: 8761h0m0s is outside 0..8760h0m0s\ntimeouts.udp: -1s is outside 0..8760h0m0s"
	if err == nil || err.Error() != want {
		t.Fatalf("Validate: %v\nwant %s", err, want)
	}
	if err := (&Config{Capacity: MaxCapacity + 1}).Validate(); err == nil || err.Error() != "capacity: 67108865 is above 67108864" {
		t.Errorf("capacity above the maximum: %v", err)
	}
	var zero Config
	if err := zero.Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	zero.Defaults()
	want2 := Config{Capacity: DefaultCapacity, Timeouts: Timeouts{SynRecv: DefaultSynRecvTimeout, Established: DefaultEstablishedTimeout,
		Fin: DefaultFinTimeout, Close: DefaultCloseTimeout, UDP: DefaultUDPTimeout, Unconfirmed: DefaultUnconfirmedTimeout}}
	if zero != want2 {
		t.Fatalf("defaults %+v, want %+v", zero, want2)
	}
	a, err := New(Config{Capacity: 8})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Capacity: 8, Timeouts: want2.Timeouts})
	if err != nil {
		t.Fatal(err)
	}
	if a.timeouts != b.timeouts {
		t.Errorf("zero timeouts give %v, the defaults %v", a.timeouts, b.timeouts)
	}
}
