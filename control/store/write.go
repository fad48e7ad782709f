package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Change is one write of a change set: a put of Value, or a delete.
type Change struct {
	Kind, Name string
	// Value is the object's new JSON, for a put.
	Value json.RawMessage
	// Delete deletes the object instead.
	Delete bool
	// IfRevision is the revision the object must be at for the change set to
	// commit: Any; 0, the object must not exist (a create; not for a delete); or
	// the object's ModRevision (If-Match). A delete with Any still needs the object
	// to exist (ErrNotFound).
	IfRevision int64
}

// ChangeSet is writes committed together in one etcd transaction, or not at all.
type ChangeSet struct {
	// Changes are the writes, one per object, at most MaxChanges.
	Changes []Change

	// Check, when set, is given the snapshot the change set would result in (every
	// object at the revision read, the changes applied, their ModRevision 0) before
	// anything is written; an error refuses the change set with a *CheckError that
	// wraps it. The transaction is conditioned on nothing having changed since that
	// revision, so no change set commits a snapshot its check did not see: when
	// another writer commits first, the change set is read, checked and tried
	// again, up to 10 times, then refused with a *ConflictError. It must not keep
	// or change the snapshot.
	Check func(*Snapshot) error

	// Extra are puts of keys outside Prefix and the store's own keys (records kept
	// beside the objects, such as a certificate's versions, which neither Check nor
	// the nodes see), made in the same transaction as Changes. They have no
	// condition of their own: the Changes' expected revisions guard them. Default
	// none.
	Extra []ExtraPut

	// Who is who makes the change (a token's name), recorded with the change set in
	// the head key (Revisions). Default none.
	Who string

	// Since, above 0, commits only if nothing was written after that revision (no
	// object and no head key write since): otherwise a *ConflictError with Since
	// set, and nothing is written nor tried again. For a change set computed from
	// the state at Since as a whole (a rollback). Default 0: not required.
	Since int64
}

// ExtraPut is one put of a ChangeSet's Extra: an etcd key and its value.
type ExtraPut struct {
	Key   string
	Value []byte
}

// Put writes one object: value is its JSON, ifRevision its expected revision (Any,
// 0 to create, or its ModRevision). It returns the object's new ModRevision.
func (s *Store) Put(ctx context.Context, kind, name string, value []byte, ifRevision int64) (int64, error) {
	return s.Commit(ctx, ChangeSet{Changes: []Change{{Kind: kind, Name: name, Value: value, IfRevision: ifRevision}}})
}

// Delete deletes one object, which must exist and, unless ifRevision is Any, be
// at ifRevision. It returns the revision of the deletion.
func (s *Store) Delete(ctx context.Context, kind, name string, ifRevision int64) (int64, error) {
	return s.Commit(ctx, ChangeSet{Changes: []Change{{Kind: kind, Name: name, Delete: true, IfRevision: ifRevision}}})
}

// Commit writes every change of cs in one transaction, after cs.Check, and returns
// the revision it committed at (every object it wrote has it as ModRevision). The
// head key is written in the same transaction with who and what (a Revision).
// Nothing is written when it fails: a *ConflictError (ErrConflict) names the
// first object not at its expected revision, ErrNotFound a delete of a missing
// object, a *CheckError what the check refused.
func (s *Store) Commit(ctx context.Context, cs ChangeSet) (int64, error) {
	if err := validateChanges(cs.Changes); err != nil {
		return 0, err
	}
	if err := validateExtra(cs); err != nil {
		return 0, err
	}
	for try := 1; ; try++ {
		var cmps []clientv3.Cmp
		if cs.Check != nil {
			p, err := s.plan(ctx, cs)
			if err != nil {
				return 0, err
			}
			cmps = append(cmps,
				clientv3.Compare(clientv3.ModRevision(headKey), "=", p.headRev),
				// Also a put by a writer that goes round the Store (etcdctl).
				clientv3.Compare(clientv3.ModRevision(Prefix), "<", p.Before.Revision+1).WithPrefix(),
			)
		}
		var sinceCmps []clientv3.Cmp
		if cs.Since > 0 {
			sinceCmps = []clientv3.Cmp{
				clientv3.Compare(clientv3.ModRevision(headKey), "<", cs.Since+1),
				clientv3.Compare(clientv3.ModRevision(Prefix), "<", cs.Since+1).WithPrefix(),
			}
			cmps = append(cmps, sinceCmps...)
		}
		ops := make([]clientv3.Op, 0, len(cs.Changes)+1)
		for _, c := range cs.Changes {
			key := Key(c.Kind, c.Name)
			switch {
			case c.IfRevision == 0:
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
			case c.IfRevision > 0:
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", c.IfRevision))
			case c.Delete:
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), ">", 0))
			}
			if c.Delete {
				ops = append(ops, clientv3.OpDelete(key))
			} else {
				ops = append(ops, clientv3.OpPut(key, string(c.Value)))
			}
		}
		for _, e := range cs.Extra {
			ops = append(ops, clientv3.OpPut(e.Key, string(e.Value)))
		}
		head, err := json.Marshal(record(cs))
		if err != nil {
			return 0, fmt.Errorf("store: %s: the head record: %w", describe(cs.Changes), err)
		}
		ops = append(ops, clientv3.OpPut(headKey, string(head)))
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return 0, fmt.Errorf("store: %s: %w", describe(cs.Changes), wrapErr(err))
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		// Which condition failed: an object's own (final), the store having moved
		// past Since (final), or only the snapshot's (another writer came first:
		// check again).
		if err := s.explain(ctx, cs.Changes); err != nil {
			return 0, err
		}
		if cs.Since > 0 {
			r, err := s.cli.Txn(ctx).If(sinceCmps...).Commit()
			if err != nil {
				return 0, fmt.Errorf("store: %s: %w", describe(cs.Changes), wrapErr(err))
			}
			if !r.Succeeded {
				return 0, &ConflictError{Since: cs.Since}
			}
		}
		if try >= s.maxTries {
			return 0, &ConflictError{}
		}
	}
}

// Plan is what a change set would do, without it being written: the snapshot it
// is read against and the one it would result in (cs.Check passed).
type Plan struct {
	// Before is every object at the revision read; After is Before with the
	// changes applied (what they write has ModRevision 0).
	Before, After *Snapshot

	headRev int64 // the head key's mod revision at Before
}

// DryRun checks cs as Commit would (its expected revisions, then cs.Check on the
// snapshot it makes) and returns what it would do, writing nothing. The errors
// are Commit's, but for a conflict with a later writer, which a dry run cannot
// have.
func (s *Store) DryRun(ctx context.Context, cs ChangeSet) (*Plan, error) {
	if err := validateChanges(cs.Changes); err != nil {
		return nil, err
	}
	if err := validateExtra(cs); err != nil {
		return nil, err
	}
	p, err := s.plan(ctx, cs)
	if err != nil {
		return nil, err
	}
	if cs.Since > 0 && p.headRev > cs.Since {
		return nil, &ConflictError{Since: cs.Since}
	}
	return p, nil
}

// plan reads the state, applies cs's changes to it after their preconditions and
// runs cs.Check (when set) on the result.
func (s *Store) plan(ctx context.Context, cs ChangeSet) (*Plan, error) {
	snap, headRev, err := s.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	next := snap.clone()
	for _, c := range cs.Changes {
		cur, ok := snap.Get(c.Kind, c.Name)
		if err := precondition(c, cur, ok); err != nil {
			return nil, err
		}
		if c.Delete {
			next.remove(c.Kind, c.Name)
			continue
		}
		next.put(Object{Kind: c.Kind, Name: c.Name, Value: c.Value, CreateRevision: cur.CreateRevision, Version: cur.Version + 1})
	}
	if cs.Check != nil {
		if err := cs.Check(next); err != nil {
			return nil, &CheckError{Revision: snap.Revision, Err: err}
		}
	}
	return &Plan{Before: snap, After: next, headRev: headRev}, nil
}

// explain reads the objects of changes at one revision and returns the error of the
// first whose expected revision does not hold, or nil.
func (s *Store) explain(ctx context.Context, changes []Change) error {
	ops := make([]clientv3.Op, len(changes))
	for i, c := range changes {
		ops[i] = clientv3.OpGet(Key(c.Kind, c.Name))
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("store: reading back %s: %w", describe(changes), wrapErr(err))
	}
	for i, c := range changes {
		var cur Object
		kvs := resp.Responses[i].GetResponseRange().GetKvs()
		if len(kvs) > 0 {
			cur = object(c.Kind, c.Name, kvs[0])
		}
		if err := precondition(c, cur, len(kvs) > 0); err != nil {
			return err
		}
	}
	return nil
}

// precondition returns the error of c against the object as it is (cur, when
// exists).
func precondition(c Change, cur Object, exists bool) error {
	var actual int64
	if exists {
		actual = cur.ModRevision
	}
	switch {
	case c.IfRevision == Any && c.Delete && !exists:
		return fmt.Errorf("store: deleting %s/%s: %w", c.Kind, c.Name, ErrNotFound)
	case c.IfRevision == Any:
		return nil
	case c.IfRevision != actual:
		return &ConflictError{Kind: c.Kind, Name: c.Name, Expected: c.IfRevision, Actual: actual}
	}
	return nil
}

// validateChanges checks a change set before anything is read.
func validateChanges(changes []Change) error {
	if len(changes) == 0 {
		return errors.New("store: empty change set")
	}
	if len(changes) > MaxChanges {
		return fmt.Errorf("store: change set of %d changes is over %d: %w", len(changes), MaxChanges, ErrTooLarge)
	}
	seen := make(map[string]bool, len(changes))
	size := 0
	for i, c := range changes {
		if err := checkKey(c.Kind, c.Name); err != nil {
			return fmt.Errorf("store: change %d: %w", i, err)
		}
		key := Key(c.Kind, c.Name)
		if seen[key] {
			return fmt.Errorf("store: change %d: %s/%s is changed twice", i, c.Kind, c.Name)
		}
		seen[key] = true
		switch {
		case c.IfRevision < Any:
			return fmt.Errorf("store: change %d (%s/%s): expected revision %d: want Any (-1), 0 or a revision", i, c.Kind, c.Name, c.IfRevision)
		case c.Delete && c.Value != nil:
			return fmt.Errorf("store: change %d (%s/%s): a delete with a value", i, c.Kind, c.Name)
		case c.Delete && c.IfRevision == 0:
			return fmt.Errorf("store: change %d (%s/%s): a delete of an object that must not exist", i, c.Kind, c.Name)
		case !c.Delete:
			if err := checkValue(c.Kind, c.Name, c.Value); err != nil {
				return err
			}
		}
		size += len(key) + len(c.Value)
	}
	if size > MaxChangeSetBytes {
		return fmt.Errorf("store: change set of %d bytes is over %d: %w", size, MaxChangeSetBytes, ErrTooLarge)
	}
	return nil
}

// describe names a change set in errors.
func describe(changes []Change) string {
	if len(changes) == 1 {
		verb := "writing"
		if changes[0].Delete {
			verb = "deleting"
		}
		return verb + " " + changes[0].Kind + "/" + changes[0].Name
	}
	return fmt.Sprintf("a change set of %d changes", len(changes))
}

// validateExtra checks a change set's Extra puts: keys outside Prefix and the
// store's own, within the limits of a change set with its Changes.
func validateExtra(cs ChangeSet) error {
	if len(cs.Changes)+len(cs.Extra) > MaxChanges {
		return fmt.Errorf("store: change set of %d changes and %d extra puts is over %d: %w", len(cs.Changes), len(cs.Extra), MaxChanges, ErrTooLarge)
	}
	size := 0
	for _, c := range cs.Changes {
		size += len(Key(c.Kind, c.Name)) + len(c.Value)
	}
	for i, e := range cs.Extra {
		if e.Key == "" || strings.HasPrefix(e.Key, Prefix) || strings.HasPrefix(e.Key, "/tiergate/meta/") {
			return fmt.Errorf("store: extra put %d: key %q: want a key outside %s and the store's own", i, e.Key, Prefix)
		}
		size += len(e.Key) + len(e.Value)
	}
	if size > MaxChangeSetBytes {
		return fmt.Errorf("store: change set of %d bytes is over %d: %w", size, MaxChangeSetBytes, ErrTooLarge)
	}
	return nil
}
