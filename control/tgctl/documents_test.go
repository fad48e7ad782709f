package tgctl

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestParseDocuments(t *testing.T) {
	docs, err := ParseDocuments("web.yaml", []byte(webYAML))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ kind, name, obj, source string }{
		{"pools", "app", `{"name":"app","members":[{"addr":"198.18.1.1:80"}]}`, "web.yaml:2"},
		{"l4-pools", "l7", `{"name":"l7","members":[{"name":"a","address":"198.18.2.1"}]}`, "web.yaml:7"},
		{"l4-rules", "https", `{"name":"https","vip":"203.0.113.1","protocol":"tcp","port":443,"pool":"l7"}`, "web.yaml:13"},
	}
	if len(docs) != len(want) {
		t.Fatalf("%d documents: %+v", len(docs), docs)
	}
	for i, w := range want {
		d := docs[i]
		if d.Kind != w.kind || d.Name != w.name || string(d.Object) != w.obj || d.Source != w.source {
			t.Errorf("document %d: %s %s %s %s, want %+v", i, d.Kind, d.Name, d.Object, d.Source, w)
		}
	}

	// JSON is YAML; aliases of kinds; types as YAML 1.2 resolves them; empty documents.
	docs, err = ParseDocuments("x.json", []byte(`---
---
{"kind": "Pool", "name": "a", "members": [{"addr": "198.18.1.1:80", "weight": 2}], "x": null, "t": 2001-12-14, "f": 1.5, "s": "007", "b": true}
`))
	if err != nil || len(docs) != 1 {
		t.Fatalf("%v %v", docs, err)
	}
	if got := string(docs[0].Object); got != `{"name":"a","members":[{"addr":"198.18.1.1:80","weight":2}],"x":null,"t":"2001-12-14","f":1.5,"s":"007","b":true}` {
		t.Errorf("object %s", got)
	}

	for _, bad := range []struct{ in, want string }{
		{"", "no objects"},
		{"kind: pools\n", "x.yaml:1: name: required"},
		{"name: a\n", "kind: required"},
		{"kind: [pools]\nname: a\n", "kind: want a string"},
		{"kind: nope\nname: a\n", `kind "nope"`},
		{"kind: pools\nname: 3\n", "name: want a string"},
		{"kind: pools\nname: a\n---\nkind: pools\nname: a\n", "twice"},
		{"kind: pools\nname: a\nm: {a: 1, a: 2}\n", "key"},
		{"kind: pools\nname: a\nx: .inf\n", "infinities"},
		{"- 1\n", "not a scalar"},
		{"kind: pools\nname: a\n x: [\n", "x.yaml"},
		{"base: &b {y: 1}\nkind: pools\nname: a\n<<: *b\n", "merge"},
	} {
		_, err := ParseDocuments("x.yaml", []byte(bad.in))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want %q", bad.in, err, bad.want)
		}
	}
}

// TestAliasBomb: aliases expanding past maxNodes are refused, not expanded.
func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("kind: pools\nname: a\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	_, err := ParseDocuments("bomb.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "YAML nodes") {
		t.Fatalf("an alias bomb: %v", err)
	}
}

func TestWithKindAndYAML(t *testing.T) {
	d, err := withKind("certificates", json.RawMessage(`{"name":"www","chain":"-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n","sans":["a","true"],"port":443}`))
	if err != nil {
		t.Fatal(err)
	}
	y, err := jsonToYAML(d)
	if err != nil {
		t.Fatal(err)
	}
	want := `kind: certificates
name: www
chain: |
  -----BEGIN CERTIFICATE-----
  AAA
  -----END CERTIFICATE-----
sans:
  - a
  - "true"
port: 443
`
	if string(y) != want {
		t.Errorf("YAML:\n%s\nwant:\n%s", y, want)
	}
	// And back: the same object.
	docs, err := ParseDocuments("y", y)
	if err != nil || !sameJSON(docs[0].Object, json.RawMessage(`{"name":"www","chain":"-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n","sans":["a","true"],"port":443}`)) {
		t.Errorf("back from YAML: %v %s", err, docs[0].Object)
	}
	if e, _ := withKind("pools", json.RawMessage(`{}`)); string(e) != `{"kind":"pools"}` {
		t.Errorf("withKind of {}: %s", e)
	}
	if _, err := withKind("pools", json.RawMessage(`[1]`)); err == nil {
		t.Error("withKind of a list")
	}
	var v any
	if err := yaml.Unmarshal(y, &v); err != nil {
		t.Error(err)
	}
}

func TestUnifiedDiff(t *testing.T) {
	a := "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n"
	b := "a\nB\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\n"
	got := unifiedDiff("x (revision 3)", "x (file)", a, b)
	want := `--- x (revision 3)
+++ x (file)
@@ -1,5 +1,5 @@
 a
-b
+B
 c
 d
 e
@@ -9,3 +9,4 @@
 i
 j
 k
+l
`
	if got != want {
		t.Errorf("diff:\n%s\nwant:\n%s", got, want)
	}
	if d := unifiedDiff("a", "b", "x\n", "x\n"); d != "" {
		t.Errorf("equal texts: %q", d)
	}
	if d := unifiedDiff("a", "b", "", "x\ny\n"); d != "--- a\n+++ b\n@@ -0,0 +1,2 @@\n+x\n+y\n" {
		t.Errorf("from nothing: %q", d)
	}
	if d := unifiedDiff("a", "b", "x\n", ""); d != "--- a\n+++ b\n@@ -1 +0,0 @@\n-x\n" {
		t.Errorf("to nothing: %q", d)
	}
	// Changes close together are one hunk; deletions come before insertions.
	if d := unifiedDiff("a", "b", "1\n2\n3\n4\n5\n", "1\nX\n3\nY\n5\n"); d != "--- a\n+++ b\n@@ -1,5 +1,5 @@\n 1\n-2\n+X\n 3\n-4\n+Y\n 5\n" {
		t.Errorf("close changes: %q", d)
	}
}

func TestDaysLeft(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		at   time.Time
		want int
	}{
		{now.Add(36 * time.Hour), 1}, {now.Add(23 * time.Hour), 0}, {now.Add(-time.Hour), -1}, {now.Add(-25 * time.Hour), -2},
	} {
		if got := daysLeft(c.at, now); got != c.want {
			t.Errorf("daysLeft(%v) = %d, want %d", c.at.Sub(now), got, c.want)
		}
	}
}

// FuzzParseDocuments: no panic on any file, and each object it reads is JSON that
// names its kind and name.
func FuzzParseDocuments(f *testing.F) {
	f.Add([]byte(webYAML))
	f.Add([]byte("{kind: pools, name: a, m: [1, 2.5, null, true, ~, 0x10, 'x']}"))
	f.Add([]byte("- {kind: l4-pools, name: b}\n- {kind: pool, name: c, x: &a [1], y: *a}\n"))
	f.Add([]byte("kind: pools\nname: a\n<<: {x: 1}\n"))
	f.Add([]byte("--- !!map\n? kind\n: pools\nname: a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, err := ParseDocuments("fuzz", data)
		if err != nil {
			return
		}
		for _, d := range docs {
			var obj map[string]any
			if err := json.Unmarshal(d.Object, &obj); err != nil {
				t.Fatalf("%s: not a JSON object: %v: %s", d.Source, err, d.Object)
			}
			if obj["name"] != d.Name || d.Kind == "" {
				t.Fatalf("%s: kind %q name %q, object %s", d.Source, d.Kind, d.Name, d.Object)
			}
			if _, err := canonicalKind(d.Kind); err != nil {
				t.Fatal(err)
			}
		}
	})
}
