package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Revision is one write of the Store, as the head key records it in the same
// transaction: who made it, when, and which objects it changed.
type Revision struct {
	// Revision is the store revision the write committed at.
	Revision int64 `json:"revision"`
	// Time is when the Store sent it (the writer's clock).
	Time time.Time `json:"time"`
	// Who is ChangeSet.Who: the name of the API token that made it; empty when
	// the writer did not say.
	Who string `json:"who"`
	// Changes are the objects it changed, in the change set's order.
	Changes []RevisionChange `json:"changes"`
}

// RevisionChange is one object a Revision changed.
type RevisionChange struct {
	// Op is "put" or "delete".
	Op   string `json:"op"`
	Kind string `json:"kind"`
	Name string `json:"name"`
}

// Ops of a RevisionChange and a Difference.
const (
	OpPut    = "put"
	OpDelete = "delete"
)

// DefaultRevisions and MaxRevisions bound Revisions' limit.
const (
	DefaultRevisions = 20
	MaxRevisions     = 1000
)

// record is the head key's value for cs (its Revision filled in when read).
func record(cs ChangeSet) Revision {
	r := Revision{Time: time.Now().UTC(), Who: cs.Who, Changes: make([]RevisionChange, len(cs.Changes))}
	for i, c := range cs.Changes {
		r.Changes[i] = RevisionChange{Op: OpPut, Kind: c.Kind, Name: c.Name}
		if c.Delete {
			r.Changes[i].Op = OpDelete
		}
	}
	return r
}

// parseRecord decodes a head key's value written at rev. A value the Store did
// not write as a record (empty, from an older Store) gives a Revision with only
// its revision.
func parseRecord(rev int64, value []byte) Revision {
	var r Revision
	if len(value) > 0 {
		_ = json.Unmarshal(value, &r) // best effort: the revision stands alone
	}
	r.Revision = rev
	if r.Changes == nil {
		r.Changes = []RevisionChange{}
	}
	return r
}

// Revisions returns the Store's writes, newest first, up to limit of them (0:
// DefaultRevisions; at most MaxRevisions), back to the oldest one compaction left.
// Each is read from the head key's history: writes that went round the Store
// (etcdctl) are not there.
func (s *Store) Revisions(ctx context.Context, limit int) ([]Revision, error) {
	if limit <= 0 {
		limit = DefaultRevisions
	}
	limit = min(limit, MaxRevisions)
	resp, err := s.cli.Get(ctx, headKey)
	if err != nil {
		return nil, fmt.Errorf("store: reading the revisions: %w", wrapErr(err))
	}
	out := []Revision{}
	if len(resp.Kvs) == 0 {
		return out, nil
	}
	kv := resp.Kvs[0]
	out = append(out, parseRecord(kv.ModRevision, kv.Value))
	for len(out) < limit && kv.Version > 1 {
		resp, err := s.cli.Get(ctx, headKey, clientv3.WithRev(kv.ModRevision-1))
		if errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("store: reading the revisions before %d: %w", kv.ModRevision, wrapErr(err))
		}
		if len(resp.Kvs) == 0 {
			break
		}
		kv = resp.Kvs[0]
		out = append(out, parseRecord(kv.ModRevision, kv.Value))
	}
	return out, nil
}

// RevisionAt returns the write that committed at rev: ErrNotFound when no write
// of the Store did (rev is another key's write, or in the future), ErrCompacted
// when compaction dropped it.
func (s *Store) RevisionAt(ctx context.Context, rev int64) (Revision, error) {
	if rev <= 0 {
		return Revision{}, fmt.Errorf("store: revision %d: want a revision above 0", rev)
	}
	resp, err := s.cli.Get(ctx, headKey, clientv3.WithRev(rev))
	if err != nil {
		if errors.Is(err, rpctypes.ErrFutureRev) {
			return Revision{}, fmt.Errorf("store: revision %d is not reached yet: %w", rev, ErrNotFound)
		}
		return Revision{}, fmt.Errorf("store: reading revision %d: %w", rev, wrapErr(err))
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].ModRevision != rev {
		return Revision{}, fmt.Errorf("store: revision %d is no write of the configuration: %w", rev, ErrNotFound)
	}
	return parseRecord(rev, resp.Kvs[0].Value), nil
}

// Head returns the revision of the Store's last write (the head key's mod
// revision), 0 before any: the revision of the configuration now. The store's
// own revision may be past it (writes of other keys: node status).
func (s *Store) Head(ctx context.Context) (int64, error) {
	resp, err := s.cli.Get(ctx, headKey)
	if err != nil {
		return 0, fmt.Errorf("store: reading the head: %w", wrapErr(err))
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return resp.Kvs[0].ModRevision, nil
}

// SnapshotAt returns every object as it was at revision rev: ErrCompacted when
// compaction dropped it, ErrNotFound when rev is not reached yet.
func (s *Store) SnapshotAt(ctx context.Context, rev int64) (*Snapshot, error) {
	if rev <= 0 {
		return nil, fmt.Errorf("store: revision %d: want a revision above 0", rev)
	}
	snap := &Snapshot{Revision: rev, objects: map[string]map[string]Object{}}
	if _, err := s.rangeAll(ctx, Prefix, rev, func(kv *mvccpb.KeyValue) {
		if k, n, ok := splitKey(string(kv.Key)); ok {
			snap.put(object(k, n, kv))
		}
	}); err != nil {
		if errors.Is(err, rpctypes.ErrFutureRev) {
			return nil, fmt.Errorf("store: revision %d is not reached yet: %w", rev, ErrNotFound)
		}
		return nil, fmt.Errorf("store: reading a snapshot at revision %d: %w", rev, err)
	}
	return snap, nil
}

// Difference is one object that differs between two snapshots.
type Difference struct {
	// Op is "put" (created or changed) or "delete".
	Op   string
	Kind string
	Name string
	// Before and After are the object in each snapshot; nil where it is absent.
	Before, After *Object
}

// Diff returns the objects whose value differs from one snapshot to the other,
// sorted by kind and name: in to and not in from or with another value, a put; in
// from and not in to, a delete. Values are compared as bytes (the Store keeps
// them as written).
func Diff(from, to *Snapshot) []Difference {
	var out []Difference
	seen := map[string]bool{}
	for _, b := range from.All() {
		seen[b.Kind+"/"+b.Name] = true
		a, ok := to.Get(b.Kind, b.Name)
		switch {
		case !ok:
			out = append(out, Difference{Op: OpDelete, Kind: b.Kind, Name: b.Name, Before: &b})
		case !bytes.Equal(a.Value, b.Value):
			out = append(out, Difference{Op: OpPut, Kind: b.Kind, Name: b.Name, Before: &b, After: &a})
		}
	}
	for _, a := range to.All() {
		if !seen[a.Kind+"/"+a.Name] {
			out = append(out, Difference{Op: OpPut, Kind: a.Kind, Name: a.Name, After: &a})
		}
	}
	slices.SortFunc(out, func(x, y Difference) int {
		if c := strings.Compare(x.Kind, y.Kind); c != 0 {
			return c
		}
		return strings.Compare(x.Name, y.Name)
	})
	return out
}

// RollbackChanges returns the changes that make the objects of now equal to those
// of at: a put of each object at has with another value (or that now lacks), a
// delete of each that at lacks, each expecting the object's revision in now.
// Empty when they are equal.
func RollbackChanges(now, at *Snapshot) []Change {
	var out []Change
	for _, d := range Diff(now, at) {
		c := Change{Kind: d.Kind, Name: d.Name}
		if d.Before != nil {
			c.IfRevision = d.Before.ModRevision
		}
		if d.Op == OpDelete {
			c.Delete = true
		} else {
			c.Value = d.After.Value
		}
		out = append(out, c)
	}
	return out
}
