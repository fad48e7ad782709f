package certupload

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// KeyserversConfig is controld's keyservers section: the keyserver client's
// settings (keyserver/client.Config: servers, required, every keyserverd of the
// cluster; server_name; conns_per_server, default 2; request_timeout, 1s; timeout,
// 3s; dial_timeout, 2s; ping_interval, 5s; reconnect_min and reconnect_max, 100ms
// and 10s) and the files of controld's mutual TLS to them. Its certificate must be
// one a keyserverd's client rule with admin: true matches (import_key).
type KeyserversConfig struct {
	client.Config `yaml:",inline"`

	// CertFile and KeyFile are controld's client certificate and its private key
	// (PEM). Required.
	CertFile string `yaml:"cert_file" json:"cert_file"`
	KeyFile  string `yaml:"key_file" json:"key_file"`

	// CAFile holds the CA certificates (PEM) that verify the keyservers. Required.
	CAFile string `yaml:"ca_file" json:"ca_file"`
}

// Validate checks c and returns every problem, each a *config.FieldError named by
// its path within c ("servers[0]", "cert_file").
func (c *KeyserversConfig) Validate() error {
	var ck config.Checker
	ck.Nest("", c.Config.Validate())
	for _, f := range []struct{ path, v string }{{"cert_file", c.CertFile}, {"key_file", c.KeyFile}, {"ca_file", c.CAFile}} {
		if f.v == "" {
			ck.Addf(f.path, "required")
		}
	}
	return ck.Err()
}

// TLS loads the client certificate and the keyservers' CA.
func (c *KeyserversConfig) TLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("keyservers: client certificate: %w", err)
	}
	caPEM, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("keyservers: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("keyservers: %s holds no PEM certificate", c.CAFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}, nil
}

// Open validates c, loads its TLS files and returns the keyservers.
func (c *KeyserversConfig) Open() (*Keyservers, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("keyservers: %w", err)
	}
	tc, err := c.TLS()
	if err != nil {
		return nil, err
	}
	cfg := c.Config
	cfg.TLS = tc
	return NewKeyservers(cfg)
}

// DefaultImportTimeout is how long an import or a signature of an upload may take
// at one keyserver unless the keyservers section's request_timeout and timeout say
// otherwise (the keyserver client's own defaults, 1s and 3s, are a handshake's).
const DefaultImportTimeout = config.Duration(10 * time.Second)

// Keyservers reaches each keyserver of the cluster on its own: a key must be in
// every one, so nothing fails over from one to another.
type Keyservers struct {
	addrs   []string
	clients []*client.Client
}

// NewKeyservers returns one keyserver client for each of cfg.Servers, each with
// cfg's settings; they connect in the background. cfg.Fallback and Registerer are
// not used.
func NewKeyservers(cfg client.Config) (*Keyservers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("keyservers: %w", err)
	}
	cfg = importConfig(cfg)
	k := &Keyservers{}
	for _, addr := range cfg.Servers {
		one := cfg
		one.Servers = []string{addr}
		one.Fallback, one.Registerer = nil, nil
		c, err := client.New(one)
		if err != nil {
			k.Close()
			return nil, fmt.Errorf("keyserver %s: %w", addr, err)
		}
		k.addrs = append(k.addrs, addr)
		k.clients = append(k.clients, c)
	}
	return k, nil
}

// importConfig is cfg with the timeouts left zero set for uploads: an import and a
// signature by a key just put into an HSM take longer than the signatures of a
// handshake the client's defaults are sized for, and an upload waits for them
// rather than failing over.
func importConfig(cfg client.Config) client.Config {
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultImportTimeout
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultImportTimeout
	}
	return cfg
}

// Addrs returns the keyservers' addresses.
func (k *Keyservers) Addrs() []string { return k.addrs }

// Close closes every client.
func (k *Keyservers) Close() error {
	var errs []error
	for _, c := range k.clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Result is what one keyserver did for an upload.
type Result struct {
	// Address is the keyserver's.
	Address string `json:"address"`
	// Verified says it holds the key: it signed a fresh nonce that verified with the
	// leaf's public key. False in a dry run, which only pings.
	Verified bool `json:"verified"`
	// Reachable says it answered (a ping, an import or a signature).
	Reachable bool `json:"reachable"`
	// Error is why it failed, if it did.
	Error string `json:"error,omitempty"`
}

// each runs fn for every keyserver at once and returns the results, in the order of
// the servers, and an *Error (CodeKeyserverFailed) naming the first that failed.
func (k *Keyservers) each(ctx context.Context, fn func(ctx context.Context, c *client.Client, r *Result) error) ([]Result, error) {
	if k == nil || len(k.clients) == 0 {
		return nil, &Error{Code: CodeKeyserverFailed, Err: errors.New("no keyservers are configured (controld's keyservers section): a certificate's key must be imported before it is stored")}
	}
	res := make([]Result, len(k.clients))
	errs := make([]error, len(k.clients))
	var wg sync.WaitGroup
	for i, c := range k.clients {
		res[i].Address = k.addrs[i]
		wg.Go(func() {
			errs[i] = fn(ctx, c, &res[i])
			if errs[i] != nil {
				res[i].Error = errs[i].Error()
			}
		})
	}
	wg.Wait()
	failed := 0
	first := -1
	for i, err := range errs {
		if err != nil {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if first < 0 {
		return res, nil
	}
	err := errs[first]
	if failed > 1 {
		err = fmt.Errorf("%w (and %d more keyservers failed)", err, failed-1)
	}
	return res, &Error{Code: CodeKeyserverFailed, Keyserver: k.addrs[first], Err: err}
}

// Ping checks that every keyserver answers.
func (k *Keyservers) Ping(ctx context.Context) ([]Result, error) {
	return k.each(ctx, func(ctx context.Context, c *client.Client, r *Result) error {
		if err := c.Ping(ctx); err != nil {
			return fmt.Errorf("ping: %w", err)
		}
		r.Reachable = true
		return nil
	})
}

// Import imports the key of ck into every keyserver under label, then has each
// sign a fresh nonce with the key ID it answered and verifies the signature with
// the leaf's public key. The error is an *Error naming the first keyserver that
// failed; a key imported into the others stays there (keyservers have no
// deletion), under its label, unused.
func (k *Keyservers) Import(ctx context.Context, ck *Checked, label string) ([]Result, error) {
	if ck.keyPEM == nil {
		return nil, errors.New("certupload: the key was wiped before the import")
	}
	leaf := ck.Leaf()
	return k.each(ctx, func(ctx context.Context, c *client.Client, r *Result) error {
		id, err := c.Import(ctx, label, ck.keyPEM)
		if err != nil {
			return fmt.Errorf("importing the key: %w", err)
		}
		r.Reachable = true
		if id != ck.KeyID {
			return fmt.Errorf("importing the key: the keyserver answered key ID %s, not the leaf's %s", id, ck.KeyID)
		}
		if err := verify(ctx, c, id, leaf.PublicKey); err != nil {
			return err
		}
		r.Verified = true
		return nil
	})
}

// Verify checks that every keyserver signs with key id, whose public half is pub.
func (k *Keyservers) Verify(ctx context.Context, id protocol.KeyID, pub crypto.PublicKey) ([]Result, error) {
	return k.each(ctx, func(ctx context.Context, c *client.Client, r *Result) error {
		err := verify(ctx, c, id, pub)
		var refused *protocol.Error
		r.Reachable = err == nil || errors.As(err, &refused)
		if err != nil {
			return err
		}
		r.Verified = true
		return nil
	})
}

// verify has the keyserver sign a fresh random nonce with key id and checks the
// signature with pub: for RSA both PKCS #1 v1.5 and PSS (TLS 1.2 and 1.3).
func verify(ctx context.Context, c *client.Client, id protocol.KeyID, pub crypto.PublicKey) error {
	nonce := make([]byte, 32)
	rand.Read(nonce)
	msg := append([]byte("tiergate certificate upload check\x00"), nonce...)
	digest := sha256.Sum256(msg)
	key := c.NewKey(id, pub)
	fail := func(what string, err error) error {
		if err != nil {
			return fmt.Errorf("signing a nonce with key %s (%s): %w", id.Short(), what, err)
		}
		return fmt.Errorf("the signature of a nonce with key %s (%s) does not verify with the leaf's public key", id.Short(), what)
	}
	switch p := pub.(type) {
	case *rsa.PublicKey:
		sig, err := key.SignContext(ctx, digest[:], crypto.SHA256)
		if err != nil || rsa.VerifyPKCS1v15(p, crypto.SHA256, digest[:], sig) != nil {
			return fail("RSA PKCS #1 v1.5", err)
		}
		opts := &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256}
		sig, err = key.SignContext(ctx, digest[:], opts)
		if err != nil || rsa.VerifyPSS(p, crypto.SHA256, digest[:], sig, opts) != nil {
			return fail("RSA-PSS", err)
		}
	case *ecdsa.PublicKey:
		sig, err := key.SignContext(ctx, digest[:], crypto.SHA256)
		if err != nil || !ecdsa.VerifyASN1(p, digest[:], sig) {
			return fail("ECDSA", err)
		}
	case ed25519.PublicKey:
		sig, err := key.SignContext(ctx, msg, crypto.Hash(0))
		if err != nil || !ed25519.Verify(p, msg, sig) {
			return fail("Ed25519", err)
		}
	default:
		return fmt.Errorf("a %T key: want RSA, ECDSA or Ed25519", pub)
	}
	return nil
}
