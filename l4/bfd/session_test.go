package bfd

import (
	"testing"
	"time"
)

// TestHandshake: two state machines exchange packets: Down, Init, Up (RFC 5880
// 6.2), then each polls to its fast interval and the other answers Final.
func TestHandshake(t *testing.T) {
	a := newFSM(1, 100*time.Millisecond, 100*time.Millisecond, 3)
	b := newFSM(2, 300*time.Millisecond, 200*time.Millisecond, 5)
	if a.advertisedTx != slowTx || a.txInterval() > slowTx {
		t.Fatalf("not Up: advertised %v", a.advertisedTx)
	}
	b.receive(a.packet(false)) // Down: b goes Init
	if b.state != StateInit || b.remoteDiscr != 1 {
		t.Fatalf("b: %v, remote discriminator %d", b.state, b.remoteDiscr)
	}
	a.receive(b.packet(false)) // Init: a goes Up
	if a.state != StateUp || !a.polling || a.advertisedTx != 100*time.Millisecond {
		t.Fatalf("a: %v, polling %v, advertised %v", a.state, a.polling, a.advertisedTx)
	}
	pa := a.packet(false)
	if !pa.Poll || pa.YourDiscr != 2 {
		t.Fatalf("a's packet once Up: %+v", pa)
	}
	final, _ := b.receive(pa) // Up: b goes Up, and is asked for Final
	if b.state != StateUp || !final {
		t.Fatalf("b: %v, final %v", b.state, final)
	}
	a.receive(b.packet(true))
	if a.polling {
		t.Error("a still polling after Final")
	}
	// a's detection time: b's multiplier times the longer of a's RequiredMinRx and
	// b's DesiredMinTx (b polls too, with 300 ms).
	if got, want := a.detectTime(), 5*300*time.Millisecond; got != want {
		t.Errorf("a's detection time %v, want %v", got, want)
	}
	if got, want := b.detectTime(), 3*200*time.Millisecond; got != want {
		t.Errorf("b's detection time %v, want %v", got, want)
	}
	// a's periodic interval: max(100 ms, b's RequiredMinRx 200 ms) less 0-25%.
	for range 100 {
		if iv := a.txInterval(); iv < 150*time.Millisecond || iv > 200*time.Millisecond {
			t.Fatalf("a's interval %v", iv)
		}
	}

	// Silence: a goes Down with detect_expired, forgets b, and slows down.
	if before := a.expire(); before != StateUp || a.state != StateDown || a.diag != DiagDetectExpired || a.remoteDiscr != 0 || a.advertisedTx != slowTx {
		t.Fatalf("a after expiry: %+v", a)
	}
	// b hears a Down: it goes Down too (neighbor signalled).
	b.receive(a.packet(false))
	if b.state != StateDown || b.diag != DiagNeighborDown {
		t.Fatalf("b: %v %v", b.state, b.diag)
	}
	// An AdminDown from the peer takes an Up session Down, not AdminDown.
	c, d := newFSM(3, time.Second, time.Second, 3), newFSM(4, time.Second, time.Second, 3)
	d.receive(c.packet(false))
	c.receive(d.packet(false))
	d.receive(c.packet(false))
	if c.state != StateUp || d.state != StateUp {
		t.Fatalf("c %v d %v", c.state, d.state)
	}
	c.adminDown()
	d.receive(c.packet(false))
	if d.state != StateDown || d.diag != DiagNeighborDown {
		t.Fatalf("d after AdminDown: %v %v", d.state, d.diag)
	}
	// A session AdminDown ignores what it receives.
	c.receive(d.packet(false))
	if c.state != StateAdminDown {
		t.Errorf("c left AdminDown: %v", c.state)
	}
}

// TestNoPacketsWanted: a peer whose RequiredMinRx is 0 is sent no periodic packets.
func TestNoPacketsWanted(t *testing.T) {
	a := newFSM(1, time.Second, time.Second, 3)
	a.receive(Packet{State: StateDown, DetectMult: 3, MyDiscr: 9, DesiredMinTx: time.Second})
	if iv := a.txInterval(); iv != 0 {
		t.Errorf("interval %v, want none", iv)
	}
}
