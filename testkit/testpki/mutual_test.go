package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"testing"
)

// TestNewMutualTLS: the files load as what they say, and a server and a client
// configured from them complete a handshake that verifies both sides.
func TestNewMutualTLS(t *testing.T) {
	dir := t.TempDir()
	m, err := NewMutualTLS(dir, "test", "keyserverd", []string{"127.0.0.1"}, "l7-node")
	if err != nil {
		t.Fatal(err)
	}
	serverCert, err := tls.LoadX509KeyPair(m.ServerCert, m.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := tls.LoadX509KeyPair(m.ClientCert, m.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := func(path string) *x509.CertPool {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(b) {
			t.Fatalf("%s holds no certificate", path)
		}
		return p
	}
	srv := &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool(m.ClientCAFile), ClientAuth: tls.RequireAndVerifyClientCert}
	cli := &tls.Config{Certificates: []tls.Certificate{clientCert}, RootCAs: pool(m.ServerCAFile), ServerName: "127.0.0.1"}
	a, b := net.Pipe()
	errc := make(chan error, 1)
	go func() {
		s := tls.Server(a, srv)
		err := s.Handshake()
		if err == nil && (len(s.ConnectionState().PeerCertificates) == 0 || s.ConnectionState().PeerCertificates[0].Subject.CommonName != "l7-node") {
			err = os.ErrInvalid
		}
		s.Close()
		errc <- err
	}()
	c := tls.Client(b, cli)
	if err := c.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	c.Close()
	if err := <-errc; err != nil {
		t.Fatalf("server handshake: %v", err)
	}

	// Without a client: no client files, the client CA still written.
	dir2 := t.TempDir()
	m2, err := NewMutualTLS(dir2, "test", "keyserverd", []string{"127.0.0.1"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if m2.ClientCert != "" || m2.ClientKey != "" || m2.ClientLeaf.Leaf != nil {
		t.Errorf("client files %q %q without a client", m2.ClientCert, m2.ClientKey)
	}
	if b, err := os.ReadFile(m2.ClientCAFile); err != nil {
		t.Error(err)
	} else if blk, _ := pem.Decode(b); blk == nil || blk.Type != "CERTIFICATE" {
		t.Errorf("%s is not a certificate", m2.ClientCAFile)
	}
	if _, err := NewMutualTLS("/nonexistent/dir", "test", "keyserverd", nil, "x"); err == nil {
		t.Error("no error writing to a missing directory")
	}
}
