package blacklist

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeClock is a settable clock for Options.Now.
type fakeClock struct{ ns atomic.Int64 }

func newClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func TestListExpiry(t *testing.T) {
	clock := newClock(t0)
	l := NewList("www", Options{Now: clock.Now})
	if err := l.Load(strings.NewReader("203.0.113.7 ttl=10s\n198.51.100.0/24 ttl=1m\n2001:db8::1 ttl=10s\n192.0.2.1\n")); err != nil {
		t.Fatal(err)
	}
	check := func(when string, want map[string]bool) {
		t.Helper()
		for a, w := range want {
			if got := l.Contains(addr(a)); got != w {
				t.Errorf("%s: %s contained %v, want %v", when, a, got, w)
			}
		}
	}
	check("at once", map[string]bool{"203.0.113.7": true, "198.51.100.9": true, "2001:db8::1": true, "192.0.2.1": true})
	clock.Advance(9 * time.Second)
	check("after 9s", map[string]bool{"203.0.113.7": true, "2001:db8::1": true})
	clock.Advance(time.Second)
	check("after 10s", map[string]bool{"203.0.113.7": false, "2001:db8::1": false, "198.51.100.9": true, "192.0.2.1": true})
	if l.Snapshot().Stats().Expiring != 3 {
		t.Error("expired entries dropped before a build")
	}
	clock.Advance(time.Minute)
	check("after 70s", map[string]bool{"198.51.100.9": false, "192.0.2.1": true})
	// The next build drops what expired.
	if err := l.LoadDelta(strings.NewReader("+192.0.2.2 ttl=1h\n")); err != nil {
		t.Fatal(err)
	}
	if st := l.Snapshot().Stats(); st.Expiring != 1 || l.Len() != 2 {
		t.Errorf("after a delta: %+v, len %d; want only 192.0.2.1 and the new 192.0.2.2", st, l.Len())
	}
	check("after the delta", map[string]bool{"192.0.2.2": true})
	clock.Advance(time.Hour)
	check("an hour later", map[string]bool{"192.0.2.2": false, "192.0.2.1": true})
}

func TestListUpdates(t *testing.T) {
	l := NewList("www", Options{})
	if l.Len() != 0 || l.Contains(addr("10.0.0.1")) {
		t.Fatal("a new list is not empty")
	}
	l.Replace(buildAt(time.Now(), entrySpec{p: "10.0.0.0/8"}, entrySpec{p: "2001:db8::/32"}))
	if err := l.Apply(&Delta{Remove: []netip.Prefix{pfx("10.1.0.0/16")}, Add: []Entry{{Prefix: pfx("192.0.2.1")}}}); err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{"10.0.0.1": true, "10.1.0.1": false, "192.0.2.1": true, "2001:db8::1": true} {
		if l.Contains(addr(a)) != want {
			t.Errorf("%s: want %v", a, want)
		}
	}
	before := l.Snapshot()
	if err := l.Apply(&Delta{Add: []Entry{{Prefix: netip.Prefix{}}}}); !errors.Is(err, ErrInvalidPrefix) {
		t.Errorf("Apply(invalid) = %v", err)
	}
	if err := l.LoadDelta(strings.NewReader("+10.0.0.1\nbad\n")); err == nil {
		t.Error("a bad delta was applied")
	}
	if err := l.Load(strings.NewReader("\x89TGBL\r\n\x1a\x00\x01\x00\x00garbage")); err == nil {
		t.Error("a corrupt binary upload was loaded")
	}
	if l.Snapshot() != before {
		t.Error("a rejected update changed the list")
	}
	l.Replace(nil)
	if l.Len() != 0 {
		t.Error("Replace(nil) did not empty the list")
	}

	var nilList *List
	if nilList.Contains(addr("10.0.0.1")) || nilList.Len() != 0 || nilList.Hits(SourcePacket) != 0 {
		t.Error("a nil list is not empty")
	}
	nilList.Hit(SourcePacket)
}

func TestListMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ls := NewLists(Options{Registerer: reg})
	www := ls.Listener("www")
	if ls.Global().MetricsError() != nil || www.MetricsError() != nil {
		t.Fatal(ls.Global().MetricsError(), www.MetricsError())
	}
	ls.Global().Replace(buildAt(time.Now(), entrySpec{p: "203.0.113.0/24"}))
	www.Load(strings.NewReader("198.51.100.7\n"))
	www.Load(strings.NewReader("bad\n"))

	for _, c := range []struct {
		a, source, list string
	}{
		{"203.0.113.1", SourcePacket, "global"},
		{"203.0.113.2", SourceHeader, "global"},
		{"198.51.100.7", SourceHeader, "www"},
		{"198.51.100.7", SourceHeader, "www"},
		{"192.0.2.1", SourcePacket, ""},
	} {
		name, blocked := ls.Check("www", addr(c.a), c.source)
		if name != c.list || blocked != (c.list != "") {
			t.Errorf("Check(%s) = %q, %v; want %q", c.a, name, blocked, c.list)
		}
	}
	www.Hit("quic")
	want := `
# HELP tiergate_blacklist_hits_total Blacklisted addresses seen, by list (its name: global, a listener's, or a list from the store) and where the address came from (packet or header).
# TYPE tiergate_blacklist_hits_total counter
tiergate_blacklist_hits_total{list="global",source="header"} 1
tiergate_blacklist_hits_total{list="global",source="packet"} 1
tiergate_blacklist_hits_total{list="www",source="header"} 2
tiergate_blacklist_hits_total{list="www",source="packet"} 0
tiergate_blacklist_hits_total{list="www",source="quic"} 1
# HELP tiergate_blacklist_entries Entries in force (single addresses and merged ranges), by list.
# TYPE tiergate_blacklist_entries gauge
tiergate_blacklist_entries{list="global"} 1
tiergate_blacklist_entries{list="www"} 1
# HELP tiergate_blacklist_updates_total Updates, by list, kind (replace or delta) and result (ok or rejected: the list in force was kept).
# TYPE tiergate_blacklist_updates_total counter
tiergate_blacklist_updates_total{kind="replace",list="global",result="ok"} 1
tiergate_blacklist_updates_total{kind="replace",list="www",result="ok"} 1
tiergate_blacklist_updates_total{kind="replace",list="www",result="rejected"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tiergate_blacklist_hits_total", "tiergate_blacklist_entries", "tiergate_blacklist_updates_total"); err != nil {
		t.Error(err)
	}
	if www.Hits(SourceHeader) != 2 || ls.Global().Hits(SourcePacket) != 1 || www.Hits("quic") != 1 {
		t.Error("Hits disagrees with the counters")
	}
}

func TestLists(t *testing.T) {
	ls := NewLists(Options{})
	api := ls.Listener("api")
	if ls.Listener(GlobalName) != ls.Global() || ls.Listener("api") != api {
		t.Fatal("Listener does not return the same list")
	}
	ls.Global().Replace(buildAt(time.Now(), entrySpec{p: "203.0.113.7"}, entrySpec{p: "2001:db8::/64"}))
	ls.Listener("www").Replace(buildAt(time.Now(), entrySpec{p: "198.51.100.0/24"}, entrySpec{p: "203.0.113.7"}))
	for _, c := range []struct {
		listener, a, list string
	}{
		{"www", "203.0.113.7", GlobalName}, // global first
		{"www", "::ffff:203.0.113.7", GlobalName},
		{"www", "198.51.100.9", "www"},
		{"api", "198.51.100.9", ""},
		{"nosuch", "2001:db8::5", GlobalName},
		{"nosuch", "192.0.2.1", ""},
		{"www", "invalid", ""},
	} {
		a, _ := netip.ParseAddr(c.a)
		name, blocked := ls.Blocked(c.listener, a)
		if name != c.list || blocked != (c.list != "") {
			t.Errorf("Blocked(%s, %s) = %q, %v; want %q", c.listener, c.a, name, blocked, c.list)
		}
	}
	if got := fmt.Sprint(ls.Names()); got != "[api www]" {
		t.Errorf("Names = %s", got)
	}
	var nilLists *Lists
	if _, blocked := nilLists.Blocked("www", addr("203.0.113.7")); blocked {
		t.Error("a nil Lists blocks")
	}
}

// TestConcurrentUpdates runs lookups while the list is replaced and changed by
// deltas. Each snapshot holds exactly one of two marker addresses, so a lookup that
// saw a half-made set would be caught; run it under -race.
func TestConcurrentUpdates(t *testing.T) {
	ls := NewLists(Options{})
	l := ls.Listener("www")
	x, y := addr("192.0.2.1"), addr("192.0.2.2")
	var bx, by Builder
	for i := range 2000 {
		p := netip.PrefixFrom(a4(0x0a000000+uint32(i)*7).addr(), 32)
		bx.Add(p, time.Time{})
		by.Add(p, time.Time{})
	}
	bx.AddAddr(x, time.Time{})
	by.AddAddr(y, time.Time{})
	sx, sy := bx.Build(), by.Build()
	l.Replace(sx)

	var stop atomic.Bool
	var wg sync.WaitGroup
	var lookups atomic.Int64
	for range 3 {
		wg.Go(func() {
			for !stop.Load() {
				s := l.Snapshot()
				if s.Contains(x) == s.Contains(y) {
					t.Error("a snapshot holds both markers or neither")
					return
				}
				ls.Check("www", x, SourcePacket)
				ls.Blocked("www", addr("10.0.0.7"))
				lookups.Add(1)
			}
		})
	}
	toY := &Delta{Remove: []netip.Prefix{netip.PrefixFrom(x, 32)}, Add: []Entry{{Prefix: netip.PrefixFrom(y, 32)}}}
	toX := &Delta{Remove: []netip.Prefix{netip.PrefixFrom(y, 32)}, Add: []Entry{{Prefix: netip.PrefixFrom(x, 32)}}}
	for i := range 100 {
		switch i % 4 {
		case 0:
			l.Replace(sy)
		case 1:
			if err := l.Apply(toX); err != nil {
				t.Error(err)
			}
		case 2:
			if err := l.Apply(toY); err != nil {
				t.Error(err)
			}
		case 3:
			l.Replace(sx)
		}
		ls.Listener(fmt.Sprint("l", i%5)) // concurrent creation
	}
	// The last update put sx in force, which holds x: wait for the lookups to
	// have seen it (on a busy machine they may not have run meanwhile).
	for deadline := time.Now().Add(10 * time.Second); l.Hits(SourcePacket) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if lookups.Load() == 0 {
		t.Error("no lookups ran")
	}
	if l.Hits(SourcePacket) == 0 {
		t.Error("no hits counted")
	}
}

func TestMeasureSwapStall(t *testing.T) {
	l := NewList("www", Options{})
	s := buildAt(time.Now(), entrySpec{p: "10.0.0.0/8"}, entrySpec{p: "2001:db8::1"})
	d := MeasureSwapStall(l, s, 10000)
	if d <= 0 {
		t.Errorf("stall %v", d)
	}
	if l.Snapshot() != s {
		t.Error("the list does not hold the new set afterwards")
	}
}

func TestListNextAndReplaceDelta(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ls := NewLists(Options{Registerer: reg})
	l := ls.Global()
	l.Replace(buildAt(time.Now(), entrySpec{p: "192.0.2.1"}))
	d, err := ParseTextDelta(strings.NewReader("+198.51.100.9\n-192.0.2.1\n"))
	if err != nil {
		t.Fatal(err)
	}
	next, err := l.Next(d)
	if err != nil {
		t.Fatal(err)
	}
	// Next changes nothing in force.
	if _, hit := ls.Check("", addr("192.0.2.1"), SourcePacket); !hit {
		t.Fatal("Next changed the list in force")
	}
	l.ReplaceDelta(next)
	if _, hit := ls.Check("", addr("192.0.2.1"), SourcePacket); hit {
		t.Fatal("removed address still listed after ReplaceDelta")
	}
	if _, hit := ls.Check("", addr("198.51.100.9"), SourcePacket); !hit {
		t.Fatal("added address not listed after ReplaceDelta")
	}
	want := `
# HELP tiergate_blacklist_updates_total Updates, by list, kind (replace or delta) and result (ok or rejected: the list in force was kept).
# TYPE tiergate_blacklist_updates_total counter
tiergate_blacklist_updates_total{kind="delta",list="global",result="ok"} 1
tiergate_blacklist_updates_total{kind="replace",list="global",result="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tiergate_blacklist_updates_total"); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentApplyLosesNothing: deltas applied from several goroutines at once,
// with no lock, each end up in the list.
func TestConcurrentApplyLosesNothing(t *testing.T) {
	l := NewList("www", Options{})
	const workers, each = 4, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				// Addresses two apart, so that none merge into a range.
				a := a4(0x0a000000 + uint32(w)<<16 + uint32(2*i)).addr()
				if err := l.Apply(&Delta{Add: []Entry{{Prefix: netip.PrefixFrom(a, 32)}}}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := l.Len(); n != workers*each {
		t.Errorf("%d entries after %d concurrent deltas of one each", n, workers*each)
	}
}
