package l7

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

func FuzzListElements(f *testing.F) {
	for _, s := range []string{"close", "keep-alive, Upgrade", " , ,X-Foo\t,\tbar ", "", ",,,", "a,b,c", "\t", "x\x00y, z"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		var got []string
		listElements(v, func(tok []byte) { got = append(got, string(tok)) })
		var want []string
		for p := range strings.SplitSeq(string(v), ",") {
			if p = strings.Trim(p, " \t"); p != "" {
				want = append(want, p)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("listElements(%q) = %q, want %q", v, got, want)
		}
	})
}

var (
	fuzzClient = netip.MustParseAddr("192.0.2.7")
	fuzzPeer   = netip.MustParseAddr("198.51.100.1")
)

// checkForwarded writes req as it goes to a backend, parses it back, and checks that
// it is exactly one request, with the method and body it had and the forwarding
// headers set, and without hop-by-hop headers.
func checkForwarded(t *testing.T, req *fasthttp.Request, trusted bool, priorXFF string, named [][]byte) {
	t.Helper()
	method := string(req.Header.Method())
	body := string(req.Body())

	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	if err := req.Write(w); err != nil {
		t.Fatalf("writing the forwarded request: %v", err)
	}
	w.Flush()
	wire := buf.String()

	out := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(out)
	br := bufio.NewReader(&buf)
	if err := out.Read(br); err != nil {
		t.Fatalf("the forwarded request does not parse: %v\n%q", err, wire)
	}
	if n := br.Buffered(); n > 0 {
		t.Fatalf("%d bytes follow the forwarded request (smuggled):\n%q", n, wire)
	}
	if got := string(out.Header.Method()); got != method {
		t.Fatalf("method %q became %q:\n%q", method, got, wire)
	}
	if got := string(out.Body()); got != body {
		t.Fatalf("body %q became %q:\n%q", body, got, wire)
	}
	if v := out.Header.PeekAll("X-Real-IP"); len(v) != 1 || string(v[0]) != fuzzClient.String() {
		t.Fatalf("X-Real-IP %q:\n%q", v, wire)
	}
	if v := out.Header.PeekAll("X-Forwarded-Proto"); len(v) != 1 || string(v[0]) != "https" {
		t.Fatalf("X-Forwarded-Proto %q:\n%q", v, wire)
	}
	xff := out.Header.PeekAll("X-Forwarded-For")
	wantXFF := fuzzClient.String()
	if trusted {
		wantXFF = fuzzPeer.String()
		if priorXFF != "" {
			wantXFF = priorXFF + ", " + wantXFF
		}
	}
	if len(xff) != 1 || string(xff[0]) != wantXFF {
		t.Fatalf("X-Forwarded-For %q, want %q:\n%q", xff, wantXFF, wire)
	}
	for _, h := range hopHeaders {
		if h == "Connection" {
			continue // fasthttp may add "Connection: close" of its own
		}
		if v := out.Header.Peek(h); v != nil {
			t.Fatalf("hop-by-hop header %s: %q forwarded:\n%q", h, v, wire)
		}
	}
	for _, n := range named {
		if !isProtected(n) && out.Header.PeekBytes(n) != nil {
			t.Fatalf("header %q, named by Connection, forwarded:\n%q", n, wire)
		}
	}
}

func priorXFF(h *fasthttp.RequestHeader) string {
	var parts []string
	for _, v := range h.PeekAll("X-Forwarded-For") {
		for e := range strings.SplitSeq(string(v), ",") {
			if e = strings.Trim(e, " \t"); e != "" {
				parts = append(parts, e)
			}
		}
	}
	return strings.Join(parts, ", ")
}

// FuzzUpstreamRequest feeds HTTP/1.1 requests, as fasthttp parses them from clients,
// through prepareUpstream.
func FuzzUpstreamRequest(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /p?q HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: X-A, keep-alive\r\nX-A: 1\r\nKeep-Alive: 5\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: Host, Content-Length\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8, 9.9.9.9\r\nX-Real-IP: 6.6.6.6\r\n\r\n",
		"GET https://evil.test/x HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
		"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nTe: trailers\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic x\r\n\r\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, trusted bool) {
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		br := bufio.NewReader(bytes.NewReader(raw))
		if err := req.Read(br); err != nil {
			return
		}
		if req.MayContinue() {
			if err := req.ContinueReadBody(br, 0); err != nil {
				return
			}
		}
		if bytes.HasPrefix(bytes.ToLower(req.Header.ContentType()), []byte("multipart/")) {
			return // the server does not pre-parse forms; Read here would
		}
		var named [][]byte
		for _, v := range req.Header.PeekAll("Connection") {
			listElements(v, func(tok []byte) { named = append(named, bytes.Clone(tok)) })
		}
		prior := priorXFF(&req.Header)
		if !prepareUpstream(req, &Decision{ClientIP: fuzzClient, TrustedPeer: trusted}, fuzzPeer, "sni.test") {
			return
		}
		checkForwarded(t, req, trusted, prior, named)
	})
}

// fuzzListener is what bodyFrom needs of a listener.
var fuzzListener = &listener{
	cfg: ListenerConfig{Listener: Listener{MaxRequestBody: 1 << 16}},
	s:   &Server{bodies: &bodyBudget{max: 1 << 20, inUse: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}), refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "c"})}},
}

// FuzzFromHTTP feeds HTTP/2 and HTTP/3 requests, as net/http and quic-go hand them
// over, through the conversion to fasthttp and prepareUpstream. The servers check
// header syntax already; the conversion must stay safe if one did not.
func FuzzFromHTTP(f *testing.F) {
	f.Add("GET", "/", "a.test", "X-Foo", "bar", "")
	f.Add("POST", "/p?q=1", "a.test:8443", "Content-Type", "text/plain", "body")
	f.Add("GET", "/", "a.test", "X-Forwarded-For", "1.2.3.4", "")
	f.Add("GET", "/x y", "a.test", "X-Foo", "bar", "")
	f.Add("GET", "/", "a.test", "X-Foo", "bar\r\nX-Real-IP: 6.6.6.6", "")
	f.Add("GET", "/", "a.test\r\nX: y", "X-Foo", "bar", "")
	f.Add("GE T", "/", "a.test", "X Foo", "bar", "")
	f.Add("PUT", "/", "a.test", "Content-Length", "100", "short")
	f.Add("GET", "/", "a.test", "Transfer-Encoding", "chunked", "")
	f.Fuzz(func(t *testing.T, method, uri, host, key, value, body string) {
		hr := &http.Request{
			Method:        method,
			RequestURI:    uri,
			Host:          host,
			URL:           &url.URL{Path: "/"},
			Header:        http.Header{key: {value}},
			Body:          io.NopCloser(strings.NewReader(body)),
			ContentLength: int64(len(body)),
		}
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		if status := fromHTTP(req, hr); status != 0 {
			return
		}
		var ch chunk
		defer ch.put()
		if _, status := fuzzListener.bodyFrom(req, hr, &ch); status != 0 {
			return
		}
		var named [][]byte
		for _, v := range req.Header.PeekAll("Connection") {
			listElements(v, func(tok []byte) { named = append(named, bytes.Clone(tok)) })
		}
		if !prepareUpstream(req, &Decision{ClientIP: fuzzClient}, fuzzPeer, "sni.test") {
			return
		}
		checkForwarded(t, req, false, "", named)
		if got := string(req.Body()); got != body {
			t.Fatalf("body %q became %q", body, got)
		}
	})
}
