package l7d

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"slices"

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

// listSource is what a list was last loaded from: its files and a digest of their
// names and contents.
type listSource struct {
	files  []string
	digest [sha256.Size]byte
}

// readBlacklists reads the files of cfg's lists whose files, or their contents,
// differ from what loaded says they were loaded from. It returns the sets to swap in,
// by list (nil: empty the list, whose files are gone from the configuration), and the
// sources of every list loaded from files once they are swapped in. Nothing is
// swapped here: a bad file fails the whole, with the list, file and line.
func readBlacklists(cfg *FileConfig, loaded map[string]listSource) (map[string]*blacklist.Set, map[string]listSource, error) {
	sets := map[string]*blacklist.Set{}
	sources := map[string]listSource{}
	for name, b := range cfg.Blacklists {
		if len(b.Files) == 0 {
			continue
		}
		data := make([][]byte, len(b.Files))
		h := sha256.New()
		for i, f := range b.Files {
			var err error
			if data[i], err = os.ReadFile(f); err != nil {
				return nil, nil, fmt.Errorf("blacklists.%s: %w", name, err)
			}
			sum := sha256.Sum256(data[i])
			fmt.Fprintf(h, "%q %x\n", f, sum)
		}
		src := listSource{files: slices.Clone(b.Files)}
		h.Sum(src.digest[:0])
		sources[name] = src
		if old, ok := loaded[name]; ok && old.digest == src.digest {
			continue
		}
		var bl blacklist.Builder
		var set *blacklist.Set
		for i, f := range b.Files {
			s, err := blacklist.Read(bytes.NewReader(data[i]))
			if err != nil {
				return nil, nil, fmt.Errorf("blacklists.%s: %s: %w", name, f, err)
			}
			if len(b.Files) == 1 {
				set = s
				break
			}
			for e := range s.All() {
				bl.Add(e.Prefix, e.Expires)
			}
		}
		if set == nil {
			set = bl.Build()
		}
		sets[name] = set
	}
	for name := range loaded {
		if _, ok := sources[name]; !ok {
			sets[name] = nil
		}
	}
	return sets, sources, nil
}

// swapBlacklists puts sets in force.
func (d *Daemon) swapBlacklists(sets map[string]*blacklist.Set, sources map[string]listSource) {
	for name, s := range sets {
		l := d.lists.Listener(name)
		l.Replace(s)
		if s == nil {
			d.log.Info("blacklist emptied: its files are no longer configured", "list", name)
			continue
		}
		d.log.Info("blacklist loaded", "list", name, "entries", s.Len(), "files", sources[name].files)
	}
	d.loaded = sources
}

var _ l7.Decider = (*policy)(nil)
