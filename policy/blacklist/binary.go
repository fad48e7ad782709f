package blacklist

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"time"
)

// binaryMagic opens the binary format; its first byte is not text, like PNG's.
var binaryMagic = []byte("\x89TGBL\r\n\x1a")

const (
	binaryVersion = 1
	headerLen     = 12
	trailerLen    = 4
	// MaxInputBytes bounds an upload after decompression.
	MaxInputBytes int64 = 4 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Why a binary upload is refused: the Err of a *BinaryError is one of these or
// ErrTooManyEntries.
var (
	ErrNotBinary = errors.New("not a binary blacklist")
	ErrVersion   = errors.New("unsupported version")
	ErrChecksum  = errors.New("checksum mismatch")
	ErrTruncated = errors.New("truncated")
	ErrCorrupt   = errors.New("corrupt")
	ErrTooLarge  = fmt.Errorf("larger than %d bytes", MaxInputBytes)
)

// A BinaryError is a refused binary upload.
type BinaryError struct {
	Offset int64 // where in the (decompressed) input
	Err    error
	Detail string
}

func (e *BinaryError) Error() string {
	s := fmt.Sprintf("binary blacklist, byte %d: %v", e.Offset, e.Err)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *BinaryError) Unwrap() error { return e.Err }

// section kinds, in the order they are written.
const (
	secAddrs4 = iota
	secRanges4
	secAddrs6
	secRanges6
	numKinds
)

// minRecord is the smallest encoding of a record of each kind, without expiry.
var minRecord = [numKinds]int{1, 2, 16, 32}

// WriteBinary writes s in the binary format described in the package documentation.
func WriteBinary(w io.Writer, s *Set) error {
	if s == nil {
		s = emptySet
	}
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 64<<10)
	var hdr [headerLen]byte
	copy(hdr[:], binaryMagic)
	binary.BigEndian.PutUint16(hdr[8:], binaryVersion)
	bw.Write(hdr[:])
	var buf []byte
	put := func() {
		bw.Write(buf)
		buf = buf[:0]
	}
	for _, tab := range []struct {
		s4 *singles4
		r4 *ranges4
		s6 *singles6
		r6 *ranges6
	}{{s4: &s.p4}, {r4: &s.pr4}, {s6: &s.p6}, {r6: &s.pr6}, {s4: &s.e4}, {r4: &s.er4}, {s6: &s.e6}, {r6: &s.er6}} {
		switch {
		case tab.s4 != nil:
			keys := tab.s4.t.appendKeys(nil)
			buf = binary.AppendUvarint(buf, uint64(len(keys)))
			for i, k := range keys {
				if i == 0 {
					buf = binary.AppendUvarint(buf, uint64(k))
				} else {
					buf = binary.AppendUvarint(buf, uint64(k-keys[i-1]-1))
				}
				buf = appendExp(buf, tab.s4.exp, i)
				if len(buf) > 32<<10 {
					put()
				}
			}
		case tab.r4 != nil:
			starts := tab.r4.start.appendKeys(nil)
			buf = binary.AppendUvarint(buf, uint64(len(starts)))
			for i, k := range starts {
				if i == 0 {
					buf = binary.AppendUvarint(buf, uint64(k))
				} else {
					buf = binary.AppendUvarint(buf, uint64(k-tab.r4.end[i-1]-1))
				}
				buf = binary.AppendUvarint(buf, uint64(tab.r4.end[i]-k))
				buf = appendExp(buf, tab.r4.exp, i)
				if len(buf) > 32<<10 {
					put()
				}
			}
		case tab.s6 != nil:
			buf = binary.AppendUvarint(buf, uint64(tab.s6.t.n))
			for i, k := range tab.s6.t.keys {
				buf = append6(buf, k)
				buf = appendExp(buf, tab.s6.exp, i)
				if len(buf) > 32<<10 {
					put()
				}
			}
		default:
			buf = binary.AppendUvarint(buf, uint64(tab.r6.start.n))
			for i, k := range tab.r6.start.keys {
				buf = append6(buf, k)
				buf = append6(buf, tab.r6.end[i])
				buf = appendExp(buf, tab.r6.exp, i)
				if len(buf) > 32<<10 {
					put()
				}
			}
		}
	}
	put()
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing a binary blacklist: %w", err)
	}
	if _, err := w.Write(crc.Sum(nil)); err != nil {
		return fmt.Errorf("writing a binary blacklist: %w", err)
	}
	return nil
}

func appendExp(b []byte, exp []uint32, i int) []byte {
	if exp == nil {
		return b
	}
	return binary.BigEndian.AppendUint32(b, exp[i])
}

func append6(b []byte, k a6) []byte {
	b = binary.BigEndian.AppendUint64(b, k.hi)
	return binary.BigEndian.AppendUint64(b, k.lo)
}

// ReadBinary reads a list in the binary format, gzip-compressed or not. The whole
// input is checked (size, checksum, every count against the bytes present) before
// any entry is kept; entries already expired are left out.
func ReadBinary(r io.Reader) (*Set, error) {
	br := bufio.NewReader(r)
	br, closer, err := gunzip(br)
	if err != nil {
		return nil, err
	}
	if closer != nil {
		defer closer.Close()
	}
	return readBinary(br, time.Now())
}

func readBinary(r io.Reader, now time.Time) (*Set, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading a binary blacklist: %w", err)
	}
	if int64(len(data)) > MaxInputBytes {
		return nil, &BinaryError{Offset: MaxInputBytes, Err: ErrTooLarge}
	}
	return decodeBinary(data, now)
}

func decodeBinary(data []byte, now time.Time) (*Set, error) {
	if len(data) < len(binaryMagic) || !bytes.Equal(data[:len(binaryMagic)], binaryMagic) {
		return nil, &BinaryError{Err: ErrNotBinary}
	}
	if len(data) < headerLen+trailerLen {
		return nil, &BinaryError{Offset: int64(len(data)), Err: ErrTruncated}
	}
	if v := binary.BigEndian.Uint16(data[8:]); v != binaryVersion {
		return nil, &BinaryError{Offset: 8, Err: ErrVersion, Detail: fmt.Sprintf("version %d, want %d", v, binaryVersion)}
	}
	if f := binary.BigEndian.Uint16(data[10:]); f != 0 {
		return nil, &BinaryError{Offset: 10, Err: ErrCorrupt, Detail: fmt.Sprintf("unknown flags %#x", f)}
	}
	body := len(data) - trailerLen
	if got, want := crc32.Checksum(data[:body], castagnoli), binary.BigEndian.Uint32(data[body:]); got != want {
		return nil, &BinaryError{Offset: int64(body), Err: ErrChecksum, Detail: fmt.Sprintf("computed %#08x, stored %#08x", got, want)}
	}
	d := decoder{data: data[:body], off: headerLen}
	for sec := range 2 * numKinds {
		if err := d.section(sec%numKinds, sec >= numKinds); err != nil {
			return nil, err
		}
	}
	if d.off != body {
		return nil, &BinaryError{Offset: int64(d.off), Err: ErrCorrupt, Detail: fmt.Sprintf("%d bytes after the last section", body-d.off)}
	}
	b := Builder{v4: chunks[span[a4]]{cur: d.v4, n: len(d.v4)}, v6: chunks[span[a6]]{cur: d.v6, n: len(d.v6)}}
	return b.BuildAt(now), nil
}

type decoder struct {
	data    []byte
	off     int
	total   int
	v4      []span[a4]
	v6      []span[a6]
	pending int // the offset of the record being read, for errors
}

func (d *decoder) fail(err error, format string, args ...any) error {
	return &BinaryError{Offset: int64(d.pending), Err: err, Detail: fmt.Sprintf(format, args...)}
}

func (d *decoder) uvarint() (uint64, error) {
	v, n := binary.Uvarint(d.data[d.off:])
	switch {
	case n == 0:
		return 0, d.fail(ErrTruncated, "in a varint")
	case n < 0:
		return 0, d.fail(ErrCorrupt, "varint overflows 64 bits")
	}
	d.off += n
	return v, nil
}

func (d *decoder) fixed(n int) ([]byte, error) {
	if len(d.data)-d.off < n {
		return nil, d.fail(ErrTruncated, "want %d bytes, have %d", n, len(d.data)-d.off)
	}
	b := d.data[d.off : d.off+n]
	d.off += n
	return b, nil
}

func (d *decoder) exp(expiring bool) (uint32, error) {
	if !expiring {
		return expPermanent, nil
	}
	b, err := d.fixed(4)
	if err != nil {
		return 0, err
	}
	e := binary.BigEndian.Uint32(b)
	if e == expPermanent {
		return 0, d.fail(ErrCorrupt, "an expiring record that never expires")
	}
	return e, nil
}

func (d *decoder) section(kind int, expiring bool) error {
	d.pending = d.off
	count, err := d.uvarint()
	if err != nil {
		return err
	}
	if count > uint64(MaxEntries-d.total) {
		return d.fail(ErrTooManyEntries, "section %d holds %d records", kind+1, count)
	}
	rec := minRecord[kind]
	if expiring {
		rec += 4
	}
	if have := len(d.data) - d.off; count > uint64(have/rec) {
		return d.fail(ErrTruncated, "section %d holds %d records of at least %d bytes; %d bytes remain", kind+1, count, rec, have)
	}
	n := int(count)
	d.total += n
	if kind == secAddrs4 || kind == secRanges4 {
		d.v4 = slices.Grow(d.v4, n)
	} else {
		d.v6 = slices.Grow(d.v6, n)
	}
	var prev uint64 // the last IPv4 address of the previous record
	for i := range n {
		d.pending = d.off
		switch kind {
		case secAddrs4, secRanges4:
			v, err := d.uvarint()
			if err != nil {
				return err
			}
			if v > 0xffff_ffff {
				return d.fail(ErrCorrupt, "IPv4 record %d of section %d is past 255.255.255.255", i, kind+1)
			}
			lo := v
			if i > 0 {
				lo = prev + 1 + v
			}
			hi := lo
			if kind == secRanges4 {
				l, err := d.uvarint()
				if err != nil {
					return err
				}
				if l > 0xffff_ffff {
					return d.fail(ErrCorrupt, "IPv4 record %d of section %d is past 255.255.255.255", i, kind+1)
				}
				hi = lo + l
			}
			if hi > 0xffff_ffff {
				return d.fail(ErrCorrupt, "IPv4 record %d of section %d is past 255.255.255.255", i, kind+1)
			}
			prev = hi
			e, err := d.exp(expiring)
			if err != nil {
				return err
			}
			d.v4 = append(d.v4, span[a4]{a4(lo), a4(hi), e})
		default:
			b, err := d.fixed(minRecord[kind])
			if err != nil {
				return err
			}
			lo := from16([16]byte(b[:16]))
			hi := lo
			if kind == secRanges6 {
				hi = from16([16]byte(b[16:32]))
				if hi.less(lo) {
					return d.fail(ErrCorrupt, "IPv6 range %d of section %d ends before it starts", i, kind+1)
				}
			}
			e, err := d.exp(expiring)
			if err != nil {
				return err
			}
			d.v6 = append(d.v6, span[a6]{lo, hi, e})
		}
	}
	return nil
}

// gunzip returns a reader of the gzip stream r holds, or r itself if it is not gzip.
func gunzip(r *bufio.Reader) (*bufio.Reader, io.Closer, error) {
	head, _ := r.Peek(2)
	if len(head) < 2 || head[0] != 0x1f || head[1] != 0x8b {
		return r, nil, nil
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, nil, fmt.Errorf("reading a gzip blacklist: %w", err)
	}
	return bufio.NewReaderSize(&capReader{r: zr, left: MaxInputBytes}, MaxLineBytes), zr, nil
}

// capReader fails with ErrTooLarge past a size, so a small gzip cannot inflate
// without bound.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("decompressing: %w", ErrTooLarge)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// Read reads a whole list in any of the formats: gzip-compressed or not, binary
// (recognized by its magic) or text.
func Read(r io.Reader) (*Set, error) { return read(r, time.Now()) }

func read(r io.Reader, now time.Time) (*Set, error) {
	br, closer, err := gunzip(bufio.NewReaderSize(r, MaxLineBytes))
	if err != nil {
		return nil, err
	}
	if closer != nil {
		defer closer.Close()
	}
	if head, _ := br.Peek(len(binaryMagic)); bytes.Equal(head, binaryMagic) {
		return readBinary(br, now)
	}
	return parseText(br, now)
}

// ReadDelta reads a text delta, gzip-compressed or not; see ParseTextDelta.
func ReadDelta(r io.Reader) (*Delta, error) { return readDelta(r, time.Now()) }

func readDelta(r io.Reader, now time.Time) (*Delta, error) {
	br, closer, err := gunzip(bufio.NewReaderSize(r, MaxLineBytes))
	if err != nil {
		return nil, err
	}
	if closer != nil {
		defer closer.Close()
	}
	return parseTextDelta(br, now)
}
