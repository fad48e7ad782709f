package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/l7/l7d"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/route"
)

func TestParseSizes(t *testing.T) {
	for in, want := range map[string][]int{
		"1M,10M":          {1_000_000, 10_000_000},
		" 100k , 1M":      {100_000, 1_000_000},
		"1500":            {1500},
		"2K,3m":           {2000, 3_000_000},
		"50M":             {50_000_000},
		"1000,1k1":        nil,
		"":                nil,
		"0":               nil,
		"-1M":             nil,
		"1M,1M":           nil,
		"10M,1M":          nil,
		"51M":             nil,
		"1G":              nil,
		"1.5M":            nil,
		"99999999999999M": nil,
	} {
		got, err := parseSizes(in)
		if want == nil {
			if err == nil {
				t.Errorf("%q: accepted as %v", in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: got %v, %v; want %v", in, got, err, want)
		}
	}
}

func TestSizeName(t *testing.T) {
	for n, want := range map[int]string{1_000_000: "1M", 10_000_000: "10M", 100_000: "100k", 1500: "1500", 2_500_000: "2500k"} {
		if got := sizeName(n); got != want {
			t.Errorf("sizeName(%d) = %q, want %q", n, got, want)
		}
		if got, err := parseSizes(sizeName(n)); err != nil || len(got) != 1 || got[0] != n {
			t.Errorf("parseSizes(sizeName(%d)) = %v, %v", n, got, err)
		}
	}
}

func TestParseList(t *testing.T) {
	got, err := benchkit.ParseList("haproxy, l7d", serverNames)
	if err != nil || !slices.Equal(got, []string{srvL7d, srvHAProxy}) {
		t.Errorf("got %v, %v; want the known order", got, err)
	}
	if _, err := benchkit.ParseList("l7d,envoy", serverNames); err == nil || !strings.Contains(err.Error(), `"envoy"`) {
		t.Errorf("unknown server: %v", err)
	}
}

func TestMainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-bl-sizes", "0"},
		{"-duration", "0s"},
		{"-conns", "0"},
		{"-phases", "bogus"},
		{"-servers", "envoy"},
		{"-backend", "apache"},
		{"-lookups", "-1"},
		{"extra"},
	} {
		if code := Main(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%v: exit status %d, want 2", args, code)
		}
	}
}

func TestReadResponse(t *testing.T) {
	const ok = "HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: application/octet-stream\r\ncontent-length: 5\r\n\r\nhello"
	for _, c := range []struct {
		name      string
		in        string
		status    int
		body      string
		closeConn bool
		err       string
	}{
		{name: "keep-alive", in: ok, status: 200, body: "hello"},
		{name: "two in a row", in: ok + ok, status: 200, body: "hello"},
		{name: "connection close", in: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi", status: 200, body: "hi", closeConn: true},
		{name: "HTTP/1.0", in: "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", status: 200, closeConn: true},
		{name: "HTTP/1.0 keep-alive", in: "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n", status: 200},
		{name: "no reason phrase", in: "HTTP/1.1 404\r\nContent-Length: 0\r\n\r\n", status: 404},
		{name: "bare LF", in: "HTTP/1.1 502 Bad Gateway\nContent-Length: 1\n\nx", status: 502, body: "x"},
		{name: "chunked", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", err: "chunked"},
		{name: "no length", in: "HTTP/1.1 200 OK\r\n\r\nhello", err: "no Content-Length"},
		{name: "two lengths", in: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", err: "Content-Length"},
		{name: "negative length", in: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", err: "Content-Length"},
		{name: "too long", in: "HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n", err: "over"},
		{name: "bad status line", in: "HTTP/2 200\r\n\r\n", err: "status line"},
		{name: "bad status", in: "HTTP/1.1 2x0 OK\r\n\r\n", err: "status line"},
		{name: "bad header", in: "HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", err: "header line"},
		{name: "truncated body", in: "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello", err: "unexpected EOF"},
		{name: "truncated header", in: "HTTP/1.1 200 OK\r\nContent-Le", err: "unexpected EOF"},
		{name: "nothing", in: "", err: "EOF"},
	} {
		t.Run(c.name, func(t *testing.T) {
			buf := make([]byte, 1024)
			r, err := readResponse(bufio.NewReader(strings.NewReader(c.in)), buf)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one with %q", err, c.err)
				}
				return
			}
			if err != nil || r.status != c.status || string(r.body) != c.body || r.closeConn != c.closeConn {
				t.Fatalf("got %d %q close=%v, %v; want %d %q close=%v", r.status, r.body, r.closeConn, err, c.status, c.body, c.closeConn)
			}
		})
	}
	br := bufio.NewReader(strings.NewReader(ok + ok))
	for i := range 2 {
		if r, err := readResponse(br, make([]byte, 16)); err != nil || string(r.body) != "hello" {
			t.Fatalf("response %d on one connection: %q, %v", i, r.body, err)
		}
	}
	if _, err := readResponse(br, make([]byte, 16)); !errors.Is(err, io.EOF) {
		t.Errorf("after the last response: %v, want EOF", err)
	}
}

func TestParseStubStatus(t *testing.T) {
	text := "Active connections: 3 \nserver accepts handled requests\n 10 10 123 \nReading: 0 Writing: 1 Waiting: 2 \n"
	if n, err := parseStubStatus(text); err != nil || n != 123 {
		t.Errorf("got %v, %v; want 123", n, err)
	}
	for _, bad := range []string{"", "server accepts handled requests\n", "server accepts handled requests\n 1 2\n", "server accepts handled requests\n 1 2 x\n"} {
		if _, err := parseStubStatus(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseL7Metrics(t *testing.T) {
	text := `# HELP tiergate_http_requests_total Requests.
# TYPE tiergate_http_requests_total counter
tiergate_http_requests_total{code="200",route="origin"} 1500
tiergate_http_requests_total{code="502",route="origin"} 2
tiergate_http_requests_total{code="404",route="-"} 1
go_memstats_alloc_bytes_total 1.048576e+06
go_gc_duration_seconds_count 7
go_gc_duration_seconds_sum 0.01
tiergate_runtime_gomaxprocs 2
tiergate_runtime_gomaxprocs_changes_total{direction="down"} 1
tiergate_runtime_gomaxprocs_changes_total{direction="up"} 2
`
	c, err := parseL7Metrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if c.ok != 1500 || c.other != 3 || c.allocBytes != 1<<20 || c.gcCycles != 7 || c.procs.N != 2 || c.procs.Changes != 3 {
		t.Errorf("got %+v", *c)
	}
	d := c.minus(&l7Counters{ok: 500, allocBytes: 1 << 19, gcCycles: 2, procs: benchkit.Procs{N: 1, Changes: 1}})
	if d.procs.N != 2 || d.procs.Changes != 2 {
		t.Errorf("GOMAXPROCS over the row: %+v, want 2 Ps at the end and 2 changes", d.procs)
	}
	if kb, gc, ok := d.perRequest(); !ok || kb != 0.512 || gc != 5 {
		t.Errorf("per request: %v KB, %v GC per 1000, %v", kb, gc, ok)
	}
	if _, err := parseL7Metrics(strings.NewReader("tiergate_http_requests_total{code=\"200\"} x\n")); err == nil {
		t.Error("a bad value was accepted")
	}
}

func TestParseVersions(t *testing.T) {
	if v := parseNginxVersion("nginx version: nginx/1.22.1\n"); v != "1.22.1" {
		t.Errorf("nginx: %q", v)
	}
	if v := parseHAProxyVersion("HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/\nStatus: long-term"); v != "2.6.12-1+deb12u4" {
		t.Errorf("haproxy: %q", v)
	}
	if parseNginxVersion("") != "" || parseHAProxyVersion("garbage") != "" {
		t.Error("a version read from nothing")
	}
}

// TestConfigs checks the configurations given to l7d, and to nginx and haproxy when
// they are installed, with their own checkers.
func TestConfigs(t *testing.T) {
	dir := t.TempDir()
	fx, err := newFixture(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := l7d.ParseConfig([]byte(l7dConfig("127.0.0.1:8443", "127.0.0.1:9241", "127.0.0.1:8080", fx)), "l7d.yaml")
	if err != nil {
		t.Fatalf("l7d configuration: %v", err)
	}
	if len(cfg.Listeners) != 1 || !cfg.Listeners[0].DisableHTTP3 {
		t.Errorf("l7d listeners: %+v", cfg.Listeners)
	}
	if !strings.Contains(nginxBackendConfig(dir, "127.0.0.1:8080", 1), `"`+string(body)+`"`) {
		t.Error("the nginx backend does not answer with the body")
	}

	if nginx, err := exec.LookPath("nginx"); err == nil {
		for name, conf := range map[string]func(dir string) string{
			"backend": func(d string) string { return nginxBackendConfig(d, "127.0.0.1:8080", 1) },
			"proxy": func(d string) string {
				return nginxProxyConfig(d, "127.0.0.1:8443", "127.0.0.1:8080", fx.cert, fx.key, 2)
			},
		} {
			d := filepath.Join(dir, name)
			path := writeFile(t, d, "nginx.conf", conf(d))
			if out, err := exec.Command(nginx, "-t", "-q", "-c", path, "-p", d+"/", "-e", filepath.Join(d, "error.log")).CombinedOutput(); err != nil {
				t.Errorf("nginx -t, %s: %v: %s", name, err, out)
			}
		}
	} else {
		t.Log("nginx not installed: its configurations are not checked")
	}
	if haproxy, err := exec.LookPath("haproxy"); err == nil {
		path := writeFile(t, dir, "haproxy.cfg", haproxyConfig("127.0.0.1:8443", "127.0.0.1:8080", fx.combined, 2))
		if out, err := exec.Command(haproxy, "-c", "-q", "-f", path).CombinedOutput(); err != nil {
			t.Errorf("haproxy -c: %v: %s", err, out)
		}
	} else {
		t.Log("haproxy not installed: its configuration is not checked")
	}
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRouteTable(t *testing.T) {
	cfg, err := route.Parse([]byte(routeConfigYAML()))
	if err != nil {
		t.Fatal(err)
	}
	tab, err := route.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tab.Routes()); n != routeVHosts*len(vhostRoutes) || n != 1000 {
		t.Errorf("%d routes, want 1000", n)
	}
	for _, rq := range routeRequests() {
		r, ok := tab.Match(routeListener, rq.host, rq.method, rq.path, rq.header)
		if !ok || r.Name() != rq.want() {
			t.Errorf("%s: matched %v, %v; want %s", rq.name, r, ok, rq.want())
		}
	}
}

func TestBlacklistData(t *testing.T) {
	for _, kind := range kindNames {
		d := genData(kind, 3000)
		if d.len() != 3000 {
			t.Errorf("%s: %d entries, want 3000", kind, d.len())
		}
		s := d.build()
		p, err := makeProbes(d, s)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		l := blacklist.NewList("test", blacklist.Options{})
		l.Replace(s)
		if _, found := timeLookups(l, p.hits, len(p.hits)); found != len(p.hits) {
			t.Errorf("%s: %d of %d hits found", kind, found, len(p.hits))
		}
		if _, found := timeLookups(l, p.misses, len(p.misses)); found != 0 {
			t.Errorf("%s: %d misses found", kind, found)
		}
		n := len(p.mixed) + 12345
		if _, found := timeLookups(l, p.mixed, n); found != expectedFound(p.mixedHits, n) {
			t.Errorf("%s: %d of the mixed found, want %d", kind, found, expectedFound(p.mixedHits, n))
		}
		if again := genData(kind, 3000); !slices.Equal(again.v4, d.v4) || !slices.Equal(again.v6, d.v6) || !slices.Equal(again.cidrs, d.cidrs) {
			t.Errorf("%s: the data differs from one run to the next", kind)
		}
	}
	fwd, back := makeDeltas(genData(kindV4, 100_000))
	if len(fwd.Add)+len(fwd.Remove) != deltaSize || len(back.Add) != len(fwd.Remove) {
		t.Errorf("deltas of %d+%d and %d+%d entries", len(fwd.Add), len(fwd.Remove), len(back.Add), len(back.Remove))
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
