package hsm

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/internal/config"
)

// TestConfigYAMLAndJSON: the model reads the same from YAML (keyserverd's pkcs11
// section) and from JSON, and writes back what it read; the Logger has neither form.
func TestConfigYAMLAndJSON(t *testing.T) {
	const doc = `
module: /usr/lib/softhsm/libsofthsm2.so
token_label: tiergate
pin_file: /etc/tiergate/pin
keys: [{label: www}, {id: "ab:cd"}, {uri: "pkcs11:object=api;type=private"}]
allow_extractable: true
sessions: 8
`
	const js = `{"module": "/usr/lib/softhsm/libsofthsm2.so", "token_label": "tiergate", "pin_file": "/etc/tiergate/pin",
		"keys": [{"label": "www"}, {"id": "ab:cd"}, {"uri": "pkcs11:object=api;type=private"}],
		"allow_extractable": true, "sessions": 8}`
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
	if !reflect.DeepEqual(y, j) || !reflect.DeepEqual(y, std) || len(y.Keys) != 3 || y.Sessions != 8 {
		t.Fatalf("YAML %+v\nJSON %+v\nencoding/json %+v", y, j, std)
	}
	out, err := json.Marshal(y)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, y) {
		t.Fatalf("round trip through %s: %+v, %v", out, back, err)
	}
	slot := uint(3)
	if out, _ := json.Marshal(Config{Slot: &slot}); string(out) != `{"slot":3}` {
		t.Errorf("a slot as JSON: %s", out)
	}
	if err := y.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestValidatePaths: Validate names every bad field by its path, without the module.
func TestValidatePaths(t *testing.T) {
	c := Config{
		TokenLabel: "a", TokenSerial: "b", PIN: "x", PINEnv: "Y", Sessions: -2,
		Keys: []KeySpec{{Label: "ok"}, {ID: "ab", Label: "x"}, {ID: "xyz"}, {URI: "pkcs11:object=k;type=public"}, {URI: "pkcs11:tokn=x"}},
	}
	want := []string{
		"token_serial: token_label, token_serial, slot and uri are mutually exclusive",
		"pin: pin_file, pin_env and pin are mutually exclusive",
		"keys[1]: set exactly one of uri, id and label",
		`keys[2].id: "xyz" is not hex`,
		"keys[3].uri: URI pkcs11:object=k;type=public has type=public",
		`keys[4].uri: `,
		"sessions: -2: must not be negative",
	}
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in\n%v", w, err)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != len(want) {
		t.Errorf("%d problems, want %d:\n%v", n, len(want), err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "token_label: no token selected"},
		{Config{URI: "pkcs11:object=x"}, "uri: pkcs11:object=x names no token"},
		{Config{Keys: []KeySpec{{URI: "pkcs11:token=t;object=k"}}}, ""},
		{Config{Keys: []KeySpec{{URI: "pkcs11:object=k"}}}, "token_label: no token selected"},
	} {
		err := tc.cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
