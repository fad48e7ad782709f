package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/policy/clientip"
)

// These tests drive l7d's policy end to end: client addresses from the packet, a
// PROXY header or X-Forwarded-For; blacklists loaded from files and pushed through
// the admin API, checked before the TLS handshake and per request; routing with
// health checks, retries, rate limits and reloads. Clients take addresses of 127/8
// other than 127.0.0.1 by binding their local address: all of 127/8 is local.

// namedBackend is an HTTP/1.1 backend that answers with its name and what it saw of
// the client, and whose /healthz answers a status that tests set.
type namedBackend struct {
	name   string
	addr   string
	hits   atomic.Int64
	health atomic.Int32
}

type seen struct {
	Backend, Path, XFF, XRealIP string
}

func newNamedBackend(t *testing.T, name string) *namedBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &namedBackend{name: name, addr: ln.Addr().String()}
	b.health.Store(200)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.WriteHeader(int(b.health.Load()))
			return
		}
		b.hits.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(seen{b.name, r.URL.Path, r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Real-Ip")})
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return b
}

// siteCert returns the certificates section of an l7d configuration serving
// site.test with a new ECDSA key.
func siteCert(t *testing.T, s *site) string {
	cert := s.cert(t, "site", ecKey(t), true, "site.test")
	return `certificates: {certificates: [{cert_file: "` + cert + `", key_file: "` + strings.TrimSuffix(cert, ".pem") + `.key"}]}` + "\n"
}

// clientFrom returns an HTTPS client whose connections come from the local address ip.
func clientFrom(s *site, ip, proto string) *http.Client {
	c := httpsClient(s, proto)
	tr := c.Transport.(*http.Transport)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr.DialContext = d.DialContext
	return c
}

// getSeen makes a GET with the given headers and decodes what the backend saw.
func getSeen(t *testing.T, c *http.Client, url string, hdr map[string]string) (int, seen, error) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, seen{}, err
	}
	defer resp.Body.Close()
	var sn seen
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(body, &sn); err != nil {
			return resp.StatusCode, sn, fmt.Errorf("backend answer %q: %v", body, err)
		}
	}
	return resp.StatusCode, sn, nil
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

// handshakeFrom connects to addr from the local address ip, sends prefix (a PROXY
// header), then runs a TLS handshake for site.test. It returns the connection when
// the handshake succeeded, and how many bytes the server sent. A server that resets
// the connection at once may do so before the dial returns.
func handshakeFrom(s *site, addr, ip string, prefix []byte) (*tls.Conn, int, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
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
	tc := tls.Client(cc, &tls.Config{RootCAs: s.pool(), ServerName: "site.test", NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, cc.n, err
	}
	_ = cc.SetDeadline(time.Time{})
	return tc, cc.n, nil
}

// refusedBeforeHandshake reports whether a connection from ip is closed without the
// server sending a byte: no ServerHello, no TLS work.
func refusedBeforeHandshake(t *testing.T, s *site, addr, ip string, prefix []byte) bool {
	t.Helper()
	tc, n, err := handshakeFrom(s, addr, ip, prefix)
	if err == nil {
		tc.Close()
		return false
	}
	if n != 0 {
		t.Errorf("from %s: the server sent %d bytes before closing: %v", ip, n, err)
		return false
	}
	return true
}

// quicFrom dials QUIC (HTTP/3 ALPN) to addr from the local address ip.
func quicFrom(s *site, addr, ip string) error {
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		return err
	}
	tr := &quic.Transport{Conn: udp}
	defer tr.Close()
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := tr.Dial(ctx, raddr, &tls.Config{RootCAs: s.pool(), ServerName: "site.test", NextProtos: []string{http3.NextProtoH3}}, nil)
	if err == nil {
		c.CloseWithError(0, "")
	}
	return err
}

func writeList(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestL7dBlacklistPacketBeforeHandshake: a blacklisted source address is dropped
// at accept, TCP and QUIC alike, before any TLS work, and counted.
func TestL7dBlacklistPacketBeforeHandshake(t *testing.T) {
	backend := newNamedBackend(t, "a")
	s := newSite(t)
	list := writeList(t, t.TempDir(), "global.txt", "# test list\n127.0.0.2\n198.51.100.0/24\n")
	l7 := newL7d(t, `
listeners: [{name: public, addr: "%[1]s", pool: web}]
backends: {web: {members: ["`+backend.addr+`"]}}
blacklists: {global: {files: ["`+list+`"]}}
admin_listen: "%[2]s"
`+siteCert(t, s))

	if !refusedBeforeHandshake(t, s, l7.addr, "127.0.0.2", nil) {
		t.Errorf("TCP from a blacklisted address got through")
	}
	var te *quic.TransportError
	if err := quicFrom(s, l7.addr, "127.0.0.2"); !errors.As(err, &te) || te.ErrorCode != quic.ConnectionRefused {
		t.Errorf("QUIC from a blacklisted address: %v, want CONNECTION_REFUSED", err)
	}
	if got := l7.metric("tiergate_blacklist_hits_total", `list="global"`, `source="packet"`); got < 2 {
		t.Errorf("packet hits counted: %v, want at least 2 (TCP and QUIC)", got)
	}
	if got := l7.metric("tiergate_l7_connections_rejected_total", `reason="filtered"`); got < 2 {
		t.Errorf("filtered connections counted: %v, want at least 2", got)
	}
	if got := l7.metric("tiergate_tls_handshakes_total"); got != 0 {
		t.Errorf("%v handshakes counted for refused connections", got)
	}
	// Another local address is served, over TCP and QUIC.
	if code, sn, err := getSeen(t, clientFrom(s, "127.0.0.3", "h2"), "https://"+l7.addr+"/ok", nil); err != nil || code != 200 || sn.XRealIP != "127.0.0.3" {
		t.Errorf("from 127.0.0.3: %d %+v %v", code, sn, err)
	}
	if err := quicFrom(s, l7.addr, "127.0.0.3"); err != nil {
		t.Errorf("QUIC from 127.0.0.3: %v", err)
	}
}

// TestL7dClientIPAndHeaderBlacklist: X-Forwarded-For is believed from a trusted
// peer only; the client it names is checked against the blacklists per request,
// with each list's action; an untrusted peer's spoofed header changes nothing.
func TestL7dClientIPAndHeaderBlacklist(t *testing.T) {
	backend := newNamedBackend(t, "a")
	s := newSite(t)
	dir := t.TempDir()
	global := writeList(t, dir, "global.txt", "203.0.113.9\n")
	local := writeList(t, dir, "public.txt", "203.0.113.10\n")
	l7 := newL7d(t, `
listeners:
  - name: public
    addr: "%[1]s"
    pool: web
    client_ip: {trusted_proxies: ["127.0.0.1/32"]}
backends: {web: {members: ["`+backend.addr+`"]}}
blacklists:
  global: {files: ["`+global+`"]}
  public: {files: ["`+local+`"], action: close}
admin_listen: "%[2]s"
`+siteCert(t, s))
	url := "https://" + l7.addr + "/x"

	for _, proto := range []string{"h1", "h2"} {
		trusted := clientFrom(s, "127.0.0.1", proto)
		code, sn, err := getSeen(t, trusted, url, map[string]string{"X-Forwarded-For": "198.51.100.1"})
		if err != nil || code != 200 || sn.XRealIP != "198.51.100.1" || sn.XFF != "198.51.100.1, 127.0.0.1" {
			t.Errorf("%s trusted peer: %d %+v %v", proto, code, sn, err)
		}
		if code, _, err := getSeen(t, trusted, url, map[string]string{"X-Forwarded-For": "203.0.113.9"}); err != nil || code != 403 {
			t.Errorf("%s trusted peer, blacklisted client: %d %v, want 403", proto, code, err)
		}
		// The trusted peer's connection serves its other clients after a 403.
		if code, _, err := getSeen(t, trusted, url, map[string]string{"X-Forwarded-For": "198.51.100.2"}); err != nil || code != 200 {
			t.Errorf("%s after a 403: %d %v", proto, code, err)
		}
		// A spoofed header from an untrusted peer is ignored and replaced.
		untrusted := clientFrom(s, "127.0.0.3", proto)
		code, sn, err = getSeen(t, untrusted, url, map[string]string{"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.9"})
		if err != nil || code != 200 || sn.XRealIP != "127.0.0.3" || sn.XFF != "127.0.0.3" {
			t.Errorf("%s untrusted peer's XFF: %d %+v %v, want it ignored", proto, code, sn, err)
		}
	}
	if got := l7.metric("tiergate_blacklist_hits_total", `list="global"`, `source="header"`); got != 2 {
		t.Errorf("header hits on the global list: %v, want 2", got)
	}

	// The listener's list closes: HTTP/1.1 gets no answer, HTTP/2 a reset stream.
	for _, proto := range []string{"h1", "h2"} {
		c := clientFrom(s, "127.0.0.1", proto)
		if code, _, err := getSeen(t, c, url, map[string]string{"X-Forwarded-For": "203.0.113.10"}); err == nil {
			t.Errorf("%s client on a close list answered %d", proto, code)
		}
		c.CloseIdleConnections()
	}
	if got := l7.metric("tiergate_blacklist_hits_total", `list="public"`, `source="header"`); got < 2 {
		t.Errorf("header hits on the listener's list: %v, want at least 2", got)
	}
	if got := l7.metric("tiergate_http_requests_total", `code="closed"`); got < 2 {
		t.Errorf("closed requests counted: %v", got)
	}
}

// TestL7dProxyProtocol: a PROXY v2 header is refused from an untrusted peer and
// believed from a trusted one; its source is the client, blacklisted or not.
func TestL7dProxyProtocol(t *testing.T) {
	backend := newNamedBackend(t, "a")
	s := newSite(t)
	list := writeList(t, t.TempDir(), "global.txt", "198.51.100.66\n")
	l7 := newL7d(t, `
listeners:
  - name: public
    addr: "%[1]s"
    pool: web
    disable_http3: true
    client_ip: {proxy_protocol: true, proxy_trusted: ["127.0.0.1"], proxy_timeout: 2s}
backends: {web: {members: ["`+backend.addr+`"]}}
blacklists: {global: {files: ["`+list+`"]}}
admin_listen: "%[2]s"
`+siteCert(t, s))
	frame := func(src string) []byte {
		h := clientip.ProxyHeader{Version: 2, Command: clientip.CommandProxy,
			Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort("203.0.113.1:443")}
		b, err := h.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	tc, _, err := handshakeFrom(s, l7.addr, "127.0.0.1", frame("192.0.2.9:40000"))
	if err != nil {
		t.Fatalf("PROXY v2 from a trusted peer, then TLS: %v\n%s", err, l7.logTail())
	}
	io.WriteString(tc, "GET /proxied HTTP/1.1\r\nHost: site.test\r\nX-Forwarded-For: 203.0.113.50\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	var sn seen
	json.NewDecoder(resp.Body).Decode(&sn)
	resp.Body.Close()
	tc.Close()
	if resp.StatusCode != 200 || sn.XRealIP != "192.0.2.9" || sn.XFF != "192.0.2.9" {
		t.Errorf("trusted PROXY peer: %d, backend saw %+v; want the PROXY source as the client", resp.StatusCode, sn)
	}

	if !refusedBeforeHandshake(t, s, l7.addr, "127.0.0.4", frame("192.0.2.9:40000")) {
		t.Errorf("PROXY header from an untrusted peer was accepted")
	}
	if !refusedBeforeHandshake(t, s, l7.addr, "127.0.0.1", nil) {
		t.Errorf("a trusted peer without a PROXY header was accepted")
	}
	if !refusedBeforeHandshake(t, s, l7.addr, "127.0.0.1", frame("198.51.100.66:1234")) {
		t.Errorf("a blacklisted PROXY source was accepted")
	}
	waitFor(t, 5*time.Second, "rejections counted", func() bool {
		return l7.metric("tiergate_clientip_proxy_rejected_total", `reason="untrusted"`) == 1 &&
			l7.metric("tiergate_clientip_proxy_rejected_total", `reason="not_proxy"`)+
				l7.metric("tiergate_clientip_proxy_rejected_total", `reason="timeout"`) == 1
	})
	if got := l7.metric("tiergate_blacklist_hits_total", `list="global"`, `source="packet"`); got != 1 {
		t.Errorf("packet hits for the PROXY source: %v, want 1", got)
	}
}

// TestL7dHealthCheckEjectionAndReturn: a member whose health check fails gets no
// traffic until it passes again.
func TestL7dHealthCheckEjectionAndReturn(t *testing.T) {
	a, b := newNamedBackend(t, "a"), newNamedBackend(t, "b")
	s := newSite(t)
	l7 := newL7d(t, `
listeners: [{name: public, addr: "%[1]s"}]
routing:
  pools:
    - name: web
      members: [{addr: "`+a.addr+`"}, {addr: "`+b.addr+`"}]
      health_check: {path: /healthz, interval: 100ms, timeout: 100ms, unhealthy_threshold: 2, healthy_threshold: 2}
  listeners:
    - name: public
      vhosts: [{names: ["*"], routes: [{name: all, action: {pool: web}}]}]
admin_listen: "%[2]s"
`+siteCert(t, s))
	c := httpsClient(s, "h2")
	spread := func() (int64, int64) {
		a0, b0 := a.hits.Load(), b.hits.Load()
		for i := range 20 {
			if code, _, err := getSeen(t, c, "https://"+l7.addr+"/x", nil); err != nil || code != 200 {
				t.Fatalf("request %d: %d %v", i, code, err)
			}
		}
		return a.hits.Load() - a0, b.hits.Load() - b0
	}
	healthy := func(addr string) float64 {
		return l7.metric("tiergate_pool_member_healthy", `member="`+addr+`"`)
	}

	if ha, hb := spread(); ha == 0 || hb == 0 {
		t.Errorf("both healthy: a got %d, b got %d", ha, hb)
	}
	a.health.Store(500)
	waitFor(t, 5*time.Second, "a down", func() bool { return healthy(a.addr) == 0 })
	if ha, hb := spread(); ha != 0 || hb != 20 {
		t.Errorf("a down: a got %d, b got %d", ha, hb)
	}
	a.health.Store(200)
	waitFor(t, 5*time.Second, "a back", func() bool { return healthy(a.addr) == 1 })
	if ha, hb := spread(); ha == 0 || hb == 0 {
		t.Errorf("a back: a got %d, b got %d", ha, hb)
	}
	if got := l7.metric("tiergate_pool_health_transitions_total", `pool="web"`); got != 2 {
		t.Errorf("health transitions: %v, want 2 (down, up)", got)
	}
}

// TestL7dRetriesAndRateLimit: a member that refuses connections costs a retry, not
// a failed request; a rate-limited route answers 429 past its burst.
func TestL7dRetriesAndRateLimit(t *testing.T) {
	live := newNamedBackend(t, "live")
	dead := freePort(t) // nothing listens there
	s := newSite(t)
	l7 := newL7d(t, `
listeners: [{name: public, addr: "%[1]s"}]
routing:
  pools:
    - {name: flaky, members: [{addr: "`+dead+`"}, {addr: "`+live.addr+`"}]}
    - {name: live, members: [{addr: "`+live.addr+`"}]}
  listeners:
    - name: public
      vhosts:
        - names: ["*"]
          routes:
            - {name: retried, match: {path_prefix: /retry}, action: {pool: flaky}, retries: 1}
            - {name: limited, match: {path: /limited}, action: {pool: live}, rate_limit: {per_second: 0.1, burst: 3}}
admin_listen: "%[2]s"
`+siteCert(t, s))
	c := httpsClient(s, "h1")
	for i := range 10 {
		if code, sn, err := getSeen(t, c, "https://"+l7.addr+"/retry", nil); err != nil || code != 200 || sn.Backend != "live" {
			t.Errorf("retried request %d: %d %+v %v", i, code, sn, err)
		}
	}
	if got := l7.metric("tiergate_l7_backend_errors_total", `pool="flaky"`, `reason="connect"`); got == 0 {
		t.Errorf("no connection failure counted: the dead member was never picked?")
	}
	var codes []int
	for range 5 {
		code, _, err := getSeen(t, c, "https://"+l7.addr+"/limited", nil)
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 200 200 429 429]" {
		t.Errorf("rate-limited route: %v, want [200 200 200 429 429]", codes)
	}
	if got := l7.metric("tiergate_http_requests_total", `route="limited"`, `code="429"`); got != 2 {
		t.Errorf("429s counted under the route: %v", got)
	}
	if code, _, _ := getSeen(t, c, "https://"+l7.addr+"/nowhere", nil); code != 404 {
		t.Errorf("no route: %d, want 404", code)
	}
}

// TestL7dBlacklistPush: lists pushed through the admin API take effect at once,
// survive reloads, and a bad push changes nothing.
func TestL7dBlacklistPush(t *testing.T) {
	backend := newNamedBackend(t, "a")
	s := newSite(t)
	l7 := newL7d(t, `
listeners: [{name: public, addr: "%[1]s", pool: web, client_ip: {trusted_proxies: ["127.0.0.1"]}}]
backends: {web: {members: ["`+backend.addr+`"]}}
admin_listen: "%[2]s"
`+siteCert(t, s))
	push := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		return adminCall(t, l7.admin, method, path, body, l7.token())
	}
	served := func(ip string) bool {
		t.Helper()
		tc, n, err := handshakeFrom(s, l7.addr, ip, nil)
		if err != nil {
			if n != 0 {
				t.Errorf("from %s: refused after %d bytes", ip, n)
			}
			return false
		}
		tc.Close()
		return true
	}

	if !served("127.0.0.5") || !served("127.0.0.6") {
		t.Fatal("not served before any push")
	}
	if code, out := push("PUT", "/blacklists/global", "127.0.0.5\n"); code != 200 || out["entries"] != 1.0 {
		t.Fatalf("PUT: %d %v", code, out)
	}
	if served("127.0.0.5") || !served("127.0.0.6") {
		t.Errorf("after the push: 127.0.0.5 must be refused, 127.0.0.6 served")
	}
	code, out := push("PUT", "/blacklists/global", "127.0.0.6\nnot-an-address\n127.0.0.0/33\n")
	lines, _ := out["lines"].([]any)
	if code != 422 || len(lines) != 2 || lines[0].(map[string]any)["line"] != 2.0 || lines[1].(map[string]any)["line"] != 3.0 {
		t.Errorf("bad push: %d %v, want 422 naming lines 2 and 3", code, out)
	}
	if served("127.0.0.5") || !served("127.0.0.6") {
		t.Errorf("a rejected push changed the list")
	}
	if code, out := push("POST", "/blacklists/global/delta", "-127.0.0.5\n+127.0.0.6\n+203.0.113.9 ttl=1h\n"); code != 200 || out["entries"] != 2.0 {
		t.Errorf("delta: %d %v", code, out)
	}
	if !served("127.0.0.5") || served("127.0.0.6") {
		t.Errorf("after the delta: 127.0.0.5 must be served, 127.0.0.6 refused")
	}
	// A per-request check on an open connection: the header's client pushed to the
	// listener's list.
	c := clientFrom(s, "127.0.0.1", "h2")
	if code, _, err := getSeen(t, c, "https://"+l7.addr+"/", map[string]string{"X-Forwarded-For": "198.51.100.8"}); err != nil || code != 200 {
		t.Fatalf("before the listener push: %d %v", code, err)
	}
	if code, out := push("PUT", "/blacklists/public", "198.51.100.0/24\n"); code != 200 || out["list"] != "public" {
		t.Errorf("PUT listener list: %d %v", code, out)
	}
	if code, _, err := getSeen(t, c, "https://"+l7.addr+"/", map[string]string{"X-Forwarded-For": "198.51.100.8"}); err != nil || code != 403 {
		t.Errorf("after the listener push, same connection: %d %v, want 403", code, err)
	}
	if code, out := push("PUT", "/blacklists/nosuch", "192.0.2.1\n"); code != 404 || out["code"] != "unknown_list" {
		t.Errorf("unknown list: %d %v", code, out)
	}

	// A reload keeps what was pushed (the lists have no files).
	l7.signal(syscall.SIGHUP)
	waitFor(t, 5*time.Second, "reload", func() bool { return l7.metric("tiergate_l7_reloads_total", `result="ok"`) >= 1 })
	if !served("127.0.0.5") || served("127.0.0.6") {
		t.Errorf("after a reload the pushed list changed")
	}
	if got := l7.metric("tiergate_blacklist_hits_total", `list="global"`, `source="packet"`); got < 4 {
		t.Errorf("packet hits: %v", got)
	}
}

// TestL7dReloadRoutingUnderLoad: routing changes and refused reloads while clients
// run: no request fails, and the new routes take traffic.
func TestL7dReloadRoutingUnderLoad(t *testing.T) {
	a, b := newNamedBackend(t, "a"), newNamedBackend(t, "b")
	s := newSite(t)
	dir := t.TempDir()
	goodList := writeList(t, dir, "good.txt", "192.0.2.200\n")
	badList := writeList(t, dir, "bad.txt", "192.0.2.200\nbogus\n")
	certs := siteCert(t, s)
	cfg := func(routing, list string) string {
		return `
listeners: [{name: public, addr: "%[1]s"}]
blacklists: {global: {files: ["` + list + `"]}}
admin_listen: "%[2]s"
` + certs + routing
	}
	before := `
routing:
  pools: [{name: p, members: [{addr: "` + a.addr + `"}]}]
  listeners: [{name: public, vhosts: [{names: ["*"], routes: [{name: all, action: {pool: p}}]}]}]
`
	after := `
routing:
  pools:
    - {name: p, members: [{addr: "` + a.addr + `"}, {addr: "` + b.addr + `", weight: 3}], balance: least_request}
    - {name: q, members: [{addr: "` + b.addr + `"}]}
  listeners:
    - name: public
      vhosts:
        - names: ["*"]
          routes:
            - {name: b-only, match: {path_prefix: /b/}, action: {pool: q}, retries: 1}
            - {name: all, action: {pool: p}}
`
	l7 := newL7d(t, cfg(before, goodList))

	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			c := httpsClient(s, []string{"h1", "h2"}[w%2])
			for i := 0; i < 3000 && time.Now().Before(stop); i++ {
				if i%20 == 0 {
					c.CloseIdleConnections()
				}
				path := "/x"
				if i%2 == 1 {
					path = "/b/y"
				}
				code, _, err := getSeen(t, c, "https://"+l7.addr+path, nil)
				if err == nil && code != 200 {
					err = fmt.Errorf("%s: status %d", path, code)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
			}
		})
	}
	time.Sleep(time.Second)
	if b.hits.Load() != 0 {
		t.Errorf("b served before the reload")
	}
	l7.writeConfig(cfg(after, goodList))
	l7.signal(syscall.SIGHUP)
	waitFor(t, 5*time.Second, "reload", func() bool { return l7.metric("tiergate_l7_reloads_total", `result="ok"`) >= 1 })
	time.Sleep(500 * time.Millisecond)

	// Refused reloads: a route to a pool that does not exist, a bad blacklist file.
	for _, bad := range []string{
		cfg(strings.Replace(after, "{pool: q}", "{pool: nope}", 1), goodList),
		cfg(before, badList),
	} {
		l7.writeConfig(bad)
		resp, err := l7.post("/reload")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnprocessableEntity {
			t.Errorf("bad reload answered %d %s, want 422", resp.StatusCode, body)
		}
	}
	wg.Wait()
	t.Logf("%d requests, %d failed (first: %v); a %d, b %d", ok.Load(), failed.Load(), firstErr.Load(), a.hits.Load(), b.hits.Load())
	if failed.Load() != 0 || ok.Load() < 100 {
		t.Errorf("%d requests failed of %d during reloads: %v\n%s", failed.Load(), ok.Load()+failed.Load(), firstErr.Load(), l7.logTail())
	}
	if b.hits.Load() == 0 {
		t.Errorf("the reloaded routing sent nothing to b")
	}
	if got := l7.metric("tiergate_http_requests_total", `route="b-only"`, `code="200"`); got == 0 {
		t.Errorf("no request counted under the new route")
	}
	if got := l7.metric("tiergate_l7_reloads_total", `result="error"`); got != 2 {
		t.Errorf("refused reloads counted: %v, want 2", got)
	}
}

// TestL7dBlacklistPushSurvivesRestart: with state_dir, what is pushed through the
// admin API (whole lists and deltas) is still in force after l7d is stopped with
// SIGTERM, or killed, and started again; the configured file is not read while the
// list has pushed state, and dropping that state goes back to it. The admin API
// wants its bearer token.
func TestL7dBlacklistPushSurvivesRestart(t *testing.T) {
	backend := newNamedBackend(t, "a")
	s := newSite(t)
	dir := t.TempDir()
	list := writeList(t, dir, "global.txt", "127.0.0.7\n")
	const token = "integration-admin-token-0123456789"
	tokenFile := writeList(t, dir, "admin.token", token+"\n")
	stateDir := filepath.Join(dir, "state")
	l7 := newL7d(t, `
listeners: [{name: public, addr: "%[1]s", pool: web}]
backends: {web: {members: ["`+backend.addr+`"]}}
blacklists: {global: {files: ["`+list+`"]}}
state_dir: "`+stateDir+`"
admin_token_file: "`+tokenFile+`"
admin_listen: "%[2]s"
`+siteCert(t, s))
	admin := func(method, path, body, tok string) (int, map[string]any) {
		t.Helper()
		return adminCall(t, l7.admin, method, path, body, tok)
	}
	// refused reports, for each address, whether a connection from it is refused
	// before its handshake.
	refused := func(ips ...string) string {
		t.Helper()
		var b strings.Builder
		for _, ip := range ips {
			fmt.Fprintf(&b, "%s:%v ", ip, refusedBeforeHandshake(t, s, l7.addr, ip, nil))
		}
		return strings.TrimSpace(b.String())
	}

	if got, want := refused("127.0.0.5", "127.0.0.7"), "127.0.0.5:false 127.0.0.7:true"; got != want {
		t.Fatalf("from the file: %s, want %s", got, want)
	}
	if code, out := admin("PUT", "/blacklists/global", "127.0.0.5\n", ""); code != 401 || out["code"] != "unauthorized" {
		t.Errorf("PUT without the token: %d %v", code, out)
	}
	if code, out := admin("PUT", "/blacklists/global", "127.0.0.5\n", "wrong-token"); code != 401 {
		t.Errorf("PUT with a wrong token: %d %v", code, out)
	}
	if got, want := refused("127.0.0.5"), "127.0.0.5:false"; got != want {
		t.Errorf("a refused PUT changed the list: %s", got)
	}
	if code, out := admin("PUT", "/blacklists/global", "127.0.0.5\n", token); code != 200 || out["entries"] != 1.0 {
		t.Fatalf("PUT: %d %v", code, out)
	}
	if code, out := admin("POST", "/blacklists/global/delta", "+127.0.0.6 ttl=1h\n", token); code != 200 || out["entries"] != 2.0 {
		t.Fatalf("delta: %d %v", code, out)
	}
	want := "127.0.0.5:true 127.0.0.6:true 127.0.0.7:false 127.0.0.8:false"
	if got := refused("127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8"); got != want {
		t.Fatalf("after the pushes: %s, want %s", got, want)
	}

	// SIGTERM, then a new process: the pushed list, not the file.
	l7.stop()
	l7.start()
	if got := refused("127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8"); got != want {
		t.Errorf("after a restart: %s, want %s\n%s", got, want, l7.logTail())
	}
	if !strings.Contains(l7.logTail(), "blacklist loaded from its pushed state") {
		t.Errorf("the log does not say where the list came from\n%s", l7.logTail())
	}
	if code, out := admin("GET", "/blacklists/global", "", token); code != 200 || out["state_file"] != filepath.Join(stateDir, "blacklist-global.bin") {
		t.Errorf("GET after a restart: %d %v", code, out)
	}

	// A push answered 200 is on disk: it survives a kill.
	if code, _ := admin("POST", "/blacklists/global/delta", "+127.0.0.8\n", token); code != 200 {
		t.Fatalf("delta: %d", code)
	}
	l7.kill()
	l7.start()
	want = "127.0.0.5:true 127.0.0.6:true 127.0.0.7:false 127.0.0.8:true"
	if got := refused("127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8"); got != want {
		t.Errorf("after a kill: %s, want %s", got, want)
	}

	// Dropping the pushed state: the file again, now and after a restart.
	if code, out := admin("DELETE", "/blacklists/global/state", "", token); code != 200 || out["entries"] != 1.0 {
		t.Errorf("DELETE state: %d %v", code, out)
	}
	want = "127.0.0.5:false 127.0.0.7:true 127.0.0.8:false"
	if got := refused("127.0.0.5", "127.0.0.7", "127.0.0.8"); got != want {
		t.Errorf("after DELETE state: %s, want %s", got, want)
	}
	l7.stop()
	l7.start()
	if got := refused("127.0.0.5", "127.0.0.7", "127.0.0.8"); got != want {
		t.Errorf("after DELETE state and a restart: %s, want %s", got, want)
	}
}

// adminCall sends body to an l7d admin endpoint (with a bearer token unless tok is
// empty) and returns the status and the decoded JSON answer.
func adminCall(t *testing.T, admin, method, path, body, tok string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+admin+path, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}
