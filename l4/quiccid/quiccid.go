// Package quiccid is the format of the QUIC connection IDs that l7d issues and l4d
// routes by: the L7 node's server ID in clear text, so that an L4 distributor can send
// every packet of a QUIC connection to the node that holds it, even after the client's
// address changes.
//
// The format is QUIC-LB's plaintext algorithm (draft-ietf-quic-load-balancers) with
// config rotation 0 and an 8-byte connection ID:
//
//	byte 0     top 3 bits: config rotation, 0b000; low 5 bits: length of the rest, 7
//	bytes 1-2  server ID, big endian, 1..65535 (0 means none)
//	bytes 3-7  nonce, random for every connection ID
//
// A connection ID whose first byte is not 0x07, or whose server ID is 0, is not one of
// ours: the distributor routes its packet by the 5-tuple instead. Client-chosen IDs (the
// destination ID of Initial and 0-RTT packets) are random and fail this test 255 times
// in 256 at the first byte, and the server ID check catches a further 1 in 65536.
package quiccid

import (
	"crypto/rand"
	"encoding/binary"
	"errors"

	"github.com/quic-go/quic-go"
)

// Len is the length in bytes of the connection IDs this package makes.
const Len = 8

// firstByte is config rotation 0 (top three bits) and the length of the rest (Len-1).
const firstByte = Len - 1

// Errors of Encode.
var (
	ErrShort    = errors.New("quiccid: destination shorter than a connection ID")
	ErrServerID = errors.New("quiccid: server ID 0 is reserved for none")
)

// Encode writes a connection ID for serverID into dst[:Len], with a fresh random nonce.
// It fails when dst is shorter than Len, when serverID is 0 or when the system's random
// source fails.
func Encode(dst []byte, serverID uint16) error {
	if len(dst) < Len {
		return ErrShort
	}
	if serverID == 0 {
		return ErrServerID
	}
	dst[0] = firstByte
	binary.BigEndian.PutUint16(dst[1:3], serverID)
	if _, err := rand.Read(dst[3:Len]); err != nil {
		return err
	}
	return nil
}

// Decode returns the server ID in a connection ID and whether cid is one of ours. cid
// may be longer than Len, as the bytes after a short header's first byte are (the
// connection ID's length is not on the wire there); only its first Len bytes are read.
func Decode(cid []byte) (serverID uint16, ok bool) {
	if len(cid) < Len || cid[0] != firstByte {
		return 0, false
	}
	id := binary.BigEndian.Uint16(cid[1:3])
	return id, id != 0
}

// Generator is a quic.ConnectionIDGenerator that issues connection IDs carrying
// ServerID, for quic.Transport.ConnectionIDGenerator. ServerID must not be 0.
type Generator struct {
	ServerID uint16
}

// GenerateConnectionID returns a new connection ID for g.ServerID.
func (g Generator) GenerateConnectionID() (quic.ConnectionID, error) {
	var b [Len]byte
	if err := Encode(b[:], g.ServerID); err != nil {
		return quic.ConnectionID{}, err
	}
	return quic.ConnectionIDFromBytes(b[:]), nil
}

// ConnectionIDLen returns Len.
func (Generator) ConnectionIDLen() int { return Len }

var _ quic.ConnectionIDGenerator = Generator{}
