package certs

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLoadRejections(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	good := p.files(t, dir, "good", leafSpec{cn: "good.example.com", names: []string{"good.example.com"}, key: ecKey(t)}, false)

	spec := func(name string) leafSpec {
		return leafSpec{cn: name + ".example.com", names: []string{name + ".example.com"}, key: ecKey(t)}
	}
	tests := []struct {
		name    string
		make    func(t *testing.T, dir string) CertConfig
		wantErr string
	}{
		{"wrong order", func(t *testing.T, dir string) CertConfig {
			s := spec("order")
			_, der := p.leaf(t, s)
			return CertConfig{
				CertFile: writeFile(t, filepath.Join(dir, "order.pem"), pemOf("CERTIFICATE", p.inter.Raw, der)),
				KeyFile:  writeFile(t, filepath.Join(dir, "order.key"), keyPEM(t, s.key)),
			}
		}, "wrong chain order"},
		{"broken signature", func(t *testing.T, dir string) CertConfig {
			s := spec("broken")
			_, der := p.leaf(t, s)
			der = bytes.Clone(der)
			der[len(der)-1] ^= 1
			return CertConfig{
				CertFile: writeFile(t, filepath.Join(dir, "broken.pem"), pemOf("CERTIFICATE", der, p.inter.Raw)),
				KeyFile:  writeFile(t, filepath.Join(dir, "broken.key"), keyPEM(t, s.key)),
			}
		}, "does not verify"},
		{"key not matching", func(t *testing.T, dir string) CertConfig {
			cc := p.files(t, dir, "mismatch", spec("mismatch"), false)
			writeFile(t, cc.KeyFile, keyPEM(t, ecKey(t)))
			return cc
		}, "does not match the certificate"},
		{"expired", func(t *testing.T, dir string) CertConfig {
			s := spec("expired")
			s.notBefore, s.notAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
			return p.files(t, dir, "expired", s, false)
		}, "expired at"},
		{"not yet valid", func(t *testing.T, dir string) CertConfig {
			s := spec("future")
			s.notBefore = time.Now().Add(time.Hour)
			return p.files(t, dir, "future", s, false)
		}, "not valid before"},
		{"missing file", func(t *testing.T, dir string) CertConfig {
			return CertConfig{CertFile: filepath.Join(dir, "missing.pem"), KeyFile: good.KeyFile}
		}, "no such file"},
		{"missing key file", func(t *testing.T, dir string) CertConfig {
			cc := p.files(t, dir, "nokey", spec("nokey"), false)
			os.Remove(cc.KeyFile)
			return cc
		}, "key file"},
		{"garbage PEM", func(t *testing.T, dir string) CertConfig {
			return CertConfig{CertFile: writeFile(t, filepath.Join(dir, "garbage.pem"), []byte("-----BEGIN CERTIFICATE-----\nnot base64!\n")), KeyFile: good.KeyFile}
		}, "no PEM certificate found"},
		{"garbage key", func(t *testing.T, dir string) CertConfig {
			cc := p.files(t, dir, "badkey", spec("badkey"), false)
			writeFile(t, cc.KeyFile, []byte("nothing"))
			return cc
		}, "no PEM private key"},
		{"client-only certificate", func(t *testing.T, dir string) CertConfig {
			s := spec("client")
			s.eku = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
			return p.files(t, dir, "client", s, false)
		}, "server authentication"},
		{"remote key without a keyserver", func(t *testing.T, dir string) CertConfig {
			return p.files(t, dir, "remote", spec("remote"), true)
		}, "no keyserver is configured"},
		{"duplicate name", func(t *testing.T, dir string) CertConfig {
			cc := p.files(t, dir, "dup", spec("dup"), false)
			cc.Name = "good"
			return cc
		}, `another certificate is named "good"`},
		{"no cert_file", func(t *testing.T, dir string) CertConfig {
			return CertConfig{Name: "empty"}
		}, "cert_file is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := tt.make(t, t.TempDir())
			s := NewStore(Options{Logger: quietLog})
			rep, err := s.Load(Config{Certificates: []CertConfig{good, bad}})
			if err != nil {
				t.Fatalf("Load failed for one bad certificate: %v", err)
			}
			if !slices.Equal(rep.Loaded, []string{"good"}) {
				t.Errorf("Loaded = %q, want [good]", rep.Loaded)
			}
			if len(rep.Rejected) != 1 {
				t.Fatalf("Rejected = %v, want one", rep.Rejected)
			}
			r := rep.Rejected[0]
			msg := r.Err.Error()
			wantName := bad.Name
			if wantName == "" {
				wantName = strings.TrimSuffix(filepath.Base(bad.CertFile), ".pem")
			}
			if r.Name != wantName || !strings.Contains(msg, `"`+wantName+`"`) {
				t.Errorf("rejection %q is not named %q", msg, wantName)
			}
			if bad.CertFile != "" && !strings.Contains(msg, bad.CertFile) {
				t.Errorf("rejection %q does not name the file %s", msg, bad.CertFile)
			}
			if !strings.Contains(msg, tt.wantErr) {
				t.Errorf("rejection %q does not contain %q", msg, tt.wantErr)
			}
			if c := s.Set().Cert("good"); c == nil || c.KeyType != KeyECDSA || c.Remote {
				t.Errorf("good certificate not served properly: %+v", c)
			}
		})
	}
}

// loadOK loads cfg into s and fails the test on any error or rejection.
func loadOK(t *testing.T, s *Store, cfg Config) *Set {
	t.Helper()
	rep, err := s.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rejected) > 0 {
		t.Fatalf("rejected: %v", rep.Rejected)
	}
	return s.Set()
}

func TestLoadFailureKeepsOldSet(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	good := p.files(t, dir, "good", leafSpec{cn: "good", names: []string{"good.example.com"}, key: ecKey(t)}, false)
	expired := p.files(t, dir, "expired", leafSpec{cn: "expired", names: []string{"expired.example.com"}, key: ecKey(t),
		notBefore: time.Now().Add(-48 * time.Hour), notAfter: time.Now().Add(-time.Hour)}, false)
	garbage := CertConfig{CertFile: writeFile(t, filepath.Join(dir, "garbage.pem"), []byte("junk"))}
	k1 := randomKey(t)
	keyFile := writeFile(t, filepath.Join(dir, "ticket1"), k1[:])
	badKeyFile := writeFile(t, filepath.Join(dir, "ticket-bad"), []byte("short"))

	s := NewStore(Options{Logger: quietLog})
	old := loadOK(t, s, Config{Certificates: []CertConfig{good}, Default: "good", TicketKeyFiles: []string{keyFile}})

	tests := []struct {
		name    string
		cfg     Config
		wantErr string
		wantRej int
	}{
		{"all bad", Config{Certificates: []CertConfig{expired, garbage}}, "no certificate could be loaded", 2},
		{"nothing configured", Config{}, "no certificate is configured", 0},
		{"default rejected", Config{Certificates: []CertConfig{good, expired}, Default: "expired"}, "default certificate was rejected", 1},
		{"default missing", Config{Certificates: []CertConfig{good}, Default: "nope"}, `default certificate "nope" is not configured`, 0},
		{"bad ticket key", Config{Certificates: []CertConfig{good}, TicketKeyFiles: []string{badKeyFile}}, "ticket key file", 0},
		{"missing ticket key", Config{Certificates: []CertConfig{good}, TicketKeyFiles: []string{keyFile, filepath.Join(dir, "nokey")}}, "no such file", 0},
		{"unreadable dir", Config{Dir: filepath.Join(dir, "nodir")}, "reading certificate directory", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := s.Load(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Load error = %v, want one containing %q", err, tt.wantErr)
			}
			if rep == nil || len(rep.Rejected) != tt.wantRej {
				t.Errorf("report = %+v, want %d rejections", rep, tt.wantRej)
			}
			if s.Set() != old {
				t.Fatal("a failed Load replaced the set")
			}
			if s.TicketKeys() != 1 {
				t.Fatal("a failed Load changed the ticket keys")
			}
			if c, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: "good.example.com"}); err != nil || c != old.Cert("good").TLS {
				t.Fatalf("old set not served: %v", err)
			}
		})
	}
}

func TestLoadDir(t *testing.T) {
	p := newPKI(t)
	rsaK := rsaKey(t, 0)
	ks := startKeyserver(t, rsaK)
	dir := t.TempDir()
	p.files(t, dir, "local", leafSpec{cn: "local", names: []string{"local.example.com"}, key: ecKey(t)}, false)
	p.files(t, dir, "remote", leafSpec{cn: "remote", names: []string{"remote.example.com"}, key: rsaK}, true)
	p.files(t, dir, ".hidden", leafSpec{cn: "hidden", names: []string{"hidden.example.com"}, key: ecKey(t)}, false)
	writeFile(t, filepath.Join(dir, "README.txt"), []byte("not a certificate"))
	if err := os.Mkdir(filepath.Join(dir, "sub.pem"), 0o700); err != nil {
		t.Fatal(err)
	}
	combined := p.files(t, dir, "combined", leafSpec{cn: "combined", names: []string{"combined.example.com"}, key: ecKey(t)}, false)
	chainPEM, _ := os.ReadFile(combined.CertFile)
	keyData, _ := os.ReadFile(combined.KeyFile)
	writeFile(t, combined.CertFile, append(keyData, chainPEM...))
	os.Remove(combined.KeyFile)
	listed := p.files(t, t.TempDir(), "listed", leafSpec{cn: "listed", names: []string{"listed.example.com"}, key: ecKey(t)}, false)
	listed.Name = ""

	s := NewStore(Options{KeyServer: ks.client, Logger: quietLog})
	set := loadOK(t, s, Config{Certificates: []CertConfig{listed}, Dir: dir, Default: "remote"})
	var names []string
	for _, c := range set.Certs() {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"listed", "combined", "local", "remote"}) {
		t.Fatalf("loaded %q, want [listed combined local remote]", names)
	}
	if c := set.Cert("combined"); c.Remote || c.KeyFile != c.CertFile {
		t.Errorf("combined: %+v", c)
	}
	local, remote := set.Cert("local"), set.Cert("remote")
	if local.Remote || local.KeyType != KeyECDSA || local.KeyFile != filepath.Join(dir, "local.key") {
		t.Errorf("local: %+v", local)
	}
	if !remote.Remote || remote.KeyType != KeyRSA || remote.KeyFile != "" {
		t.Errorf("remote: %+v", remote)
	}
	if set.Default() != remote {
		t.Error("default is not the remote certificate")
	}
	if len(remote.Chain) != 2 || !slices.Equal(remote.Names, []string{"remote.example.com"}) {
		t.Errorf("remote chain of %d, names %q", len(remote.Chain), remote.Names)
	}
	if _, ok := remote.TLS.PrivateKey.(crypto.Decrypter); !ok {
		t.Error("remote RSA key is not a crypto.Decrypter")
	}
}

func TestLoadRemoteKeys(t *testing.T) {
	p := newPKI(t)
	rsaK, ec := rsaKey(t, 0), ecKey(t)
	ks := startKeyserver(t, rsaK, ec)
	dir := t.TempDir()
	rsaCert := p.files(t, dir, "rsa", leafSpec{cn: "rsa", names: []string{"rsa.example.com"}, key: rsaK}, true)
	ecCert := p.files(t, dir, "ec", leafSpec{cn: "ec", names: []string{"ec.example.com"}, key: ec}, true)
	unknown := p.files(t, dir, "unknown", leafSpec{cn: "unknown", names: []string{"unknown.example.com"}, key: rsaKey(t, 1)}, true)

	s := NewStore(Options{KeyServer: ks.client, Logger: quietLog, KeyTimeout: 2 * time.Second})
	rep, err := s.Load(Config{Certificates: []CertConfig{rsaCert, ecCert, unknown}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Loaded, []string{"rsa", "ec"}) || len(rep.Rejected) != 1 || rep.Rejected[0].Name != "unknown" {
		t.Fatalf("report: %+v", rep)
	}
	if msg := rep.Rejected[0].Err.Error(); !strings.Contains(msg, "keyservers do not serve key") || !strings.Contains(msg, unknown.CertFile) {
		t.Errorf("rejection: %s", msg)
	}
	ecc := s.Set().Cert("ec")
	if _, ok := ecc.TLS.PrivateKey.(crypto.Decrypter); ok {
		t.Error("remote ECDSA key is a crypto.Decrypter: crypto/tls would refuse it in TLS 1.2")
	}
	if _, ok := ecc.TLS.PrivateKey.(crypto.Signer); !ok || !ecc.Remote {
		t.Error("remote ECDSA key is not a remote crypto.Signer")
	}
	// A key lookup that cannot reach any keyserver is a rejection after the timeout,
	// not a failure of the whole load.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ks.srv.Shutdown(ctx)
	s2 := NewStore(Options{KeyServer: ks.client, Logger: quietLog, KeyTimeout: 300 * time.Millisecond})
	local := p.files(t, dir, "local", leafSpec{cn: "local", names: []string{"local.example.com"}, key: ecKey(t)}, false)
	start := time.Now()
	rep, err = s2.Load(Config{Certificates: []CertConfig{local, rsaCert}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rejected) != 1 || rep.Rejected[0].Name != "rsa" {
		t.Fatalf("report with keyserver down: %+v", rep)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("load with keyserver down took %v", d)
	}
}

// TestConcurrentReload serves handshakes' certificate lookups while the set is
// reloaded (run with -race).
func TestConcurrentReload(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	a := p.files(t, dir, "a", leafSpec{cn: "a", names: []string{"a.example.com"}, key: ecKey(t)}, false)
	b := p.files(t, dir, "b", leafSpec{cn: "b", names: []string{"b.example.com"}, key: ecKey(t)}, false)
	s := NewStore(Options{Logger: quietLog})
	loadOK(t, s, Config{Certificates: []CertConfig{a, b}, Default: "a"})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			h := helloModern
			h.ServerName = "b.example.com"
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := s.GetCertificate(&h)
				if err != nil || c == nil {
					t.Errorf("GetCertificate during reload: %v", err)
					return
				}
			}
		})
	}
	for i := range 20 {
		cfg := Config{Certificates: []CertConfig{a, b}, Default: "a"}
		if i%2 == 1 {
			cfg = Config{Certificates: []CertConfig{a}, Default: "a"}
		}
		if _, err := s.Load(cfg); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

// TestPrepareServesNothingUntilCommit: a Set and ticket keys that Prepare built are
// not served, however long the caller waits, until Commit; then both at once.
func TestPrepareServesNothingUntilCommit(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	a := p.files(t, dir, "a", leafSpec{cn: "a", names: []string{"a.example.com"}, key: ecKey(t)}, false)
	b := p.files(t, dir, "b", leafSpec{cn: "b", names: []string{"b.example.com"}, key: ecKey(t)}, false)
	k1 := randomKey(t)
	keyFile := writeFile(t, filepath.Join(dir, "ticket1"), k1[:])
	s := NewStore(Options{Logger: quietLog})
	old := loadOK(t, s, Config{Certificates: []CertConfig{a}, Default: "a"})

	prep, rep, err := s.Prepare(Config{Certificates: []CertConfig{b}, Default: "b", TicketKeyFiles: []string{keyFile}})
	if err != nil || len(rep.Loaded) != 1 || prep.Set().Cert("b") == nil {
		t.Fatalf("Prepare: %v %+v", err, rep)
	}
	if s.Set() != old || s.TicketKeys() != 0 {
		t.Fatal("Prepare changed what is served")
	}
	if c, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: "b.example.com"}); err != nil || c != old.Cert("a").TLS {
		t.Fatalf("before Commit, b.example.com gets %v, %v; want the default a", c, err)
	}
	s.Commit(prep)
	if s.Set() != prep.Set() || s.TicketKeys() != 1 {
		t.Fatal("Commit did not serve the prepared set and keys")
	}
	if _, _, err := s.Prepare(Config{Certificates: []CertConfig{b}, Default: "nope"}); err == nil || s.Set() != prep.Set() {
		t.Fatalf("a failed Prepare: %v, or it changed the set", err)
	}
}
