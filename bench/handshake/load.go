package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// The key exchange and cipher suites every handshake must negotiate.
const (
	wantCurve   = tls.X25519
	suiteTLS12  = tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
	suiteTLS13  = tls.TLS_AES_128_GCM_SHA256
	maxDrain    = 64 << 10 // what a client reads while waiting for the server's close
	sessionKeep = 4        // sessions each worker's cache keeps (one server name)
)

// clientConfig is the load's client configuration at version: ECDHE over X25519 only
// (no hybrid post-quantum key share, which nginx's OpenSSL 3.0 lacks), the one cipher
// suite of each version with AES-128-GCM, and a session cache that never holds a
// session (firstVisit). The chain is not verified on every handshake; client.verify
// checks a sample against the CA.
func clientConfig(version uint16) *tls.Config {
	cfg := &tls.Config{
		ServerName:         siteName,
		InsecureSkipVerify: true,
		MinVersion:         version,
		MaxVersion:         version,
		CurvePreferences:   []tls.CurveID{wantCurve},
		ClientSessionCache: firstVisit{},
	}
	if version == tls.VersionTLS12 {
		cfg.CipherSuites = []uint16{suiteTLS12}
	}
	return cfg
}

// firstVisit is the session cache of full-handshake rows: it forgets every session,
// so no handshake resumes, while the client still announces that it takes tickets (a
// browser's first visit). Without any cache, crypto/tls would announce neither the
// TLS 1.2 ticket extension nor TLS 1.3 PSK modes, and crypto/tls servers (l7d) would
// skip the TLS 1.3 ticket that OpenSSL (nginx) sends anyway: the rows would not do the
// same work.
type firstVisit struct{}

func (firstVisit) Get(string) (*tls.ClientSessionState, bool) { return nil, false }
func (firstVisit) Put(string, *tls.ClientSessionState)        {}

// checkState checks what a handshake negotiated. A resumed TLS 1.2 handshake makes no
// key exchange.
func checkState(st *tls.ConnectionState, version uint16, resumeRow bool) error {
	want := suiteTLS13
	if version == tls.VersionTLS12 {
		want = suiteTLS12
	}
	switch {
	case !st.HandshakeComplete:
		return errors.New("handshake not complete")
	case st.Version != version:
		return fmt.Errorf("negotiated %s, want %s", tls.VersionName(st.Version), tls.VersionName(version))
	case st.CipherSuite != want:
		return fmt.Errorf("negotiated %s, want %s", tls.CipherSuiteName(st.CipherSuite), tls.CipherSuiteName(want))
	case st.DidResume && !resumeRow:
		return errors.New("resumed a session in a full-handshake row")
	case !(st.DidResume && version == tls.VersionTLS12) && st.CurveID != wantCurve:
		return fmt.Errorf("key exchange over %v, want %v", st.CurveID, wantCurve)
	case len(st.PeerCertificates) == 0:
		return errors.New("no peer certificate")
	}
	return nil
}

// record is one completed operation, as the client saw it.
type record struct {
	end       int64         // Unix ns
	handshake time.Duration // from the start of the TCP connect to the handshake's end
	total     time.Duration // to the connection's end: the response read, or the server's close
	bytes     int           // bytes the server sent: handshake, ticket, close_notify
	resumed   bool
}

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	n int
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n += n
	return n, err
}

// client is the load of one row: each operation connects, makes a TLS handshake,
// sends close_notify and reads until the server closes, then closes. Reading is what
// makes the client process a TLS 1.3 session ticket (sent after the handshake), so it
// is done in every row, against every server, resumed or not; no HTTP request is
// made. For resumed rows each worker keeps a session cache of its own: its first
// handshake is full, the next ones resume.
type client struct {
	addr        string
	version     uint16
	resume      bool
	timeout     time.Duration
	verifyEvery uint64
	roots       *x509.CertPool

	request bool // each connection makes one HTTP/1.1 request after the handshake (requestOp)

	cfgs     []*tls.Config // per worker
	records  [][]record    // per worker
	verified atomic.Int64
	bad      atomic.Int64 // handshakes that negotiated something else, or failed verification
}

func newClient(addr string, version uint16, resume bool, workers int, timeout time.Duration, verifyEvery int, roots *x509.CertPool) *client {
	c := &client{
		addr: addr, version: version, resume: resume, timeout: timeout,
		verifyEvery: uint64(verifyEvery), roots: roots,
		cfgs: make([]*tls.Config, workers), records: make([][]record, workers),
	}
	base := clientConfig(version)
	for w := range c.cfgs {
		cfg := base.Clone()
		if resume { // firstVisit otherwise
			cfg.ClientSessionCache = tls.NewLRUClientSessionCache(sessionKeep)
		}
		c.cfgs[w] = cfg
	}
	return c
}

// op is the benchkit operation.
func (c *client) op(ctx context.Context, w int, seq uint64) error {
	start := time.Now()
	deadline := start.Add(c.timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return err
	}
	defer raw.Close()
	if err := raw.SetDeadline(deadline); err != nil {
		return err
	}
	cc := &countingConn{Conn: raw}
	tc := tls.Client(cc, c.cfgs[w])
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	hsDone := time.Now()
	st := tc.ConnectionState()
	if err := checkState(&st, c.version, c.resume); err != nil {
		c.bad.Add(1)
		return err
	}
	if seq%c.verifyEvery == 0 {
		if err := c.verify(&st); err != nil {
			c.bad.Add(1)
			return err
		}
	}
	if c.request {
		// As h2load --h1 does: one kept-alive request, its response read, then the
		// client closes (close_notify, FIN).
		if err := getOK(tc); err != nil {
			return err
		}
		end := time.Now()
		tc.Close()
		c.records[w] = append(c.records[w], record{end: end.UnixNano(), handshake: hsDone.Sub(start), total: end.Sub(start), bytes: cc.n, resumed: st.DidResume})
		return nil
	}
	if err := tc.CloseWrite(); err != nil {
		return fmt.Errorf("sending close_notify: %w", err)
	}
	// The server answers with close_notify (io.EOF here) or closes TCP without it, as
	// nginx does after the client's close_notify (io.ErrUnexpectedEOF).
	n, err := io.Copy(io.Discard, io.LimitReader(tc, maxDrain))
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("waiting for the server to close: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("the server sent %d bytes of application data", n)
	}
	end := time.Now()
	c.records[w] = append(c.records[w], record{end: end.UnixNano(), handshake: hsDone.Sub(start), total: end.Sub(start), bytes: cc.n, resumed: st.DidResume})
	return nil
}

// getRequest is the request of the rows with one: HTTP/1.1, kept alive, as a browser
// or h2load sends it.
const getRequest = "GET / HTTP/1.1\r\nHost: " + siteName + "\r\nUser-Agent: bench-handshake\r\nAccept: */*\r\n\r\n"

// getOK sends getRequest on tc and reads the response, which must be 200 with
// okBody.
func getOK(tc *tls.Conn) error {
	if _, err := io.WriteString(tc, getRequest); err != nil {
		return fmt.Errorf("sending the request: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(tc, 1024), nil)
	if err != nil {
		return fmt.Errorf("reading the response: %w", err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the response body: %w", err)
	}
	if resp.StatusCode != http.StatusOK || string(body) != okBody {
		return fmt.Errorf("answered %d %q, want 200 %q", resp.StatusCode, body, okBody)
	}
	return nil
}

// verify checks the chain the server sent against the site CA and name.
func (c *client) verify(st *tls.ConnectionState) error {
	opts := x509.VerifyOptions{Roots: c.roots, DNSName: siteName, Intermediates: x509.NewCertPool()}
	for _, ic := range st.PeerCertificates[1:] {
		opts.Intermediates.AddCert(ic)
	}
	if _, err := st.PeerCertificates[0].Verify(opts); err != nil {
		return fmt.Errorf("certificate chain: %w", err)
	}
	c.verified.Add(1)
	return nil
}

// window sums the operations that ended in res's window.
type window struct {
	ops, resumed int
	bytes        int // bytes the servers sent
	handshakes   benchkit.Latencies
	conns        benchkit.Latencies // each connection's whole time (record.total)
}

func (c *client) window(res *benchkit.Result) window {
	return c.between(res.Start.UnixNano(), res.Start.Add(res.Elapsed).UnixNano())
}

// between sums the operations that ended from t0 to t1 (Unix ns).
func (c *client) between(t0, t1 int64) window {
	var w window
	var lat, total []time.Duration
	for _, rs := range c.records {
		for _, r := range rs {
			if r.end < t0 || r.end > t1 {
				continue
			}
			w.ops++
			w.bytes += r.bytes
			if r.resumed {
				w.resumed++
			}
			lat = append(lat, r.handshake)
			total = append(total, r.total)
		}
	}
	w.handshakes = benchkit.NewLatencies(slices.Clip(lat))
	w.conns = benchkit.NewLatencies(slices.Clip(total))
	return w
}
