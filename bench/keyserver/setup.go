package main

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testpki"
)

const (
	tokenLabel = "tiergate-bench"
	keyLabel   = "bench-rsa2048"
	clientName = "bench-client"
)

// fixture is everything the phases share, all under one temporary directory.
type fixture struct {
	dir      string
	tok      *softhsm.Token
	pinFile  string
	key      *rsa.PrivateKey
	keyPath  string // PEM (PKCS #8) of key
	keyID    protocol.KeyID
	sessions int // PKCS#11 operation sessions, in keyserverd and in the direct run

	serverCert, serverKey, clientCAFile string
	serverTLS                           *tls.Config // for -inprocess
	clientTLS                           *tls.Config
}

// newFixture creates the token, the RSA key and the mutual-TLS certificates in dir,
// and imports the key into the token with `keyserverd import`. sessions 0 means
// keyserverd's default, 4 × GOMAXPROCS.
func newFixture(dir, ksBin string, sessions int) (*fixture, error) {
	if sessions == 0 {
		sessions = 4 * runtime.GOMAXPROCS(0)
	}
	f := &fixture{dir: dir, sessions: sessions}
	var err error
	f.tok, err = softhsm.CreateToken(filepath.Join(dir, "softhsm"), tokenLabel, "bench-so-pin", "bench-user-pin")
	if err != nil {
		return nil, fmt.Errorf("creating the SoftHSM2 token: %w", err)
	}
	// SoftHSM reads SOFTHSM2_CONF in C_Initialize only: set it before this process
	// loads the module for the direct run.
	if err := f.tok.Setenv(); err != nil {
		return nil, err
	}
	f.pinFile = filepath.Join(dir, "token.pin")
	if err := os.WriteFile(f.pinFile, []byte(f.tok.PIN+"\n"), 0o600); err != nil {
		return nil, err
	}

	if f.key, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		return nil, err
	}
	f.key.Precompute()
	if f.keyID, err = backend.KeyIDOf(f.key.Public()); err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(f.key)
	if err != nil {
		return nil, err
	}
	f.keyPath = filepath.Join(dir, keyLabel+".pem")
	if err := testpki.WritePEM(f.keyPath, "PRIVATE KEY", der); err != nil {
		return nil, err
	}

	pki := filepath.Join(dir, "pki")
	if err := os.Mkdir(pki, 0o700); err != nil {
		return nil, err
	}
	mtls, err := testpki.NewMutualTLS(pki, "bench keyserver", "keyserverd", []string{"127.0.0.1"}, clientName)
	if err != nil {
		return nil, err
	}
	f.serverCert, f.serverKey, f.clientCAFile = mtls.ServerCert, mtls.ServerKey, mtls.ClientCAFile
	f.serverTLS = &tls.Config{Certificates: []tls.Certificate{mtls.ServerLeaf}, ClientCAs: mtls.ClientCA.Pool()}
	f.clientTLS = &tls.Config{Certificates: []tls.Certificate{mtls.ClientLeaf}, RootCAs: mtls.ServerCA.Pool(), ServerName: "127.0.0.1"}

	// The import goes through keyserverd itself, as an operator would do it.
	cfg, err := f.writeConfig("import", "127.0.0.1:0", "off", pkcs11Backend, false)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(ksBin, "import", "-config", cfg, "-label", keyLabel, "-key", f.keyPath)
	cmd.Env = append(os.Environ(), f.tok.Env()...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("keyserverd import: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	if !strings.HasPrefix(string(out), f.keyID.String()) {
		return nil, fmt.Errorf("keyserverd import answered %q, want key ID %s", strings.TrimSpace(string(out)), f.keyID)
	}
	return f, nil
}

// Backend kinds.
const (
	pkcs11Backend   = "pkcs11"
	softwareBackend = "software"
)

// writeConfig writes a keyserverd configuration serving the key from kind and returns
// its path. With selectKey the PKCS#11 backend is told to load the benchmark key by its
// label (it must be on the token already).
func (f *fixture) writeConfig(name, listen, metrics, kind string, selectKey bool) (string, error) {
	var backendYAML string
	switch kind {
	case pkcs11Backend:
		backendYAML = fmt.Sprintf(`pkcs11:
  module: %q
  token_label: %q
  pin_file: %q
  sessions: %d
`, f.tok.Module, f.tok.Label, f.pinFile, f.sessions)
		if selectKey {
			backendYAML += fmt.Sprintf("  keys:\n    - label: %q\n", keyLabel)
		}
	case softwareBackend:
		backendYAML = fmt.Sprintf(`software:
  files: [%q]
`, f.keyPath)
	default:
		return "", fmt.Errorf("unknown backend %q", kind)
	}
	cfg := fmt.Sprintf(`listen: %q
metrics_listen: %q
state_dir: %q
log_level: info
shutdown_grace: 5s
tls:
  cert_file: %q
  key_file: %q
  client_ca_file: %q
%sclients:
  - name: %q
    keys: ["*"]
`, listen, metrics, filepath.Join(f.dir, "keyserverd-"+name), f.serverCert, f.serverKey, f.clientCAFile, backendYAML, clientName)
	path := filepath.Join(f.dir, "keyserverd-"+name+".yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}
