package certs

import (
	"crypto/tls"
	"path/filepath"
	"testing"
)

// TestResumptionAcrossNodes runs two Stores with the same ticket key files behind two
// TLS servers, as two L7 nodes, and checks that a session from one resumes on the
// other without the keyserver, through a key rotation, and no longer once the key
// that sealed it is dropped.
func TestResumptionAcrossNodes(t *testing.T) {
	for _, v := range []struct {
		name string
		max  uint16
	}{{"TLS1.2", tls.VersionTLS12}, {"TLS1.3", tls.VersionTLS13}} {
		t.Run(v.name, func(t *testing.T) { testResumption(t, v.max) })
	}
}

func testResumption(t *testing.T, maxVersion uint16) {
	p := newPKI(t)
	rsaK := rsaKey(t, 0)
	ks := startKeyserver(t, rsaK)
	dir := t.TempDir()
	remote := p.files(t, dir, "rsa", leafSpec{cn: "rsa", names: []string{"rsa.example.com"}, key: rsaK}, true)
	k1, k2 := randomKey(t), randomKey(t)
	f1 := writeFile(t, filepath.Join(dir, "ticket1.key"), k1[:])
	f2 := writeFile(t, filepath.Join(dir, "ticket2.key"), k2[:])

	nodes := make([]*Store, 2)
	servers := make([]*tlsServer, 2)
	for i := range nodes {
		nodes[i] = NewStore(Options{KeyServer: ks.client, Logger: quietLog})
		loadOK(t, nodes[i], Config{Certificates: []CertConfig{remote}, TicketKeyFiles: []string{f1}})
		servers[i] = startTLSServer(t, nodes[i]) // cloned now, before any rotation
	}
	reload := func(files ...string) {
		t.Helper()
		for _, n := range nodes {
			loadOK(t, n, Config{Certificates: []CertConfig{remote}, TicketKeyFiles: files})
		}
	}
	client := func(cache tls.ClientSessionCache) *tls.Config {
		c := p.clientConfig("rsa.example.com")
		c.MaxVersion = maxVersion
		c.ClientSessionCache = cache
		return c
	}
	// connect handshakes with node i and reports whether the session resumed and how
	// many keyserver operations the handshake took.
	connect := func(i int, cache tls.ClientSessionCache) (resumed bool, ops int64) {
		t.Helper()
		before := ks.ops.Load()
		c, err := dial(t, servers[i].addr, client(cache))
		if err != nil {
			t.Fatalf("handshake with node %d: %v", i, err)
		}
		defer c.Close()
		st := c.ConnectionState()
		if st.Version != maxVersion {
			t.Fatalf("negotiated version %x, want %x", st.Version, maxVersion)
		}
		return st.DidResume, ks.ops.Load() - before
	}

	// Two clients get a ticket from node 0, sealed with k1.
	cur, old := tls.NewLRUClientSessionCache(4), tls.NewLRUClientSessionCache(4)
	for _, cache := range []tls.ClientSessionCache{cur, old} {
		if resumed, ops := connect(0, cache); resumed || ops != 1 {
			t.Fatalf("first handshake: resumed %v with %d keyserver operations, want a full handshake with 1", resumed, ops)
		}
	}

	// The ticket resumes on the other node, without the keyserver.
	if resumed, ops := connect(1, cur); !resumed || ops != 0 {
		t.Fatalf("on node 1: resumed %v with %d keyserver operations, want resumed with 0", resumed, ops)
	}

	// Rotation: k2 seals, k1 still opens.
	reload(f2, f1)
	if resumed, ops := connect(0, cur); !resumed || ops != 0 {
		t.Fatalf("after rotation: resumed %v with %d keyserver operations, want resumed with 0", resumed, ops)
	}

	// A session sealed under k2 on one node resumes on the other.
	fresh := tls.NewLRUClientSessionCache(4)
	if resumed, _ := connect(1, fresh); resumed {
		t.Fatal("fresh client resumed")
	}
	if resumed, ops := connect(0, fresh); !resumed || ops != 0 {
		t.Fatalf("k2 ticket on the other node: resumed %v with %d ops", resumed, ops)
	}

	// k1 dropped: the old ticket no longer opens, the handshake is a full one.
	reload(f2)
	if resumed, ops := connect(1, old); resumed || ops != 1 {
		t.Fatalf("after dropping k1: resumed %v with %d keyserver operations, want a full handshake", resumed, ops)
	}
	if resumed, _ := connect(1, fresh); !resumed {
		t.Fatal("k2 ticket no longer resumes after dropping k1")
	}
}

// TestResumptionWithoutTicketKeys checks the default: per-process random keys, so a
// session resumes on the Store that issued it (across its listeners, and across a
// reload) but not on another node.
func TestResumptionWithoutTicketKeys(t *testing.T) {
	p := newPKI(t)
	cert := p.files(t, t.TempDir(), "ec", leafSpec{cn: "ec", names: []string{"ec.example.com"}, key: ecKey(t)}, false)
	a, b := NewStore(Options{Logger: quietLog}), NewStore(Options{Logger: quietLog})
	loadOK(t, a, Config{Certificates: []CertConfig{cert}})
	loadOK(t, b, Config{Certificates: []CertConfig{cert}})
	a1, a2, b1 := startTLSServer(t, a), startTLSServer(t, a), startTLSServer(t, b)

	cache := tls.NewLRUClientSessionCache(4)
	cc := p.clientConfig("ec.example.com")
	cc.ClientSessionCache = cache
	try := func(srv *tlsServer) bool {
		t.Helper()
		c, err := dial(t, srv.addr, cc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().DidResume
	}
	if try(a1) {
		t.Fatal("first handshake resumed")
	}
	if !try(a2) {
		t.Fatal("no resumption on another listener of the same Store")
	}
	loadOK(t, a, Config{Certificates: []CertConfig{cert}})
	if !try(a1) {
		t.Fatal("no resumption after a reload that kept the (random) keys")
	}
	if try(b1) {
		t.Fatal("resumed on another Store without shared ticket keys")
	}
}
