package demo

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestForwardAPI: a request to the relay's address reaches the server behind it and
// comes back whole; once the stack closes, the relay listens no more.
func TestForwardAPI(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Method+" "+r.URL.Path+" "+string(b))
	}))
	defer srv.Close()
	s := newStack(io.Discard, "")
	defer s.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	at := ln.Addr().String()
	ln.Close()
	if err := forwardAPI(s, at, nil, srv.Listener.Addr().String()); err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("x", 1<<20) // more than one read and write
	for range 3 {
		resp, err := http.Post("http://"+at+"/v1/nodes", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := "POST /v1/nodes " + body; string(got) != want {
			t.Fatalf("through the relay: %d bytes %.40q, want %d bytes", len(got), got, len(want))
		}
	}
	s.close()
	if c, err := net.DialTimeout("tcp", at, time.Second); err == nil {
		c.Close()
		t.Error("the relay still listens after the stack closed")
	}
}

// TestTgctlRun: the command is printed as people type it, its output indented under
// it, with the API and token in its environment; a failure is an error carrying the
// output.
func TestTgctlRun(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tgctl")
	script := "#!/bin/sh\necho \"api=$TIERGATE_API token=$TIERGATE_TOKEN args=$*\"\n[ \"$1\" = fail ] && { echo refused >&2; exit 4; }\nexit 0\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tg := &tgctl{bin: bin, api: "http://127.0.0.1:7443", token: "tok", out: &out}
	if err := tg.run(context.Background(), "nodes", "-o", "json"); err != nil {
		t.Fatal(err)
	}
	if want := "  $ tgctl nodes -o json\n    api=http://127.0.0.1:7443 token=tok args=nodes -o json\n"; out.String() != want {
		t.Errorf("printed %q, want %q", out.String(), want)
	}
	err := tg.run(context.Background(), "fail")
	if err == nil || !strings.Contains(err.Error(), "tgctl fail") || !strings.Contains(err.Error(), "refused") {
		t.Errorf("a failing tgctl: %v", err)
	}
}

// TestSiteCertificates: the site certificates verify against the site CA for the
// demo's name, as servers, and are valid for the weeks siteValidity says, not a day.
func TestSiteCertificates(t *testing.T) {
	ca, err := newSiteCA("test site CA")
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := issueSite(ca, key.Public(), "demo.tiergate.test")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "demo.tiergate.test", Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the site certificate does not verify: %v", err)
	}
	if left := time.Until(leaf.NotAfter); left < siteValidity-2*time.Hour || !leaf.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("valid until %v (%v left), the CA until %v; want %v", leaf.NotAfter, left, ca.Cert.NotAfter, siteValidity)
	}
}
