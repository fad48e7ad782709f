package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestCommandMain(t *testing.T) {
	var ran, checked string
	c := Command{
		Name: "tgd", Usage: "usage: tgd run|check\n", DefaultConfig: "/etc/tgd.yaml",
		New: func(path string, _ io.Writer) Runner { return &fakeRunner{path: path, ran: &ran, checked: &checked} },
	}
	for _, tc := range []struct {
		args       []string
		code       int
		ran, check string
		stderr     string
	}{
		{nil, 2, "", "", "usage: tgd"},
		{[]string{"run"}, 0, "/etc/tgd.yaml", "", ""},
		{[]string{"run", "-config", "x.yaml"}, 0, "x.yaml", "", ""},
		{[]string{"check", "-config", "y.yaml"}, 0, "", "y.yaml", ""},
		{[]string{"check", "-config", "bad.yaml"}, 1, "", "bad.yaml", "tgd: line 3: nope"},
		{[]string{"run", "extra"}, 2, "", "", `unexpected arguments ["extra"]`},
		{[]string{"run", "-nope"}, 2, "", "", "flag provided but not defined"},
		{[]string{"serve"}, 2, "", "", `tgd: unknown command "serve"`},
		{[]string{"help"}, 0, "", "", ""},
	} {
		ran, checked = "", ""
		var out, errb bytes.Buffer
		code := c.Main(tc.args, &out, &errb)
		if code != tc.code || ran != tc.ran || checked != tc.check || !strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("Main(%q) = %d, ran %q, checked %q, stderr %q; want %d, %q, %q, %q",
				tc.args, code, ran, checked, errb.String(), tc.code, tc.ran, tc.check, tc.stderr)
		}
	}
}

type fakeRunner struct {
	path         string
	ran, checked *string
}

func (f *fakeRunner) Run(context.Context) error { *f.ran = f.path; return nil }

func (f *fakeRunner) Check(io.Writer) error {
	*f.checked = f.path
	if f.path == "bad.yaml" {
		return errors.New("line 3: nope")
	}
	return nil
}
