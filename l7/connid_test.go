package l7

import (
	"errors"
	"testing"

	"github.com/tiergate/tiergate/wire"
)

func TestConnIDGenerator(t *testing.T) {
	g := connIDGenerator{serverID: 513}
	if g.ConnectionIDLen() != wire.ConnIDLen {
		t.Fatalf("ConnectionIDLen = %d", g.ConnectionIDLen())
	}
	c, err := g.GenerateConnectionID()
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != wire.ConnIDLen {
		t.Fatalf("generated length %d", c.Len())
	}
	if id, ok := wire.DecodeConnID(c.Bytes()); !ok || id != 513 {
		t.Fatalf("DecodeConnID(generated % x) = %d, %v", c.Bytes(), id, ok)
	}
	if _, err := (connIDGenerator{}).GenerateConnectionID(); !errors.Is(err, wire.ErrServerID) {
		t.Fatalf("zero server ID: %v, want ErrServerID", err)
	}
}

func BenchmarkConnIDGenerator(b *testing.B) {
	g := connIDGenerator{serverID: 9}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.GenerateConnectionID(); err != nil {
			b.Fatal(err)
		}
	}
}
