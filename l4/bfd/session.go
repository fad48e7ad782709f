package bfd

import (
	"math/rand/v2"
	"time"
)

// slowTx is the shortest interval between packets while a session is not Up (RFC
// 5880 6.8.3: at least one second).
const slowTx = time.Second

// fsm is one session's state variables (RFC 5880 6.8.1) and its state machine, free
// of sockets and clocks: the speaker's session goroutine feeds it packets and
// timer expiries, and sends what it says.
type fsm struct {
	// Configured: the local parameters once Up.
	desiredMinTx, requiredMinRx time.Duration
	detectMult                  uint8

	state, remoteState State
	localDiscr         uint32
	remoteDiscr        uint32
	diag               Diag
	// advertisedTx is the DesiredMinTx in the packets sent: slowTx (or more) while
	// not Up, desiredMinTx once Up.
	advertisedTx time.Duration
	// remoteMinRx is the peer's RequiredMinRx (initially 1 µs, RFC 6.8.1),
	// remoteMinTx its DesiredMinTx and remoteMult its DetectMult, from its last
	// packet.
	remoteMinRx, remoteMinTx time.Duration
	remoteMult               uint8
	// polling: a Poll Sequence is in progress; every packet sent has P until a
	// packet with F arrives.
	polling bool
}

func newFSM(discr uint32, desiredMinTx, requiredMinRx time.Duration, mult uint8) *fsm {
	return &fsm{
		desiredMinTx: desiredMinTx, requiredMinRx: requiredMinRx, detectMult: mult,
		state: StateDown, remoteState: StateDown, localDiscr: discr,
		advertisedTx: max(slowTx, desiredMinTx), remoteMinRx: time.Microsecond,
	}
}

// receive takes a packet that passed Decode's checks and was demultiplexed to this
// session (RFC 5880 6.8.6). It returns whether a packet with Final must be sent at
// once (the peer polled) and the state before, so the caller sees a change.
func (f *fsm) receive(p Packet) (final bool, before State) {
	before = f.state
	f.remoteDiscr = p.MyDiscr
	f.remoteState = p.State
	f.remoteMinRx = p.RequiredMinRx
	f.remoteMinTx = p.DesiredMinTx
	f.remoteMult = p.DetectMult
	if p.Final && f.polling {
		f.polling = false
	}
	if f.state == StateAdminDown {
		return false, before
	}
	switch {
	case p.State == StateAdminDown:
		if f.state != StateDown {
			f.goDown(DiagNeighborDown)
		}
	case f.state == StateDown:
		switch p.State {
		case StateDown:
			f.setState(StateInit)
		case StateInit:
			f.setState(StateUp)
		}
	case f.state == StateInit:
		if p.State == StateInit || p.State == StateUp {
			f.setState(StateUp)
		}
	default: // Up
		if p.State == StateDown {
			f.goDown(DiagNeighborDown)
		}
	}
	return p.Poll, before
}

// setState moves to s. Going Up, the session's fast intervals are advertised and a
// Poll Sequence starts (6.8.3: a change of DesiredMinTx is polled; a decrease may be
// used at once).
func (f *fsm) setState(s State) {
	f.state = s
	if s == StateUp {
		f.diag = DiagNone
		if f.advertisedTx != f.desiredMinTx {
			f.advertisedTx = f.desiredMinTx
			f.polling = true
		}
	}
}

// goDown leaves Init or Up for Down with diag: the slow rate again, no poll.
func (f *fsm) goDown(diag Diag) {
	f.state, f.diag = StateDown, diag
	f.advertisedTx = max(slowTx, f.desiredMinTx)
	f.polling = false
}

// expire is the Detection Time passing without a packet (6.8.4): a session in
// Init or Up goes Down, and the peer's discriminator is forgotten. It returns the
// state before.
func (f *fsm) expire() State {
	before := f.state
	if f.state == StateInit || f.state == StateUp {
		f.goDown(DiagDetectExpired)
	}
	f.remoteDiscr = 0
	f.remoteState = StateDown
	f.remoteMinRx = time.Microsecond
	f.remoteMult = 0
	return before
}

// adminDown takes the session down administratively (6.8.16): its packets say
// AdminDown, with DiagAdminDown.
func (f *fsm) adminDown() {
	f.state, f.diag = StateAdminDown, DiagAdminDown
	f.polling = false
}

// detectTime is how long without a packet takes the session Down (6.8.4,
// asynchronous mode): the peer's multiplier times the longer of the interval this
// side can receive at and the one the peer wants to send at; 0 before any packet.
func (f *fsm) detectTime() time.Duration {
	if f.remoteMult == 0 {
		return 0
	}
	return time.Duration(f.remoteMult) * max(f.requiredMinRx, f.remoteMinTx)
}

// txInterval is the time to the next periodic packet (6.8.7): the longer of the
// advertised DesiredMinTx and the peer's RequiredMinRx, less a random 0-25% (10-25%
// with a multiplier of 1); 0 when the peer wants no packets.
func (f *fsm) txInterval() time.Duration {
	if f.remoteMinRx == 0 {
		return 0
	}
	iv := max(f.advertisedTx, f.remoteMinRx)
	low := 0.75
	hi := 1.0
	if f.detectMult == 1 {
		hi = 0.9
	}
	return time.Duration(float64(iv) * (low + rand.Float64()*(hi-low)))
}

// packet is the next packet to send: periodic (final false, with P while polling)
// or the answer to a poll (final, never P).
func (f *fsm) packet(final bool) Packet {
	return Packet{
		Diag: f.diag, State: f.state,
		Poll: f.polling && !final, Final: final,
		DetectMult: f.detectMult, MyDiscr: f.localDiscr, YourDiscr: f.remoteDiscr,
		DesiredMinTx: f.advertisedTx, RequiredMinRx: f.requiredMinRx,
	}
}
