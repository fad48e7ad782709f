package certs

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// MemConfig is a certificate configuration held in memory rather than in files, as
// the control plane gives it to l7d: certificate chains whose private keys the
// keyservers hold (never the node), and which of them each listener serves, for
// which server names.
type MemConfig struct {
	// Certificates are the chains, each with its name and version. Names are unique.
	// Default none.
	Certificates []MemCert

	// Listeners gives, by listener name, the bindings of certificates served there. A
	// listener not named serves no certificate: its handshakes fail with
	// ErrNoCertificate. Default none.
	Listeners map[string][]Binding

	// TicketKeyFiles are Config.TicketKeyFiles: the files of the session ticket keys
	// the cluster shares, newest first. Default none: per-process random keys.
	TicketKeyFiles []string
}

// MemCert is one certificate of a MemConfig.
type MemCert struct {
	// Name identifies the certificate in bindings, reports, logs and metrics.
	// Required.
	Name string

	// Version is the version of Name, reported with it (Cert.Version). Default 0.
	Version int

	// Chain is the PEM certificate chain, the leaf first, as ParseChain reads it. The
	// leaf's private key is held by the keyservers under its key ID (the SHA-256 of
	// its SubjectPublicKeyInfo); private key blocks in Chain are ignored. Required.
	Chain []byte
}

// Binding serves certificates on a listener.
type Binding struct {
	// Name names the binding in errors. Default none.
	Name string

	// Certificates are the names of the MemCerts served, at most one per key type
	// (ECDSA and RSA side by side: per handshake the first the client supports in
	// the order ECDSA, Ed25519, RSA). At least one.
	Certificates []string

	// ServerNames are the server names (SNI) served: DNS names, "*.example.com"
	// wildcards (one label) or IP addresses (also served to clients that send no
	// server name and connect to that address). A name may be bound once per
	// listener. Default: every name of the certificates (Cert.Names).
	ServerNames []string

	// Default serves the certificates to handshakes whose server name no binding of
	// the listener serves, or that send none. One per listener. Default false.
	Default bool
}

// PrepareMem is Prepare for a configuration held in memory: it reads the ticket key
// files and checks every certificate (chain order, validity now, server
// authentication, key type) and that the keyservers hold its key, then builds the
// Set and each listener's view of it (Set.Listener). Unlike Prepare it leaves nothing
// out: any certificate that fails, or a binding that names a certificate it does not
// have, binds a name twice or gives a listener two defaults, fails the whole and
// changes nothing; the error names each. A certificate whose chain is the one of a
// certificate being served is taken from the current Set without asking the
// keyservers again. What it returns is put in force by Commit.
func (s *Store) PrepareMem(cfg MemConfig) (*Prepared, error) {
	p, err := s.prepareMem(cfg)
	if err != nil {
		s.m.failed()
		s.log.Error("certificates not loaded; the previous set stays in use", "err", err)
		return nil, err
	}
	return p, nil
}

func (s *Store) prepareMem(cfg MemConfig) (*Prepared, error) {
	keys, err := LoadTicketKeys(cfg.TicketKeyFiles)
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	cur := map[string]*Cert{} // served remote certificates by their chain
	if set := s.set.Load(); set != nil {
		for _, c := range set.certs {
			if c.Remote {
				cur[chainKey(c.Chain)] = c
			}
		}
	}
	now := s.opts.Now()
	certs := make([]*Cert, len(cfg.Certificates))
	errs := make([]error, len(cfg.Certificates))
	seen := map[string]bool{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, loadWorkers)
	for i, mc := range cfg.Certificates {
		switch {
		case mc.Name == "":
			errs[i] = errors.New("the name is empty")
			continue
		case seen[mc.Name]:
			errs[i] = errors.New("another certificate has this name")
			continue
		}
		seen[mc.Name] = true
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			certs[i], errs[i] = s.memCert(mc, now, cur)
		})
	}
	wg.Wait()
	var bad []error
	byName := map[string]*Cert{}
	for i, mc := range cfg.Certificates {
		if errs[i] != nil {
			bad = append(bad, fmt.Errorf("certificate %q (version %d): %w", mc.Name, mc.Version, errs[i]))
			continue
		}
		byName[mc.Name] = certs[i]
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("certs: %w", errors.Join(bad...))
	}
	set := newSet(certs, "")
	set.views = map[string]*Set{}
	for _, name := range slices.Sorted(maps.Keys(cfg.Listeners)) {
		v, err := boundSet(byName, cfg.Listeners[name])
		if err != nil {
			bad = append(bad, fmt.Errorf("listener %q: %w", name, err))
			continue
		}
		set.views[name] = v
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("certs: %w", errors.Join(bad...))
	}
	if !s.tickets.Load().sameKeys(keys) {
		warnTicketFileModes(cfg.TicketKeyFiles, s.log)
	}
	return &Prepared{set: set, keys: keys, loaded: len(certs)}, nil
}

// chainKey is a map key of a DER chain.
func chainKey(chain [][]byte) string { return string(bytes.Join(chain, []byte{0})) }

// memCert checks one certificate held in memory and finds its remote key, or takes
// it from cur (served certificates by chain) when its chain is served already.
func (s *Store) memCert(mc MemCert, now time.Time, cur map[string]*Cert) (*Cert, error) {
	chain, err := ParseChain(mc.Chain)
	if err != nil {
		return nil, err
	}
	ders := make([][]byte, len(chain))
	for i, c := range chain {
		ders[i] = c.Raw
	}
	if c := cur[chainKey(ders)]; c != nil && !now.After(c.NotAfter) && !now.Before(c.NotBefore) {
		cc := *c
		cc.Name, cc.Version = mc.Name, mc.Version
		return &cc, nil
	}
	c, err := s.newCert(mc.Name, chain, now, "version", mc.Version)
	if err != nil {
		return nil, err
	}
	c.Version, c.Remote = mc.Version, true
	priv, err := s.remoteKey(c)
	if err != nil {
		return nil, err
	}
	c.TLS = &tls.Certificate{Certificate: c.Chain, PrivateKey: priv, Leaf: c.Leaf}
	return c, nil
}

// boundSet builds what one listener serves from its bindings.
func boundSet(byName map[string]*Cert, bs []Binding) (*Set, error) {
	set := &Set{
		byName: map[string]*Cert{},
		exact:  map[string]*group{},
		wild:   map[string]*group{},
		ips:    map[netip.Addr]*group{},
	}
	var errs []error
	boundBy := map[string]string{} // server name → the binding serving it
	for i, b := range bs {
		what := fmt.Sprintf("binding %d", i)
		if b.Name != "" {
			what = fmt.Sprintf("binding %q", b.Name)
		}
		var cs []*Cert
		types := map[string]string{}
		for _, name := range b.Certificates {
			c := byName[name]
			if c == nil {
				errs = append(errs, fmt.Errorf("%s: no certificate is named %q", what, name))
				continue
			}
			if other, dup := types[c.KeyType]; dup {
				errs = append(errs, fmt.Errorf("%s: %q has the same key type (%s) as %q: one certificate per key type", what, name, c.KeyType, other))
				continue
			}
			types[c.KeyType] = name
			cs = append(cs, c)
		}
		if len(cs) == 0 {
			if len(b.Certificates) == 0 {
				errs = append(errs, fmt.Errorf("%s: no certificate", what))
			}
			continue
		}
		names := make([]string, 0, len(b.ServerNames))
		for _, n := range b.ServerNames {
			names = append(names, string(appendLower(nil, strings.TrimSuffix(n, "."))))
		}
		if len(names) == 0 {
			for _, c := range cs {
				for _, n := range c.Names {
					if !slices.Contains(names, n) {
						names = append(names, n)
					}
				}
			}
		}
		for _, c := range cs {
			if _, ok := set.byName[c.Name]; !ok {
				set.byName[c.Name] = c
				set.certs = append(set.certs, c)
			}
		}
		for _, n := range names {
			if first, dup := boundBy[n]; dup {
				errs = append(errs, fmt.Errorf("%s: the server name %q is bound by %s too", what, n, first))
				continue
			}
			boundBy[n] = what
			m, key := set.exact, n
			if rest, ok := strings.CutPrefix(n, "*."); ok {
				m, key = set.wild, rest
			}
			for _, c := range cs {
				addTo(m, key, c)
			}
			if ip, err := netip.ParseAddr(n); err == nil {
				for _, c := range cs {
					addTo(set.ips, ip.Unmap(), c)
				}
			}
		}
		if b.Default {
			if set.defg != nil {
				errs = append(errs, fmt.Errorf("%s: the listener has another default binding", what))
				continue
			}
			set.defg = &group{first: cs[0], preferred: slices.Clone(cs)}
			set.def = cs[0]
		}
	}
	for _, m := range []map[string]*group{set.exact, set.wild} {
		for _, g := range m {
			g.sort()
		}
	}
	for _, g := range set.ips {
		g.sort()
	}
	if set.defg != nil {
		set.defg.sort()
	}
	return set, errors.Join(errs...)
}

// TLSConfigFor is TLSConfig for the listener named listener: its GetCertificate
// selects among what that listener serves (Set.Listener), following every Commit.
func (s *Store) TLSConfigFor(listener string) *tls.Config {
	cfg := s.TLSConfig()
	cfg.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		set := s.set.Load()
		if set == nil {
			return nil, errNotLoaded
		}
		c, err := set.Listener(listener).Select(hello)
		if err != nil {
			return nil, err
		}
		return c.TLS, nil
	}
	return cfg
}
