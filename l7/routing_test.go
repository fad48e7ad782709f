package l7

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/policy/clientip"
	"github.com/tiergate/tiergate/policy/route"
)

func TestSimpleRouting(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want *route.Config
	}{
		{
			name: "one listener, one pool",
			cfg: Config{
				Listeners: []ListenerConfig{{Listener: Listener{Name: "web", Pool: "app"}}},
				Backends:  map[string]PoolConfig{"app": {Members: []string{"10.0.0.1:80"}, Timeout: config.Duration(time.Second), ConnectTimeout: config.Duration(2 * time.Second), ConnsPerMember: 7}},
			},
			want: &route.Config{
				Pools: []route.Pool{{Name: "app", Members: []route.PoolMember{{Addr: "10.0.0.1:80", Weight: 1}},
					ConnectTimeout: route.Duration(2 * time.Second), MaxConnsPerMember: 7}},
				Listeners: []route.Listener{{Name: "web", VHosts: []route.VHost{{Names: []string{"*"},
					Routes: []route.Route{{Name: "app", Action: route.Action{Pool: "app"}, Timeout: route.Duration(time.Second)}}}}}},
			},
		},
		{
			name: "a member listed twice weighs twice; retries over the other members; pools sorted",
			cfg: Config{
				Listeners: []ListenerConfig{{Listener: Listener{Name: "a", Pool: "p2"}}, {Listener: Listener{Name: "b", Pool: "p1"}}},
				Backends: map[string]PoolConfig{
					"p2": {Members: []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.1:80"}},
					"p1": {Members: []string{"10.0.0.3:80"}},
				},
			},
			want: &route.Config{
				Pools: []route.Pool{
					{Name: "p1", Members: []route.PoolMember{{Addr: "10.0.0.3:80", Weight: 1}}},
					{Name: "p2", Members: []route.PoolMember{{Addr: "10.0.0.1:80", Weight: 2}, {Addr: "10.0.0.2:80", Weight: 1}}},
				},
				Listeners: []route.Listener{
					{Name: "a", VHosts: []route.VHost{{Names: []string{"*"}, Routes: []route.Route{{Name: "p2", Action: route.Action{Pool: "p2"}, Retries: 1}}}}},
					{Name: "b", VHosts: []route.VHost{{Names: []string{"*"}, Routes: []route.Route{{Name: "p1", Action: route.Action{Pool: "p1"}}}}}},
				},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := simpleRouting(&tc.cfg)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("simpleRouting =\n%+v\nwant\n%+v", got, tc.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("the simple form does not validate: %v", err)
			}
		})
	}
	if got := simpleRetries(40); got != 10 {
		t.Errorf("simpleRetries(40) = %d, want route's bound 10", got)
	}
}

func routingConfig(t testing.TB, rc *route.Config) Config {
	cfg := baseConfig(t)
	cfg.Backends = nil
	cfg.Listeners[0].Pool = ""
	cfg.Routing = rc
	return cfg
}

func TestRoutingConfigErrors(t *testing.T) {
	pool := route.Pool{Name: "p", Members: []route.PoolMember{{Addr: "127.0.0.1:1"}}}
	good := func() *route.Config {
		return &route.Config{Pools: []route.Pool{pool}, Listeners: []route.Listener{{Name: "web",
			VHosts: []route.VHost{{Names: []string{"*"}, Routes: []route.Route{{Action: route.Action{Pool: "p"}}}}}}}}
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"backends with routing", func(c *Config) { c.Backends = map[string]PoolConfig{"x": {Members: []string{"127.0.0.1:1"}}} }, "give routing or backends, not both"},
		{"pool with routing", func(c *Config) { c.Listeners[0].Pool = "p" }, `listeners[0].pool: pool "p" is set with routing`},
		{"unknown listener", func(c *Config) { c.Routing.Listeners[0].Name = "api" }, `listeners[0].name: "api" is not a listener`},
		{"invalid route", func(c *Config) { c.Routing.Listeners[0].VHosts[0].Routes[0].Action.Pool = "q" }, `routing.listeners[0].vhosts[0].routes[0].action.pool: no pool is named "q"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := routingConfig(t, good())
			tc.mod(&cfg)
			_, err := NewServer(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := NewServer(routingConfig(t, good())); err != nil {
		t.Errorf("good routing config: %v", err)
	}
}

// rawRequest sends raw over a new TLS connection (HTTP/1.1) and returns the response.
func (ts *testServer) rawRequest(t *testing.T, raw string) (*http.Response, []byte) {
	t.Helper()
	c, err := tls.Dial("tcp", ts.addr, &tls.Config{RootCAs: ts.pki.pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

func TestRouting(t *testing.T) {
	a := startBackend(t, "a")
	b := startBackend(t, "b")
	c := startBackend(t, "c")
	rc := &route.Config{
		Pools: []route.Pool{
			{Name: "pa", Members: []route.PoolMember{{Addr: a.addr}}},
			{Name: "pb", Members: []route.PoolMember{{Addr: b.addr}}},
			{Name: "pc", Members: []route.PoolMember{{Addr: c.addr}}},
		},
		Listeners: []route.Listener{{Name: "web", VHosts: []route.VHost{
			{Names: []string{"a.test"}, Routes: []route.Route{{Name: "a-all", Action: route.Action{Pool: "pa"}}}},
			{Names: []string{"*"}, Routes: []route.Route{
				{Name: "teapot", Match: route.Match{Path: "/teapot"},
					Action: route.Action{Respond: &route.Respond{Status: 418, Body: "short and stout\n"}}},
				{Name: "empty", Match: route.Match{Path: "/empty"}, Action: route.Action{Respond: &route.Respond{Status: 204}}},
				{Name: "moved", Match: route.Match{PathPrefix: "/old/"},
					Action: route.Action{Redirect: &route.Redirect{Code: 301, Path: "/new"}}},
				{Name: "limited", Match: route.Match{Path: "/limited"}, Action: route.Action{Pool: "pb"},
					RateLimit: &route.RateLimit{PerSecond: 0.01, Burst: 2}},
				{Name: "admin", Match: route.Match{PathPrefix: "/admin"},
					Action: route.Action{Respond: &route.Respond{Status: 403, Body: "no\n"}}},
				{Name: "public", Match: route.Match{PathPrefix: "/public/"}, Action: route.Action{Pool: "pb"},
					RequestHeaders:  route.HeaderEdits{Set: []route.HeaderValue{{Name: "X-Hop", Value: "edited"}}},
					ResponseHeaders: route.HeaderEdits{Add: []route.HeaderValue{{Name: "X-Route", Value: "public"}}, Remove: []string{"X-Backend"}}},
				{Name: "api", Match: route.Match{PathPrefix: "/api", Methods: []string{"POST"},
					Headers: []route.HeaderMatch{{Name: "X-Api-Key", Present: true}}}, Action: route.Action{Pool: "pc"}},
			}},
		}}},
	}
	cfg := routingConfig(t, rc)
	cfg.Decider = DeciderFunc(func(r *Request) Decision {
		if string(r.URI().Path()) == "/public/to-c" {
			return Decision{Pool: "pc"}
		}
		return Decision{}
	})
	ts := startServer(t, cfg)

	for _, proto := range []string{"1.1", "2", "3"} {
		cl := ts.client(t, proto)
		cl.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		do := func(method, path, host string, hdr map[string]string) (*http.Response, []byte) {
			t.Helper()
			req, _ := http.NewRequest(method, ts.url(path), nil)
			if host != "" {
				req.Host = host
			}
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatalf("HTTP/%s %s %s: %v", proto, method, path, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp, body
		}

		resp, body := do("GET", "/x", "A.Test:443", nil)
		if e := decodeEcho(t, body); resp.StatusCode != 200 || e.Backend != "a" {
			t.Errorf("HTTP/%s host a.test: %d %s", proto, resp.StatusCode, body)
		}
		resp, body = do("GET", "/teapot", "", nil)
		if resp.StatusCode != 418 || string(body) != "short and stout\n" || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Errorf("HTTP/%s respond: %d %q %v", proto, resp.StatusCode, body, resp.Header)
		}
		resp, body = do("GET", "/empty", "", nil)
		if resp.StatusCode != 204 || len(body) != 0 || resp.Header.Get("Content-Type") != "" {
			t.Errorf("HTTP/%s empty respond: %d %q %v", proto, resp.StatusCode, body, resp.Header)
		}
		resp, _ = do("GET", "/old/page?q=1", "", nil)
		if loc := resp.Header.Get("Location"); resp.StatusCode != 301 || loc != "https://"+ts.addr+"/new?q=1" {
			t.Errorf("HTTP/%s redirect: %d Location %q", proto, resp.StatusCode, loc)
		}
		resp, body = do("GET", "/public/p", "", map[string]string{"X-Hop": "client"})
		if e := decodeEcho(t, body); resp.StatusCode != 200 || e.Backend != "b" || e.Hop != "edited" ||
			resp.Header.Get("X-Route") != "public" || resp.Header.Get("X-Backend") != "" {
			t.Errorf("HTTP/%s header edits: %d %+v %v", proto, resp.StatusCode, e, resp.Header)
		}
		resp, body = do("GET", "/public/to-c", "", nil)
		if e := decodeEcho(t, body); resp.StatusCode != 200 || e.Backend != "c" {
			t.Errorf("HTTP/%s decider's pool: %d %s", proto, resp.StatusCode, body)
		}
		resp, body = do("POST", "/api/v1", "", map[string]string{"X-Api-Key": "k"})
		if e := decodeEcho(t, body); resp.StatusCode != 200 || e.Backend != "c" {
			t.Errorf("HTTP/%s api: %d %s", proto, resp.StatusCode, body)
		}
		if resp, _ = do("GET", "/api/v1", "", map[string]string{"X-Api-Key": "k"}); resp.StatusCode != 404 {
			t.Errorf("HTTP/%s GET /api (POST only): %d, want 404", proto, resp.StatusCode)
		}
		if resp, _ = do("POST", "/api/v1", "", nil); resp.StatusCode != 404 {
			t.Errorf("HTTP/%s api without key: %d, want 404", proto, resp.StatusCode)
		}
	}

	// Rate limit: two requests, then 429, per client IP whatever the protocol.
	var codes []int
	for _, proto := range []string{"1.1", "2", "3"} {
		resp, _ := get(t, ts.client(t, proto), "GET", ts.url("/limited"), "")
		codes = append(codes, resp.StatusCode)
	}
	if !reflect.DeepEqual(codes, []int{200, 200, 429}) {
		t.Errorf("rate-limited route answered %v, want [200 200 429]", codes)
	}

	// An ambiguous path is refused (path_mode reject, the default; see
	// TestPathModes); routes see the decoded path, and the backend gets the target as
	// sent, its query untouched.
	resp, _ := ts.rawRequest(t, "GET /public/../admin HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if resp.StatusCode != 400 {
		t.Errorf("dot segments: %d, want 400", resp.StatusCode)
	}
	resp, body := ts.rawRequest(t, "GET /public/%61dmin/x%20y?q=%20&r=../%2F HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if e := decodeEcho(t, body); resp.StatusCode != 200 || e.Backend != "b" || e.URI != "/public/%61dmin/x%20y?q=%20&r=../%2F" {
		t.Errorf("raw target: %d %+v", resp.StatusCode, e)
	}
	resp, _ = ts.rawRequest(t, "GET /%61dmin HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if resp.StatusCode != 403 {
		t.Errorf("percent-encoded /admin: %d, want 403", resp.StatusCode)
	}
	if resp, _ = ts.rawRequest(t, "GET /nothing HTTP/1.1\r\nHost: localhost\r\n\r\n"); resp.StatusCode != 404 {
		t.Errorf("no route: %d, want 404", resp.StatusCode)
	}

	for _, c := range []struct {
		route, code string
		want        float64
	}{
		{"teapot", "418", 3}, {"moved", "301", 3}, {"public", "200", 4}, {"pc", "200", 3},
		{"limited", "429", 1}, {"admin", "403", 1}, {routeNone, "404", 7}, {routeNone, "400", 1},
	} {
		if got := ts.requests(c.route, c.code); got != c.want {
			t.Errorf("tiergate_http_requests_total{route=%q,code=%q} = %v, want %v", c.route, c.code, got, c.want)
		}
	}
}

func TestRoutingRetriesAndNoMember(t *testing.T) {
	live := startBackend(t, "live")
	rc := &route.Config{
		Pools: []route.Pool{
			{Name: "p", Members: []route.PoolMember{{Addr: closedPort(t)}, {Addr: live.addr}}},
			{Name: "dead", Members: []route.PoolMember{{Addr: closedPort(t)}},
				PassiveEjection: &route.Ejection{ConsecutiveFailures: 1, EjectionTime: route.Duration(time.Minute)}},
		},
		Listeners: []route.Listener{{Name: "web", VHosts: []route.VHost{{Names: []string{"*"}, Routes: []route.Route{
			{Name: "once", Match: route.Match{Path: "/once"}, Action: route.Action{Pool: "p"}},
			{Name: "dead", Match: route.Match{Path: "/dead"}, Action: route.Action{Pool: "dead"}},
			{Name: "retried", Action: route.Action{Pool: "p"}, Retries: 1},
		}}}}},
	}
	ts := startServer(t, routingConfig(t, rc))
	c := ts.client(t, "1.1")
	for i := range 6 {
		if resp, body := get(t, c, "GET", ts.url("/r"), ""); resp.StatusCode != 200 {
			t.Errorf("retried GET %d: %d %s", i, resp.StatusCode, body)
		}
	}
	// Without retries, or for a POST, the dead member's turns fail with 502.
	codes := map[int]int{}
	for range 6 {
		resp, _ := get(t, c, "GET", ts.url("/once"), "")
		codes[resp.StatusCode]++
		resp, _ = get(t, c, "POST", ts.url("/r"), "x")
		codes[resp.StatusCode]++
	}
	if codes[502] == 0 || codes[200] == 0 || codes[502]+codes[200] != 12 {
		t.Errorf("without retries: %v, want some 502 and some 200", codes)
	}
	// A member ejected after one connection failure leaves no one: 502, then 503.
	if resp, _ := get(t, c, "GET", ts.url("/dead"), ""); resp.StatusCode != 502 {
		t.Errorf("dead pool, first request: %d, want 502", resp.StatusCode)
	}
	if resp, _ := get(t, c, "GET", ts.url("/dead"), ""); resp.StatusCode != 503 {
		t.Errorf("dead pool, member ejected: %d, want 503", resp.StatusCode)
	}
	if n := counter(ts.m.backendErrors.WithLabelValues("p", "connect")); n < 3 {
		t.Errorf("connect failures counted: %v", n)
	}
}

func TestReloadRouting(t *testing.T) {
	a := startBackend(t, "a")
	b := startBackend(t, "b")
	one := func(addr string) *route.Config {
		return &route.Config{
			Pools: []route.Pool{{Name: "p", Members: []route.PoolMember{{Addr: addr}}}},
			Listeners: []route.Listener{{Name: "web", VHosts: []route.VHost{{Names: []string{"*"},
				Routes: []route.Route{{Name: "all", Action: route.Action{Pool: "p"}}}}}}},
		}
	}
	ts := startServer(t, routingConfig(t, one(a.addr)))
	c := ts.client(t, "2")
	if _, body := get(t, c, "GET", ts.url("/"), ""); decodeEcho(t, body).Backend != "a" {
		t.Fatalf("before reload: %s", body)
	}
	old := ts.state.Load().upstreams.byKey[memberKey{"p", a.addr}]

	// The simple form and routing replace each other.
	if err := ts.Reload(baseConfig(t, b.addr)); err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, c, "GET", ts.url("/"), ""); decodeEcho(t, body).Backend != "b" {
		t.Errorf("after reload to the simple form: %s", body)
	}
	if err := ts.Reload(routingConfig(t, one(a.addr))); err != nil {
		t.Fatal(err)
	}
	if _, body := get(t, c, "GET", ts.url("/"), ""); decodeEcho(t, body).Backend != "a" {
		t.Errorf("after reload back: %s", body)
	}
	if ts.state.Load().upstreams.byKey[memberKey{"p", a.addr}] == old {
		t.Errorf("a member that was gone for one reload kept its client")
	}
	kept := ts.state.Load().upstreams.byKey[memberKey{"p", a.addr}]
	if err := ts.Reload(routingConfig(t, one(a.addr))); err != nil {
		t.Fatal(err)
	}
	if ts.state.Load().upstreams.byKey[memberKey{"p", a.addr}] != kept {
		t.Errorf("an unchanged member got a new client")
	}

	// An invalid routing policy changes nothing.
	bad := one(b.addr)
	bad.Pools[0].Members[0].Weight = -1
	if err := ts.Reload(routingConfig(t, bad)); err == nil || !strings.Contains(err.Error(), "weight") {
		t.Errorf("reload with a bad weight: %v", err)
	}
	if _, body := get(t, c, "GET", ts.url("/"), ""); decodeEcho(t, body).Backend != "a" {
		t.Errorf("a refused reload changed the routing: %s", body)
	}
}

// dialFrom dials the server's TCP port from a local address of 127/8. A server that
// resets the connection at once may do so before the dial returns.
func (ts *testServer) dialFrom(ip string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return d.Dial("tcp", ts.addr)
}

// handshakeFrom connects from ip, sends prefix, then runs a TLS handshake over the
// connection. It returns the handshake's error and the bytes the server sent.
func (ts *testServer) handshakeFrom(ip string, prefix []byte) (*tls.Conn, int, error) {
	c, err := ts.dialFrom(ip)
	if err != nil {
		return nil, 0, err
	}
	if len(prefix) > 0 {
		if _, err := c.Write(prefix); err != nil {
			c.Close()
			return nil, 0, err
		}
	}
	cc := &countingConn{Conn: c}
	_ = cc.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(cc, &tls.Config{RootCAs: ts.pki.pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, cc.n, err
	}
	return tc, cc.n, nil
}

// countingConn counts the bytes read from it.
type countingConn struct {
	net.Conn
	n int
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n += n
	return n, err
}

func TestAcceptFilter(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	blocked := netip.MustParseAddr("127.0.0.2")
	cfg.AcceptFilter = func(listener string, remote netip.AddrPort) bool {
		return listener != "web" || remote.Addr() != blocked
	}
	ts := startServer(t, cfg)

	if tc, n, err := ts.handshakeFrom("127.0.0.2", nil); err == nil || n != 0 {
		if tc != nil {
			tc.Close()
		}
		t.Errorf("filtered TCP connection: handshake error %v after reading %d bytes, want an error and nothing read", err, n)
	}

	// QUIC from the same address is refused at its first packet.
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP("127.0.0.2")})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tr := &quic.Transport{Conn: udp}
	defer tr.Close()
	raddr, _ := net.ResolveUDPAddr("udp", ts.addr)
	qtls := ts.clientTLS()
	qtls.NextProtos = []string{http3.NextProtoH3}
	_, err = tr.Dial(ctx, raddr, qtls, nil)
	var te *quic.TransportError
	if !errors.As(err, &te) || te.ErrorCode != quic.ConnectionRefused {
		t.Errorf("filtered QUIC connection: %v, want CONNECTION_REFUSED", err)
	}

	// A QUIC client may send its Initial more than once before the refusal arrives.
	if n := counter(ts.m.connsRejected.WithLabelValues("web", "filtered")); n < 2 {
		t.Errorf("filtered connections counted: %v, want at least 2", n)
	}
	if n := ts.handshakeCount(t, nil); n != 0 {
		t.Errorf("%v handshakes counted for filtered connections", n)
	}
	for _, p := range []string{"1.1", "3"} {
		if resp, body := get(t, ts.client(t, p), "GET", ts.url("/"), ""); resp.StatusCode != 200 {
			t.Errorf("HTTP/%s from 127.0.0.1: %d %s", p, resp.StatusCode, body)
		}
	}
}

func TestWrapListenerProxyProtocol(t *testing.T) {
	b := startBackend(t, "b1")
	res, err := clientip.New(clientip.Config{ProxyProtocol: true, ProxyTrusted: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].DisableHTTP3 = true
	cfg.Listeners[0].WrapListener = func(ln net.Listener) (net.Listener, error) {
		return clientip.NewListenerWithOptions(ln, res, clientip.Options{Name: "web"})
	}
	type seen struct {
		remote netip.AddrPort
		src    clientip.Source
	}
	got := make(chan seen, 1)
	cfg.Decider = DeciderFunc(func(r *Request) Decision {
		got <- seen{r.Conn.Remote, r.Conn.Source}
		return Decision{}
	})
	filtered := netip.MustParseAddr("198.51.100.66")
	cfg.AcceptFilter = func(_ string, remote netip.AddrPort) bool { return remote.Addr() != filtered }
	ts := startServer(t, cfg)

	send := func(from, src string) (int, error) {
		h := clientip.ProxyHeader{Version: 2, Command: clientip.CommandProxy,
			Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort("203.0.113.1:443")}
		frame, err := h.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		tc, n, err := ts.handshakeFrom(from, frame)
		if err != nil {
			return n, err
		}
		defer tc.Close()
		if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"); err != nil {
			return n, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			return n, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if e := decodeEcho(t, body); e.RealIP != "192.0.2.9" || e.XFF != "192.0.2.9" {
			t.Errorf("backend saw %+v, want the PROXY source", e)
		}
		return n, nil
	}

	if _, err := send("127.0.0.1", "192.0.2.9:40000"); err != nil {
		t.Fatalf("trusted peer: %v", err)
	}
	if s := <-got; s.remote != netip.MustParseAddrPort("192.0.2.9:40000") || s.src != clientip.SourceProxy {
		t.Errorf("ConnInfo: %v from %v, want 192.0.2.9:40000 from proxy_protocol", s.remote, s.src)
	}
	for _, tc := range []struct{ name, from, src string }{
		{"untrusted peer", "127.0.0.3", "192.0.2.9:40000"},
		{"filtered PROXY source", "127.0.0.1", "198.51.100.66:1"},
	} {
		if n, err := send(tc.from, tc.src); err == nil || n != 0 {
			t.Errorf("%s: %v after reading %d bytes, want refused before the handshake", tc.name, err, n)
		}
	}
	if n := counter(ts.m.connsRejected.WithLabelValues("web", "filtered")); n != 1 {
		t.Errorf("filtered connections: %v, want 1", n)
	}
}

func TestDecisionDrop(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Decider = DeciderFunc(func(r *Request) Decision {
		if string(r.URI().Path()) == "/drop" {
			return Decision{Drop: true}
		}
		return Decision{}
	})
	// quic-go's client forgets, without closing it, a connection on which a request
	// failed: let the server's idle timeout close it before the test's shutdown.
	cfg.Listeners[0].IdleTimeout = config.Duration(time.Second)
	ts := startServer(t, cfg)

	// HTTP/1.1: the connection is closed with no answer.
	c, err := tls.Dial("tcp", ts.addr, &tls.Config{RootCAs: ts.pki.pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /drop HTTP/1.1\r\nHost: localhost\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 100)); n != 0 || err == nil {
		t.Errorf("HTTP/1.1 drop: read %d bytes, %v; want the connection closed unanswered", n, err)
	}

	// HTTP/2 and HTTP/3: the stream is reset; the connection serves the next request.
	for _, p := range []string{"2", "3"} {
		cl := ts.client(t, p)
		if resp, err := cl.Get(ts.url("/drop")); err == nil {
			resp.Body.Close()
			t.Errorf("HTTP/%s drop answered %d", p, resp.StatusCode)
		}
		resp, body := get(t, cl, "GET", ts.url("/after"), "")
		if resp.StatusCode != 200 {
			t.Errorf("HTTP/%s after a drop: %d %s", p, resp.StatusCode, body)
		}
	}
	if n := ts.requests(routeNone, codeClosed); n < 3 {
		t.Errorf("dropped requests counted: %v, want at least 3", n)
	}
	if n := ts.conns(connH2); n != 1 {
		t.Errorf("HTTP/2 connections open after the drop: %v, want the one kept", n)
	}
}
