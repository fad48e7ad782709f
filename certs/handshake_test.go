package certs

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/tls"
	"testing"
)

// clientConfig trusts p's root and asks for name.
func (p *pki) clientConfig(name string) *tls.Config {
	return &tls.Config{RootCAs: p.root.Pool(), ServerName: name, NextProtos: []string{"h2"}}
}

func TestHandshakes(t *testing.T) {
	p := newPKI(t)
	rsaK := rsaKey(t, 0)
	ks := startKeyserver(t, rsaK)
	dir := t.TempDir()
	ec := p.files(t, dir, "ec", leafSpec{cn: "ec", names: []string{"ec.example.com", "both.example.com"}, key: ecKey(t)}, false)
	remote := p.files(t, dir, "rsa", leafSpec{cn: "rsa", names: []string{"rsa.example.com", "both.example.com"}, key: rsaK}, true)
	cfg := Config{Certificates: []CertConfig{remote, ec}}

	store := NewStore(Options{KeyServer: ks.client, Logger: quietLog})
	loadOK(t, store, cfg)
	srv := startTLSServer(t, store)

	tests := []struct {
		name    string
		sni     string
		tweak   func(*tls.Config)
		wantKey string
	}{
		{"TLS 1.3 ECDSA name", "ec.example.com", nil, KeyECDSA},
		{"TLS 1.3 remote RSA name", "rsa.example.com", nil, KeyRSA},
		{"TLS 1.3 both: ECDSA preferred", "both.example.com", nil, KeyECDSA},
		{"TLS 1.2 both, ECDHE-RSA only: remote RSA", "both.example.com", func(c *tls.Config) {
			c.MaxVersion = tls.VersionTLS12
			c.CipherSuites = []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}
		}, KeyRSA},
		{"TLS 1.2 both, ECDHE-ECDSA only", "both.example.com", func(c *tls.Config) {
			c.MaxVersion = tls.VersionTLS12
			c.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}
		}, KeyECDSA},
		{"TLS 1.2 remote RSA name", "rsa.example.com", func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }, KeyRSA},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cc := p.clientConfig(tt.sni)
			if tt.tweak != nil {
				tt.tweak(cc)
			}
			before := ks.ops.Load()
			c, err := dial(t, srv.addr, cc)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st := c.ConnectionState()
			if st.NegotiatedProtocol != "h2" {
				t.Errorf("ALPN %q, want h2 (set on the clone)", st.NegotiatedProtocol)
			}
			var got string
			switch st.PeerCertificates[0].PublicKey.(type) {
			case *ecdsa.PublicKey:
				got = KeyECDSA
			case *rsa.PublicKey:
				got = KeyRSA
			}
			if got != tt.wantKey {
				t.Fatalf("served a %s certificate, want %s", got, tt.wantKey)
			}
			ops := ks.ops.Load() - before
			if tt.wantKey == KeyRSA && ops != 1 {
				t.Errorf("remote RSA handshake made %d keyserver operations, want 1", ops)
			}
			if tt.wantKey == KeyECDSA && ops != 0 {
				t.Errorf("local ECDSA handshake made %d keyserver operations", ops)
			}
		})
	}

	if _, err := dial(t, srv.addr, p.clientConfig("unknown.example.com")); err == nil {
		t.Fatal("handshake for an unknown name without a default succeeded")
	}

	t.Run("reload", func(t *testing.T) {
		old, err := dial(t, srv.addr, p.clientConfig("rsa.example.com"))
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		if _, err := dial(t, srv.addr, p.clientConfig("new.example.com")); err == nil {
			t.Fatal("new name served before the reload")
		}
		added := p.files(t, t.TempDir(), "new", leafSpec{cn: "new", names: []string{"new.example.com"}, key: ecKey(t)}, false)
		cfg2 := Config{Certificates: []CertConfig{ec, added}, Default: "new"} // rsa removed
		loadOK(t, store, cfg2)
		c, err := dial(t, srv.addr, p.clientConfig("new.example.com"))
		if err != nil {
			t.Fatalf("new name after reload: %v", err)
		}
		c.Close()
		// The removed name now falls to the new default, which does not cover it.
		if _, err := dial(t, srv.addr, p.clientConfig("rsa.example.com")); err == nil {
			t.Fatal("removed certificate still served")
		}
		for range 3 {
			if err := echo(old); err != nil {
				t.Fatalf("connection made before the reload broke: %v", err)
			}
		}
		if st := old.ConnectionState(); st.PeerCertificates[0].Subject.CommonName != "rsa" {
			t.Fatal("old connection changed certificate")
		}
	})

	t.Run("IP address certificate without SNI", func(t *testing.T) {
		ipCert := p.files(t, t.TempDir(), "ip", leafSpec{cn: "ip", names: []string{"127.0.0.1"}, key: ecKey(t)}, false)
		loadOK(t, store, Config{Certificates: []CertConfig{ec, ipCert}})
		c, err := dial(t, srv.addr, p.clientConfig("127.0.0.1")) // Go sends no SNI for an IP
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if cn := c.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "ip" {
			t.Fatalf("served %q", cn)
		}
	})
}
