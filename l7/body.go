package l7

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// Bodies are streamed, never held whole: a backend's response goes to the client as
// it arrives, and a request body to the backend as it arrives. HTTP/1.1 bodies pass
// through each connection's own buffers (fasthttp's), which MaxConns bounds. An
// HTTP/2 or HTTP/3 request with a body, and a response streamed to an HTTP/2 or
// HTTP/3 client, each take a buffer of bodyChunk bytes from the server's body budget
// (Config.MaxBodyMemory) while they are copied; a request body of at most bodyChunk
// bytes is sent from that buffer whole, with its length, and can be retried.

// bodyChunk is the buffer a body streamed over HTTP/2 or HTTP/3 is copied through.
const bodyChunk = 32 << 10

var chunkPool = sync.Pool{New: func() any { return new([bodyChunk]byte) }}

// bodyBudget bounds the bytes of the buffers bodies are copied through.
type bodyBudget struct {
	max     int64
	used    atomic.Int64
	inUse   prometheus.Gauge
	refused prometheus.Counter
}

// take reserves n bytes, or counts a refusal and reports false.
func (b *bodyBudget) take(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		b.refused.Inc()
		return false
	}
	b.inUse.Add(float64(n))
	return true
}

func (b *bodyBudget) give(n int64) {
	b.used.Add(-n)
	b.inUse.Sub(float64(n))
}

// chunk is a copy buffer taken from the budget; give it back with put.
type chunk struct {
	b   *bodyBudget
	buf *[bodyChunk]byte
}

func (b *bodyBudget) chunk() (chunk, bool) {
	if !b.take(bodyChunk) {
		return chunk{}, false
	}
	return chunk{b: b, buf: chunkPool.Get().(*[bodyChunk]byte)}, true
}

func (c *chunk) put() {
	if c.buf == nil {
		return
	}
	chunkPool.Put(c.buf)
	c.buf = nil
	c.b.give(bodyChunk)
}

// Errors of reading a client's request body while it is forwarded.
var (
	errBodyTooLarge = errors.New("l7: request body larger than max_request_body")
	errBodyTimeout  = errors.New("l7: request body not received within read_timeout")
)

// clientBody is a client's request body as it is forwarded to a backend: what was
// read ahead (prefix), then the rest from r, at most left bytes more. The first error
// reading it is kept, so that a failed forward is told apart from a backend failure
// and answered for what it is: 413, 408 or 400.
type clientBody struct {
	prefix []byte
	r      io.Reader
	left   int64 // bytes r may still give
	err    error // the client's error, not io.EOF
}

func (b *clientBody) Read(p []byte) (int, error) {
	if len(b.prefix) > 0 {
		n := copy(p, b.prefix)
		b.prefix = b.prefix[n:]
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	if int64(n) > b.left {
		b.err = errBodyTooLarge
		return 0, b.err
	}
	b.left -= int64(n)
	if err != nil && err != io.EOF {
		if errors.Is(err, os.ErrDeadlineExceeded) || isTimeoutErr(err) {
			err = errBodyTimeout
		}
		b.err = err
	}
	return n, err
}

func isTimeoutErr(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// status is the answer to a request whose body could not be read: 413, 408 or 400.
func (b *clientBody) status() int {
	switch b.err {
	case errBodyTooLarge:
		return fasthttp.StatusRequestEntityTooLarge
	case errBodyTimeout:
		return fasthttp.StatusRequestTimeout
	}
	return fasthttp.StatusBadRequest
}
