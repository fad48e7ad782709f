package l7

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/testkit/testpki"
)

// pki is the test certificate hierarchy: one CA, and a leaf for localhost and
// 127.0.0.1.
type pki struct {
	ca   *testpki.CA
	leaf tls.Certificate
	pool *x509.CertPool
}

var (
	pkiOnce sync.Once
	testPKI *pki
	pkiErr  error
)

func getPKI(t testing.TB) *pki {
	t.Helper()
	pkiOnce.Do(func() {
		ca, err := testpki.NewCA("l7 test CA")
		if err != nil {
			pkiErr = err
			return
		}
		leaf, err := ca.Leaf("localhost", "localhost", "127.0.0.1")
		if err != nil {
			pkiErr = err
			return
		}
		testPKI = &pki{ca: ca, leaf: leaf, pool: ca.Pool()}
	})
	if pkiErr != nil {
		t.Fatal(pkiErr)
	}
	return testPKI
}

// echo is what the test backend answers: what it saw of the request.
type echo struct {
	Method  string `json:"method"`
	URI     string `json:"uri"`
	Host    string `json:"host"`
	Proto   string `json:"proto"`
	XFF     string `json:"xff"`
	RealIP  string `json:"real_ip"`
	XFProto string `json:"xf_proto"`
	Body    string `json:"body"`
	Conn    string `json:"connection"`
	Hop     string `json:"hop"`
	Backend string `json:"backend"`
}

// backend is a net/http server on 127.0.0.1 answering with an echo. /slow?d=DUR
// sleeps first, announcing the request on arrived.
type backend struct {
	name    string
	addr    string
	srv     *http.Server
	arrived chan string
}

func startBackend(t testing.TB, name string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, addr: ln.Addr().String(), arrived: make(chan string, 64)}
	b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 5 * time.Second}
	go b.srv.Serve(ln)
	t.Cleanup(func() { b.srv.Close() })
	return b
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/big":
		serveBig(w, r)
		return
	case "/sink":
		serveSink(w, r)
		return
	case "/cut":
		// Half the body its length promises, then the connection is dropped.
		w.Header().Set("Content-Length", "1048576")
		_, _ = io.Copy(w, &patternReader{n: 512 << 10})
		panic(http.ErrAbortHandler)
	}
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/slow" {
		d, _ := time.ParseDuration(r.URL.Query().Get("d"))
		select {
		case b.arrived <- r.URL.RawQuery:
		default:
		}
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	if r.URL.Path == "/header" {
		w.Header().Set("Connection", "X-Secret")
		w.Header().Set("X-Secret", "hop")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Alt-Svc", `h3=":1"`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Backend", b.name)
	json.NewEncoder(w).Encode(echo{
		Method: r.Method, URI: r.RequestURI, Host: r.Host, Proto: r.Proto,
		XFF: strings.Join(r.Header.Values("X-Forwarded-For"), "|"), RealIP: r.Header.Get("X-Real-IP"),
		XFProto: r.Header.Get("X-Forwarded-Proto"), Body: string(body),
		Conn: r.Header.Get("Connection"), Hop: r.Header.Get("X-Hop"), Backend: b.name,
	})
}

// testServer is an l7 Server on 127.0.0.1:0 with one listener "web" and pool "app".
type testServer struct {
	*Server
	reg  *prometheus.Registry
	addr string // TCP (and UDP) address
	port int
	pki  *pki
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("L7_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func baseConfig(t testing.TB, members ...string) Config {
	p := getPKI(t)
	return Config{
		Listeners: []ListenerConfig{{
			Listener: Listener{Name: "web", Addr: "127.0.0.1:0", Pool: "app"},
			TLS:      &tls.Config{Certificates: []tls.Certificate{p.leaf}},
		}},
		Backends: map[string]PoolConfig{"app": {Members: members}},
		Logger:   testLogger(t),
	}
}

func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	addr := s.Addrs()["web"].String()
	_, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	return &testServer{Server: s, reg: reg, addr: addr, port: n, pki: getPKI(t)}
}

func (ts *testServer) url(path string) string { return "https://" + ts.addr + path }

func (ts *testServer) clientTLS() *tls.Config {
	return &tls.Config{RootCAs: ts.pki.pool, ServerName: "localhost"}
}

// client returns an HTTP client speaking proto ("1.1", "2" or "3") to ts.
func (ts *testServer) client(t testing.TB, proto string) *http.Client {
	t.Helper()
	var rt http.RoundTripper
	switch proto {
	case "1.1":
		tr := &http.Transport{TLSClientConfig: ts.clientTLS()}
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetHTTP1(true)
		t.Cleanup(tr.CloseIdleConnections)
		rt = tr
	case "2":
		tr := &http.Transport{TLSClientConfig: ts.clientTLS()}
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetHTTP2(true)
		t.Cleanup(tr.CloseIdleConnections)
		rt = tr
	case "3":
		tr := &http3.Transport{TLSClientConfig: ts.clientTLS()}
		t.Cleanup(func() { tr.Close() })
		rt = tr
	default:
		t.Fatalf("no protocol %q", proto)
	}
	return &http.Client{Transport: rt, Timeout: 10 * time.Second}
}

// get makes a request and returns the response with its body read.
func get(t testing.TB, c *http.Client, method, url, body string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return resp, b
}

func decodeEcho(t testing.TB, b []byte) echo {
	t.Helper()
	var e echo
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("backend answer %q: %v", b, err)
	}
	return e
}

// waitFor polls cond until it holds or 5s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func counter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

func (ts *testServer) requests(route, code string) float64 {
	return counter(ts.m.requests.WithLabelValues(route, code))
}

func (ts *testServer) conns(proto string) float64 {
	return counter(ts.m.conns.WithLabelValues("web", proto))
}

// closedPort returns a 127.0.0.1 address nothing listens on.
func closedPort(t testing.TB) string {
	// A socket bound but not listening holds the port for the whole test, so no
	// other test can take it, and every connection to it is refused.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// readClosed reports whether the peer closes c within d, reading and discarding what
// it sends meanwhile.
func readClosed(c net.Conn, d time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("still open after %v", d)
		}
		return nil
	}
}
