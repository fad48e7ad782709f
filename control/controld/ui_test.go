package controld

import (
	"io"
	"strings"
	"testing"
)

// TestUIFlags checks the /ui dashboard's flags: a -prometheus that is not an
// http(s) URL and a -ui-scrape-interval under 100ms are refused by check.
func TestUIFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-prometheus", "http://127.0.0.1:9090"}, ""},
		{[]string{"-prometheus", "127.0.0.1:9090"}, "-prometheus"},
		{[]string{"-ui-scrape-interval", "1s"}, ""},
		{[]string{"-ui-scrape-interval", "10ms"}, "-ui-scrape-interval"},
	} {
		args := append([]string{"-data-dir", t.TempDir()}, tc.args...)
		c, err := ParseArgs("check", args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		c.Defaults()
		err = c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}
