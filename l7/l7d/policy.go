package l7d

import (
	"log/slog"

	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/policy"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// decider is the L7 server's Decider over the policy of one configuration (package
// policy), swapped with the rest of the configuration on reload.
type decider struct{ p *policy.Decider }

func newDecider(cfg *FileConfig, lists *blacklist.Lists, log *slog.Logger) (decider, error) {
	ls := make([]policy.Listener, len(cfg.Listeners))
	for i, l := range cfg.Listeners {
		ls[i] = policy.Listener{Name: l.Name, ClientIP: l.ClientIP}
	}
	p, err := policy.New(ls, lists, cfg.Blacklists, log)
	return decider{p}, err
}

// Decide is policy.Decider.Decide for an L7 request.
func (d decider) Decide(r *l7.Request) l7.Decision {
	x := d.p.Decide(policy.Request{Listener: r.Conn.Listener, Remote: r.Conn.Remote, Source: r.Conn.Source, Header: r.Header.PeekAll})
	return l7.Decision{ClientIP: x.ClientIP, ClientSource: x.ClientSource, TrustedPeer: x.TrustedPeer, Status: x.Status, Drop: x.Drop}
}

var _ l7.Decider = decider{}
