package controld

import (
	"context"
	"fmt"

	"github.com/tiergate/tiergate/control/blsync"
	"github.com/tiergate/tiergate/control/crowdsec"
	"github.com/tiergate/tiergate/control/store"
)

// startCrowdSec starts the bouncer of the crowdsec section, writing its list to
// st, and returns the function that stops it and waits for it.
func (d *Daemon) startCrowdSec(ctx context.Context, st *store.Store) (stop func(), err error) {
	w := blsync.NewWriter(st, blsync.WriterConfig{Logger: d.Log})
	b, err := crowdsec.New(*d.Config.CrowdSec, w, d.Log)
	if err != nil {
		return nil, fmt.Errorf("crowdsec: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Run(ctx)
	}()
	d.crowdsec = b
	d.Log.Info("crowdsec: pulling decisions", "lapi", d.Config.CrowdSec.LAPIURL, "list", b.List(), "every", d.Config.CrowdSec.PollInterval.String())
	return func() {
		cancel()
		<-done
		w.Wait()
	}, nil
}

// CrowdSec returns the bouncer of the crowdsec section once Serving is closed;
// nil without one.
func (d *Daemon) CrowdSec() *crowdsec.Bouncer { return d.crowdsec }
