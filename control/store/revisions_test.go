package store

import (
	"errors"
	"testing"
	"time"
)

// TestRevisionsRecordWhoAndWhat: every write records, in the head key of its own
// transaction, who made it and which objects it changed; Revisions reads them
// newest first and RevisionAt one of them.
func TestRevisionsRecordWhoAndWhat(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		if revs, err := s.Revisions(ctx, 0); err != nil || len(revs) != 0 {
			t.Fatalf("revisions of an empty store: %v %v", revs, err)
		}
		before := time.Now().Add(-time.Second)
		r1, err := s.Commit(ctx, ChangeSet{Who: "alice", Changes: []Change{
			{Kind: "pools", Name: "web", Value: []byte(`{"n":1}`), IfRevision: 0},
			{Kind: "routing", Name: "site", Value: []byte(`{"n":1}`), IfRevision: 0},
		}})
		if err != nil {
			t.Fatal(err)
		}
		// A write of another key (a node's status) is no revision of the store's.
		if _, err := s.Client().Put(ctx, "/tiergate/nodes/v1/x", "{}"); err != nil {
			t.Fatal(err)
		}
		r2, err := s.Commit(ctx, ChangeSet{Who: "bob", Changes: []Change{{Kind: "pools", Name: "web", Delete: true, IfRevision: r1}}})
		if err != nil {
			t.Fatal(err)
		}
		r3, err := s.Put(ctx, "pools", "api", []byte(`{"n":2}`), Any)
		if err != nil {
			t.Fatal(err)
		}
		revs, err := s.Revisions(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(revs) != 3 || revs[0].Revision != r3 || revs[1].Revision != r2 || revs[2].Revision != r1 {
			t.Fatalf("revisions %+v, want %d %d %d", revs, r3, r2, r1)
		}
		first := revs[2]
		if first.Who != "alice" || first.Time.Before(before) || len(first.Changes) != 2 ||
			first.Changes[0] != (RevisionChange{Op: OpPut, Kind: "pools", Name: "web"}) ||
			first.Changes[1] != (RevisionChange{Op: OpPut, Kind: "routing", Name: "site"}) {
			t.Fatalf("revision %d: %+v", r1, first)
		}
		if revs[1].Who != "bob" || len(revs[1].Changes) != 1 || revs[1].Changes[0].Op != OpDelete {
			t.Fatalf("revision %d: %+v", r2, revs[1])
		}
		if revs[0].Who != "" || revs[0].Changes[0].Name != "api" {
			t.Fatalf("revision %d: %+v", r3, revs[0])
		}
		if revs, err := s.Revisions(ctx, 2); err != nil || len(revs) != 2 || revs[1].Revision != r2 {
			t.Fatalf("limit 2: %+v %v", revs, err)
		}

		got, err := s.RevisionAt(ctx, r2)
		if err != nil || got.Who != "bob" || got.Revision != r2 {
			t.Fatalf("RevisionAt(%d): %+v %v", r2, got, err)
		}
		if _, err := s.RevisionAt(ctx, r1+1); !errors.Is(err, ErrNotFound) {
			t.Fatalf("RevisionAt of the status write: %v, want ErrNotFound", err)
		}
		if _, err := s.RevisionAt(ctx, r3+100); !errors.Is(err, ErrNotFound) {
			t.Fatalf("RevisionAt of a future revision: %v, want ErrNotFound", err)
		}
	})
}

// TestSnapshotAtAndDiff: SnapshotAt reads the objects as they were, Diff says
// what changed between two revisions, and a compacted revision is ErrCompacted.
func TestSnapshotAtAndDiff(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		r1, _ := s.Put(ctx, "pools", "web", []byte(`{"n":1}`), 0)
		r2, _ := s.Put(ctx, "pools", "api", []byte(`{"n":1}`), 0)
		r3, _ := s.Put(ctx, "pools", "web", []byte(`{"n":2}`), r1)
		r4, _ := s.Delete(ctx, "pools", "api", r2)
		at2, err := s.SnapshotAt(ctx, r2)
		if err != nil {
			t.Fatal(err)
		}
		if at2.Revision != r2 || at2.Len() != 2 {
			t.Fatalf("snapshot at %d: %d objects at %d", r2, at2.Len(), at2.Revision)
		}
		if o, _ := at2.Get("pools", "web"); string(o.Value) != `{"n":1}` {
			t.Fatalf("web at %d: %s", r2, o.Value)
		}
		at4, err := s.SnapshotAt(ctx, r4)
		if err != nil {
			t.Fatal(err)
		}
		d := Diff(at2, at4)
		if len(d) != 2 || d[0].Name != "api" || d[0].Op != OpDelete || d[0].After != nil || d[0].Before == nil ||
			d[1].Name != "web" || d[1].Op != OpPut || string(d[1].Before.Value) != `{"n":1}` || string(d[1].After.Value) != `{"n":2}` {
			t.Fatalf("diff %d..%d: %+v", r2, r4, d)
		}
		if d := Diff(at4, at4); len(d) != 0 {
			t.Fatalf("diff of a snapshot with itself: %+v", d)
		}
		if _, err := s.SnapshotAt(ctx, r4+100); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a future revision: %v", err)
		}
		if err := s.Compact(ctx, r3); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SnapshotAt(ctx, r2); !errors.Is(err, ErrCompacted) {
			t.Fatalf("a compacted revision: %v, want ErrCompacted", err)
		}
		if _, err := s.RevisionAt(ctx, r2); !errors.Is(err, ErrCompacted) {
			t.Fatalf("RevisionAt a compacted revision: %v, want ErrCompacted", err)
		}
		// The revisions left after compaction, the last of them r3.
		revs, err := s.Revisions(ctx, 0)
		if err != nil || len(revs) != 2 || revs[1].Revision != r3 {
			t.Fatalf("revisions after compaction: %+v %v", revs, err)
		}
	})
}

// TestRollbackSince: the changes back to an earlier revision make the objects
// equal to what they were; a change set with Since is refused when the store was
// written after it, and DryRun writes nothing.
func TestRollbackSince(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		r1, _ := s.Put(ctx, "pools", "web", []byte(`{"n":1}`), 0)
		s.Put(ctx, "pools", "api", []byte(`{"n":1}`), 0)
		at, _ := s.SnapshotAt(ctx, r1)
		s.Put(ctx, "pools", "web", []byte(`{"n":2}`), Any)
		s.Put(ctx, "pools", "new", []byte(`{"n":3}`), Any)
		head, err := s.Head(ctx)
		if err != nil {
			t.Fatal(err)
		}
		now, _ := s.Snapshot(ctx)
		changes := RollbackChanges(now, at)
		if len(changes) != 3 {
			t.Fatalf("changes %+v", changes)
		}
		plan, err := s.DryRun(ctx, ChangeSet{Changes: changes, Since: head})
		if err != nil {
			t.Fatal(err)
		}
		if d := Diff(plan.After, at); len(d) != 0 {
			t.Fatalf("the dry run's result differs from revision %d: %+v", r1, d)
		}
		if h, _ := s.Head(ctx); h != head {
			t.Fatalf("the dry run wrote: head %d, was %d", h, head)
		}

		// Another write after head: the rollback computed at head is refused.
		other, _ := s.Put(ctx, "pools", "other", []byte(`{"n":4}`), Any)
		_, err = s.Commit(ctx, ChangeSet{Changes: changes, Since: head, Who: "alice"})
		var ce *ConflictError
		if !errors.As(err, &ce) || ce.Since != head {
			t.Fatalf("a rollback after another write: %v, want a conflict since %d", err, head)
		}
		if _, err := s.DryRun(ctx, ChangeSet{Changes: changes, Since: head}); !errors.As(err, &ce) {
			t.Fatalf("dry run after another write: %v", err)
		}
		if h, _ := s.Head(ctx); h != other {
			t.Fatalf("head %d after the refused rollback, want %d", h, other)
		}

		now, _ = s.Snapshot(ctx)
		rev, err := s.Commit(ctx, ChangeSet{Changes: RollbackChanges(now, at), Since: other, Who: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		after, _ := s.SnapshotAt(ctx, rev)
		if d := Diff(after, at); len(d) != 0 {
			t.Fatalf("after the rollback the objects differ from revision %d: %+v", r1, d)
		}
	})
}
