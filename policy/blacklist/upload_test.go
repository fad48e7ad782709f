package blacklist

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tiergate/tiergate/internal/config"
)

// gzipBomb returns a gzip stream of a few thousandths of size that inflates to head
// followed by fill repeated up to size bytes: one gzip member per MiB, the same
// member repeated, which gzip readers take as one stream.
func gzipBomb(t testing.TB, head []byte, fill string, size int64) []byte {
	t.Helper()
	const chunk = 1 << 20
	member := func(b []byte) []byte {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	body := bytes.Repeat([]byte(fill), chunk/len(fill))
	var out bytes.Buffer
	out.Write(member(append(bytes.Clone(head), body[len(head):]...)))
	rest := member(body)
	for n := int64(len(body)); n < size; n += int64(len(body)) {
		out.Write(rest)
	}
	return out.Bytes()
}

// commentLine is a text line that holds no entry: a bomb of these is read to its end.
var commentLine = "#" + strings.Repeat(" nothing to see here", 50) + "\n"

// binaryBombHead is a binary header whose first section claims n records.
func binaryBombHead(n uint64) []byte {
	b := append(bytes.Clone(binaryMagic), 0, 1, 0, 0)
	return binary.AppendUvarint(b, n)
}

// allocated returns the bytes allocated by the whole process while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestUploadGzipBomb: a small gzip that inflates to 1 GiB is refused by the limit it
// passes, read as a stream: the process allocates a few MiB, not the gigabyte (before
// the limits, a binary upload was read whole into memory, and a text one was taken).
func TestUploadGzipBomb(t *testing.T) {
	if testing.Short() {
		t.Skip("inflates up to 512 MiB")
	}
	const size = 1 << 30
	u, err := NewUploader(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		bomb  []byte
		limit string
	}{
		{"text of comments", gzipBomb(t, nil, commentLine, size), "max_text_bytes"},
		{"binary with a huge count", gzipBomb(t, binaryBombHead(1<<40), "\x00", size), "max_entries"},
		{"binary past its limit", gzipBomb(t, binaryBombHead(0), "\x00", size), "max_binary_bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.bomb) > 8<<20 {
				t.Fatalf("the bomb is %d bytes, not small", len(tt.bomb))
			}
			var s *Set
			var err error
			alloc := allocated(func() { s, err = u.Read(bytes.NewReader(tt.bomb), UploadLimits{}) })
			var le *LimitError
			if s != nil || !errors.As(err, &le) || le.Limit != tt.limit || !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrTooManyEntries) {
				t.Fatalf("a %d-byte gzip of %d bytes: set %v, err %v; want a *LimitError on %s", len(tt.bomb), size, s, err, tt.limit)
			}
			if alloc > 64<<20 {
				t.Errorf("reading the bomb allocated %d MiB, want under 64", alloc>>20)
			}
			if got := testutil.ToFloat64(u.refused.WithLabelValues(tt.limit)); got != 1 {
				t.Errorf("refused{reason=%q} = %v, want 1", tt.limit, got)
			}
		})
	}
}

func TestUploadLimits(t *testing.T) {
	text := []byte(strings.Repeat("192.0.2.1\n", 10)) // 100 bytes, 10 entries
	bin := encode(t, mustParse(t, "192.0.2.0/31\n198.51.100.7\n2001:db8::1\n"))
	lim := UploadLimits{MaxBodyBytes: 100, MaxBinaryBytes: int64(len(bin)), MaxTextBytes: 100, MaxEntries: 10}
	tests := []struct {
		name  string
		data  []byte
		lim   UploadLimits
		limit string // "" when accepted
	}{
		{"text at every limit", text, lim, ""},
		{"binary at its limit", bin, lim, ""},
		{"body one byte over", append(bytes.Clone(text), '\n'), lim, "max_body_bytes"},
		{"gzip body over", gz(text), UploadLimits{MaxBodyBytes: 20}, "max_body_bytes"},
		{"text one byte over", append(bytes.Clone(text), '\n'), UploadLimits{MaxTextBytes: 100}, "max_text_bytes"},
		{"gzip text over", gz(append(bytes.Clone(text), '#')), UploadLimits{MaxTextBytes: 100}, "max_text_bytes"},
		{"binary one byte over", bin, UploadLimits{MaxBinaryBytes: int64(len(bin)) - 1}, "max_binary_bytes"},
		{"gzip binary over", gz(bin), UploadLimits{MaxBinaryBytes: int64(len(bin)) - 1}, "max_binary_bytes"},
		{"text entries over", text, UploadLimits{MaxEntries: 9}, "max_entries"},
		{"binary entries over", bin, UploadLimits{MaxEntries: 2}, "max_entries"},
		{"text limit does not bind binary", bin, UploadLimits{MaxTextBytes: 1}, ""},
		{"binary limit does not bind text", text, UploadLimits{MaxBinaryBytes: 1}, ""},
	}
	u, err := NewUploader(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := u.Read(bytes.NewReader(tt.data), tt.lim)
			if tt.limit == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var le *LimitError
			if s != nil || !errors.As(err, &le) || le.Limit != tt.limit {
				t.Fatalf("set %v, err %v; want a *LimitError on %s", s, err, tt.limit)
			}
			if !strings.Contains(err.Error(), tt.limit) {
				t.Errorf("%q does not name %s", err, tt.limit)
			}
		})
	}
	d, err := u.ReadDelta(bytes.NewReader(gz([]byte("+192.0.2.1\n-192.0.2.2\n+192.0.2.3\n"))), UploadLimits{MaxEntries: 2})
	var le *LimitError
	if d != nil || !errors.As(err, &le) || le.Limit != "max_entries" || !errors.Is(err, ErrTooManyEntries) {
		t.Errorf("a delta of 3 entries over max_entries 2: %v, %v", d, err)
	}
	if _, err := u.ReadDelta(strings.NewReader("+192.0.2.1\n"), UploadLimits{MaxTextBytes: 5}); !errors.As(err, &le) || le.Limit != "max_text_bytes" {
		t.Errorf("a delta over max_text_bytes: %v", err)
	}
}

func mustParse(t *testing.T, text string) *Set {
	t.Helper()
	s, err := parseText(strings.NewReader(text), t0, fileLimits)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestUploaderOneAtATime: an upload waits for the one in progress, at most its wait,
// then is refused as busy and counted.
func TestUploaderOneAtATime(t *testing.T) {
	u, err := NewUploader(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	release, err := u.Acquire(context.Background(), UploadLimits{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := u.Acquire(context.Background(), UploadLimits{Wait: config.Duration(50 * time.Millisecond)}); !errors.Is(err, ErrBusy) {
		t.Fatalf("second upload: %v, want ErrBusy", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("refused after %v, before its wait", waited)
	}
	if got := testutil.ToFloat64(u.refused.WithLabelValues("busy")); got != 1 {
		t.Errorf("refused{reason=busy} = %v, want 1", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := u.Acquire(ctx, UploadLimits{Wait: config.Duration(time.Minute)}); !errors.Is(err, context.Canceled) {
		t.Errorf("with its request gone: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := u.Acquire(context.Background(), UploadLimits{Wait: config.Duration(10 * time.Second)})
		if err == nil {
			r()
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	release()
	if err := <-got; err != nil {
		t.Errorf("an upload waiting when the first ended: %v", err)
	}
}

func TestUploadLimitsValidate(t *testing.T) {
	var l UploadLimits
	l.Defaults()
	if l.MaxBodyBytes != DefaultMaxBodyBytes || l.MaxBinaryBytes != DefaultMaxBinaryBytes || l.MaxTextBytes != DefaultMaxTextBytes ||
		l.MaxEntries != DefaultMaxUploadEntries || l.Wait.D() != DefaultUploadWait {
		t.Errorf("defaults: %+v", l)
	}
	if err := l.Validate(); err != nil {
		t.Errorf("defaults refused: %v", err)
	}
	bad := UploadLimits{MaxBodyBytes: -1, MaxTextBytes: MaxInputBytes + 1, MaxEntries: MaxEntries + 1, Wait: -1}
	err := bad.Validate()
	for _, field := range []string{"max_body_bytes", "max_text_bytes", "max_entries", "wait"} {
		if err == nil || !strings.Contains(err.Error(), field+":") {
			t.Errorf("%s not named in %v", field, err)
		}
	}
}

// TestReadBinaryStreams: the binary reader takes its input in pieces of any size
// (here one byte at a time) and gives the same answer as from memory.
func TestReadBinaryStreams(t *testing.T) {
	data := encode(t, sampleSet())
	s, err := readBinary(&oneByte{bytes.NewReader(data)}, t0, fileLimits)
	if err != nil {
		t.Fatal(err)
	}
	assertSameSet(t, sampleSet(), s)
	bad := bytes.Clone(data)
	bad[20] ^= 4
	if _, err := readBinary(&oneByte{bytes.NewReader(bad)}, t0, fileLimits); !errors.Is(err, ErrChecksum) {
		t.Errorf("a flipped bit read a byte at a time: %v, want ErrChecksum", err)
	}
}

type oneByte struct{ r io.Reader }

func (o *oneByte) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}
