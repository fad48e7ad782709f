package keyserver

import (
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

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

// grant is what one client may do, compiled from its ClientRule.
type grant struct {
	rule   string
	all    bool
	ids    map[protocol.KeyID]bool
	labels map[string]bool
	admin  bool
}

func compileRule(r ClientRule) *grant {
	g := &grant{rule: r.Name, ids: map[protocol.KeyID]bool{}, labels: map[string]bool{}, admin: r.Admin}
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
	return g
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

func (g *grant) allows(k *keyEntry) bool {
	return g.all || g.ids[k.ID] || (k.Label != "" && g.labels[k.Label])
}

// ruleSet is the client rules in force, compiled: an immutable snapshot swapped
// whole by Server.Apply.
type ruleSet struct {
	rules  []ClientRule
	grants []*grant
}

// noRule is the rule name of the grant of a client no rule matches.
const noRule = "none"

func compileRules(rules []ClientRule) *ruleSet {
	rs := &ruleSet{rules: slices.Clone(rules)}
	for _, r := range rules {
		rs.grants = append(rs.grants, compileRule(r))
	}
	return rs
}

// grantFor returns the grant of the first rule matching a client certificate's
// names; with no rules at all, every key; when no rule matches, nothing (the
// rule named noRule).
func (rs *ruleSet) grantFor(names []string) *grant {
	if len(rs.rules) == 0 {
		return &grant{rule: "default", all: true}
	}
	for i, r := range rs.rules {
		if r.Name == "*" || slices.Contains(names, r.Name) {
			return rs.grants[i]
		}
	}
	return &grant{rule: noRule}
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
