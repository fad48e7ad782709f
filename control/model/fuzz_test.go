package model

import (
	"encoding/json"
	"testing"

	"github.com/tiergate/tiergate/control/store"
)

// FuzzDecode decodes arbitrary values as every kind: no panic in Decode, Validate or
// Consistent, and what decodes encodes back to a value that decodes the same.
func FuzzDecode(f *testing.F) {
	for _, o := range fullSnapshot(f).Objects() {
		data, err := json.Marshal(o)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(o.Kind(), o.ObjectName(), data)
	}
	f.Add(KindPool, "x", []byte(`{"name":"x","members":[{"addr":"[::1]:0"}],"health_check":{"interval":"-1s"}}`))
	f.Add(KindCertBinding, "b", []byte(`{"name":"b","certificates":["a","a"],"listeners":[],"server_names":["*."]}`))
	f.Add(KindL4Pool, "p", []byte(`{"name":"p","members":[{"name":"m","address":"::ffff:1.2.3.4","mac":"ff:ff:ff:ff:ff:ff"}]}`))
	f.Fuzz(func(t *testing.T, kind, name string, data []byte) {
		obj, err := Decode(store.Object{Kind: kind, Name: name, Value: data})
		if err != nil {
			return
		}
		_ = obj.Validate()
		s := NewSnapshot(1, obj)
		_ = s.Consistent()
		again, err := json.Marshal(obj)
		if err != nil {
			t.Fatalf("encoding a decoded %s: %v", kind, err)
		}
		back, err := Decode(store.Object{Kind: kind, Name: name, Value: again})
		if err != nil {
			t.Fatalf("decoding %s again: %v", again, err)
		}
		if third, _ := json.Marshal(back); string(third) != string(again) {
			t.Fatalf("round trip:\n%s\n%s", again, third)
		}
	})
}
