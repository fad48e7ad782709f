package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Event is one object's change.
type Event struct {
	// Object is the object as the change left it; for a delete, its Value is nil
	// and its ModRevision the revision of the deletion.
	Object
	// Deleted is set for a delete.
	Deleted bool
}

// Batch is what one revision changed (the writes of one change set) or, after the
// revisions a watch needed were compacted, the whole state.
type Batch struct {
	// Revision is the revision of the batch: once it is handled, the consumer has
	// seen every change up to it.
	Revision int64
	// Events are the changes at Revision, in the order they were written.
	Events []Event
	// Reset, when set, is every object at Revision, replacing whatever the consumer
	// held (Events is then empty): the watch had fallen behind compaction and could
	// not say what changed in between.
	Reset *Snapshot
}

// Bounds of the wait before watching again after etcd ended a watch (the leader
// lost, the connection broken) without progress in between.
const (
	watchRetryMin = 50 * time.Millisecond
	watchRetryMax = 2 * time.Second
)

// Watch calls fn with every change to the objects after revision after, in order,
// one Batch per revision, until ctx is done (it then returns ctx's error), fn
// returns an error (which it returns) or the Store is closed (ErrClosed). A consumer that read a Snapshot at R
// watches from R.
//
// It never misses a change: its etcd watch requires a leader
// (clientv3.WithRequireLeader), so a member cut off from its cluster ends it
// rather than going quiet, and every watch that ends is started again from the
// revision after the last one delivered; when etcd has compacted that revision,
// fn is given the whole state at the current revision (Batch.Reset) and the watch
// goes on from there. fn runs on Watch's goroutine: while it runs, changes wait
// (in the etcd client's buffer).
func (s *Store) Watch(ctx context.Context, after int64, fn func(Batch) error) error {
	next := after + 1
	wait := time.Duration(0)
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if s.cli.Ctx().Err() != nil {
			return ErrClosed
		}
		start := next
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		if s.watchStarted != nil {
			s.watchStarted(cancel)
		}
		ch := s.cli.Watch(wctx, Prefix, clientv3.WithPrefix(), clientv3.WithRev(next))
		compacted, err := s.consume(wctx, ch, &next, fn)
		cancel()
		switch {
		case err != nil:
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		case compacted:
			snap, err := s.Snapshot(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s.log.Warn("store watch: re-reading the state after compaction", "err", err)
				break
			}
			s.log.Debug("store watch: revisions compacted, the state read again", "from", next, "revision", snap.Revision)
			if err := fn(Batch{Revision: snap.Revision, Reset: snap}); err != nil {
				return err
			}
			next = snap.Revision + 1
			wait = 0
			continue
		}
		// The watch ended: start again at once if it had made progress, else
		// after a wait that doubles up to watchRetryMax.
		if next > start {
			wait = 0
		} else {
			wait = min(max(2*wait, watchRetryMin), watchRetryMax)
		}
		if wait == 0 {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// consume delivers the batches of one etcd watch until it ends: compacted is set
// when it ended because revision *next was compacted; err is fn's error. Once wctx
// is done, what the watch still holds is left: the next watch reads it again.
func (s *Store) consume(wctx context.Context, ch clientv3.WatchChan, next *int64, fn func(Batch) error) (compacted bool, err error) {
	for resp := range ch {
		if wctx.Err() != nil {
			return false, nil
		}
		if resp.CompactRevision != 0 {
			return true, nil
		}
		if err := resp.Err(); err != nil {
			s.log.Warn("store watch ended; watching again", "from", *next, "err", err)
			return false, nil
		}
		evs := resp.Events
		for len(evs) > 0 {
			rev := evs[0].Kv.ModRevision
			n := 1
			for n < len(evs) && evs[n].Kv.ModRevision == rev {
				n++
			}
			b := Batch{Revision: rev, Events: make([]Event, 0, n)}
			for _, ev := range evs[:n] {
				kind, name, ok := splitKey(string(ev.Kv.Key))
				if !ok {
					s.log.Debug("store watch: a key that names no object", "key", string(ev.Kv.Key), "revision", rev)
					continue
				}
				e := Event{Object: object(kind, name, ev.Kv), Deleted: ev.Type == mvccpb.DELETE}
				if e.Deleted {
					e.Value = nil
				}
				b.Events = append(b.Events, e)
			}
			evs = evs[n:]
			if wctx.Err() != nil {
				return false, nil
			}
			if rev < *next {
				return false, fmt.Errorf("store watch: revision %d after %d: %w", rev, *next-1, errOutOfOrder)
			}
			if err := fn(b); err != nil {
				return false, err
			}
			*next = rev + 1
		}
	}
	return false, nil
}

// errOutOfOrder is a watch that went back in revisions, which etcd never does.
var errOutOfOrder = errors.New("revisions out of order")
