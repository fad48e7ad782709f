package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/internal/proc"
)

// Servers, in the order each group of rows measures them.
const (
	srvL7Local   = "l7d-local"
	srvL7Offload = "l7d-offload"
	srvNginx     = "nginx"
	srvGoTLS     = "go-tls" // profiling baseline: crypto/tls alone
)

// serverNames are the servers the report compares; srvGoTLS comes after them when
// asked for.
var serverNames = []string{srvL7Local, srvL7Offload, srvNginx}

// server is one TLS server under test.
type server struct {
	id    string // one of the srv constants
	label string // as in the table
	addr  string
	proc  *benchkit.Process
	clock benchkit.CPUClock // the server's CPU: l7d's process, or nginx's master and workers

	metricsURL string // l7d's /metrics
	pprofURL   string // the profiling variant's /debug/pprof/ (-profile)
	workers    []int  // nginx's worker processes at start-up

	floor     bool              // a floor server (floor.go): measured in the shapes floorShape names
	ks        *benchkit.Process // the key server whose CPU is shown beside: keyserverd, or the floor signer
	schedPIDs []int             // the processes whose threads' scheduler counters are read
	userClock benchkit.CPUClock // the server's user-mode CPU
}

// fleet is every process the rows measure, started once and stopped at the end.
type fleet struct {
	servers []*server
	ks      *benchkit.Process // keyserverd, for l7d-offload
}

// startFleet starts keyserverd, both l7d and nginx, and checks each
// serves the site certificate, verified against its CA. On error, what was started
// is stopped.
func (b *bench) startFleet(ctx context.Context) (err error) {
	fl := &fleet{}
	b.fl = fl
	defer func() {
		if err != nil {
			b.stopFleet()
		}
	}()

	want := b.wanted()
	if want[srvL7Offload] {
		if err := b.startKeyserver(ctx); err != nil {
			return err
		}
	}
	for _, id := range append(serverNames, srvGoTLS) {
		if !want[id] {
			continue
		}
		var s *server
		switch id {
		case srvL7Local, srvL7Offload:
			s, err = b.startL7d(ctx, id)
		case srvNginx:
			s, err = b.startNginx(ctx)
		case srvGoTLS:
			s, err = b.startGoTLS(ctx)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		fl.servers = append(fl.servers, s)
	}
	if b.floorWanted() {
		for _, id := range []string{srvL7Local, srvL7Offload} {
			if !want[id] {
				continue
			}
			s, err := b.startFloor(ctx, floorFor[id])
			if err != nil {
				return fmt.Errorf("%s: %w", floorFor[id], err)
			}
			fl.servers = append(fl.servers, s)
		}
	}
	return nil
}

// floorWanted reports whether the floor servers are to be measured: -floor, and a
// sequential shape in the matrix.
func (b *bench) floorWanted() bool {
	if !b.o.floor {
		return false
	}
	for _, sh := range b.o.matrix {
		if floorShape(sh) {
			return true
		}
	}
	return false
}

// wanted is the set of servers the selected rows need.
func (b *bench) wanted() map[string]bool {
	out := map[string]bool{}
	for _, s := range b.o.servers {
		out[s] = true
	}
	return out
}

func (b *bench) startKeyserver(ctx context.Context) error {
	listen, err := benchkit.FreeAddr()
	if err != nil {
		return err
	}
	metrics, err := benchkit.FreeAddr()
	if err != nil {
		return err
	}
	cfg, err := b.f.keyserverConfig("run", listen, metrics)
	if err != nil {
		return err
	}
	p, err := benchkit.StartProcess("keyserverd", b.Bin("keyserverd"), []string{"run", "-config", cfg},
		b.f.tok.Env(), filepath.Join(b.f.dir, "keyserverd.log"))
	if err != nil {
		return err
	}
	b.fl.ks = p
	if err := p.WaitHTTP(ctx, nil, "http://"+metrics+"/healthz", 20*time.Second); err != nil {
		return fmt.Errorf("keyserverd did not become healthy: %w; log:\n%s", err, p.LogTail(20))
	}
	b.ksAddr = listen
	return nil
}

func (b *bench) startL7d(ctx context.Context, id string) (*server, error) {
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	local := id == srvL7Local
	cfg, err := b.f.l7dConfig(id, addr, admin, local, b.ksAddr)
	if err != nil {
		return nil, err
	}
	s := &server{id: id, addr: addr, metricsURL: "http://" + admin + "/metrics"}
	s.label = "l7d, key local"
	if !local {
		s.label = "l7d, key on keyserverd"
	}
	path, args := b.Bin("l7d"), []string{"run", "-config", cfg}
	if b.o.profileDir != "" {
		// The profiling variant: l7d's own code in a copy of this program, with pprof.
		var err error
		if path, args, s.pprofURL, err = benchkit.ProfiledL7d(cfg); err != nil {
			return nil, err
		}
		s.label += " (pprof variant)"
	}
	if s.proc, err = benchkit.StartProcess(id, path, args, b.o.l7dEnv, filepath.Join(b.f.dir, id+".log")); err != nil {
		return nil, err
	}
	s.clock = s.proc.CPU()
	s.schedPIDs = []int{s.proc.PID()}
	s.userClock = benchkit.ProcessUserCPU(s.proc.PID(), false)
	if !local {
		s.ks = b.fl.ks
	}
	if err := s.proc.WaitHTTP(ctx, nil, "http://"+admin+"/healthz", 20*time.Second); err != nil {
		s.proc.Stop(5 * time.Second)
		return nil, fmt.Errorf("l7d did not become healthy: %w; log:\n%s", err, s.proc.LogTail(20))
	}
	if err := b.waitTLS(ctx, s, 10*time.Second); err != nil {
		s.proc.Stop(5 * time.Second)
		return nil, err
	}
	return s, nil
}

// startGoTLS starts the crypto/tls baseline (-profile): this program as a plain
// crypto/tls server with the site certificate and key file and l7d's ticket key.
func (b *bench) startGoTLS(ctx context.Context) (*server, error) {
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	pp, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s := &server{id: srvGoTLS, label: "crypto/tls alone, key local", addr: addr, pprofURL: "http://" + pp + "/debug/pprof/"}
	args := []string{serveGoTLSCommand, "-addr", addr, "-cert", b.f.siteCert, "-key", b.f.siteKey, "-ticket-key", b.f.ticketKey, "-pprof", pp}
	if s.proc, err = benchkit.StartProcess(srvGoTLS, self, args, nil, filepath.Join(b.f.dir, srvGoTLS+".log")); err != nil {
		return nil, err
	}
	s.clock = s.proc.CPU()
	if err := s.proc.WaitHTTP(ctx, nil, "http://"+pp+"/healthz", 20*time.Second); err != nil {
		s.proc.Stop(5 * time.Second)
		return nil, err
	}
	if err := b.waitTLS(ctx, s, 10*time.Second); err != nil {
		s.proc.Stop(5 * time.Second)
		return nil, err
	}
	return s, nil
}

func (b *bench) startNginx(ctx context.Context) (*server, error) {
	path, err := exec.LookPath(b.o.nginx)
	if err != nil {
		return nil, fmt.Errorf("nginx not found (Debian package nginx; `make deps` installs it): %w", err)
	}
	if out, err := exec.CommandContext(ctx, path, "-V").CombinedOutput(); err == nil {
		b.nginxVersion, b.nginxOpenSSL = parseNginxV(string(out))
	}
	dir := filepath.Join(b.f.dir, "nginx")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConfig(dir, addr, b.f.siteCert, b.f.siteKey, b.o.nginxWorkers)), 0o600); err != nil {
		return nil, err
	}
	errLog := filepath.Join(dir, benchkit.NginxErrorLog)
	s := &server{id: srvNginx, label: "nginx, key local", addr: addr}
	// Should this program die, SIGTERM makes the master stop its workers too (they
	// would outlive a killed master).
	s.proc, err = benchkit.StartProcess("nginx", path, []string{"-c", conf, "-p", dir + "/", "-e", errLog}, nil,
		filepath.Join(dir, "nginx-stderr.log"), benchkit.DeathSignal(syscall.SIGTERM))
	if err != nil {
		return nil, err
	}
	s.clock = benchkit.ProcessTreeCPU(s.proc.PID())
	if err := b.waitTLS(ctx, s, 20*time.Second); err != nil {
		stopNginx(s)
		return nil, fmt.Errorf("%w; error log:\n%s", err, proc.Tail(errLog, 20))
	}
	// The workers are up once one has answered; wait for all of them to be forked.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		kids, err := benchkit.ChildPIDs(s.proc.PID())
		if err != nil {
			stopNginx(s)
			return nil, err
		}
		s.workers = kids
		if len(kids) >= b.o.nginxWorkers || time.Now().After(end) {
			break
		}
	}
	s.schedPIDs = append([]int{s.proc.PID()}, s.workers...)
	s.userClock = benchkit.ProcessUserCPU(s.proc.PID(), true)
	if len(s.workers) != b.o.nginxWorkers {
		stopNginx(s)
		return nil, fmt.Errorf("nginx has %d worker processes, want %d; error log:\n%s", len(s.workers), b.o.nginxWorkers, proc.Tail(errLog, 20))
	}
	return s, nil
}

var (
	nginxVersionRE = regexp.MustCompile(`nginx version: (\S+)`)
	runningWithRE  = regexp.MustCompile(`running with (OpenSSL [^)\s]+)`)
	builtWithRE    = regexp.MustCompile(`built with (OpenSSL \S+)`)
)

// parseNginxV returns the version and the OpenSSL nginx runs with from `nginx -V`.
func parseNginxV(out string) (version, openssl string) {
	if m := nginxVersionRE.FindStringSubmatch(out); m != nil {
		version = m[1]
	}
	if m := runningWithRE.FindStringSubmatch(out); m != nil {
		openssl = m[1]
	} else if m := builtWithRE.FindStringSubmatch(out); m != nil {
		openssl = m[1]
	}
	return version, openssl
}

// waitTLS polls s until a handshake that verifies the certificate chain against the
// site CA succeeds, s's process exits, timeout passes or ctx ends.
func (b *bench) waitTLS(ctx context.Context, s *server, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := b.verifyOnce(ctx, s.addr, tls.VersionTLS13)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no verified TLS handshake with %s within %v: %w", s.addr, timeout, err)
		}
		select {
		case <-s.proc.Done():
			return s.proc.Exited()
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// verifyOnce makes one handshake at version that verifies the chain against the site
// CA and the name, and checks the server presented the site key.
func (b *bench) verifyOnce(ctx context.Context, addr string, version uint16) error {
	cfg := clientConfig(version)
	cfg.InsecureSkipVerify = false
	cfg.RootCAs = b.f.siteCA.Pool()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	st := c.(*tls.Conn).ConnectionState()
	if err := checkState(&st, version, false); err != nil {
		return err
	}
	if !b.f.key.PublicKey.Equal(st.PeerCertificates[0].PublicKey) {
		return errors.New("the server presented another key than the site key")
	}
	return nil
}

// stopFleet stops every process in the reverse order of their start.
func (b *bench) stopFleet() {
	fl := b.fl
	if fl == nil {
		return
	}
	for i := len(fl.servers) - 1; i >= 0; i-- {
		s := fl.servers[i]
		if s.id == srvNginx {
			if err := stopNginx(s); err != nil {
				b.Fail("stopping nginx: %v", err)
			}
			continue
		}
		if err := s.proc.Stop(10 * time.Second); err != nil {
			b.Fail("stopping %s: %v; log:\n%s", s.id, err, s.proc.LogTail(10))
		}
		if s.floor && s.ks != nil {
			if err := s.ks.Stop(10 * time.Second); err != nil {
				b.Fail("stopping %s's signer: %v; log:\n%s", s.id, err, s.ks.LogTail(10))
			}
		}
	}
	if fl.ks != nil {
		if err := fl.ks.Stop(10 * time.Second); err != nil {
			b.Fail("stopping keyserverd: %v; log:\n%s", err, fl.ks.LogTail(10))
		}
	}
	b.fl = nil
}

// stopNginx stops nginx's master and any worker it left behind.
func stopNginx(s *server) error { return benchkit.StopNginx(s.proc, s.workers, 10*time.Second) }
