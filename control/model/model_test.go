package model

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/policy/route"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// pki is a CA shared by the tests of the package.
var pki = func() *testpki.CA {
	ca, err := testpki.NewCA("model test CA")
	if err != nil {
		panic(err)
	}
	return ca
}()

// chainPEM issues a leaf for pub and names and returns it and the CA as a PEM chain.
func chainPEM(t testing.TB, pub crypto.PublicKey, names ...string) ([]byte, *x509.Certificate) {
	t.Helper()
	leaf, der, err := pki.Issue(names[0], pub, names...)
	if err != nil {
		t.Fatal(err)
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.DER})...)
	return out, leaf
}

func ecdsaKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newCert(t testing.TB, name string, pub crypto.PublicKey, names ...string) *Certificate {
	t.Helper()
	chain, _ := chainPEM(t, pub, names...)
	c, err := NewCertificate(name, 1, chain)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fullSnapshot is a consistent cluster: listener web routed to pool app, served
// with an ECDSA and an Ed25519 certificate side by side, and an L4 rule to a pool
// of two L7 nodes.
func fullSnapshot(t testing.TB) *Snapshot {
	t.Helper()
	_, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return NewSnapshot(1,
		&Listener{l7.Listener{Name: "web", Addr: "198.51.100.1:443"}},
		&RoutingPolicy{route.Listener{Name: "web", VHosts: []route.VHost{{
			Names:  []string{"www.example.com"},
			Routes: []route.Route{{Name: "all", Action: route.Action{Pool: "app"}}},
		}}}},
		&Pool{route.Pool{Name: "app", Members: []route.PoolMember{{Addr: "198.18.1.1:8080"}}}},
		newCert(t, "www", ecdsaKey(t).Public(), "www.example.com", "*.example.com"),
		newCert(t, "www-ed", edPriv.Public(), "www.example.com", "*.example.com"),
		&CertBinding{Name: "www", Certificates: []string{"www", "www-ed"}, Listeners: []string{"web"}, Default: true},
		&L4Rule{datapath.RuleConfig{Name: "https", VIP: netip.MustParseAddr("203.0.113.10"), Protocol: "tcp", Port: 443, Pool: "l7"}},
		&L4Pool{Name: "l7", PoolConfig: datapath.PoolConfig{Members: []datapath.MemberConfig{
			{Name: "n1", Address: netip.MustParseAddr("198.18.2.1")},
			{Name: "n2", Address: netip.MustParseAddr("198.18.2.2")},
		}}},
	)
}

// fieldErrors returns the field errors of err as "path: message" lines.
func fieldErrors(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var fe *config.FieldError
		if errors.As(err, &fe) {
			out = append(out, fe.Path+": "+fe.Err.Error())
		} else if err != nil {
			out = append(out, "(not a field error) "+err.Error())
		}
	}
	walk(err)
	return out
}

// hasError reports whether err has a field error at path whose message holds msg.
func hasError(err error, path, msg string) bool {
	for _, line := range fieldErrors(err) {
		p, m, _ := strings.Cut(line, ": ")
		if p == path && strings.Contains(m, msg) {
			return true
		}
	}
	return false
}

func TestObjectsValidate(t *testing.T) {
	cert := newCert(t, "www", ecdsaKey(t).Public(), "www.example.com")
	withKey := *cert
	key, _ := testpki.KeyPEM(ecdsaKey(t))
	withKey.Chain += string(key)
	wrongID := *cert
	wrongID.KeyID = strings.Repeat("0", 64)
	wrongNames := *cert
	wrongNames.SANs = []string{"other.example.com"}
	noVersion := *cert
	noVersion.Version = 0
	for _, tc := range []struct {
		name      string
		obj       Object
		path, msg string // "" for a valid object
	}{
		{"listener", &Listener{l7.Listener{Name: "web"}}, "", ""},
		{"listener addr", &Listener{l7.Listener{Name: "web", Addr: "nope"}}, "addr", "missing port"},
		{"listener limit", &Listener{l7.Listener{Name: "web", MaxConns: -1}}, "max_conns", "must not be negative"},
		{"listener pool", &Listener{l7.Listener{Name: "web", Pool: "app"}}, "pool", "by its routing policy"},
		{"listener QUIC ID", &Listener{l7.Listener{Name: "web", QUICServerID: 7}}, "quic_server_id", "node to node"},
		{"listener no name", &Listener{l7.Listener{}}, "name", "required"},
		{"listener bad name", &Listener{l7.Listener{Name: "a/b"}}, "name", "want letters"},
		{"routing to a pool not checked alone", &RoutingPolicy{route.Listener{Name: "web", VHosts: []route.VHost{{Names: []string{"*"}, Routes: []route.Route{{Action: route.Action{Pool: "elsewhere"}}}}}}}, "", ""},
		{"routing path mode", &RoutingPolicy{route.Listener{Name: "web", PathMode: "loose"}}, "path_mode", "loose"},
		{"routing two actions", &RoutingPolicy{route.Listener{Name: "web", VHosts: []route.VHost{{Names: []string{"*"}, Routes: []route.Route{{Action: route.Action{Pool: "p", Respond: &route.Respond{Status: 200}}}}}}}}, "vhosts[0].routes[0].action", "exactly one"},
		{"routing no name", &RoutingPolicy{route.Listener{}}, "name", "required"},
		{"pool", &Pool{route.Pool{Name: "app", Members: []route.PoolMember{{Addr: "198.18.1.1:80"}}}}, "", ""},
		{"pool no members", &Pool{route.Pool{Name: "app"}}, "members", ""},
		{"pool balance", &Pool{route.Pool{Name: "app", Balance: "random", Members: []route.PoolMember{{Addr: "198.18.1.1:80"}}}}, "balance", "random"},
		{"l4 rule to a pool not checked alone", &L4Rule{datapath.RuleConfig{Name: "r", VIP: netip.MustParseAddr("203.0.113.1"), Protocol: "udp", Port: 443, Pool: "x", QUIC: true}}, "", ""},
		{"l4 rule protocol", &L4Rule{datapath.RuleConfig{Name: "r", VIP: netip.MustParseAddr("203.0.113.1"), Protocol: "sctp", Port: 443, Pool: "x"}}, "protocol", "sctp"},
		{"l4 rule no pool", &L4Rule{datapath.RuleConfig{Name: "r", VIP: netip.MustParseAddr("203.0.113.1"), Protocol: "tcp", Port: 443}}, "pool", "not a pool"},
		{"l4 pool", &L4Pool{Name: "l7", PoolConfig: datapath.PoolConfig{Members: []datapath.MemberConfig{{Name: "a", Address: netip.MustParseAddr("198.18.2.1")}}}}, "", ""},
		{"l4 pool member", &L4Pool{Name: "l7", PoolConfig: datapath.PoolConfig{Members: []datapath.MemberConfig{{Name: "a"}}}}, "members[0].address", "required"},
		{"l4 pool health", &L4Pool{Name: "l7.eu", PoolConfig: datapath.PoolConfig{Health: datapath.HealthConfig{Type: "icmp"}}}, "health.type", "icmp"},
		{"l4 pool no name", &L4Pool{}, "name", "required"},
		{"certificate", cert, "", ""},
		{"certificate with its key", &withKey, "chain", "private key"},
		{"certificate key ID", &wrongID, "key_id", "not the leaf's key ID"},
		{"certificate names", &wrongNames, "sans", "not the leaf's names"},
		{"certificate version", &noVersion, "version", "from 1"},
		{"certificate chain", &Certificate{Name: "x", Version: 1, Chain: "junk"}, "chain", "no PEM certificate"},
		{"binding", &CertBinding{Name: "b", Certificates: []string{"www"}, Listeners: []string{"web"}, ServerNames: []string{"*.example.com", "192.0.2.1"}}, "", ""},
		{"binding no certificate", &CertBinding{Name: "b", Listeners: []string{"web"}}, "certificates", "at least one"},
		{"binding twice", &CertBinding{Name: "b", Certificates: []string{"www"}, Listeners: []string{"web", "web"}}, "listeners[1]", "twice"},
		{"binding server name", &CertBinding{Name: "b", Certificates: []string{"www"}, Listeners: []string{"web"}, ServerNames: []string{"a..b"}}, "server_names[0]", "label"},
	} {
		err := tc.obj.Validate()
		switch {
		case tc.path == "" && err != nil:
			t.Errorf("%s: %v", tc.name, fieldErrors(err))
		case tc.path != "" && !hasError(err, tc.path, tc.msg):
			t.Errorf("%s: %q, want an error at %q holding %q", tc.name, fieldErrors(err), tc.path, tc.msg)
		}
	}
}

func TestNewCertificate(t *testing.T) {
	key := ecdsaKey(t)
	chain, leaf := chainPEM(t, key.Public(), "www.example.com", "*.Example.com", "192.0.2.7")
	c, err := NewCertificate("www", 3, chain)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := backend.KeyIDOf(key.Public())
	if c.KeyID != id.String() || c.KeyType != "ecdsa" || c.Version != 3 || !c.NotAfter.Equal(leaf.NotAfter) {
		t.Fatalf("certificate %+v", c)
	}
	if strings.Join(c.SANs, ",") != "www.example.com,*.example.com,192.0.2.7" {
		t.Fatalf("SANs %q", c.SANs)
	}
	for name, want := range map[string]bool{
		"www.example.com": true, "WWW.example.com.": true, "api.example.com": true, "*.example.com": true,
		"example.com": false, "a.b.example.com": false, "192.0.2.7": true, "192.0.2.8": false,
	} {
		if c.Serves(name) != want {
			t.Errorf("Serves(%q) = %v", name, !want)
		}
	}
	// The leaf last: certs' own order check says so.
	blocks := strings.SplitAfter(string(chain), "-----END CERTIFICATE-----\n")
	if _, err := NewCertificate("www", 1, []byte(blocks[1]+blocks[0])); !hasError(err, "chain", "wrong chain order") {
		t.Fatalf("a chain in the wrong order: %v", err)
	}
	// A private key in the upload never gets into the object.
	keyPEM, _ := testpki.KeyPEM(key)
	if _, err := NewCertificate("www", 1, append(chain, keyPEM...)); !hasError(err, "chain", "holds a private key") {
		t.Fatalf("a chain with its key: %v", err)
	}
	// The JSON form is what the store holds, and reads back the same.
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Decode(store.Object{Kind: KindCertificate, Name: "www", Value: data})
	if err != nil {
		t.Fatal(err)
	}
	if err := back.Validate(); err != nil {
		t.Fatalf("decoded certificate: %v", err)
	}
	if strings.Contains(string(data), "PRIVATE") {
		t.Fatal("the stored form has a private key")
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		obj       store.Object
		path, msg string
	}{
		{store.Object{Kind: KindPool, Name: "app", Value: []byte(`{"name":"app","members":[],"color":"red"}`)}, "pools/app", `unknown field "color"`},
		{store.Object{Kind: KindPool, Name: "app", Value: []byte(`{"name":"api"}`)}, "pools/app.name", `"api" is not the name`},
		{store.Object{Kind: KindListener, Name: "web", Value: []byte(`{"name":"web","idle_timeout":"soon"}`)}, "listeners/web", "decoding"},
		{store.Object{Kind: "widgets", Name: "w", Value: []byte(`{}`)}, "widgets/w", "no kind"},
		{store.Object{Kind: KindPool, Name: "app", Value: []byte(`{"name":"app"} {}`)}, "pools/app", "data after"},
	} {
		_, err := Decode(tc.obj)
		if !hasError(err, tc.path, tc.msg) {
			t.Errorf("%s: %v, want %s: %s", tc.obj.Value, fieldErrors(err), tc.path, tc.msg)
		}
	}
}

func TestConsistent(t *testing.T) {
	if err := fullSnapshot(t).Validate(); err != nil {
		t.Fatalf("the full snapshot: %q", fieldErrors(err))
	}
	if err := fullSnapshot(t).Consistent(); err != nil {
		t.Fatalf("the full snapshot: %q", fieldErrors(err))
	}
	rsaLike := newCert(t, "www-2", ecdsaKey(t).Public(), "www.example.com")
	other := newCert(t, "other", ecdsaKey(t).Public(), "other.example.com")
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherEd := newCert(t, "other-ed", edPub, "other.example.com")
	for _, tc := range []struct {
		name      string
		change    func(s *Snapshot)
		path, msg string
	}{
		{"route to a missing pool", func(s *Snapshot) { delete(s.Pools, "app") },
			"routing/web.vhosts[0].routes[0].action.pool", `no pool is named "app"`},
		{"routing of a missing listener", func(s *Snapshot) {
			s.Add(&RoutingPolicy{route.Listener{Name: "api"}})
		}, "routing/api.name", `no listener is named "api"`},
		{"binding to a missing certificate", func(s *Snapshot) { delete(s.Certificates, "www") },
			"cert-bindings/www.certificates[0]", `no certificate is named "www"`},
		{"binding to a missing listener", func(s *Snapshot) {
			s.CertBindings["www"].Listeners = append(s.CertBindings["www"].Listeners, "api")
		}, "cert-bindings/www.listeners[1]", `no listener is named "api"`},
		{"listener without a certificate", func(s *Snapshot) {
			s.Add(&Listener{l7.Listener{Name: "api", Addr: "198.51.100.2:443"}})
		}, "listeners/api", "no certificate is bound"},
		{"two listeners on one address", func(s *Snapshot) {
			s.Add(&Listener{l7.Listener{Name: "api", Addr: "198.51.100.1:443"}})
			s.CertBindings["www"].Listeners = append(s.CertBindings["www"].Listeners, "api")
		}, "listeners/web.addr", "also the address of listeners/api"},
		{"a server name not served", func(s *Snapshot) {
			s.CertBindings["www"].ServerNames = []string{"www.example.org"}
		}, "cert-bindings/www.server_names[0]", `does not serve "www.example.org"`},
		{"two certificates of one key type", func(s *Snapshot) {
			s.Add(rsaLike)
			s.CertBindings["www"].Certificates = []string{"www", "www-2"}
		}, "cert-bindings/www.certificates[1]", "same key type (ecdsa)"},
		{"certificates side by side with other names", func(s *Snapshot) {
			s.Add(otherEd)
			s.CertBindings["www"].Certificates = []string{"www", "other-ed"}
		}, "cert-bindings/www.certificates", `certificates/other-ed does not serve "www.example.com", which certificates/www does`},
		{"one name bound twice", func(s *Snapshot) {
			s.Add(&CertBinding{Name: "zz", Certificates: []string{"www"}, Listeners: []string{"web"}, ServerNames: []string{"WWW.example.com"}})
		}, "cert-bindings/zz", `"www.example.com" on listener "web" is already served by cert-bindings/www`},
		{"two defaults", func(s *Snapshot) {
			s.Add(other)
			s.Add(&CertBinding{Name: "zz", Certificates: []string{"other"}, Listeners: []string{"web"}, Default: true})
		}, "cert-bindings/zz.default", "already has a default: cert-bindings/www"},
		{"l4 rule to a missing pool", func(s *Snapshot) { delete(s.L4Pools, "l7") },
			"l4-rules/https.pool", `"l7" is not a pool`},
		{"two l4 rules on one VIP", func(s *Snapshot) {
			r := *s.L4Rules["https"]
			r.Name = "https2"
			s.Add(&r)
		}, "l4-rules/https2", `is also rule "https"`},
		{"one QUIC ID twice in an l4 pool", func(s *Snapshot) {
			p := s.L4Pools["l7"]
			p.Members[0].QUICID, p.Members[1].QUICID = 9, 9
		}, "l4-pools/l7.members[1].quic_id", "also member"},
	} {
		s := fullSnapshot(t)
		tc.change(s)
		err := s.Consistent()
		if !hasError(err, tc.path, tc.msg) {
			t.Errorf("%s: %q, want an error at %q holding %q", tc.name, fieldErrors(err), tc.path, tc.msg)
		}
	}
}

// TestStoreCheck runs the model's check on the store's change sets over a real
// etcd: a consistent cluster commits in one change set; one that would leave a
// dangling reference is refused whole, naming the field, and writes nothing.
func TestStoreCheck(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, store.Config{Dir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := fullSnapshot(t)
	var cs store.ChangeSet
	cs.Check = Check
	for _, o := range want.Objects() {
		c, err := Put(o, 0)
		if err != nil {
			t.Fatal(err)
		}
		cs.Changes = append(cs.Changes, c)
	}
	rev, err := s.Commit(ctx, cs)
	if err != nil {
		t.Fatalf("committing a consistent cluster: %v", err)
	}
	ss, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := FromStore(ss)
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != rev || len(got.Objects()) != len(want.Objects()) {
		t.Fatalf("read back %d objects at %d, want %d at %d", len(got.Objects()), got.Revision, len(want.Objects()), rev)
	}
	for i, o := range got.Objects() {
		a, _ := json.Marshal(o)
		b, _ := json.Marshal(want.Objects()[i])
		if string(a) != string(b) {
			t.Errorf("read back %s\nwant %s", a, b)
		}
	}
	if rc := got.RouteConfig(); len(rc.Listeners) != 1 || len(rc.Pools) != 1 || rc.Validate() != nil {
		t.Fatalf("route config: %+v", rc)
	}

	refused := func(cs store.ChangeSet, path, msg string) {
		t.Helper()
		_, err := s.Commit(ctx, cs)
		var che *store.CheckError
		if !errors.As(err, &che) || !hasError(che.Err, path, msg) {
			t.Fatalf("want the change set refused at %s (%s), got %v", path, msg, err)
		}
		if now, _ := s.Snapshot(ctx); now.Revision != rev {
			t.Fatalf("a refused change set moved the revision from %d to %d", rev, now.Revision)
		}
	}
	// A pool still routed to.
	refused(store.ChangeSet{Check: Check, Changes: []store.Change{{Kind: KindPool, Name: "app", Delete: true, IfRevision: rev}}},
		"routing/web.vhosts[0].routes[0].action.pool", `no pool is named "app"`)
	// A bound certificate.
	refused(store.ChangeSet{Check: Check, Changes: []store.Change{{Kind: KindCertificate, Name: "www-ed", Delete: true, IfRevision: rev}}},
		"cert-bindings/www.certificates[1]", `no certificate is named "www-ed"`)
	// A change set with a dangling pool, among good changes.
	api, _ := Put(&Listener{l7.Listener{Name: "api", Addr: "198.51.100.9:443"}}, 0)
	apiRouting, _ := Put(&RoutingPolicy{route.Listener{Name: "api", VHosts: []route.VHost{{Names: []string{"*"}, Routes: []route.Route{{Action: route.Action{Pool: "api"}}}}}}}, 0)
	binding, _ := Put(&CertBinding{Name: "api", Certificates: []string{"www"}, Listeners: []string{"api"}}, 0)
	refused(store.ChangeSet{Check: Check, Changes: []store.Change{api, apiRouting, binding}},
		"routing/api.vhosts[0].routes[0].action.pool", `no pool is named "api"`)
	// An invalid object.
	bad, _ := Put(&Pool{route.Pool{Name: "empty"}}, 0)
	refused(store.ChangeSet{Check: Check, Changes: []store.Change{bad}}, "pools/empty.members", "")
	// With the pool, the same change set commits.
	pool, _ := Put(&Pool{route.Pool{Name: "api", Members: []route.PoolMember{{Addr: "198.18.1.9:80"}}}}, 0)
	if _, err := s.Commit(ctx, store.ChangeSet{Check: Check, Changes: []store.Change{api, apiRouting, binding, pool}}); err != nil {
		t.Fatalf("the change set with its pool: %v", err)
	}
	// A stored object the model cannot read is named by the check.
	if _, err := s.Put(ctx, KindPool, "odd", []byte(`{"name":"odd","colour":1}`), 0); err != nil {
		t.Fatal(err)
	}
	other, _ := Put(&Pool{route.Pool{Name: "more", Members: []route.PoolMember{{Addr: "198.18.1.9:80"}}}}, 0)
	_, err = s.Commit(ctx, store.ChangeSet{Check: Check, Changes: []store.Change{other}})
	if !hasError(errors.Unwrap(err), "pools/odd", `unknown field "colour"`) {
		t.Fatalf("an unreadable stored object: %v", err)
	}
}

// TestExpiredCertificateStored: validity is the upload's and the nodes' to judge;
// the model keeps an expired certificate (a node reports it) rather than making the
// whole cluster's configuration unwritable the day it expires.
func TestExpiredCertificateStored(t *testing.T) {
	key := ecdsaKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: pki.Cert.SerialNumber, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
		DNSNames: []string{"old.example.com"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, pki.Cert, key.Public(), pki.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCertificate("old", 1, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	if err != nil {
		t.Fatalf("an expired certificate: %v", err)
	}
	if !c.NotAfter.Before(time.Now()) {
		t.Fatalf("not_after %v", c.NotAfter)
	}
}

// TestKeyIDIsTheKeyservers: the model's key ID is the one the keyservers name a key
// by (keyserver/protocol), which the model does not import.
func TestKeyIDIsTheKeyservers(t *testing.T) {
	_, leaf := chainPEM(t, ecdsaKey(t).Public(), "www.example.com")
	if got, want := KeyID(leaf), protocol.KeyIDFromSPKI(leaf.RawSubjectPublicKeyInfo).String(); got != want {
		t.Fatalf("model.KeyID %s, keyserver %s", got, want)
	}
}
