package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/testkit/softhsm"
	"github.com/tiergate/tiergate/testkit/testenv"
	"github.com/tiergate/tiergate/testkit/testpki"
)

func newClient(t *testing.T, p *pki, cn string, servers ...*keyserverProc) *client.Client {
	t.Helper()
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.addr
	}
	c, err := client.New(client.Config{
		Servers:        addrs,
		TLS:            p.clientTLS(t, cn),
		RequestTimeout: config.Duration(500 * time.Millisecond),
		Timeout:        config.Duration(3 * time.Second),
		PingInterval:   config.Duration(time.Second),
		ReconnectMin:   config.Duration(50 * time.Millisecond),
		ReconnectMax:   config.Duration(500 * time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func digestOf(h crypto.Hash, s string) []byte {
	hh := h.New()
	hh.Write([]byte(s))
	return hh.Sum(nil)
}

// TestHSMKeysSignThroughKeyserverd imports every key type into a real SoftHSM2 token
// with `keyserverd import` and checks every signature keyserverd makes with crypto/*.
func TestHSMKeysSignThroughKeyserverd(t *testing.T) {
	requireSoftHSM(t)
	p := newPKI(t)
	keys := testKeys(t)
	ks := newKeyserver(t, p, keys)
	c := newClient(t, p, "l7-node", ks)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	listed, err := c.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != len(keys) {
		t.Fatalf("keyserverd lists %d keys, want %d", len(listed), len(keys))
	}
	for _, k := range keys {
		t.Run(k.name, func(t *testing.T) {
			rk, err := c.Key(ctx, k.id)
			if err != nil {
				t.Fatal(err)
			}
			if !rk.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(k.priv.Public()) {
				t.Fatal("public key from keyserverd differs from the imported key's")
			}
			for _, h := range []crypto.Hash{crypto.SHA256, crypto.SHA384, crypto.SHA512} {
				d := digestOf(h, "tiergate "+k.name)
				switch pub := k.priv.Public().(type) {
				case *rsa.PublicKey:
					sig, err := rk.Sign(rand.Reader, d, h)
					if err != nil {
						t.Fatalf("PKCS #1 v1.5 %v: %v", h, err)
					}
					if err := rsa.VerifyPKCS1v15(pub, h, d, sig); err != nil {
						t.Errorf("PKCS #1 v1.5 %v: %v", h, err)
					}
					pss := &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: h}
					sig, err = rk.Sign(rand.Reader, d, pss)
					if err != nil {
						t.Fatalf("PSS %v: %v", h, err)
					}
					if err := rsa.VerifyPSS(pub, h, d, sig, pss); err != nil {
						t.Errorf("PSS %v: %v", h, err)
					}
				case *ecdsa.PublicKey:
					sig, err := rk.Sign(rand.Reader, d, h)
					if err != nil {
						t.Fatalf("ECDSA %v: %v", h, err)
					}
					if !ecdsa.VerifyASN1(pub, d, sig) {
						t.Errorf("ECDSA %v: signature does not verify", h)
					}
				}
			}
			if pub, ok := k.priv.Public().(*rsa.PublicKey); ok {
				secret := bytes.Repeat([]byte{0x5a}, 48)
				//lint:ignore SA1019 TLS 1.2 RSA key exchange is PKCS #1 v1.5 encryption; it is what keyserverd must decrypt
				ct, err := rsa.EncryptPKCS1v15(rand.Reader, pub, secret)
				if err != nil {
					t.Fatal(err)
				}
				pt, err := rk.Decrypt(rand.Reader, ct, nil)
				if err != nil || !bytes.Equal(pt, secret) {
					t.Errorf("decrypt: %x, %v", pt, err)
				}
			}
		})
	}

	// A client authorized for the ECDSA keys only is refused the RSA key, at once and
	// without trying another server.
	ecOnly := newClient(t, p, "l7-ec-only", ks)
	start := time.Now()
	_, err = ecOnly.NewKey(keyByName(t, "rsa2048").id, keyByName(t, "rsa2048").priv.Public()).Sign(rand.Reader, digestOf(crypto.SHA256, "x"), crypto.SHA256)
	if !errors.Is(err, protocol.ErrNotAuthorized) {
		t.Errorf("RSA sign by an ECDSA-only client: %v, want not_authorized", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("refusal took %v", took)
	}
	if _, err := ecOnly.Key(ctx, keyByName(t, "p256").id); err != nil {
		t.Errorf("ECDSA-only client, own key: %v", err)
	}
}

// tlsSite is a crypto/tls server whose certificate's private key is remote.
type tlsSite struct {
	addr   string
	caFile string
	roots  *tls.Config
	ln     net.Listener
	// lastErr is the last server-side handshake failure, for test messages.
	lastErr atomic.Value
}

func newTLSSite(t *testing.T, key *siteKey, priv crypto.Signer) *tlsSite {
	t.Helper()
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	_, der, err := ca.Issue("site.test", key.priv.Public(), "site.test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile, err := ca.WriteFiles(dir, "site")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{
		Certificates:           []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}},
		SessionTicketsDisabled: true,
		CipherSuites: []uint16{
			tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
			tls.TLS_RSA_WITH_AES_128_GCM_SHA256,
		},
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	site := &tlsSite{addr: ln.Addr().String(), caFile: caFile, ln: ln,
		roots: &tls.Config{RootCAs: ca.Pool(), ServerName: "site.test"}}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				nc.SetDeadline(time.Now().Add(10 * time.Second))
				if err := nc.(*tls.Conn).Handshake(); err != nil {
					site.lastErr.Store(err.Error())
					return
				}
				io.WriteString(nc, "ok\n")
			}()
		}
	}()
	return site
}

// handshake makes one full handshake with a Go client and reads the greeting.
func (s *tlsSite) handshake(ctx context.Context, maxVersion, suite uint16) (tls.ConnectionState, error) {
	cfg := s.roots.Clone()
	cfg.MaxVersion = maxVersion
	if suite != 0 {
		cfg.CipherSuites = []uint16{suite}
	}
	d := tls.Dialer{Config: cfg}
	nc, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(nc, buf); err != nil || string(buf) != "ok\n" {
		return tls.ConnectionState{}, fmt.Errorf("greeting: %q %v", buf, err)
	}
	return nc.(*tls.Conn).ConnectionState(), nil
}

// TestTLSHandshakesWithRemoteKey runs real TLS 1.2 (ECDHE-RSA, ECDHE-ECDSA, RSA key
// exchange) and TLS 1.3 handshakes against crypto/tls servers whose key is in the
// token behind keyserverd, from a Go client and from openssl s_client.
func TestTLSHandshakesWithRemoteKey(t *testing.T) {
	requireSoftHSM(t)
	opensslBin := testenv.RequireCommand(t, "openssl", "openssl")
	p := newPKI(t)
	keys := testKeys(t)
	ks := newKeyserver(t, p, keys)
	c := newClient(t, p, "l7-node", ks)

	type mode struct {
		name    string
		max     uint16
		suite   uint16
		openssl []string
		want    string
	}
	rsaModes := []mode{
		{"TLS1.3", tls.VersionTLS13, 0, []string{"-tls1_3"}, "TLSv1.3"},
		{"TLS1.2-ECDHE-RSA", tls.VersionTLS12, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, []string{"-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"}, "TLSv1.2"},
		{"TLS1.2-RSA-kx", tls.VersionTLS12, tls.TLS_RSA_WITH_AES_128_GCM_SHA256, []string{"-tls1_2", "-cipher", "AES128-GCM-SHA256"}, "TLSv1.2"},
	}
	ecModes := []mode{
		{"TLS1.3", tls.VersionTLS13, 0, []string{"-tls1_3"}, "TLSv1.3"},
		{"TLS1.2-ECDHE-ECDSA", tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"}, "TLSv1.2"},
	}
	for _, k := range keys {
		modes := rsaModes
		if _, ok := k.priv.Public().(*ecdsa.PublicKey); ok {
			modes = ecModes
		}
		site := newTLSSite(t, k, c.NewKey(k.id, k.priv.Public()).PrivateKey())
		for _, m := range modes {
			t.Run(k.name+"/"+m.name, func(t *testing.T) {
				before := ks.opsOK()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				st, err := site.handshake(ctx, m.max, m.suite)
				if err != nil {
					t.Fatalf("Go client: %v (server side: %v)\nkeyserverd log:\n%s", err, site.lastErr.Load(), ks.logTail())
				}
				if st.DidResume || (m.suite != 0 && st.CipherSuite != m.suite) {
					t.Errorf("Go client: resumed=%v suite=%s", st.DidResume, tls.CipherSuiteName(st.CipherSuite))
				}
				args := append([]string{"s_client", "-connect", site.addr, "-servername", "site.test",
					"-CAfile", site.caFile, "-verify_return_error", "-brief", "-no_ticket"}, m.openssl...)
				cmd := exec.CommandContext(ctx, opensslBin, args...)
				cmd.Stdin = strings.NewReader("")
				out, err := cmd.CombinedOutput()
				if err != nil || !strings.Contains(string(out), "Verification: OK") ||
					!strings.Contains(string(out), "Protocol version: "+m.want) {
					t.Fatalf("openssl s_client %v: %v\n%s", m.openssl, err, out)
				}
				if after := ks.opsOK(); after < before+2 {
					t.Errorf("keyserverd answered %v operations for two full handshakes, want ≥ 2", after-before)
				}
			})
		}
	}
}

// TestKeyserverKilledDuringHandshakes kills one of two keyservers while 500 concurrent
// clients make full handshakes: every handshake must end (done or failed) within its
// deadline, the others must be served by the survivor, and the restarted keyserver
// must be reconnected to and used again.
//
// The L7 side (a crypto/tls server whose key is on the keyservers, and the 500
// clients) runs in hsload, a separate process built without the race detector: under
// -race the handshakes' own cryptography would starve the machine's two cores.
func TestKeyserverKilledDuringHandshakes(t *testing.T) {
	requireSoftHSM(t)
	testenv.SkipShort(t, "500 concurrent handshakes")
	p := newPKI(t)
	k := keyByName(t, "rsa2048")
	a := newKeyserver(t, p, []*siteKey{k})
	b := newKeyserver(t, p, []*siteKey{k})

	dir := t.TempDir()
	siteCA, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	_, siteDER, err := siteCA.Issue("site.test", k.priv.Public(), "site.test")
	if err != nil {
		t.Fatal(err)
	}
	siteCert := filepath.Join(dir, "site.pem")
	testpki.WritePEM(siteCert, "CERTIFICATE", siteDER)
	siteCAFile, _ := siteCA.WriteFiles(dir, "site")
	l7, err := p.clientCA.Leaf("l7-node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.clientCA.WriteFiles(dir, "l7", l7); err != nil {
		t.Fatal(err)
	}

	const workers, deadline = 500, 8 * time.Second
	load := exec.Command(filepath.Join(binaries(t), "hsload"),
		"-keyservers", a.addr+","+b.addr, "-cert", siteCert, "-ca", siteCAFile, "-servername", "site.test",
		"-client-cert", filepath.Join(dir, "l7-node.pem"), "-client-key", filepath.Join(dir, "l7-node.key"),
		"-keyserver-ca", filepath.Join(p.dir, "server-ca.pem"),
		"-workers", fmt.Sprint(workers), "-duration", "4s", "-deadline", deadline.String())
	var stdout bytes.Buffer
	load.Stdout = &stdout
	stderr, err := load.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	defer load.Process.Kill()
	var logTail strings.Builder
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "hsload: ready") {
				close(ready)
			} else if logTail.Len() < 8000 {
				logTail.WriteString(sc.Text() + "\n")
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatal("hsload not ready after 20s")
	}
	time.Sleep(1500 * time.Millisecond)
	aBefore, bBefore := a.opsOK(), b.opsOK()
	a.kill()
	load.Process.Signal(syscall.SIGUSR1)
	t.Logf("killed keyserver A after %.0f of its operations (B: %.0f)", aBefore, bBefore)
	if err := load.Wait(); err != nil {
		t.Fatalf("hsload: %v\n%s", err, logTail.String())
	}
	var res struct {
		Completed, Failed, Late int64
		CompletedAfter          int64   `json:"completed_after_mark"`
		FailedAfter             int64   `json:"failed_after_mark"`
		Slowest                 float64 `json:"slowest_s"`
		FirstError              string  `json:"first_error"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("hsload output %q: %v", stdout.String(), err)
	}
	t.Logf("handshakes: %d completed (%d after the kill), %d failed (%d after), slowest %.2fs; first failure: %q",
		res.Completed, res.CompletedAfter, res.Failed, res.FailedAfter, res.Slowest, res.FirstError)
	if res.Late > 0 {
		t.Errorf("%d handshakes outlived their %v deadline", res.Late, deadline)
	}
	if aBefore <= 0 {
		t.Errorf("keyserver A served nothing before the kill")
	}
	if res.CompletedAfter == 0 || b.opsOK() <= bBefore {
		t.Errorf("no handshake completed through keyserver B after A was killed")
	}
	if total := res.Completed + res.Failed; res.Failed*20 > total {
		t.Errorf("%d of %d handshakes failed; want under 5%%\n%s", res.Failed, total, logTail.String())
	}

	// Restart A on the same address: a client reconnects and sends it work again.
	c := newClient(t, p, "l7-node", a, b)
	a.start()
	waitFor(t, 15*time.Second, "client connected to the restarted keyserver", func() bool {
		return c.Stats()[0].Conns > 0
	})
	rk := c.NewKey(k.id, k.priv.Public())
	waitFor(t, 15*time.Second, "restarted keyserver serves signatures", func() bool {
		for i := 0; i < 20; i++ {
			if _, err := rk.Sign(rand.Reader, digestOf(crypto.SHA256, "x"), crypto.SHA256); err != nil {
				t.Fatalf("sign after restart: %v", err)
			}
		}
		return a.opsOK() > 0
	})
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting: %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKeyserverdCLI checks the command's error paths a user meets first.
func TestKeyserverdCLI(t *testing.T) {
	bin := filepath.Join(binaries(t), "keyserverd")
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listen: :1\nunknown_field: 1\nsoftware: {}\n"), 0o600)
	noBackend := filepath.Join(dir, "nobackend.yaml")
	os.WriteFile(noBackend, []byte("listen: :1\n"), 0o600)
	cases := []struct {
		args []string
		want string
		code int
	}{
		{nil, "usage: keyserverd", 2},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`, 2},
		{[]string{"run", "-config", filepath.Join(dir, "missing.yaml")}, "reading configuration", 1},
		{[]string{"run", "-config", bad}, "field unknown_field not found", 1},
		{[]string{"run", "-config", noBackend}, "no key backend", 1},
		{[]string{"import", "-config", noBackend}, "no key backend", 1},
	}
	for _, tc := range cases {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		var ee *exec.ExitError
		code := 0
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("keyserverd %v: exit %d, output %q; want exit %d and %q", tc.args, code, out, tc.code, tc.want)
		}
	}
}

// TestImportWithKeySelection: a configuration that already names the key being
// imported (pkcs11.keys) must not stop `keyserverd import`, and `run` then serves it.
func TestImportWithKeySelection(t *testing.T) {
	requireSoftHSM(t)
	bin := filepath.Join(binaries(t), "keyserverd")
	dir := t.TempDir()
	tok, err := softhsm.CreateToken(filepath.Join(dir, "token"), "sel", "so-pin-1", "pin-1")
	if err != nil {
		t.Fatal(err)
	}
	k := keyByName(t, "p256")
	cfg := filepath.Join(dir, "ks.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("pkcs11:\n  module: %q\n  token_label: sel\n  pin: pin-1\n  keys: [{label: site}]\n", tok.Module)), 0o600)
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), tok.Env()...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("keys", "-config", cfg); err == nil || !strings.Contains(out, "site") {
		t.Fatalf("keys before import: %v %s (want an error naming the missing key)", err, out)
	}
	if out, err := run("import", "-config", cfg, "-label", "site", "-key", k.pem); err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	out, err := run("keys", "-config", cfg)
	if err != nil || !strings.Contains(out, k.id.String()) {
		t.Fatalf("keys after import: %v\n%s", err, out)
	}
}
