// Package demo runs the Tiergate stack on one machine for `make demo`: keyserverd on a
// SoftHSM2 token it creates on first run under a state directory, a TLS server whose
// private key never leaves that token, and a client loop making real full handshakes
// through it.
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

	"github.com/tiergate/tiergate/internal/softhsm"
	"github.com/tiergate/tiergate/internal/testpki"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/client"
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

	// 5. The TLS server: its private key is the token's, reached through keyserverd.
	ksClient, err := client.New(client.Config{
		Servers: []string{o.KeyserverAt},
		TLS:     &tls.Config{Certificates: []tls.Certificate{l7Cert}, RootCAs: ksCA.Pool(), ServerName: "127.0.0.1"},
	})
	if err != nil {
		return err
	}
	defer ksClient.Close()
	remote := ksClient.NewKey(siteID, siteKey.Public())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	web := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from a server whose key is in an HSM (%s)\n", r.TLS.ServerName)
		}),
		TLSConfig: &tls.Config{
			Certificates:           []tls.Certificate{{Certificate: [][]byte{siteDER}, PrivateKey: remote}},
			SessionTicketsDisabled: true, // every handshake is a full one
			CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
				tls.TLS_RSA_WITH_AES_128_GCM_SHA256},
		},
		ReadHeaderTimeout: 5 * time.Second,
	}
	go web.ServeTLS(ln, "", "")
	defer web.Close()

	fmt.Fprintf(out, `
Tiergate demo
  state directory     %s (SoftHSM2 token %q, keyserverd.yaml, keyserverd.log)
  site key            %s, RSA-2048, imported into the token as non-extractable (source PEM: site.key)
  keyserverd          %s (mutual TLS), pid %d
  keyserver metrics   %s
  keyserver health    http://%s/healthz
  TLS server          https://%s (demo.tiergate.test, key offloaded to keyserverd)
  try                 curl --cacert %s --resolve demo.tiergate.test:%d:127.0.0.1 https://demo.tiergate.test:%d/
  stop                Ctrl-C (or kill -INT %d)

`, dir, tok.Label, siteID, o.KeyserverAt, ks.Process.Pid, metricsURL, o.MetricsAt, ln.Addr(),
		filepath.Join(pki, "site-ca.pem"), ln.Addr().(*net.TCPAddr).Port, ln.Addr().(*net.TCPAddr).Port, os.Getpid())

	// 6. The client loop: full handshakes, rotating TLS 1.3, TLS 1.2 ECDHE-RSA and
	// TLS 1.2 RSA key exchange (which makes keyserverd decrypt).
	modes := []struct {
		name  string
		max   uint16
		suite uint16
	}{
		{"TLS 1.3", tls.VersionTLS13, 0},
		{"TLS 1.2 ECDHE-RSA", tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
		{"TLS 1.2 RSA kx", tls.VersionTLS12, tls.TLS_RSA_WITH_AES_128_GCM_SHA256},
	}
	roots := siteCA.Pool()
	ok, failed := 0, 0
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			fmt.Fprintf(out, "\n%d handshakes completed, %d failed\n", ok, failed)
			if failed > 0 {
				return fmt.Errorf("%d handshakes failed", failed)
			}
			return nil
		case err := <-ksDone:
			return fmt.Errorf("keyserverd exited: %v (log: %s)", err, logPath)
		case <-time.After(o.Interval):
		}
		m := modes[(i-1)%len(modes)]
		tcfg := &tls.Config{RootCAs: roots, ServerName: "demo.tiergate.test", MaxVersion: m.max}
		if m.suite != 0 {
			tcfg.CipherSuites = []uint16{m.suite}
		}
		start := time.Now()
		st, body, err := fetch(ctx, ln.Addr().String(), tcfg)
		took := time.Since(start)
		if err != nil {
			failed++
			fmt.Fprintf(out, "#%-4d %-18s FAILED after %v: %v\n", i, m.name, took.Round(time.Microsecond), err)
			continue
		}
		ok++
		fmt.Fprintf(out, "#%-4d %-18s %-40s %7.2f ms  %q\n", i, m.name, tls.CipherSuiteName(st.CipherSuite),
			float64(took.Microseconds())/1000, strings.TrimSpace(body))
		if i%10 == 0 {
			fmt.Fprintf(out, "      keyserverd: %s\n", scrapeOps(metricsURL))
		}
	}
}

func fetch(ctx context.Context, addr string, cfg *tls.Config) (tls.ConnectionState, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := tls.Dialer{Config: cfg}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return tls.ConnectionState{}, "", err
	}
	defer nc.Close()
	tc := nc.(*tls.Conn)
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(nc, "GET / HTTP/1.1\r\nHost: demo.tiergate.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		return tc.ConnectionState(), "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return tc.ConnectionState(), string(b), err
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
