package l7

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"

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

func BenchmarkPrepareUpstream(b *testing.B) {
	raw := "GET /api/v1/items?id=42 HTTP/1.1\r\nHost: shop.test\r\nUser-Agent: bench\r\nAccept: */*\r\n" +
		"Connection: keep-alive\r\nX-Forwarded-For: 198.51.100.1\r\nCookie: a=1; b=2\r\n\r\n"
	d := Decision{ClientIP: netip.MustParseAddr("203.0.113.5")}
	peer := netip.MustParseAddr("192.0.2.10")
	req := fasthttp.AcquireRequest()
	sr := strings.NewReader(raw)
	br := bufio.NewReader(sr)
	b.ReportAllocs()
	for b.Loop() {
		req.Reset()
		sr.Reset(raw)
		br.Reset(sr)
		if err := req.Read(br); err != nil {
			b.Fatal(err)
		}
		prepareUpstream(req, &d, peer, "shop.test")
	}
}
