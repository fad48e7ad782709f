// Package demo runs the Tiergate stack on one machine for `make demo`: keyserverd on a
// SoftHSM2 token it creates on first run under a state directory, l7d terminating TLS
// 1.2/1.3 and QUIC with the site's private key in that token, a backend behind it, and
// a client loop making real requests, each over a full handshake.
package demo

import (
	"bufio"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/internal/softhsm"
	"github.com/tiergate/tiergate/internal/testpki"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/softkey"
)

// Options of a demo run.
type Options struct {
	Dir         string        // state directory; default ./.demo
	BinDir      string        // where keyserverd is; default ./bin
	Duration    time.Duration // stop after this long; default 0 = until SIGINT/SIGTERM
	Interval    time.Duration // between handshakes; default 500ms
	KeyserverAt string        // keyserverd listen address; default 127.0.0.1:2407
	MetricsAt   string        // keyserverd metrics address; default 127.0.0.1:9240
	L7At        string        // l7d listener (TCP and UDP); default 127.0.0.1:8443
	L7AdminAt   string        // l7d admin (metrics, reload); default 127.0.0.1:9241
}

// Main is the tgdemo command.
func Main(args []string, stdout, stderr io.Writer) int {
	var o Options
	fs := flag.NewFlagSet("tgdemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Dir, "dir", ".demo", "state `directory` (token, keys, logs)")
	fs.StringVar(&o.BinDir, "bin", "bin", "`directory` holding keyserverd")
	fs.DurationVar(&o.Duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	fs.DurationVar(&o.Interval, "interval", 500*time.Millisecond, "pause between handshakes")
	fs.StringVar(&o.KeyserverAt, "keyserver", "127.0.0.1:2407", "keyserverd listen `address`")
	fs.StringVar(&o.MetricsAt, "metrics", "127.0.0.1:9240", "keyserverd metrics `address`")
	fs.StringVar(&o.L7At, "l7", "127.0.0.1:8443", "l7d listener `address` (TCP and UDP)")
	fs.StringVar(&o.L7AdminAt, "l7-admin", "127.0.0.1:9241", "l7d admin `address`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}
	if err := Run(ctx, o, stdout); err != nil {
		fmt.Fprintf(stderr, "tgdemo: %v\n", err)
		return 1
	}
	return 0
}

// Run runs the demo until ctx is done.
func Run(ctx context.Context, o Options, out io.Writer) error {
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ksBin := filepath.Join(o.BinDir, "keyserverd")
	if _, err := os.Stat(ksBin); err != nil {
		return fmt.Errorf("keyserverd binary: %w (run `make build`)", err)
	}

	// 1. The token: created on the first run, reused after.
	tok, err := softhsm.OpenOrCreateToken(filepath.Join(dir, "softhsm"), "tiergate-demo", "demo-so-pin", "demo-pin")
	if err != nil {
		return fmt.Errorf("SoftHSM2 token: %w", err)
	}
	pinFile := filepath.Join(dir, "token.pin")
	if err := os.WriteFile(pinFile, []byte(tok.PIN+"\n"), 0o600); err != nil {
		return err
	}

	// 2. The site key: generated once, imported into the token (idempotent).
	siteKeyPath := filepath.Join(dir, "site.key")
	siteKey, err := loadOrCreateRSAKey(siteKeyPath)
	if err != nil {
		return err
	}
	siteID, err := backend.KeyIDOf(siteKey.Public())
	if err != nil {
		return err
	}

	// 3. Certificates: mTLS between the L7 side and keyserverd, and the site certificate.
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return err
	}
	ksCA, err := testpki.NewCA("Tiergate demo keyserver CA")
	if err != nil {
		return err
	}
	clientCA, err := testpki.NewCA("Tiergate demo L7 client CA")
	if err != nil {
		return err
	}
	siteCA, err := testpki.NewCA("Tiergate demo site CA")
	if err != nil {
		return err
	}
	ksCert, err := ksCA.Leaf("keyserverd", "127.0.0.1")
	if err != nil {
		return err
	}
	l7Cert, err := clientCA.Leaf("l7-demo")
	if err != nil {
		return err
	}
	if _, err := ksCA.WriteFiles(pki, "keyserver", ksCert); err != nil {
		return err
	}
	clientCAPath, err := clientCA.WriteFiles(pki, "client")
	if err != nil {
		return err
	}
	_, siteDER, err := siteCA.Issue("demo.tiergate.test", siteKey.Public(), "demo.tiergate.test")
	if err != nil {
		return err
	}
	if err := testpki.WritePEM(filepath.Join(pki, "site.pem"), "CERTIFICATE", siteDER); err != nil {
		return err
	}
	if _, err := siteCA.WriteFiles(pki, "site"); err != nil {
		return err
	}

	// 4. keyserverd: configuration, import, run.
	cfgPath := filepath.Join(dir, "keyserverd.yaml")
	cfg := fmt.Sprintf(`# Written by tgdemo on every run.
listen: %q
metrics_listen: %q
tls:
  cert_file: %q
  key_file: %q
  client_ca_file: %q
pkcs11:
  module: %q
  token_label: %q
  pin_file: %q
clients:
  - name: l7-demo
    keys: ["*"]
`, o.KeyserverAt, o.MetricsAt, filepath.Join(pki, "keyserverd.pem"), filepath.Join(pki, "keyserverd.key"),
		clientCAPath, tok.Module, tok.Label, pinFile)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	env := append(os.Environ(), tok.Env()...)
	imp := exec.Command(ksBin, "import", "-config", cfgPath, "-label", "demo-site", "-key", siteKeyPath)
	imp.Env = env
	if b, err := imp.CombinedOutput(); err != nil {
		return fmt.Errorf("keyserverd import: %v: %s", err, b)
	}
	logPath := filepath.Join(dir, "keyserverd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	ks := exec.Command(ksBin, "run", "-config", cfgPath)
	ks.Env, ks.Stdout, ks.Stderr = env, logFile, logFile
	if err := ks.Start(); err != nil {
		return fmt.Errorf("starting keyserverd: %w", err)
	}
	ksDone := make(chan error, 1)
	go func() { ksDone <- ks.Wait() }()
	defer func() {
		ks.Process.Signal(syscall.SIGTERM)
		select {
		case <-ksDone:
		case <-time.After(15 * time.Second):
			ks.Process.Kill()
			<-ksDone
		}
		fmt.Fprintln(out, "keyserverd stopped; state kept in", dir)
	}()
	metricsURL := "http://" + o.MetricsAt + "/metrics"
	if err := waitHealthy(ctx, "http://"+o.MetricsAt+"/healthz", ksDone); err != nil {
		return fmt.Errorf("keyserverd did not become healthy (log: %s): %w", logPath, err)
	}

	// 5. A backend, and l7d in front of it: TLS 1.2/1.3 and QUIC, the site key remote.
	if _, err := clientCA.WriteFiles(pki, "l7", l7Cert); err != nil {
		return err
	}
	backendLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	backend := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the backend: you are %s, l7d says %s\n", r.Header.Get("X-Real-Ip"), r.Header.Get("X-Forwarded-Proto"))
	})}
	go backend.Serve(backendLn)
	defer backend.Close()
	l7Cfg := filepath.Join(dir, "l7d.yaml")
	l7Yaml := fmt.Sprintf(`# Written by tgdemo on every run.
listeners: [{name: demo, addr: %q, pool: demo}]
backends: {demo: {members: [%q]}}
certificates:
  certificates: [{name: demo-site, cert_file: %q}]   # no key_file: the key is in the token
keyservers:
  servers: [%q]
  cert_file: %q
  key_file: %q
  ca_file: %q
admin_listen: %q
`, o.L7At, backendLn.Addr().String(), filepath.Join(pki, "site.pem"), o.KeyserverAt,
		filepath.Join(pki, "l7-demo.pem"), filepath.Join(pki, "l7-demo.key"), filepath.Join(pki, "keyserver-ca.pem"), o.L7AdminAt)
	if err := os.WriteFile(l7Cfg, []byte(l7Yaml), 0o600); err != nil {
		return err
	}
	l7Log := filepath.Join(dir, "l7d.log")
	l7LogFile, err := os.Create(l7Log)
	if err != nil {
		return err
	}
	defer l7LogFile.Close()
	l7 := exec.Command(filepath.Join(o.BinDir, "l7d"), "run", "-config", l7Cfg)
	l7.Stdout, l7.Stderr = l7LogFile, l7LogFile
	if err := l7.Start(); err != nil {
		return fmt.Errorf("starting l7d: %w", err)
	}
	l7Done := make(chan error, 1)
	go func() { l7Done <- l7.Wait() }()
	defer func() {
		l7.Process.Signal(syscall.SIGTERM)
		select {
		case <-l7Done:
		case <-time.After(15 * time.Second):
			l7.Process.Kill()
			<-l7Done
		}
		fmt.Fprintln(out, "l7d stopped")
	}()
	if err := waitHealthy(ctx, "http://"+o.L7AdminAt+"/healthz", l7Done); err != nil {
		return fmt.Errorf("l7d did not become healthy (log: %s): %w", l7Log, err)
	}
	_, l7Port, _ := net.SplitHostPort(o.L7At)

	fmt.Fprintf(out, `
Tiergate demo
  state directory     %s (SoftHSM2 token %q, configs, logs)
  site key            %s, RSA-2048, imported into the token as non-extractable (source PEM: site.key)
  keyserverd          %s (mutual TLS), pid %d, log keyserverd.log
  l7d                 https://%s (TCP: TLS 1.2/1.3, h2 + http/1.1; UDP: QUIC, HTTP/3), pid %d, log l7d.log
  metrics             keyserverd %s   l7d http://%s/metrics
  try                 curl --cacert %s --resolve demo.tiergate.test:%s:127.0.0.1 https://demo.tiergate.test:%s/
  stop                Ctrl-C (or kill -INT %d)

`, dir, tok.Label, siteID, o.KeyserverAt, ks.Process.Pid, o.L7At, l7.Process.Pid, metricsURL, o.L7AdminAt,
		filepath.Join(pki, "site-ca.pem"), l7Port, l7Port, os.Getpid())

	// 6. The client loop: a full handshake per request (no session reuse), rotating
	// protocols; each handshake is one signature by keyserverd.
	roots := siteCA.Pool()
	modes := []mode{
		{"HTTP/1.1 TLS 1.3", "h1", tls.VersionTLS13, 0},
		{"HTTP/2 TLS 1.2", "h2", tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
		{"HTTP/3 QUIC", "h3", tls.VersionTLS13, 0},
		{"HTTP/1.1 TLS 1.2", "h1", tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
	}
	ok, failed := 0, 0
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			fmt.Fprintf(out, "\n%d requests completed, %d failed\n", ok, failed)
			if failed > 0 {
				return fmt.Errorf("%d requests failed", failed)
			}
			return nil
		case err := <-ksDone:
			return fmt.Errorf("keyserverd exited: %v (log: %s)", err, logPath)
		case err := <-l7Done:
			return fmt.Errorf("l7d exited: %v (log: %s)", err, l7Log)
		case <-time.After(o.Interval):
		}
		m := modes[(i-1)%len(modes)]
		start := time.Now()
		res, err := m.fetch(ctx, o.L7At, roots)
		took := time.Since(start)
		if err != nil && ctx.Err() != nil {
			continue // stopping: the request was cut short by the stop, not refused
		}
		if err != nil {
			failed++
			fmt.Fprintf(out, "#%-4d %-21s FAILED after %v: %v\n", i, m.name, took.Round(time.Microsecond), err)
			continue
		}
		ok++
		fmt.Fprintf(out, "#%-4d %-21s %-8s %-40s %7.2f ms  %d %q\n", i, m.name, res.proto, res.suite,
			float64(took.Microseconds())/1000, res.status, res.body)
		if i%8 == 0 {
			fmt.Fprintf(out, "      keyserverd: %s\n", scrapeOps(metricsURL))
		}
	}
}

type mode struct {
	name  string
	proto string
	max   uint16
	suite uint16
}

type result struct {
	proto, suite, body string
	status             int
}

// fetch makes one request over a new connection, so each is a full handshake.
func (m mode) fetch(ctx context.Context, addr string, roots *x509.CertPool) (*result, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tcfg := &tls.Config{RootCAs: roots, ServerName: "demo.tiergate.test", MaxVersion: m.max}
	if m.suite != 0 {
		tcfg.CipherSuites = []uint16{m.suite}
	}
	var rt http.RoundTripper
	switch m.proto {
	case "h3":
		t := &http3.Transport{TLSClientConfig: tcfg}
		defer t.Close()
		rt = t
	default:
		t := &http.Transport{TLSClientConfig: tcfg, DisableKeepAlives: true, ForceAttemptHTTP2: m.proto == "h2"}
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
	r := &result{proto: resp.Proto, status: resp.StatusCode, body: strings.TrimSpace(string(body))}
	if resp.TLS != nil {
		r.suite = tls.CipherSuiteName(resp.TLS.CipherSuite)
	}
	return r, nil
}

// scrapeOps summarises tiergate_keyserver_ops_total from keyserverd's /metrics.
func scrapeOps(url string) string {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
	if err != nil {
		return "metrics unavailable: " + err.Error()
	}
	defer resp.Body.Close()
	var parts []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "tiergate_keyserver_ops_total{") && !strings.HasSuffix(line, " 0") {
			l := strings.TrimPrefix(line, "tiergate_keyserver_ops_total")
			parts = append(parts, l)
		}
	}
	if len(parts) == 0 {
		return "no operations yet"
	}
	return "tiergate_keyserver_ops_total " + strings.Join(parts, " ")
}

func waitHealthy(ctx context.Context, url string, exited <-chan error) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case e := <-exited:
			return fmt.Errorf("keyserverd exited: %v", e)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func loadOrCreateRSAKey(path string) (crypto.Signer, error) {
	if data, err := os.ReadFile(path); err == nil {
		k, err := softkey.ParsePEM(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: not a signing key", path)
		}
		return s, nil
	}
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return k, testpki.WritePEM(path, "PRIVATE KEY", der)
}
