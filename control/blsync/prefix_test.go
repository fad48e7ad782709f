package blsync

import (
	"testing"

	"github.com/tiergate/tiergate/control/agent"
)

// TestPrefixGranted: the prefix the lists are kept under is the one a node's etcd
// role may read (agent.GrantNode).
func TestPrefixGranted(t *testing.T) {
	if Prefix != agent.BlacklistPrefix {
		t.Fatalf("blsync.Prefix %q, agent.BlacklistPrefix %q", Prefix, agent.BlacklistPrefix)
	}
}
