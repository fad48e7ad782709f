package route

import (
	"log/slog"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// headers is a HeaderFunc over a map of header values (names in any case).
func headers(kv map[string]string) HeaderFunc {
	h := make(map[string][]byte, len(kv))
	for k, v := range kv {
		h[textproto.CanonicalMIMEHeaderKey(k)] = []byte(v)
	}
	return func(name string) []byte { return h[name] }
}

// eventually polls cond every few milliseconds until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustCompile(t testing.TB, c *Config) *Table {
	t.Helper()
	tab, err := Compile(c)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return tab
}

// newTestRouter returns a Router logging to t, closed when the test ends.
func newTestRouter(t *testing.T) *Router {
	t.Helper()
	r := NewRouter(Options{Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	t.Cleanup(r.Close)
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// seenUp reports whether b's view of member m, the one Pick uses, is up.
func seenUp(b *Balancer, m *Member) bool { return b.availability().up[m.index] }

func mustApply(t *testing.T, r *Router, c *Config) {
	t.Helper()
	if err := r.Apply(c); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

// members returns pool members of weight 1 at the given addresses.
func members(addrs ...string) []PoolMember {
	out := make([]PoolMember, len(addrs))
	for i, a := range addrs {
		out[i] = PoolMember{Addr: a}
	}
	return out
}

// poolOnly is a Config with one pool and one listener routing everything to it.
func poolOnly(p Pool) *Config {
	return &Config{
		Pools: []Pool{p},
		Listeners: []Listener{{Name: "l", VHosts: []VHost{{
			Names:  []string{"*"},
			Routes: []Route{{Name: "all", Action: Action{Pool: p.Name}}},
		}}}},
	}
}

// pickCounts picks n times from b, ending each pick at once, and counts the members
// picked by address.
func pickCounts(t *testing.T, b *Balancer, n int, key func(i int) (ipHeader HeaderFunc)) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := range n {
		var h HeaderFunc
		if key != nil {
			h = key(i)
		}
		m, err := b.Pick(testIP, h, nil)
		if err != nil {
			t.Fatalf("Pick: %v", err)
		}
		counts[m.Addr()]++
		m.Done(Success)
	}
	return counts
}

var testIP = netip.MustParseAddr("198.51.100.7")

var _ HeaderWriter = http.Header{}
