package l7d

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// setOf returns a Set of prefixes.
func setOf(t *testing.T, prefixes ...string) *blacklist.Set {
	t.Helper()
	var b blacklist.Builder
	for _, p := range prefixes {
		b.Add(netip.MustParsePrefix(p), time.Time{})
	}
	return b.Build()
}

// waitBlocked waits up to 5s for new connections from 127.0.0.1 to be refused
// (blocked) or served (!blocked).
func (e *controlEnv) waitBlocked(blocked bool) {
	e.t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var c interface{ Close() error }
		c, _, err = e.handshake()
		if err == nil {
			c.Close()
		}
		if (err != nil) == blocked {
			return
		}
	}
	if blocked {
		e.t.Fatalf("connections still served 5s after the list was pushed")
	}
	e.t.Fatalf("connections still refused 5s after the delta: %v", err)
}

// TestControlBlacklists: l7d enforces the lists of the store that name its global
// list or its listeners, reports their versions in its status, follows deltas,
// refuses admin pushes to them, and, restarted with the store down, enforces the
// lists it kept on disk.
func TestControlBlacklists(t *testing.T) {
	e := newControlEnv(t)
	cert, _ := e.cert(1, e.key)
	e.put(append(siteObjects(), cert)...)
	stop, _, admin := e.startAdmin()
	if _, _, err := e.handshake(); err != nil {
		t.Fatalf("before any list: %v", err)
	}
	ctx := context.Background()
	w := blsync.NewWriter(e.st, blsync.WriterConfig{Logger: slog.New(slog.DiscardHandler)})
	defer w.Wait()

	v1, err := w.Replace(ctx, blacklist.GlobalName, setOf(t, "127.0.0.1/32", "203.0.113.0/24"), "test")
	if err != nil {
		t.Fatal(err)
	}
	e.waitBlocked(true)
	e.waitStatus("reporting the global list", func(s agent.Status) bool { return s.Blacklists[blacklist.GlobalName] == v1 })
	// The connections refused, hits of the list, in the node's status (read every 5s).
	e.waitStatus("reporting the global list's hits", func(s agent.Status) bool { return s.BlacklistHits[blacklist.GlobalName] > 0 })

	// A listener's list, and one naming no listener (not fetched, not reported).
	vWeb, err := w.Replace(ctx, "web", setOf(t, "198.51.100.0/24"), "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Replace(ctx, "elsewhere", setOf(t, "192.0.2.1/32"), "test"); err != nil {
		t.Fatal(err)
	}
	st := e.waitStatus("reporting the listener's list", func(s agent.Status) bool { return s.Blacklists["web"] == vWeb })
	if _, ok := st.Blacklists["elsewhere"]; ok {
		t.Errorf("a list naming no listener is reported enforced: %v", st.Blacklists)
	}
	if code, out, _ := admin.call("GET", "/blacklists/web", ""); code != 200 || out["entries"] != float64(1) {
		t.Errorf("GET /blacklists/web: %d %v, want the store's one entry", code, out)
	}

	// The admin endpoint does not change a list the store feeds.
	if code, out, _ := admin.call("PUT", "/blacklists/global", "192.0.2.7\n"); code != 409 || out["code"] != codeListFromControl {
		t.Errorf("PUT /blacklists/global answered %d %v, want 409 %s", code, out, codeListFromControl)
	}

	// A delta unblocks.
	v2, err := w.Delta(ctx, blacklist.GlobalName, &blacklist.Delta{Remove: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	e.waitBlocked(false)
	e.waitStatus("reporting the delta", func(s agent.Status) bool { return s.Blacklists[blacklist.GlobalName] == v2 })

	// Blocked again, then restarted with the store down: the list kept on disk is in
	// force as soon as the node serves.
	v3, err := w.Delta(ctx, blacklist.GlobalName, &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("127.0.0.0/8")}}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	e.waitBlocked(true)
	e.waitStatus("reporting the second delta", func(s agent.Status) bool { return s.Blacklists[blacklist.GlobalName] == v3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	w.Wait()
	e.st.Close()
	stop2, log2, admin2 := e.startAdmin()
	defer stop2()
	if c, _, err := e.handshake(); err == nil {
		c.Close()
		t.Fatal("restarted with the store down: a listed client's connection is served")
	}
	code, out, body := admin2.call("GET", "/blacklists/global", "")
	if code != 200 || out["entries"] != float64(2) || out["hits_packet"] == float64(0) {
		t.Errorf("GET /blacklists/global after the restart: %d %s, want 2 entries and a hit", code, body)
	}
	if !strings.Contains(log2.String(), "blacklist loaded from disk") {
		t.Errorf("the log does not say the list was loaded from disk:\n%s", log2)
	}
}
