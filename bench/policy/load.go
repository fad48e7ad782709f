package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// request is what every operation sends: a GET that keeps the connection open.
var request = []byte("GET " + requestPath + " HTTP/1.1\r\nHost: " + siteName + "\r\nUser-Agent: tiergate-bench-policy\r\nAccept: */*\r\n\r\n")

// Bounds on what a response may hold.
const (
	maxHeaderLine = 8 << 10
	maxHeaders    = 64
	maxBody       = 64 << 10
)

// clientConfig is the load's TLS configuration: TLS 1.3 only, ECDHE over X25519 only
// (no hybrid post-quantum key share, which the OpenSSL 3.0 of nginx and haproxy
// lacks), HTTP/1.1 by ALPN, and the chain verified against the site CA on every
// connection (connections are few: keep-alive).
func clientConfig(fx *fixture) *tls.Config {
	return &tls.Config{
		ServerName:       siteName,
		RootCAs:          fx.ca.Pool(),
		MinVersion:       tls.VersionTLS13,
		MaxVersion:       tls.VersionTLS13,
		CurvePreferences: []tls.CurveID{tls.X25519},
		NextProtos:       []string{"http/1.1"},
	}
}

// conn is one keep-alive connection of the load.
type conn struct {
	tc   *tls.Conn
	br   *bufio.Reader
	body []byte
}

// client is the load of one row: each worker owns a keep-alive connection and makes
// one request at a time on it, reading the whole answer before the next. A
// connection that fails or that the server closes is dialled again by its worker's
// next operation.
type client struct {
	addr    string
	cfg     *tls.Config
	timeout time.Duration
	conns   []*conn

	mu      sync.Mutex
	dials   []int64 // when each connection was established, Unix ns
	peerKey crypto.PublicKey
	bad     atomic.Int64 // answers that were not the backend's
	closed  atomic.Int64 // connections the server closed
}

func newClient(addr string, fx *fixture, workers int, timeout time.Duration) *client {
	return &client{addr: addr, cfg: clientConfig(fx), timeout: timeout, conns: make([]*conn, workers)}
}

// op is the benchkit operation: one request and its answer, checked.
func (c *client) op(ctx context.Context, w int, _ uint64) error {
	cn := c.conns[w]
	if cn == nil {
		var err error
		if cn, err = c.dial(ctx); err != nil {
			return err
		}
		c.conns[w] = cn
	}
	if err := cn.tc.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		c.drop(w)
		return err
	}
	if _, err := cn.tc.Write(request); err != nil {
		c.drop(w)
		return fmt.Errorf("sending the request: %w", err)
	}
	resp, err := readResponse(cn.br, cn.body)
	if err != nil {
		c.drop(w)
		if errors.Is(err, io.EOF) {
			c.closed.Add(1)
		}
		return fmt.Errorf("reading the answer: %w", err)
	}
	if resp.closeConn {
		c.drop(w)
		c.closed.Add(1)
	}
	switch {
	case resp.status != 200:
		c.bad.Add(1)
		return fmt.Errorf("status %d, want 200", resp.status)
	case !bytes.Equal(resp.body, body):
		c.bad.Add(1)
		return fmt.Errorf("a body of %d bytes that is not the backend's %d", len(resp.body), len(body))
	}
	return nil
}

// dial connects and checks what the TLS handshake negotiated.
func (c *client) dial(ctx context.Context) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: c.cfg}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	tc := nc.(*tls.Conn)
	st := tc.ConnectionState()
	if err := checkState(&st); err != nil {
		tc.Close()
		c.bad.Add(1)
		return nil, err
	}
	c.mu.Lock()
	c.dials = append(c.dials, time.Now().UnixNano())
	c.peerKey = st.PeerCertificates[0].PublicKey
	c.mu.Unlock()
	return &conn{tc: tc, br: bufio.NewReaderSize(tc, maxHeaderLine), body: make([]byte, maxBody)}, nil
}

// checkState checks that a connection negotiated what every proxy is held to.
func checkState(st *tls.ConnectionState) error {
	switch {
	case st.Version != tls.VersionTLS13:
		return fmt.Errorf("negotiated %s, want TLS 1.3", tls.VersionName(st.Version))
	case st.CipherSuite != tlsSuite:
		return fmt.Errorf("negotiated %s, want %s", tls.CipherSuiteName(st.CipherSuite), tlsSuiteName)
	case st.CurveID != tls.X25519:
		return fmt.Errorf("key exchange over %v, want X25519", st.CurveID)
	case st.NegotiatedProtocol != "" && st.NegotiatedProtocol != "http/1.1":
		return fmt.Errorf("ALPN chose %q, want http/1.1", st.NegotiatedProtocol)
	case len(st.PeerCertificates) == 0:
		return errors.New("no peer certificate")
	}
	return nil
}

func (c *client) drop(w int) {
	if cn := c.conns[w]; cn != nil {
		cn.tc.Close()
		c.conns[w] = nil
	}
}

// close closes every connection; call it once the load has stopped.
func (c *client) close() {
	for w := range c.conns {
		c.drop(w)
	}
}

// dialsBetween counts the connections established between two instants.
func (c *client) dialsBetween(t0, t1 time.Time) (in, all int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.dials {
		if d >= t0.UnixNano() && d <= t1.UnixNano() {
			in++
		}
	}
	return in, len(c.dials)
}

// response is what readResponse read: the body aliases the buffer it was given.
type response struct {
	status    int
	body      []byte
	closeConn bool
}

// readResponse reads one HTTP/1.1 response with a Content-Length body into buf. It
// refuses chunked bodies and bodies larger than buf; closeConn says that the
// connection cannot carry another request.
func readResponse(br *bufio.Reader, buf []byte) (response, error) {
	var r response
	line, err := br.ReadSlice('\n')
	if err != nil {
		return r, err
	}
	line = bytes.TrimRight(line, "\r\n")
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return r, fmt.Errorf("bad status line %q", line)
	}
	if r.status, err = strconv.Atoi(string(line[9:12])); err != nil || r.status < 100 {
		return r, fmt.Errorf("bad status line %q", line)
	}
	r.closeConn = line[7] == '0' // HTTP/1.0 without keep-alive
	length := -1
	for n := 0; ; n++ {
		if n > maxHeaders {
			return r, fmt.Errorf("more than %d header lines", maxHeaders)
		}
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return r, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return r, fmt.Errorf("bad header line %q", line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case equalFold(name, "Content-Length"):
			v, err := strconv.Atoi(string(value))
			if err != nil || v < 0 || (length >= 0 && v != length) {
				return r, fmt.Errorf("bad Content-Length %q", value)
			}
			length = v
		case equalFold(name, "Transfer-Encoding"):
			return r, fmt.Errorf("a %s body; want Content-Length", value)
		case equalFold(name, "Connection"):
			for _, tok := range bytes.Split(value, []byte(",")) {
				switch tok = bytes.TrimSpace(tok); {
				case equalFold(tok, "close"):
					r.closeConn = true
				case equalFold(tok, "keep-alive"):
					r.closeConn = false
				}
			}
		}
	}
	if length < 0 {
		return r, errors.New("no Content-Length")
	}
	if length > len(buf) {
		return r, fmt.Errorf("a body of %d bytes, over %d", length, len(buf))
	}
	if _, err := io.ReadFull(br, buf[:length]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return r, err
	}
	r.body = buf[:length]
	return r, nil
}

// equalFold is bytes.EqualFold against an ASCII string, without allocating.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
