package certs

import (
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"testing"
)

// Client hellos built by hand, as crypto/tls's own tests do.
var (
	// helloModern is a TLS 1.3 client that takes any key type.
	helloModern = tls.ClientHelloInfo{
		SupportedVersions: []uint16{tls.VersionTLS13, tls.VersionTLS12},
		SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256, tls.Ed25519, tls.PSSWithSHA256, tls.PKCS1WithSHA256},
		CipherSuites: []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
		SupportedCurves: []tls.CurveID{tls.X25519, tls.CurveP256},
		SupportedPoints: []uint8{0},
	}
	// helloRSA12 is a TLS 1.2 client with only ECDHE-RSA cipher suites.
	helloRSA12 = tls.ClientHelloInfo{
		SupportedVersions: []uint16{tls.VersionTLS12},
		SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256, tls.PSSWithSHA256, tls.PKCS1WithSHA256},
		CipherSuites:      []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
		SupportedCurves:   []tls.CurveID{tls.X25519, tls.CurveP256},
		SupportedPoints:   []uint8{0},
	}
	// helloRSASigs13 is a TLS 1.3 client that verifies only RSA-PSS signatures.
	helloRSASigs13 = tls.ClientHelloInfo{
		SupportedVersions: []uint16{tls.VersionTLS13},
		SignatureSchemes:  []tls.SignatureScheme{tls.PSSWithSHA256},
		CipherSuites:      []uint16{tls.TLS_AES_128_GCM_SHA256},
		SupportedCurves:   []tls.CurveID{tls.X25519},
	}
	// helloECDSA12 is a TLS 1.2 client with only ECDHE-ECDSA cipher suites.
	helloECDSA12 = tls.ClientHelloInfo{
		SupportedVersions: []uint16{tls.VersionTLS12},
		SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256, tls.PKCS1WithSHA256},
		CipherSuites:      []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
		SupportedCurves:   []tls.CurveID{tls.CurveP256},
		SupportedPoints:   []uint8{0},
	}
	// helloP384Only is a TLS 1.2 client that supports neither the ECDSA P-256 key
	// (curve) nor RSA (cipher suites): nothing fits.
	helloP384Only = tls.ClientHelloInfo{
		SupportedVersions: []uint16{tls.VersionTLS12},
		SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP384AndSHA384},
		CipherSuites:      []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
		SupportedCurves:   []tls.CurveID{tls.CurveP384},
		SupportedPoints:   []uint8{0},
	}
)

// localConn is a net.Conn that only knows its local address.
type localConn struct {
	net.Conn
	addr net.Addr
}

func (c localConn) LocalAddr() net.Addr { return c.addr }

func TestSelect(t *testing.T) {
	p := newPKI(t)
	rsaK := rsaKey(t, 0)
	certs := []*Cert{
		// RSA configured before ECDSA for the same name: ECDSA must still win when
		// the client takes both.
		p.memCert(t, "www-rsa", rsaK, "www.example.com", "both.example.com"),
		p.memCert(t, "www-ec", ecKey(t), "www.example.com", "both.example.com"),
		p.memCert(t, "wild", ecKey(t), "*.example.com"),
		p.memCert(t, "api", ecKey(t), "API.example.com."),
		p.memCert(t, "ip", ecKey(t), "192.0.2.10", "2001:db8::10"),
		p.memCert(t, "ed", edKey(t), "ed.example.org"),
		p.memCert(t, "ed-rsa", rsaK, "ed.example.org"),
		p.memCert(t, "fallback", ecKey(t), "default.example.net"),
	}
	withDefault := newSet(certs, "fallback")
	noDefault := newSet(certs, "")

	hello := func(base tls.ClientHelloInfo, name string) *tls.ClientHelloInfo {
		base.ServerName = name
		return &base
	}
	fromIP := func(ip string) *tls.ClientHelloInfo {
		h := helloModern
		h.Conn = localConn{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 443}}
		return &h
	}
	fromUDP := func(ip string) *tls.ClientHelloInfo {
		h := helloModern
		h.Conn = localConn{addr: &net.UDPAddr{IP: net.ParseIP(ip), Port: 443}}
		return &h
	}

	tests := []struct {
		name  string
		set   *Set
		hello *tls.ClientHelloInfo
		want  string // certificate name; "" means ErrNoCertificate
	}{
		{"exact, ECDSA preferred", withDefault, hello(helloModern, "www.example.com"), "www-ec"},
		{"exact, RSA-only TLS 1.2 cipher suites", withDefault, hello(helloRSA12, "www.example.com"), "www-rsa"},
		{"exact, RSA-only TLS 1.3 signatures", withDefault, hello(helloRSASigs13, "both.example.com"), "www-rsa"},
		{"exact, ECDSA-only TLS 1.2", withDefault, hello(helloECDSA12, "both.example.com"), "www-ec"},
		{"exact, nothing supported: first configured", withDefault, hello(helloP384Only, "www.example.com"), "www-rsa"},
		{"Ed25519 before RSA", withDefault, hello(helloModern, "ed.example.org"), "ed"},
		{"Ed25519 unsupported", withDefault, hello(helloRSASigs13, "ed.example.org"), "ed-rsa"},
		{"upper case", withDefault, hello(helloModern, "WWW.Example.COM"), "www-ec"},
		{"trailing dot", withDefault, hello(helloModern, "www.example.com."), "www-ec"},
		{"name normalised in the certificate", withDefault, hello(helloModern, "api.example.com"), "api"},
		{"exact beats wildcard", withDefault, hello(helloModern, "api.example.com"), "api"},
		{"wildcard, one label", withDefault, hello(helloModern, "a.example.com"), "wild"},
		{"wildcard, upper case and dot", withDefault, hello(helloModern, "A.EXAMPLE.com."), "wild"},
		{"wildcard, two labels: default", withDefault, hello(helloModern, "a.b.example.com"), "fallback"},
		{"wildcard, bare domain: default", withDefault, hello(helloModern, "example.com"), "fallback"},
		{"wildcard, empty label: default", withDefault, hello(helloModern, ".example.com"), "fallback"},
		{"no match: default", withDefault, hello(helloModern, "unknown.test"), "fallback"},
		{"no SNI, no address: default", withDefault, hello(helloModern, ""), "fallback"},
		{"no SNI: local IPv4 address", withDefault, fromIP("192.0.2.10"), "ip"},
		{"no SNI: local IPv4-mapped address", withDefault, fromIP("::ffff:192.0.2.10"), "ip"},
		{"no SNI: local IPv6 address over UDP", withDefault, fromUDP("2001:db8::10"), "ip"},
		{"no SNI: other address: default", withDefault, fromIP("192.0.2.11"), "fallback"},
		{"IP literal as SNI", withDefault, hello(helloModern, "192.0.2.10"), "ip"},
		{"no match, no default", noDefault, hello(helloModern, "unknown.test"), ""},
		{"no SNI, no default", noDefault, hello(helloModern, ""), ""},
		{"no default, wildcard two labels", noDefault, hello(helloModern, "a.b.example.com"), ""},
		{"no default, exact still works", noDefault, hello(helloModern, "www.example.com"), "www-ec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.set.Select(tt.hello)
			if tt.want == "" {
				if !errors.Is(err, ErrNoCertificate) {
					t.Fatalf("Select = %v, %v; want ErrNoCertificate", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != tt.want {
				t.Fatalf("Select chose %q, want %q", got.Name, tt.want)
			}
		})
	}
}

func TestGetCertificateBeforeLoad(t *testing.T) {
	s := NewStore(Options{Logger: quietLog})
	if _, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: "a.example"}); !errors.Is(err, ErrNoCertificate) {
		t.Fatalf("GetCertificate before Load = %v, want ErrNoCertificate", err)
	}
	if s.Set() != nil {
		t.Fatal("Set before Load is not nil")
	}
}

func TestSelectAllocations(t *testing.T) {
	p := newPKI(t)
	set := newSet([]*Cert{
		p.memCert(t, "a", ecKey(t), "a.example.com"),
		p.memCert(t, "wild", ecKey(t), "*.example.com"),
	}, "a")
	for _, name := range []string{"a.example.com", "A.Example.COM.", "b.example.com", "nothing.test", ""} {
		h := helloModern
		h.ServerName = name
		if n := testing.AllocsPerRun(100, func() { set.Select(&h) }); n != 0 {
			t.Errorf("Select(%q) allocates %v times", name, n)
		}
	}
}

func BenchmarkGetCertificate(b *testing.B) {
	p := newPKI(b)
	var certs []*Cert
	for i := range 1000 {
		certs = append(certs, p.memCert(b, "c"+strconv.Itoa(i), ecKey(b), "host"+strconv.Itoa(i)+".example.com"))
	}
	certs = append(certs, p.memCert(b, "wild", ecKey(b), "*.example.org"))
	s := NewStore(Options{Logger: quietLog})
	s.set.Store(newSet(certs, ""))
	for _, bc := range []struct{ name, sni string }{
		{"exact", "host500.example.com"},
		{"wildcard", "x.example.org"},
		{"upper case", "HOST500.example.com"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := helloModern
			h.ServerName = bc.sni
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.GetCertificate(&h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
