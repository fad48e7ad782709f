package l7

import (
	"github.com/quic-go/quic-go"

	"github.com/tiergate/tiergate/wire"
)

// connIDGenerator is the quic.ConnectionIDGenerator of a listener with a QUIC server
// ID: every connection ID it issues carries serverID in wire's layout, so that the L4
// distributors send the connection's packets here whatever the client's address.
// serverID must not be 0.
type connIDGenerator struct {
	serverID uint16
}

// GenerateConnectionID returns a new connection ID for g.serverID.
func (g connIDGenerator) GenerateConnectionID() (quic.ConnectionID, error) {
	var b [wire.ConnIDLen]byte
	if err := wire.EncodeConnID(b[:], g.serverID); err != nil {
		return quic.ConnectionID{}, err
	}
	return quic.ConnectionIDFromBytes(b[:]), nil
}

// ConnectionIDLen returns wire.ConnIDLen.
func (connIDGenerator) ConnectionIDLen() int { return wire.ConnIDLen }

var _ quic.ConnectionIDGenerator = connIDGenerator{}
