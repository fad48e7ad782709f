// Command hsload drives full TLS handshakes from a bounded number of concurrent
// clients for a bounded time, and reports what happened as one JSON object.
//
// With -keyservers it also serves the target itself: a crypto/tls server whose
// certificate's private key lives on those keyservers (through keyserver/client), so
// integration tests can load a remote key from a process built without the race
// detector. SIGUSR1 marks a moment (say, a keyserver being killed): handshakes that
// complete after it are counted separately.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/client"
)

// Result is the JSON report.
type Result struct {
	Completed      int64   `json:"completed"`
	Failed         int64   `json:"failed"`
	Late           int64   `json:"late"` // ended after deadline + 1s
	CompletedAfter int64   `json:"completed_after_mark"`
	FailedAfter    int64   `json:"failed_after_mark"`
	SlowestSeconds float64 `json:"slowest_s"`
	FirstError     string  `json:"first_error,omitempty"`
	Seconds        float64 `json:"seconds"`
}

func main() {
	var (
		target     = flag.String("target", "", "`host:port` to handshake with (default: the built-in server)")
		serverName = flag.String("servername", "site.test", "SNI and verified name")
		caFile     = flag.String("ca", "", "CA `file` verifying the target (default: no verification)")
		workers    = flag.Int("workers", 500, "concurrent clients")
		duration   = flag.Duration("duration", 4*time.Second, "how long to start new handshakes")
		deadline   = flag.Duration("deadline", 8*time.Second, "deadline of one handshake")
		maxVersion = flag.String("tls", "1.3", "highest TLS version: 1.2 or 1.3")

		keyservers = flag.String("keyservers", "", "comma-separated keyserver `addresses`: serve the target with a remote key")
		certFile   = flag.String("cert", "", "built-in server's certificate `file` (PEM); its key is remote")
		clientCert = flag.String("client-cert", "", "mTLS client certificate `file` for the keyservers")
		clientKey  = flag.String("client-key", "", "mTLS client key `file`")
		ksCA       = flag.String("keyserver-ca", "", "CA `file` verifying the keyservers")
		reqTimeout = flag.Duration("request-timeout", 500*time.Millisecond, "keyserver client attempt timeout")
	)
	flag.Parse()
	if err := run(*target, *serverName, *caFile, *workers, *duration, *deadline, *maxVersion,
		*keyservers, *certFile, *clientCert, *clientKey, *ksCA, *reqTimeout); err != nil {
		fmt.Fprintln(os.Stderr, "hsload:", err)
		os.Exit(1)
	}
}

func run(target, serverName, caFile string, workers int, duration, deadline time.Duration, maxVersion,
	keyservers, certFile, clientCert, clientKey, ksCA string, reqTimeout time.Duration) error {
	if workers <= 0 || workers > 100000 || duration <= 0 || duration > 10*time.Minute {
		return errors.New("workers must be 1..100000 and duration 0..10m")
	}
	if keyservers != "" {
		addr, stop, err := serveRemote(strings.Split(keyservers, ","), certFile, clientCert, clientKey, ksCA, reqTimeout)
		if err != nil {
			return err
		}
		defer stop()
		target = addr
	}
	if target == "" {
		return errors.New("-target or -keyservers is required")
	}
	cfg := &tls.Config{ServerName: serverName, InsecureSkipVerify: caFile == ""}
	if caFile != "" {
		pool, err := loadPool(caFile)
		if err != nil {
			return err
		}
		cfg.RootCAs = pool
	}
	switch maxVersion {
	case "1.2":
		cfg.MaxVersion = tls.VersionTLS12
	case "1.3":
		cfg.MaxVersion = tls.VersionTLS13
	default:
		return fmt.Errorf("-tls %q: want 1.2 or 1.3", maxVersion)
	}
	cfg.ClientSessionCache = nil // every handshake is a full one

	var marked atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		for range sig {
			marked.Store(true)
		}
	}()
	fmt.Fprintf(os.Stderr, "hsload: ready target=%s\n", target)

	var (
		res      Result
		slowest  atomic.Int64
		firstErr sync.Once
		wg       sync.WaitGroup
	)
	start := time.Now()
	stopAt := start.Add(duration)
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stopAt) {
				t0 := time.Now()
				err := handshake(target, cfg, deadline)
				took := time.Since(t0)
				for s := slowest.Load(); int64(took) > s && !slowest.CompareAndSwap(s, int64(took)); s = slowest.Load() {
				}
				if took > deadline+time.Second {
					atomic.AddInt64(&res.Late, 1)
				}
				after := marked.Load()
				if err != nil {
					atomic.AddInt64(&res.Failed, 1)
					if after {
						atomic.AddInt64(&res.FailedAfter, 1)
					}
					firstErr.Do(func() { res.FirstError = err.Error() })
					continue
				}
				atomic.AddInt64(&res.Completed, 1)
				if after {
					atomic.AddInt64(&res.CompletedAfter, 1)
				}
			}
		}()
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.SlowestSeconds = time.Duration(slowest.Load()).Seconds()
	return json.NewEncoder(os.Stdout).Encode(&res)
}

func handshake(addr string, cfg *tls.Config, deadline time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	d := tls.Dialer{Config: cfg}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	// The server's signature is in its first flight: a completed client handshake
	// means the private-key operation was done.
	return nc.Close()
}

// serveRemote starts a TLS server on 127.0.0.1 whose private key is on the keyservers.
func serveRemote(servers []string, certFile, clientCert, clientKey, caFile string, reqTimeout time.Duration) (string, func(), error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return "", nil, err
	}
	var chain [][]byte
	for b, rest := pem.Decode(certPEM); b != nil; b, rest = pem.Decode(rest) {
		chain = append(chain, b.Bytes)
	}
	if len(chain) == 0 {
		return "", nil, fmt.Errorf("%s: no certificate", certFile)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return "", nil, err
	}
	id, err := backend.KeyIDOf(leaf.PublicKey)
	if err != nil {
		return "", nil, err
	}
	mtls, err := tls.LoadX509KeyPair(clientCert, clientKey)
	if err != nil {
		return "", nil, err
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return "", nil, err
	}
	c, err := client.New(client.Config{
		Servers:        servers,
		TLS:            &tls.Config{Certificates: []tls.Certificate{mtls}, RootCAs: pool},
		RequestTimeout: config.Duration(reqTimeout),
		PingInterval:   config.Duration(time.Second),
		ReconnectMin:   config.Duration(50 * time.Millisecond),
		ReconnectMax:   config.Duration(500 * time.Millisecond),
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return "", nil, err
	}
	key := c.NewKey(id, leaf.PublicKey)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates:           []tls.Certificate{{Certificate: chain, PrivateKey: key.PrivateKey(), Leaf: leaf}},
		SessionTicketsDisabled: true,
	})
	if err != nil {
		c.Close()
		return "", nil, err
	}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				nc.SetDeadline(time.Now().Add(30 * time.Second))
				if nc.(*tls.Conn).Handshake() == nil {
					io.WriteString(nc, "ok\n")
				}
			}()
		}
	}()
	// Wait until every keyserver is connected, so the load starts on a warm client.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		up := 0
		for _, s := range c.Stats() {
			if s.Conns > 0 {
				up++
			}
		}
		if up == len(servers) {
			break
		}
	}
	return ln.Addr().String(), func() { ln.Close(); c.Close() }, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return p, nil
}
