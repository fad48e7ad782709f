package certs

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/softkey"
)

// loadWorkers bounds the certificates loaded at once (remote keys are looked up on
// the keyservers, so a reload of many takes round trips, not CPU).
const loadWorkers = 8

// entry is one configured certificate.
type entry struct {
	name     string
	certFile string
	keyFile  string // empty: remote key
	fromDir  bool
	err      error // set when the entry is unusable before any file is read
}

// Load reads and validates every configured certificate, builds a new Set of the
// good ones and serves it; it also puts the ticket keys in use. It is Prepare then
// Commit.
//
// A certificate that fails (unreadable file, bad PEM, chain out of order or with a
// broken signature, a key that does not match, a remote key the keyservers do not
// hold, expired or not yet valid, a duplicate name) is left out and listed in the
// report's Rejected, and the others load. Load fails, and the current Set and ticket
// keys stay as they were, when no certificate at all could be loaded, when the Default
// is not among those loaded, when the Dir cannot be read, or when a ticket key file is
// bad. The report is returned in every case.
func (s *Store) Load(cfg Config) (*LoadReport, error) {
	p, rep, err := s.Prepare(cfg)
	if err != nil {
		return rep, err
	}
	s.Commit(p)
	return rep, nil
}

// Prepared is a certificate Set and ticket keys that Prepare built, ready for
// Commit. Nothing of it is served until then.
type Prepared struct {
	set      *Set
	keys     [][TicketKeyLen]byte
	def      string
	loaded   int
	rejected int
}

// Set returns the Set that Commit would serve.
func (p *Prepared) Set() *Set { return p.set }

// Prepare does everything of Load that can fail, and serves nothing: it reads the
// ticket key files and every certificate (reaching the keyservers for remote keys),
// validates them and builds the Set. Its report and its errors are Load's. Prepare
// may run at any time; what it returns is put in force by Commit.
func (s *Store) Prepare(cfg Config) (*Prepared, *LoadReport, error) {
	rep, set, keys, err := s.build(cfg)
	for _, r := range rep.Rejected {
		s.log.Warn("certificate rejected", "name", r.Name, "err", r.Err)
	}
	if err != nil {
		s.m.failed()
		s.log.Error("certificates not loaded; the previous set stays in use", "err", err)
		return nil, rep, err
	}
	if !s.tickets.Load().sameKeys(keys) {
		warnTicketFileModes(cfg.TicketKeyFiles, s.log)
	}
	return &Prepared{set: set, keys: keys, def: cfg.Default, loaded: len(rep.Loaded), rejected: len(rep.Rejected)}, rep, nil
}

// Commit serves what Prepare built, certificates and ticket keys together; it cannot
// fail. Commits, and Loads, come from one goroutine at a time. Handshakes that have begun finish with the Set they started with.
func (s *Store) Commit(p *Prepared) {
	s.set.Store(p.set)
	s.applyTickets(p.keys)
	s.m.loaded(p.set, p.rejected)
	s.log.Info("certificates loaded", "loaded", p.loaded, "rejected", p.rejected, "default", p.def)
}

func (s *Store) build(cfg Config) (*LoadReport, *Set, [][TicketKeyLen]byte, error) {
	rep := &LoadReport{}
	keys, err := LoadTicketKeys(cfg.TicketKeyFiles)
	if err != nil {
		return rep, nil, nil, fmt.Errorf("certs: %w", err)
	}
	entries, err := cfg.entries()
	if err != nil {
		return rep, nil, nil, fmt.Errorf("certs: %w", err)
	}

	now := s.opts.Now()
	results := make([]*Cert, len(entries))
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	sem := make(chan struct{}, loadWorkers)
	for i, e := range entries {
		if e.err != nil {
			errs[i] = e.err
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i], errs[i] = s.loadCert(e, now)
		})
	}
	wg.Wait()

	var certs []*Cert
	for i, e := range entries {
		if errs[i] != nil {
			file := e.certFile
			if file == "" {
				file = "no cert_file"
			}
			rep.Rejected = append(rep.Rejected, Rejection{Name: e.name, Err: fmt.Errorf("certificate %q (%s): %w", e.name, file, errs[i])})
			continue
		}
		certs = append(certs, results[i])
		rep.Loaded = append(rep.Loaded, e.name)
	}

	if len(certs) == 0 {
		if len(rep.Rejected) == 0 {
			return rep, nil, nil, errors.New("certs: no certificate is configured")
		}
		return rep, nil, nil, fmt.Errorf("certs: no certificate could be loaded: %w", joinRejections(rep.Rejected))
	}
	if cfg.Default != "" && !slices.Contains(rep.Loaded, cfg.Default) {
		for _, r := range rep.Rejected {
			if r.Name == cfg.Default {
				return rep, nil, nil, fmt.Errorf("certs: the default certificate was rejected: %w", r.Err)
			}
		}
		return rep, nil, nil, fmt.Errorf("certs: the default certificate %q is not configured", cfg.Default)
	}
	return rep, newSet(certs, cfg.Default), keys, nil
}

func joinRejections(rs []Rejection) error {
	errs := make([]error, len(rs))
	for i, r := range rs {
		errs[i] = r.Err
	}
	return errors.Join(errs...)
}

// entries lists the configured certificates: Certificates in order, then Dir's
// *.pem files in name order. Entries that are unusable as configured carry their
// error; an unreadable Dir is an error.
func (cfg *Config) entries() ([]entry, error) {
	var out []entry
	seen := map[string]string{} // name → its cert file
	add := func(e entry) {
		if e.err == nil {
			if prev, dup := seen[e.name]; dup {
				e.err = fmt.Errorf("another certificate is named %q (%s)", e.name, prev)
			} else {
				seen[e.name] = e.certFile
			}
		}
		out = append(out, e)
	}
	for i, c := range cfg.Certificates {
		e := entry{name: c.Name, certFile: c.CertFile, keyFile: c.KeyFile}
		if e.name == "" {
			e.name = strings.TrimSuffix(filepath.Base(c.CertFile), filepath.Ext(c.CertFile))
		}
		switch {
		case c.CertFile == "":
			if e.name == "" || e.name == "." {
				e.name = fmt.Sprintf("certificates[%d]", i)
			}
			e.err = errors.New("cert_file is required")
		case e.name == "":
			e.err = errors.New("name is empty")
		}
		add(e)
	}
	if cfg.Dir != "" {
		ents, err := os.ReadDir(cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("reading certificate directory: %w", err)
		}
		for _, de := range ents {
			n := de.Name()
			if de.IsDir() || strings.HasPrefix(n, ".") || !strings.HasSuffix(n, ".pem") {
				continue
			}
			name := strings.TrimSuffix(n, ".pem")
			e := entry{name: name, certFile: filepath.Join(cfg.Dir, n), fromDir: true}
			key := filepath.Join(cfg.Dir, name+".key")
			if _, err := os.Stat(key); err == nil {
				e.keyFile = key
			} else if !errors.Is(err, os.ErrNotExist) {
				e.err = fmt.Errorf("key file: %w", err)
			}
			add(e)
		}
	}
	return out, nil
}

// loadCert reads, checks and prepares one certificate.
func (s *Store) loadCert(e entry, now time.Time) (*Cert, error) {
	data, err := os.ReadFile(e.certFile)
	if err != nil {
		return nil, err
	}
	chain, err := ParseChain(data)
	if err != nil {
		return nil, err
	}
	if e.keyFile == "" && e.fromDir && bytes.Contains(data, []byte("PRIVATE KEY-----")) {
		e.keyFile = e.certFile // a combined file
	}
	c, err := s.newCert(e.name, chain, now, "file", e.certFile)
	if err != nil {
		return nil, err
	}
	c.CertFile, c.KeyFile, c.Remote = e.certFile, e.keyFile, e.keyFile == ""
	leaf := c.Leaf
	var priv crypto.Signer
	if c.Remote {
		priv, err = s.remoteKey(c)
	} else {
		priv, err = localKey(e.keyFile, leaf)
	}
	if err != nil {
		return nil, err
	}
	c.TLS = &tls.Certificate{Certificate: c.Chain, PrivateKey: priv, Leaf: leaf}
	return c, nil
}

// newCert checks a parsed chain (leaf first) at now and returns its Cert without a
// key: the leaf must be valid now and allow server authentication, and its key be of
// a type TLS serves. An expired issuer is logged, with where (a "file" or a "version"
// and its value).
func (s *Store) newCert(name string, chain []*x509.Certificate, now time.Time, whereKey string, where any) (*Cert, error) {
	leaf := chain[0]
	if now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if !serverAuth(leaf) {
		return nil, errors.New("the leaf's extended key usage does not allow TLS server authentication")
	}
	for i, c := range chain[1:] {
		if now.After(c.NotAfter) {
			s.log.Warn("an issuer in the chain has expired; clients must find another path to a root",
				"name", name, whereKey, where, "position", i+2, "subject", c.Subject.String(), "not_after", c.NotAfter)
		}
	}
	keyType, err := keyTypeOf(leaf.PublicKey)
	if err != nil {
		return nil, err
	}
	id, err := backend.KeyIDOf(leaf.PublicKey)
	if err != nil {
		return nil, err
	}
	c := &Cert{
		Name:      name,
		Leaf:      leaf,
		KeyType:   keyType,
		KeyID:     id,
		Names:     namesOf(leaf),
		NotBefore: leaf.NotBefore,
		NotAfter:  leaf.NotAfter,
	}
	for _, cert := range chain {
		c.Chain = append(c.Chain, cert.Raw)
	}
	return c, nil
}

func serverAuth(leaf *x509.Certificate) bool {
	if len(leaf.ExtKeyUsage) == 0 && len(leaf.UnknownExtKeyUsage) == 0 {
		return true
	}
	return slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny)
}

func keyTypeOf(pub crypto.PublicKey) (string, error) {
	switch pub.(type) {
	case *rsa.PublicKey:
		return KeyRSA, nil
	case *ecdsa.PublicKey:
		return KeyECDSA, nil
	case ed25519.PublicKey:
		return KeyEd25519, nil
	}
	return "", fmt.Errorf("unsupported public key type %T in the leaf", pub)
}

type publicKey interface{ Equal(crypto.PublicKey) bool }

// localKey reads the private key of leaf from a PEM file.
func localKey(path string, leaf *x509.Certificate) (crypto.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	priv, err := softkey.ParsePEM(data)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	signer, ok := priv.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key file %s: %T is not a signing key", path, priv)
	}
	if pub, ok := signer.Public().(publicKey); !ok || !pub.Equal(leaf.PublicKey) {
		return nil, fmt.Errorf("key file %s: the private key does not match the certificate's public key", path)
	}
	return signer, nil
}

// remoteKey checks that the keyservers hold the key of c and returns it.
func (s *Store) remoteKey(c *Cert) (crypto.Signer, error) {
	ks := s.opts.KeyServer
	if ks == nil {
		return nil, fmt.Errorf("no key_file, and no keyserver is configured to hold key %s", c.KeyID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.KeyTimeout)
	defer cancel()
	rk, err := ks.Key(ctx, c.KeyID)
	if err != nil {
		return nil, fmt.Errorf("no key_file, and the keyservers do not serve key %s: %w", c.KeyID, err)
	}
	if pub, ok := rk.Public().(publicKey); !ok || !pub.Equal(c.Leaf.PublicKey) {
		return nil, fmt.Errorf("the keyservers' key %s does not match the certificate's public key", c.KeyID)
	}
	return rk.PrivateKey(), nil
}
