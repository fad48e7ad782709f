package certs

import (
	"crypto/x509"

	"github.com/tiergate/tiergate/certs/chain"
)

// ParseChain parses a PEM certificate chain and checks its order: chain.Parse.
func ParseChain(data []byte) ([]*x509.Certificate, error) { return chain.Parse(data) }
