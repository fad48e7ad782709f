package keyserver

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// keyEntry is a key as the server serves it, with its SPKI ready for OpPublicKey.
type keyEntry struct {
	*backend.Key
	spki    []byte
	backend string
}

// keySet is an immutable snapshot of every key the server offers; it is swapped
// whole when a key is imported.
type keySet struct {
	byID map[protocol.KeyID]*keyEntry
	list []*keyEntry
}

func newKeySet(backends []backend.Backend) (*keySet, error) {
	ks := &keySet{byID: map[protocol.KeyID]*keyEntry{}}
	for _, b := range backends {
		keys, err := b.Keys()
		if err != nil {
			return nil, fmt.Errorf("listing keys of backend %s: %w", b.Name(), err)
		}
		for _, k := range keys {
			if err := ks.add(k, b.Name()); err != nil {
				return nil, err
			}
		}
	}
	return ks, nil
}

func (ks *keySet) add(k *backend.Key, backendName string) error {
	if _, dup := ks.byID[k.ID]; dup {
		return nil
	}
	spki, err := x509.MarshalPKIXPublicKey(k.Public)
	if err != nil {
		return fmt.Errorf("key %s (%q): %w", k.ID.Short(), k.Label, err)
	}
	e := &keyEntry{Key: k, spki: spki, backend: backendName}
	ks.byID[k.ID] = e
	ks.list = append(ks.list, e)
	return nil
}

// with returns a copy of ks that also holds k.
func (ks *keySet) with(k *backend.Key, backendName string) (*keySet, error) {
	n := &keySet{byID: make(map[protocol.KeyID]*keyEntry, len(ks.byID)+1), list: append([]*keyEntry(nil), ks.list...)}
	for id, e := range ks.byID {
		n.byID[id] = e
	}
	return n, n.add(k, backendName)
}

// opMask is a set of operations, one bit per op value.
type opMask uint64

func bit(op protocol.Op) opMask { return 1 << op }

// keyOps are the operations a rule's ops govern, in wire order.
var keyOps = []protocol.Op{protocol.OpPublicKey, protocol.OpRSASignPKCS1, protocol.OpRSASignPSS,
	protocol.OpRSADecrypt, protocol.OpECDSASign, protocol.OpEd25519Sign}

const (
	signOps    = 1<<protocol.OpRSASignPKCS1 | 1<<protocol.OpRSASignPSS | 1<<protocol.OpECDSASign | 1<<protocol.OpEd25519Sign
	allKeyOps  = signOps | 1<<protocol.OpPublicKey | 1<<protocol.OpRSADecrypt
	defaultOps = signOps | 1<<protocol.OpPublicKey
)

// opsOf returns the operations an entry of a rule's ops names.
func opsOf(name string) (opMask, error) {
	switch name {
	case "*":
		return allKeyOps, nil
	case "sign":
		return signOps, nil
	}
	names := make([]string, 0, len(keyOps))
	for _, op := range keyOps {
		if op.String() == name {
			return bit(op), nil
		}
		names = append(names, op.String())
	}
	return 0, fmt.Errorf("unknown operation %q: want sign, * or one of %s", name, strings.Join(names, ", "))
}

// grant is what one client may do, compiled from its ClientRule.
type grant struct {
	rule   string
	index  int // of the rule in its ruleSet; -1 for none
	all    bool
	ids    map[protocol.KeyID]bool
	labels map[string]bool
	ops    opMask
	admin  bool
	rate   RateLimit
}

func compileRule(i int, r ClientRule) *grant {
	g := &grant{rule: r.Name, index: i, ids: map[protocol.KeyID]bool{}, labels: map[string]bool{}, admin: r.Admin, rate: r.RateLimit}
	for _, k := range r.Keys {
		switch {
		case k == "*":
			g.all = true
		case len(k) == 2*protocol.KeyIDLen && isHex(k):
			id, _ := protocol.ParseKeyID(strings.ToLower(k))
			g.ids[id] = true
		default:
			g.labels[k] = true
		}
	}
	for _, name := range r.Ops {
		m, _ := opsOf(name) // validated
		g.ops |= m
	}
	if len(r.Ops) == 0 {
		g.ops = defaultOps
	}
	return g
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

func (g *grant) allows(k *keyEntry) bool {
	return g.all || g.ids[k.ID] || (k.Label != "" && g.labels[k.Label])
}

// allowsOp reports whether the grant lets its client ask for op at all (ping and
// list_keys always; import_key for admins; key operations as the rule's ops say).
func (g *grant) allowsOp(op protocol.Op) bool {
	switch op {
	case protocol.OpPing, protocol.OpListKeys:
		return true
	case protocol.OpImportKey:
		return g.admin
	}
	return g.ops&bit(op) != 0
}

// ruleSet is the client rules in force, compiled, with the deny list and the rate
// limiters of the clients they matched: an immutable snapshot (but for the
// limiters) swapped whole by Server.Apply.
type ruleSet struct {
	rules    []ClientRule
	grants   []*grant
	allowAll bool
	deny     denySet

	mu      sync.Mutex
	buckets map[bucketKey]*bucket
}

// bucketKey names a client's rate limiter: the rule that matched it and its
// certificate's key.
type bucketKey struct {
	rule int
	spki [sha256.Size]byte
}

// noRule is the rule name of the grant of a client no rule matches.
const noRule = "none"

// allowAllRule is the rule name of the grant every client gets under
// allow_all_clients.
const allowAllRule = "allow_all_clients"

func compileRules(rules []ClientRule, allowAll bool, deny DenyList) *ruleSet {
	rs := &ruleSet{rules: slices.Clone(rules), allowAll: allowAll, deny: compileDeny(deny), buckets: map[bucketKey]*bucket{}}
	for i, r := range rules {
		rs.grants = append(rs.grants, compileRule(i, r))
	}
	return rs
}

// grantFor returns the grant of the first rule matching a client certificate's
// names; with no rules and allow_all_clients, every key with the default
// operations; when no rule matches, nothing (the rule named noRule).
func (rs *ruleSet) grantFor(names []string) *grant {
	if len(rs.rules) == 0 && rs.allowAll {
		return &grant{rule: allowAllRule, index: -1, all: true, ops: defaultOps}
	}
	for i, r := range rs.rules {
		if r.Name == "*" || slices.Contains(names, r.Name) {
			return rs.grants[i]
		}
	}
	return &grant{rule: noRule, index: -1}
}

// limiter returns the rate limiter of the client whose certificate's key digest is
// spki under g, or nil when g has no limit.
func (rs *ruleSet) limiter(g *grant, spki [sha256.Size]byte) *bucket {
	if g.rate.PerSecond <= 0 || g.index < 0 {
		return nil
	}
	k := bucketKey{g.index, spki}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	b := rs.buckets[k]
	if b == nil {
		b = newBucket(g.rate)
		rs.buckets[k] = b
	}
	return b
}

// bucket is a token bucket, shared by the connections of one client.
type bucket struct {
	rate, burst float64
	mu          sync.Mutex
	tokens      float64
	last        time.Time
}

func newBucket(r RateLimit) *bucket {
	burst := float64(r.Burst)
	if burst <= 0 {
		burst = max(1, math.Ceil(r.PerSecond))
	}
	return &bucket{rate: r.PerSecond, burst: burst, tokens: burst}
}

// allow takes a token, reporting whether there was one.
func (b *bucket) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// denySet is a DenyList compiled for lookups.
type denySet struct {
	serials map[string]bool // big.Int hex
	spki    map[[sha256.Size]byte]bool
}

func compileDeny(d DenyList) denySet {
	ds := denySet{serials: map[string]bool{}, spki: map[[sha256.Size]byte]bool{}}
	for _, s := range d.Serials {
		if n, err := parseSerial(s); err == nil {
			ds.serials[n] = true
		}
	}
	for _, s := range d.SPKISHA256 {
		if h, err := parseSPKIDigest(s); err == nil {
			ds.spki[h] = true
		}
	}
	return ds
}

// denies reports whether the set names the certificate of serial and key digest
// spki.
func (ds denySet) denies(serial *big.Int, spki [sha256.Size]byte) bool {
	if len(ds.serials) > 0 && serial != nil && ds.serials[serial.Text(16)] {
		return true
	}
	return ds.spki[spki]
}

// parseSerial reads a certificate serial number in hex, colons allowed, as
// big.Int's hex text.
func parseSerial(s string) (string, error) {
	h := strings.ReplaceAll(s, ":", "")
	if h == "" || len(h) > 2*20+2 {
		return "", fmt.Errorf("serial %q: want 1 to 20 bytes in hex", s)
	}
	n, ok := new(big.Int).SetString(h, 16)
	if !ok || n.Sign() < 0 {
		return "", fmt.Errorf("serial %q: want 1 to 20 bytes in hex", s)
	}
	return n.Text(16), nil
}

// parseSPKIDigest reads a SHA-256 digest written as 64 hex digits (colons allowed).
func parseSPKIDigest(s string) ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	b, err := hex.DecodeString(strings.ReplaceAll(s, ":", ""))
	if err != nil || len(b) != sha256.Size {
		return d, fmt.Errorf("spki_sha256 %q: want a SHA-256 digest, 64 hex digits", s)
	}
	copy(d[:], b)
	return d, nil
}

// certNames lists the names a rule may match: common name, DNS and URI SANs.
func certNames(c *x509.Certificate) []string {
	names := make([]string, 0, 1+len(c.DNSNames)+len(c.URIs))
	if c.Subject.CommonName != "" {
		names = append(names, c.Subject.CommonName)
	}
	names = append(names, c.DNSNames...)
	for _, u := range c.URIs {
		names = append(names, u.String())
	}
	return names
}
