package bfd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// State is a session's state (RFC 5880 4.1, 6.2).
type State uint8

// The session states, as the State field carries them.
const (
	StateAdminDown State = 0
	StateDown      State = 1
	StateInit      State = 2
	StateUp        State = 3
)

var stateNames = [...]string{"admin_down", "down", "init", "up"}

// String is the state's name in status and logs: admin_down, down, init or up.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Diag says why a session last left Up (RFC 5880 4.1).
type Diag uint8

// The diagnostic codes used here and the others RFC 5880 defines.
const (
	DiagNone             Diag = 0
	DiagDetectExpired    Diag = 1 // Control Detection Time Expired
	DiagEchoFailed       Diag = 2
	DiagNeighborDown     Diag = 3 // Neighbor Signaled Session Down
	DiagForwardingReset  Diag = 4
	DiagPathDown         Diag = 5
	DiagConcatPathDown   Diag = 6
	DiagAdminDown        Diag = 7 // Administratively Down
	DiagRevConcatPathDwn Diag = 8
)

var diagNames = [...]string{"none", "detect_expired", "echo_failed", "neighbor_down", "forwarding_reset",
	"path_down", "concatenated_path_down", "admin_down", "reverse_concatenated_path_down"}

// String is the diagnostic's name in status and logs.
func (d Diag) String() string {
	if int(d) < len(diagNames) {
		return diagNames[d]
	}
	return fmt.Sprintf("diag(%d)", uint8(d))
}

// Version is the BFD version spoken (RFC 5880).
const Version = 1

// HeaderLen is the length of the mandatory part of a control packet.
const HeaderLen = 24

// Packet is a BFD control packet's mandatory section (RFC 5880 4.1). Intervals are
// carried in microseconds on the wire and as durations here.
type Packet struct {
	Diag  Diag
	State State
	// Poll asks the peer to answer with Final: a change of parameters (or a check).
	Poll bool
	// Final answers a Poll.
	Final bool
	// ControlPlaneIndependent says BFD does not share fate with the control plane.
	ControlPlaneIndependent bool
	// Demand mode is not supported: a packet asking for it is decoded, and the
	// session goes on in asynchronous mode (the peer does not stop sending while
	// this side does not set the bit).
	Demand bool
	// DetectMult is the sender's detection multiplier (at least 1).
	DetectMult uint8
	// MyDiscr is the sender's discriminator (not 0), YourDiscr the receiver's (0
	// until the sender has heard it).
	MyDiscr, YourDiscr uint32
	// DesiredMinTx is the sender's wished interval between its packets,
	// RequiredMinRx the shortest it can receive (0: send none), RequiredMinEchoRx
	// the shortest for echo packets (0: no echo).
	DesiredMinTx, RequiredMinRx, RequiredMinEchoRx time.Duration
}

// Errors of Decode. Each is wrapped with the offending value; match with errors.Is
// (or errors.As for *AuthError).
var (
	ErrShort      = errors.New("shorter than a BFD control packet (24 bytes)")
	ErrVersion    = errors.New("not BFD version 1")
	ErrLength     = errors.New("length field out of bounds")
	ErrDetectMult = errors.New("detect multiplier is zero")
	ErrMultipoint = errors.New("multipoint bit set")
	ErrMyDiscr    = errors.New("my discriminator is zero")
	ErrYourDiscr  = errors.New("your discriminator is zero in a packet of state init or up")
)

// AuthError is a packet carrying authentication (the A bit), which this speaker
// does not do: sessions are protected by GTSM (TTL 255) on a directly connected
// link instead. Type is the authentication type of the section, 0 when it is cut
// short.
type AuthError struct{ Type uint8 }

func (e *AuthError) Error() string {
	return fmt.Sprintf("authentication (type %d) is not supported", e.Type)
}

const (
	flagPoll     = 0x20
	flagFinal    = 0x10
	flagCPI      = 0x08
	flagAuth     = 0x04
	flagDemand   = 0x02
	flagMultipnt = 0x01
)

// Decode parses a control packet and applies the checks of RFC 5880 6.8.6 that need
// no session: version, length, detect multiplier, multipoint, discriminators. A
// packet with authentication is refused with *AuthError.
func Decode(b []byte) (Packet, error) {
	var p Packet
	if len(b) < HeaderLen {
		return p, fmt.Errorf("decoding BFD control packet of %d bytes: %w", len(b), ErrShort)
	}
	if v := b[0] >> 5; v != Version {
		return p, fmt.Errorf("decoding BFD control packet: version %d: %w", v, ErrVersion)
	}
	flags := b[1] & 0x3f
	length := int(b[3])
	minLen := HeaderLen
	if flags&flagAuth != 0 {
		minLen = HeaderLen + 2
	}
	if length < minLen || length > len(b) {
		return p, fmt.Errorf("decoding BFD control packet: length %d with %d bytes received: %w", length, len(b), ErrLength)
	}
	if flags&flagAuth != 0 {
		return p, &AuthError{Type: b[HeaderLen]}
	}
	p = Packet{
		Diag:                    Diag(b[0] & 0x1f),
		State:                   State(b[1] >> 6),
		Poll:                    flags&flagPoll != 0,
		Final:                   flags&flagFinal != 0,
		ControlPlaneIndependent: flags&flagCPI != 0,
		Demand:                  flags&flagDemand != 0,
		DetectMult:              b[2],
		MyDiscr:                 binary.BigEndian.Uint32(b[4:]),
		YourDiscr:               binary.BigEndian.Uint32(b[8:]),
		DesiredMinTx:            usec(binary.BigEndian.Uint32(b[12:])),
		RequiredMinRx:           usec(binary.BigEndian.Uint32(b[16:])),
		RequiredMinEchoRx:       usec(binary.BigEndian.Uint32(b[20:])),
	}
	switch {
	case flags&flagMultipnt != 0:
		return p, fmt.Errorf("decoding BFD control packet: %w", ErrMultipoint)
	case p.DetectMult == 0:
		return p, fmt.Errorf("decoding BFD control packet: %w", ErrDetectMult)
	case p.MyDiscr == 0:
		return p, fmt.Errorf("decoding BFD control packet: %w", ErrMyDiscr)
	case p.YourDiscr == 0 && p.State != StateDown && p.State != StateAdminDown:
		return p, fmt.Errorf("decoding BFD control packet of state %v: %w", p.State, ErrYourDiscr)
	}
	return p, nil
}

// Append appends p's 24 bytes to b (no authentication).
func (p *Packet) Append(b []byte) []byte {
	flags := byte(0)
	for _, f := range []struct {
		on  bool
		bit byte
	}{{p.Poll, flagPoll}, {p.Final, flagFinal}, {p.ControlPlaneIndependent, flagCPI}, {p.Demand, flagDemand}} {
		if f.on {
			flags |= f.bit
		}
	}
	b = append(b, Version<<5|byte(p.Diag)&0x1f, byte(p.State)<<6|flags, p.DetectMult, HeaderLen)
	b = binary.BigEndian.AppendUint32(b, p.MyDiscr)
	b = binary.BigEndian.AppendUint32(b, p.YourDiscr)
	b = binary.BigEndian.AppendUint32(b, toUsec(p.DesiredMinTx))
	b = binary.BigEndian.AppendUint32(b, toUsec(p.RequiredMinRx))
	return binary.BigEndian.AppendUint32(b, toUsec(p.RequiredMinEchoRx))
}

func usec(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }

// toUsec is d in whole microseconds, within the field's 32 bits.
func toUsec(d time.Duration) uint32 {
	us := d / time.Microsecond
	switch {
	case us < 0:
		return 0
	case us > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(us)
}
