package l7

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

func TestProtocols(t *testing.T) {
	b := startBackend(t, "b1")
	ts := startServer(t, baseConfig(t, b.addr))
	altSvc := fmt.Sprintf(`h3=":%d"; ma=86400`, ts.port)

	for _, tc := range []struct{ proto, want string }{
		{"1.1", "HTTP/1.1"},
		{"2", "HTTP/2.0"},
		{"3", "HTTP/3.0"},
	} {
		t.Run("HTTP/"+tc.proto, func(t *testing.T) {
			c := ts.client(t, tc.proto)
			resp, body := get(t, c, "GET", ts.url("/a/b?x=1&y=%20"), "")
			if resp.StatusCode != 200 || resp.Proto != tc.want {
				t.Fatalf("got %d over %s, want 200 over %s: %s", resp.StatusCode, resp.Proto, tc.want, body)
			}
			if got := resp.Header.Get("Alt-Svc"); got != altSvc {
				t.Errorf("Alt-Svc = %q, want %q", got, altSvc)
			}
			if got := resp.Header.Get("X-Backend"); got != "b1" {
				t.Errorf("X-Backend = %q", got)
			}
			e := decodeEcho(t, body)
			want := echo{Method: "GET", URI: "/a/b?x=1&y=%20", Host: ts.addr, Proto: "HTTP/1.1",
				XFF: "127.0.0.1", RealIP: "127.0.0.1", XFProto: "https", Backend: "b1"}
			if e != want {
				t.Errorf("backend saw %+v\nwant %+v", e, want)
			}

			resp, body = get(t, c, "POST", ts.url("/post"), "hello body")
			e = decodeEcho(t, body)
			if resp.StatusCode != 200 || e.Method != "POST" || e.Body != "hello body" {
				t.Errorf("POST: %d %+v", resp.StatusCode, e)
			}

			resp, body = get(t, c, "HEAD", ts.url("/head"), "")
			if resp.StatusCode != 200 || len(body) != 0 {
				t.Errorf("HEAD: %d, body %q", resp.StatusCode, body)
			}
		})
	}
	if n := ts.requests("app", "200"); n != 9 {
		t.Errorf("tiergate_http_requests_total{route=app,code=200} = %v, want 9", n)
	}
	for _, p := range []string{ProtoHTTP1, ProtoHTTP2, ProtoHTTP3} {
		if n := counter(ts.m.requestsByProto.WithLabelValues("web", p)); n != 3 {
			t.Errorf("requests over %s = %v, want 3", p, n)
		}
	}
}

func TestHopByHopHeaders(t *testing.T) {
	b := startBackend(t, "b1")
	ts := startServer(t, baseConfig(t, b.addr))
	for _, proto := range []string{"1.1", "2"} {
		c := ts.client(t, proto)
		req, _ := http.NewRequest("GET", ts.url("/header"), nil)
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		req.Header.Set("X-Real-IP", "203.0.113.9")
		req.Header.Set("X-Forwarded-Proto", "http")
		if proto == "1.1" {
			req.Header.Set("Connection", "X-Hop")
			req.Header.Set("X-Hop", "must not pass")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e echo
		func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Scan()
			e = decodeEcho(t, sc.Bytes())
		}()
		if e.XFF != "127.0.0.1" || e.RealIP != "127.0.0.1" || e.XFProto != "https" {
			t.Errorf("HTTP/%s: client-supplied forwarding headers reached the backend: %+v", proto, e)
		}
		if e.Hop != "" || e.Conn != "" {
			t.Errorf("HTTP/%s: hop-by-hop headers reached the backend: %+v", proto, e)
		}
		for _, h := range []string{"X-Secret", "Keep-Alive"} {
			if v := resp.Header.Get(h); v != "" {
				t.Errorf("HTTP/%s: response carries %s: %q", proto, h, v)
			}
		}
		if got := resp.Header.Values("Alt-Svc"); len(got) != 1 || got[0] != fmt.Sprintf(`h3=":%d"; ma=86400`, ts.port) {
			t.Errorf("HTTP/%s: Alt-Svc = %q", proto, got)
		}
	}
}

func TestCurl(t *testing.T) {
	curl := testenv.RequireCommand(t, "curl", "curl")
	b := startBackend(t, "b1")
	ts := startServer(t, baseConfig(t, b.addr))
	dir := t.TempDir()
	caPath := filepath.Join(dir, "ca.pem")
	if err := testpki.WritePEM(caPath, "CERTIFICATE", ts.pki.ca.DER); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ flag, version string }{{"--http1.1", "1.1"}, {"--http2", "2"}} {
		out, err := exec.Command(curl, "-sS", tc.flag, "--cacert", caPath,
			"--resolve", fmt.Sprintf("localhost:%d:127.0.0.1", ts.port),
			"-D", "-", "-w", "\nversion=%{http_version}\n",
			fmt.Sprintf("https://localhost:%d/curl?q=1", ts.port)).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %s: %v\n%s", tc.flag, err, out)
		}
		s := string(out)
		for _, want := range []string{
			"version=" + tc.version,
			fmt.Sprintf(`alt-svc: h3=":%d"; ma=86400`, ts.port),
			`"uri":"/curl?q=1"`, `"xff":"127.0.0.1"`, `"xf_proto":"https"`,
		} {
			if !strings.Contains(strings.ToLower(s), strings.ToLower(want)) {
				t.Errorf("curl %s: output lacks %q:\n%s", tc.flag, want, s)
			}
		}
	}
}

func TestBackendDown(t *testing.T) {
	cfg := baseConfig(t, closedPort(t))
	ts := startServer(t, cfg)
	for _, proto := range []string{"1.1", "2", "3"} {
		resp, body := get(t, ts.client(t, proto), "GET", ts.url("/"), "")
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("HTTP/%s: %d %s, want 502", proto, resp.StatusCode, body)
		}
	}
	if n := counter(ts.m.backendErrors.WithLabelValues("app", "connect")); n < 3 {
		t.Errorf("connect errors counted: %v", n)
	}

	// A pool with a dead member and a live one: every request reaches the live one.
	b := startBackend(t, "live")
	cfg2 := baseConfig(t, closedPort(t), b.addr)
	ts2 := startServer(t, cfg2)
	c := ts2.client(t, "1.1")
	for i := 0; i < 4; i++ {
		if resp, body := get(t, c, "GET", ts2.url("/"), ""); resp.StatusCode != 200 {
			t.Errorf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
}

func TestSlowBackend(t *testing.T) {
	b := startBackend(t, "slow")
	cfg := baseConfig(t, b.addr)
	cfg.Backends["app"] = PoolConfig{Members: []string{b.addr}, Timeout: config.Duration(300 * time.Millisecond)}
	ts := startServer(t, cfg)
	for _, proto := range []string{"1.1", "2", "3"} {
		start := time.Now()
		resp, body := get(t, ts.client(t, proto), "GET", ts.url("/slow?d=3s"), "")
		took := time.Since(start)
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Errorf("HTTP/%s: %d %s, want 504", proto, resp.StatusCode, body)
		}
		if took > 1500*time.Millisecond {
			t.Errorf("HTTP/%s: 504 took %v with a 300ms timeout", proto, took)
		}
	}
	if n := ts.requests("app", "504"); n != 3 {
		t.Errorf("504s counted: %v", n)
	}
}

func TestLimits(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].MaxRequestBody = 1000
	cfg.Listeners[0].MaxHeaderBytes = 4096
	ts := startServer(t, cfg)

	t.Run("header too large", func(t *testing.T) {
		c := ts.client(t, "1.1")
		req, _ := http.NewRequest("GET", ts.url("/"), nil)
		req.Header.Set("X-Big", strings.Repeat("a", 8000))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("got %d, want 431", resp.StatusCode)
		}
		if n := ts.requests(routeNone, "431"); n != 1 {
			t.Errorf("431 counted %v times", n)
		}
	})
	t.Run("body too large", func(t *testing.T) {
		for _, proto := range []string{"1.1", "2", "3"} {
			resp, _ := get(t, ts.client(t, proto), "POST", ts.url("/"), strings.Repeat("b", 2000))
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Errorf("HTTP/%s: got %d, want 413", proto, resp.StatusCode)
			}
			resp, _ = get(t, ts.client(t, proto), "POST", ts.url("/"), strings.Repeat("b", 1000))
			if resp.StatusCode != 200 {
				t.Errorf("HTTP/%s: a body at the limit got %d", proto, resp.StatusCode)
			}
		}
	})
}

func TestMaxConns(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].MaxConns = 2
	ts := startServer(t, cfg)

	// MaxConns counts connections whose handshake is done (those in their handshake
	// have MaxHandshakes: TestHandshakeBudget).
	var held []net.Conn
	for range 2 {
		c, err := tls.Dial("tcp", ts.addr, ts.clientTLS())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	waitFor(t, "two connections tracked", func() bool { return ts.conns(connHTTP1) == 2 })

	extra, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if err := readClosed(extra, 2*time.Second); err != nil {
		t.Errorf("connection beyond MaxConns: %v", err)
	}
	if n := counter(ts.m.connsRejected.WithLabelValues("web", "max_conns")); n != 1 {
		t.Errorf("rejections counted: %v", n)
	}

	// QUIC connections count against the same limit, once their handshake is done.
	h3 := ts.client(t, "3")
	h3.Timeout = 2 * time.Second
	if resp, err := h3.Get(ts.url("/")); err == nil {
		resp.Body.Close()
		t.Errorf("HTTP/3 request beyond MaxConns answered %d", resp.StatusCode)
	}
	// The HTTP/3 client may dial again within its timeout when the first connection
	// is closed before its request is answered: each is refused and counted.
	if n := counter(ts.m.connsRejected.WithLabelValues("web", "max_conns")); n < 2 {
		t.Errorf("rejections counted after the QUIC connection: %v, want the TCP one and at least one QUIC", n)
	}
	if n := ts.l().quicHS.Load(); n != 0 {
		t.Errorf("the refused QUIC connection kept its handshake place: %d", n)
	}

	for _, c := range held {
		c.Close()
	}
	waitFor(t, "connections released", func() bool { return ts.l().nconns.Load() == 0 })
	if resp, body := get(t, ts.client(t, "2"), "GET", ts.url("/"), ""); resp.StatusCode != 200 {
		t.Errorf("after releasing: %d %s", resp.StatusCode, body)
	}
}

func (ts *testServer) l() *listener { return ts.listeners[0] }

func TestGracefulShutdown(t *testing.T) {
	b := startBackend(t, "b1")
	reg := startServer(t, baseConfig(t, b.addr))
	ts := reg
	clients := map[string]*http.Client{}
	for _, p := range []string{"1.1", "2", "3"} {
		clients[p] = ts.client(t, p)
		// Warm the connection up, so the slow request goes over an existing one.
		if resp, _ := get(t, clients[p], "GET", ts.url("/"), ""); resp.StatusCode != 200 {
			t.Fatalf("HTTP/%s warm-up: %d", p, resp.StatusCode)
		}
	}
	// An idle HTTP/1.1 connection with no request: it must not hold the shutdown up.
	idle, err := tls.Dial("tcp", ts.addr, ts.clientTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	type result struct {
		proto  string
		status int
		body   string
		err    error
	}
	results := make(chan result, 3)
	for p, c := range clients {
		go func() {
			resp, err := c.Get(ts.url("/slow?d=700ms&p=" + p))
			if err != nil {
				results <- result{proto: p, err: err}
				return
			}
			defer resp.Body.Close()
			var sb strings.Builder
			_, err = bufio.NewReader(resp.Body).WriteTo(&sb)
			results <- result{p, resp.StatusCode, sb.String(), err}
		}()
	}
	for range 3 {
		select {
		case <-b.arrived:
		case <-time.After(5 * time.Second):
			t.Fatal("slow requests did not reach the backend")
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := ts.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	took := time.Since(start)
	if took > 3*time.Second {
		t.Errorf("Shutdown took %v", took)
	}
	for range 3 {
		r := <-results
		if r.err != nil || r.status != 200 || !strings.Contains(r.body, `"uri":"/slow?d=700ms`) {
			t.Errorf("HTTP/%s request in flight during shutdown: %d %q %v", r.proto, r.status, r.body, r.err)
		}
	}
	if err := readClosed(idle, time.Second); err != nil {
		t.Errorf("idle connection: %v", err)
	}
	if c, err := net.DialTimeout("tcp", ts.addr, time.Second); err == nil {
		c.Close()
		t.Errorf("TCP still accepting after Shutdown")
	}
	if ts.l().nconns.Load() != 0 {
		t.Errorf("%d connections left after Shutdown", ts.l().nconns.Load())
	}
}

func TestShutdownDeadline(t *testing.T) {
	b := startBackend(t, "b1")
	ts := startServer(t, baseConfig(t, b.addr))
	c := ts.client(t, "2")
	errc := make(chan error, 1)
	go func() {
		resp, err := c.Get(ts.url("/slow?d=10s"))
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-b.arrived
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := ts.Shutdown(ctx); err == nil {
		t.Errorf("Shutdown with a request outliving the deadline returned nil")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Shutdown took %v past a 300ms deadline", took)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Errorf("request outliving the deadline succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Errorf("request still waiting after the forced close")
	}
}

func TestDecider(t *testing.T) {
	b1 := startBackend(t, "b1")
	b2 := startBackend(t, "b2")
	cfg := baseConfig(t, b1.addr)
	cfg.Backends["other"] = PoolConfig{Members: []string{b2.addr}}
	cfg.Decider = DeciderFunc(func(r *Request) Decision {
		switch string(r.URI().Path()) {
		case "/deny":
			return Decision{Status: http.StatusForbidden, Close: true}
		case "/other":
			return Decision{Pool: "other"}
		case "/cdn":
			return Decision{TrustedPeer: true, ClientIP: netip.MustParseAddr("198.51.100.7")}
		case "/unknown":
			return Decision{Pool: "nope"}
		}
		if r.Conn.Listener != "web" || !r.Conn.Remote.Addr().IsLoopback() || r.Conn.TLS == nil ||
			string(r.URI().Scheme()) != "https" || string(r.URI().Host()) != string(r.Header.Host()) {
			return Decision{Status: http.StatusTeapot}
		}
		return Decision{}
	})
	ts := startServer(t, cfg)
	for _, proto := range []string{"1.1", "2", "3"} {
		c := ts.client(t, proto)
		if resp, body := get(t, c, "GET", ts.url("/deny"), ""); resp.StatusCode != 403 {
			t.Errorf("HTTP/%s /deny: %d %s", proto, resp.StatusCode, body)
		}
		if resp, body := get(t, c, "GET", ts.url("/other"), ""); resp.StatusCode != 200 || decodeEcho(t, body).Backend != "b2" {
			t.Errorf("HTTP/%s /other: %d %s", proto, resp.StatusCode, body)
		}
		req, _ := http.NewRequest("GET", ts.url("/cdn"), nil)
		req.Header.Add("X-Forwarded-For", "198.51.100.7, 192.0.2.1")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e echo
		func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Scan()
			e = decodeEcho(t, sc.Bytes())
		}()
		if e.XFF != "198.51.100.7, 192.0.2.1, 127.0.0.1" || e.RealIP != "198.51.100.7" {
			t.Errorf("HTTP/%s trusted peer: XFF %q, X-Real-IP %q", proto, e.XFF, e.RealIP)
		}
		if resp, _ := get(t, c, "GET", ts.url("/unknown"), ""); resp.StatusCode != 502 {
			t.Errorf("HTTP/%s unknown pool: %d", proto, resp.StatusCode)
		}
		if resp, body := get(t, c, "GET", ts.url("/"), ""); resp.StatusCode != 200 {
			t.Errorf("HTTP/%s /: %d %s", proto, resp.StatusCode, body)
		}
	}
	if n := ts.requests("app", "403"); n != 3 {
		t.Errorf("403s counted under route app: %v", n)
	}
}

func TestReload(t *testing.T) {
	b1 := startBackend(t, "b1")
	b2 := startBackend(t, "b2")
	cfg := baseConfig(t, b1.addr)
	ts := startServer(t, cfg)
	c := ts.client(t, "2")
	if _, body := get(t, c, "GET", ts.url("/"), ""); decodeEcho(t, body).Backend != "b1" {
		t.Fatalf("before reload: %s", body)
	}

	// A new pool and a new certificate.
	leaf, err := ts.pki.ca.Leaf("reloaded", "localhost", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	next := baseConfig(t, b2.addr)
	next.Listeners[0].TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	// Prepared, it changes nothing until committed.
	prep, err := ts.Prepare(next)
	if err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, c, "GET", ts.url("/"), ""); decodeEcho(t, body).Backend != "b1" {
		t.Fatalf("after Prepare, before Commit: %s", body)
	}
	ts.Commit(prep)
	if _, body := get(t, c, "GET", ts.url("/"), ""); decodeEcho(t, body).Backend != "b2" {
		t.Errorf("after reload, on the old connection: %s", body)
	}
	for _, proto := range []string{"1.1", "3"} {
		resp, _ := get(t, ts.client(t, proto), "GET", ts.url("/"), "")
		if cn := resp.TLS.PeerCertificates[0].Subject.CommonName; cn != "reloaded" {
			t.Errorf("HTTP/%s after reload: certificate %q", proto, cn)
		}
	}

	bad := baseConfig(t, b2.addr)
	bad.Listeners[0].IdleTimeout = config.Duration(time.Minute + time.Second)
	if err := ts.Reload(bad); err == nil || !strings.Contains(err.Error(), "listeners[0].idle_timeout") {
		t.Errorf("reload changing IdleTimeout: %v", err)
	}
	bad = baseConfig(t, b2.addr)
	bad.Listeners[0].Addr = "127.0.0.1:1"
	if err := ts.Reload(bad); err == nil || !strings.Contains(err.Error(), "listeners[0].addr") {
		t.Errorf("reload changing Addr: %v", err)
	}
	if _, body := get(t, c, "GET", ts.url("/"), ""); decodeEcho(t, body).Backend != "b2" {
		t.Errorf("a refused reload changed something: %s", body)
	}
}

func TestConfigErrors(t *testing.T) {
	good := func() Config { return baseConfig(t, "127.0.0.1:1") }
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no listeners", func(c *Config) { c.Listeners = nil }, "listeners: at least one listener"},
		{"no name", func(c *Config) { c.Listeners[0].Name = "" }, "listeners[0].name: name is empty"},
		{"duplicate name", func(c *Config) { c.Listeners = append(c.Listeners, c.Listeners[0]) }, `listeners[1].name: "web": name used twice`},
		{"bad addr", func(c *Config) { c.Listeners[0].Addr = "127.0.0.1" }, "listeners[0].addr: address 127.0.0.1: missing port"},
		{"bad port", func(c *Config) { c.Listeners[0].Addr = "127.0.0.1:https" }, "port is not a number"},
		{"no TLS", func(c *Config) { c.Listeners[0].TLS = nil }, "listeners[0].tls: TLS with a certificate"},
		{"no cert", func(c *Config) { c.Listeners[0].TLS = &tls.Config{} }, "TLS with a certificate"},
		{"no pool", func(c *Config) { c.Listeners[0].Pool = "" }, "listeners[0].pool: pool is empty"},
		{"unknown pool", func(c *Config) { c.Listeners[0].Pool = "x" }, `pool "x" is not among`},
		{"negative timeout", func(c *Config) { c.Listeners[0].IdleTimeout = -1 }, "listeners[0].idle_timeout: -1ns: timeouts must not be negative"},
		{"tiny header limit", func(c *Config) { c.Listeners[0].MaxHeaderBytes = 100 }, "listeners[0].max_header_bytes: 100: below 1 KiB"},
		{"empty pool", func(c *Config) { c.Backends["app"] = PoolConfig{} }, "backends.app.members: no members"},
		{"bad member", func(c *Config) { c.Backends["app"] = PoolConfig{Members: []string{"backend"}} }, `backends.app.members[0]: member "backend"`},
		{"member port 0", func(c *Config) { c.Backends["app"] = PoolConfig{Members: []string{"10.0.0.1:0"}} }, "port from 1 to 65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.mod(&cfg)
			_, err := NewServer(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}

	cfg := good()
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := s.cfg.Listeners[0]
	if l.HandshakeTimeout.D() != 5*time.Second || l.MaxHeaderBytes != 64<<10 || l.MaxConns != 10000 ||
		l.MaxConcurrentStreams != 250 || l.MaxRequestBody != 16<<20 || l.IdleTimeout.D() != time.Minute || l.DeferAccept.D() != time.Second ||
		l.MaxHandshakes != 1000 || l.MaxHandshakesPerSource != 100 || l.QUICRetryAbove != 100 {
		t.Errorf("defaults not filled in: %+v", l)
	}
	if p := s.cfg.Backends["app"]; p.Timeout.D() != 30*time.Second || p.ConnsPerMember != 512 {
		t.Errorf("pool defaults not filled in: %+v", p)
	}
	if cfg.Listeners[0].HandshakeTimeout != 0 {
		t.Errorf("NewServer changed the caller's config")
	}
}

func TestBindConflict(t *testing.T) {
	// UDP taken on a fixed port: Start fails and releases the TCP socket.
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	cfg := baseConfig(t, "127.0.0.1:1")
	cfg.Listeners[0].Addr = udp.LocalAddr().String()
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil {
		s.Shutdown(context.Background())
		t.Fatal("Start succeeded with the UDP port taken")
	}
	ln, err := net.Listen("tcp", udp.LocalAddr().String())
	if err != nil {
		t.Errorf("TCP port still held after a failed Start: %v", err)
	} else {
		ln.Close()
	}

	// Without HTTP/3 the same address binds.
	cfg.Listeners[0].DisableHTTP3 = true
	ts := startServer(t, cfg)
	resp, _ := get(t, ts.client(t, "1.1"), "GET", ts.url("/"), "")
	if resp.Header.Get("Alt-Svc") != "" {
		t.Errorf("Alt-Svc sent with HTTP/3 disabled")
	}
}

func TestMain(m *testing.M) {
	// quic-go warns when it cannot raise the UDP buffer sizes, which tests do not need.
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	if spec := os.Getenv(burstClientsEnv); spec != "" {
		os.Exit(burstClients(spec, os.Stdout)) // the clients of TestLocalKeyBurstNotTimedOut
	}
	os.Exit(m.Run())
}

// TestResponsePassthrough checks that status, repeated headers and cookies reach
// clients of every protocol as the backend sent them.
func TestResponsePassthrough(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "a", Value: "1"})
		http.SetCookie(w, &http.Cookie{Name: "b", Value: "2", Path: "/"})
		w.Header().Add("X-Multi", "1")
		w.Header().Add("X-Multi", "2")
		w.Header().Set("Server", "backend")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("created"))
	}), ReadHeaderTimeout: time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ts := startServer(t, baseConfig(t, ln.Addr().String()))
	for _, p := range []string{"1.1", "2", "3"} {
		resp, body := get(t, ts.client(t, p), "GET", ts.url("/x"), "")
		h := resp.Header
		if resp.StatusCode != http.StatusCreated || string(body) != "created" ||
			strings.Join(h.Values("Set-Cookie"), "|") != "a=1|b=2; Path=/" ||
			strings.Join(h.Values("X-Multi"), "|") != "1|2" || h.Get("Server") != "backend" {
			t.Errorf("HTTP/%s: %d %q %v", p, resp.StatusCode, body, h)
		}
	}
}

// TestListenerModel: a Listener reads and writes the same names in YAML and JSON,
// durations as text; Defaults fills every zero field; Validate names fields by path.
func TestListenerModel(t *testing.T) {
	var l Listener
	in := "{name: web, addr: \"127.0.0.1:8443\", pool: app, idle_timeout: 90s, defer_accept: -1s, max_conns: 7}"
	if err := config.Decode([]byte(in), "listener", &l); err != nil {
		t.Fatal(err)
	}
	if l.IdleTimeout.D() != 90*time.Second || l.DeferAccept.D() != -time.Second || l.MaxConns != 7 || l.Pool != "app" {
		t.Fatalf("decoded %+v", l)
	}
	js, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"name":"web","addr":"127.0.0.1:8443","pool":"app","defer_accept":"-1s","idle_timeout":"1m30s","max_conns":7}`; string(js) != want {
		t.Errorf("JSON %s, want %s", js, want)
	}
	var back Listener
	if err := json.Unmarshal(js, &back); err != nil || back != l {
		t.Errorf("JSON round trip: %+v, %v", back, err)
	}
	l.Defaults()
	if l.HandshakeTimeout != DefaultHandshakeTimeout || l.IdleTimeout.D() != 90*time.Second || l.DeferAccept.D() != -time.Second ||
		l.MaxRequestBody != DefaultMaxRequestBody {
		t.Errorf("defaults: %+v", l)
	}
	l.ReadTimeout, l.MaxHeaderBytes, l.Addr = -1, 10, "nowhere"
	err = l.Validate()
	for _, want := range []string{"addr: address nowhere", "read_timeout: -1ns: timeouts must not be negative", "max_header_bytes: 10: below 1 KiB"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q among the errors", err, want)
		}
	}
	var pool PoolConfig
	if err := config.Decode([]byte("{members: [\"10.0.0.1:80\", x], timeout: 2s}"), "pool", &pool); err != nil {
		t.Fatal(err)
	}
	if err := pool.Validate(); err == nil || !strings.Contains(err.Error(), `members[1]: member "x"`) {
		t.Errorf("pool Validate: %v", err)
	}
}

// TestConnections counts a server's client connections, in their handshake and
// past it: the load l7d's heap goal follows (internal/gcgoal).
func TestConnections(t *testing.T) {
	b := startBackend(t, "b1")
	ts := startServer(t, baseConfig(t, b.addr))
	if n := ts.Connections(); n != 0 {
		t.Fatalf("%d connections before any, want 0", n)
	}
	raw, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte{0x16}); err != nil { // a record's first byte: in its handshake
		t.Fatal(err)
	}
	waitFor(t, "one connection in its handshake", func() bool { return ts.Connections() == 1 })
	tc, err := tls.Dial("tcp", ts.addr, ts.clientTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	waitFor(t, "a second connection, past its handshake", func() bool { return ts.Connections() == 2 })
	raw.Close()
	tc.Close()
	waitFor(t, "none", func() bool { return ts.Connections() == 0 })
}

// TestServed counts the work a server has done, for each protocol: one handshake
// per connection and each request answered (l7d's GOMAXPROCS sizing keeps a P only
// when this grows with it).
func TestServed(t *testing.T) {
	b := startBackend(t, "b1")
	ts := startServer(t, baseConfig(t, b.addr))
	want := ts.Served()
	if want != 0 {
		t.Fatalf("served %d before any request, want 0", want)
	}
	for _, proto := range []string{"1.1", "2", "3"} {
		c := ts.client(t, proto)
		for range 3 {
			if resp, _ := get(t, c, "GET", ts.url("/"), ""); resp.StatusCode != http.StatusOK {
				t.Fatalf("HTTP/%s: status %d", proto, resp.StatusCode)
			}
		}
		want += 1 + 3 // one connection's handshake and its three requests
		waitFor(t, fmt.Sprintf("served %d after HTTP/%s", want, proto), func() bool { return ts.Served() >= want })
		if got := ts.Served(); got != want {
			t.Fatalf("served %d after HTTP/%s, want %d", got, proto, want)
		}
	}
}
