package wire

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
)

// ConnIDLen is the length in bytes of the QUIC connection IDs that l7d issues and l4d
// routes by. They carry the L7 node's server ID in clear text, so that an L4
// distributor can send every packet of a QUIC connection to the node that holds it,
// even after the client's address changes.
//
// The layout is QUIC-LB's plaintext algorithm (draft-ietf-quic-load-balancers) with
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
const ConnIDLen = 8

// connIDFirstByte is config rotation 0 (top three bits) and the length of the rest.
const connIDFirstByte = ConnIDLen - 1

// Errors of EncodeConnID.
var (
	ErrConnIDShort = errors.New("wire: destination shorter than a QUIC connection ID")
	ErrServerID    = errors.New("wire: QUIC server ID 0 is reserved for none")
)

// EncodeConnID writes a QUIC connection ID for serverID into dst[:ConnIDLen], with a
// fresh random nonce. It fails when dst is shorter than ConnIDLen (ErrConnIDShort),
// when serverID is 0 (ErrServerID) or when the system's random source fails.
func EncodeConnID(dst []byte, serverID uint16) error {
	if len(dst) < ConnIDLen {
		return ErrConnIDShort
	}
	if serverID == 0 {
		return ErrServerID
	}
	dst[0] = connIDFirstByte
	binary.BigEndian.PutUint16(dst[1:3], serverID)
	if _, err := rand.Read(dst[3:ConnIDLen]); err != nil {
		return err
	}
	return nil
}

// DecodeConnID returns the server ID in a QUIC connection ID and whether cid is of
// this layout. cid may be longer than ConnIDLen, as the bytes after a short header's
// first byte are (the connection ID's length is not on the wire there); only its first
// ConnIDLen bytes are read.
func DecodeConnID(cid []byte) (serverID uint16, ok bool) {
	if len(cid) < ConnIDLen || cid[0] != connIDFirstByte {
		return 0, false
	}
	id := binary.BigEndian.Uint16(cid[1:3])
	return id, id != 0
}
