package l7

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

func TestRuntimeEnv(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string // nil: no re-execution
	}{
		{[]string{"PATH=/bin"}, []string{"PATH=/bin", "GODEBUG=" + SysmonGODEBUG}},
		{[]string{"GODEBUG=madvdontneed=1", "HOME=/"}, []string{"GODEBUG=madvdontneed=1," + SysmonGODEBUG, "HOME=/"}},
		{[]string{"GODEBUG="}, []string{"GODEBUG=" + SysmonGODEBUG}},
		{[]string{"GODEBUG=gctrace=1,schedtrace=1000"}, nil}, // the operator's own
		{[]string{"GODEBUG=" + SysmonGODEBUG}, nil},          // re-executed already
		{[]string{"TIERGATE_RUNTIME_DEFAULTS=1", "PATH=/bin"}, nil},
	} {
		got, ok := runtimeEnv(tc.in)
		if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
			t.Errorf("runtimeEnv(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
}

// TestH1CloseAfterClient checks that after the client's close_notify, l7 closes an
// HTTP/1.1 connection's TCP without a close_notify of its own, as nginx does.
func TestH1CloseAfterClient(t *testing.T) {
	be := startBackend(t, "a")
	ts := startServer(t, baseConfig(t, be.addr))

	// do makes one request, sends close_notify and returns the bytes the server
	// sent after its response: a close_notify record, or nothing.
	do := func(t *testing.T) int {
		raw, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		cr := &countingReader{Conn: raw}
		tc := tls.Client(cr, ts.clientTLS())
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(tc)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if br.Buffered() > 0 {
			t.Fatalf("%d bytes after the response", br.Buffered())
		}
		before := cr.n.Load()
		if err := tc.CloseWrite(); err != nil { // close_notify, TCP left open
			t.Fatal(err)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("read %v after the response; want EOF", err)
		}
		return int(cr.n.Load() - before)
	}
	if n := do(t); n != 0 {
		t.Errorf("after the client's close_notify, the server sent %d bytes; want none, TCP closed alone", n)
	}
}

// countingReader counts the bytes read from a connection.
type countingReader struct {
	net.Conn
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}
