// Package softkey is keyserverd's software key backend: private keys from PEM files
// (PKCS #8, PKCS #1 or SEC 1), kept parsed in memory. It is meant for development and
// for comparing against an HSM; production keys belong in a PKCS#11 token.
package softkey

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/backend"
)

// Config selects the key files: the model of keyserverd's software section, with the
// same names in YAML and JSON. The zero value loads no key.
type Config struct {
	// Files lists PEM private key files to load. Default: none.
	Files []string `yaml:"files" json:"files,omitempty"`
	// Dir is a directory whose *.key and *.pem files holding a private key are loaded;
	// imported keys are written there as <label>.key. Default: none (imports are kept in
	// memory only).
	Dir string `yaml:"dir" json:"dir,omitempty"`
}

// Validate checks c and returns every problem, each a *config.FieldError named by its
// path within c ("files[1]"). Whether the files exist and hold keys is New's to find.
func (c *Config) Validate() error {
	var ck config.Checker
	for i, f := range c.Files {
		if strings.TrimSpace(f) == "" {
			ck.Addf(config.Index("files", i), "empty")
		}
	}
	return ck.Err()
}

// Backend serves keys parsed from PEM files.
type Backend struct {
	cfg  Config
	mu   sync.Mutex
	keys []*backend.Key
	// cpu bounds concurrent private-key operations to the number of cores: they are
	// CPU-bound, so more at once only lengthens every one of them (the tail latency
	// of a burst) and a queue here keeps first come, first served.
	cpu chan struct{}
}

// boundedSigner runs its Signer (and Decrypter) under the backend's CPU bound.
type boundedSigner struct {
	crypto.Signer
	cpu chan struct{}
}

func (s *boundedSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	s.cpu <- struct{}{}
	defer func() { <-s.cpu }()
	return s.Signer.Sign(r, digest, opts)
}

// boundedDecrypter adds Decrypt for RSA keys.
type boundedDecrypter struct{ *boundedSigner }

func (s boundedDecrypter) Decrypt(r io.Reader, ct []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	s.cpu <- struct{}{}
	defer func() { <-s.cpu }()
	return s.Signer.(crypto.Decrypter).Decrypt(r, ct, opts)
}

var _ backend.Backend = (*Backend)(nil)

// New loads every configured key. A file that does not parse is an error naming it.
func New(cfg Config) (*Backend, error) {
	b := &Backend{cfg: cfg, cpu: make(chan struct{}, runtime.GOMAXPROCS(0))}
	files := append([]string(nil), cfg.Files...)
	if cfg.Dir != "" {
		ents, err := os.ReadDir(cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("reading key directory: %w", err)
		}
		for _, e := range ents {
			if n := e.Name(); !e.IsDir() && (strings.HasSuffix(n, ".key") || strings.HasSuffix(n, ".pem")) {
				files = append(files, filepath.Join(cfg.Dir, n))
			}
		}
	}
	sort.Strings(files)
	seen := map[[32]byte]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("loading key: %w", err)
		}
		priv, err := ParsePEM(data)
		if errors.Is(err, errNoKey) && cfg.Dir != "" && !contains(cfg.Files, f) {
			continue // a certificate beside the keys
		}
		if err != nil {
			return nil, fmt.Errorf("loading key %s: %w", f, err)
		}
		label := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(f), ".key"), ".pem")
		k, err := b.newKey(label, priv)
		if err != nil {
			return nil, fmt.Errorf("loading key %s: %w", f, err)
		}
		if !seen[k.ID] {
			seen[k.ID] = true
			b.keys = append(b.keys, k)
		}
	}
	return b, nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "software" }

// Keys implements backend.Backend.
func (b *Backend) Keys() ([]*backend.Key, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*backend.Key(nil), b.keys...), nil
}

// Import implements backend.Backend. With Dir set the key is also written to
// Dir/<label>.key (mode 0600), so it survives a restart.
func (b *Backend) Import(label string, priv crypto.PrivateKey) (*backend.Key, error) {
	k, err := b.newKey(label, priv)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, old := range b.keys {
		if old.ID == k.ID {
			return old, nil
		}
	}
	if b.cfg.Dir != "" {
		if label == "" || strings.ContainsAny(label, `/\`) || strings.HasPrefix(label, ".") {
			return nil, fmt.Errorf("importing key: label %q is not a file name", label)
		}
		der, err := x509.MarshalPKCS8PrivateKey(priv)
		if err != nil {
			return nil, fmt.Errorf("importing key %q: %w", label, err)
		}
		path := filepath.Join(b.cfg.Dir, label+".key")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("importing key %q: %w", label, err)
		}
		werr := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
		if err := errors.Join(werr, f.Close()); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("importing key %q: %w", label, err)
		}
	}
	b.keys = append(b.keys, k)
	return k, nil
}

// Close implements backend.Backend.
func (b *Backend) Close() error { return nil }

func (b *Backend) newKey(label string, priv crypto.PrivateKey) (*backend.Key, error) {
	var s crypto.Signer
	switch p := priv.(type) {
	case *rsa.PrivateKey:
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("invalid RSA key: %w", err)
		}
		p.Precompute()
		s = boundedDecrypter{&boundedSigner{p, b.cpu}}
	case *ecdsa.PrivateKey:
		s = &boundedSigner{p, b.cpu}
	case ed25519.PrivateKey:
		s = &boundedSigner{p, b.cpu}
	default:
		return nil, fmt.Errorf("%w: %T", backend.ErrUnsupportedKey, priv)
	}
	return backend.NewKey(label, s)
}

var errNoKey = errors.New("no PEM private key found")

// ParsePEM returns the first private key in PEM data: PKCS #8 ("PRIVATE KEY"),
// PKCS #1 ("RSA PRIVATE KEY") or SEC 1 ("EC PRIVATE KEY"). Encrypted PEM is refused.
func ParsePEM(data []byte) (crypto.PrivateKey, error) {
	for len(data) > 0 {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		if _, ok := blk.Headers["Proc-Type"]; ok {
			return nil, errors.New("encrypted PEM keys are not supported")
		}
		switch blk.Type {
		case "PRIVATE KEY":
			return x509.ParsePKCS8PrivateKey(blk.Bytes)
		case "RSA PRIVATE KEY":
			return x509.ParsePKCS1PrivateKey(blk.Bytes)
		case "EC PRIVATE KEY":
			return x509.ParseECPrivateKey(blk.Bytes)
		case "ENCRYPTED PRIVATE KEY":
			return nil, errors.New("encrypted PEM keys are not supported")
		}
	}
	return nil, errNoKey
}
