package l7d

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"

	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/clientip"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func mustSet(t *testing.T, text string) *blacklist.Set {
	t.Helper()
	s, err := blacklist.ParseText(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDecide(t *testing.T) {
	cfg := &FileConfig{
		Listeners: []ListenerFile{
			{Name: "cdn", ClientIP: clientip.Config{TrustedProxies: []string{"192.0.2.0/24"}}},
			{Name: "lb", ClientIP: clientip.Config{ProxyProtocol: true, ProxyTrusted: []string{"10.0.0.1"},
				TrustedProxies: []string{"198.18.0.0/15"}, Header: "X-Real-IP"}},
			{Name: "plain"},
		},
		Blacklists: map[string]BlacklistFile{"cdn": {Action: ActionClose}},
	}
	reg := prometheus.NewRegistry()
	lists := blacklist.NewLists(blacklist.Options{Registerer: reg})
	lists.Global().Replace(mustSet(t, "203.0.113.66\n198.51.100.0/24\n"))
	lists.Listener("cdn").Replace(mustSet(t, "203.0.113.77\n"))
	pol, err := newPolicy(cfg, lists, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name     string
		listener string
		remote   string
		source   clientip.Source
		headers  map[string]string
		want     l7.Decision
		hit      string // list:source counted
	}{
		{name: "plain peer", listener: "plain", remote: "203.0.113.1:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.66"},
			want:    l7.Decision{ClientIP: a("203.0.113.1")}},
		{name: "untrusted peer's XFF ignored", listener: "cdn", remote: "203.0.113.2:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.66"},
			want:    l7.Decision{ClientIP: a("203.0.113.2")}},
		{name: "trusted peer: rightmost untrusted", listener: "cdn", remote: "192.0.2.5:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.66, 203.0.113.9, 192.0.2.7"},
			want:    l7.Decision{ClientIP: a("203.0.113.9"), ClientSource: clientip.SourceHeader, TrustedPeer: true}},
		{name: "trusted peer, blacklisted client: forbid", listener: "cdn", remote: "192.0.2.5:1",
			headers: map[string]string{"X-Forwarded-For": "198.51.100.4"},
			want:    l7.Decision{ClientIP: a("198.51.100.4"), ClientSource: clientip.SourceHeader, TrustedPeer: true, Status: 403}, hit: "global:header"},
		{name: "listener list with action close", listener: "cdn", remote: "192.0.2.5:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.77"},
			want:    l7.Decision{ClientIP: a("203.0.113.77"), ClientSource: clientip.SourceHeader, TrustedPeer: true, Drop: true}, hit: "cdn:header"},
		{name: "another listener's list does not apply", listener: "plain", remote: "203.0.113.77:1",
			want: l7.Decision{ClientIP: a("203.0.113.77")}},
		{name: "blacklisted peer on a kept-alive connection", listener: "plain", remote: "203.0.113.66:1",
			want: l7.Decision{ClientIP: a("203.0.113.66"), Status: 403}, hit: "global:packet"},
		{name: "PROXY source, untrusted for headers", listener: "lb", remote: "203.0.113.3:1", source: clientip.SourceProxy,
			headers: map[string]string{"X-Real-IP": "203.0.113.66"},
			want:    l7.Decision{ClientIP: a("203.0.113.3"), ClientSource: clientip.SourceProxy}},
		{name: "PROXY source trusted, single-value header", listener: "lb", remote: "198.18.0.9:1", source: clientip.SourceProxy,
			headers: map[string]string{"X-Real-IP": "203.0.113.10"},
			want:    l7.Decision{ClientIP: a("203.0.113.10"), ClientSource: clientip.SourceHeader, TrustedPeer: true}},
		{name: "blacklisted PROXY source counts as packet", listener: "lb", remote: "198.51.100.9:1", source: clientip.SourceProxy,
			want: l7.Decision{ClientIP: a("198.51.100.9"), ClientSource: clientip.SourceProxy, Status: 403}, hit: "global:packet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(hitsVec(t, reg))
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			for k, v := range tc.headers {
				req.Header.Add(k, v)
			}
			got := pol.Decide(&l7.Request{Request: req, Conn: l7.ConnInfo{Listener: tc.listener, Remote: ap(tc.remote), Source: tc.source}})
			if got != tc.want {
				t.Errorf("Decide = %+v, want %+v", got, tc.want)
			}
			after := testutil.ToFloat64(hitsVec(t, reg))
			switch {
			case tc.hit == "" && after != before:
				t.Errorf("a hit was counted")
			case tc.hit != "":
				list, source, _ := strings.Cut(tc.hit, ":")
				if after != before+1 || lists.Listener(list).Hits(source) == 0 {
					t.Errorf("hit %s not counted", tc.hit)
				}
			}
		})
	}

	if !pol.accept("plain", ap("203.0.113.1:5")) || pol.accept("plain", ap("198.51.100.1:5")) || pol.accept("cdn", ap("203.0.113.77:5")) {
		t.Errorf("accept filter does not follow the lists")
	}
}

// hitsVec sums tiergate_blacklist_hits_total.
func hitsVec(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, mf := range mfs {
			if mf.GetName() == "tiergate_blacklist_hits_total" {
				for _, m := range mf.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("sum", "", nil, nil), prometheus.CounterValue, sum)
	})
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestReadBlacklists(t *testing.T) {
	dir := t.TempDir()
	g1, g2, l1 := filepath.Join(dir, "g1.txt"), filepath.Join(dir, "g2.txt.gz"), filepath.Join(dir, "l1.txt")
	writeFile(t, g1, "192.0.2.1\n")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, "# from the risk engine\n198.51.100.0/24\n")
	zw.Close()
	writeFile(t, g2, gz.String())
	writeFile(t, l1, "203.0.113.5\n")
	cfg := &FileConfig{Blacklists: map[string]BlacklistFile{
		"global": {Files: []string{g1, g2}},
		"web":    {Files: []string{l1}},
		"api":    {Action: ActionClose}, // no files: pushes only
	}}

	sets, sources, err := readBlacklists(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := sets["global"]
	if len(sets) != 2 || g == nil || !g.Contains(netip.MustParseAddr("192.0.2.1")) || !g.Contains(netip.MustParseAddr("198.51.100.77")) ||
		sets["web"].Len() != 1 || len(sources) != 2 {
		t.Fatalf("first load: %v sets, sources %v", sets, sources)
	}

	// Unchanged files are not read again into a set: what was pushed stays.
	sets, sources2, err := readBlacklists(cfg, sources)
	if err != nil || len(sets) != 0 || len(sources2) != 2 {
		t.Errorf("unchanged: %v %v", sets, err)
	}

	// One file changed: that list only; a list whose files are gone is emptied.
	writeFile(t, l1, "203.0.113.5\n203.0.113.6\n")
	delete(cfg.Blacklists, "global")
	sets, sources3, err := readBlacklists(cfg, sources2)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := sets["global"]; !ok || s != nil || sets["web"].Len() != 2 || len(sets) != 2 || len(sources3) != 1 {
		t.Errorf("after changes: %v, sources %v", sets, sources3)
	}

	// A bad line fails the whole, naming the list, the file and the line.
	writeFile(t, l1, "203.0.113.5\nnot-an-address\n")
	if _, _, err := readBlacklists(cfg, sources3); err == nil || !strings.Contains(err.Error(), "blacklists.web: "+l1+": ") ||
		!strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad line: %v", err)
	}
	cfg.Blacklists["web"] = BlacklistFile{Files: []string{filepath.Join(dir, "missing")}}
	if _, _, err := readBlacklists(cfg, sources3); err == nil || !strings.Contains(err.Error(), "blacklists.web") {
		t.Errorf("missing file: %v", err)
	}
}

func TestAdminBlacklists(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := &Daemon{reg: reg, log: quietLogger(), listenerNames: []string{"web"},
		lists: blacklist.NewLists(blacklist.Options{Registerer: reg})}
	c := &control{d: d}
	c.setConfig(&FileConfig{Blacklists: map[string]BlacklistFile{"web": {Action: ActionClose}}})
	d.startOwner(c)
	t.Cleanup(d.close)
	srv := httptest.NewServer(d.adminHandler())
	defer srv.Close()

	call := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		b, _ := io.ReadAll(resp.Body)
		if len(b) > 0 && b[0] == '{' {
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatalf("%s %s: %v: %s", method, path, err, b)
			}
		}
		return resp.StatusCode, out
	}
	blocked := func(list, addr string) bool { return d.lists.Listener(list).Contains(netip.MustParseAddr(addr)) }

	if code, out := call("PUT", "/blacklists/global", "192.0.2.1\n192.0.2.4/30 ttl=1h\n2001:db8::1\n"); code != 200 || out["entries"] != 3.0 || out["action"] != "forbid" {
		t.Errorf("PUT text: %d %v", code, out)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	blacklist.WriteBinary(zw, mustSet(t, "203.0.113.0/24\n203.0.114.1\n"))
	zw.Close()
	if code, out := call("PUT", "/blacklists/web", gz.String()); code != 200 || out["entries"] != 2.0 || out["action"] != "close" {
		t.Errorf("PUT gzip binary: %d %v", code, out)
	}
	code, out := call("PUT", "/blacklists/global", "192.0.2.9\nbogus\n10.0.0.0/40\n")
	lines, _ := out["lines"].([]any)
	if code != 422 || out["code"] != "bad_lines" || out["bad_lines"] != 2.0 || len(lines) != 2 ||
		lines[0].(map[string]any)["line"] != 2.0 || lines[1].(map[string]any)["line"] != 3.0 {
		t.Errorf("PUT bad lines: %d %v", code, out)
	}
	if !blocked("global", "192.0.2.5") || blocked("global", "192.0.2.9") {
		t.Errorf("a rejected upload changed the list")
	}
	if code, out := call("POST", "/blacklists/global/delta", "-192.0.2.4/30\n+192.0.2.9 ttl=60\n"); code != 200 || out["entries"] != 3.0 {
		t.Errorf("delta: %d %v", code, out)
	}
	if blocked("global", "192.0.2.5") || !blocked("global", "192.0.2.1") || !blocked("global", "192.0.2.9") || !blocked("global", "2001:db8::1") {
		t.Errorf("delta not applied")
	}
	if code, out := call("POST", "/blacklists/global/delta", "192.0.2.10\n"); code != 422 || out["bad_lines"] != 1.0 {
		t.Errorf("delta without sign: %d %v", code, out)
	}
	if code, out := call("PUT", "/blacklists/api", "192.0.2.1\n"); code != 404 || out["code"] != "unknown_list" {
		t.Errorf("unknown list: %d %v", code, out)
	}
	if code, _ := call("DELETE", "/blacklists/global", ""); code != 405 {
		t.Errorf("DELETE: %d, want 405", code)
	}
	if code, out := call("GET", "/blacklists/web", ""); code != 200 || out["entries"] != 2.0 {
		t.Errorf("GET: %d %v", code, out)
	}
	resp, err := http.Get(srv.URL + "/blacklists")
	if err != nil {
		t.Fatal(err)
	}
	var all []listInfo
	json.NewDecoder(resp.Body).Decode(&all)
	resp.Body.Close()
	if len(all) != 2 || all[0].List != "global" || all[1].List != "web" {
		t.Errorf("GET /blacklists: %+v", all)
	}
}
