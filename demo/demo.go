// Package demo runs the Tiergate stack on one machine for `make demo`: controld with
// its embedded store, keyserverd on a SoftHSM2 token it creates on first run under a
// state directory, l7d nodes terminating TLS 1.2/1.3 and QUIC with the site's private
// key in that token, a backend behind them, and a client loop making real requests,
// each over a full handshake. The nodes' own files hold only their node settings
// (control section, keyservers, tunnel, admin, state directory): the demo configures
// the stack through controld with bin/tgctl, uploading the site certificate with its
// key (which controld imports into keyserverd's token) and applying the listener,
// routing, pool, binding and L4 objects, and prints the tgctl commands to try.
//
// As root, with iproute2, ethtool and libdpdk, the L4 tier is in front: network
// namespaces holding a client, l4d on DPDK net_af_packet ports, two l7d tunnel
// endpoints and the backend, the client reaching the VIP through l4d; elsewhere the
// stack runs on the loopback interface without it.
package demo

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/internal/proc"
	"github.com/tiergate/tiergate/internal/promtext"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/keyserver/softkey"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// The L4 modes of Options.L4.
const (
	L4Auto = "auto" // the L4 tier when it can run here, else the loopback demo
	L4On   = "on"   // the L4 tier, or an error saying why it cannot run
	L4Off  = "off"  // the loopback demo
)

// Options of a demo run. Zero values mean the defaults given.
type Options struct {
	Dir      string        // state directory; default ./.demo
	BinDir   string        // where controld, tgctl, keyserverd, l7d and l4d are; default ./bin
	Duration time.Duration // stop after this long, set-up included; default 0 = until SIGINT/SIGTERM
	Interval time.Duration // between requests; default 500ms

	// L4 is L4Auto (default), L4On or L4Off.
	L4 string
	// NetnsPrefix starts the name of every network namespace of the L4 mode; default
	// "tgdemo-". Namespaces with this prefix left by an earlier run are removed first.
	NetnsPrefix string

	// APIAt is where tgctl reaches controld's API on the host: controld itself in the
	// loopback mode, a relay to controld in the switch's namespace in the L4 mode;
	// default 127.0.0.1:7443.
	APIAt string

	// Addresses of the loopback mode (the L4 mode's are fixed, inside its namespaces).
	KeyserverAt string // keyserverd listen address; default 127.0.0.1:2407
	MetricsAt   string // keyserverd metrics address; default 127.0.0.1:9240
	L7At        string // l7d listener (TCP and UDP); default 127.0.0.1:8443
	L7AdminAt   string // l7d admin (metrics, reload); default 127.0.0.1:9241

	// PrometheusAt is where the demo's Prometheus (Debian's, when installed)
	// answers on the host, in either mode; "off" starts none. Default
	// 127.0.0.1:9090.
	PrometheusAt string
}

func (o *Options) setDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.Dir, ".demo")
	def(&o.BinDir, "bin")
	def(&o.L4, L4Auto)
	def(&o.NetnsPrefix, "tgdemo-")
	def(&o.APIAt, "127.0.0.1:7443")
	def(&o.KeyserverAt, "127.0.0.1:2407")
	def(&o.MetricsAt, "127.0.0.1:9240")
	def(&o.L7At, "127.0.0.1:8443")
	def(&o.L7AdminAt, "127.0.0.1:9241")
	def(&o.PrometheusAt, "127.0.0.1:9090")
	if o.Interval <= 0 {
		o.Interval = 500 * time.Millisecond
	}
}

// Main is the tgdemo command.
func Main(args []string, stdout, stderr io.Writer) int {
	var o Options
	fs := flag.NewFlagSet("tgdemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Dir, "dir", ".demo", "state `directory` (token, keys, configs, logs)")
	fs.StringVar(&o.BinDir, "bin", "bin", "`directory` holding controld, tgctl, keyserverd, l7d and l4d")
	fs.DurationVar(&o.Duration, "duration", 0, "stop after this long, set-up included (0: run until Ctrl-C)")
	fs.DurationVar(&o.Interval, "interval", 500*time.Millisecond, "pause between requests")
	fs.StringVar(&o.L4, "l4", L4Auto, "the L4 tier in network namespaces: auto (when root with ip, ethtool and libdpdk), on, off")
	fs.StringVar(&o.NetnsPrefix, "netns-prefix", "tgdemo-", "`prefix` of the L4 mode's network namespaces")
	fs.StringVar(&o.APIAt, "api", "127.0.0.1:7443", "controld's API `address` on the host, for tgctl")
	fs.StringVar(&o.KeyserverAt, "keyserver", "127.0.0.1:2407", "keyserverd listen `address` (loopback mode)")
	fs.StringVar(&o.MetricsAt, "metrics", "127.0.0.1:9240", "keyserverd metrics `address` (loopback mode)")
	fs.StringVar(&o.L7At, "l7", "127.0.0.1:8443", "l7d listener `address`, TCP and UDP (loopback mode)")
	fs.StringVar(&o.L7AdminAt, "l7-admin", "127.0.0.1:9241", "l7d admin `address` (loopback mode)")
	fs.StringVar(&o.PrometheusAt, "prometheus", "127.0.0.1:9090", "`address` of the demo's Prometheus on the host (started when installed), or off")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tgdemo: unexpected arguments %q\n", fs.Args())
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A closed stdout (`| head`, a tee stopped by the same Ctrl-C) must not kill tgdemo
	// halfway through tearing down: its writes fail instead.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
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

// Run runs the demo until ctx is done, then tears down everything it started.
func Run(ctx context.Context, o Options, out io.Writer) error {
	o.setDefaults()
	if o.L4 != L4Auto && o.L4 != L4On && o.L4 != L4Off {
		return fmt.Errorf("-l4 %q: want auto, on or off", o.L4)
	}
	for _, b := range []string{"controld", "tgctl", "keyserverd", "l7d"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("%s binary: %w (run `make build`)", b, err)
		}
	}
	useL4 := o.L4 != L4Off
	if useL4 {
		if why := l4Unavailable(o.BinDir); why != "" {
			if o.L4 == L4On {
				return fmt.Errorf("cannot run the L4 tier: %s", why)
			}
			fmt.Fprintf(out, "tgdemo: L4 tier skipped: %s; running the loopback demo (-l4=on makes this an error)\n", why)
			useL4 = false
		}
	}
	st, err := prepare(o.Dir)
	if err != nil {
		return err
	}
	if !useL4 {
		return runLoopback(ctx, o, st, out)
	}
	err = runL4(ctx, o, st, out)
	var na *notAvailableError
	if errors.As(err, &na) && o.L4 == L4Auto {
		fmt.Fprintf(out, "tgdemo: L4 tier skipped: %v; running the loopback demo (-l4=on makes this an error)\n", na)
		return runLoopback(ctx, o, st, out)
	}
	return err
}

// notAvailableError is a failure to build the L4 mode's network, before any daemon
// started: the machine cannot run it.
type notAvailableError struct{ err error }

func (e *notAvailableError) Error() string { return "building the demo network: " + e.err.Error() }
func (e *notAvailableError) Unwrap() error { return e.err }

// site is the material every mode shares: the token holding the site key, and the
// certificates of the site and of the mutual TLS between keyserverd and its clients
// (l7d, controld).
type site struct {
	dir     string
	tok     *softhsm.Token
	pinFile string
	keyPath string // the site key's source PEM, which tgctl cert upload sends to controld
	keyID   protocol.KeyID
	pki     string // directory of the certificates below
	roots   *x509.CertPool

	siteCert   string // the site's certificate (RSA); its key goes into the token by controld's upload
	siteCA     string
	ecdsaCert  string // a second site certificate, ECDSA P-256, for people to upload
	ecdsaKey   string
	ctlCert    string // controld's client certificate towards keyserverd (CN tiergate-controld)
	ctlKey     string
	ksCert     string // keyserverd's server certificate (127.0.0.1 and the L4 bridge address)
	ksKey      string
	ksCA       string
	l7Cert     string // l7d's client certificate towards keyserverd
	l7Key      string
	l7ClientCA string
}

// prepare opens or creates the token and the site keys under dir, and writes fresh
// certificates.
func prepare(dir string) (*site, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the state directory: %w", err)
	}
	st := &site{dir: dir, pki: filepath.Join(dir, "pki"), pinFile: filepath.Join(dir, "token.pin"), keyPath: filepath.Join(dir, "site.key")}

	// The token: created on the first run, reused after.
	st.tok, err = softhsm.OpenOrCreateToken(filepath.Join(dir, "softhsm"), "tiergate-demo", "demo-so-pin", "demo-pin")
	if err != nil {
		return nil, fmt.Errorf("SoftHSM2 token: %w", err)
	}
	if err := os.WriteFile(st.pinFile, []byte(st.tok.PIN+"\n"), 0o600); err != nil {
		return nil, err
	}

	// The site key: generated once, imported into the token by controld's upload at
	// every run (an import of a key the token holds writes nothing).
	siteKey, err := loadOrCreateKey(st.keyPath, func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, 2048) })
	if err != nil {
		return nil, err
	}
	if st.keyID, err = backend.KeyIDOf(siteKey.Public()); err != nil {
		return nil, err
	}

	// Certificates: mutual TLS between the L7 side and keyserverd, and the site's.
	if err := os.MkdirAll(st.pki, 0o700); err != nil {
		return nil, err
	}
	mtls, err := testpki.NewMutualTLS(st.pki, "Tiergate demo keyserver", "keyserverd", []string{"127.0.0.1", l4KeyserverIP}, "l7-demo")
	if err != nil {
		return nil, err
	}
	st.ksCert, st.ksKey, st.l7ClientCA = mtls.ServerCert, mtls.ServerKey, mtls.ClientCAFile
	st.ksCA, st.l7Cert, st.l7Key = mtls.ServerCAFile, mtls.ClientCert, mtls.ClientKey
	ctl, err := mtls.ClientCA.Leaf("tiergate-controld")
	if err != nil {
		return nil, err
	}
	if _, err := mtls.ClientCA.WriteFiles(st.pki, "client", mtls.ClientLeaf, ctl); err != nil {
		return nil, err
	}
	st.ctlCert, st.ctlKey = filepath.Join(st.pki, "tiergate-controld.pem"), filepath.Join(st.pki, "tiergate-controld.key")
	siteCA, err := newSiteCA("Tiergate demo site CA")
	if err != nil {
		return nil, err
	}
	siteDER, err := issueSite(siteCA, siteKey.Public(), "demo.tiergate.test")
	if err != nil {
		return nil, err
	}
	st.siteCert = filepath.Join(st.pki, "site.pem")
	if err := testpki.WritePEM(st.siteCert, "CERTIFICATE", siteDER); err != nil {
		return nil, err
	}
	if st.siteCA, err = siteCA.WriteFiles(st.pki, "site"); err != nil {
		return nil, err
	}
	st.ecdsaKey = filepath.Join(st.pki, "site-ecdsa.key")
	ecKey, err := loadOrCreateKey(st.ecdsaKey, func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) })
	if err != nil {
		return nil, err
	}
	ecDER, err := issueSite(siteCA, ecKey.Public(), "demo.tiergate.test")
	if err != nil {
		return nil, err
	}
	st.ecdsaCert = filepath.Join(st.pki, "site-ecdsa.pem")
	if err := testpki.WritePEM(st.ecdsaCert, "CERTIFICATE", ecDER); err != nil {
		return nil, err
	}
	st.roots = siteCA.Pool()
	return st, nil
}

// startKeyserverd writes keyserverd's configuration and starts keyserverd in ns, a
// node of the control plane (it reports itself; keys come through controld's
// uploads); it returns once keyserverd is healthy.
func (st *site) startKeyserverd(ctx context.Context, s *stack, ns *netNS, listen, metrics string) (*proc.Process, error) {
	cfgPath := filepath.Join(st.dir, "keyserverd.yaml")
	if err := os.WriteFile(cfgPath, []byte(st.keyserverdConfig(listen, metrics)), 0o600); err != nil {
		return nil, err
	}
	ksBin := filepath.Join(s.bin, "keyserverd")
	env := append(os.Environ(), st.tok.Env()...)
	ks, err := s.start("keyserverd", filepath.Join(st.dir, "keyserverd.log"), env, ns, ksBin, "run", "-config", cfgPath)
	if err != nil {
		return nil, err
	}
	// Its /healthz says 503 until it holds a key, which the upload brings: it is
	// ready once its admin endpoint answers and controld is connected to it.
	if err := ks.WaitHTTP(ctx, nsHTTP(ns, time.Second), "http://"+metrics+"/metrics", healthWait); err != nil {
		return nil, err
	}
	return ks, waitConnected(ctx, ks, nsHTTP(ns, time.Second), "http://"+metrics+"/metrics")
}

// waitConnected waits until a client holds a connection to keyserverd (by its
// tiergate_keyserver_connections): controld, started before it, whose keyserver
// client retries with a growing backoff and must be connected for an upload to
// import its key.
func waitConnected(ctx context.Context, ks *proc.Process, hc *http.Client, metricsURL string) error {
	deadline := time.Now().Add(healthWait)
	for {
		ss, err := promtext.Get(ctx, hc, metricsURL)
		if err == nil && ss.Sum("tiergate_keyserver_connections") >= 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controld did not connect to keyserverd within %v (logs controld.log, %s)", healthWait, ks.Log)
		}
		select {
		case <-ks.Done():
			return ks.Exited()
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// keyserverdConfig is keyserverd's configuration.
func (st *site) keyserverdConfig(listen, metrics string) string {
	return fmt.Sprintf(`# Written by tgdemo on every run.
listen: %q
metrics_listen: %q
state_dir: %q   # keyserverd's generated admin token: admin.token
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
  - name: tiergate-controld   # imports the keys of certificate uploads
    keys: ["*"]
    admin: true
%s`, listen, metrics, filepath.Join(st.dir, "keyserverd-state"), st.ksCert, st.ksKey, st.l7ClientCA, st.tok.Module, st.tok.Label, st.pinFile,
		st.controlSection("keyserverd"))
}

// l7Config is what differs between the demo's l7d configurations: the node's own
// settings only, the listeners, routing, pools and certificates coming from controld.
type l7Config struct {
	node, admin, keyserver string
	quicID                 int      // the listener's QUIC server ID on this node; 0: none
	tunnelLDs              []string // the LDs' tunnel addresses; none: no tunnel
	// adminInsecure serves a non-loopback admin address without a token: the node's
	// namespace keeps everyone but the LD's health checks and tgdemo out.
	adminInsecure bool
	// stateDir is l7d's state_dir: its generated admin token and its cache of the
	// control plane's configuration. Required.
	stateDir string
}

// writeL7Config writes an l7d configuration to path.
func (st *site) writeL7Config(path string, c l7Config) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by tgdemo on every run. The listeners, routing, pools and certificates\n# come from controld (%s).\n", filepath.Join(st.dir, "stack.yaml"))
	b.WriteString(st.controlSection(c.node))
	if c.quicID != 0 {
		fmt.Fprintf(&b, "node_listeners:   # this node's own settings of the control plane's listener\n  %s: {quic_server_id: %d}\n", listenerName, c.quicID)
	}
	fmt.Fprintf(&b, `keyservers:   # the certificates' keys are in keyserverd's token
  servers: [%q]
  cert_file: %q
  key_file: %q
  ca_file: %q
`, c.keyserver, st.l7Cert, st.l7Key, st.ksCA)
	if len(c.tunnelLDs) > 0 {
		q := make([]string, len(c.tunnelLDs))
		for i, a := range c.tunnelLDs {
			q[i] = strconv.Quote(a)
		}
		// A dead LD's flows: their replies are copied to the other LD once the dead
		// one has been silent for ld_dead_after (1 s), and follow a packet of theirs
		// through the other LD at once; move_idle 2s is the fallback for a flow whose
		// LD still sends other traffic.
		fmt.Fprintf(&b, "tunnel: {vips: [%q], lds: [%s], key: %d, move_idle: 2s}   # l7d's own end of the LDs' GRE tunnel, l4d's key\n",
			l4VIP, strings.Join(q, ", "), l4TunnelKey)
	}
	fmt.Fprintf(&b, "admin_listen: %q\n", c.admin)
	if c.adminInsecure {
		b.WriteString("admin_insecure: true   # in the node's own network namespace\n")
	}
	fmt.Fprintf(&b, "state_dir: %q   # l7d's generated admin token (admin.token) and control-snapshot.json\nshutdown_grace: 2s\n", c.stateDir)
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// backendHandler answers with the L7 node the request came from and the client
// address that node reported.
func backendHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "hello from the backend: l7d=%s client=%s proto=%s\n", node, r.Header.Get("X-Real-Ip"), r.Header.Get("X-Forwarded-Proto"))
	})
}

// serveBackend serves backendHandler on ln until the stack closes.
func serveBackend(s *stack, ln net.Listener) {
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: backendHandler()}
	go srv.Serve(ln)
	s.onClose(func() { srv.Close() })
}

// runLoopback runs controld, keyserverd, l7d and the backend on the host, at the
// addresses of o.
func runLoopback(ctx context.Context, o Options, st *site, out io.Writer) error {
	s := newStack(out, o.BinDir)
	defer s.close()
	s.onClose(func() { fmt.Fprintln(out, "state kept in", st.dir) })

	ctld, err := st.startControld(ctx, s, nil, o.APIAt, o.KeyserverAt)
	if err != nil {
		return err
	}
	ks, err := st.startKeyserverd(ctx, s, nil, o.KeyserverAt, o.MetricsAt)
	if err != nil {
		return err
	}
	backendLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening for the backend: %w", err)
	}
	serveBackend(s, backendLn)

	// The configuration, through controld; then l7d, which starts from it.
	tg, err := st.newTgctl(o.BinDir, o.APIAt, out)
	if err != nil {
		return err
	}
	if err := st.configure(ctx, tg, stackYAML(o.L7At, backendLn.Addr().String(), false)); err != nil {
		return err
	}
	l7Cfg := filepath.Join(st.dir, "l7d.yaml")
	l7State := filepath.Join(st.dir, "l7d-state")
	if err := st.writeL7Config(l7Cfg, l7Config{node: "l7d", admin: o.L7AdminAt, keyserver: o.KeyserverAt, stateDir: l7State}); err != nil {
		return err
	}
	l7, err := s.start("l7d", filepath.Join(st.dir, "l7d.log"), nil, nil, filepath.Join(o.BinDir, "l7d"), "run", "-config", l7Cfg)
	if err != nil {
		return err
	}
	if err := l7.WaitHTTP(ctx, nsHTTP(nil, time.Second), "http://"+o.L7AdminAt+"/healthz", healthWait); err != nil {
		return err
	}
	if err := st.rolledOut(ctx, tg); err != nil {
		return err
	}
	tryDir, err := st.writeTryFiles(false)
	if err != nil {
		return err
	}
	host, l7Port, _ := net.SplitHostPort(o.L7At)
	metricsURL := "http://" + o.MetricsAt + "/metrics"
	promURL := ""
	if o.PrometheusAt != "off" {
		jobs := []promJob{{"l7d", []string{o.L7AdminAt}}, {"keyserverd", []string{o.MetricsAt}}}
		if ok, err := st.startPrometheus(ctx, s, nil, o.PrometheusAt, jobs, out); err != nil {
			return err
		} else if ok {
			promURL = "http://" + o.PrometheusAt
		}
	}

	fmt.Fprintf(out, `
Tiergate demo (loopback, no L4 tier), configured through controld
  state directory     %s (SoftHSM2 token %q, configs, logs)
  site key            %s, RSA-2048, imported into the token as non-extractable by controld's upload (source PEM: site.key)
  controld            %s, pid %d, log controld.log; its store %s, which the nodes reach at %s
  keyserverd          %s (mutual TLS), pid %d, log keyserverd.log
  l7d                 https://%s (TCP: TLS 1.2/1.3, h2 + http/1.1; UDP: QUIC, HTTP/3), pid %d, log l7d.log
  metrics             keyserverd %s   l7d http://%s/metrics
  keyserverd status   curl -s -H "Authorization: Bearer $(cat %s)" http://%s/status
  l7d blacklists      curl -s -H "Authorization: Bearer $(cat %s)" http://%s/blacklists
%s%s  try                 curl --cacert %s --resolve demo.tiergate.test:%s:%s https://demo.tiergate.test:%s/
  stop                Ctrl-C (or kill -INT %d)

`, st.dir, st.tok.Label, st.keyID, tg.api, ctld.PID(), filepath.Join(st.controlDir(), "store"), st.etcdEndpoint(), o.KeyserverAt, ks.PID(), o.L7At, l7.PID(), metricsURL, o.L7AdminAt,
		filepath.Join(st.dir, "keyserverd-state", "admin.token"), o.MetricsAt, filepath.Join(l7State, "admin.token"), o.L7AdminAt,
		st.tryText(tg, tryDir, "", o.L7At), st.dashboardText(tg, o.APIAt, promURL), st.siteCA, l7Port, host, l7Port, os.Getpid())

	hc := nsHTTP(nil, 2*time.Second)
	return clientLoop(ctx, s, target{
		addr:     o.L7At,
		roots:    st.roots,
		interval: o.Interval,
		nodes:    map[string]string{host: "l7d"},
		summary:  func() []string { return []string{"keyserverd: " + keyserverOps(hc, metricsURL)} },
	}, out)
}

// loadOrCreateKey reads the private key at path, or generates one with gen and
// writes it there.
func loadOrCreateKey(path string, gen func() (crypto.Signer, error)) (crypto.Signer, error) {
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
	k, err := gen()
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return k, testpki.WritePEM(path, "PRIVATE KEY", der)
}
