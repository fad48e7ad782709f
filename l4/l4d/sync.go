package l4d

import (
	"context"
	"fmt"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/sessionsync"
)

// syncState is session sync with the cluster's other LDs, with a sync section.
type syncState struct {
	syncer *sessionsync.Syncer
	cancel context.CancelFunc
	done   chan error
}

// validateSync fills in the sync section's defaults and checks it, naming fields
// under "sync".
func (c *FileConfig) validateSync(ck *config.Checker) {
	if c.Sync == nil {
		return
	}
	c.Sync.Defaults()
	ck.Nest("sync", c.Sync.Validate())
}

// startSync turns sync on in the datapath (before it runs), binds the sync socket,
// registers the warm-up as an announce gate and runs the syncer until stopSync.
func (d *Daemon) startSync(ctx context.Context, dist *datapath.Distributor) error {
	cfg := d.file.Sync
	if cfg == nil {
		return nil
	}
	if err := dist.EnableSync(datapath.SyncOptions{After: cfg.SyncAfter.D()}); err != nil {
		return fmt.Errorf("session sync: %w", err)
	}
	s, err := sessionsync.New(*cfg, dist, sessionsync.Options{Registerer: d.Reg, Logger: d.Log, Stats: func() sessionsync.DatapathStats {
		st := dist.SyncStats()
		return sessionsync.DatapathStats{Emitted: st.Emitted, QueueDropped: st.QueueDropped, Installed: st.Installed,
			EncapMismatch: st.EncapMismatch, Refused: map[string]uint64{
				"no_rule": st.NoRule, "no_member": st.NoMember, "kept": st.Kept, "table_full": st.TableFull}}
	}})
	if err != nil {
		return err
	}
	d.AddAnnounceGate("warmup", s.Ready)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.sync = syncState{syncer: s, cancel: cancel, done: make(chan error, 1)}
	go func() { d.sync.done <- s.Run(sctx) }()
	d.Log.Info("session sync", "listen", s.Addr(), "peers", cfg.Peers, "sync_after", cfg.SyncAfter.D(),
		"full_sync_every", cfg.FullSyncEvery.D())
	return nil
}

// stopSync stops the syncer, if any, and waits for it.
func (d *Daemon) stopSync() {
	if d.sync.cancel == nil {
		return
	}
	d.sync.cancel()
	if err := <-d.sync.done; err != nil {
		d.Log.Error("session sync", "err", err)
	}
	d.sync.cancel = nil
}
