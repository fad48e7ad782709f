package benchkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestMainExitStatus(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   int
		stderr string
	}{
		{nil, 0, ""},
		{fmt.Errorf("row 3: %w", ErrFailed), 1, ""},
		{errors.New("nginx did not start"), 1, "bench-x: nginx did not start\n"},
	} {
		var errb bytes.Buffer
		code := Main("bench-x", &errb, func(context.Context) error { return tc.err })
		if code != tc.code || errb.String() != tc.stderr {
			t.Errorf("run returning %v: status %d, stderr %q; want %d, %q", tc.err, code, errb.String(), tc.code, tc.stderr)
		}
	}
}

func TestWriteReportEnd(t *testing.T) {
	var b bytes.Buffer
	WriteReportEnd(&b, []string{"one", "two\nlines"}, map[string]int{"x": 1})
	want := "FAILURES (2):\n  one\n  two\n    lines\n{\"x\":1}\n"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	WriteReportEnd(&b, nil, func() {})
	if !strings.HasPrefix(b.String(), `{"failures":[`) {
		t.Errorf("an unencodable summary gave %q", b.String())
	}
}
