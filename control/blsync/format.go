package blsync

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// Prefix is the etcd prefix of every list: Prefix + <name> + "/manifest",
// "/chunks/<sha256>" and "/deltas/<%020d version>". It is outside store.Prefix, so
// configuration snapshots and the agents' watches never hold lists.
const Prefix = "/tiergate/blacklists/v1/"

// Limits of the stored form.
const (
	// MaxChunkBytes bounds one chunk (etcd takes requests up to 1.5 MiB).
	MaxChunkBytes = 1 << 20
	// targetChunkBytes is where a chunk is cut, by the estimate of its encoding.
	targetChunkBytes = 900 << 10
	// MaxChunks bounds the chunks of one base: the manifest's transaction checks that
	// every one exists, and etcd takes 128 comparisons per transaction.
	MaxChunks = 120
	// MaxDeltaBytes bounds one stored delta; a larger one is written as a new base.
	MaxDeltaBytes = 900 << 10
	// MaxManifestBytes bounds a manifest as read.
	MaxManifestBytes = 64 << 10
)

// ManifestKey, ChunkKey and DeltaKey are the etcd keys of a list's parts.
func ManifestKey(name string) string       { return Prefix + name + "/manifest" }
func ChunkKey(name, sum string) string     { return Prefix + name + "/chunks/" + sum }
func DeltaKey(name string, v int64) string { return fmt.Sprintf("%s%s/deltas/%020d", Prefix, name, v) }
func chunkPrefix(name string) string       { return Prefix + name + "/chunks/" }
func deltaPrefix(name string) string       { return Prefix + name + "/deltas/" }

// CheckName returns an error unless name may name a list: a store name
// (store.CheckName), so never holding a '/'.
func CheckName(name string) error {
	if err := store.CheckName(name); err != nil {
		return fmt.Errorf("blacklist name: %w", err)
	}
	return nil
}

// Manifest is a list's small record: its version, the chunks of its base and the
// range of deltas written since. Its JSON is the value of ManifestKey.
type Manifest struct {
	Name string `json:"name"`
	// Version is the list's version: one more per accepted write (a replace or a
	// delta); a compaction keeps it.
	Version int64 `json:"version"`
	// Base is the whole list at Base.Version.
	Base Base `json:"base"`
	// Deltas are the deltas after the base: versions From to To, each stored at
	// DeltaKey; From is 0 when there are none.
	Deltas DeltaRange `json:"deltas"`
	// Entries is the size of the list: the base's entries plus the deltas' additions
	// less their removals (an estimate until the next compaction: an addition of an
	// address already listed counts).
	Entries int64 `json:"entries"`
	// Updated is when the last write was made, and Who made it.
	Updated time.Time `json:"updated"`
	Who     string    `json:"who,omitempty"`
}

// Base is a list's base: its chunks in address order.
type Base struct {
	Version int64      `json:"version"`
	Entries int64      `json:"entries"`
	Bytes   int64      `json:"bytes"`
	Chunks  []ChunkRef `json:"chunks"`
}

// ChunkRef names one chunk of a base by the SHA-256 of its bytes.
type ChunkRef struct {
	SHA256  string `json:"sha256"`
	Entries int    `json:"entries"`
	Bytes   int    `json:"bytes"`
}

// DeltaRange is the deltas after a base.
type DeltaRange struct {
	From  int64 `json:"from"`
	To    int64 `json:"to"`
	Bytes int64 `json:"bytes"`
}

// Count is how many deltas there are.
func (d DeltaRange) Count() int64 {
	if d.From == 0 {
		return 0
	}
	return d.To - d.From + 1
}

// DecodeManifest reads a manifest and checks that it holds together.
func DecodeManifest(name string, data []byte) (*Manifest, error) {
	if len(data) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest of %s: %d bytes, over %d", name, len(data), MaxManifestBytes)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", name, err)
	}
	if err := m.check(name); err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", name, err)
	}
	return &m, nil
}

func (m *Manifest) check(name string) error {
	switch {
	case m.Name != name:
		return fmt.Errorf("name %q, not %q", m.Name, name)
	case m.Version < 0 || m.Base.Version < 0 || m.Base.Version > m.Version:
		return fmt.Errorf("version %d with base %d", m.Version, m.Base.Version)
	case len(m.Base.Chunks) > MaxChunks:
		return fmt.Errorf("%d chunks, over %d", len(m.Base.Chunks), MaxChunks)
	}
	if m.Deltas.From == 0 {
		if m.Deltas.To != 0 || m.Version != m.Base.Version {
			return fmt.Errorf("version %d, base %d and no deltas", m.Version, m.Base.Version)
		}
	} else if m.Deltas.From != m.Base.Version+1 || m.Deltas.To != m.Version {
		return fmt.Errorf("deltas %d to %d do not follow base %d up to version %d", m.Deltas.From, m.Deltas.To, m.Base.Version, m.Version)
	}
	for i, c := range m.Base.Chunks {
		if !validSum(c.SHA256) || c.Bytes < 0 || c.Bytes > MaxChunkBytes || c.Entries < 0 {
			return fmt.Errorf("chunk %d: %q of %d bytes", i, c.SHA256, c.Bytes)
		}
	}
	return nil
}

func validSum(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func sum(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// ErrCorrupt reports a chunk or delta whose bytes are not what its manifest says.
var ErrCorrupt = errors.New("corrupt")

// chunk is one encoded chunk of a base.
type chunk struct {
	ref  ChunkRef
	data []byte
}

// encodeChunks cuts the entries of s, in address order, into chunks of the
// policy/blacklist binary format, each within MaxChunkBytes. The entries are cut
// in one pass; each chunk is built and encoded by a goroutine of its own, as many
// at once as there are CPUs.
func encodeChunks(s *blacklist.Set) ([]chunk, error) { return encodeChunksEach(s, nil) }

// encodeChunksEach is encodeChunks calling each (when not nil) with every chunk
// as soon as it is encoded, from the goroutine that encoded it, while the next
// are encoded: the first error of each stops the encoding and is returned.
func encodeChunksEach(s *blacklist.Set, each func(chunk) error) ([]chunk, error) {
	var (
		mu    sync.Mutex
		parts [][]chunk
		first error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, runtime.GOMAXPROCS(0))
	)
	b := new(blacklist.Builder)
	n, est := 0, 0
	var prev4 uint32
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return first != nil
	}
	flush := func() {
		if n == 0 || failed() {
			return
		}
		mu.Lock()
		i := len(parts)
		parts = append(parts, nil)
		mu.Unlock()
		full, entries := b, n
		b = new(blacklist.Builder)
		n, est = 0, 0
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs, err := encodeChunk(full.Build(), entries)
			<-sem // each (a write to the store) waits, not the CPU: another chunk is encoded meanwhile
			for _, c := range cs {
				if err != nil || each == nil {
					break
				}
				err = each(c)
			}
			mu.Lock()
			defer mu.Unlock()
			parts[i] = cs
			if err != nil && first == nil {
				first = err
			}
		}()
	}
	for e := range s.All() {
		add := estimate(e, &prev4)
		if est+add > targetChunkBytes {
			flush()
		}
		b.Add(e.Prefix, e.Expires)
		n++
		est += add
	}
	flush()
	wg.Wait()
	if first != nil {
		return nil, first
	}
	var out []chunk
	for _, cs := range parts {
		out = append(out, cs...)
	}
	if len(out) > MaxChunks {
		return nil, fmt.Errorf("the list takes %d chunks, over %d: %w", len(out), MaxChunks, store.ErrTooLarge)
	}
	return out, nil
}

// encodeChunk encodes s (n entries as given) as one chunk, or as two halves and
// so on when it is over MaxChunkBytes.
func encodeChunk(s *blacklist.Set, n int) ([]chunk, error) {
	var buf bytes.Buffer
	if err := blacklist.WriteBinary(&buf, s); err != nil {
		return nil, fmt.Errorf("encoding a chunk: %w", err)
	}
	if buf.Len() <= MaxChunkBytes {
		data := buf.Bytes()
		return []chunk{{ref: ChunkRef{SHA256: sum(data), Entries: n, Bytes: len(data)}, data: data}}, nil
	}
	var lo, hi blacklist.Builder
	var nl, nh int
	half := n / 2
	i := 0
	for e := range s.All() {
		if i < half {
			lo.Add(e.Prefix, e.Expires)
			nl++
		} else {
			hi.Add(e.Prefix, e.Expires)
			nh++
		}
		i++
	}
	if nl == 0 || nh == 0 {
		return nil, fmt.Errorf("a chunk of %d entries is %d bytes, over %d", n, buf.Len(), MaxChunkBytes)
	}
	a, err := encodeChunk(lo.Build(), nl)
	if err != nil {
		return nil, err
	}
	b, err := encodeChunk(hi.Build(), nh)
	if err != nil {
		return nil, err
	}
	return append(a, b...), nil
}

// estimate is a bound of the bytes an entry takes in the binary format: exact for
// an IPv4 address (the gap to the previous one), the largest record otherwise.
func estimate(e blacklist.Entry, prev4 *uint32) int {
	exp := 0
	if !e.Expires.IsZero() {
		exp = 4
	}
	a := e.Prefix.Addr()
	switch {
	case a.Is4() && e.Prefix.Bits() == 32:
		b := a.As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		gap := v - *prev4
		*prev4 = v
		n := 1
		for gap >= 0x80 {
			gap >>= 7
			n++
		}
		return n + exp
	case a.Is4():
		return 10 + exp
	case e.Prefix.Bits() == 128:
		return 16 + exp
	}
	return 32 + exp
}

// checkChunk checks a chunk's bytes against its reference: size and SHA-256.
func checkChunk(ref ChunkRef, data []byte) error {
	if len(data) != ref.Bytes || sum(data) != ref.SHA256 {
		return fmt.Errorf("chunk %s: %d bytes whose SHA-256 is not the manifest's: %w", ref.SHA256, len(data), ErrCorrupt)
	}
	return nil
}

// decodeChunk checks a chunk's bytes against its reference and decodes them.
func decodeChunk(ref ChunkRef, data []byte) (*blacklist.Set, error) {
	if err := checkChunk(ref, data); err != nil {
		return nil, err
	}
	s, err := blacklist.ReadBinary(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w: %w", ref.SHA256, ErrCorrupt, err)
	}
	return s, nil
}

// DeltaRecord is one stored delta: the JSON value of DeltaKey.
type DeltaRecord struct {
	Version int64      `json:"version"`
	Who     string     `json:"who,omitempty"`
	Time    time.Time  `json:"time"`
	Add     []DeltaAdd `json:"add,omitempty"`
	Remove  []string   `json:"remove,omitempty"`
}

// DeltaAdd is one addition of a delta: a prefix, its expiry in Unix seconds (0:
// never) and why.
type DeltaAdd struct {
	Prefix  string `json:"p"`
	Expires int64  `json:"x,omitempty"`
	Reason  string `json:"r,omitempty"`
}

// Meta is what a write records besides its entries: who made it and, for each
// addition of a delta, why (Reasons[i] for Delta.Add[i]; shorter or nil for none).
type Meta struct {
	Who     string
	Reasons []string
}

func encodeDelta(v int64, d *blacklist.Delta, meta Meta, now time.Time) ([]byte, error) {
	rec := DeltaRecord{Version: v, Who: meta.Who, Time: now.UTC(), Add: make([]DeltaAdd, len(d.Add)), Remove: make([]string, len(d.Remove))}
	for i, e := range d.Add {
		if !e.Prefix.IsValid() {
			return nil, fmt.Errorf("addition %d: %w", i, blacklist.ErrInvalidPrefix)
		}
		a := DeltaAdd{Prefix: e.Prefix.Masked().String()}
		if !e.Expires.IsZero() {
			a.Expires = e.Expires.Unix()
			if e.Expires.Nanosecond() > 0 {
				a.Expires++
			}
		}
		if i < len(meta.Reasons) {
			a.Reason = meta.Reasons[i]
		}
		rec.Add[i] = a
	}
	for i, p := range d.Remove {
		if !p.IsValid() {
			return nil, fmt.Errorf("removal %d: %w", i, blacklist.ErrInvalidPrefix)
		}
		rec.Remove[i] = p.Masked().String()
	}
	return json.Marshal(rec)
}

// DecodeDelta reads a stored delta of version v.
func DecodeDelta(v int64, data []byte) (*blacklist.Delta, *DeltaRecord, error) {
	if len(data) > MaxDeltaBytes+MaxDeltaBytes/2 {
		return nil, nil, fmt.Errorf("delta %d: %d bytes: %w", v, len(data), ErrCorrupt)
	}
	var rec DeltaRecord
	if !deltaFast(data, &rec) {
		rec = DeltaRecord{}
		if err := json.Unmarshal(data, &rec); err != nil {
			return nil, nil, fmt.Errorf("delta %d: %w: %w", v, ErrCorrupt, err)
		}
	}
	if rec.Version != v {
		return nil, nil, fmt.Errorf("delta %d holds version %d: %w", v, rec.Version, ErrCorrupt)
	}
	d := &blacklist.Delta{Add: make([]blacklist.Entry, 0, len(rec.Add)), Remove: make([]netip.Prefix, 0, len(rec.Remove))}
	for i, a := range rec.Add {
		p, err := parsePrefix(a.Prefix)
		if err != nil {
			return nil, nil, fmt.Errorf("delta %d: addition %d: %w: %w", v, i, ErrCorrupt, err)
		}
		var exp time.Time
		if a.Expires < 0 || a.Expires > 1<<32 {
			return nil, nil, fmt.Errorf("delta %d: addition %d: expiry %d: %w", v, i, a.Expires, ErrCorrupt)
		}
		if a.Expires > 0 {
			exp = time.Unix(a.Expires, 0)
		}
		d.Add = append(d.Add, blacklist.Entry{Prefix: p, Expires: exp})
	}
	for i, r := range rec.Remove {
		p, err := parsePrefix(r)
		if err != nil {
			return nil, nil, fmt.Errorf("delta %d: removal %d: %w: %w", v, i, ErrCorrupt, err)
		}
		d.Remove = append(d.Remove, p)
	}
	return d, &rec, nil
}

// parsePrefix reads a prefix or a single address.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// combine folds deltas applied one after the other into one delta with the same
// effect: every removal, then each addition less what later deltas removed.
func combine(ds []*blacklist.Delta) (*blacklist.Delta, error) {
	if len(ds) == 1 {
		return ds[0], nil
	}
	out := &blacklist.Delta{}
	var later []netip.Prefix
	for i := len(ds) - 1; i >= 0; i-- {
		d := ds[i]
		if len(d.Add) > 0 {
			if len(later) == 0 {
				out.Add = append(out.Add, d.Add...)
			} else {
				var b blacklist.Builder
				for _, e := range d.Add {
					b.Add(e.Prefix, e.Expires)
				}
				l := blacklist.NewList("", blacklist.Options{})
				l.Replace(b.Build())
				if err := l.Apply(&blacklist.Delta{Remove: later}); err != nil {
					return nil, err
				}
				out.Add = appendAll(out.Add, l.Snapshot().All())
			}
		}
		later = append(later, d.Remove...)
	}
	out.Remove = later
	return out, nil
}

func appendAll(dst []blacklist.Entry, seq iter.Seq[blacklist.Entry]) []blacklist.Entry {
	for e := range seq {
		dst = append(dst, e)
	}
	return dst
}
