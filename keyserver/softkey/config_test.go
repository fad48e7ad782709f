package softkey

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/tiergate/tiergate/internal/config"
)

// TestConfigYAMLAndJSON: the model reads the same from YAML (keyserverd's software
// section) and from JSON, and writes back what it read; Validate names a bad file by
// its path.
func TestConfigYAMLAndJSON(t *testing.T) {
	var y, j Config
	if err := config.Decode([]byte("files: [/k/a.key, /k/b.pem]\ndir: /k/imported\n"), "YAML", &y); err != nil {
		t.Fatal(err)
	}
	if err := config.Decode([]byte(`{"files": ["/k/a.key", "/k/b.pem"], "dir": "/k/imported"}`), "JSON", &j); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(y, j) || len(y.Files) != 2 || y.Dir != "/k/imported" {
		t.Fatalf("YAML %+v, JSON %+v", y, j)
	}
	out, err := json.Marshal(y)
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back, y) {
		t.Fatalf("round trip through %s: %+v, %v", out, back, err)
	}
	if err := y.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (&Config{Files: []string{"/k/a.key", " "}}).Validate(); err == nil || err.Error() != "files[1]: empty" {
		t.Fatalf("Validate: %v", err)
	}
}
