package l7

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/policy/route"
)

// screenRouting routes /admin to a 403 and /public/ to backend b, on listener "web"
// with the given path mode and strict_sni.
func screenRouting(b *backend, mode string, strict bool) *route.Config {
	return &route.Config{
		Pools: []route.Pool{{Name: "pb", Members: []route.PoolMember{{Addr: b.addr}}}},
		Listeners: []route.Listener{{Name: "web", PathMode: mode, StrictSNI: strict, VHosts: []route.VHost{{
			Names: []string{"*"},
			Routes: []route.Route{
				{Name: "admin", Match: route.Match{PathPrefix: "/admin"},
					Action: route.Action{Respond: &route.Respond{Status: 403, Body: "no\n"}}},
				{Name: "public", Match: route.Match{PathPrefix: "/public/"}, Action: route.Action{Pool: "pb"}},
			},
		}}}},
	}
}

// rawPathRequest sends target as the request's path over proto (as written, not
// cleaned by the client) and returns the status and body.
func rawPathRequest(t *testing.T, ts *testServer, cl *http.Client, target string) (int, []byte) {
	t.Helper()
	req := &http.Request{Method: "GET", Header: http.Header{}, Host: ts.addr,
		URL: &url.URL{Scheme: "https", Host: ts.addr, Opaque: target}}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// TestPathModes: a path a backend could resolve to another one than routes matched
// (Tomcat takes "/public/..;/admin", IIS "/public/..%5cadmin", for "/admin") is
// refused with 400 by default, reaches routing and the backend normalised with
// forward_normalized, and as sent with forward_raw (as before); an ordinary path
// with a query string reaches the backend unchanged in every mode, over HTTP/1.1,
// HTTP/2 and HTTP/3.
func TestPathModes(t *testing.T) {
	b := startBackend(t, "b")
	type answer struct {
		status int
		uri    string // what the backend got, when it answered
	}
	admin := answer{403, ""}
	refused := answer{400, ""}
	tests := []struct {
		target                  string
		reject, normalized, raw answer
	}{
		{"/public/..;/admin", refused, admin, answer{200, "/public/..;/admin"}},
		{"/public/..;jsessionid=1/admin", refused, admin, answer{200, "/public/..;jsessionid=1/admin"}},
		{"/public/.;/x", refused, answer{200, "/public/x"}, answer{200, "/public/.;/x"}},
		{"/public/..%5cadmin", refused, admin, answer{200, "/public/..%5cadmin"}},
		{"/public/..%5Cadmin", refused, admin, answer{200, "/public/..%5Cadmin"}},
		{"/public/..\\admin", refused, admin, answer{200, "/public/..\\admin"}},
		{"/public/%2e%2e/admin", refused, admin, answer{403, ""}},
		{"/public/.%2E/admin", refused, admin, answer{403, ""}},
		{"/public/..%2fadmin", refused, admin, answer{403, ""}},
		{"/public/x%2Fy", refused, answer{200, "/public/x/y"}, answer{200, "/public/x%2Fy"}},
		{"/public//x", refused, answer{200, "/public/x"}, answer{200, "/public//x"}},
		{"/public/./x?q=..;/%2e", refused, answer{200, "/public/x?q=..;/%2e"}, answer{200, "/public/./x?q=..;/%2e"}},
		{"/public/x%00.html", refused, refused, answer{200, "/public/x%00.html"}},
		{"/public/%252e%252e/admin", refused, refused, answer{200, "/public/%252e%252e/admin"}},
		{"/public/.../x", refused, refused, answer{200, "/public/.../x"}},
		{"/public/a%20b/c.html?x=1&y=%2F..&z=..;", answer{200, "/public/a%20b/c.html?x=1&y=%2F..&z=..;"},
			answer{200, "/public/a%20b/c.html?x=1&y=%2F..&z=..;"}, answer{200, "/public/a%20b/c.html?x=1&y=%2F..&z=..;"}},
	}
	for _, mode := range []string{"", route.PathForwardNormalized, route.PathForwardRaw} {
		ts := startServer(t, routingConfig(t, screenRouting(b, mode, false)))
		for _, proto := range []string{"1.1", "2", "3"} {
			cl := ts.client(t, proto)
			for _, tt := range tests {
				want := tt.reject
				switch mode {
				case route.PathForwardNormalized:
					want = tt.normalized
				case route.PathForwardRaw:
					want = tt.raw
				}
				status, body := rawPathRequest(t, ts, cl, tt.target)
				if status == 200 {
					if e := decodeEcho(t, body); status != want.status || e.URI != want.uri {
						t.Errorf("mode %q, HTTP/%s %s: the backend got %q; want %d %q", mode, proto, tt.target, e.URI, want.status, want.uri)
					}
					continue
				}
				if status != want.status {
					t.Errorf("mode %q, HTTP/%s %s: %d %q; want %d %q", mode, proto, tt.target, status, body, want.status, want.uri)
				}
			}
		}
	}
}

// TestStrictSNI: with strict_sni, a request whose Host is not the TLS server name
// of its connection is answered 421 on HTTP/1.1, HTTP/2 and HTTP/3, and so is one on
// a connection made without a server name; without it (the default), Host alone
// chooses, as before.
func TestStrictSNI(t *testing.T) {
	b := startBackend(t, "b")
	for _, strict := range []bool{false, true} {
		ts := startServer(t, routingConfig(t, screenRouting(b, "", strict)))
		for _, proto := range []string{"1.1", "2", "3"} {
			for _, tt := range []struct {
				sni, host string
				strict    int // the answer with strict_sni
			}{
				{"localhost", "localhost", 200},
				{"localhost", "LOCALHOST.:" + strconv.Itoa(ts.port), 200},
				{"localhost", "other.example", 421},
				{"other.example", "localhost", 421},
				{"", "localhost", 421},
			} {
				want := 200
				if strict {
					want = tt.strict
				}
				cfg := ts.clientTLS()
				cfg.ServerName = tt.sni
				if tt.sni != "localhost" {
					cfg.InsecureSkipVerify = true // the certificate is for localhost
				}
				cl := sniClient(t, proto, cfg)
				req, _ := http.NewRequest("GET", ts.url("/public/x"), nil)
				req.Host = tt.host
				resp, err := cl.Do(req)
				if err != nil {
					t.Fatalf("HTTP/%s SNI %q Host %q: %v", proto, tt.sni, tt.host, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("strict_sni %v, HTTP/%s, SNI %q, Host %q: %d %q; want %d", strict, proto, tt.sni, tt.host, resp.StatusCode, body, want)
				}
			}
		}
	}
}

// sniClient is ts.client with the TLS configuration cfg (its ServerName is the SNI
// sent; empty, none).
func sniClient(t *testing.T, proto string, cfg *tls.Config) *http.Client {
	t.Helper()
	var rt http.RoundTripper
	switch proto {
	case "1.1", "2":
		tr := &http.Transport{TLSClientConfig: cfg}
		tr.Protocols = new(http.Protocols)
		if proto == "2" {
			tr.Protocols.SetHTTP2(true)
		} else {
			tr.Protocols.SetHTTP1(true)
		}
		t.Cleanup(tr.CloseIdleConnections)
		rt = tr
	case "3":
		tr := &http3.Transport{TLSClientConfig: cfg}
		t.Cleanup(func() { tr.Close() })
		rt = tr
	}
	return &http.Client{Transport: rt}
}
