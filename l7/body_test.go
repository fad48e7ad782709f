package l7

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pattern is what large test bodies repeat.
var pattern = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	return b
}()

// patternReader gives n bytes of pattern, and no length (so clients send it chunked
// unless told its length).
type patternReader struct{ off, n int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off)]
	for done := 0; done < len(b); {
		k := copy(b[done:], pattern[(p.off+int64(done))%int64(len(pattern)):])
		done += k
	}
	p.off += int64(len(b))
	return len(b), nil
}

// patternCheck counts what is written to it and whether it was all pattern.
type patternCheck struct {
	n   int64
	bad bool
}

func (p *patternCheck) Write(b []byte) (int, error) {
	for done := 0; done < len(b); {
		at := (p.n + int64(done)) % int64(len(pattern))
		k := min(len(b)-done, len(pattern)-int(at))
		if !bytes.Equal(b[done:done+k], pattern[at:int(at)+k]) {
			p.bad = true
		}
		done += k
	}
	p.n += int64(len(b))
	return len(b), nil
}

// serveBig answers /big?n=N[&chunked=1]: N bytes of pattern, with their length
// unless chunked.
func serveBig(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if r.URL.Query().Get("chunked") == "" {
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	}
	_, _ = io.Copy(w, &patternReader{n: n})
}

// serveSink answers /sink with "<bytes received> <ok>", checking the body is pattern.
func serveSink(w http.ResponseWriter, r *http.Request) {
	var c patternCheck
	_, err := io.Copy(&c, r.Body)
	fmt.Fprintf(w, "%d %v %s", c.n, err == nil && !c.bad, r.Header.Get("Transfer-Encoding")+strings.Join(r.TransferEncoding, ","))
}

// allocated returns the bytes the process allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A 128 MiB response, and a 128 MiB request body, pass through l7 over each protocol
// intact, while the whole process (backend and client included) allocates a small
// part of it: bodies are streamed, not held whole.
func TestLargeBodiesStream(t *testing.T) {
	if raceEnabled {
		// Delivered intact still, in less time; allocations are not counted.
		testLargeBodies(t, 16<<20, 1<<40)
		return
	}
	testLargeBodies(t, 128<<20, 32<<20)
}

func testLargeBodies(t *testing.T, size int64, maxAlloc uint64) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].MaxRequestBody = int(size)
	cfg.Backends["app"] = PoolConfig{Members: []string{b.addr}, Timeout: 120e9}
	ts := startServer(t, cfg)
	for _, proto := range []string{"1.1", "2", "3"} {
		c := ts.client(t, proto)
		c.Timeout = 2 * time.Minute
		if resp, body := get(t, c, "GET", ts.url("/"), ""); resp.StatusCode != 200 {
			t.Fatalf("HTTP/%s warm-up: %d %s", proto, resp.StatusCode, body)
		}
		for _, chunked := range []string{"", "1"} {
			var check patternCheck
			var status int
			alloc := allocated(func() {
				resp, err := c.Get(ts.url(fmt.Sprintf("/big?n=%d&chunked=%s", size, chunked)))
				if err != nil {
					t.Fatalf("HTTP/%s: %v", proto, err)
				}
				defer resp.Body.Close()
				status = resp.StatusCode
				if _, err := io.Copy(&check, resp.Body); err != nil {
					t.Errorf("HTTP/%s: reading the response: %v", proto, err)
				}
			})
			if status != 200 || check.n != size || check.bad {
				t.Errorf("HTTP/%s response (chunked %q): %d, %d bytes of %d, intact %v", proto, chunked, status, check.n, size, !check.bad)
			}
			if alloc > maxAlloc {
				t.Errorf("HTTP/%s response (chunked %q): %d MiB allocated for a %d MiB body", proto, chunked, alloc>>20, size>>20)
			}
			t.Logf("HTTP/%s response (chunked %q): %.1f MiB allocated", proto, chunked, float64(alloc)/(1<<20))

			var answer []byte
			alloc = allocated(func() {
				var body io.Reader = &patternReader{n: size}
				req, _ := http.NewRequest("POST", ts.url("/sink"), body)
				if chunked == "" {
					req.ContentLength = size
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("HTTP/%s: %v", proto, err)
				}
				defer resp.Body.Close()
				status = resp.StatusCode
				answer, _ = io.ReadAll(resp.Body)
			})
			if want := fmt.Sprintf("%d true", size); status != 200 || !strings.HasPrefix(string(answer), want) {
				t.Errorf("HTTP/%s request body (chunked %q): %d %q, want %q", proto, chunked, status, answer, want)
			}
			if alloc > maxAlloc {
				t.Errorf("HTTP/%s request body (chunked %q): %d MiB allocated for a %d MiB body", proto, chunked, alloc>>20, size>>20)
			}
			t.Logf("HTTP/%s request body (chunked %q): %.1f MiB allocated; backend saw %q", proto, chunked, float64(alloc)/(1<<20), answer)
		}
	}
	if n := counter(ts.m.bodyMemory); n != 0 {
		t.Errorf("%v bytes of the body budget still in use", n)
	}
}

// When MaxBodyMemory is spent, an HTTP/2 or HTTP/3 request that needs a buffer is
// answered 503 and counted, and the budget is whole again once requests end.
func TestBodyBudget(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.MaxBodyMemory = bodyChunk // one body at a time
	ts := startServer(t, cfg)
	c := ts.client(t, "2")

	// A request whose body (over one buffer, so streamed) holds the budget while the
	// backend takes its time.
	done := make(chan int)
	go func() {
		req, _ := http.NewRequest("POST", ts.url("/slow?d=1s"), strings.NewReader(strings.Repeat("x", 2*bodyChunk)))
		resp, err := c.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case <-b.arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the first request did not reach the backend")
	}
	for _, proto := range []string{"2", "3"} {
		if resp, body := get(t, ts.client(t, proto), "POST", ts.url("/"), "small body"); resp.StatusCode != 503 {
			t.Errorf("HTTP/%s request with the budget spent: %d %s", proto, resp.StatusCode, body)
		}
	}
	if n := counter(ts.m.bodyRefused); n != 2 {
		t.Errorf("%v refusals counted, want 2", n)
	}
	// HTTP/1.1 bodies use their connection's buffers, not the budget.
	if resp, body := get(t, ts.client(t, "1.1"), "POST", ts.url("/"), "small body"); resp.StatusCode != 200 {
		t.Errorf("HTTP/1.1 request: %d %s", resp.StatusCode, body)
	}
	if status := <-done; status != 200 {
		t.Errorf("the request holding the budget: %d", status)
	}
	waitFor(t, "the budget given back", func() bool { return counter(ts.m.bodyMemory) == 0 })
	if resp, body := get(t, ts.client(t, "3"), "POST", ts.url("/"), "small body"); resp.StatusCode != 200 {
		t.Errorf("after the budget was given back: %d %s", resp.StatusCode, body)
	}
}

// A body that does not say its length is held to MaxRequestBody as it arrives.
func TestChunkedBodyTooLarge(t *testing.T) {
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].MaxRequestBody = 40 << 10 // over one buffer: HTTP/2 and HTTP/3 stream it too
	ts := startServer(t, cfg)
	for _, proto := range []string{"1.1", "2", "3"} {
		for _, n := range []int64{40 << 10, 40<<10 + 1, 1 << 20} {
			req, _ := http.NewRequest("POST", ts.url("/sink"), &patternReader{n: n})
			resp, err := ts.client(t, proto).Do(req)
			if err != nil && proto == "1.1" && n == 1<<20 && errors.Is(err, syscall.ECONNRESET) {
				// The 413 and close came while the client was still sending: the
				// kernel resets a connection closed with unread data.
				continue
			}
			if err != nil {
				t.Errorf("HTTP/%s, %d bytes: %v", proto, n, err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := http.StatusOK
			if n > 40<<10 {
				want = http.StatusRequestEntityTooLarge
			}
			if resp.StatusCode != want {
				t.Errorf("HTTP/%s, %d bytes: %d %s, want %d", proto, n, resp.StatusCode, body, want)
			}
		}
	}
}

// A backend that fails in the middle of a response does not leave the client with a
// cut body it could take for a whole one: HTTP/1.1 closes the connection short of
// the length, HTTP/2 and HTTP/3 reset the stream.
func TestResponseCutShort(t *testing.T) {
	b := startBackend(t, "b1")
	ts := startServer(t, baseConfig(t, b.addr))
	for _, proto := range []string{"1.1", "2", "3"} {
		resp, err := ts.client(t, proto).Get(ts.url("/cut"))
		if err != nil {
			t.Errorf("HTTP/%s: %v", proto, err)
			continue
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Errorf("HTTP/%s: %d %d bytes read without an error", proto, resp.StatusCode, n)
		}
	}
	if n := counter(ts.m.responsesCut.WithLabelValues("web", cutBackend)); n != 2 {
		t.Errorf("%v responses counted as cut by the backend, want the HTTP/2 and HTTP/3 ones", n)
	}
}
