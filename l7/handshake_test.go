package l7

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

var errTestNoCert = errors.New("test: no certificate")

// failingSigner is a private key whose operations fail, as a keyserver key does when
// the keyserver is down or slow.
type failingSigner struct {
	crypto.Signer
	err error
}

func (f failingSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) { return nil, f.err }

// multiCertTLS serves a certificate per SNI: ECDSA for localhost, RSA for rsa.test,
// Ed25519 for ed.test, keys failing like a keyserver for ks-*.test, and errors for
// the rest.
func multiCertTLS(t *testing.T) *tls.Config {
	p := getPKI(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	_, rsaDER, err := p.ca.Issue("rsa.test", rsaKey.Public(), "rsa.test")
	if err != nil {
		t.Fatal(err)
	}
	edPub, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edDER, err := p.ca.Issue("ed.test", edPub, "ed.test")
	if err != nil {
		t.Fatal(err)
	}
	ksLeaf, err := p.ca.Leaf("ks.test", "ks-timeout.test", "ks-down.test")
	if err != nil {
		t.Fatal(err)
	}
	failing := func(err error) *tls.Certificate {
		c := ksLeaf
		c.PrivateKey = failingSigner{ksLeaf.PrivateKey.(crypto.Signer), err}
		return &c
	}
	certs := map[string]*tls.Certificate{
		"":                &p.leaf,
		"localhost":       &p.leaf,
		"rsa.test":        {Certificate: [][]byte{rsaDER}, PrivateKey: rsaKey},
		"ed.test":         {Certificate: [][]byte{edDER}, PrivateKey: edKey},
		"ks-timeout.test": failing(&client.OpError{Op: protocol.OpECDSASign, Err: fmt.Errorf("%w: after 1s", client.ErrTimeout)}),
		"ks-down.test":    failing(&client.OpError{Op: protocol.OpECDSASign, Err: client.ErrUnavailable}),
	}
	return &tls.Config{GetCertificate: func(chi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if c, ok := certs[chi.ServerName]; ok {
			return c, nil
		}
		if chi.ServerName == "broken.test" {
			return nil, errors.New("test: certificate store broken")
		}
		return nil, fmt.Errorf("%w for %q", errTestNoCert, chi.ServerName)
	}}
}

// handshakeCount sums tiergate_tls_handshakes_total over the series whose labels
// include match.
func (ts *testServer) handshakeCount(t *testing.T, match map[string]string) float64 {
	t.Helper()
	return ts.metricSum(t, "tiergate_tls_handshakes_total", match)
}

// metricSum sums a counter's values, or a histogram's sample counts, over the series
// whose labels include match.
func (ts *testServer) metricSum(t *testing.T, name string, match map[string]string) float64 {
	t.Helper()
	mfs, err := ts.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range match {
				if have[k] != v {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

func TestHandshakeMetrics(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].TLS = multiCertTLS(t)
	// Long enough that a handshake the client fails (client alert) is not taken for a
	// timeout on a loaded machine; the timeout case waits it out once.
	cfg.Listeners[0].HandshakeTimeout = config.Duration(2 * time.Second)
	cfg.IsNoCertificate = func(err error) bool { return errors.Is(err, errTestNoCert) }
	ts := startServer(t, cfg)

	dial := func(name string, minV, maxV uint16, roots bool) error {
		tc := &tls.Config{ServerName: name, MinVersion: minV, MaxVersion: maxV, NextProtos: []string{"http/1.1"}}
		if roots {
			tc.RootCAs = ts.pki.pool
		} else {
			tc.RootCAs = nil // the system pool, which does not know the test CA
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", ts.addr, tc)
		if err == nil {
			c.Close()
		}
		return err
	}
	type want struct{ version, resumed, sig, result string }
	for _, tc := range []struct {
		name       string
		sni        string
		minV, maxV uint16
		roots      bool
		ok         bool
		want       want
	}{
		{"ecdsa 1.3", "localhost", tls.VersionTLS13, 0, true, true, want{"1.3", "false", "ecdsa", "ok"}},
		{"ecdsa 1.2", "localhost", 0, tls.VersionTLS12, true, true, want{"1.2", "false", "ecdsa", "ok"}},
		{"rsa 1.3", "rsa.test", tls.VersionTLS13, 0, true, true, want{"1.3", "false", "rsa", "ok"}},
		{"rsa 1.2", "rsa.test", 0, tls.VersionTLS12, true, true, want{"1.2", "false", "rsa", "ok"}},
		{"ed25519", "ed.test", tls.VersionTLS13, 0, true, true, want{"1.3", "false", "ed25519", "ok"}},
		{"no certificate", "unknown.test", 0, 0, true, false, want{"1.3", "false", "none", "no_certificate"}},
		{"store error", "broken.test", 0, 0, true, false, want{"1.3", "false", "none", "other"}},
		{"keyserver timeout", "ks-timeout.test", 0, 0, true, false, want{"1.3", "false", "ecdsa", "keyserver_timeout"}},
		{"keyserver down", "ks-down.test", 0, 0, true, false, want{"1.3", "false", "ecdsa", "keyserver_error"}},
		{"keyserver down 1.2", "ks-down.test", 0, tls.VersionTLS12, true, false, want{"1.2", "false", "ecdsa", "keyserver_error"}},
		{"client alert", "localhost", 0, 0, false, false, want{"1.3", "false", "ecdsa", "client_alert"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			match := map[string]string{"transport": "tcp", "version": tc.want.version, "resumed": tc.want.resumed, "sig": tc.want.sig, "result": tc.want.result}
			before := ts.handshakeCount(t, match)
			err := dial(tc.sni, tc.minV, tc.maxV, tc.roots)
			if (err == nil) != tc.ok {
				t.Fatalf("handshake error %v, want success %v", err, tc.ok)
			}
			waitFor(t, fmt.Sprintf("handshake counted as %v", match), func() bool {
				return ts.handshakeCount(t, match) == before+1
			})
		})
	}

	t.Run("timeout", func(t *testing.T) {
		timeouts := map[string]string{"transport": "tcp", "result": "timeout"}
		before := ts.handshakeCount(t, timeouts)
		c, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := readClosed(c, 8*time.Second); err != nil {
			t.Errorf("half-open connection: %v", err)
		}
		waitFor(t, "timeout counted", func() bool {
			return ts.handshakeCount(t, timeouts) == before+1
		})
	})
	t.Run("protocol", func(t *testing.T) {
		c, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if err := readClosed(c, 8*time.Second); err != nil {
			t.Errorf("plain HTTP on the TLS port: %v", err)
		}
		waitFor(t, "protocol counted", func() bool {
			return ts.handshakeCount(t, map[string]string{"transport": "tcp", "result": "protocol"}) == 1
		})
	})
	t.Run("client closed", func(t *testing.T) {
		c, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		waitFor(t, "client_closed counted", func() bool {
			return ts.handshakeCount(t, map[string]string{"transport": "tcp", "result": "client_closed"}) == 1
		})
	})

	t.Run("resumed", func(t *testing.T) {
		tr := &http.Transport{TLSClientConfig: ts.clientTLS()}
		tr.TLSClientConfig.ClientSessionCache = tls.NewLRUClientSessionCache(8)
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetHTTP1(true)
		c := &http.Client{Transport: tr}
		match := map[string]string{"transport": "tcp", "version": "1.3", "resumed": "true", "sig": "none", "result": "ok"}
		for i := range 2 {
			resp, _ := get(t, c, "GET", ts.url("/"), "")
			if resp.TLS.DidResume != (i == 1) {
				t.Fatalf("request %d: DidResume %v", i, resp.TLS.DidResume)
			}
			tr.CloseIdleConnections()
		}
		waitFor(t, "resumption counted", func() bool { return ts.handshakeCount(t, match) == 1 })
		if n := ts.metricSum(t, "tiergate_tls_handshake_seconds", map[string]string{"listener": "web", "transport": "tcp", "resumed": "true"}); n != 1 {
			t.Errorf("resumed handshakes timed: %v", n)
		}
	})

	t.Run("QUIC", func(t *testing.T) {
		okMatch := map[string]string{"transport": "quic", "version": "1.3", "resumed": "false", "sig": "ecdsa", "result": "ok"}
		before := ts.handshakeCount(t, okMatch)
		timed := ts.metricSum(t, "tiergate_tls_handshake_seconds", map[string]string{"listener": "web", "transport": "quic"})
		if resp, body := get(t, ts.client(t, "3"), "GET", ts.url("/"), ""); resp.StatusCode != 200 {
			t.Fatalf("HTTP/3: %d %s", resp.StatusCode, body)
		}
		waitFor(t, "QUIC handshake counted", func() bool { return ts.handshakeCount(t, okMatch) == before+1 })
		if n := ts.metricSum(t, "tiergate_tls_handshake_seconds", map[string]string{"listener": "web", "transport": "quic"}); n != timed+1 {
			t.Errorf("QUIC handshakes timed: %v, want %v", n, timed+1)
		}

		for _, tc := range []struct {
			sni    string
			roots  bool
			result string
		}{
			{"unknown.test", true, "no_certificate"},
			{"ks-timeout.test", true, "keyserver_timeout"},
			{"localhost", false, "client_alert"},
		} {
			match := map[string]string{"transport": "quic", "version": "1.3", "result": tc.result}
			before := ts.handshakeCount(t, match)
			tc2 := &tls.Config{ServerName: tc.sni, NextProtos: []string{"h3"}}
			if tc.roots {
				tc2.RootCAs = ts.pki.pool
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			conn, err := quic.DialAddr(ctx, ts.addr, tc2, nil)
			cancel()
			if err == nil {
				conn.CloseWithError(0, "")
				t.Fatalf("QUIC %s: handshake succeeded", tc.sni)
			}
			waitFor(t, fmt.Sprintf("QUIC %s counted as %s", tc.sni, tc.result), func() bool {
				return ts.handshakeCount(t, match) == before+1
			})
		}
	})

	total := ts.handshakeCount(t, map[string]string{"result": "ok"})
	if total < 8 {
		t.Errorf("%v successful handshakes counted", total)
	}
}

func TestClassify(t *testing.T) {
	opErr := func(op string, err error) error { return &net.OpError{Op: op, Net: "tcp", Err: err} }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{opErr("remote error", errors.New("tls: bad certificate")), resultClientAlert},
		{opErr("local error", errors.New("tls: no application protocol")), resultProtocol},
		{tls.RecordHeaderError{Msg: "tls: first record does not look like a TLS handshake"}, resultProtocol},
		{opErr("read", os.ErrDeadlineExceeded), resultTimeout},
		{context.DeadlineExceeded, resultTimeout},
		{io.EOF, resultClientClosed},
		{opErr("read", syscall.ECONNRESET), resultClientClosed},
		{errors.New("tls: invalid client key share"), resultProtocol},
		{errors.New("x509: something new"), resultOther},
	} {
		if got := classifyTLSError(tc.err); got != tc.want {
			t.Errorf("classifyTLSError(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&quic.HandshakeTimeoutError{}, resultTimeout},
		{&quic.IdleTimeoutError{}, resultTimeout},
		{&quic.TransportError{Remote: true, ErrorCode: 0x12a}, resultClientAlert},
		{&quic.TransportError{Remote: true, ErrorCode: quic.ProtocolViolation}, resultClientClosed},
		{&quic.TransportError{ErrorCode: 0x178}, resultProtocol},
		{&quic.ApplicationError{Remote: true}, resultClientClosed},
		{quic.ErrServerClosed, resultOther},
	} {
		if got := classifyQUICError(tc.err); got != tc.want {
			t.Errorf("classifyQUICError(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	noCert := func(err error) bool { return errors.Is(err, errTestNoCert) }
	for _, tc := range []struct {
		err      error
		isNoCert func(error) bool
		want     string
	}{
		{errTestNoCert, noCert, resultNoCertificate},
		{errors.New("store down"), noCert, resultOther},
		{errors.New("anything"), nil, resultNoCertificate},
		{&client.OpError{Op: protocol.OpPublicKey, Err: client.ErrTimeout}, noCert, resultKeyserverTimeout},
		{fmt.Errorf("loading: %w", &client.OpError{Op: protocol.OpPublicKey, Err: client.ErrUnavailable}), noCert, resultKeyserverError},
		{protocol.ErrKeyNotFound, nil, resultKeyserverError},
	} {
		if got := classifyCertError(tc.err, tc.isNoCert); got != tc.want {
			t.Errorf("classifyCertError(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	if got := classifyKeyError(errors.New("hsm: device error")); got != resultKeyserverError {
		t.Errorf("a signer's own error: %s", got)
	}
}

// TestResumptionAcrossReload uses a base config that seals tickets itself, as the
// certs package does (WrapSession/UnwrapSession over its own keys): sessions resume
// after a Reload that brings a new base config with the same keys.
func TestResumptionAcrossReload(t *testing.T) {
	b := startBackend(t, "b1")
	keys := &tls.Config{}
	keys.SetSessionTicketKeys([][32]byte{{1, 2, 3}})
	sealed := func() *tls.Config {
		return &tls.Config{
			Certificates:  []tls.Certificate{getPKI(t).leaf},
			WrapSession:   keys.EncryptTicket,
			UnwrapSession: keys.DecryptTicket,
		}
	}
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].TLS = sealed()
	ts := startServer(t, cfg)

	cache := tls.NewLRUClientSessionCache(8)
	for _, proto := range []string{"1.1", "2"} {
		tr := &http.Transport{TLSClientConfig: ts.clientTLS()}
		tr.TLSClientConfig.ClientSessionCache = cache
		tr.Protocols = new(http.Protocols)
		if proto == "1.1" {
			tr.Protocols.SetHTTP1(true)
		} else {
			tr.Protocols.SetHTTP2(true)
		}
		c := &http.Client{Transport: tr}
		resp, _ := get(t, c, "GET", ts.url("/"), "")
		tr.CloseIdleConnections()
		if proto == "1.1" && resp.TLS.DidResume {
			t.Fatalf("first connection resumed")
		}
		next := baseConfig(t, b.addr)
		next.Listeners[0].TLS = sealed()
		if err := ts.Reload(next); err != nil {
			t.Fatal(err)
		}
		resp, _ = get(t, c, "GET", ts.url("/"), "")
		tr.CloseIdleConnections()
		if !resp.TLS.DidResume {
			t.Errorf("HTTP/%s: no resumption after a reload", proto)
		}
	}
}
