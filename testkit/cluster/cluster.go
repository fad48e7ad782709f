// Package cluster starts a Tiergate control-plane cluster as real processes from
// built binaries (make build's bin/, or the integration tests' build): controld with
// its embedded etcd, or pointed at an external etcd process (Debian's etcd-server)
// that the cluster starts; keyserverd processes on SoftHSM2 tokens of their own,
// each a node of the control plane; l7d nodes fed only by controld's store; and,
// where DPDK runs, l4d nodes on null devices fed the same way.
// The end-to-end tests (integration/control_test.go) and the control plane's
// benchmark (bench/control, its certificate phase) share it.
//
// Everything is on loopback, in the directory the caller gives: the PKI (the
// keyservers' mutual TLS and a site CA for the certificates uploaded), the
// daemons' configuration files, state directories and logs, the store's data and
// the tokens. A node reaches the store by the embedded etcd's unix socket path
// (which works across network namespaces too) or by the external etcd's loopback
// URL; with Options.EtcdListen the l7d nodes take controld's -etcd-listen URL
// instead. Close stops every process the cluster started.
//
// l7d serves nothing until the configuration holds a listener and the certificates
// it needs, so a caller starts the cluster (Start: the store, controld and the
// keyservers), uploads and applies through controld's API, and only then adds the
// l7d nodes (AddL7).
package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tiergate/tiergate/internal/proc"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// Options say what Start starts. The zero value of every optional field means its
// documented default.
type Options struct {
	// Bin is the directory holding controld, keyserverd and l7d (and l4d for
	// AddL4). Required.
	Bin string

	// Dir is where everything is written (configuration, state, logs, the store's
	// data); the caller removes it. Its path must leave room for the embedded
	// etcd's unix socket (Dir/controld/data/store/etcd.sock within 107 bytes).
	// Required.
	Dir string

	// ExternalEtcd starts an etcd process (EtcdBin) on loopback and points
	// controld and the nodes at it instead of controld's embedded etcd. Default
	// false: the embedded one, nodes on its unix socket.
	ExternalEtcd bool

	// EtcdListen has controld's embedded etcd also serve a loopback URL
	// (-etcd-listen), which the l7d nodes then use as their etcd_endpoints; the
	// keyservers and l4d keep the unix socket. Only embedded. Default false: every
	// node on the unix socket.
	EtcdListen bool

	// EtcdBin is the etcd binary of ExternalEtcd. Default "etcd" in $PATH.
	EtcdBin string

	// Keyservers is the number of keyserverd processes. Default 2.
	Keyservers int

	// Listener is the name of the listener the l7d nodes bind on a loopback port
	// of their own (their node_listeners). Default "web".
	Listener string

	// StartTimeout bounds the start of each process (until its health check
	// answers). Default 20s.
	StartTimeout time.Duration

	// ControldExtra is YAML appended to controld's configuration file, such as a
	// crowdsec section. Default none.
	ControldExtra string

	// L7ClientIP is the client_ip of the l7d nodes' listener (Options.Listener),
	// as a YAML flow mapping, such as `{proxy_protocol: true, proxy_trusted:
	// ["127.0.0.1"]}`. Default none: the client is the connection's peer.
	L7ClientIP string

	// LogLevel is the log_level of controld and of every node. Default debug.
	LogLevel string
}

// Cluster is a running cluster.
type Cluster struct {
	Opts Options

	// KeyserverPKI is the keyservers' mutual TLS: their server certificate (for
	// 127.0.0.1), the CA the clients trust, and the client CA that issues the l7d
	// nodes' ("l7-node") and controld's ("tiergate-controld") certificates.
	KeyserverPKI *testpki.MutualTLS
	// SiteCA issues the certificates a caller uploads (IssueSite); SiteCAFile is its
	// certificate (PEM), for curl and openssl.
	SiteCA     *testpki.CA
	SiteCAFile string

	// Etcd is the external etcd (nil when embedded).
	Etcd *Proc
	// Controld is controld; API is its URL (http://127.0.0.1:port) and Token the
	// first admin token it generated.
	Controld *Proc
	API      string
	Token    string
	// StoreEndpoint is what the nodes have as control.etcd_endpoints: the
	// embedded etcd's unix socket (unix:///...) or the external etcd's URL.
	// L7Endpoint is the l7d nodes': controld's -etcd-listen URL with EtcdListen,
	// else StoreEndpoint.
	StoreEndpoint, L7Endpoint string
	// StoreDir is the store's data: the embedded etcd's or the external one's.
	StoreDir string

	Keyservers []*Keyserver
	L7         []*L7
	L4         []*L4

	l7ClientCert, l7ClientKey string
}

// Proc is one process of the cluster: started, checked by its health URL, stopped
// or killed, and started again with the same configuration.
type Proc struct {
	// Name is how messages name it ("l7d l7-a").
	Name string
	// Dir holds its configuration, state and log.
	Dir string
	// Log is its standard output and error, over every run.
	Log string

	args    []string
	env     []string
	health  string
	timeout time.Duration
	// termExit: the process ends on SIGTERM by the signal (etcd), which is a
	// clean stop.
	termExit bool
	p        *proc.Process
}

// Keyserver is a keyserverd on a SoftHSM2 token of its own, reporting itself as a
// node of the control plane.
type Keyserver struct {
	Proc
	// Node is its name in the control plane ("ks-1").
	Node string
	// Addr is its client (mTLS) address, Admin its admin endpoint.
	Addr, Admin string
	// Token is its SoftHSM2 token; its directory is the only place a key uploaded
	// may be.
	Token *softhsm.Token
}

// L7 is an l7d fed only by controld's store.
type L7 struct {
	Proc
	// Node is its name in the control plane ("l7-a").
	Node string
	// Listen is where it binds the cluster's listener (Options.Listener), TCP and
	// UDP (QUIC); Admin its admin endpoint.
	Listen, Admin string
	// StateDir is its state_dir; CacheFile the snapshot it keeps there.
	StateDir, CacheFile string
}

// PID is the process's ID while it runs, 0 when it does not.
func (p *Proc) PID() int {
	if p == nil || p.p == nil {
		return 0
	}
	return p.p.PID()
}

// Start starts the store (external etcd when asked), the keyservers and controld,
// and waits for each to answer. On an error it stops what it started.
func Start(ctx context.Context, o Options) (_ *Cluster, err error) {
	if o.Bin == "" || o.Dir == "" {
		return nil, errors.New("cluster: Bin and Dir are required")
	}
	if o.Keyservers == 0 {
		o.Keyservers = 2
	}
	if o.EtcdBin == "" {
		o.EtcdBin = "etcd"
	}
	if o.Listener == "" {
		o.Listener = "web"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 20 * time.Second
	}
	if o.LogLevel == "" {
		o.LogLevel = "debug"
	}
	if o.Bin, err = filepath.Abs(o.Bin); err != nil {
		return nil, err
	}
	for _, b := range []string{"controld", "keyserverd", "l7d"} {
		if _, err := os.Stat(filepath.Join(o.Bin, b)); err != nil {
			return nil, fmt.Errorf("cluster: %s not built (make build): %w", b, err)
		}
	}
	c := &Cluster{Opts: o}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.pki(); err != nil {
		return nil, err
	}
	if o.ExternalEtcd {
		if err := c.startEtcd(ctx); err != nil {
			return nil, err
		}
	}
	// The keyservers first, for controld's keyservers section; their agents
	// reach the store once controld (its embedded etcd) is up.
	for i := range o.Keyservers {
		if err := c.prepareKeyserver(fmt.Sprintf("ks-%d", i+1)); err != nil {
			return nil, err
		}
		if err := c.Keyservers[i].Start(ctx); err != nil {
			return nil, err
		}
	}
	if err := c.startControld(ctx); err != nil {
		return nil, err
	}
	var names []string
	for _, ks := range c.Keyservers {
		names = append(names, ks.Node)
	}
	if err := c.WaitNodes(ctx, o.StartTimeout, names...); err != nil {
		return nil, fmt.Errorf("cluster: the keyservers report to the store: %w", err)
	}
	return c, nil
}

// pki writes the keyservers' mutual TLS, the client certificates of the l7d nodes
// and controld, and the site CA.
func (c *Cluster) pki() error {
	dir := filepath.Join(c.Opts.Dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	m, err := testpki.NewMutualTLS(dir, "keyserver", "keyserverd", []string{"127.0.0.1"}, "l7-node")
	if err != nil {
		return fmt.Errorf("cluster: keyservers' PKI: %w", err)
	}
	c.KeyserverPKI = m
	c.l7ClientCert, c.l7ClientKey = m.ClientCert, m.ClientKey
	ctl, err := m.ClientCA.Leaf("tiergate-controld")
	if err != nil {
		return err
	}
	if _, err := m.ClientCA.WriteFiles(dir, "keyserver-client", ctl); err != nil {
		return err
	}
	if c.SiteCA, err = testpki.NewCA("site CA"); err != nil {
		return err
	}
	c.SiteCAFile = filepath.Join(dir, "site-ca.pem")
	return testpki.WritePEM(c.SiteCAFile, "CERTIFICATE", c.SiteCA.DER)
}

// FreePort returns a loopback address with a port free for TCP (and, as far as
// can be told, UDP) at the time of the call.
func FreePort() (string, error) {
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		udp, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err == nil {
			udp.Close()
			return addr, nil
		}
	}
	return "", errors.New("no free loopback port for TCP and UDP")
}

func freePorts(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		a, err := FreePort()
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

// startEtcd starts the external etcd on two loopback ports (client and peer).
func (c *Cluster) startEtcd(ctx context.Context) error {
	bin, err := exec.LookPath(c.Opts.EtcdBin)
	if err != nil {
		return fmt.Errorf("cluster: the external etcd (Debian's etcd-server): %w", err)
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.Opts.Dir, "etcd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	client, peer := "http://"+ports[0], "http://"+ports[1]
	c.StoreDir = filepath.Join(dir, "data")
	c.StoreEndpoint = client
	c.Etcd = &Proc{Name: "etcd", Dir: dir, termExit: true, Log: filepath.Join(dir, "etcd.log"), health: client + "/health", timeout: c.Opts.StartTimeout,
		args: []string{bin, "--name", "tiergate-test", "--data-dir", c.StoreDir,
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "tiergate-test=" + peer, "--initial-cluster-state", "new",
			"--log-level", "warn"}}
	return c.Etcd.Start(ctx)
}

// prepareKeyserver creates a SoftHSM2 token and the configuration of a keyserverd
// on it, with a control section.
func (c *Cluster) prepareKeyserver(node string) error {
	dir := filepath.Join(c.Opts.Dir, node)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tok, err := softhsm.CreateToken(filepath.Join(dir, "token"), node, "so-pin-1234", "pin-1234")
	if err != nil {
		return fmt.Errorf("cluster: %s's token: %w", node, err)
	}
	pinFile := filepath.Join(dir, "pin")
	if err := os.WriteFile(pinFile, []byte(tok.PIN+"\n"), 0o600); err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	ks := &Keyserver{Node: node, Addr: ports[0], Admin: ports[1], Token: tok}
	cfgPath := filepath.Join(dir, "keyserverd.yaml")
	cfg := fmt.Sprintf(`listen: %q
admin_listen: %q
state_dir: %q
log_level: `+c.Opts.LogLevel+`
shutdown_grace: 5s
tls:
  cert_file: %q
  key_file: %q
  client_ca_file: %q
pkcs11:
  module: %q
  token_label: %q
  pin_file: %q
clients:
  - name: l7-node
    keys: ["*"]
    ops: ["*"]
  - name: tiergate-controld
    keys: ["*"]
    admin: true
control:
  node: %s
  etcd_endpoints: [%q]
  dial_timeout: 1s
`, ks.Addr, ks.Admin, filepath.Join(dir, "state"), c.KeyserverPKI.ServerCert, c.KeyserverPKI.ServerKey, c.KeyserverPKI.ClientCAFile,
		tok.Module, tok.Label, pinFile, node, c.storeEndpointFor())
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	// keyserverd is healthy once it serves a key: a bootstrap key of its own,
	// imported with keyserverd import as an operator would, before the uploads.
	boot, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	bootPEM, err := testpki.KeyPEM(boot)
	if err != nil {
		return err
	}
	bootFile := filepath.Join(dir, "bootstrap.key")
	if err := os.WriteFile(bootFile, bootPEM, 0o600); err != nil {
		return err
	}
	imp := exec.Command(filepath.Join(c.Opts.Bin, "keyserverd"), "import", "-config", cfgPath, "-label", "bootstrap", "-key", bootFile)
	imp.Env = append(os.Environ(), tok.Env()...)
	if out, err := imp.CombinedOutput(); err != nil {
		return fmt.Errorf("cluster: keyserverd import into %s's token: %v\n%s", node, err, out)
	}
	if err := os.Remove(bootFile); err != nil {
		return err
	}
	ks.Proc = Proc{Name: "keyserverd " + node, Dir: dir, Log: filepath.Join(dir, "keyserverd.log"), env: tok.Env(),
		health: "http://" + ks.Admin + "/healthz", timeout: c.Opts.StartTimeout,
		args: []string{filepath.Join(c.Opts.Bin, "keyserverd"), "run", "-config", cfgPath}}
	c.Keyservers = append(c.Keyservers, ks)
	return nil
}

// storeEndpointFor is the endpoint nodes use, known before controld starts: the
// external etcd's URL or the embedded etcd's socket in controld's data directory.
func (c *Cluster) storeEndpointFor() string {
	if c.Opts.ExternalEtcd {
		return c.StoreEndpoint
	}
	return "unix://" + filepath.Join(c.Opts.Dir, "controld", "data", "store", "etcd.sock")
}

// startControld writes controld's configuration (the keyservers section naming
// every keyserver) and starts it, then reads the first admin token.
func (c *Cluster) startControld(ctx context.Context) error {
	dir := filepath.Join(c.Opts.Dir, "controld")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	listen, err := FreePort()
	if err != nil {
		return err
	}
	data := filepath.Join(dir, "data")
	var servers []string
	for _, ks := range c.Keyservers {
		servers = append(servers, fmt.Sprintf("%q", ks.Addr))
	}
	pki := filepath.Join(c.Opts.Dir, "pki")
	cfg := fmt.Sprintf(`data_dir: %q
listen: %q
log_level: `+c.Opts.LogLevel+`
keyservers:
  servers: [%s]
  cert_file: %q
  key_file: %q
  ca_file: %q
  timeout: 3s
  request_timeout: 3s
  ping_interval: 1s
  dial_timeout: 2s
  reconnect_min: 50ms
  reconnect_max: 500ms
`, data, listen, strings.Join(servers, ", "), filepath.Join(pki, "tiergate-controld.pem"), filepath.Join(pki, "tiergate-controld.key"),
		c.KeyserverPKI.ServerCAFile)
	if c.Opts.ExternalEtcd {
		cfg += fmt.Sprintf("etcd_endpoints: [%q]\n", c.StoreEndpoint)
	} else {
		c.StoreDir = filepath.Join(data, "store")
		c.StoreEndpoint = c.storeEndpointFor()
	}
	c.L7Endpoint = c.StoreEndpoint
	if c.Opts.EtcdListen && !c.Opts.ExternalEtcd {
		// A fixed port, so that the URL stays the same across restarts of controld.
		port, err := FreePort()
		if err != nil {
			return err
		}
		c.L7Endpoint = "http://" + port
		cfg += fmt.Sprintf("etcd_listen: %q\n", c.L7Endpoint)
	}
	if c.Opts.ControldExtra != "" {
		cfg += strings.TrimSuffix(c.Opts.ControldExtra, "\n") + "\n"
	}
	cfgPath := filepath.Join(dir, "controld.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	c.API = "http://" + listen
	c.Controld = &Proc{Name: "controld", Dir: dir, Log: filepath.Join(dir, "controld.log"), health: c.API + "/healthz",
		timeout: c.Opts.StartTimeout, args: []string{filepath.Join(c.Opts.Bin, "controld"), "run", "-config", cfgPath}}
	if err := c.Controld.Start(ctx); err != nil {
		return err
	}
	tok, err := os.ReadFile(filepath.Join(data, "admin.token"))
	if err != nil {
		return fmt.Errorf("cluster: controld's first admin token: %w", err)
	}
	c.Token = strings.TrimSpace(string(tok))
	return nil
}

// AddL7 writes the configuration of an l7d node named node (its own loopback port
// for the cluster's listener, both keyservers, a control section on the store) and
// starts it; it answers once it has applied a configuration, which must hold the
// listener by then.
func (c *Cluster) AddL7(ctx context.Context, node string) (*L7, error) {
	dir := filepath.Join(c.Opts.Dir, node)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	l := &L7{Node: node, Listen: ports[0], Admin: ports[1], StateDir: filepath.Join(dir, "state")}
	l.CacheFile = filepath.Join(l.StateDir, "control-snapshot.json")
	var servers []string
	for _, ks := range c.Keyservers {
		servers = append(servers, fmt.Sprintf("%q", ks.Addr))
	}
	cfgPath := filepath.Join(dir, "l7d.yaml")
	clientIP := ""
	if c.Opts.L7ClientIP != "" {
		clientIP = ", client_ip: " + c.Opts.L7ClientIP
	}
	cfg := fmt.Sprintf(`control:
  node: %s
  etcd_endpoints: [%q]
  dial_timeout: 1s
keyservers:
  servers: [%s]
  cert_file: %q
  key_file: %q
  ca_file: %q
node_listeners:
  %s: {addr: %q%s}
state_dir: %q
admin_listen: %q
log_level: `+c.Opts.LogLevel+`
`, node, c.L7Endpoint, strings.Join(servers, ", "), c.l7ClientCert, c.l7ClientKey, c.KeyserverPKI.ServerCAFile,
		c.Opts.Listener, l.Listen, clientIP, l.StateDir, l.Admin)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	l.Proc = Proc{Name: "l7d " + node, Dir: dir, Log: filepath.Join(dir, "l7d.log"), health: "http://" + l.Admin + "/healthz",
		timeout: c.Opts.StartTimeout, args: []string{filepath.Join(c.Opts.Bin, "l7d"), "run", "-config", cfgPath}}
	c.L7 = append(c.L7, l)
	if err := l.Start(ctx); err != nil {
		return nil, err
	}
	if err := c.WaitNodes(ctx, c.Opts.StartTimeout, node); err != nil {
		return nil, fmt.Errorf("cluster: %s reports to the store: %w", l.Name, err)
	}
	return l, nil
}

// L4 is an l4d fed only by controld's store (its l4-rules and l4-pools), its two
// DPDK ports null devices (net_null): it takes and reports configuration, and
// forwards nothing.
type L4 struct {
	Proc
	// Node is its name in the control plane ("l4-a"); Admin its admin endpoint.
	Node, Admin string
	// StateDir is its state_dir.
	StateDir string
	// runtimeDir is DPDK's runtime folder of its file prefix, removed by Close.
	runtimeDir string
}

// L4Ports are the DPDK ports of an l4d node (AddL4On). The zero value of a field
// means its default: the null devices of AddL4.
type L4Ports struct {
	// VDevs are the EAL's --vdev arguments, such as
	// "net_af_packet0,iface=x0". Default net_null0 and net_null1.
	VDevs []string
	// External and Internal are the devices of the two ports, ExternalAddr and
	// InternalAddr their addresses (CIDR). Default net_null0 198.18.0.2/24 and
	// net_null1 198.18.1.2/24.
	External, Internal         string
	ExternalAddr, InternalAddr string
	// Gateway is the external port's gateway. Default none.
	Gateway string
	// Blacklists are the store's lists l4d enforces (its blacklists setting), as
	// a YAML flow sequence such as `[global, web]`. Default none given: l4d's
	// own default ([global]).
	Blacklists string
}

// AddL4 writes the configuration of an l4d node named node and starts it (l4d
// from Bin, built with DPDK: root and libdpdk needed); it answers once the node
// has applied a configuration from the store and reports it.
func (c *Cluster) AddL4(ctx context.Context, node string) (*L4, error) {
	return c.AddL4On(ctx, node, L4Ports{})
}

// AddL4On is AddL4 with the DPDK ports of p, such as net_af_packet on a veth a
// test sends packets through.
func (c *Cluster) AddL4On(ctx context.Context, node string, p L4Ports) (*L4, error) {
	if len(p.VDevs) == 0 {
		p.VDevs = []string{"net_null0", "net_null1"}
	}
	if p.External == "" {
		p.External, p.Internal = "net_null0", "net_null1"
	}
	if p.ExternalAddr == "" {
		p.ExternalAddr = "198.18.0.2/24"
	}
	if p.InternalAddr == "" {
		p.InternalAddr = "198.18.1.2/24"
	}
	dir := filepath.Join(c.Opts.Dir, node)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	admin, err := FreePort()
	if err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf("tg-%s-%d", node, os.Getpid())
	l := &L4{Node: node, Admin: admin, StateDir: filepath.Join(dir, "state"), runtimeDir: filepath.Join("/var/run/dpdk", prefix)}
	cfgPath := filepath.Join(dir, "l4d.yaml")
	// A file prefix of its own: DPDK's runtime files of another process (another
	// test's l4d) are not this one's.
	var vdevs []string
	for _, v := range p.VDevs {
		vdevs = append(vdevs, fmt.Sprintf("%q", "--vdev="+v))
	}
	gateway := ""
	if p.Gateway != "" {
		gateway = fmt.Sprintf(", gateway: %q", p.Gateway)
	}
	cfg := fmt.Sprintf(`admin_listen: %q
state_dir: %q
log_level: `+c.Opts.LogLevel+`
dpdk:
  eal_args: [--no-pci, --no-huge, -m, "256", --no-telemetry, "--file-prefix=%s", %s]
ports:
  external: {device: %s, addr: %s%s}
  internal: {device: %s, addr: %s}
conntrack: {capacity: 10000}
control:
  node: %s
  etcd_endpoints: [%q]
  dial_timeout: 1s
`, admin, l.StateDir, prefix, strings.Join(vdevs, ", "), p.External, p.ExternalAddr, gateway, p.Internal, p.InternalAddr, node, c.StoreEndpoint)
	if p.Blacklists != "" {
		cfg += "blacklists: " + p.Blacklists + "\n"
	}
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	l.Proc = Proc{Name: "l4d " + node, Dir: dir, Log: filepath.Join(dir, "l4d.log"), health: "http://" + admin + "/healthz",
		timeout: c.Opts.StartTimeout, args: []string{filepath.Join(c.Opts.Bin, "l4d"), "run", "-config", cfgPath}}
	c.L4 = append(c.L4, l)
	if err := l.Start(ctx); err != nil {
		return nil, err
	}
	if err := c.WaitNodes(ctx, c.Opts.StartTimeout, node); err != nil {
		return nil, fmt.Errorf("cluster: %s reports to the store: %w", l.Name, err)
	}
	return l, nil
}

// Close stops every process the cluster started, nodes first, and returns the
// errors of those that did not stop cleanly.
func (c *Cluster) Close() error {
	var errs []error
	for _, l := range c.L7 {
		errs = append(errs, l.Stop())
	}
	for _, l := range c.L4 {
		errs = append(errs, l.Stop())
		if err := os.RemoveAll(l.runtimeDir); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ks := range c.Keyservers {
		errs = append(errs, ks.Stop())
	}
	errs = append(errs, c.Controld.Stop())
	errs = append(errs, c.Etcd.Stop())
	return errors.Join(errs...)
}

// Start starts the process and waits until its health URL answers 200.
func (p *Proc) Start(ctx context.Context) error {
	if p.p != nil {
		return fmt.Errorf("%s is running", p.Name)
	}
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Dir = p.Dir
	pr, err := proc.Start(p.Name, p.Log, cmd, proc.AppendLog())
	if err != nil {
		return err
	}
	p.p = pr
	if err := pr.WaitHTTP(ctx, &http.Client{Timeout: time.Second}, p.health, p.timeout); err != nil {
		pr.Kill()
		p.p = nil
		return fmt.Errorf("%w\n%s", err, proc.Tail(p.Log, 40))
	}
	return nil
}

// Running reports whether the process was started and has not been stopped.
func (p *Proc) Running() bool { return p != nil && p.p != nil }

// Stop sends SIGTERM and waits for the process to exit (killing it after 10s); a
// process not running is left alone.
func (p *Proc) Stop() error {
	if p == nil || p.p == nil {
		return nil
	}
	err := p.p.Stop(10 * time.Second)
	p.p = nil
	var ee *exec.ExitError
	if p.termExit && errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("stopping %s: %w\n%s", p.Name, err, proc.Tail(p.Log, 15))
	}
	return nil
}

// Kill kills the process at once, as a crash would.
func (p *Proc) Kill() {
	if p == nil || p.p == nil {
		return
	}
	p.p.Kill()
	p.p = nil
}

// Signal sends sig to the running process (SIGSTOP freezes it, SIGCONT lets it
// go on).
func (p *Proc) Signal(sig os.Signal) error {
	if p == nil || p.p == nil {
		return fmt.Errorf("%s is not running", p.Name)
	}
	return p.p.Signal(sig)
}

// LogTail returns the last n lines of the process's log.
func (p *Proc) LogTail(n int) string { return proc.Tail(p.Log, n) }
