package policy

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"

	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/clientip"
)

// Listener is what the decision needs of one listener.
type Listener struct {
	// Name is the listener's name, its blacklist's name too. Required.
	Name string
	// ClientIP says where the client address may come from on this listener.
	// Default: the packet's source, headers ignored.
	ClientIP clientip.Config
}

// Decider is the per-connection and per-request policy of one configuration: each
// listener's client-IP resolver and each blacklist's action, over lists that change
// in place on pushes and reloads. It is immutable and safe for concurrent use; a new
// configuration makes a new Decider.
type Decider struct {
	lists      *blacklist.Lists
	resolvers  map[string]*clientip.Resolver // by listener; nil trusts nothing
	closeLists map[string]bool               // lists whose action is close
	log        *slog.Logger
}

// New returns the Decider of listeners over lists, with each list's action from
// blacklists (by list name; a list not there forbids). A nil log discards.
func New(listeners []Listener, lists *blacklist.Lists, blacklists map[string]blacklist.ListConfig, log *slog.Logger) (*Decider, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Decider{lists: lists, resolvers: map[string]*clientip.Resolver{}, closeLists: map[string]bool{}, log: log}
	for _, l := range listeners {
		r, err := clientip.New(l.ClientIP)
		if err != nil {
			return nil, fmt.Errorf("listener %q: client_ip.%w", l.Name, err)
		}
		p.resolvers[l.Name] = r
	}
	for name, b := range blacklists {
		if b.Action == blacklist.ActionClose {
			p.closeLists[name] = true
		}
	}
	return p, nil
}

// Resolver returns a listener's client-IP resolver (nil for a listener it was not
// made with: it trusts nothing).
func (p *Decider) Resolver(listener string) *clientip.Resolver { return p.resolvers[listener] }

// Request is what a decision looks at.
type Request struct {
	// Listener is the listener's name.
	Listener string
	// Remote is the connection's peer: the packet's source, or the source a PROXY
	// header named.
	Remote netip.AddrPort
	// Source is how Remote was found: clientip.SourcePacket or SourceProxy.
	Source clientip.Source
	// Header returns every value of a request header (fasthttp's PeekAll). Nil
	// means none.
	Header func(name string) [][]byte
}

// Decision is what to do with a request. The zero Decision serves it on behalf of
// the connection's peer.
type Decision struct {
	// ClientIP is the client the request is made for.
	ClientIP netip.Addr
	// ClientSource says how ClientIP was found.
	ClientSource clientip.Source
	// TrustedPeer says the peer is a proxy whose headers are trusted, whose
	// X-Forwarded-For is kept and extended.
	TrustedPeer bool
	// Status, when not zero, answers the request with it (403, a blacklisted
	// client on a list whose action is forbid).
	Status int
	// Drop answers nothing: the request of a blacklisted client on a list whose
	// action is close.
	Drop bool
}

func noHeader(string) [][]byte { return nil }

// Decide finds the client a request is made for (from the header a trusted peer
// sends, else the connection's peer) and refuses it when a blacklist of the
// listener, or the global one, holds it: 403, or a drop when that list's action is
// close. The hit is counted on the list, by where the address came from.
func (p *Decider) Decide(r Request) Decision {
	res := p.resolvers[r.Listener]
	peer := r.Remote.Addr()
	get := r.Header
	if get == nil {
		get = noHeader
	}
	client, src := res.FromHeaders(peer, r.Source, get)
	d := Decision{ClientIP: client, ClientSource: src, TrustedPeer: res.Trusted(peer)}
	source := blacklist.SourcePacket
	if src == clientip.SourceHeader {
		source = blacklist.SourceHeader
	}
	list, blocked := p.lists.Check(r.Listener, client, source)
	if !blocked {
		return d
	}
	action := blacklist.ActionForbid
	if p.closeLists[list] {
		action = blacklist.ActionClose
		d.Drop = true
	} else {
		d.Status = http.StatusForbidden
	}
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("request refused by a blacklist", "listener", r.Listener, "client", client,
			"source", src, "peer", peer, "list", list, "action", action)
	}
	return d
}

// Accept is the decision on a connection, before any TLS work: one whose peer (the
// packet's source, or the source a PROXY header names) is blacklisted is refused.
func (p *Decider) Accept(listener string, remote netip.AddrPort) bool {
	_, blocked := p.lists.Check(listener, remote.Addr(), blacklist.SourcePacket)
	return !blocked
}
