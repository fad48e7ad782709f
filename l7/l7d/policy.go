package l7d

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"

	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/clientip"
)

// policy is the per-connection and per-request policy of one configuration: each
// listener's client-IP resolver and each blacklist's action. It is the L7 server's
// Decider and AcceptFilter, swapped with the rest of the configuration on reload;
// the lists themselves are shared, and change in place on pushes and reloads.
type policy struct {
	lists      *blacklist.Lists
	resolvers  map[string]*clientip.Resolver // by listener; nil trusts nothing
	closeLists map[string]bool               // lists whose action is close
	log        *slog.Logger
}

func newPolicy(cfg *FileConfig, lists *blacklist.Lists, log *slog.Logger) (*policy, error) {
	p := &policy{lists: lists, resolvers: map[string]*clientip.Resolver{}, closeLists: map[string]bool{}, log: log}
	for i, l := range cfg.Listeners {
		r, err := clientip.New(l.ClientIP)
		if err != nil {
			return nil, fmt.Errorf("listeners[%d].client_ip.%w", i, err)
		}
		p.resolvers[l.Name] = r
	}
	for name, b := range cfg.Blacklists {
		if b.Action == ActionClose {
			p.closeLists[name] = true
		}
	}
	return p, nil
}

// Decide finds the client a request is made for (from the header a trusted peer
// sends, else the connection's peer) and refuses it when a blacklist of the
// listener, or the global one, holds it.
func (p *policy) Decide(r *l7.Request) l7.Decision {
	res := p.resolvers[r.Conn.Listener]
	peer := r.Conn.Remote.Addr()
	client, src := res.FromHeaders(peer, r.Conn.Source, r.Header.PeekAll)
	d := l7.Decision{ClientIP: client, ClientSource: src, TrustedPeer: res.Trusted(peer)}
	source := blacklist.SourcePacket
	if src == clientip.SourceHeader {
		source = blacklist.SourceHeader
	}
	list, blocked := p.lists.Check(r.Conn.Listener, client, source)
	if !blocked {
		return d
	}
	action := ActionForbid
	if p.closeLists[list] {
		action = ActionClose
		d.Drop = true
	} else {
		d.Status = http.StatusForbidden
	}
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("request refused by a blacklist", "listener", r.Conn.Listener, "client", client,
			"source", src, "peer", peer, "list", list, "action", action)
	}
	return d
}

// accept is the AcceptFilter: a connection whose peer (the packet source, or the
// source a PROXY header names) is blacklisted is dropped before its handshake.
func (p *policy) accept(listener string, remote netip.AddrPort) bool {
	_, blocked := p.lists.Check(listener, remote.Addr(), blacklist.SourcePacket)
	return !blocked
}

var _ l7.Decider = (*policy)(nil)
