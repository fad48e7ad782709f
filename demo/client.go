package demo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/internal/promtext"
)

// target is what the client loop requests, and from where.
type target struct {
	addr     string // host:port dialled, TCP and UDP
	ns       *netNS // where the client's sockets are made; nil: the host
	roots    *x509.CertPool
	interval time.Duration
	nodes    map[string]string // L7 node address (as the backend sees it) → name printed
	summary  func() []string   // lines printed every eight requests
}

// mode is one way of making a request: protocol and TLS parameters.
type mode struct {
	name  string
	proto string // h1, h2 or h3
	max   uint16
	suite uint16
}

var modes = []mode{
	{"HTTP/1.1 TLS 1.3", "h1", tls.VersionTLS13, 0},
	{"HTTP/2 TLS 1.2", "h2", tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
	{"HTTP/3 QUIC", "h3", tls.VersionTLS13, 0},
	{"HTTP/1.1 TLS 1.2", "h1", tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
}

// result is one answer, as the backend wrote it through an L7 node.
type result struct {
	proto, suite string
	status       int
	node, client string // the L7 node's address and the client address it reported
}

// clientLoop makes a request over a new connection, so a full handshake (one signature
// by keyserverd), every interval, rotating modes, and prints each result, until ctx is
// done or a daemon of s ends.
func clientLoop(ctx context.Context, s *stack, t target, out io.Writer) error {
	ok, failed := 0, 0
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			fmt.Fprintf(out, "\n%d requests completed, %d failed\n", ok, failed)
			if failed > 0 {
				return fmt.Errorf("%d requests failed", failed)
			}
			return nil
		case p := <-s.died:
			return p.Exited()
		case p := <-s.lost:
			fmt.Fprintf(out, "\n*** %s (pid %d) ended (%v); the router drops its path when its BGP session closes or its hold timer expires, and the others carry its synced connections on ***\n\n",
				p.Name, p.PID(), p.ExitErr())
			continue
		case <-time.After(t.interval):
		}
		m := modes[(i-1)%len(modes)]
		start := time.Now()
		res, err := m.fetch(ctx, t.ns, t.addr, t.roots)
		took := time.Since(start)
		if err != nil && ctx.Err() != nil {
			continue // stopping: the request was cut short by the stop, not refused
		}
		if err != nil {
			failed++
			fmt.Fprintf(out, "#%-4d %-17s FAILED after %v: %v\n", i, m.name, took.Round(time.Microsecond), err)
			continue
		}
		ok++
		name := t.nodes[res.node]
		if name == "" {
			name = "l7d"
		}
		fmt.Fprintf(out, "#%-4d %-17s %-8s %-38s %7.2f ms  %d  served by %s (%s), client %s\n", i, m.name, res.proto, res.suite,
			float64(took.Microseconds())/1000, res.status, name, res.node, res.client)
		if i%8 == 0 && t.summary != nil {
			for _, l := range t.summary() {
				fmt.Fprintf(out, "      %s\n", l)
			}
		}
	}
}

// fetch makes one request to addr over a new connection whose socket is made in ns.
func (m mode) fetch(ctx context.Context, ns *netNS, addr string, roots *x509.CertPool) (*result, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tcfg := &tls.Config{RootCAs: roots, ServerName: "demo.tiergate.test", MaxVersion: m.max}
	if m.suite != 0 {
		tcfg.CipherSuites = []uint16{m.suite}
	}
	var rt http.RoundTripper
	switch m.proto {
	case "h3":
		var conn net.PacketConn
		if err := ns.do(func() error {
			var err error
			conn, err = net.ListenPacket("udp", ":0")
			return err
		}); err != nil {
			return nil, fmt.Errorf("opening a UDP socket: %w", err)
		}
		defer conn.Close()
		qt := &quic.Transport{Conn: conn}
		defer qt.Close()
		t := &http3.Transport{TLSClientConfig: tcfg, Dial: func(ctx context.Context, addr string, tlsConf *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			ua, err := net.ResolveUDPAddr("udp", addr)
			if err != nil {
				return nil, err
			}
			return qt.DialEarly(ctx, ua, tlsConf, qc)
		}}
		defer t.Close()
		rt = t
	default:
		t := &http.Transport{TLSClientConfig: tcfg, DialContext: nsDialer(ns), DisableKeepAlives: true, ForceAttemptHTTP2: m.proto == "h2"}
		if m.proto == "h1" {
			t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		defer t.CloseIdleConnections()
		rt = t
	}
	req, err := http.NewRequestWithContext(ctx, "GET", "https://"+addr+"/", nil)
	if err != nil {
		return nil, err
	}
	req.Host = "demo.tiergate.test"
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return nil, err
	}
	r := &result{proto: resp.Proto, status: resp.StatusCode}
	r.node, r.client = parseAnswer(string(body))
	if resp.TLS != nil {
		r.suite = tls.CipherSuiteName(resp.TLS.CipherSuite)
	}
	return r, nil
}

// parseAnswer returns the L7 node and the client address from backendHandler's answer.
func parseAnswer(body string) (node, client string) {
	for _, f := range strings.Fields(body) {
		if v, ok := strings.CutPrefix(f, "l7d="); ok {
			node = v
		} else if v, ok := strings.CutPrefix(f, "client="); ok {
			client = v
		}
	}
	return node, client
}

// keyserverOps summarises tiergate_keyserver_ops_total from keyserverd's /metrics.
func keyserverOps(hc *http.Client, url string) string {
	ss, err := promtext.Get(context.Background(), hc, url)
	if err != nil {
		return "metrics unavailable: " + err.Error()
	}
	var parts []string
	for _, s := range ss.Select("tiergate_keyserver_ops_total") {
		if s.Value != 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", s.LabelString(), s.Value))
		}
	}
	if len(parts) == 0 {
		return "no operations yet"
	}
	return "tiergate_keyserver_ops_total " + strings.Join(parts, " ")
}
