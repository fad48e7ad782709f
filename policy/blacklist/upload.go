package blacklist

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/internal/promreg"
)

// Default upload limits, sized for a list of 10 million IPv4 entries.
const (
	// DefaultMaxBodyBytes bounds an upload as it is sent, compressed or not: room for
	// 10M IPv4 addresses as plain, uncompressed text (at most 16 bytes a line).
	DefaultMaxBodyBytes = 256 << 20
	// DefaultMaxBinaryBytes bounds a binary upload after decompression: 10M IPv4
	// records take at most 90 MB (a 5-byte gap and a 4-byte expiry each), 20 to 50 MB
	// as usually written.
	DefaultMaxBinaryBytes = 128 << 20
	// DefaultMaxTextBytes bounds a text upload after decompression: 10M IPv4 lines
	// take at most 160 MB, 450 MB with an RFC 3339 expiry on every line.
	DefaultMaxTextBytes = 512 << 20
	// DefaultMaxUploadEntries bounds the entries of one upload or delta: 10M with
	// room. Reading one costs up to 12 bytes per IPv4 and 40 per IPv6 entry, twice
	// over while the Set is built (56 bytes per entry of a delta).
	DefaultMaxUploadEntries = 1 << 24
	// DefaultUploadWait is how long an upload waits for the one in progress.
	DefaultUploadWait = 5 * time.Second
)

// UploadLimits bound what one upload through the admin API may make l7d read and
// hold, so that a small gzip cannot inflate into gigabytes and two large uploads do
// not build at once. Uploads are read as a stream: memory grows with the entries
// read, never with the bytes. The zero value of each field means its default.
type UploadLimits struct {
	// MaxBodyBytes bounds the request body as sent (gzip-compressed or not); beyond
	// it the upload is refused with 413. Default 256 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes,omitempty" json:"max_body_bytes,omitempty"`

	// MaxBinaryBytes bounds a binary upload after decompression; beyond it the upload
	// is refused with 413. Default 128 MiB (10M IPv4 entries take at most 90 MB).
	MaxBinaryBytes int64 `yaml:"max_binary_bytes,omitempty" json:"max_binary_bytes,omitempty"`

	// MaxTextBytes bounds a text upload or delta after decompression, comments
	// included; beyond it the upload is refused with 413. Default 512 MiB (10M IPv4
	// lines take 160 MB, 450 MB with an RFC 3339 expiry each).
	MaxTextBytes int64 `yaml:"max_text_bytes,omitempty" json:"max_text_bytes,omitempty"`

	// MaxEntries bounds the entries of one upload or delta (records, or lines that
	// are not blank or comments); beyond it the upload is refused with 413, as soon
	// as a binary section's count says so. At most MaxEntries (100M). Default
	// 16,777,216.
	MaxEntries int `yaml:"max_entries,omitempty" json:"max_entries,omitempty"`

	// Wait is how long an upload waits for the one being read to finish: uploads are
	// read one at a time, and one still waiting after Wait is refused with 429, code
	// busy, and Retry-After. Default 5s.
	Wait config.Duration `yaml:"wait,omitempty" json:"wait,omitempty"`
}

// Defaults fills in the zero fields.
func (l *UploadLimits) Defaults() {
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxBinaryBytes == 0 {
		l.MaxBinaryBytes = DefaultMaxBinaryBytes
	}
	if l.MaxTextBytes == 0 {
		l.MaxTextBytes = DefaultMaxTextBytes
	}
	if l.MaxEntries == 0 {
		l.MaxEntries = DefaultMaxUploadEntries
	}
	if l.Wait == 0 {
		l.Wait = config.Duration(DefaultUploadWait)
	}
}

// Validate checks the fields, naming each by its YAML name.
func (l UploadLimits) Validate() error {
	var ck config.Checker
	for _, f := range []struct {
		name string
		v    int64
	}{{"max_body_bytes", l.MaxBodyBytes}, {"max_binary_bytes", l.MaxBinaryBytes}, {"max_text_bytes", l.MaxTextBytes}} {
		if f.v < 0 || f.v > MaxInputBytes {
			ck.Addf(f.name, "%d: want 1 to %d bytes (0 for the default)", f.v, MaxInputBytes)
		}
	}
	if l.MaxEntries < 0 || l.MaxEntries > MaxEntries {
		ck.Addf("max_entries", "%d: want 1 to %d (0 for the default)", l.MaxEntries, MaxEntries)
	}
	if l.Wait < 0 {
		ck.Addf("wait", "%v: want a duration of 0 (the default) or more", l.Wait)
	}
	return ck.Err()
}

// limits are the bounds of one read; a zero field means none.
type limits struct {
	body, binary, text int64
	entries            int
	named              bool // the bounds are UploadLimits' (errors name them)
}

// fileLimits bound what Read and ReadDelta take: files and state files, which the
// operator wrote.
var fileLimits = limits{binary: MaxInputBytes, text: MaxInputBytes, entries: MaxEntries}

func (l UploadLimits) limits() limits {
	l.Defaults()
	return limits{body: l.MaxBodyBytes, binary: l.MaxBinaryBytes, text: l.MaxTextBytes,
		entries: min(l.MaxEntries, MaxEntries), named: true}
}

// tooMany is the error of more than l.entries entries.
func (l limits) tooMany() error {
	if !l.named {
		return ErrTooManyEntries
	}
	return &LimitError{Limit: "max_entries", Max: int64(l.entries)}
}

// maxEntries is l.entries, or MaxEntries when l sets none.
func (l limits) maxEntries() int {
	if l.entries <= 0 {
		return MaxEntries
	}
	return l.entries
}

// A LimitError is an upload refused for passing one of its limits. It wraps
// ErrTooManyEntries or ErrTooLarge.
type LimitError struct {
	// Limit names the limit passed: max_body_bytes, max_binary_bytes, max_text_bytes
	// or max_entries (UploadLimits' fields), or "" for the package's own bounds
	// (MaxInputBytes, MaxEntries).
	Limit string
	// Max is the limit's value, in bytes or entries.
	Max int64
}

func (e *LimitError) Error() string {
	switch e.Limit {
	case "max_entries":
		return fmt.Sprintf("more than max_entries (%d) entries", e.Max)
	case "max_body_bytes":
		return fmt.Sprintf("request body over max_body_bytes (%d bytes)", e.Max)
	case "":
		return fmt.Sprintf("over %d bytes after decompression", e.Max)
	}
	return fmt.Sprintf("over %s (%d bytes after decompression)", e.Limit, e.Max)
}

func (e *LimitError) Unwrap() error {
	if e.Limit == "max_entries" {
		return ErrTooManyEntries
	}
	return ErrTooLarge
}

// capReader fails with a *LimitError once more than max bytes came through it (never,
// while max is 0), so that a small gzip cannot inflate without bound.
type capReader struct {
	r     io.Reader
	n     int64
	max   int64
	limit string
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.max > 0 {
		if c.n > c.max {
			return 0, c.err()
		}
		if room := c.max + 1 - c.n; int64(len(p)) > room {
			p = p[:room]
		}
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.max > 0 && c.n > c.max {
		return n - int(c.n-c.max), c.err()
	}
	return n, err
}

func (c *capReader) err() error { return &LimitError{Limit: c.limit, Max: c.max} }

// ErrBusy is the error of an upload that waited for the one in progress longer
// than UploadLimits.Wait.
var ErrBusy = errors.New("another upload is being read")

// Reasons for a refused upload, the values of
// tiergate_blacklist_uploads_refused_total{reason}: the limits' names and busy.
const reasonBusy = "busy"

// An Uploader reads the uploads of an admin API one at a time, within UploadLimits,
// and counts the ones it refuses. Make one with NewUploader.
type Uploader struct {
	slot    chan struct{}
	refused *prometheus.CounterVec
}

// NewUploader returns an Uploader whose refusals are counted in
// tiergate_blacklist_uploads_refused_total{reason} in reg (none when nil).
func NewUploader(reg prometheus.Registerer) (*Uploader, error) {
	u := &Uploader{slot: make(chan struct{}, 1), refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tiergate_blacklist_uploads_refused_total",
		Help: "Blacklist uploads and deltas refused before parsing ended, by reason: the limit passed (max_body_bytes, max_binary_bytes, max_text_bytes, max_entries) or busy (another upload was being read).",
	}, []string{"reason"})}
	for _, r := range []string{"max_body_bytes", "max_binary_bytes", "max_text_bytes", "max_entries", reasonBusy} {
		u.refused.WithLabelValues(r)
	}
	if reg != nil {
		var err error
		if u.refused, err = promreg.Register(reg, u.refused); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// Acquire waits until no other upload is being read, at most lim.Wait (and until ctx
// ends), and returns the function that ends this one. After the wait it returns
// ErrBusy, and ctx's error when ctx ends first.
func (u *Uploader) Acquire(ctx context.Context, lim UploadLimits) (release func(), err error) {
	lim.Defaults()
	select {
	case u.slot <- struct{}{}:
		return u.release, nil
	default:
	}
	t := time.NewTimer(lim.Wait.D())
	defer t.Stop()
	select {
	case u.slot <- struct{}{}:
		return u.release, nil
	case <-t.C:
		u.count(reasonBusy)
		return nil, ErrBusy
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (u *Uploader) release() { <-u.slot }

// Read reads a whole list as Read does (gzip or not, binary or text), within lim.
// An upload over a limit is refused with a *LimitError, and counted.
func (u *Uploader) Read(r io.Reader, lim UploadLimits) (*Set, error) {
	s, err := read(r, time.Now(), lim.limits())
	u.countErr(err)
	return s, err
}

// ReadDelta reads a text delta as ReadDelta does, within lim. A delta over a limit
// is refused with a *LimitError, and counted.
func (u *Uploader) ReadDelta(r io.Reader, lim UploadLimits) (*Delta, error) {
	d, err := readDelta(r, time.Now(), lim.limits())
	u.countErr(err)
	return d, err
}

func (u *Uploader) countErr(err error) {
	var le *LimitError
	if errors.As(err, &le) {
		u.count(le.Limit)
	}
}

func (u *Uploader) count(reason string) { u.refused.WithLabelValues(reason).Inc() }
