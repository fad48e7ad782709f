package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// watcher runs Watch from after in the background, its batches sent on the
// returned channel; the watch stops at the end of the test.
func watcher(t *testing.T, s *Store, after int64) <-chan Batch {
	t.Helper()
	wctx, cancel := context.WithCancel(context.Background())
	batches := make(chan Batch, 100)
	done := make(chan error, 1)
	go func() {
		done <- s.Watch(wctx, after, func(b Batch) error {
			batches <- b
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := waitFor(t, done, "end of the watch"); !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	})
	return batches
}

// describeBatch writes a batch as "rev: +kind/name=value -kind/name".
func describeBatch(b Batch) string {
	var parts []string
	for _, e := range b.Events {
		if e.Deleted {
			parts = append(parts, "-"+e.Kind+"/"+e.Name)
		} else {
			parts = append(parts, "+"+e.Kind+"/"+e.Name+"="+string(e.Value))
		}
	}
	return fmt.Sprintf("%d: %s", b.Revision, strings.Join(parts, " "))
}

func TestWatchOrder(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		if _, err := s.Put(ctx, "pools", "old", []byte(`0`), 0); err != nil {
			t.Fatal(err)
		}
		snap, err := s.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		batches := watcher(t, s, snap.Revision)
		var want []string
		r1, err := s.Put(ctx, "pools", "a", []byte(`1`), 0)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%d: +pools/a=1", r1))
		r2, err := s.Commit(ctx, ChangeSet{Changes: []Change{
			{Kind: "routes", Name: "x", Value: []byte(`2`), IfRevision: 0},
			{Kind: "pools", Name: "b", Value: []byte(`3`), IfRevision: 0},
			{Kind: "pools", Name: "old", Delete: true, IfRevision: Any},
		}})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%d: +routes/x=2 +pools/b=3 -pools/old", r2))
		r3, err := s.Delete(ctx, "pools", "a", r1)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%d: -pools/a", r3))
		for i, w := range want {
			b := waitFor(t, batches, "batch")
			if b.Reset != nil {
				t.Fatalf("batch %d is a reset at %d", i, b.Revision)
			}
			if got := describeBatch(b); got != w {
				t.Errorf("batch %d: %s, want %s", i, got, w)
			}
		}
		select {
		case b := <-batches:
			t.Errorf("an extra batch: %s", describeBatch(b))
		default:
		}
	})
}

func TestWatchFromCompactedRevision(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		r0, err := s.Put(ctx, "pools", "a", []byte(`1`), 0)
		if err != nil {
			t.Fatal(err)
		}
		r1, _ := s.Put(ctx, "pools", "a", []byte(`2`), r0)
		r2, _ := s.Put(ctx, "pools", "b", []byte(`3`), 0)
		if err := s.Compact(ctx, r2); err != nil {
			t.Fatal(err)
		}
		// A consumer that last saw r0 (say, a node back from its copy on disk) asks
		// for r0+1, which is gone: it gets the whole state, then what follows.
		batches := watcher(t, s, r0)
		b := waitFor(t, batches, "reset")
		if b.Reset == nil || b.Revision < r2 || len(b.Events) != 0 {
			t.Fatalf("first batch: %s (reset %v), want a reset at %d or later", describeBatch(b), b.Reset != nil, r2)
		}
		if a, _ := b.Reset.Get("pools", "a"); a.ModRevision != r1 || string(a.Value) != "2" || b.Reset.Len() != 2 {
			t.Fatalf("reset: %+v", b.Reset.All())
		}
		r3, err := s.Put(ctx, "pools", "c", []byte(`4`), 0)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := describeBatch(waitFor(t, batches, "batch after the reset")), fmt.Sprintf("%d: +pools/c=4", r3); got != want {
			t.Fatalf("after the reset: %s, want %s", got, want)
		}
	})
}

// TestWatchCompactedMidway: a watch that ends mid-way (as when its member loses the
// leader) starts again from the revision after the last one delivered; when that
// was compacted in between, the consumer gets the state and misses nothing.
func TestWatchCompactedMidway(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		cancels := make(chan context.CancelFunc, 10)
		s.watchStarted = func(cancel context.CancelFunc) { cancels <- cancel }
		start := revision(t, s)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		batches := make(chan Batch)
		release := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			first := true
			done <- s.Watch(wctx, start, func(b Batch) error {
				batches <- b
				if first {
					first = false
					<-release // the consumer is busy while the store moves on
				}
				return nil
			})
		}()
		r1, err := s.Put(ctx, "pools", "a", []byte(`1`), 0)
		if err != nil {
			t.Fatal(err)
		}
		if b := waitFor(t, batches, "first batch"); b.Revision != r1 {
			t.Fatalf("first batch at %d, want %d", b.Revision, r1)
		}
		// While the consumer handles r1: writes, a compaction past them, and the
		// watch's stream ends.
		r2, _ := s.Put(ctx, "pools", "b", []byte(`2`), 0)
		r3, _ := s.Delete(ctx, "pools", "a", r1)
		if err := s.Compact(ctx, r3); err != nil {
			t.Fatal(err)
		}
		waitFor(t, cancels, "the watch's start")()
		close(release)
		b := waitFor(t, batches, "batch after the stream ended")
		if b.Reset == nil {
			t.Fatalf("after the compaction: %s, want a reset", describeBatch(b))
		}
		if _, ok := b.Reset.Get("pools", "a"); ok || b.Reset.Len() != 1 || b.Revision < r3 {
			t.Fatalf("reset at %d: %+v (want pools/b only, at %d or later)", b.Revision, b.Reset.All(), r3)
		}
		if o, _ := b.Reset.Get("pools", "b"); o.ModRevision != r2 {
			t.Fatalf("reset's pools/b: %+v", o)
		}
		r4, _ := s.Put(ctx, "pools", "c", []byte(`3`), 0)
		if got, want := describeBatch(waitFor(t, batches, "batch after the reset")), fmt.Sprintf("%d: +pools/c=3", r4); got != want {
			t.Fatalf("after the reset: %s, want %s", got, want)
		}
		stop()
		if err := waitFor(t, done, "end of the watch"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Watch returned %v", err)
		}
	})
}

// TestWatchConsumerError: an error from the consumer ends the watch with it.
func TestWatchConsumerError(t *testing.T) {
	s := openEmbedded(t)
	start := revision(t, s)
	boom := errors.New("boom")
	done := make(chan error, 1)
	go func() { done <- s.Watch(ctx, start, func(Batch) error { return boom }) }()
	if _, err := s.Put(ctx, "pools", "a", []byte(`1`), 0); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(t, done, "end of the watch"); !errors.Is(err, boom) {
		t.Fatalf("Watch returned %v", err)
	}
}

// TestWatchEndsOnClose: closing the Store ends its watches with ErrClosed.
func TestWatchEndsOnClose(t *testing.T) {
	s := openEmbedded(t)
	done := make(chan error, 1)
	started := make(chan context.CancelFunc, 1)
	s.watchStarted = func(cancel context.CancelFunc) {
		select {
		case started <- cancel:
		default:
		}
	}
	rev := revision(t, s)
	go func() { done <- s.Watch(ctx, rev, func(Batch) error { return nil }) }()
	waitFor(t, started, "the watch's start")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(t, done, "end of the watch"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Watch returned %v, want ErrClosed", err)
	}
}
