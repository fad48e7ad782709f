package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/certs/chain"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// Key types of Cert.KeyType.
const (
	KeyRSA     = chain.KeyRSA
	KeyECDSA   = chain.KeyECDSA
	KeyEd25519 = chain.KeyEd25519
)

// Cert is one loaded certificate. It is immutable once in a Set.
type Cert struct {
	Name string
	// Version is the version of a certificate held in memory (MemCert.Version); 0 for
	// one read from files.
	Version  int
	CertFile string
	KeyFile  string // empty for a remote key
	Leaf     *x509.Certificate
	Chain    [][]byte // DER, leaf first
	KeyType  string   // KeyRSA, KeyECDSA or KeyEd25519
	Remote   bool     // the private key is held by the keyservers
	KeyID    protocol.KeyID
	TLS      *tls.Certificate
	// Names are the names the certificate is served for, lower case: its DNS and IP
	// address SANs or, when it has neither, its subject common name.
	Names     []string
	NotBefore time.Time
	NotAfter  time.Time
}

// Set is an immutable snapshot of the loaded certificates and their SNI index. It is
// safe for concurrent use.
type Set struct {
	certs  []*Cert
	byName map[string]*Cert
	exact  map[string]*group     // lower-case names, IP addresses as strings
	wild   map[string]*group     // "*.example.com" under "example.com"
	ips    map[netip.Addr]*group // IP address SANs, for clients that send no SNI
	def    *Cert
	defg   *group // a bound default (Binding.Default): chosen by what the client supports

	// views, for a Set built from bindings (Store.PrepareMem), is what each listener
	// serves, by listener name; nil for a Set read from files, which every listener
	// serves whole.
	views map[string]*Set
}

// emptySet serves no certificate: the view of a listener no binding names.
var emptySet = newSet(nil, "")

// Listener returns what the listener named name serves: the Set itself when it was
// read from files (Store.Prepare), which every listener serves whole; for a Set built
// from bindings (Store.PrepareMem), the certificates bound to that listener for the
// server names of their bindings, and an empty Set for a listener no binding names.
func (set *Set) Listener(name string) *Set {
	if set.views == nil {
		return set
	}
	if v := set.views[name]; v != nil {
		return v
	}
	return emptySet
}

// group is the certificates for one name: preferred lists them by preference of key
// type (ECDSA, then Ed25519, then RSA; configuration order within a type), first is
// the first in configuration order.
type group struct {
	preferred []*Cert
	first     *Cert
}

// Certs returns the certificates in configuration order. The slice must not be
// modified.
func (set *Set) Certs() []*Cert { return set.certs }

// Cert returns the certificate named name, or nil.
func (set *Set) Cert(name string) *Cert { return set.byName[name] }

// Default returns the default certificate, or nil.
func (set *Set) Default() *Cert { return set.def }

// newSet indexes certs (in configuration order, names unique); def names the default
// certificate or is empty.
func newSet(certs []*Cert, def string) *Set {
	set := &Set{
		certs:  certs,
		byName: make(map[string]*Cert, len(certs)),
		exact:  map[string]*group{},
		wild:   map[string]*group{},
		ips:    map[netip.Addr]*group{},
	}
	for _, c := range certs {
		set.byName[c.Name] = c
		for _, n := range c.Names {
			if rest, ok := strings.CutPrefix(n, "*."); ok {
				if rest != "" && !strings.Contains(rest, "*") {
					addTo(set.wild, rest, c)
				}
				continue
			}
			if strings.Contains(n, "*") {
				continue // partial wildcards are not honoured by clients either
			}
			addTo(set.exact, n, c)
			if ip, err := netip.ParseAddr(n); err == nil {
				addTo(set.ips, ip.Unmap(), c)
			}
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
	if def != "" {
		set.def = set.byName[def]
	}
	return set
}

func addTo[K comparable](m map[K]*group, key K, c *Cert) {
	g := m[key]
	if g == nil {
		g = &group{first: c}
		m[key] = g
	}
	if !slices.Contains(g.preferred, c) {
		g.preferred = append(g.preferred, c)
	}
}

func (g *group) sort() {
	slices.SortStableFunc(g.preferred, func(a, b *Cert) int { return keyRank(a.KeyType) - keyRank(b.KeyType) })
}

// keyRank orders key types by the cost of a handshake signature, cheapest first.
func keyRank(t string) int {
	switch t {
	case KeyECDSA:
		return 0
	case KeyEd25519:
		return 1
	}
	return 2
}

// Select returns the certificate for a handshake: the certificates for the client's
// server name (case does not matter, a trailing dot is ignored), else those of a
// wildcard one label above it (*.example.com serves a.example.com, but neither
// example.com nor a.b.example.com); with no server name, those for the connection's
// local IP address; else the default. Among several certificates for the name, the
// first the client supports in the order ECDSA, Ed25519, RSA wins, else the first
// configured. With no match and no default, the error wraps ErrNoCertificate.
func (set *Set) Select(hello *tls.ClientHelloInfo) (*Cert, error) {
	if name := hello.ServerName; name != "" {
		var buf [256]byte
		key := appendLower(buf[:0], strings.TrimSuffix(name, "."))
		// Map lookups keyed by string(bytes) do not allocate.
		if g := set.exact[string(key)]; g != nil {
			return g.choose(hello), nil
		}
		if i := bytes.IndexByte(key, '.'); i > 0 {
			if g := set.wild[string(key[i+1:])]; g != nil {
				return g.choose(hello), nil
			}
		}
	} else if len(set.ips) > 0 && hello.Conn != nil {
		if ip, ok := localIP(hello.Conn); ok {
			if g := set.ips[ip]; g != nil {
				return g.choose(hello), nil
			}
		}
	}
	if set.defg != nil {
		return set.defg.choose(hello), nil
	}
	if set.def != nil {
		return set.def, nil
	}
	if hello.ServerName == "" {
		return nil, fmt.Errorf("%w: the client sent no server name", ErrNoCertificate)
	}
	return nil, fmt.Errorf("%w %q", ErrNoCertificate, hello.ServerName)
}

// appendLower appends s in ASCII lower case to b (host names are ASCII; IDNs come
// as punycode).
func appendLower(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

func (g *group) choose(hello *tls.ClientHelloInfo) *Cert {
	if len(g.preferred) == 1 {
		return g.preferred[0]
	}
	for _, c := range g.preferred {
		if hello.SupportsCertificate(c.TLS) == nil {
			return c
		}
	}
	return g.first
}

func localIP(c net.Conn) (netip.Addr, bool) {
	switch a := c.LocalAddr().(type) {
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	case *net.UDPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		return ip.Unmap(), ok
	}
	return netip.Addr{}, false
}

// namesOf returns the names a leaf is served for: its DNS and IP address SANs, lower
// case without a trailing dot, or its common name when it has neither.
func namesOf(leaf *x509.Certificate) []string {
	var names []string
	addName := func(n string) {
		n = string(appendLower(nil, strings.TrimSuffix(n, ".")))
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	for _, n := range leaf.DNSNames {
		addName(n)
	}
	for _, ip := range leaf.IPAddresses {
		addName(ip.String())
	}
	if len(leaf.DNSNames) == 0 && len(leaf.IPAddresses) == 0 {
		addName(leaf.Subject.CommonName)
	}
	return names
}
