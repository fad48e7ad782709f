package l7

import (
	"bufio"
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// burstKey is an RSA-4096 key (testdata/rsa4096.key) and a certificate for
// localhost issued to it: a key whose signature is most of a full handshake's CPU.
func burstKey(t *testing.T) (tls.Certificate, *rsa.PrivateKey) {
	t.Helper()
	b, err := os.ReadFile("testdata/rsa4096.key")
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("testdata/rsa4096.key: no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatalf("testdata/rsa4096.key: %v", err)
	}
	key := k.(*rsa.PrivateKey)
	cert, der, err := getPKI(t).ca.Issue("localhost", key.Public(), "localhost")
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, key
}

// signCost is the least time of a few signatures by key: its CPU cost, near enough.
func signCost(t *testing.T, key *rsa.PrivateKey) time.Duration {
	t.Helper()
	digest := sha256.Sum256([]byte("burst"))
	best := time.Duration(1 << 62)
	for range 3 {
		start := time.Now()
		if _, err := key.Sign(rand.Reader, digest[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256}); err != nil {
			t.Fatal(err)
		}
		best = min(best, time.Since(start))
	}
	return best
}

// slowKey is a local key (no context: not offloaded) whose signature costs
// slowRounds RSA signatures of CPU.
type slowKey struct{ *rsa.PrivateKey }

const slowRounds = 4

func (k slowKey) Sign(rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	for range slowRounds - 1 {
		if _, err := k.PrivateKey.Sign(rand, digest, opts); err != nil {
			return nil, err
		}
	}
	return k.PrivateKey.Sign(rand, digest, opts)
}

// TestLocalKeyBurstNotTimedOut: a burst of full handshakes with a local key, all
// accepted at once, takes the server longer than HandshakeTimeout to sign, on any
// number of cores. Every connection whose client answered in time is served: the
// time a handshake waits for a core behind the others' signatures is not the
// client's, and HandshakeTimeout bounds only the client's. With the timeout counted
// from accept, the later part of the burst was closed unanswered.
func TestLocalKeyBurstNotTimedOut(t *testing.T) {
	if testing.Short() {
		t.Skip("a burst of RSA-4096 handshakes")
	}
	cert, key := burstKey(t)
	// The key signs as slowly as four RSA-4096 keys, so that a burst of a few dozen
	// connections outlasts the timeout and its clients have little to do. The
	// timeout is half the burst's signing on all cores; the burst's size makes it at
	// least 300 ms, so that a client's own turn (its answer to the server's flight)
	// fits in it many times over.
	cert.PrivateKey = slowKey{key}
	cost := slowRounds * signCost(t, key)
	procs := runtime.GOMAXPROCS(0)
	const minTimeout = 300 * time.Millisecond
	n := max(int(2*time.Duration(procs)*minTimeout/cost)+1, 8*procs)
	timeout := time.Duration(n) * cost / time.Duration(2*procs)
	t.Logf("signature %v, %d handshakes, handshake_timeout %v on %d cores", cost, n, timeout, procs)

	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	cfg.Listeners[0].HandshakeTimeout = config.Duration(timeout)
	cfg.Listeners[0].MaxHandshakes = n
	cfg.Listeners[0].MaxHandshakesPerSource = n
	ts := startServer(t, cfg)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := testpki.WritePEM(caFile, "CERTIFICATE", ts.pki.ca.Cert.Raw); err != nil {
		t.Fatal(err)
	}

	// The clients run in a process of their own (this test binary again), so that
	// their turns are not queued behind the server's goroutines: all connect at once.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%d|%s", burstClientsEnv, ts.addr, n, caFile))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the clients' process: %v\n%s", err, stderr.Bytes())
	}
	var results []burstResult
	for line := range bytes.Lines(out) {
		var r burstResult
		if json.Unmarshal(line, &r) == nil {
			results = append(results, r)
		}
	}
	if len(results) != n {
		t.Fatalf("%d results from the clients' process, want %d:\n%s", len(results), n, out)
	}

	// A client that took half the timeout to answer the server (the machine's other
	// load can hold it that long) may have used up its own budget: its connection is
	// not counted. Those that answered in time must all be served.
	failed, excused := 0, 0
	for i, r := range results {
		switch turn := time.Duration(r.TurnNs); {
		case turn > timeout/2:
			excused++
			t.Logf("connection %d: the client took %v to answer; not counted (%s)", i, turn, r.Err)
		case r.Err != "":
			failed++
			if failed <= 5 {
				t.Errorf("connection %d: %s", i, r.Err)
			}
		}
	}
	t.Logf("burst served in %v (%.1f× handshake_timeout); %d of %d failed, %d not counted", took, float64(took)/float64(timeout), failed, n, excused)
	if failed > 0 {
		t.Fatalf("%d of the %d connections of the burst whose client answered in time failed; want none", failed, n-excused)
	}
	if excused > n/2 {
		t.Fatalf("%d of %d clients took over half the timeout to answer: the machine was too busy for the test to tell", excused, n)
	}
}

// burstClientsEnv, set to "addr|n|CA file", makes the test binary the clients of
// TestLocalKeyBurstNotTimedOut (TestMain): n connections to addr at once, each a
// TLS 1.3 handshake verified against the CA and one request; one
// burstResult per connection on stdout, as a JSON line.
const burstClientsEnv = "TIERGATE_L7_BURST_CLIENTS"

// burstResult is one client's connection: its error ("" for none) and its longest
// turn (from its connection, or a read that returned bytes, to its next write).
type burstResult struct {
	Err    string `json:"err"`
	TurnNs int64  `json:"turn_ns"`
}

func burstClients(spec string, stdout io.Writer) int {
	parts := strings.Split(spec, "|")
	if len(parts) != 3 {
		fmt.Fprintf(os.Stderr, "%s=%q: want addr|n|CA file\n", burstClientsEnv, spec)
		return 2
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	caPEM, err := os.ReadFile(parts[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS13,
		CurvePreferences: []tls.CurveID{tls.X25519}} // the least ClientHello to make
	results := make([]burstResult, n)
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for i := range results {
		wg.Go(func() {
			<-begin
			c, err := net.DialTimeout("tcp", parts[0], 10*time.Second)
			if err != nil {
				results[i].Err = err.Error()
				return
			}
			defer c.Close()
			// The client's first turn is from its connection to its ClientHello.
			tc := &turnConn{Conn: c, lastRead: time.Now()}
			if err := burstRequest(tc, cfg); err != nil {
				results[i].Err = err.Error()
			}
			results[i].TurnNs = int64(tc.longest)
		})
	}
	time.Sleep(10 * time.Millisecond) // every goroutine parked on begin
	close(begin)
	wg.Wait()
	enc := json.NewEncoder(stdout)
	for _, r := range results {
		_ = enc.Encode(r)
	}
	return 0
}

// turnConn is a client's connection that notes its longest turn: from a read that
// returned bytes to its next write.
type turnConn struct {
	net.Conn
	lastRead time.Time
	longest  time.Duration
}

func (c *turnConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.lastRead = time.Now()
	}
	return n, err
}

func (c *turnConn) Write(p []byte) (int, error) {
	if !c.lastRead.IsZero() {
		c.longest = max(c.longest, time.Since(c.lastRead))
	}
	return c.Conn.Write(p)
}

// burstRequest does a TLS 1.3 handshake over c and one request, and checks the answer.
func burstRequest(c net.Conn, cfg *tls.Config) error {
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if _, err := tc.Write([]byte("GET /burst HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")); err != nil {
		return fmt.Errorf("writing the request: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answer %d, want 200", resp.StatusCode)
	}
	return nil
}

// countingKey records how many of its signatures run at once.
type countingKey struct {
	mu       sync.Mutex
	now, max int
	release  chan struct{}
}

func (k *countingKey) Public() crypto.PublicKey { return nil }

func (k *countingKey) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	k.mu.Lock()
	k.now++
	k.max = max(k.max, k.now)
	k.mu.Unlock()
	<-k.release
	k.mu.Lock()
	k.now--
	k.mu.Unlock()
	return []byte("sig"), nil
}

// TestKeySlots: local keys' operations run as many at a time as there are slots.
func TestKeySlots(t *testing.T) {
	slots := newKeySlots(2)
	k := &countingKey{release: make(chan struct{})}
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if _, err := signLocal(slots, k, nil, nil, crypto.SHA256); err != nil {
				t.Error(err)
			}
		})
	}
	waitFor(t, "two signatures in progress", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.now == 2
	})
	for range 6 {
		k.release <- struct{}{}
	}
	wg.Wait()
	if k.max != 2 {
		t.Errorf("%d signatures ran at once, want 2", k.max)
	}
}
