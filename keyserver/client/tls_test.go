package client

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tiergate/tiergate/keyserver/protocol"
)

// TestTLSHandshakes runs real crypto/tls handshakes whose server certificate's private
// key is a RemoteKey.
func TestTLSHandshakes(t *testing.T) {
	ks := testKeys()
	r := newResponder(t, ks.rsa, ks.p256, ks.ed)
	c := newClient(t, Config{}, r)
	ca := sharedPKI().ca
	const host = "www.example.test"

	for _, tc := range []struct {
		name    string
		key     crypto.Signer
		version uint16
		suite   uint16 // TLS 1.2 only
		op      protocol.Op
	}{
		{"TLS1.3 RSA-PSS", ks.rsa, tls.VersionTLS13, 0, protocol.OpRSASignPSS},
		{"TLS1.3 ECDSA", ks.p256, tls.VersionTLS13, 0, protocol.OpECDSASign},
		{"TLS1.3 Ed25519", ks.ed, tls.VersionTLS13, 0, protocol.OpEd25519Sign},
		{"TLS1.2 ECDHE-RSA", ks.rsa, tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, protocol.OpRSASignPSS},
		{"TLS1.2 ECDHE-ECDSA", ks.p256, tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, protocol.OpECDSASign},
		{"TLS1.2 RSA key exchange", ks.rsa, tls.VersionTLS12, tls.TLS_RSA_WITH_AES_128_GCM_SHA256, protocol.OpRSADecrypt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key, err := c.Key(ctx, keyID(t, tc.key))
			if err != nil {
				t.Fatal(err)
			}
			_, der, err := ca.Issue(host, tc.key.Public(), host)
			if err != nil {
				t.Fatal(err)
			}
			cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
			if _, isRSA := tc.key.(*rsa.PrivateKey); !isRSA && tc.version == tls.VersionTLS12 {
				// crypto/tls refuses a non-RSA crypto.Decrypter in TLS 1.2.
				if cert, err = c.TLSCertificate([][]byte{der}); err != nil {
					t.Fatal(err)
				}
			}
			serverCfg := &tls.Config{
				Certificates: []tls.Certificate{cert},
				MinVersion:   tc.version,
				MaxVersion:   tc.version,
			}
			clientCfg := &tls.Config{RootCAs: ca.Pool(), ServerName: host, MinVersion: tc.version, MaxVersion: tc.version}
			if tc.suite != 0 {
				serverCfg.CipherSuites = []uint16{tc.suite}
				clientCfg.CipherSuites = []uint16{tc.suite}
			}
			before := r.ops[tc.op].Load()

			cc, sc := net.Pipe()
			defer cc.Close()
			defer sc.Close()
			deadline := time.Now().Add(10 * time.Second)
			cc.SetDeadline(deadline)
			sc.SetDeadline(deadline)
			srv := tls.Server(sc, serverCfg)
			serverErr := make(chan error, 1)
			go func() {
				if err := srv.Handshake(); err != nil {
					serverErr <- err
					return
				}
				buf := make([]byte, 5)
				if _, err := io.ReadFull(srv, buf); err != nil {
					serverErr <- err
					return
				}
				_, err := srv.Write(buf)
				serverErr <- err
			}()
			cli := tls.Client(cc, clientCfg)
			if err := cli.Handshake(); err != nil {
				t.Fatalf("client handshake: %v (server: %v)", err, <-serverErr)
			}
			if _, err := cli.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 5)
			if _, err := io.ReadFull(cli, buf); err != nil || string(buf) != "hello" {
				t.Fatalf("echo over the TLS connection: %q, %v", buf, err)
			}
			if err := <-serverErr; err != nil {
				t.Fatalf("server: %v", err)
			}
			st := cli.ConnectionState()
			if st.Version != tc.version || (tc.suite != 0 && st.CipherSuite != tc.suite) {
				t.Errorf("negotiated %s %s", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))
			}
			if got := r.ops[tc.op].Load() - before; got != 1 {
				t.Errorf("the keyserver served %d %s requests for the handshake, want 1", got, tc.op)
			}
		})
	}
}
