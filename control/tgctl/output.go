package tgctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"
)

// Output formats of -o.
const (
	FormatTable = "table"
	FormatJSON  = "json"
	FormatYAML  = "yaml"
)

// printer writes a command's answer in the format -o chose.
type printer struct {
	w      io.Writer
	format string
}

// data prints v (a value or JSON bytes) as JSON or YAML; for the table format it
// calls table instead.
func (p *printer) data(v any, table func(t *tabwriter.Writer)) error {
	switch p.format {
	case FormatTable:
		if table == nil {
			return p.json(v)
		}
		t := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
		table(t)
		return t.Flush()
	case FormatYAML:
		data, err := toJSON(v)
		if err != nil {
			return err
		}
		out, err := jsonToYAML(data)
		if err != nil {
			return err
		}
		_, err = p.w.Write(out)
		return err
	}
	return p.json(v)
}

func (p *printer) json(v any) error {
	data, err := toJSON(v)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, data, "", "  "); err != nil {
		return fmt.Errorf("formatting the answer: %w", err)
	}
	buf.WriteByte('\n')
	_, err = p.w.Write(buf.Bytes())
	return err
}

func toJSON(v any) ([]byte, error) {
	switch v := v.(type) {
	case json.RawMessage:
		return v, nil
	case []byte:
		return v, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding the answer: %w", err)
	}
	return data, nil
}

// jsonToYAML renders a JSON value as block YAML, keeping the order of its keys;
// strings of several lines (certificate chains) as literal blocks.
func jsonToYAML(data []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("converting JSON to YAML: %w", err)
	}
	blockStyle(&doc)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("encoding YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func blockStyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && strings.Contains(strings.TrimRight(n.Value, "\n"), "\n") {
		n.Style = yaml.LiteralStyle
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// yamlDocs renders several JSON values as a YAML stream, one document each.
func yamlDocs(w io.Writer, docs [][]byte) error {
	for i, d := range docs {
		out, err := jsonToYAML(d)
		if err != nil {
			return err
		}
		if i > 0 {
			io.WriteString(w, "---\n")
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// row writes tab-separated cells and a newline.
func row(t io.Writer, cells ...any) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(t, "\t")
		}
		fmt.Fprint(t, c)
	}
	io.WriteString(t, "\n")
}

// orDash is s, or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
