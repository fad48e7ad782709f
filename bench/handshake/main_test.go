package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/testkit/testpki"
)

func TestParseList(t *testing.T) {
	got, err := benchkit.ParseList("nginx, l7d-local", serverNames)
	if err != nil || !slices.Equal(got, []string{srvL7Local, srvNginx}) {
		t.Errorf("got %v, %v; want the known order", got, err)
	}
	if _, err := benchkit.ParseList("nginx,haproxy", serverNames); err == nil || !strings.Contains(err.Error(), `"haproxy"`) {
		t.Errorf("unknown server: %v", err)
	}
}

func TestParseVersions(t *testing.T) {
	got, err := parseVersions("1.2, 1.3")
	if err != nil || !slices.Equal(got, []uint16{tls.VersionTLS12, tls.VersionTLS13}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "1.1", "1.3,1.3", "tls1.3"} {
		if _, err := parseVersions(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestMainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-duration", "0s"},
		{"-workers", "0"},
		{"-warmup", "-1s"},
		{"-servers", "bogus"},
		{"-modes", "half"},
		{"-tls", "1.0"},
		{"-servers", "go-tls"}, // a profiling baseline without -profile
		{"extra"},
	} {
		if code := Main(args, io.Discard, io.Discard); code != 2 {
			t.Errorf("%v: exit status %d, want 2", args, code)
		}
	}
}

func TestParseNginxV(t *testing.T) {
	out := "nginx version: nginx/1.22.1\nbuilt with OpenSSL 3.0.22 25 Aug 2026 (running with OpenSSL 3.0.19 27 Jan 2026)\nTLS SNI support enabled\n"
	v, ssl := parseNginxV(out)
	if v != "nginx/1.22.1" || ssl != "OpenSSL 3.0.19" {
		t.Errorf("got %q, %q", v, ssl)
	}
	if _, ssl := parseNginxV("nginx version: nginx/1.25.0\nbuilt with OpenSSL 3.1.0 14 Mar 2023\n"); ssl != "OpenSSL 3.1.0" {
		t.Errorf("without a running-with note: %q", ssl)
	}
}

func TestParseMetrics(t *testing.T) {
	in := `# HELP tiergate_tls_handshakes_total TLS handshakes
# TYPE tiergate_tls_handshakes_total counter
tiergate_tls_handshakes_total{listener="bench",result="ok",resumed="false",sig="rsa",version="TLS 1.3"} 120
tiergate_tls_handshakes_total{listener="bench",result="ok",resumed="true",sig="none",version="TLS 1.3"} 30
tiergate_tls_handshakes_total{listener="bench",result="client_closed",resumed="false",sig="rsa",version="TLS 1.3"} 2
tiergate_keyserver_ops_total{op="sign",result="ok"} 118
tiergate_keyserver_ops_total{op="sign",result="timeout"} 1
tiergate_tls_handshake_seconds_bucket{listener="bench",resumed="false",le="0.001"} 5
go_gc_duration_seconds_count 7
go_memstats_alloc_bytes_total 1.2345e+07
tiergate_runtime_gomaxprocs 1
tiergate_runtime_gomaxprocs_changes_total{direction="up"} 4
`
	d, err := parseMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	got := *d
	got.procs = benchkit.Procs{N: d.procs.N, Changes: d.procs.Changes} // the time read aside
	if got != (scrapeDelta{hsOK: 150, hsFailed: 2, ksOK: 118, ksFailed: 1, allocBytes: 12345000, gcCycles: 7, procs: benchkit.Procs{N: 1, Changes: 4}}) {
		t.Errorf("got %+v", *d)
	}
	if kb, gc, ok := d.perHandshake(); !ok || math.Abs(gc-46.667) > 0.001 || math.Abs(kb-80.371) > 0.001 {
		t.Errorf("per handshake %v KB, %v GC, %v", kb, gc, ok)
	}
	if _, err := parseMetrics(strings.NewReader(`tiergate_keyserver_ops_total{op="sign",result="ok"} x`)); err == nil {
		t.Error("a bad value was accepted")
	}
}

// TestNginxConfig checks the configuration with nginx -t when nginx is installed.
func TestNginxConfig(t *testing.T) {
	dir := t.TempDir()
	f, err := newFixtureCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	conf := nginxConfig(dir, "127.0.0.1:8443", f.siteCert, f.siteKey, 2)
	for _, want := range []string{
		"daemon off;", "master_process on;", "worker_processes 2;", "listen 127.0.0.1:8443 ssl deferred;",
		"ssl_protocols TLSv1.2 TLSv1.3;", "ssl_session_cache off;", "ssl_session_tickets on;", "access_log off;",
		"pid " + filepath.Join(dir, "nginx.pid") + ";",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("configuration lacks %q", want)
		}
	}
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		if os.Getenv("TIERGATE_REQUIRE_ALL") != "" {
			t.Fatal("nginx is not installed (Debian package nginx; make deps)")
		}
		t.Skip("nginx is not installed (Debian package nginx; make deps)")
	}
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(nginx, "-t", "-c", path, "-p", dir+"/", "-e", filepath.Join(dir, "error.log")).CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
}

// newFixtureCerts is the certificate part of newFixture, without the token.
func newFixtureCerts(dir string) (*fixture, error) {
	f := &fixture{dir: dir}
	f.siteCert = filepath.Join(dir, "site.pem")
	f.siteKey = filepath.Join(dir, "site.key")
	site, err := testSite()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(f.siteCert, site.certPEM, 0o600); err != nil {
		return nil, err
	}
	return f, os.WriteFile(f.siteKey, site.keyPEM, 0o600)
}

// TestClientOp runs the load's operation against a crypto/tls server: every row's
// handshakes check out, full rows never resume and resumed rows do from the second
// handshake of each worker on.
func TestClientOp(t *testing.T) {
	site, err := testSite()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(site.certPEM, site.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var tickets atomic.Int64
	srvCfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	srvCfg.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		tickets.Add(1)
		return srvCfg.EncryptTicket(cs, ss)
	}
	go func() { done <- serveHandshakes(ctx, ln, srvCfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	roots := site.roots

	for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		for _, resume := range []bool{false, true} {
			c := newClient(ln.Addr().String(), v, resume, 2, 5*time.Second, 2, roots)
			tickets.Store(0)
			start := time.Now()
			for w := range 2 {
				for seq := range uint64(3) {
					if err := c.op(ctx, w, seq); err != nil {
						t.Fatalf("%s resume=%v: worker %d op %d: %v", tls.VersionName(v), resume, w, seq, err)
					}
				}
			}
			res := &benchkit.Result{Start: start, Elapsed: time.Since(start)}
			win := c.window(res)
			wantResumed := 0
			if resume {
				wantResumed = 4 // all but each worker's first
			}
			if win.ops != 6 || win.resumed != wantResumed || c.verified.Load() != 4 || c.bad.Load() != 0 {
				t.Errorf("%s resume=%v: %d ops, %d resumed, %d verified, %d bad; want 6, %d, 4, 0",
					tls.VersionName(v), resume, win.ops, win.resumed, c.verified.Load(), c.bad.Load(), wantResumed)
			}
			// Full rows too take a ticket (firstVisit), as browsers do.
			if n := tickets.Load(); n < 6 {
				t.Errorf("%s resume=%v: the server sealed %d tickets for 6 handshakes", tls.VersionName(v), resume, n)
			}
			if win.bytes < 6*500 {
				t.Errorf("%s: %d bytes from the server over 6 connections: the certificate alone is larger", tls.VersionName(v), win.bytes)
			}
			if n := len(win.handshakes); n != 6 {
				t.Errorf("%d latencies, want 6", n)
			}
			if len(win.conns) != 6 || win.conns.Percentile(50) < win.handshakes.Percentile(50) || win.conns.Percentile(100) > time.Since(start) {
				t.Errorf("connection times %v against handshake times %v: want 6, each past its handshake and within the test", win.conns, win.handshakes)
			}
			empty := c.window(&benchkit.Result{Start: time.Now().Add(time.Hour), Elapsed: time.Second})
			if empty.ops != 0 {
				t.Errorf("%d operations counted in a window after them", empty.ops)
			}
		}
	}
}

func TestCheckState(t *testing.T) {
	site, err := testSite()
	if err != nil {
		t.Fatal(err)
	}
	good := tls.ConnectionState{HandshakeComplete: true, Version: tls.VersionTLS13, CipherSuite: suiteTLS13,
		CurveID: tls.X25519, PeerCertificates: []*x509.Certificate{site.leaf}}
	for _, tc := range []struct {
		name    string
		change  func(*tls.ConnectionState)
		version uint16
		resume  bool
		err     string
	}{
		{"good", func(*tls.ConnectionState) {}, tls.VersionTLS13, false, ""},
		{"version", func(*tls.ConnectionState) {}, tls.VersionTLS12, false, "negotiated TLS 1.3, want TLS 1.2"},
		{"suite", func(st *tls.ConnectionState) { st.CipherSuite = tls.TLS_AES_256_GCM_SHA384 }, tls.VersionTLS13, false, "TLS_AES_256_GCM_SHA384"},
		{"group", func(st *tls.ConnectionState) { st.CurveID = tls.X25519MLKEM768 }, tls.VersionTLS13, false, "key exchange"},
		{"resumed in a full row", func(st *tls.ConnectionState) { st.DidResume = true }, tls.VersionTLS13, false, "resumed"},
		{"resumed", func(st *tls.ConnectionState) { st.DidResume = true }, tls.VersionTLS13, true, ""},
		{"TLS 1.2 resumed without key exchange", func(st *tls.ConnectionState) {
			st.Version, st.CipherSuite, st.CurveID, st.DidResume = tls.VersionTLS12, suiteTLS12, 0, true
		}, tls.VersionTLS12, true, ""},
		{"TLS 1.2 full without key exchange", func(st *tls.ConnectionState) {
			st.Version, st.CipherSuite, st.CurveID = tls.VersionTLS12, suiteTLS12, 0
		}, tls.VersionTLS12, false, "key exchange"},
		{"no certificate", func(st *tls.ConnectionState) { st.PeerCertificates = nil }, tls.VersionTLS13, false, "no peer certificate"},
	} {
		st := good
		tc.change(&st)
		err := checkState(&st, tc.version, tc.resume)
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

type siteFiles struct {
	certPEM, keyPEM []byte
	leaf            *x509.Certificate
	roots           *x509.CertPool
}

var (
	siteOnce sync.Once
	siteVal  *siteFiles
	siteErr  error
)

// testSite is an RSA-2048 certificate for siteName and 127.0.0.1 from a test CA, made
// once for every test.
func testSite() (*siteFiles, error) {
	siteOnce.Do(func() {
		ca, err := testpki.NewCA("test site CA")
		if err != nil {
			siteErr = err
			return
		}
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			siteErr = err
			return
		}
		leaf, der, err := ca.Issue(siteName, key.Public(), siteName, "127.0.0.1")
		if err != nil {
			siteErr = err
			return
		}
		keyPEM, err := testpki.KeyPEM(key)
		if err != nil {
			siteErr = err
			return
		}
		siteVal = &siteFiles{
			certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			keyPEM:  keyPEM, leaf: leaf, roots: ca.Pool(),
		}
	})
	return siteVal, siteErr
}

func TestParseH2load(t *testing.T) {
	out := `TLS Protocol: TLSv1.3
Cipher: TLS_AES_128_GCM_SHA256
Server Temp Key: X25519 253 bits
Application protocol: http/1.1

finished in 2.11s, 113.18 req/s, 13.15KB/s
requests: 2000 total, 1999 started, 1998 done, 1997 succeeded, 3 failed, 3 errored, 0 timeout
status codes: 1997 2xx, 0 3xx, 0 4xx, 0 5xx
`
	ok, failed, err := parseH2load(out)
	if err != nil || ok != 1997 || failed != 3 {
		t.Errorf("got %d ok, %d failed, %v; want 1997, 3", ok, failed, err)
	}
	for _, bad := range []string{
		strings.Replace(out, "TLSv1.3", "TLSv1.2", 1),
		strings.Replace(out, "X25519", "P-256", 1),
		strings.Replace(out, "requests:", "reqs:", 1),
		strings.Replace(out, "status codes:", "codes:", 1),
	} {
		if _, _, err := parseH2load(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestParseSTime(t *testing.T) {
	out := "Collecting connection statistics for 3 seconds\n" +
		"tttttttt\n\n1052 connections in 2.87s; 366.55 connections/user sec, bytes read 0\n" +
		"1052 connections in 3 real seconds, 0 bytes read per connection\n"
	n, secs, err := parseSTime(out)
	if err != nil || n != 1052 || secs != 3 {
		t.Errorf("got %d, %d, %v", n, secs, err)
	}
	if _, _, err := parseSTime("ERROR\n"); err == nil {
		t.Error("accepted an output without a count")
	}
}

func TestParseShapes(t *testing.T) {
	all := matrixShapes(2000)
	got, err := parseShapes("poisson, sequential,burst2000_h2load", all)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sh := range got {
		names = append(names, sh.name)
	}
	// Run order: the Poisson rate comes from the closed loops, which run first.
	if want := []string{"sequential", "burst2000_h2load", "poisson"}; !slices.Equal(names, want) {
		t.Errorf("got %v, want %v", names, want)
	}
	if _, err := parseShapes("closed9", all); err == nil {
		t.Error("accepted an unknown shape")
	}
	if got, _ := parseShapes("none", all); len(got) != 0 {
		t.Errorf("none: %v", got)
	}
	for _, sh := range all {
		if strings.HasSuffix(sh.name, "_hs") == sh.request {
			t.Errorf("%s: request %v; the _hs shapes and only they make none", sh.name, sh.request)
		}
		// The floor is beside every figure the targets are read over, and the
		// sequential shapes without a request.
		if want := sh.request || strings.HasPrefix(sh.name, "sequential"); floorShape(sh) != want {
			t.Errorf("%s: floorShape %v, want %v", sh.name, floorShape(sh), want)
		}
	}
}

func TestShapeMedian(t *testing.T) {
	sh := shape{name: "burst2000_h2load", request: true}
	srv := &server{id: srvL7Offload}
	row := func(conns, errs int, cpu time.Duration) *mrow {
		return &mrow{sh: sh, srv: srv, conns: conns, errors: errs, cpu: []time.Duration{mclockServer: cpu, nMClocks - 1: 0}}
	}
	b := &bench{mrows: []*mrow{row(2000, 0, 800*time.Millisecond), row(9, 1991, 440*time.Millisecond), row(2000, 0, 700*time.Millisecond)}}
	if got := b.shapeMedian(sh.name, srvL7Offload, mclockServer); got == nil || *got != 375 {
		t.Errorf("median %v; want 375 µs, from the two repeats without errors", got)
	}
	b.mrows = b.mrows[1:2]
	if got := b.shapeMedian(sh.name, srvL7Offload, mclockServer); got == nil || math.Abs(*got-48888.9) > 0.1 {
		t.Errorf("median %v; want the only repeat's 48888.9 µs", got)
	}
	if got := b.shapeMedian(sh.name, srvNginx, mclockServer); got != nil {
		t.Errorf("a server not measured: %v", *got)
	}
}
