package l7

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/internal/config"
)

// An HTTP/3 request stream gets the listener's read and write timeouts, although the
// client's PINGs keep its connection from ever being idle: a client that sends its
// body too slowly, or never reads the response, loses the stream, not the server.
func TestHTTP3StreamTimeouts(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	const timeout = 500 * time.Millisecond
	cfg.Listeners[0].ReadTimeout = config.Duration(timeout)
	cfg.Listeners[0].WriteTimeout = config.Duration(timeout)
	ts := startServer(t, cfg)

	tr := &http3.Transport{
		TLSClientConfig: ts.clientTLS(),
		QUICConfig:      &quic.Config{KeepAlivePeriod: 100 * time.Millisecond},
	}
	t.Cleanup(func() { tr.Close() })
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	if resp, body := get(t, c, "GET", ts.url("/"), ""); resp.StatusCode != 200 {
		t.Fatalf("warm-up: %d %s", resp.StatusCode, body)
	}

	t.Run("body too slow", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		go pw.Write([]byte("the start of a body that never ends"))
		req, _ := http.NewRequest("POST", ts.url("/sink"), pr)
		start := time.Now()
		resp, err := c.Do(req)
		took := time.Since(start)
		switch {
		case err != nil:
			t.Logf("after %v: %v", took, err) // the stream reset: as good as an answer
		case resp.StatusCode != http.StatusRequestTimeout:
			t.Errorf("answered %d, want 408", resp.StatusCode)
			fallthrough
		default:
			resp.Body.Close()
		}
		if took < timeout || took > timeout+2*time.Second {
			t.Errorf("the stream ended after %v; read timeout %v", took, timeout)
		}
	})

	t.Run("response never read", func(t *testing.T) {
		const size = 64 << 20 // far more than the flow-control windows
		resp, err := c.Get(ts.url(fmt.Sprintf("/big?n=%d", size)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		time.Sleep(timeout + time.Second)
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil || n >= size {
			t.Errorf("read %d bytes of %d after stalling, err %v: the stream was not reset", n, size, err)
		}
		t.Logf("read %d bytes, then %v", n, err)
		if n := counter(ts.m.responsesCut.WithLabelValues("web", cutClient)); n != 1 {
			t.Errorf("%v responses counted as cut for the client", n)
		}
	})

	// The connection itself is alive: its PINGs went on, and it serves requests.
	if resp, body := get(t, c, "GET", ts.url("/"), ""); resp.StatusCode != 200 {
		t.Fatalf("after the timeouts: %d %s", resp.StatusCode, body)
	}
	if n := ts.l().nconns.Load(); n != 1 {
		t.Errorf("%d connections open, want the one client's", n)
	}
}
