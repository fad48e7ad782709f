package conntrack

import (
	"testing"
)

func syncKey(port uint16) Key {
	return Key{Client: [16]byte{10: 0xff, 11: 0xff, 12: 192, 15: 1}, ClientPort: port, Rule: 1}
}

func TestEvents(t *testing.T) {
	tb := newTable(t, 64)
	tb.EnableEvents(2)
	k := syncKey(1)
	h := testHash(&k)
	insert(t, tb, k, 3, StateSynRecv, 100)
	tb.LookupTCP(&k, h, ack, 100) // syn_recv → established
	tb.LookupTCP(&k, h, ack, 101) // no change: no event
	evs, dropped := tb.Events(nil)
	if len(evs) != 1 || dropped != 0 || evs[0].State != StateEstablished || evs[0].Key != k || evs[0].Hash != h || evs[0].Shared {
		t.Fatalf("events %+v dropped %d", evs, dropped)
	}
	if _, st, exp, ok := tb.MarkSent(&k, h, 102); !ok || st != StateEstablished || exp != 101+tb.timeouts[StateEstablished] {
		t.Fatalf("MarkSent = %v %v %v", st, exp, ok)
	}
	tb.LookupTCP(&k, h, fin|ack, 103)
	tb.Delete(&k, h)
	k2 := syncKey(2)
	insert(t, tb, k2, 3, StateEstablished, 103)
	tb.Delete(&k2, testHash(&k2)) // never sent: no event
	evs, dropped = tb.Events(evs[:0])
	if len(evs) != 2 || dropped != 0 || evs[0].State != StateFin || !evs[0].Shared || evs[1].State != 0 || !evs[1].Shared {
		t.Fatalf("events %+v dropped %d", evs, dropped)
	}
	// Overflow: the third event of a 2-event ring is dropped and counted.
	for p := uint16(10); p < 13; p++ {
		k := syncKey(p)
		insert(t, tb, k, 3, StateSynRecv, 104)
		tb.LookupTCP(&k, testHash(&k), ack, 104)
	}
	if evs, dropped = tb.Events(evs[:0]); len(evs) != 2 || dropped != 1 {
		t.Fatalf("%d events, %d dropped; want 2 and 1", len(evs), dropped)
	}
}

func TestInstall(t *testing.T) {
	tb := newTable(t, 64)
	k := syncKey(1)
	h := testHash(&k)
	if tb.Install(&k, h, 5, StateSynRecv, 10, 100) {
		t.Fatal("installed a half-open entry")
	}
	if !tb.Install(&k, h, 5, StateEstablished, 500, 100) {
		t.Fatal("Install failed")
	}
	if m, st, ok := tb.Lookup(&k, h, 600); !ok || m != 5 || st != StateEstablished {
		t.Fatalf("Lookup = %d %v %v", m, st, ok)
	}
	if _, _, ok := tb.Lookup(&k, h, 601); ok {
		t.Fatal("entry outlived the TTL it was given")
	}
	// A synced entry is replaced by a newer one; only one entry remains.
	tb.Install(&k, h, 5, StateEstablished, 500, 700)
	if !tb.Install(&k, h, 6, StateFin, 60, 701) || tb.Len() != 1 {
		t.Fatalf("update: len %d", tb.Len())
	}
	if m, st, _ := tb.Lookup(&k, h, 702); m != 6 || st != StateFin {
		t.Fatalf("after update: %d %v", m, st)
	}
	// An entry this LD made from the start is kept; an unconfirmed one is replaced.
	k2, k3 := syncKey(2), syncKey(3)
	insert(t, tb, k2, 1, StateEstablished, 700)
	insert(t, tb, k3, 1, StateUnconfirmed, 700)
	if tb.Install(&k2, testHash(&k2), 7, StateEstablished, 900, 701) {
		t.Fatal("replaced an entry this LD made")
	}
	if !tb.Install(&k3, testHash(&k3), 7, StateEstablished, 900, 701) {
		t.Fatal("did not replace an unconfirmed entry")
	}
	if m, _, _ := tb.Lookup(&k3, testHash(&k3), 702); m != 7 {
		t.Fatalf("unconfirmed entry now has member %d, want 7", m)
	}
	if tb.RemoveSynced(&k2, testHash(&k2)) || !tb.RemoveSynced(&k3, testHash(&k3)) {
		t.Fatal("RemoveSynced removed the local entry or kept the synced one")
	}
	mustCheck(t, tb, testHash)
}

func TestWalk(t *testing.T) {
	tb := newTable(t, 64)
	for p := uint16(1); p <= 10; p++ {
		insert(t, tb, syncKey(p), 1, StateEstablished, 100)
	}
	k := syncKey(3)
	tb.MarkSent(&k, testHash(&k), 100)
	k5 := syncKey(11)
	tb.Install(&k5, testHash(&k5), 2, StateEstablished, 900, 100)
	var seen, sent, synced int
	pos := uint32(1)
	stops := 0
	for pos != 0 {
		pos = tb.Walk(pos, 3, 100, func(v *View) bool {
			if stops < 2 && v.Key.ClientPort == 7 {
				stops++
				return false // ring full: resume at this entry
			}
			seen++
			if v.Sent {
				sent++
			}
			if v.Synced {
				synced++
			}
			return true
		})
	}
	if seen != 11 || sent != 1 || synced != 1 {
		t.Fatalf("walk saw %d entries, %d sent, %d synced; want 11, 1, 1", seen, sent, synced)
	}
}
