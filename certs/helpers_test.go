package certs

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tiergate/tiergate/keyserver"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/softkey"
	"github.com/tiergate/tiergate/testkit/testpki"
)

var quietLog = slog.New(slog.DiscardHandler)

var (
	rsaOnce sync.Once
	rsaKeys [2]*rsa.PrivateKey
)

// rsaKey returns one of two RSA-2048 keys generated once per test binary.
func rsaKey(t testing.TB, i int) *rsa.PrivateKey {
	t.Helper()
	rsaOnce.Do(func() {
		for j := range rsaKeys {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			rsaKeys[j] = k
		}
	})
	return rsaKeys[i]
}

func ecKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func edKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// pki is a root CA and an intermediate that issues the leaves.
type pki struct {
	root     *testpki.CA
	inter    *x509.Certificate
	interKey crypto.Signer
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	root, err := testpki.NewCA("certs test root")
	if err != nil {
		t.Fatal(err)
	}
	key := ecKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(2),
		Subject:               pkix.Name{CommonName: "certs test intermediate"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root.Cert, key.Public(), root.Key)
	if err != nil {
		t.Fatal(err)
	}
	inter, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &pki{root: root, inter: inter, interKey: key}
}

// leafSpec describes a leaf certificate; zero times mean an hour ago and a day ahead.
type leafSpec struct {
	cn        string
	names     []string // DNS names, or IP addresses
	key       crypto.Signer
	notBefore time.Time
	notAfter  time.Time
	eku       []x509.ExtKeyUsage // default server auth
}

var serial atomic.Int64

// leaf issues a leaf from the intermediate and returns it with its DER.
func (p *pki) leaf(t testing.TB, s leafSpec) (*x509.Certificate, []byte) {
	t.Helper()
	if s.notBefore.IsZero() {
		s.notBefore = time.Now().Add(-time.Hour)
	}
	if s.notAfter.IsZero() {
		s.notAfter = time.Now().Add(24 * time.Hour)
	}
	if s.eku == nil {
		s.eku = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(100 + serial.Add(1)),
		Subject:      pkix.Name{CommonName: s.cn},
		NotBefore:    s.notBefore,
		NotAfter:     s.notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  s.eku,
	}
	if _, ok := s.key.Public().(*rsa.PublicKey); ok {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	for _, n := range s.names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.inter, s.key.Public(), p.interKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, der
}

func pemOf(typ string, ders ...[]byte) []byte {
	var out []byte
	for _, d := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: d})...)
	}
	return out
}

func keyPEM(t testing.TB, key crypto.PrivateKey) []byte {
	t.Helper()
	b, err := testpki.KeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t testing.TB, path string, data []byte) string {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// files writes the chain (leaf, intermediate) of s to dir/name.pem and, unless
// remote, its key to dir/name.key, and returns the matching CertConfig.
func (p *pki) files(t testing.TB, dir, name string, s leafSpec, remote bool) CertConfig {
	t.Helper()
	_, der := p.leaf(t, s)
	cc := CertConfig{Name: name, CertFile: writeFile(t, filepath.Join(dir, name+".pem"), pemOf("CERTIFICATE", der, p.inter.Raw))}
	if !remote {
		cc.KeyFile = writeFile(t, filepath.Join(dir, name+".key"), keyPEM(t, s.key))
	}
	return cc
}

// memCert builds a Cert in memory (no files) for index tests.
func (p *pki) memCert(t testing.TB, name string, key crypto.Signer, names ...string) *Cert {
	t.Helper()
	leaf, der := p.leaf(t, leafSpec{cn: name, names: names, key: key})
	kt, err := keyTypeOf(leaf.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	chain := [][]byte{der, p.inter.Raw}
	return &Cert{
		Name: name, Leaf: leaf, Chain: chain, KeyType: kt, Names: namesOf(leaf), NotAfter: leaf.NotAfter,
		TLS: &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf},
	}
}

// ksFixture is an in-process keyserver with software keys and a client of it.
type ksFixture struct {
	srv    *keyserver.Server
	client *client.Client
	ops    atomic.Int64 // private-key operations performed by the backend
}

func startKeyserver(t testing.TB, keys ...crypto.PrivateKey) *ksFixture {
	t.Helper()
	f := &ksFixture{}
	soft, err := softkey.New(softkey.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := soft.Import("k", k); err != nil {
			t.Fatal(err)
		}
	}
	serverCA, err := testpki.NewCA("keyserver CA")
	if err != nil {
		t.Fatal(err)
	}
	clientCA, err := testpki.NewCA("l7 CA")
	if err != nil {
		t.Fatal(err)
	}
	serverCert, err := serverCA.Leaf("keyserver", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := clientCA.Leaf("l7")
	if err != nil {
		t.Fatal(err)
	}
	f.srv, err = keyserver.NewServer(keyserver.Config{
		Addr:     "127.0.0.1:0",
		TLS:      &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: clientCA.Pool()},
		Backends: []backend.Backend{countingBackend{soft, &f.ops}},
		Clients:  []keyserver.ClientRule{{Name: "l7", Keys: []string{"*"}, Ops: []string{"*"}}},
		Logger:   quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.srv.Shutdown(ctx)
	})
	f.client, err = client.New(client.Config{
		Servers: []string{f.srv.Addr().String()},
		TLS:     &tls.Config{Certificates: []tls.Certificate{clientCert}, RootCAs: serverCA.Pool()},
		Logger:  quietLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.client.Close() })
	return f
}

// countingBackend counts the private-key operations of a backend's keys.
type countingBackend struct {
	backend.Backend
	ops *atomic.Int64
}

func (b countingBackend) Keys() ([]*backend.Key, error) {
	keys, err := b.Backend.Keys()
	out := make([]*backend.Key, len(keys))
	for i, k := range keys {
		kk := *k
		cs := &countingSigner{Signer: k.Signer, ops: b.ops}
		if _, ok := k.Signer.(crypto.Decrypter); ok {
			kk.Signer = countingDecrypter{cs}
		} else {
			kk.Signer = cs
		}
		out[i] = &kk
	}
	return out, err
}

type countingSigner struct {
	crypto.Signer
	ops *atomic.Int64
}

func (s *countingSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	s.ops.Add(1)
	return s.Signer.Sign(r, digest, opts)
}

type countingDecrypter struct{ *countingSigner }

func (d countingDecrypter) Decrypt(r io.Reader, ct []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	d.ops.Add(1)
	return d.Signer.(crypto.Decrypter).Decrypt(r, ct, opts)
}

// tlsServer serves TLS with a clone of a Store's config (with ALPN) and echoes lines.
type tlsServer struct {
	ln    net.Listener
	addr  string
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startTLSServer(t testing.TB, store *Store) *tlsServer {
	t.Helper()
	return serveTLS(t, store.TLSConfig())
}

// serveTLS is startTLSServer over a clone of base.
func serveTLS(t testing.TB, base *tls.Config) *tlsServer {
	t.Helper()
	cfg := base.Clone()
	cfg.NextProtos = []string{"h2", "http/1.1"}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &tlsServer{ln: ln, addr: ln.Addr().String()}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// dial connects to s as name and does one echo round trip (which, in TLS 1.3, also
// takes in the server's session tickets).
func dial(t testing.TB, addr string, cfg *tls.Config) (*tls.Conn, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	if err := echo(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func echo(c *tls.Conn) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return errors.New("bad echo " + line)
	}
	return nil
}
