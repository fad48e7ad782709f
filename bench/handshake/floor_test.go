package main

import (
	"bytes"
	"context"
	"crypto/rsa"
	"crypto/tls"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestFloorServers: the floor server answers the load's operation, with and without
// a request, with its key local and with the floor signer making its signatures.
func TestFloorServers(t *testing.T) {
	f, err := newFixtureCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	site, err := testSite()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	key, err := loadSigner(f.siteKey)
	if err != nil {
		t.Fatal(err)
	}
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	signed := make(chan error, 1)
	go func() { signed <- floorSign(ctx, sln, key) }()

	for _, tc := range []struct{ name, key, signer string }{
		{"local", f.siteKey, ""},
		{"offload", "", sln.Addr().String()},
	} {
		cfg, err := floorConfig(f.siteCert, tc.key, tc.signer, "")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := listenDeferred("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- floorServe(sctx, ln, cfg) }()
		for _, request := range []bool{true, false} {
			c := newClient(ln.Addr().String(), 0x0304, false, 1, 5*time.Second, 1, site.roots)
			c.request = request
			for seq := range uint64(3) {
				if err := c.op(ctx, 0, seq); err != nil {
					t.Fatalf("%s, request %v: op %d: %v", tc.name, request, seq, err)
				}
			}
			if c.bad.Load() != 0 || c.verified.Load() != 3 {
				t.Errorf("%s, request %v: %d bad, %d verified; want 0, 3", tc.name, request, c.bad.Load(), c.verified.Load())
			}
		}
		// An HTTP/1.0 request, as s_time makes: the server answers and closes first,
		// with close_notify (a clean end of the TLS stream).
		raw, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		rec := &recordingConn{Conn: raw}
		tc10 := tls.Client(rec, &tls.Config{RootCAs: site.roots, ServerName: siteName})
		_ = tc10.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(tc10, "GET / HTTP/1.0\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := io.ReadAll(tc10)
		tc10.Close()
		if err != nil || !bytes.Equal(resp, floorResponse) {
			t.Errorf("%s: HTTP/1.0: read %q, %v; want the response", tc.name, resp, err)
		}
		// crypto/tls takes a TCP close at a record's end as a clean end too: the last
		// record must be the alert, sealed (TLS 1.3: 2 bytes, the inner type, the tag).
		if n := len(rec.got); n < 24 || !bytes.Equal(rec.got[n-24:n-19], []byte{23, 3, 3, 0, 19}) {
			t.Errorf("%s: HTTP/1.0: the stream does not end with a sealed alert (close_notify)", tc.name)
		}
		stop()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	cancel()
	if err := <-signed; err != nil {
		t.Error(err)
	}
}

// recordingConn keeps what it reads.
type recordingConn struct {
	net.Conn
	got []byte
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.got = append(c.got, p[:n]...)
	return n, err
}

func TestParseSched(t *testing.T) {
	v, iv := parseSwitches([]byte("Name:\tl7d\nThreads:\t7\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t56\n"))
	if v != 1234 || iv != 56 {
		t.Errorf("switches %d, %d; want 1234, 56", v, iv)
	}
	wait, slices := parseSchedstat([]byte("987654 321 42\n"))
	if wait != 321 || slices != 42 {
		t.Errorf("schedstat wait %d, slices %d; want 321, 42", wait, slices)
	}
	// This process's threads have run and slept.
	c, err := readSched([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if c[schedSlices] == 0 || c[schedVoluntary]+c[schedInvoluntary] == 0 {
		t.Errorf("own counters %v: nothing counted", c)
	}
}

func TestKeepAlive(t *testing.T) {
	for head, want := range map[string]bool{
		"GET / HTTP/1.1\r\nHost: a":                      true,
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: close": false,
		"GET / HTTP/1.0":                                 false,
	} {
		if got := keepAlive([]byte(head)); got != want {
			t.Errorf("keepAlive(%q) = %v, want %v", head, got, want)
		}
	}
}

func TestParseSpeedX25519(t *testing.T) {
	out := "CPUINFO: OPENSSL_ia32cap=0xfffa3203078bffff:0x405fc6f1bf07ab\n                              op      op/s\n 253 bits ecdh (X25519)   0.0000s  28823.5\n"
	if v, err := parseSpeedX25519(out); err != nil || v != 28823.5 {
		t.Errorf("parseSpeedX25519 = %v, %v; want 28823.5", v, err)
	}
	if _, err := parseSpeedX25519("nothing"); err == nil {
		t.Error("no error without the row")
	}
}

// TestMeasureGoCrypto: Go's public-key operations cost something, RSA more than X25519.
func TestMeasureGoCrypto(t *testing.T) {
	f, err := newFixtureCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	key, err := loadSigner(f.siteKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := measureGoCrypto(key.(*rsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *c)
	if c.GoX25519Pair <= 0 || c.GoRSASign <= c.GoX25519Pair {
		t.Errorf("Go X25519 %v µs, RSA-2048 %v µs: want both, RSA the larger", c.GoX25519Pair, c.GoRSASign)
	}
}
