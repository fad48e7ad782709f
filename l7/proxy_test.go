package l7

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
)

func parseRequest(t testing.TB, raw string) *fasthttp.Request {
	t.Helper()
	req := fasthttp.AcquireRequest()
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("parsing %q: %v", raw, err)
	}
	return req
}

func TestPrepareUpstream(t *testing.T) {
	client := netip.MustParseAddr("203.0.113.5")
	peer := netip.MustParseAddr("192.0.2.10")
	for _, tc := range []struct {
		name     string
		raw      string
		d        Decision
		sni      string
		ok       bool
		wantLine string   // request line sent to the backend
		want     []string // headers sent, "Name: value"
		absent   []string
	}{
		{
			name: "untrusted peer: XFF replaced",
			raw:  "GET /p?q=1 HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-For: 6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nX-Forwarded-Proto: http\r\n\r\n",
			d:    Decision{ClientIP: client}, ok: true,
			wantLine: "GET /p?q=1 HTTP/1.1",
			want:     []string{"Host: a.test", "X-Forwarded-For: 203.0.113.5", "X-Real-Ip: 203.0.113.5", "X-Forwarded-Proto: https"},
		},
		{
			name: "trusted peer: the peer appended to every prior XFF value",
			raw:  "GET / HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-For: 203.0.113.5\r\nX-Forwarded-For: 10.0.0.1 , \r\n\r\n",
			d:    Decision{ClientIP: client, TrustedPeer: true}, ok: true,
			wantLine: "GET / HTTP/1.1",
			want:     []string{"X-Forwarded-For: 203.0.113.5, 10.0.0.1, 192.0.2.10", "X-Real-Ip: 203.0.113.5"},
		},
		{
			name: "several X-Real-IP and X-Forwarded-Proto all replaced",
			raw:  "GET / HTTP/1.1\r\nHost: a.test\r\nX-Real-IP: 6.6.6.6\r\nX-Forwarded-Proto: http\r\nx-real-ip: 7.7.7.7\r\nX-Forwarded-Proto: ftp\r\n\r\n",
			d:    Decision{ClientIP: client}, ok: true,
			wantLine: "GET / HTTP/1.1",
			want:     []string{"X-Real-Ip: 203.0.113.5", "X-Forwarded-Proto: https"},
		},
		{
			name: "trusted peer without XFF",
			raw:  "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
			d:    Decision{ClientIP: peer, TrustedPeer: true}, ok: true,
			wantLine: "GET / HTTP/1.1",
			want:     []string{"X-Forwarded-For: 192.0.2.10", "X-Real-Ip: 192.0.2.10"},
		},
		{
			name: "hop-by-hop and Connection-named headers removed, Host kept",
			raw: "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: X-A, Host, keep-alive\r\nX-A: 1\r\nKeep-Alive: 5\r\n" +
				"Upgrade: websocket\r\nTe: trailers\r\nProxy-Authorization: x\r\nExpect: 100-continue\r\nX-B: 2\r\n\r\n",
			d: Decision{ClientIP: client}, ok: true,
			wantLine: "GET / HTTP/1.1",
			want:     []string{"Host: a.test", "X-B: 2"},
			absent:   []string{"X-A", "Keep-Alive", "Upgrade", "Te", "Proxy-Authorization", "Expect", "Connection"},
		},
		{
			name: "absolute form becomes origin form, its authority the Host",
			raw:  "GET https://b.test/x?y HTTP/1.1\r\nHost: a.test\r\n\r\n",
			d:    Decision{ClientIP: client}, ok: true,
			wantLine: "GET /x?y HTTP/1.1",
			want:     []string{"Host: b.test"},
		},
		{
			name: "HTTP/1.0 without Host takes the SNI",
			raw:  "GET / HTTP/1.0\r\n\r\n",
			d:    Decision{ClientIP: client}, sni: "sni.test", ok: true,
			wantLine: "GET / HTTP/1.1",
			want:     []string{"Host: sni.test"},
		},
		{
			name: "no Host and no SNI",
			raw:  "GET / HTTP/1.0\r\n\r\n",
			d:    Decision{ClientIP: client},
		},
		{
			name: "absolute form with an empty authority",
			raw:  "GET http:///x HTTP/1.1\r\nHost: a.test\r\n\r\n",
			d:    Decision{ClientIP: client},
		},
		{
			name: "chunked body forwarded with its length",
			raw:  "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			d:    Decision{ClientIP: client}, ok: true,
			wantLine: "POST / HTTP/1.1",
			want:     []string{"Content-Length: 3"},
			absent:   []string{"Transfer-Encoding"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := parseRequest(t, tc.raw)
			defer fasthttp.ReleaseRequest(req)
			if ok := prepareUpstream(req, &tc.d, peer, tc.sni); ok != tc.ok {
				t.Fatalf("prepareUpstream = %v, want %v", ok, tc.ok)
			}
			if !tc.ok {
				return
			}
			wire := req.String()
			line, _, _ := strings.Cut(wire, "\r\n")
			if line != tc.wantLine {
				t.Errorf("request line %q, want %q", line, tc.wantLine)
			}
			checkHeaderLines(t, wire, tc.want, tc.absent)
		})
	}
}

// checkHeaderLines checks that wire, a request or response head, has each of the
// header lines want and no header named in absent, in any case.
func checkHeaderLines(t *testing.T, wire string, want, absent []string) {
	t.Helper()
	for _, h := range want {
		if !strings.Contains(wire, "\r\n"+h+"\r\n") {
			t.Errorf("missing %q in\n%s", h, wire)
		}
	}
	for _, h := range absent {
		if strings.Contains(strings.ToLower(wire), "\r\n"+strings.ToLower(h)+":") {
			t.Errorf("%s forwarded in\n%s", h, wire)
		}
	}
}

// TestForwardingHeadersOnce: a client's X-Real-IP and X-Forwarded-Proto headers, one
// or several, in any case, are replaced by one of each.
func TestForwardingHeadersOnce(t *testing.T) {
	for _, extra := range []string{
		"X-Real-IP: 6.6.6.6\r\nX-Forwarded-Proto: http\r\n",
		"X-Real-IP: 6.6.6.6\r\nX-Forwarded-Proto: http\r\nx-real-ip: 7.7.7.7\r\nX-FORWARDED-PROTO: ftp\r\nX-Real-Ip: 8.8.8.8\r\n",
		"Cookie: a=1\r\nX-Real-IP: 6.6.6.6\r\nX-Real-IP: 7.7.7.7\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Proto: ftp\r\n",
	} {
		req := parseRequest(t, "GET / HTTP/1.1\r\nHost: a.test\r\n"+extra+"\r\n")
		if !prepareUpstream(req, &Decision{ClientIP: netip.MustParseAddr("203.0.113.5")}, netip.MustParseAddr("192.0.2.10"), "") {
			t.Fatal("refused")
		}
		out := parseRequest(t, req.String())
		if v := out.Header.PeekAll("X-Real-IP"); len(v) != 1 || string(v[0]) != "203.0.113.5" {
			t.Errorf("X-Real-IP %q forwarded from\n%s", v, extra)
		}
		if v := out.Header.PeekAll("X-Forwarded-Proto"); len(v) != 1 || string(v[0]) != "https" {
			t.Errorf("X-Forwarded-Proto %q forwarded from\n%s", v, extra)
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseRequest(out)
	}
}

func TestBackendStatus(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		reason string
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, 502, "connect"},
		{fasthttp.ErrDialTimeout, 502, "connect"},
		{fmt.Errorf("x: %w", fasthttp.ErrTimeout), 504, "timeout"},
		{&net.OpError{Op: "read", Net: "tcp", Err: errTimeout{}}, 504, "timeout"},
		{fasthttp.ErrNoFreeConns, 503, "busy"},
		{fasthttp.ErrConnectionClosed, 502, "other"},
		{errors.New("malformed response"), 502, "other"},
	} {
		status, reason := backendStatus(tc.err)
		if status != tc.status || reason != tc.reason {
			t.Errorf("backendStatus(%v) = %d %s, want %d %s", tc.err, status, reason, tc.status, tc.reason)
		}
	}
}

type errTimeout struct{}

func (errTimeout) Error() string   { return "i/o timeout" }
func (errTimeout) Timeout() bool   { return true }
func (errTimeout) Temporary() bool { return true }

// isHopHeaderEqualFold is isHopHeader as it was, with bytes.EqualFold, which folds
// non-ASCII letters too (the Kelvin sign is a k).
func isHopHeaderEqualFold(name []byte) bool {
	for _, h := range hopHeaders {
		if bytes.EqualFold(name, []byte(h)) {
			return true
		}
	}
	return false
}

// removeRequestHopHeadersDel is removeRequestHopHeaders as it was, a Del for each
// name: the reference the one-pass removal must agree with.
func removeRequestHopHeadersDel(h *fasthttp.RequestHeader) {
	var named [][]byte
	for _, v := range h.PeekAll("Connection") {
		listElements(v, func(tok []byte) {
			if !isProtected(tok) && !isHopHeaderEqualFold(tok) {
				named = append(named, append([]byte(nil), tok...))
			}
		})
	}
	for _, n := range named {
		h.DelBytes(n)
	}
	for _, n := range hopHeaders {
		h.Del(n)
	}
}

// prepareUpstreamDel is prepareUpstream as it was, over removeRequestHopHeadersDel,
// but for X-Real-IP and X-Forwarded-Proto sent more than once.
func prepareUpstreamDel(req *fasthttp.Request, d *Decision, peer netip.Addr, sni string) bool {
	h := &req.Header
	if len(h.Host()) == 0 {
		if sni == "" {
			return false
		}
		h.SetHost(sni)
	}
	if len(req.URI().Host()) == 0 {
		return false
	}
	h.SetProtocol("HTTP/1.1")
	removeRequestHopHeadersDel(h)
	h.Del("Expect")
	req.URI().SetScheme("http")

	var buf [128]byte
	xff := buf[:0]
	if d.TrustedPeer {
		for _, v := range h.PeekAll("X-Forwarded-For") {
			listElements(v, func(e []byte) {
				if len(xff) > 0 {
					xff = append(xff, ", "...)
				}
				xff = append(xff, e...)
			})
		}
		if len(xff) > 0 {
			xff = append(xff, ", "...)
		}
		xff = peer.AppendTo(xff)
	} else {
		xff = d.ClientIP.AppendTo(xff)
	}
	h.Del("X-Forwarded-For")
	h.SetBytesV("X-Forwarded-For", xff)
	var ipBuf [48]byte
	// Since then: a client's X-Real-IP and X-Forwarded-Proto beyond the first
	// (which Set replaces) go too.
	if len(h.PeekAll("X-Real-IP")) > 1 {
		h.Del("X-Real-IP")
	}
	h.SetBytesV("X-Real-IP", d.ClientIP.AppendTo(ipBuf[:0]))
	if len(h.PeekAll("X-Forwarded-Proto")) > 1 {
		h.Del("X-Forwarded-Proto")
	}
	h.Set("X-Forwarded-Proto", "https")
	return true
}

// removeResponseHopHeadersDel is removeResponseHopHeaders as it was. It finds only
// the spelling Del is given, so it is the reference for responses whose names were
// normalized when parsed.
func removeResponseHopHeadersDel(h *fasthttp.ResponseHeader) {
	var named [][]byte
	for _, v := range h.PeekAll("Connection") {
		listElements(v, func(tok []byte) {
			if !equalFoldASCII(tok, "Content-Length") && !isHopHeaderEqualFold(tok) {
				named = append(named, append([]byte(nil), tok...))
			}
		})
	}
	for _, n := range named {
		h.DelBytes(n)
	}
	for _, n := range hopHeaders {
		h.Del(n)
	}
}

// headerLines returns the header fields of a request or response as written, but
// for the first line, each "name: value" with the name in lower case, sorted.
func headerLines(wire string) []string {
	head, _, _ := strings.Cut(wire, "\r\n\r\n")
	lines := strings.Split(head, "\r\n")[1:]
	for i, l := range lines {
		if k, v, ok := strings.Cut(l, ":"); ok {
			lines[i] = strings.ToLower(k) + ":" + v
		}
	}
	slices.Sort(lines)
	return lines
}

func TestRemoveRequestHopHeaders(t *testing.T) {
	for _, tc := range []struct {
		name         string
		headers      string // after "GET / HTTP/1.1\r\n"
		want, absent []string
		cookies      bool // the cookies parsed before (a Decider read one)
	}{
		{
			name:    "Connection names a custom header and keep-alive",
			headers: "Host: a\r\nConnection: X-Custom, keep-alive\r\nX-Custom: 1\r\nKeep-Alive: timeout=5\r\nX-Other: 2\r\n",
			want:    []string{"Host: a", "X-Other: 2"},
			absent:  []string{"X-Custom", "Keep-Alive", "Connection"},
		},
		{
			name:    "Proxy-Connection and Proxy-Authorization",
			headers: "Host: a\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nAccept: */*\r\n",
			want:    []string{"Accept: */*"},
			absent:  []string{"Proxy-Connection", "Proxy-Authorization"},
		},
		{
			name:    "Te, Trailer and Upgrade",
			headers: "Host: a\r\nConnection: Upgrade, TE\r\nUpgrade: websocket\r\nTe: trailers\r\nTrailer: X-Sum\r\nX-Sum: 1\r\n",
			want:    []string{"X-Sum: 1"},
			absent:  []string{"Upgrade", "Te", "Trailer", "Connection"},
		},
		{
			name:    "named Host and Content-Length stay",
			headers: "Host: a\r\nContent-Length: 0\r\nConnection: host, Content-Length, X-A\r\nX-A: 1\r\n",
			want:    []string{"Host: a", "Content-Length: 0"},
			absent:  []string{"X-A", "Connection"},
		},
		{
			name:    "names in odd case",
			headers: "host: a\r\nCONNECTION: x-a, KEEP-ALIVE\r\nx-A: 1\r\nkeep-alive: 5\r\nuPgRaDe: h2c\r\nprOxy-authoriZation: x\r\nexPECT: 100-continue\r\nx-b: 2\r\n",
			want:    []string{"Host: a", "X-B: 2"},
			absent:  []string{"X-A", "Keep-Alive", "Upgrade", "Proxy-Authorization", "Expect", "Connection"},
		},
		{
			name:    "several Connection headers",
			headers: "Host: a\r\nConnection: X-A\r\nX-A: 1\r\nConnection: X-B, keep-alive\r\nX-B: 2\r\nX-C: 3\r\n",
			want:    []string{"X-C: 3"},
			absent:  []string{"X-A", "X-B", "Connection"},
		},
		{
			name:    "Connection: close names a header Close",
			headers: "Host: a\r\nConnection: close\r\nClose: x\r\nX-C: 3\r\n",
			want:    []string{"X-C: 3"},
			absent:  []string{"Close", "Connection"},
		},
		{
			name:    "cookies kept as the client wrote them",
			headers: "Host: a\r\nCookie: a=1;b=2\r\nCookie: c\r\nConnection: X-A\r\nX-A: 1\r\nTe: trailers\r\n",
			want:    []string{"Cookie: a=1;b=2", "Cookie: c"},
			absent:  []string{"X-A", "Te", "Connection"},
		},
		{
			name:    "cookies parsed before",
			headers: "Host: a\r\nCookie: a=1; b=2\r\nConnection: X-A, Cookie\r\nX-A: 1\r\nKeep-Alive: 1\r\n",
			cookies: true,
			absent:  []string{"X-A", "Cookie", "Keep-Alive", "Connection"},
		},
		{
			name:    "Connection names Expect and X-Forwarded-For",
			headers: "Host: a\r\nConnection: Expect, X-Forwarded-For\r\nExpect: 100-continue\r\nX-Forwarded-For: 6.6.6.6\r\n",
			want:    []string{"X-Forwarded-For: 192.0.2.10"},
			absent:  []string{"Expect", "Connection"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := "GET / HTTP/1.1\r\n" + tc.headers + "\r\n"
			d := Decision{ClientIP: netip.MustParseAddr("203.0.113.5"), TrustedPeer: true}
			peer := netip.MustParseAddr("192.0.2.10")
			req, ref := parseRequest(t, raw), parseRequest(t, raw)
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseRequest(ref)
			if tc.cookies {
				req.Header.Cookie("a")
				ref.Header.Cookie("a")
			}
			if !prepareUpstream(req, &d, peer, "") || !prepareUpstreamDel(ref, &d, peer, "") {
				t.Fatal("refused")
			}
			wire := req.String()
			if want := ref.String(); wire != want {
				t.Errorf("forwarded\n%s\nwhere Del forwarded\n%s", wire, want)
			}
			for _, h := range tc.want {
				if !strings.Contains(wire, "\r\n"+h+"\r\n") {
					t.Errorf("missing %q in\n%s", h, wire)
				}
			}
			for _, h := range tc.absent {
				if strings.Contains(strings.ToLower(wire), "\r\n"+strings.ToLower(h)+":") {
					t.Errorf("%s forwarded in\n%s", h, wire)
				}
			}
		})
	}
}

// parseResponse parses a response as the backends' client does: stream, names as
// they come.
func parseResponse(t testing.TB, raw string, normalize bool) *fasthttp.Response {
	t.Helper()
	resp := fasthttp.AcquireResponse()
	if !normalize {
		resp.Header.DisableNormalizing()
	}
	resp.StreamBody = true
	if err := resp.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatalf("parsing %q: %v", raw, err)
	}
	return resp
}

func TestRemoveResponseHopHeaders(t *testing.T) {
	for _, tc := range []struct {
		name         string
		headers      string // after "HTTP/1.1 200 OK\r\n"
		want, absent []string
	}{
		{
			name:    "Connection names a custom header",
			headers: "Connection: X-Secret, keep-alive\r\nX-Secret: hop\r\nKeep-Alive: timeout=5\r\nAlt-Svc: x\r\nContent-Length: 0\r\n",
			want:    []string{"Alt-Svc: x", "Content-Length: 0"},
			absent:  []string{"X-Secret", "Keep-Alive", "Connection"},
		},
		{
			name:    "names in lower case, as some backends send them",
			headers: "connection: x-secret\r\nx-secret: hop\r\nkeep-alive: timeout=5\r\nupgrade: h2c\r\nproxy-authenticate: Basic\r\nx-kept: 1\r\ncontent-length: 0\r\n",
			want:    []string{"x-kept: 1", "Content-Length: 0"},
			absent:  []string{"X-Secret", "Keep-Alive", "Upgrade", "Proxy-Authenticate", "Connection"},
		},
		{
			name:    "a token in another case than the header it names",
			headers: "Connection: X-SECRET\r\nX-Secret: hop\r\nProxy-Connection: x\r\nTe: x\r\nContent-Length: 0\r\n",
			want:    []string{"Content-Length: 0"},
			absent:  []string{"X-Secret", "Proxy-Connection", "Te", "Connection"},
		},
		{
			name:    "Content-Length named stays, named specials go",
			headers: "Connection: content-length, content-type, Server\r\nContent-Type: text/plain\r\nServer: s\r\nContent-Length: 0\r\n",
			want:    []string{"Content-Length: 0"},
			absent:  []string{"Content-Type", "Server", "Connection"},
		},
		{
			name:    "several Connection headers and close",
			headers: "Connection: X-A\r\nX-A: 1\r\nconnection: close, x-b\r\nX-B: 2\r\nX-C: 3\r\nContent-Length: 0\r\n",
			want:    []string{"X-C: 3"},
			absent:  []string{"X-A", "X-B", "Connection"},
		},
		{
			name:    "chunked",
			headers: "Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\nX-Kept: 1\r\n",
			want:    []string{"X-Kept: 1"},
			absent:  []string{"Trailer", "Transfer-Encoding"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := "HTTP/1.1 200 OK\r\n" + tc.headers + "\r\n"
			if strings.Contains(tc.headers, "chunked") {
				raw += "0\r\n\r\n"
			}
			resp := parseResponse(t, raw, false)
			defer fasthttp.ReleaseResponse(resp)
			removeResponseHopHeaders(&resp.Header)
			if resp.Header.ConnectionClose() {
				t.Error("Connection: close kept")
			}
			checkHeaderLines(t, resp.Header.String(), tc.want, tc.absent)
		})
	}
}

// FuzzRequestHopHeaders checks that prepareUpstream's one pass over the headers
// forwards exactly what the Del of each name did, byte for byte, for requests as the
// server parses them, with or without their cookies parsed before (a Decider can
// read them).
func FuzzRequestHopHeaders(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: X-A, keep-alive\r\nX-A: 1\r\nKeep-Alive: 5\r\nCookie: a=1\r\n\r\n",
		"GET / HTTP/1.1\r\nhost: a\r\nconnection: x-a\r\nconnection: close, HOST, content-length\r\nX-a: 1\r\nclose: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nProxy-Connection: x\r\nProxy-Authenticate: x\r\nProxy-Authorization: x\r\nTe: x\r\nUpgrade: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\nConnection: X-Sum\r\n\r\n1\r\na\r\n0\r\nX-Sum: 1\r\n\r\n",
		"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8\r\n\r\nok",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: X-Forwarded-For, Expect, Cookie, User-Agent, Content-Type\r\nX-Forwarded-For: 1\r\nCookie: a=1\r\nUser-Agent: u\r\nContent-Type: t\r\nTe:\r\n\r\n",
		"GET http://b/x HTTP/1.0\r\nConnection: keep-alive\r\nX-Real-IP: 1\r\nX-Real-IP: 2\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: \u212aeep-alive, \u017fet-cookie\r\n\u212aeep-Alive: 1\r\n\r\n",
	} {
		f.Add([]byte(s), false, false)
		f.Add([]byte(s), true, true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, trusted, cookies bool) {
		parse := func() *fasthttp.Request {
			req := fasthttp.AcquireRequest()
			br := bufio.NewReader(bytes.NewReader(raw))
			if err := req.ReadLimitBody(br, 1<<16); err != nil {
				fasthttp.ReleaseRequest(req)
				return nil
			}
			if cookies {
				req.Header.Cookie("a")
			}
			return req
		}
		req, ref := parse(), parse()
		if req == nil {
			return
		}
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseRequest(ref)
		d := Decision{ClientIP: fuzzClient, TrustedPeer: trusted}
		ok, refOK := prepareUpstream(req, &d, fuzzPeer, "sni.test"), prepareUpstreamDel(ref, &d, fuzzPeer, "sni.test")
		if ok != refOK {
			t.Fatalf("prepareUpstream = %v, with Del %v", ok, refOK)
		}
		if got, want := req.String(), ref.String(); got != want {
			t.Fatalf("forwarded\n%q\nwhere Del forwarded\n%q", got, want)
		}
	})
}

// FuzzResponseHopHeaders checks removeResponseHopHeaders, on a response parsed as
// the backends' client parses it (names as they come), against the Del of each name
// on the same response parsed with its names normalized, where Del finds them all:
// the same fields must be left, whatever the case of their names.
func FuzzResponseHopHeaders(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: X-Secret, keep-alive\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nconnection: x-secret\r\nx-SECRET: 1\r\nkeep-alive: 5\r\nupgrade: h2c\r\nte: x\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: close, content-type, SERVER, set-cookie, content-length\r\nContent-Type: t\r\nServer: s\r\nSet-Cookie: a=1\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\nConnection: x-sum\r\nProxy-Authenticate: b\r\n\r\n1\r\na\r\n0\r\nX-Sum: 1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		parse := func(normalize bool) *fasthttp.Response {
			resp := fasthttp.AcquireResponse()
			if !normalize {
				resp.Header.DisableNormalizing()
			}
			// As the backends' client reads: the body left to stream (a large
			// Content-Length would otherwise be allocated whole).
			resp.StreamBody = true
			if err := resp.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
				fasthttp.ReleaseResponse(resp)
				return nil
			}
			return resp
		}
		resp, ref := parse(false), parse(true)
		if resp == nil || ref == nil {
			if resp != nil {
				fasthttp.ReleaseResponse(resp)
			}
			return
		}
		defer fasthttp.ReleaseResponse(resp)
		defer fasthttp.ReleaseResponse(ref)
		removeResponseHopHeaders(&resp.Header)
		removeResponseHopHeadersDel(&ref.Header)
		got, want := headerLines(resp.Header.String()), headerLines(ref.Header.String())
		if !slices.Equal(got, want) {
			t.Fatalf("left\n%q\nwhere Del on normalized names left\n%q", got, want)
		}
	})
}

const (
	// benchRequest is a browser's request, with a cookie, Connection: keep-alive and
	// the X-Forwarded-For of a proxy before.
	benchRequest = "GET /api/v1/items?id=42 HTTP/1.1\r\nHost: shop.test\r\nUser-Agent: bench\r\nAccept: */*\r\n" +
		"Connection: keep-alive\r\nX-Forwarded-For: 198.51.100.1\r\nCookie: a=1; b=2\r\n\r\n"
	// benchRequestBare is wrk's: Host alone.
	benchRequestBare = "GET /1k HTTP/1.1\r\nHost: shop.test\r\n\r\n"
	// benchResponse is nginx's answer to it.
	benchResponse = "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Tue, 01 Dec 2026 22:00:00 GMT\r\n" +
		"Content-Type: application/octet-stream\r\nContent-Length: 1024\r\nLast-Modified: Tue, 01 Dec 2026 21:00:00 GMT\r\n" +
		"Connection: keep-alive\r\nETag: \"675a1b2c-400\"\r\nAccept-Ranges: bytes\r\n\r\n"
)

// BenchmarkPrepareUpstream prepares a parsed request for the backend; "del" is the
// former Del of each name, for comparison. Parsing is in the loop, the same in each:
// "parse" is that alone.
func BenchmarkPrepareUpstream(b *testing.B) {
	for _, impl := range []struct {
		name string
		f    func(*fasthttp.Request, *Decision, netip.Addr, string) bool
	}{
		{"onepass", prepareUpstream},
		{"del", prepareUpstreamDel},
		{"parse", func(*fasthttp.Request, *Decision, netip.Addr, string) bool { return true }},
	} {
		for _, rc := range []struct{ name, raw string }{{"browser", benchRequest}, {"bare", benchRequestBare}} {
			b.Run(impl.name+"/"+rc.name, func(b *testing.B) {
				d := Decision{ClientIP: netip.MustParseAddr("203.0.113.5")}
				peer := netip.MustParseAddr("192.0.2.10")
				req := fasthttp.AcquireRequest()
				sr := strings.NewReader(rc.raw)
				br := bufio.NewReader(sr)
				b.ReportAllocs()
				for b.Loop() {
					req.Reset()
					sr.Reset(rc.raw)
					br.Reset(sr)
					if err := req.Read(br); err != nil {
						b.Fatal(err)
					}
					req.URI() // parsed by serve, to route on
					impl.f(req, &d, peer, "shop.test")
				}
			})
		}
	}
}

// BenchmarkRemoveResponseHopHeaders removes the hop-by-hop headers of nginx's
// answer; "del" is the former Del of each name. Parsing is in the loop ("parse").
func BenchmarkRemoveResponseHopHeaders(b *testing.B) {
	for _, impl := range []struct {
		name string
		f    func(*fasthttp.ResponseHeader)
	}{
		{"onepass", removeResponseHopHeaders},
		{"del", removeResponseHopHeadersDel},
		{"parse", func(*fasthttp.ResponseHeader) {}},
	} {
		b.Run(impl.name, func(b *testing.B) {
			var h fasthttp.ResponseHeader
			sr := strings.NewReader(benchResponse)
			br := bufio.NewReader(sr)
			b.ReportAllocs()
			for b.Loop() {
				h.Reset()
				h.DisableNormalizing()
				sr.Reset(benchResponse)
				br.Reset(sr)
				if err := h.Read(br); err != nil {
					b.Fatal(err)
				}
				impl.f(&h)
			}
		})
	}
}

// BenchmarkProxyH1 is the whole HTTP/1.1 path of a proxied request in process: a
// keep-alive TLS 1.3 connection to a listener, GET /1k, forwarded to a fasthttp
// backend answering 1 KiB. ns/op counts the client's and the backend's work too.
func BenchmarkProxyH1(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), 1024)
	backend := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/octet-stream")
		ctx.SetBody(body)
	}}
	go backend.Serve(ln)
	b.Cleanup(func() { backend.Shutdown() })
	ts := startServer(b, baseConfig(b, ln.Addr().String()))

	cfg := ts.clientTLS()
	cfg.NextProtos = []string{"http/1.1"}
	c, err := tls.Dial("tcp", ts.addr, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	req := []byte("GET /1k HTTP/1.1\r\nHost: localhost\r\n\r\n")
	br := bufio.NewReaderSize(c, 16<<10)
	roundTrip := func() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		n := -1
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				b.Fatal(err)
			}
			if len(line) <= 2 {
				break
			}
			if k, v, ok := bytes.Cut(line, []byte(":")); ok && strings.EqualFold(string(k), "Content-Length") {
				n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
			}
		}
		if n != len(body) {
			b.Fatalf("answer of %d bytes", n)
		}
		if _, err := br.Discard(n); err != nil {
			b.Fatal(err)
		}
	}
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	roundTrip()
	b.ReportAllocs()
	for b.Loop() {
		roundTrip()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(br, 0))
}

// TestRequestChildren: the children count keeps are those of the vectors, one per
// pair of labels, whichever goroutine finds a pair first.
func TestRequestChildren(t *testing.T) {
	m := newMetrics(nil)
	labels := []requestLabels{{"a", "200"}, {"a", "404"}, {"b", "200"}, {routeNone, codeClosed}}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 1000 {
				l := labels[i%len(labels)]
				c := m.requestChild(l.route, l.code)
				c.requests.Inc()
				c.seconds.Observe(0.001)
			}
		})
	}
	wg.Wait()
	for _, l := range labels {
		if got := testutil.ToFloat64(m.requests.WithLabelValues(l.route, l.code)); got != 1000 {
			t.Errorf("requests %v = %v, want 1000", l, got)
		}
	}
	if n := testutil.CollectAndCount(m.requestSeconds); n != 3 {
		t.Errorf("%d request_seconds series, want 3", n)
	}
	if n := len(*m.requestChildren.byLabels.Load()); n != len(labels) {
		t.Errorf("%d children kept, want %d", n, len(labels))
	}
}
