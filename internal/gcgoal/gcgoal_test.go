package gcgoal

import (
	"context"
	"errors"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestNewConfig(t *testing.T) {
	load := func() int64 { return 0 }
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"no load", Config{}},
		{"interval", Config{Load: load, Interval: time.Microsecond}},
		{"drop", Config{Load: load, Drop: 1}},
		{"min load", Config{Load: load, MinLoad: -1}},
		{"min gap", Config{Load: load, MinGap: -time.Second}},
	} {
		if _, err := New(c.cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", c.name, err)
		}
	}
	g, err := New(Config{Load: load})
	if err != nil {
		t.Fatal(err)
	}
	c := g.cfg
	if c.Interval != DefaultInterval || c.Drop != DefaultDrop || c.MinLoad != DefaultMinLoad || c.MinSlack != DefaultMinSlack || c.MinGap != DefaultMinGap {
		t.Errorf("defaults: interval %v, drop %d, min load %d, min slack %d, min gap %v", c.Interval, c.Drop, c.MinLoad, c.MinSlack, c.MinGap)
	}
}

const mib = 1 << 20

// TestNext walks the decision through readings: a collection is started only when
// the load has fallen to a quarter of the load as of the last collection, the goal
// is far above the heap, collection is on, and the last one started is a second
// old.
func TestNext(t *testing.T) {
	g, err := New(Config{Load: func() int64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1e9, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	steps := []struct {
		what string
		r    Reading
		want bool
	}{
		{"first reading, idle", Reading{Load: 0, Cycles: 1, Goal: 16 * mib, Heap: 2 * mib, GOGC: 400, At: at(0)}, false},
		{"a burst, no collection yet", Reading{Load: 2000, Cycles: 1, Goal: 16 * mib, Heap: 15 * mib, GOGC: 400, At: at(100)}, false},
		{"collected during the burst", Reading{Load: 1900, Cycles: 3, Goal: 600 * mib, Heap: 130 * mib, GOGC: 400, At: at(200)}, false},
		{"the burst winds down, load still a third", Reading{Load: 700, Cycles: 3, Goal: 600 * mib, Heap: 140 * mib, GOGC: 400, At: at(300)}, false},
		{"load at a quarter, goal far above", Reading{Load: 475, Cycles: 3, Goal: 600 * mib, Heap: 140 * mib, GOGC: 400, At: at(400)}, true},
	}
	for _, s := range steps {
		if got := g.Next(s.r); got != s.want {
			t.Fatalf("%s: Next %v, want %v", s.what, got, s.want)
		}
	}
	// The caller collected: the load as of that collection is the present one.
	g.Collected(Reading{Load: 475, Cycles: 5, Goal: 80 * mib, Heap: 10 * mib, GOGC: 400, At: at(450)})
	more := []struct {
		what string
		r    Reading
		want bool
	}{
		{"load falls from the forced collection's, within the gap", Reading{Load: 10, Cycles: 5, Goal: 80 * mib, Heap: 12 * mib, GOGC: 400, At: at(500)}, false},
		{"after the gap", Reading{Load: 10, Cycles: 5, Goal: 80 * mib, Heap: 12 * mib, GOGC: 400, At: at(1500)}, true},
	}
	for _, s := range more {
		if got := g.Next(s.r); got != s.want {
			t.Fatalf("%s: Next %v, want %v", s.what, got, s.want)
		}
	}
	g.Collected(Reading{Load: 10, Cycles: 7, Goal: 16 * mib, Heap: 3 * mib, GOGC: 400, At: at(1550)})
	rest := []struct {
		what string
		r    Reading
		want bool
	}{
		{"load 10 as of the last collection: under MinLoad", Reading{Load: 0, Cycles: 7, Goal: 16 * mib, Heap: 3 * mib, GOGC: 400, At: at(3000)}, false},
		// A collection ends between a reading at 1000 and one at 0: the heap it
		// found live may be the thousand's.
		{"load rises", Reading{Load: 1000, Cycles: 7, Goal: 16 * mib, Heap: 15 * mib, GOGC: 400, At: at(3100)}, false},
		{"collected between the readings, load gone", Reading{Load: 0, Cycles: 8, Goal: 300 * mib, Heap: 70 * mib, GOGC: 400, At: at(3200)}, true},
		// A collection that ends at low load sets the goal itself.
		{"load rises again", Reading{Load: 1000, Cycles: 9, Goal: 300 * mib, Heap: 80 * mib, GOGC: 400, At: at(4300)}, false},
		{"load falls, goal near", Reading{Load: 10, Cycles: 9, Goal: 300 * mib, Heap: 290 * mib, GOGC: 400, At: at(4350)}, false},
		{"collected at low load", Reading{Load: 5, Cycles: 10, Goal: 20 * mib, Heap: 4 * mib, GOGC: 400, At: at(4400)}, false},
		{"collected at low load, next reading", Reading{Load: 0, Cycles: 10, Goal: 20 * mib, Heap: 5 * mib, GOGC: 400, At: at(4500)}, false},
		// Little slack: the next collection comes soon anyway.
		{"load rises, slack small", Reading{Load: 1000, Cycles: 11, Goal: 100 * mib, Heap: 90 * mib, GOGC: 400, At: at(5600)}, false},
		{"load gone, slack 10 MiB", Reading{Load: 0, Cycles: 11, Goal: 100 * mib, Heap: 90 * mib, GOGC: 400, At: at(5700)}, false},
		{"heap over the goal", Reading{Load: 0, Cycles: 11, Goal: 100 * mib, Heap: 110 * mib, GOGC: 400, At: at(5800)}, false},
		{"slack 16 MiB", Reading{Load: 0, Cycles: 11, Goal: 100 * mib, Heap: 84 * mib, GOGC: 400, At: at(5900)}, true},
		// Collection turned off (GOGC=off): not the Governor's to start.
		{"load rises, GOGC off", Reading{Load: 1000, Cycles: 12, Goal: 1 << 60, Heap: 90 * mib, GOGC: -1, At: at(7000)}, false},
		{"load gone, GOGC off", Reading{Load: 0, Cycles: 12, Goal: 1 << 60, Heap: 90 * mib, GOGC: -1, At: at(8000)}, false},
	}
	for _, s := range rest {
		if got := g.Next(s.r); got != s.want {
			t.Fatalf("%s: Next %v, want %v", s.what, got, s.want)
		}
	}
}

// held keeps the test's "connections" live: what a heap goal is set on.
var held [][]byte

// TestRunFollowsTheLoad runs a Governor on the runtime: a load of 1,000 holds
// 64 MiB live, and 64 MiB more of buffers sits in a sync.Pool as a server's pools
// do; a collection sets the goal on all of it at GOGC 400. When the load falls to
// zero the Governor collects, and the goal follows: the buffers in the pool do not
// survive in its victim cache to hold it up.
func TestRunFollowsTheLoad(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	var load atomic.Int64
	var pool sync.Pool
	load.Store(1000)
	for range 64 {
		held = append(held, make([]byte, mib))
	}
	bufs := make([]*[]byte, 0, 64)
	for range 64 {
		b := make([]byte, mib)
		bufs = append(bufs, &b)
	}
	for _, b := range bufs {
		pool.Put(b)
	}
	bufs = nil
	runtime.GC()
	// That collection moved the pool's buffers to its victim cache, which the next
	// one empties; put them back where a server's pools hold what its load left.
	for {
		b, _ := pool.Get().(*[]byte)
		if b == nil {
			break
		}
		bufs = append(bufs, b)
	}
	if len(bufs) < 32 {
		t.Fatalf("%d buffers back from the pool, want most of 64", len(bufs))
	}
	for _, b := range bufs {
		pool.Put(b)
	}
	bufs = nil
	reg := prometheus.NewRegistry()
	g, err := New(Config{Load: load.Load, Interval: 5 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	before := g.read()
	if before.Goal < 400*mib {
		t.Fatalf("goal %d MiB with 128 MiB held at GOGC 400; want 400 MiB and more", before.Goal/mib)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// Held load: no collection.
	time.Sleep(100 * time.Millisecond)
	if n := testutil.ToFloat64(g.forced); n != 0 {
		t.Fatalf("%v collections started at a steady load", n)
	}
	held = nil
	load.Store(0)
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(g.forced) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no collection started after the load fell")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	after := g.read()
	if after.Goal > 64*mib {
		t.Errorf("goal %d MiB after the load fell (%d MiB before); want it set on what is still live, under 64 MiB", after.Goal/mib, before.Goal/mib)
	}
	if n := testutil.ToFloat64(g.forced); n != 1 {
		t.Errorf("%v collections started for one fall of the load, want 1", n)
	}
	runtime.KeepAlive(&pool)
}
