package main

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testpki"
)

const (
	// siteName is the name the site certificate is issued for and the client sends
	// as SNI; the certificate also holds 127.0.0.1.
	siteName = "bench.tiergate.test"

	tokenLabel = "tiergate-bench-hs"
	keyLabel   = "site-rsa2048"
	l7Client   = "l7-bench"
)

// fixture is what every server shares, all under one temporary directory: the site
// certificate and its RSA-2048 key (a PEM file for l7d with a local key and for
// nginx, and the same key imported into a SoftHSM2 token for keyserverd), and the
// mutual-TLS certificates between l7d and keyserverd.
type fixture struct {
	dir string

	siteCA   *testpki.CA
	siteCert string // PEM: the leaf only, as nginx and l7d both serve it
	siteKey  string // PEM (PKCS #8)
	key      *rsa.PrivateKey
	keyID    protocol.KeyID

	ticketKey string // l7d's session ticket key file

	tok     *softhsm.Token
	pinFile string

	ksCert, ksKey, ksClientCA string // keyserverd's side of mutual TLS
	ksCA, l7Cert, l7Key       string // l7d's side
}

// newFixture writes the certificates and keys into dir and creates the token.
func newFixture(dir string) (*fixture, error) {
	f := &fixture{dir: dir}
	pki := filepath.Join(dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		return nil, err
	}

	var err error
	if f.key, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		return nil, err
	}
	if f.keyID, err = backend.KeyIDOf(f.key.Public()); err != nil {
		return nil, err
	}
	if f.siteCA, err = testpki.NewCA("Tiergate bench site CA"); err != nil {
		return nil, err
	}
	_, der, err := f.siteCA.Issue(siteName, f.key.Public(), siteName, "127.0.0.1")
	if err != nil {
		return nil, err
	}
	f.siteCert = filepath.Join(pki, "site.pem")
	if err := testpki.WritePEM(f.siteCert, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(f.key)
	if err != nil {
		return nil, err
	}
	f.siteKey = filepath.Join(pki, "site.key")
	if err := testpki.WritePEM(f.siteKey, "PRIVATE KEY", keyDER); err != nil {
		return nil, err
	}

	var tk [32]byte
	rand.Read(tk[:])
	f.ticketKey = filepath.Join(pki, "ticket.key")
	if err := os.WriteFile(f.ticketKey, []byte(hex.EncodeToString(tk[:])+"\n"), 0o600); err != nil {
		return nil, err
	}

	mtls, err := testpki.NewMutualTLS(pki, "Tiergate bench keyserver", "keyserverd", []string{"127.0.0.1"}, l7Client)
	if err != nil {
		return nil, err
	}
	f.ksCert, f.ksKey, f.ksClientCA = mtls.ServerCert, mtls.ServerKey, mtls.ClientCAFile
	f.ksCA, f.l7Cert, f.l7Key = mtls.ServerCAFile, mtls.ClientCert, mtls.ClientKey

	f.tok, err = softhsm.CreateToken(filepath.Join(dir, "softhsm"), tokenLabel, "bench-so-pin", "bench-user-pin")
	if err != nil {
		return nil, fmt.Errorf("creating the SoftHSM2 token: %w", err)
	}
	f.pinFile = filepath.Join(dir, "token.pin")
	if err := os.WriteFile(f.pinFile, []byte(f.tok.PIN+"\n"), 0o600); err != nil {
		return nil, err
	}
	return f, nil
}

// importKey stores the site key in the token through `keyserverd import`, as an
// operator would.
func (f *fixture) importKey(ksBin string) error {
	cfg, err := f.keyserverConfig("import", "127.0.0.1:0", "off")
	if err != nil {
		return err
	}
	cmd := exec.Command(ksBin, "import", "-config", cfg, "-label", keyLabel, "-key", f.siteKey)
	cmd.Env = append(os.Environ(), f.tok.Env()...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("keyserverd import: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	if !strings.HasPrefix(string(out), f.keyID.String()) {
		return fmt.Errorf("keyserverd import answered %q, want key ID %s", strings.TrimSpace(string(out)), f.keyID)
	}
	return nil
}

// keyserverConfig writes a keyserverd configuration serving the site key from the
// token (with its default session count) to l7d's client certificate, and returns
// its path.
func (f *fixture) keyserverConfig(name, listen, metrics string) (string, error) {
	keys := ""
	if name != "import" { // an import must not name the key it is about to store
		keys = fmt.Sprintf("  keys:\n    - label: %q\n", keyLabel)
	}
	cfg := fmt.Sprintf(`listen: %q
metrics_listen: %q
state_dir: %q
log_level: warn
shutdown_grace: 5s
tls:
  cert_file: %q
  key_file: %q
  client_ca_file: %q
pkcs11:
  module: %q
  token_label: %q
  pin_file: %q
%sclients:
  - name: %q
    keys: ["*"]
`, listen, metrics, filepath.Join(f.dir, "keyserverd-"+name), f.ksCert, f.ksKey, f.ksClientCA, f.tok.Module, f.tok.Label, f.pinFile, keys, l7Client)
	path := filepath.Join(f.dir, "keyserverd-"+name+".yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// l7dConfig writes an l7d configuration with one TCP-only listener on addr that
// answers every request `200 ok` itself (a respond route, as nginx's `return 200`),
// serving the site certificate with its key from the PEM file (local) or from
// keyserverd at ksAddr, and returns its path. The listener's handshake admission
// limits (max_handshakes, max_handshakes_per_source: 1000 and 100 by default) are
// raised past the largest burst: the load comes from one address standing for many
// clients, and a refused connection would do none of the work measured; nginx has
// no such limits.
func (f *fixture) l7dConfig(name, addr, admin string, local bool, ksAddr string) (string, error) {
	keyLine, keyservers := "", ""
	if local {
		keyLine = fmt.Sprintf("      key_file: %q\n", f.siteKey)
	} else {
		keyservers = fmt.Sprintf(`keyservers:
  servers: [%q]
  cert_file: %q
  key_file: %q
  ca_file: %q
`, ksAddr, f.l7Cert, f.l7Key, f.ksCA)
	}
	cfg := fmt.Sprintf(`listeners:
  - name: bench
    addr: %q
    disable_http3: true
    max_handshakes: %d
    max_handshakes_per_source: %d
routing:
  listeners:
    - name: bench
      vhosts:
        - names: ["*"]
          routes:
            - name: ok
              action: {respond: {status: 200, body: %q}}
certificates:
  certificates:
    - name: site
      cert_file: %q
%s  default: site
  ticket_key_files: [%q]
%sadmin_listen: %q
state_dir: %q
shutdown_grace: 2s
log_level: warn
`, addr, admitHandshakes, admitHandshakes, okBody, f.siteCert, keyLine, f.ticketKey, keyservers, admin, filepath.Join(f.dir, "l7d-"+name+"-state"))
	path := filepath.Join(f.dir, "l7d-"+name+".yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// admitHandshakes is l7d's max_handshakes and max_handshakes_per_source in the
// benchmark: more than a burst's connections (-burst, 2000 by default).
const admitHandshakes = 1 << 16

// okBody is what every server answers a request with, status 200.
const okBody = "ok\n"

// nginxConfig returns a minimal nginx.conf: as many workers as cores, TLS 1.2 and
// 1.3 on addr (`ssl deferred`) with the site certificate and key, no session cache,
// session tickets on (one per handshake, as crypto/tls sends), and every request
// answered `200 ok` by nginx itself. Everything nginx writes goes under dir.
func nginxConfig(dir, addr, cert, key string, workers int) string {
	return benchkit.NginxHTTPTop(dir, workers) + fmt.Sprintf(`
    server {
        listen %s ssl deferred;
        ssl_certificate %s;
        ssl_certificate_key %s;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache off;
        ssl_session_tickets on;
        ssl_conf_command NumTickets 1;

        location / {
            return 200 "ok\n";
        }
    }
}
`, addr, cert, key)
}
