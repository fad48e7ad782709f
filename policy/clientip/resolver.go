package clientip

import (
	"fmt"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// Source says how a client address was found.
type Source uint8

const (
	// SourcePacket: the source address of the connection, which the L4 tunnel keeps.
	SourcePacket Source = iota
	// SourceProxy: the source in a PROXY protocol header sent by a trusted peer.
	SourceProxy
	// SourceHeader: an HTTP header (X-Forwarded-For, X-Real-IP, …) sent by a trusted
	// peer.
	SourceHeader
)

var sourceNames = [...]string{SourcePacket: "packet", SourceProxy: "proxy_protocol", SourceHeader: "header"}

// String returns "packet", "proxy_protocol" or "header", the names used in logs and
// metric labels.
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// MarshalText returns the String form, so a Source logs and encodes as its name.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// HeaderXFF is X-Forwarded-For, the default header.
const HeaderXFF = "X-Forwarded-For"

// DefaultProxyTimeout is how long a peer has to send its PROXY header when
// Config.ProxyTimeout is zero.
const DefaultProxyTimeout = config.Duration(5 * time.Second)

// Config says, for one listener, where the client address may come from: the model a
// configuration file (l7d's listeners[i].client_ip) and the control plane hold, with
// the same names in YAML and JSON. The zero value trusts nothing: the client is the
// packet source. The zero value of every field means the default its comment gives;
// Defaults fills them in and Validate checks them, naming fields by path.
type Config struct {
	// TrustedProxies are CIDRs ("203.0.113.0/24", "2001:db8::/32") or single addresses
	// of the proxies whose Header is believed, such as a CDN's edge ranges. A request
	// whose peer is elsewhere has its headers ignored. Default none.
	TrustedProxies []string `yaml:"trusted_proxies,omitempty" json:"trusted_proxies,omitempty"`

	// Header carries the client address from a trusted peer: "X-Forwarded-For" (read
	// right to left, see ParseXFF), or the name of a header holding one address, set
	// by the trusted peer, such as "X-Real-IP", "True-Client-IP" or
	// "CF-Connecting-IP". Default X-Forwarded-For when TrustedProxies is set; it may
	// not be set without them.
	Header string `yaml:"header,omitempty" json:"header,omitempty"`

	// ProxyProtocol says the listener's peers open every connection with a PROXY
	// protocol header, version 1 or 2, whose source is then the connection's peer.
	// Only ProxyTrusted peers may connect. Default false.
	ProxyProtocol bool `yaml:"proxy_protocol,omitempty" json:"proxy_protocol,omitempty"`

	// ProxyTrusted are CIDRs or single addresses of the peers allowed to send PROXY
	// headers (the load balancers in front). Connections from anywhere else are closed
	// at once and counted. Required when ProxyProtocol is on, refused otherwise.
	ProxyTrusted []string `yaml:"proxy_trusted,omitempty" json:"proxy_trusted,omitempty"`

	// ProxyTimeout bounds the wait for a PROXY header after the connection is
	// accepted; a peer that is slower is closed and counted. Default 5s; only with
	// ProxyProtocol.
	ProxyTimeout config.Duration `yaml:"proxy_timeout,omitempty" json:"proxy_timeout,omitempty"`

	// MaxHops bounds the X-Forwarded-For elements examined, rightmost first. When all
	// of them are trusted proxies, the leftmost examined is the answer (see ParseXFF).
	// Default 64.
	MaxHops int `yaml:"max_hops,omitempty" json:"max_hops,omitempty"`
}

// Validate checks c and returns every problem, each a *config.FieldError named by its
// path within c, as in `trusted_proxies[2]: "10.0.0.0/33": bad CIDR`.
func (c *Config) Validate() error {
	var ck config.Checker
	for _, list := range []struct {
		field string
		v     []string
	}{{"trusted_proxies", c.TrustedProxies}, {"proxy_trusted", c.ProxyTrusted}} {
		for i, s := range list.v {
			if _, err := parsePrefix(s); err != nil {
				ck.Add(config.Index(list.field, i), err)
			}
		}
	}
	switch {
	case c.Header != "" && len(c.TrustedProxies) == 0:
		ck.Addf("header", "%q is set but trusted_proxies is empty, so no peer's header would be believed", c.Header)
	case c.Header != "" && !validFieldName(c.Header):
		ck.Addf("header", "%q is not a valid header name", c.Header)
	case c.Header != "" && textproto.CanonicalMIMEHeaderKey(c.Header) == "Forwarded":
		ck.Addf("header", `"Forwarded" (RFC 7239) is not supported; use X-Forwarded-For or a single-value header`)
	}
	if c.MaxHops < 0 {
		ck.Addf("max_hops", "%d is negative", c.MaxHops)
	}
	if c.ProxyTimeout < 0 {
		ck.Addf("proxy_timeout", "%v is negative", c.ProxyTimeout)
	}
	if c.ProxyProtocol {
		if len(c.ProxyTrusted) == 0 {
			ck.Addf("proxy_trusted", "required when proxy_protocol is on (a PROXY header from anyone would let them choose their address)")
		}
	} else {
		if len(c.ProxyTrusted) > 0 {
			ck.Addf("proxy_trusted", "set but proxy_protocol is off")
		}
		if c.ProxyTimeout > 0 {
			ck.Addf("proxy_timeout", "set but proxy_protocol is off")
		}
	}
	return ck.Err()
}

// Defaults fills in the default of every field left zero: Header (X-Forwarded-For,
// with TrustedProxies), MaxHops and, with ProxyProtocol, ProxyTimeout.
func (c *Config) Defaults() {
	if c.Header == "" && len(c.TrustedProxies) > 0 {
		c.Header = HeaderXFF
	}
	if c.MaxHops == 0 {
		c.MaxHops = DefaultMaxHops
	}
	if c.ProxyProtocol && c.ProxyTimeout == 0 {
		c.ProxyTimeout = DefaultProxyTimeout
	}
}

// Resolver finds the client address of requests on one listener. It is compiled from
// a Config by New, is immutable and is safe for concurrent use. A nil *Resolver
// trusts nothing.
type Resolver struct {
	cfg          Config // with defaults filled in
	trusted      *prefixTable
	proxyTrusted *prefixTable
	header       string // canonical form; empty when TrustedProxies is empty
	xff          bool
	maxHops      int
}

// New checks cfg (Validate: every problem, each naming its field, as in
// `trusted_proxies[2]: "10.0.0.0/33": bad CIDR`), fills in its defaults and
// compiles it.
func New(cfg Config) (*Resolver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Defaults()
	r := &Resolver{}
	var err error
	if r.trusted, err = compilePrefixes("trusted_proxies", cfg.TrustedProxies); err != nil {
		return nil, err
	}
	if r.proxyTrusted, err = compilePrefixes("proxy_trusted", cfg.ProxyTrusted); err != nil {
		return nil, err
	}
	if cfg.Header != "" {
		cfg.Header = textproto.CanonicalMIMEHeaderKey(cfg.Header)
	}
	r.header = cfg.Header
	r.xff = cfg.Header == HeaderXFF
	r.maxHops = cfg.MaxHops
	cfg.TrustedProxies = slices.Clone(cfg.TrustedProxies)
	cfg.ProxyTrusted = slices.Clone(cfg.ProxyTrusted)
	r.cfg = cfg
	return r, nil
}

// validFieldName reports whether s is an HTTP field name (an RFC 9110 token).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// Config returns the configuration the Resolver was built from, defaults filled in
// (the header name in canonical form).
func (r *Resolver) Config() Config {
	if r == nil {
		return Config{MaxHops: DefaultMaxHops}
	}
	c := r.cfg
	c.TrustedProxies = slices.Clone(c.TrustedProxies)
	c.ProxyTrusted = slices.Clone(c.ProxyTrusted)
	return c
}

// Trusted reports whether a is among the TrustedProxies, whose headers are believed.
// Zones are ignored and IPv4-mapped addresses match IPv4 entries.
func (r *Resolver) Trusted(a netip.Addr) bool {
	return r != nil && r.trusted.contains(a)
}

// ProxyTrusted reports whether a is among the ProxyTrusted peers, allowed to send
// PROXY headers.
func (r *Resolver) ProxyTrusted(a netip.Addr) bool {
	return r != nil && r.proxyTrusted.contains(a)
}

// FromHeaders returns the client a request is made for, and how it was found.
//
// peer is the connection's peer as the listener established it: the packet source
// (peerSource SourcePacket) or the source of a PROXY header (SourceProxy). When peer
// is a trusted proxy, the configured header is read through get, which returns the
// values of a header, one per line, in order (fasthttp's RequestHeader.PeekAll, or
// http.Header.Values converted); get is called at most once. Otherwise, or when the
// header yields no address, the answer is (peer, peerSource): a header from an
// untrusted peer is never believed.
//
// The address returned has no zone and IPv4 is unmapped. FromHeaders does not
// allocate.
func (r *Resolver) FromHeaders(peer netip.Addr, peerSource Source, get func(name string) [][]byte) (netip.Addr, Source) {
	peer = peer.Unmap().WithZone("")
	if r == nil || r.header == "" || get == nil || !r.trusted.contains(peer) {
		return peer, peerSource
	}
	values := get(r.header)
	if r.xff {
		if a, ok := ParseXFF(values, r.trusted.contains, r.maxHops); ok {
			return a, SourceHeader
		}
		return peer, peerSource
	}
	// A single-value header is overwritten by the trusted peer; more than one line
	// means something on the way added to it, and no line can be told from another.
	if len(values) == 1 {
		if a, ok := ParseAddr(values[0]); ok {
			return a, SourceHeader
		}
	}
	return peer, peerSource
}
