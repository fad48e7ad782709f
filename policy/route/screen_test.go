package route

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestScreen: each listener's path_mode and strict_sni decide what becomes of a
// request before it is routed, and each refusal is counted.
func TestScreen(t *testing.T) {
	all := []VHost{{Names: []string{"*"}, Routes: []Route{{Name: "all", Action: Action{Respond: &Respond{Status: 200}}}}}}
	tab := mustCompile(t, &Config{Listeners: []Listener{
		{Name: "default", VHosts: all},
		{Name: "normalize", VHosts: all, PathMode: PathForwardNormalized},
		{Name: "raw", VHosts: all, PathMode: PathForwardRaw},
		{Name: "strict", VHosts: all, StrictSNI: true},
	}})
	tests := []struct {
		listener, host, sni, path string
		status                    int
		forward                   string // the path to route and forward instead, if any
	}{
		{"default", "www.example.com", "www.example.com", "/public/x", 0, ""},
		{"default", "www.example.com", "www.example.com", "/public/..;/admin", 400, ""},
		{"default", "www.example.com", "www.example.com", "/public/..%5cadmin", 400, ""},
		{"default", "www.example.com", "www.example.com", "/public/%2e%2e/admin", 400, ""},
		{"default", "www.example.com", "", "/a%2fb", 400, ""},
		{"unknown", "www.example.com", "", "/a/../b", 400, ""},
		{"default", "other.example", "www.example.com", "/", 0, ""},

		{"normalize", "www.example.com", "www.example.com", "/public/..;/admin", 0, "/admin"},
		{"normalize", "www.example.com", "www.example.com", "/public/..%5cadmin", 0, "/admin"},
		{"normalize", "www.example.com", "www.example.com", "/a//b/./c/", 0, "/a/b/c/"},
		{"normalize", "www.example.com", "www.example.com", "/public/%2500", 400, ""},
		{"normalize", "www.example.com", "www.example.com", "/public/x", 0, ""},

		{"raw", "www.example.com", "www.example.com", "/public/..;/admin", 0, ""},
		{"raw", "www.example.com", "www.example.com", "/public/%00", 0, ""},

		{"strict", "www.example.com", "www.example.com", "/", 0, ""},
		{"strict", "WWW.Example.COM:443", "www.example.com", "/", 0, ""},
		{"strict", "www.example.com.", "www.example.com", "/", 0, ""},
		{"strict", "api.example.com", "www.example.com", "/", 421, ""},
		{"strict", "www.example.com", "", "/", 421, ""},
		{"strict", "192.0.2.1", "", "/", 421, ""},
		{"strict", "", "www.example.com", "/", 421, ""},
		{"strict", "api.example.com", "www.example.com", "/a/../b", 421, ""},
		{"strict", "www.example.com", "www.example.com", "/a/../b", 400, ""},
	}
	for _, tt := range tests {
		status, path := tab.Screen(tt.listener, []byte(tt.host), tt.sni, []byte(tt.path), nil)
		if status != tt.status || string(path) != tt.forward {
			t.Errorf("%s: Host %q, SNI %q, %q: %d %q; want %d %q", tt.listener, tt.host, tt.sni, tt.path, status, path, tt.status, tt.forward)
		}
	}
	m := tab.m
	for _, c := range []struct {
		listener, result string
		want             float64
	}{
		{"default", "refused", 4}, {"unknown", "refused", 1}, {"normalize", "normalized", 3}, {"normalize", "refused", 1},
		{"raw", "forwarded", 2}, {"strict", "refused", 1},
	} {
		if got := testutil.ToFloat64(m.ambiguous.WithLabelValues(c.listener, c.result)); got != c.want {
			t.Errorf("ambiguous_paths{listener=%q,result=%q} = %v, want %v", c.listener, c.result, got, c.want)
		}
	}
	if got := testutil.ToFloat64(m.misdirected.WithLabelValues("strict")); got != 5 {
		t.Errorf("misdirected{listener=strict} = %v, want 5", got)
	}
	if n := testing.AllocsPerRun(100, func() {
		tab.Screen("strict", []byte("www.example.com"), "www.example.com", []byte("/public/x/y.html"), nil)
	}); n != 0 {
		t.Errorf("Screen of a clean request allocates %v times", n)
	}
}
