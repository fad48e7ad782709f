package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/internal/proc"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// Proxies, in the order of the first round.
const (
	srvL7d     = "l7d"
	srvNginx   = "nginx"
	srvHAProxy = "haproxy"
)

var serverNames = []string{srvL7d, srvNginx, srvHAProxy, srvFloor, srvFloorFasthttp}

// Backends.
const (
	backendNginx = "nginx"
	backendGo    = "go"
)

const (
	// siteName is the name the site certificate is issued for and the client sends
	// as SNI and Host.
	siteName = "bench.tiergate.test"
	// requestPath is what the load asks for; the backend answers it with body.
	requestPath = "/1k"
	bodySize    = 1024
	// tlsSuite is the one TLS 1.3 cipher suite every proxy is held to, so they all
	// encrypt alike (haproxy would prefer AES-256-GCM of its own accord).
	tlsSuite     = tls.TLS_AES_128_GCM_SHA256
	tlsSuiteName = "TLS_AES_128_GCM_SHA256"
	// keepaliveRequests is how many requests nginx serves on one connection, in
	// either direction (its default, 1000, would add a handshake every 1000).
	keepaliveRequests = 100_000_000
)

// body is the backend's answer: bodySize bytes of letters and digits (nothing nginx
// would read as a variable or an escape in its configuration).
var body = func() []byte {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	b := make([]byte, bodySize)
	for i := range b {
		b[i] = alphabet[(i*7+i/len(alphabet))%len(alphabet)]
	}
	return b
}()

// fixture is the site certificate, an ECDSA P-256 key, as files every server reads:
// the certificate, the key, and both in one file for haproxy.
type fixture struct {
	dir                 string
	ca                  *testpki.CA
	pub                 *ecdsa.PublicKey
	cert, key, combined string
}

func newFixture(dir string) (*fixture, error) {
	f := &fixture{dir: dir}
	pki := filepath.Join(dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		return nil, err
	}
	var err error
	if f.ca, err = testpki.NewCA("Tiergate bench-policy site CA"); err != nil {
		return nil, err
	}
	leaf, err := f.ca.Leaf(siteName, siteName, "127.0.0.1")
	if err != nil {
		return nil, err
	}
	f.pub = leaf.Leaf.PublicKey.(*ecdsa.PublicKey)
	keyPEM, err := testpki.KeyPEM(leaf.PrivateKey)
	if err != nil {
		return nil, err
	}
	f.cert, f.key, f.combined = filepath.Join(pki, "site.pem"), filepath.Join(pki, "site.key"), filepath.Join(pki, "site-combined.pem")
	if err := testpki.WritePEM(f.cert, "CERTIFICATE", leaf.Certificate[0]); err != nil {
		return nil, err
	}
	if err := os.WriteFile(f.key, keyPEM, 0o600); err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(f.cert)
	if err != nil {
		return nil, err
	}
	return f, os.WriteFile(f.combined, append(certPEM, keyPEM...), 0o600)
}

// endpoint is a process the rows talk to: a proxy under test or the backend.
type endpoint struct {
	id      string // one of the srv constants, or "backend"
	label   string // as in the table
	addr    string
	proc    *benchkit.Process
	clock   benchkit.CPUClock // its CPU: every thread, and nginx's workers too
	user    benchkit.CPUClock // the user-mode part of clock
	nginx   bool              // an nginx master, whose workers must go with it
	version string
	dead    bool // its exit has been reported

	metricsURL string // l7d's /metrics
	pprofURL   string // the profiling variant's /debug/pprof/ (-profile)
	statsURL   string // the backend's request count: nginx stub_status or /stats
}

// fleet is every process the proxy rows need, started once and stopped at the end.
type fleet struct {
	backend *endpoint
	servers []*endpoint
}

// startFleet starts the backend and the proxies. What it started is in the fleet it
// returns, on error too, for stopFleet.
func (b *bench) startFleet(ctx context.Context, fx *fixture) (*fleet, error) {
	fl := &fleet{}
	var err error
	if fl.backend, err = b.startBackend(ctx); err != nil {
		return fl, fmt.Errorf("backend: %w", err)
	}
	for _, id := range b.o.servers {
		var s *endpoint
		switch id {
		case srvL7d:
			s, err = b.startL7d(ctx, fx, fl.backend.addr)
		case srvNginx:
			s, err = b.startNginxProxy(ctx, fx, fl.backend.addr)
		case srvHAProxy:
			s, err = b.startHAProxy(ctx, fx, fl.backend.addr)
		case srvFloor, srvFloorFasthttp:
			s, err = b.startFloor(ctx, fx, fl.backend.addr, id)
		}
		if s != nil {
			fl.servers = append(fl.servers, s)
		}
		if err != nil {
			return fl, fmt.Errorf("%s: %w", id, err)
		}
	}
	return fl, nil
}

// stopFleet stops every process in the reverse order of their start.
func (b *bench) stopFleet(fl *fleet) {
	all := append([]*endpoint{fl.backend}, fl.servers...)
	for i := len(all) - 1; i >= 0; i-- {
		if e := all[i]; e != nil && e.proc != nil {
			if err := e.stop(); err != nil && !e.dead {
				b.Fail("stopping %s: %v; log:\n%s", e.id, err, e.proc.LogTail(10))
			}
		}
	}
}

// stop stops the process: SIGTERM, then SIGKILL after a grace period. An nginx
// master stops its workers on SIGTERM; any it left behind are killed. haproxy, which
// SIGTERM kills outright, gets SIGUSR1 first: its soft stop, which exits cleanly
// once its connections are closed (the load closes them after each row).
func (e *endpoint) stop() error {
	if e.id == srvHAProxy {
		select {
		case <-e.proc.Done():
		default:
			_ = syscall.Kill(e.proc.PID(), syscall.SIGUSR1)
			select {
			case <-e.proc.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
	if !e.nginx {
		return e.proc.Stop(10 * time.Second)
	}
	return benchkit.StopNginx(e.proc, nil, 10*time.Second)
}

// exited returns an error if the process is gone, and marks it reported.
func (e *endpoint) exited() error {
	select {
	case <-e.proc.Done():
		e.dead = true
		return e.proc.Exited()
	default:
		return nil
	}
}

func (b *bench) startBackend(ctx context.Context) (*endpoint, error) {
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	if b.o.backend == backendGo {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		e := &endpoint{id: "backend", label: "fasthttp backend (a child of this program)", addr: addr, statsURL: "http://" + addr + "/stats"}
		if e.proc, err = benchkit.StartProcess("backend", self, []string{serveBackendCommand, "-addr", addr}, nil, filepath.Join(b.dir, "backend.log")); err != nil {
			return nil, err
		}
		e.clock, e.user = e.proc.CPU(), benchkit.ProcessUserCPU(e.proc.PID(), false)
		if err := e.proc.WaitHTTP(ctx, nil, "http://"+addr+requestPath, 20*time.Second); err != nil {
			e.stop()
			return nil, err
		}
		return e, nil
	}
	dir := filepath.Join(b.dir, "nginx-backend")
	conf := nginxBackendConfig(dir, addr, b.o.backendWorkers)
	e, err := b.startNginx(ctx, "backend", dir, conf, b.o.backendWorkers, func(e *endpoint) error {
		return e.proc.WaitHTTP(ctx, nil, "http://"+addr+requestPath, 20*time.Second)
	})
	if err != nil {
		return nil, err
	}
	e.addr = addr
	e.label = fmt.Sprintf("nginx, %s, fixed answer", plural(b.o.backendWorkers, "worker"))
	e.statsURL = "http://" + addr + "/nginx_status"
	return e, nil
}

func (b *bench) startL7d(ctx context.Context, fx *fixture, backend string) (*endpoint, error) {
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(b.dir, "l7d.yaml")
	state := fmt.Sprintf("state_dir: %q\n", filepath.Join(b.dir, "l7d-state")) // its generated admin token
	if err := os.WriteFile(cfg, []byte(l7dConfig(addr, admin, backend, fx)+state), 0o600); err != nil {
		return nil, err
	}
	s := &endpoint{id: srvL7d, label: "l7d", addr: addr, metricsURL: "http://" + admin + "/metrics"}
	path, args := b.Bin("l7d"), []string{"run", "-config", cfg}
	if b.o.profileDir != "" {
		var err error
		if path, args, s.pprofURL, err = benchkit.ProfiledL7d(cfg); err != nil {
			return nil, err
		}
		s.label = "l7d (pprof variant)"
	}
	if s.proc, err = benchkit.StartProcess(srvL7d, path, args, nil, filepath.Join(b.dir, "l7d.log")); err != nil {
		return nil, err
	}
	s.clock, s.user = s.proc.CPU(), benchkit.ProcessUserCPU(s.proc.PID(), false)
	if err := s.proc.WaitHTTP(ctx, nil, "http://"+admin+"/healthz", 20*time.Second); err != nil {
		return s, fmt.Errorf("l7d did not become healthy: %w; log:\n%s", err, s.proc.LogTail(20))
	}
	return s, b.waitServing(ctx, s, fx)
}

func (b *bench) startNginxProxy(ctx context.Context, fx *fixture, backend string) (*endpoint, error) {
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.dir, "nginx")
	conf := nginxProxyConfig(dir, addr, backend, fx.cert, fx.key, b.o.workers)
	e, err := b.startNginx(ctx, srvNginx, dir, conf, b.o.workers, func(e *endpoint) error {
		e.addr = addr
		return b.waitServing(ctx, e, fx)
	})
	if err != nil {
		return nil, err
	}
	e.label = fmt.Sprintf("nginx, %s", plural(b.o.workers, "worker"))
	return e, nil
}

// startNginx writes conf into dir and starts nginx on it as process id, waits for
// ready and for its workers to be forked.
func (b *bench) startNginx(ctx context.Context, id, dir, conf string, workers int, ready func(*endpoint) error) (*endpoint, error) {
	path, err := exec.LookPath(b.o.nginx)
	if err != nil {
		return nil, fmt.Errorf("nginx not found (Debian package nginx; `make deps` installs it): %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	confPath, errLog := filepath.Join(dir, "nginx.conf"), filepath.Join(dir, benchkit.NginxErrorLog)
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	e := &endpoint{id: id, nginx: true}
	if out, err := exec.CommandContext(ctx, path, "-v").CombinedOutput(); err == nil {
		e.version = parseNginxVersion(string(out))
	}
	// Should this program die, SIGTERM makes the master stop its workers too (they
	// would outlive a killed master).
	e.proc, err = benchkit.StartProcess(id, path, []string{"-c", confPath, "-p", dir + "/", "-e", errLog}, nil,
		filepath.Join(dir, "stderr.log"), benchkit.DeathSignal(syscall.SIGTERM))
	if err != nil {
		return nil, err
	}
	e.clock, e.user = benchkit.ProcessTreeCPU(e.proc.PID()), benchkit.ProcessUserCPU(e.proc.PID(), true)
	if err := ready(e); err != nil {
		e.stop()
		return nil, fmt.Errorf("%w; error log:\n%s", err, proc.Tail(errLog, 20))
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		kids, err := benchkit.ChildPIDs(e.proc.PID())
		if err != nil {
			e.stop()
			return nil, err
		}
		if len(kids) >= workers {
			break
		}
		if time.Now().After(end) {
			e.stop()
			return nil, fmt.Errorf("nginx has %d worker processes, want %d; error log:\n%s", len(kids), workers, proc.Tail(errLog, 20))
		}
	}
	return e, nil
}

func (b *bench) startHAProxy(ctx context.Context, fx *fixture, backend string) (*endpoint, error) {
	path, err := exec.LookPath(b.o.haproxy)
	if err != nil {
		return nil, fmt.Errorf("haproxy not found (Debian package haproxy; `make deps` installs it): %w", err)
	}
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(b.dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(addr, backend, fx.combined, b.o.workers)), 0o600); err != nil {
		return nil, err
	}
	s := &endpoint{id: srvHAProxy, label: fmt.Sprintf("haproxy, %s", plural(b.o.workers, "thread")), addr: addr}
	if out, err := exec.CommandContext(ctx, path, "-v").CombinedOutput(); err == nil {
		s.version = parseHAProxyVersion(string(out))
	}
	if out, err := exec.CommandContext(ctx, path, "-c", "-q", "-f", cfg).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy -c: %v: %s", err, bytes.TrimSpace(out))
	}
	if s.proc, err = benchkit.StartProcess(srvHAProxy, path, []string{"-f", cfg, "-db"}, nil, filepath.Join(b.dir, "haproxy.log")); err != nil {
		return nil, err
	}
	s.clock, s.user = benchkit.ProcessTreeCPU(s.proc.PID()), benchkit.ProcessUserCPU(s.proc.PID(), true)
	return s, b.waitServing(ctx, s, fx)
}

// waitServing polls s until one request through it gets the backend's answer over a
// verified TLS connection, s's process exits, 20s pass or ctx ends.
func (b *bench) waitServing(ctx context.Context, s *endpoint, fx *fixture) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := probeOnce(ctx, s.addr, fx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer through %s within 20s: %w", s.addr, err)
		}
		var done <-chan struct{}
		if s.proc != nil {
			done = s.proc.Done()
		}
		select {
		case <-done:
			return s.exited()
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// probeOnce connects, checks the connection and the certificate, and makes one
// request.
func probeOnce(ctx context.Context, addr string, fx *fixture) error {
	cl := newClient(addr, fx, 1, 5*time.Second)
	defer cl.close()
	if err := cl.op(ctx, 0, 0); err != nil {
		return err
	}
	if !fx.pub.Equal(cl.peerKey) {
		return fmt.Errorf("the server presented another key than the site key")
	}
	return nil
}

// l7dConfig is an l7d configuration with one TCP-only listener on addr in front of
// backend, serving the site certificate and key.
func l7dConfig(addr, admin, backend string, fx *fixture) string {
	return fmt.Sprintf(`listeners:
  - name: bench
    addr: %q
    pool: origin
    disable_http3: true
backends:
  origin:
    members: [%q]
certificates:
  certificates:
    - name: site
      cert_file: %q
      key_file: %q
  default: site
admin_listen: %q
shutdown_grace: 2s
log_level: warn
`, addr, backend, fx.cert, fx.key, admin)
}

// nginxCommon is the top of every nginx.conf here: foreground, workers, everything
// written under dir, no access log.
func nginxCommon(dir string, workers int) string {
	return benchkit.NginxHTTPTop(dir, workers) + fmt.Sprintf(`    keepalive_requests %d;
    keepalive_timeout 75s;
`, keepaliveRequests)
}

// nginxBackendConfig is the shared backend: plain HTTP/1.1 on addr answering
// requestPath with body from memory, and its request count at /nginx_status.
func nginxBackendConfig(dir, addr string, workers int) string {
	return nginxCommon(dir, workers) + fmt.Sprintf(`
    server {
        listen %s;
        location = %s {
            default_type application/octet-stream;
            return 200 "%s";
        }
        location = /nginx_status {
            stub_status;
        }
        location / {
            return 404;
        }
    }
}
`, addr, requestPath, body)
}

// nginxProxyConfig is nginx as the proxy under test: TLS 1.3 on addr with the site
// certificate, every request proxied over HTTP/1.1 keep-alive to backend.
func nginxProxyConfig(dir, addr, backend, cert, key string, workers int) string {
	return nginxCommon(dir, workers) + fmt.Sprintf(`
    upstream backend {
        server %s;
        keepalive 64;
        keepalive_requests %d;
        keepalive_timeout 75s;
    }

    server {
        listen %s ssl;
        ssl_certificate %s;
        ssl_certificate_key %s;
        ssl_protocols TLSv1.3;
        ssl_conf_command Ciphersuites %s;

        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_max_temp_file_size 0;
        }
    }
}
`, backend, keepaliveRequests, addr, cert, key, tlsSuiteName)
}

// haproxyConfig is haproxy as the proxy under test, run with -db (foreground, one
// process of threads threads): TLS 1.3 on addr with the site certificate and key
// (pem), every request to backend over connections shared by all (http-reuse
// always), no logging.
func haproxyConfig(addr, backend, pem string, threads int) string {
	return fmt.Sprintf(`global
    nbthread %d
    maxconn 4096
    ssl-default-bind-ciphersuites %s
    ssl-default-bind-options ssl-min-ver TLSv1.3

defaults
    mode http
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout http-request 10s
    timeout http-keep-alive 75s

frontend fe
    bind %s ssl crt %s alpn http/1.1
    default_backend be

backend be
    http-reuse always
    server origin %s
`, threads, tlsSuiteName, addr, pem, backend)
}

var (
	nginxVersionRE   = regexp.MustCompile(`nginx version: nginx/(\S+)`)
	haproxyVersionRE = regexp.MustCompile(`(?i)HAProxy version (\S+)`)
)

// parseNginxVersion reads `nginx -v`: "nginx version: nginx/1.22.1".
func parseNginxVersion(out string) string {
	if m := nginxVersionRE.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

// parseHAProxyVersion reads the first line of `haproxy -v`: "HAProxy version
// 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/".
func parseHAProxyVersion(out string) string {
	if m := haproxyVersionRE.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

// plural writes a count of things: "1 worker", "2 workers".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
