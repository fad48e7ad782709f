package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/testpki"
)

// chainOf parses a PEM chain.
func chainOf(t *testing.T, data []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// TestIssueWith: the leaf is signed by the signer, followed by next's certificate,
// which signed it only when it is the signer; the validity asked is the one given.
func TestIssueWith(t *testing.T) {
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testpki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	good, err := IssueWith(ca, ca, key, time.Time{}, time.Time{}, "www.example.test")
	if err != nil {
		t.Fatal(err)
	}
	chain := chainOf(t, good.ChainPEM)
	if len(chain) != 2 || chain[0].CheckSignatureFrom(chain[1]) != nil || chain[0].SerialNumber.Cmp(good.Serial()) != 0 {
		t.Fatalf("chain of %d certificates, the leaf not signed by the next", len(chain))
	}
	if err := chain[0].VerifyHostname("www.example.test"); err != nil {
		t.Error(err)
	}
	bad, err := IssueWith(ca, other, key, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour), "www.example.test")
	if err != nil {
		t.Fatal(err)
	}
	chain = chainOf(t, bad.ChainPEM)
	if chain[0].CheckSignatureFrom(chain[1]) == nil {
		t.Error("the leaf is signed by a CA that did not issue it")
	}
	if !chain[0].NotAfter.Before(time.Now()) {
		t.Errorf("not after %v: want an expired certificate", chain[0].NotAfter)
	}
	if !strings.Contains(string(good.KeyPEM), "PRIVATE KEY") {
		t.Errorf("key PEM %q", good.KeyPEM)
	}
}

// TestFreePort: the address is free for both TCP and UDP (the l7d listener's QUIC
// shares the port).
func TestFreePort(t *testing.T) {
	addr, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	pc.Close()
}

// TestStartWithoutBinaries: a cluster asked of a folder without the daemons says
// which one is missing and how to build it, and leaves nothing running.
func TestStartWithoutBinaries(t *testing.T) {
	_, err := Start(context.Background(), Options{Bin: t.TempDir(), Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "controld not built (make build)") {
		t.Fatalf("Start: %v", err)
	}
	if _, err := Start(context.Background(), Options{}); err == nil || !strings.Contains(err.Error(), "Bin and Dir are required") {
		t.Fatalf("Start with no options: %v", err)
	}
}
