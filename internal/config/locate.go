package config

import (
	"bytes"
	"encoding"
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Locate finds the first value in data (YAML, or JSON, which is YAML) that v's type
// cannot take as text, and returns it as a FieldError naming its path and line:
// `rules[1].vip: line 7: "www": ParseAddr("www"): unable to parse IP`. Decoders
// report such values (addresses, durations: types read with UnmarshalText) with
// neither path nor line; a caller whose Decode failed calls Locate for a better
// error. It returns nil when it finds no such value.
func Locate(data []byte, v any) error {
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		return nil
	}
	t := reflect.TypeOf(v)
	if t == nil {
		return nil
	}
	return locate(&doc, t, "")
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

func locate(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return locate(n.Content[0], t, path)
	case yaml.AliasNode:
		if n.Alias == nil {
			return nil
		}
		return locate(n.Alias, t, path)
	}
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
			return nil
		}
		if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			return &FieldError{Path: path, Err: fmt.Errorf("line %d: %q: %w", n.Line, n.Value, err)}
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			if ft, ok := fields[n.Content[i].Value]; ok {
				if err := locate(n.Content[i+1], ft, At(path, n.Content[i].Value)); err != nil {
					return err
				}
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := locate(n.Content[i+1], t.Elem(), At(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return nil
		}
		for i, item := range n.Content {
			if err := locate(item, t.Elem(), Index(path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// yamlFields maps the YAML names of t's fields, those of inline fields included, to
// their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range yamlFields(ft) {
					if _, dup := out[k]; !dup {
						out[k] = v
					}
				}
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}
