package certs

import (
	"context"
	"crypto"
	"crypto/tls"
	"strings"
	"testing"
	"time"
)

// memChain issues a leaf for key and names and returns its PEM chain (leaf,
// intermediate) and its serial.
func (p *pki) memChain(t testing.TB, key crypto.Signer, names ...string) (chain []byte, serial string) {
	t.Helper()
	leaf, der := p.leaf(t, leafSpec{cn: names[0], names: names, key: key})
	return pemOf("CERTIFICATE", der, p.inter.Raw), leaf.SerialNumber.String()
}

// served dials addr as sni with tweak applied and returns the serial of the leaf
// served, or the handshake's error.
func served(t testing.TB, p *pki, addr, sni string, tweak func(*tls.Config)) (string, error) {
	t.Helper()
	cc := p.clientConfig(sni)
	if sni == "" {
		cc.ServerName = "127.0.0.1" // an IP address is not sent as SNI
		cc.InsecureSkipVerify = true
	}
	if tweak != nil {
		tweak(cc)
	}
	c, err := dial(t, addr, cc)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

func tls12RSA(c *tls.Config) {
	c.MaxVersion = tls.VersionTLS12
	c.CipherSuites = []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}
}

// TestPrepareMem serves in-memory chains with remote keys on the listeners they are
// bound to, for the bound names only, by key type, with each listener's default.
func TestPrepareMem(t *testing.T) {
	p := newPKI(t)
	rsaK, ec, other := rsaKey(t, 0), ecKey(t), ecKey(t)
	ks := startKeyserver(t, rsaK, ec, other)
	wwwEC, serialEC := p.memChain(t, ec, "www.example.com", "*.example.com")
	wwwRSA, serialRSA := p.memChain(t, rsaK, "www.example.com", "*.example.com")
	api, serialAPI := p.memChain(t, other, "api.example.net")

	s := NewStore(Options{KeyServer: ks.client, Logger: quietLog})
	cfg := MemConfig{
		Certificates: []MemCert{{Name: "www-ec", Version: 2, Chain: wwwEC}, {Name: "www-rsa", Version: 1, Chain: wwwRSA}, {Name: "api", Version: 7, Chain: api}},
		Listeners: map[string][]Binding{
			"web": {{Name: "www", Certificates: []string{"www-rsa", "www-ec"}, ServerNames: []string{"www.example.com", "*.example.com"}}},
			"api": {{Name: "api", Certificates: []string{"api"}, Default: true}},
		},
	}
	prep, err := s.PrepareMem(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Commit(prep)
	if c := s.Set().Cert("www-ec"); c == nil || c.Version != 2 || !c.Remote || c.KeyFile != "" {
		t.Fatalf("www-ec: %+v", c)
	}
	web := serveTLS(t, s.TLSConfigFor("web"))
	apiSrv := serveTLS(t, s.TLSConfigFor("api"))
	none := serveTLS(t, s.TLSConfigFor("unbound"))

	for _, tt := range []struct {
		name, addr, sni string
		tweak           func(*tls.Config)
		want            string // serial, or "" for a failed handshake
	}{
		{"web ECDSA first", web.addr, "www.example.com", nil, serialEC},
		{"web RSA-only client", web.addr, "www.example.com", tls12RSA, serialRSA},
		{"web wildcard", web.addr, "a.example.com", nil, serialEC},
		{"web: api's name is not bound there", web.addr, "api.example.net", nil, ""},
		{"web: no SNI, no default", web.addr, "", nil, ""},
		{"api by name", apiSrv.addr, "api.example.net", nil, serialAPI},
		{"api default for another name", apiSrv.addr, "other.example.org", func(c *tls.Config) { c.InsecureSkipVerify = true }, serialAPI},
		{"api: www is not bound there", apiSrv.addr, "", nil, serialAPI},
		{"unbound listener", none.addr, "www.example.com", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := served(t, p, tt.addr, tt.sni, tt.tweak)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("served %s, want a failed handshake", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("served serial %s, want %s", got, tt.want)
			}
		})
	}

	// A new version is served to new handshakes; a connection made before stays.
	old, err := dial(t, web.addr, p.clientConfig("www.example.com"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	wwwEC2, serialEC2 := p.memChain(t, ec, "www.example.com", "*.example.com")
	cfg.Certificates[0] = MemCert{Name: "www-ec", Version: 3, Chain: wwwEC2}
	prep, err = s.PrepareMem(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Commit(prep)
	if got, err := served(t, p, web.addr, "www.example.com", nil); err != nil || got != serialEC2 {
		t.Fatalf("after the new version: serial %s (%v), want %s", got, err, serialEC2)
	}
	if err := echo(old); err != nil {
		t.Fatalf("the connection made before the new version: %v", err)
	}

	// Chains served already are not looked up again: with the keyservers gone, the
	// same configuration still prepares, and a new chain does not.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ks.srv.Shutdown(sctx)
	s.opts.KeyTimeout = 300 * time.Millisecond
	if _, err := s.PrepareMem(cfg); err != nil {
		t.Fatalf("the chains in force, keyservers down: %v", err)
	}
	third, _ := p.memChain(t, ec, "www.example.com")
	cfg.Certificates[0].Chain, cfg.Certificates[0].Version = third, 4
	if _, err := s.PrepareMem(cfg); err == nil || !strings.Contains(err.Error(), `certificate "www-ec" (version 4)`) {
		t.Fatalf("a new chain with the keyservers down: %v", err)
	}
	if c := s.Set().Cert("www-ec"); c.Version != 3 {
		t.Fatalf("after a refused configuration: version %d in force, want 3 still", c.Version)
	}
}

// TestPrepareMemRefuses: a configuration with any certificate or binding that
// cannot be served is refused whole, each problem named.
func TestPrepareMemRefuses(t *testing.T) {
	p := newPKI(t)
	ec, ec2 := ecKey(t), ecKey(t)
	ks := startKeyserver(t, ec, ec2)
	good, _ := p.memChain(t, ec, "www.example.com")
	good2, _ := p.memChain(t, ec2, "www.example.com", "api.example.com")
	unknownKey, _ := p.memChain(t, ecKey(t), "x.example.com")
	_, expiredDER := p.leaf(t, leafSpec{cn: "old", names: []string{"old.example.com"}, key: ec, notBefore: time.Now().Add(-48 * time.Hour), notAfter: time.Now().Add(-time.Hour)})
	expired := pemOf("CERTIFICATE", expiredDER, p.inter.Raw)
	s := NewStore(Options{KeyServer: ks.client, Logger: quietLog, KeyTimeout: 2 * time.Second})

	for _, tt := range []struct {
		name string
		cfg  MemConfig
		want []string
	}{
		{"key the keyservers lack", MemConfig{Certificates: []MemCert{{Name: "www", Version: 1, Chain: good}, {Name: "x", Version: 5, Chain: unknownKey}}},
			[]string{`certificate "x" (version 5): no key_file, and the keyservers do not serve key`}},
		{"expired", MemConfig{Certificates: []MemCert{{Name: "old", Version: 1, Chain: expired}}}, []string{`certificate "old" (version 1): expired at`}},
		{"bad chain", MemConfig{Certificates: []MemCert{{Name: "bad", Chain: []byte("junk")}}}, []string{`certificate "bad" (version 0): no PEM certificate found`}},
		{"binding to a missing certificate", MemConfig{Certificates: []MemCert{{Name: "www", Chain: good}},
			Listeners: map[string][]Binding{"web": {{Name: "b", Certificates: []string{"nope"}}}}},
			[]string{`listener "web": binding "b": no certificate is named "nope"`}},
		{"a name bound twice, two defaults, two of one key type", MemConfig{Certificates: []MemCert{{Name: "www", Chain: good}, {Name: "www2", Chain: good2}},
			Listeners: map[string][]Binding{"web": {
				{Name: "a", Certificates: []string{"www"}, Default: true},
				{Name: "b", Certificates: []string{"www2"}, Default: true},
				{Name: "c", Certificates: []string{"www", "www2"}, ServerNames: []string{"api.example.com"}}}}},
			[]string{`binding "b": the server name "www.example.com" is bound by binding "a" too`,
				`binding "b": the listener has another default binding`,
				`binding "c": "www2" has the same key type (ecdsa) as "www"`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.PrepareMem(tt.cfg)
			if err == nil {
				t.Fatal("prepared")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not say %q", err, w)
				}
			}
			if s.Set() != nil {
				t.Error("a refused configuration was put in force")
			}
		})
	}
}
