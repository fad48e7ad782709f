package packet

import "encoding/binary"

// QUIC long-header packet types as QUICDestConnID reports them (QUIC version 1
// numbering; version 2 types are mapped onto these).
const (
	QUICInitial   = 0
	QUIC0RTT      = 1
	QUICHandshake = 2
	QUICRetry     = 3
)

// QUIC versions whose long-header type bits QUICDestConnID interprets.
const (
	quicV1 = 0x00000001 // RFC 9000
	quicV2 = 0x6b3343cf // RFC 9369
)

// maxQUICConnIDLen is the longest connection ID QUIC versions 1 and 2 allow.
const maxQUICConnIDLen = 20

// QUICDestConnID returns the destination connection ID of the QUIC packet in the UDP
// payload u, as a sub-slice of u. A short-header packet's connection ID has the fixed
// length shortLen (chosen by the server, 0..20). long reports a long header and typ its
// packet type (QUICInitial, QUIC0RTT, QUICHandshake, QUICRetry; version 2 types are
// mapped to these, other versions' type bits are reported as they are). ok is false
// if u is too short for its header, a connection ID of a version 1 or 2 packet is
// longer than 20 bytes, shortLen is out of range, or the packet is a version
// negotiation (version 0).
func QUICDestConnID(u []byte, shortLen int) (cid []byte, long bool, typ uint8, ok bool) {
	if len(u) < 1 {
		return nil, false, 0, false
	}
	if u[0]&0x80 == 0 {
		if shortLen < 0 || shortLen > maxQUICConnIDLen || len(u)-1 < shortLen {
			return nil, false, 0, false
		}
		return u[1 : 1+shortLen], false, 0, true
	}
	// Long header (RFC 8999 section 5.1): flags, version, DCID length, DCID, SCID
	// length, SCID.
	if len(u) < 7 {
		return nil, true, 0, false
	}
	ver := binary.BigEndian.Uint32(u[1:])
	if ver == 0 {
		return nil, true, 0, false
	}
	dl := int(u[5])
	if len(u)-6 < dl+1 {
		return nil, true, 0, false
	}
	sl := int(u[6+dl])
	if len(u)-7-dl < sl {
		return nil, true, 0, false
	}
	typ = u[0] >> 4 & 3
	switch ver {
	case quicV1:
	case quicV2:
		typ = (typ - 1) & 3
	default:
		return u[6 : 6+dl], true, typ, true
	}
	if dl > maxQUICConnIDLen || sl > maxQUICConnIDLen {
		return nil, true, typ, false
	}
	return u[6 : 6+dl], true, typ, true
}
