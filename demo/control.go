package demo

// The control plane of the demo: controld, and the configuration the demo gives the
// stack through it with bin/tgctl.
//
// controld keeps its embedded etcd in <dir>/controld/store, afresh on every run. The
// nodes reach that etcd through its unix socket there (control.etcd_endpoints
// unix://<dir>/controld/store/etcd.sock), not through an -etcd-listen URL: a loopback
// URL is reachable only inside the network namespace it is bound in, and the L4
// mode's nodes each run in a namespace of their own, while a unix socket is a path,
// the same file in every network namespace of the machine, guarded by the data
// directory's mode (0700, root's). The loopback mode uses the same socket, so that
// both modes configure their nodes alike.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tiergate/tiergate/internal/proc"
)

// Names of the objects the demo stores through controld.
const (
	siteCertName  = "demo-site"       // the RSA site certificate, uploaded at the start
	ecdsaCertName = "demo-site-ecdsa" // the ECDSA one, for people to upload
	listenerName  = "demo"            // the listener, its routing policy, its pool and its binding
	l4PoolName    = "l7"              // the L4 pool of L7 nodes
	controldAt    = "127.0.0.1:7443"  // controld's API inside the switch's namespace (L4 mode)
)

// controlDir is controld's data directory under the state directory.
func (st *site) controlDir() string { return filepath.Join(st.dir, "controld") }

// etcdEndpoint is the URL nodes reach controld's embedded etcd at: its unix socket.
func (st *site) etcdEndpoint() string {
	return "unix://" + filepath.Join(st.controlDir(), "store", "etcd.sock")
}

// controlSection is the control section of a node's own file.
func (st *site) controlSection(node string) string {
	return fmt.Sprintf(`control:   # this node takes its configuration from controld's store
  node: %s
  etcd_endpoints: [%q]   # controld's embedded etcd, through its unix socket
`, node, st.etcdEndpoint())
}

// startControld writes controld's configuration, removes the store of an earlier run
// and the nodes' caches of it, and starts controld in ns with its API at listen; it
// returns once the API answers.
func (st *site) startControld(ctx context.Context, s *stack, ns *netNS, listen, keyserver string) (*proc.Process, error) {
	if err := os.RemoveAll(st.controlDir()); err != nil {
		return nil, fmt.Errorf("removing the store of an earlier run: %w", err)
	}
	// A node's cache holds a revision of the store just removed.
	caches, _ := filepath.Glob(filepath.Join(st.dir, "*-state", "control-snapshot.json"))
	for _, c := range caches {
		os.Remove(c)
	}
	cfgPath := filepath.Join(st.dir, "controld.yaml")
	cfg := fmt.Sprintf(`# Written by tgdemo on every run.
data_dir: %q   # the embedded etcd (store/) and the first admin token (admin.token)
listen: %q
log_level: info
# Certificate uploads import their keys into keyserverd, whose client rule for
# tiergate-controld has admin: true.
keyservers:
  servers: [%q]
  cert_file: %q
  key_file: %q
  ca_file: %q
`, st.controlDir(), listen, keyserver, st.ctlCert, st.ctlKey, st.ksCA)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	p, err := s.start("controld", filepath.Join(st.dir, "controld.log"), nil, ns, filepath.Join(s.bin, "controld"), "run", "-config", cfgPath)
	if err != nil {
		return nil, err
	}
	return p, p.WaitHTTP(ctx, nsHTTP(ns, time.Second), "http://"+listen+"/healthz", healthWait)
}

// forwardAPI relays the TCP connections made to at on the host to to inside ns, so
// that tgctl on the host reaches controld in the switch's namespace.
func forwardAPI(s *stack, at string, ns *netNS, to string) error {
	return relayNS(s, nil, at, ns, to)
}

// tgctl runs bin/tgctl against controld's API with its admin token, as people do.
type tgctl struct {
	bin   string // the tgctl binary
	api   string // TIERGATE_API
	token string // TIERGATE_TOKEN
	out   io.Writer
}

// newTgctl reads controld's first admin token.
func (st *site) newTgctl(binDir, apiAt string, out io.Writer) (*tgctl, error) {
	tok, err := os.ReadFile(st.tokenFile())
	if err != nil {
		return nil, fmt.Errorf("controld's admin token: %w", err)
	}
	return &tgctl{bin: filepath.Join(binDir, "tgctl"), api: "http://" + apiAt, token: strings.TrimSpace(string(tok)), out: out}, nil
}

// tokenFile is controld's first admin token.
func (st *site) tokenFile() string { return filepath.Join(st.controlDir(), "admin.token") }

// run prints "$ tgctl args", runs it and prints what it wrote, indented; a failure
// is an error carrying that output.
func (t *tgctl) run(ctx context.Context, args ...string) error {
	fmt.Fprintf(t.out, "  $ tgctl %s\n", strings.Join(args, " "))
	stop := ctx
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, t.bin, args...)
	cmd.Env = append(os.Environ(), "TIERGATE_API="+t.api, "TIERGATE_TOKEN="+t.token)
	b, err := cmd.CombinedOutput()
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if l != "" {
			fmt.Fprintf(t.out, "    %s\n", l)
		}
	}
	if err != nil && stop.Err() != nil {
		return fmt.Errorf("tgctl %s: stopped: %w", strings.Join(args, " "), stop.Err())
	}
	if err != nil {
		return fmt.Errorf("tgctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(b)))
	}
	return nil
}

// configure stores the demo's configuration through controld: the site certificate
// with its key (imported into keyserverd's token by controld), then stack.yaml.
func (st *site) configure(ctx context.Context, t *tgctl, stack string) error {
	fmt.Fprintln(t.out, "configuring the stack through controld:")
	path := filepath.Join(st.dir, "stack.yaml")
	if err := os.WriteFile(path, []byte(stack), 0o600); err != nil {
		return err
	}
	if err := t.run(ctx, "cert", "upload", "--name", siteCertName, "--cert", st.siteCert, "--key", st.keyPath); err != nil {
		return err
	}
	return t.run(ctx, "apply", "-f", path)
}

// rolledOut waits until every node applied the newest revision, then lists them.
func (st *site) rolledOut(ctx context.Context, t *tgctl) error {
	if err := t.run(ctx, "rollout", "status", "--wait", "30s"); err != nil {
		return err
	}
	return t.run(ctx, "nodes")
}

// stackYAML is the configuration the demo applies: the listener with its routing,
// pool and certificate binding, and in the L4 mode the L4 rules and the pool of L7
// nodes.
func stackYAML(listen, backend string, l4 bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by tgdemo on every run and applied with tgctl apply -f: the whole
# configuration of the stack, stored by controld. The certificate %[1]s is uploaded
# before (tgctl cert upload), since a binding must name a stored certificate.
kind: listeners
name: %[2]s
addr: %[3]q
---
kind: routing
name: %[2]s          # the routing of the listener of that name
vhosts:
  - names: ["*"]
    routes:
      - action: {pool: %[2]s}
---
kind: pools
name: %[2]s
members: [{addr: %[4]q}]
---
kind: cert-bindings
name: %[2]s
certificates: [%[1]s]
listeners: [%[2]s]
default: true     # also for handshakes without a server name it serves
`, siteCertName, listenerName, listen, backend)
	if l4 {
		fmt.Fprintf(&b, `---
kind: l4-rules
name: https
vip: %[1]q
protocol: tcp
port: 443
pool: %[2]s
---
kind: l4-rules
name: quic
vip: %[1]q
protocol: udp
port: 443
pool: %[2]s
quic: true
---
%[3]s---
kind: l4-bgp     # the LDs' AS and their router: cluster configuration (each LD's file has its own part)
name: cluster
asn: %[4]d
peers:
  - {address: %[5]q, as: %[6]d, hold_time: %[7]ds, connect_retry: 1s}
`, l4VIP, l4PoolName, l4PoolYAML(""), l4LDAS, l4RouterIP, l4RouterAS, l4HoldTime)
	}
	return b.String()
}

// l4PoolYAML is the L4 pool of the two L7 nodes, drained the one named.
func l4PoolYAML(drained string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kind: l4-pools\nname: %s\nmembers:\n", l4PoolName)
	for _, node := range l4Nodes {
		d := ""
		if node.label == drained {
			d = ", drained: true"
		}
		fmt.Fprintf(&b, "  - {name: %s, address: %q, quic_id: %d, health_addr: %q%s}\n",
			node.label, node.ip, node.quicID, net.JoinHostPort(node.ip, l4L7AdminPort), d)
	}
	b.WriteString("health: {type: http, path: /healthz, interval: 500ms, timeout: 400ms}\n")
	return b.String()
}

// webYAML is the change people are invited to apply: a redirect route before the
// pool's, and the ECDSA certificate beside the RSA one in the listener's binding.
func webYAML() string {
	return fmt.Sprintf(`# Written by tgdemo: a change to try, after uploading %[1]s:
#   tgctl diff -f this file; tgctl apply -f this file
kind: routing
name: %[2]s
vhosts:
  - names: ["*"]
    routes:
      - name: old
        match: {path_prefix: /old}
        action: {redirect: {code: 301, path: /}}
      - action: {pool: %[2]s}
---
kind: cert-bindings
name: %[2]s
certificates: [%[1]s, %[3]s]   # per handshake: ECDSA when the client takes it, else RSA
listeners: [%[2]s]
default: true
`, ecdsaCertName, listenerName, siteCertName)
}

// writeTryFiles writes the files the printed commands use, under <dir>/try.
func (st *site) writeTryFiles(l4 bool) (dir string, err error) {
	dir = filepath.Join(st.dir, "try")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	files := map[string]string{"web.yaml": webYAML()}
	if l4 {
		files["drain-l7a.yaml"] = "# Written by tgdemo: l7a drained (tgctl apply -f this file; undrain-l7a.yaml undoes it)\n" + l4PoolYAML("l7a")
		files["undrain-l7a.yaml"] = "# Written by tgdemo: the pool as the demo started it\n" + l4PoolYAML("")
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// tryText is the block of tgctl commands printed at the start; in is how a command
// reaches the listener ("" on the host, "ip netns exec <client namespace> " in the L4
// mode) and at the listener's host:port.
func (st *site) tryText(t *tgctl, tryDir, in, at string) string {
	host, port, _ := net.SplitHostPort(at)
	curl := fmt.Sprintf("%scurl -sv --cacert %s --resolve demo.tiergate.test:%s:%s https://demo.tiergate.test:%s/old 2>&1 | grep -E '< HTTP|< location'",
		in, st.siteCA, port, host, port)
	openssl := fmt.Sprintf("%sopenssl s_client -connect %s -servername demo.tiergate.test </dev/null 2>/dev/null | grep -E 'Peer signature type|Server public key'", in, at)
	return fmt.Sprintf(`  tgctl               export TIERGATE_API=%[1]s TIERGATE_TOKEN=$(cat %[2]s)
  upload a cert       %[3]s cert upload --name %[4]s --cert %[5]s --key %[6]s
  apply a route       %[3]s diff -f %[7]s; %[3]s apply -f %[7]s   (a redirect of /old, the ECDSA cert beside the RSA one)
  see it served       %[8]s
                      %[9]s
  see nodes           %[3]s nodes
  see a rollout       %[3]s rollout status --wait 10s; %[3]s revisions; %[3]s cert list
`, t.api, st.tokenFile(), t.bin, ecdsaCertName, st.ecdsaCert, st.ecdsaKey, filepath.Join(tryDir, "web.yaml"), curl, openssl)
}
