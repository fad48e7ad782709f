package tgctl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Kinds are the kinds of the cluster configuration (control/model.Kinds), as the API
// names them.
var Kinds = []string{"listeners", "routing", "pools", "certificates", "cert-bindings", "l4-rules", "l4-pools", "l4-bgp"}

// kindAliases are the other names tgctl takes for a kind.
var kindAliases = map[string]string{
	"listener": "listeners", "route": "routing", "routes": "routing", "pool": "pools",
	"certificate": "certificates", "cert": "certificates", "certs": "certificates",
	"cert-binding": "cert-bindings", "binding": "cert-bindings", "bindings": "cert-bindings",
	"l4-rule": "l4-rules", "l4-pool": "l4-pools",
}

// canonicalKind returns the API's name for kind, a kind or an alias.
func canonicalKind(kind string) (string, error) {
	k := strings.ToLower(strings.TrimSpace(kind))
	for _, x := range Kinds {
		if k == x {
			return x, nil
		}
	}
	if x, ok := kindAliases[k]; ok {
		return x, nil
	}
	return "", fmt.Errorf("kind %q: want one of %s", kind, strings.Join(Kinds, ", "))
}

// Document is one object of an apply file: its kind and name and its JSON, without
// the kind field.
type Document struct {
	Kind   string
	Name   string
	Object json.RawMessage
	// Source is where it was read: "web.yaml:12".
	Source string
}

// maxNodes bounds the YAML nodes one file expands to, aliases included.
const maxNodes = 1 << 20

// ParseDocuments reads an apply file: a YAML stream (JSON is YAML too) whose
// documents are each an object with a kind field ("kind: pools") beside the object's
// own fields, name included, or a list of such objects. Empty documents are
// skipped. source names the file in errors.
func ParseDocuments(source string, data []byte) ([]Document, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []Document
	seen := map[string]string{}
	budget := maxNodes
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		root := &doc
		if root.Kind == yaml.DocumentNode {
			if len(root.Content) == 0 {
				continue
			}
			root = root.Content[0]
		}
		var objs []*yaml.Node
		switch {
		case root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null":
			continue
		case root.Kind == yaml.SequenceNode:
			objs = root.Content
		default:
			objs = []*yaml.Node{root}
		}
		for _, n := range objs {
			d, err := document(source, n, &budget)
			if err != nil {
				return nil, err
			}
			key := d.Kind + "/" + d.Name
			if at, ok := seen[key]; ok {
				return nil, fmt.Errorf("%s: %s is in the file twice (first at %s)", d.Source, key, at)
			}
			seen[key] = d.Source
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no objects", source)
	}
	return out, nil
}

func document(source string, n *yaml.Node, budget *int) (Document, error) {
	at := fmt.Sprintf("%s:%d", source, n.Line)
	d := Document{Source: at}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return d, fmt.Errorf("%s: an object is a mapping with a kind field, not a %s", at, nodeKind(n))
	}
	rest := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "kind":
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
				return d, fmt.Errorf("%s:%d: kind: want a string", source, v.Line)
			}
			kind, err := canonicalKind(v.Value)
			if err != nil {
				return d, fmt.Errorf("%s:%d: %w", source, v.Line, err)
			}
			d.Kind = kind
			continue
		case "name":
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" || v.Value == "" {
				return d, fmt.Errorf("%s:%d: name: want a string", source, v.Line)
			}
			d.Name = v.Value
		}
		rest.Content = append(rest.Content, k, v)
	}
	if d.Kind == "" {
		return d, fmt.Errorf("%s: kind: required (one of %s)", at, strings.Join(Kinds, ", "))
	}
	if d.Name == "" {
		return d, fmt.Errorf("%s: name: required", at)
	}
	var buf bytes.Buffer
	if err := nodeJSON(&buf, rest, budget, 0); err != nil {
		return d, fmt.Errorf("%s: %s/%s: %w", at, d.Kind, d.Name, err)
	}
	d.Object = buf.Bytes()
	return d, nil
}

func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.ScalarNode:
		return "scalar (" + n.ShortTag() + ")"
	}
	return "node"
}

// nodeJSON writes a YAML node as JSON, keys in their order. Scalars are typed as
// YAML 1.2 resolves them (null, true/false, numbers); timestamps stay strings.
func nodeJSON(buf *bytes.Buffer, n *yaml.Node, budget *int, depth int) error {
	if *budget--; *budget < 0 {
		return fmt.Errorf("over %d YAML nodes (aliases expanded)", maxNodes)
	}
	if depth > 200 {
		return errors.New("nested over 200 levels")
	}
	switch n.Kind {
	case yaml.AliasNode:
		return nodeJSON(buf, n.Alias, budget, depth+1)
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			buf.WriteString("null")
			return nil
		}
		return nodeJSON(buf, n.Content[0], budget, depth+1)
	case yaml.SequenceNode:
		buf.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := nodeJSON(buf, c, budget, depth+1); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
		return nil
	case yaml.MappingNode:
		buf.WriteByte('{')
		keys := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.AliasNode {
				k = k.Alias
			}
			if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
				return fmt.Errorf("line %d: a key is a string (merge keys are not taken)", k.Line)
			}
			if keys[k.Value] {
				return fmt.Errorf("line %d: key %q twice", k.Line, k.Value)
			}
			keys[k.Value] = true
			if i > 0 {
				buf.WriteByte(',')
			}
			kj, _ := json.Marshal(k.Value)
			buf.Write(kj)
			buf.WriteByte(':')
			if err := nodeJSON(buf, v, budget, depth+1); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
		return nil
	case yaml.ScalarNode:
		return scalarJSON(buf, n)
	}
	return fmt.Errorf("line %d: unexpected YAML node", n.Line)
}

func scalarJSON(buf *bytes.Buffer, n *yaml.Node) error {
	switch n.ShortTag() {
	case "!!null":
		buf.WriteString("null")
		return nil
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		buf.WriteString(strconv.FormatBool(b))
		return nil
	case "!!int":
		var i int64
		if err := n.Decode(&i); err != nil {
			var u uint64
			if n.Decode(&u) != nil {
				return fmt.Errorf("line %d: %q: an integer out of range", n.Line, n.Value)
			}
			buf.WriteString(strconv.FormatUint(u, 10))
			return nil
		}
		buf.WriteString(strconv.FormatInt(i, 10))
		return nil
	case "!!float":
		var f float64
		if err := n.Decode(&f); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Errorf("line %d: %q: JSON has no infinities or NaN", n.Line, n.Value)
		}
		out, _ := json.Marshal(f)
		buf.Write(out)
		return nil
	}
	out, _ := json.Marshal(n.Value)
	buf.Write(out)
	return nil
}

// withKind returns the JSON object obj with "kind": kind as its first member: an
// object as apply takes it.
func withKind(kind string, obj json.RawMessage) (json.RawMessage, error) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, obj); err != nil || buf.Len() < 2 || buf.Bytes()[0] != '{' {
		return nil, fmt.Errorf("%s: the API's object is not a JSON object", kind)
	}
	k, _ := json.Marshal(kind)
	out := append([]byte(`{"kind":`), k...)
	if rest := buf.Bytes()[1:]; rest[0] != '}' {
		out = append(out, ',')
		out = append(out, rest...)
	} else {
		out = append(out, '}')
	}
	return out, nil
}

// sameJSON reports whether two JSON values are equal as values (key order and
// spacing aside).
func sameJSON(a, b []byte) bool {
	var x, y any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	if da.Decode(&x) != nil || db.Decode(&y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return bytes.Equal(ja, jb)
}
