package conntrack

import "testing"

func TestProxyLifecycle(t *testing.T) {
	tb := newTable(t, 4)
	if tb.ProxyEnabled() {
		t.Fatal("proxy state allocated before it was asked for")
	}
	tb.EnableEvents(16)
	k := Key{Client: [16]byte{15: 1}, ClientPort: 40000, Rule: 1}
	h := testHash(&k)
	if _, ok := tb.InsertProxy(&k, h, 3, Proxy{SeqDelta: 1000, TSDelta: 7, Win: 502, Flags: ProxyTS}, 100); !ok {
		t.Fatal("InsertProxy failed")
	}
	if tb.HalfOpen() != 1 {
		t.Fatalf("%d half-open, want the pending connection", tb.HalfOpen())
	}
	// The client's packets while the member has not answered change nothing.
	m, ref, ok := tb.LookupTCPRef(&k, h, ack, 101)
	px := tb.Proxy(ref)
	if !ok || m != 3 || px == nil || px.Flags != ProxyOn|ProxyPending|ProxyTS || px.SeqDelta != 1000 || px.Win != 502 {
		t.Fatalf("lookup: %d %v %+v", m, ok, px)
	}
	if _, st, _ := tb.Lookup(&k, h, 101); st != StateSynRecv {
		t.Fatalf("an ACK while pending moved the entry to %v", st)
	}
	// The member's SYN-ACK establishes it.
	_, ref, ok = tb.LookupReplyRef(&k, h, 102)
	if !ok || tb.Proxy(ref) == nil {
		t.Fatal("reply lookup missed")
	}
	tb.Proxy(ref).SeqDelta = 5
	tb.EstablishProxy(ref, h, 102)
	if _, st, _ := tb.Lookup(&k, h, 102); st != StateEstablished || tb.HalfOpen() != 0 {
		t.Fatalf("after the member's SYN-ACK: %v, %d half-open", st, tb.HalfOpen())
	}
	if px, ok := tb.ProxyOf(&k, h); !ok || px.Flags != ProxyOn|ProxyTS || px.SeqDelta != 5 {
		t.Fatalf("ProxyOf = %+v, %v", px, ok)
	}
	var evs []Event
	if evs, _ = tb.Events(evs); len(evs) != 1 || evs[0].State != StateEstablished {
		t.Fatalf("events %+v, want the establishment", evs)
	}
	var seen Proxy
	tb.Walk(1, 10, 102, func(v *View) bool { seen = v.Proxy; return true })
	if seen.SeqDelta != 5 {
		t.Fatalf("Walk shows %+v", seen)
	}
	// A deleted entry's state is cleared: the next entry in its place is not proxied.
	tb.Delete(&k, h)
	insert(t, tb, k, 2, StateSynRecv, 103)
	if _, ref, _ := tb.LookupTCPRef(&k, h, ack, 103); tb.Proxy(ref) != nil {
		t.Fatal("a new entry inherited proxy state")
	}
	if m, _, _ := tb.Lookup(&k, h, 103); m != 2 {
		t.Fatal("lookup after reuse")
	}

	// A peer's proxied connection installs with its state.
	k2 := Key{Client: [16]byte{15: 2}, ClientPort: 1, Rule: 1}
	if !tb.InstallProxy(&k2, testHash(&k2), 1, StateEstablished, 60, 104, Proxy{SeqDelta: 9, Flags: ProxyOn | ProxyPending, WShift: -2}) {
		t.Fatal("InstallProxy failed")
	}
	if px, ok := tb.ProxyOf(&k2, testHash(&k2)); !ok || px.SeqDelta != 9 || px.WShift != -2 || px.Flags != ProxyOn {
		t.Fatalf("installed %+v", px)
	}
}

// TestProxyPendingReset: a reset from the client closes a pending connection.
func TestProxyPendingReset(t *testing.T) {
	tb := newTable(t, 4)
	k := Key{ClientPort: 1}
	h := testHash(&k)
	tb.InsertProxy(&k, h, 1, Proxy{}, 10)
	tb.LookupTCPRef(&k, h, rst, 11)
	if _, st, _ := tb.Lookup(&k, h, 11); st != StateClose {
		t.Fatalf("state %v after a reset, want close", st)
	}
}
