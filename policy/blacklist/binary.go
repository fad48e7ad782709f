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
	"sort"
	"time"
)

// binaryMagic opens the binary format; its first byte is not text, like PNG's.
var binaryMagic = []byte("\x89TGBL\r\n\x1a")

const (
	binaryVersion = 1
	headerLen     = 12
	trailerLen    = 4
	// MaxInputBytes bounds a list read by Read or ReadBinary after decompression, and
	// each of UploadLimits' sizes.
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
	ErrTooLarge  = errors.New("too large") // wrapped by a *LimitError, which says which limit
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
	var sc scratch
	defer sc.free()
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
	secs := writeSections(&sc, s)
	for k, sec := range secs {
		switch kind := k % numKinds; kind {
		case secAddrs4:
			buf = binary.AppendUvarint(buf, uint64(len(sec.k4)))
			for i, k := range sec.k4 {
				if i == 0 {
					buf = binary.AppendUvarint(buf, uint64(k))
				} else {
					buf = binary.AppendUvarint(buf, uint64(k-sec.k4[i-1]-1))
				}
				buf = appendExp(buf, sec.exp, i)
				if len(buf) > 32<<10 {
					put()
				}
			}
		case secRanges4:
			buf = binary.AppendUvarint(buf, uint64(len(sec.k4)))
			for i, k := range sec.k4 {
				if i == 0 {
					buf = binary.AppendUvarint(buf, uint64(k))
				} else {
					buf = binary.AppendUvarint(buf, uint64(k-sec.end4[i-1]-1))
				}
				buf = binary.AppendUvarint(buf, uint64(sec.end4[i]-k))
				buf = appendExp(buf, sec.exp, i)
				if len(buf) > 32<<10 {
					put()
				}
			}
		case secAddrs6:
			buf = binary.AppendUvarint(buf, uint64(len(sec.k6)))
			for i, k := range sec.k6 {
				buf = append6(buf, k)
				buf = appendExp(buf, sec.exp, i)
				if len(buf) > 32<<10 {
					put()
				}
			}
		default:
			buf = binary.AppendUvarint(buf, uint64(len(sec.k6)))
			for i, k := range sec.k6 {
				buf = append6(buf, k)
				buf = append6(buf, sec.end6[i])
				buf = appendExp(buf, sec.exp, i)
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

// section is what one section of the binary format lists: keys (single addresses
// or range starts), range ends, expiries (nil for permanent entries).
type section struct {
	k4, end4 []a4
	k6, end6 []a6
	exp      []uint32
}

// writeSections returns s's entries by section, in the order written; arrays that
// are not the Set's own are taken from sc. A Set with an overlay is merged first.
func writeSections(sc *scratch, s *Set) [2 * numKinds]section {
	keys := func(t *t4) []a4 { return t.appendKeys(grab[a4](sc, t.n)) }
	if o := s.ov; o != nil {
		// Each table of the merged list is the base's entries outside the windows
		// (which never cut one) and the patch's, in order.
		w4, w6, p := o.windows4(sc), o.windows6(sc), o.patch
		var out [2 * numKinds]section
		out[0].k4, _, _ = outsideMerge(sc, w4, keys(&s.p4.t), nil, nil, keys(&p.p4.t), nil, nil)
		out[1].k4, out[1].end4, _ = outsideMerge(sc, w4, keys(&s.pr4.start), s.pr4.end, nil, keys(&p.pr4.start), p.pr4.end, nil)
		out[2].k6, _, _ = outsideMerge(sc, w6, s.p6.t.keys, nil, nil, p.p6.t.keys, nil, nil)
		out[3].k6, out[3].end6, _ = outsideMerge(sc, w6, s.pr6.start.keys, s.pr6.end, nil, p.pr6.start.keys, p.pr6.end, nil)
		out[4].k4, _, out[4].exp = outsideMerge(sc, w4, keys(&s.e4.t), nil, s.e4.exp, keys(&p.e4.t), nil, p.e4.exp)
		out[5].k4, out[5].end4, out[5].exp = outsideMerge(sc, w4, keys(&s.er4.start), s.er4.end, s.er4.exp, keys(&p.er4.start), p.er4.end, p.er4.exp)
		out[6].k6, _, out[6].exp = outsideMerge(sc, w6, s.e6.t.keys, nil, s.e6.exp, p.e6.t.keys, nil, p.e6.exp)
		out[7].k6, out[7].end6, out[7].exp = outsideMerge(sc, w6, s.er6.start.keys, s.er6.end, s.er6.exp, p.er6.start.keys, p.er6.end, p.er6.exp)
		return out
	}
	return [2 * numKinds]section{
		{k4: keys(&s.p4.t)}, {k4: keys(&s.pr4.start), end4: s.pr4.end},
		{k6: s.p6.t.keys}, {k6: s.pr6.start.keys, end6: s.pr6.end},
		{k4: keys(&s.e4.t), exp: s.e4.exp}, {k4: keys(&s.er4.start), end4: s.er4.end, exp: s.er4.exp},
		{k6: s.e6.t.keys, exp: s.e6.exp}, {k6: s.er6.start.keys, end6: s.er6.end, exp: s.er6.exp},
	}
}

// outsideMerge merges one table of a base (keys bk, range ends bend and expiries
// bexp, nil when the table has none) less its entries inside the windows win, and
// the same table of a patch (pk, pend, pexp), in key order, into arrays taken from
// sc.
func outsideMerge[K key[K]](sc *scratch, win []span[K], bk, bend []K, bexp []uint32, pk, pend []K, pexp []uint32) (k, end []K, exp []uint32) {
	n := len(bk) + len(pk)
	k = grab[K](sc, n)
	if bend != nil || pend != nil {
		end = grab[K](sc, n)
	}
	if bexp != nil || pexp != nil {
		exp = grab[uint32](sc, n)
	}
	i, j, w := 0, 0, 0
	for i < len(bk) || j < len(pk) {
		if i < len(bk) {
			for w < len(win) && win[w].hi.less(bk[i]) {
				w++
			}
			if w < len(win) && !bk[i].less(win[w].lo) {
				i++ // inside a window: the patch holds what the list holds there
				continue
			}
		}
		if j == len(pk) || i < len(bk) && bk[i].less(pk[j]) {
			// Base entries up to the next window or patch entry, in one go.
			stop := len(bk)
			if w < len(win) {
				stop = i + sort.Search(len(bk)-i, func(x int) bool { return !bk[i+x].less(win[w].lo) })
			}
			if j < len(pk) {
				stop = i + sort.Search(stop-i, func(x int) bool { return !bk[i+x].less(pk[j]) })
			}
			k = appendYielding(k, bk[i:stop])
			if end != nil {
				end = appendYielding(end, bend[i:stop])
			}
			if exp != nil {
				exp = appendYielding(exp, bexp[i:stop])
			}
			i = stop
		} else {
			k = append(k, pk[j])
			if end != nil {
				end = append(end, pend[j])
			}
			if exp != nil {
				exp = append(exp, pexp[j])
			}
			j++
		}
	}
	return k, end, exp
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

// ReadBinary reads a list in the binary format, gzip-compressed or not, as a stream:
// memory grows with the entries, never with the bytes. Nothing is kept unless the
// whole input is good: header, every record, no bytes after the last section, and the
// checksum, which is the error reported when it does not match, whatever else is
// wrong. Entries already expired are left out.
func ReadBinary(r io.Reader) (*Set, error) {
	br, _, closer, err := open(r, fileLimits)
	if err != nil {
		return nil, err
	}
	if closer != nil {
		defer closer.Close()
	}
	return readBinary(br, time.Now(), fileLimits)
}

// decodeBinary reads a whole binary list held in memory.
func decodeBinary(data []byte, now time.Time) (*Set, error) {
	return readBinary(bytes.NewReader(data), now, fileLimits)
}

// readBinary decodes the binary format from r, within lim's entries; r's size is
// bounded by whoever made it.
func readBinary(r io.Reader, now time.Time, lim limits) (*Set, error) {
	t := &tailReader{r: r, buf: make([]byte, 32<<10)}
	d := decoder{r: bufio.NewReaderSize(t, 64<<10), t: t, max: lim.maxEntries(), lim: lim}
	d.b.init()
	defer d.b.Reset()
	if err := d.decode(); err != nil {
		return nil, err
	}
	return d.b.BuildAt(now), nil
}

// tailReader hands out all of r but its last trailerLen bytes, which it holds back
// (at the end, the trailer), and the CRC-32C of what it handed out.
type tailReader struct {
	r   io.Reader
	buf []byte
	n   int // buf[:n] is read and not handed out; its last trailerLen bytes are held
	eof bool
	crc uint32
}

func (t *tailReader) Read(p []byte) (int, error) {
	for t.n <= trailerLen && !t.eof {
		k, err := t.r.Read(t.buf[t.n:])
		t.n += k
		if errors.Is(err, io.EOF) {
			t.eof = true
		} else if err != nil {
			return 0, err
		}
	}
	avail := t.n - trailerLen
	if avail <= 0 {
		return 0, io.EOF
	}
	k := copy(p, t.buf[:avail])
	t.crc = crc32.Update(t.crc, castagnoli, p[:k])
	t.n = copy(t.buf, t.buf[k:t.n])
	return k, nil
}

// held returns the bytes held back: at the end, the trailer (fewer than trailerLen
// when the input was shorter).
func (t *tailReader) held() []byte { return t.buf[:t.n] }

// decoder reads the binary format from a stream. off counts the bytes read, for
// errors; pending is the offset of the record being read.
type decoder struct {
	r       *bufio.Reader
	t       *tailReader
	off     int64
	pending int64
	total   int
	max     int // entries
	lim     limits
	b       Builder
	scratch [32]byte
}

func (d *decoder) fail(err error, format string, args ...any) error {
	return &BinaryError{Offset: d.pending, Err: err, Detail: fmt.Sprintf(format, args...)}
}

// readErr reports a failure to read the input itself (too large, a broken gzip
// stream), at the current offset.
func (d *decoder) readErr(err error) error {
	return &BinaryError{Offset: d.off, Err: err}
}

func (d *decoder) decode() error {
	hdr := d.scratch[:headerLen]
	n, err := io.ReadFull(d.r, hdr)
	d.off = int64(n)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		// Shorter than a header and a trailer: what was read and what is held is
		// all there is.
		all := append(hdr[:n:n], d.t.held()...)
		if !bytes.HasPrefix(all, binaryMagic) {
			return &BinaryError{Err: ErrNotBinary}
		}
		return &BinaryError{Offset: int64(len(all)), Err: ErrTruncated}
	default:
		return d.readErr(err)
	}
	if !bytes.Equal(hdr[:len(binaryMagic)], binaryMagic) {
		return &BinaryError{Err: ErrNotBinary}
	}
	if v := binary.BigEndian.Uint16(hdr[8:]); v != binaryVersion {
		return &BinaryError{Offset: 8, Err: ErrVersion, Detail: fmt.Sprintf("version %d, want %d", v, binaryVersion)}
	}
	if f := binary.BigEndian.Uint16(hdr[10:]); f != 0 {
		return &BinaryError{Offset: 10, Err: ErrCorrupt, Detail: fmt.Sprintf("unknown flags %#x", f)}
	}
	for sec := range 2 * numKinds {
		if err := d.section(sec%numKinds, sec >= numKinds); err != nil {
			return d.settle(err)
		}
	}
	d.pending = d.off
	extra, err := io.Copy(io.Discard, d.r)
	d.off += extra
	if err != nil {
		return d.readErr(err)
	}
	if err := d.checksum(); err != nil {
		return err
	}
	if extra > 0 {
		return d.fail(ErrCorrupt, "%d bytes after the last section", extra)
	}
	return nil
}

// settle decides what to report for err, met in the sections: a limit passed or a
// read error is reported at once; for a record that is corrupt or cut short, the
// rest of the input is read so that a bad checksum, which explains either, is what
// is reported.
func (d *decoder) settle(err error) error {
	var be *BinaryError
	if !errors.As(err, &be) || be.Err != ErrCorrupt && be.Err != ErrTruncated {
		return err
	}
	n, rerr := io.Copy(io.Discard, d.r)
	d.off += n
	if rerr != nil {
		return d.readErr(rerr)
	}
	if cerr := d.checksum(); cerr != nil {
		return cerr
	}
	return err
}

// checksum compares, once the input is read to its end, the trailer with the
// checksum of everything before it.
func (d *decoder) checksum() error {
	tr := d.t.held()
	body := d.t.crc
	if len(tr) < trailerLen {
		return &BinaryError{Offset: d.off + int64(len(tr)), Err: ErrTruncated, Detail: "no room for the checksum"}
	}
	if want := binary.BigEndian.Uint32(tr); body != want {
		return &BinaryError{Offset: d.off, Err: ErrChecksum, Detail: fmt.Sprintf("computed %#08x, stored %#08x", body, want)}
	}
	return nil
}

func (d *decoder) uvarint() (uint64, error) {
	var x uint64
	var s uint
	for i := range binary.MaxVarintLen64 {
		c, err := d.r.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, d.fail(ErrTruncated, "in a varint")
			}
			return 0, d.readErr(err)
		}
		d.off++
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				break
			}
			return x | uint64(c)<<s, nil
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	return 0, d.fail(ErrCorrupt, "varint overflows 64 bits")
}

func (d *decoder) fixed(n int) ([]byte, error) {
	b := d.scratch[:n]
	k, err := io.ReadFull(d.r, b)
	d.off += int64(k)
	switch {
	case err == nil:
		return b, nil
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return nil, d.fail(ErrTruncated, "want %d bytes, have %d", n, k)
	}
	return nil, d.readErr(err)
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

// section reads a section's count and its records. The count is checked against the
// entries allowed before anything is read; the records are collected as they come,
// so a count larger than the records present costs nothing.
func (d *decoder) section(kind int, expiring bool) error {
	d.pending = d.off
	count, err := d.uvarint()
	if err != nil {
		return err
	}
	if count > uint64(d.max-d.total) {
		return &BinaryError{Offset: d.pending, Err: d.lim.tooMany(), Detail: fmt.Sprintf("section %d holds %d records", kind+1, count)}
	}
	n := int(count)
	d.total += n
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
			d.b.v4.add(span[a4]{a4(lo), a4(hi), e})
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
			d.b.v6.add(span[a6]{lo, hi, e})
		}
	}
	return nil
}

// open returns a buffered reader of what r holds, decompressed when it is gzip, and
// the capReader under that buffer, which the caller bounds by the format it finds (it
// starts at the larger of lim's two, while the format is not known). r itself is bounded by lim.body.
func open(r io.Reader, lim limits) (*bufio.Reader, *capReader, io.Closer, error) {
	if lim.body > 0 {
		r = &capReader{r: r, max: lim.body, limit: "max_body_bytes"}
	}
	br := bufio.NewReaderSize(r, 64<<10)
	var src io.Reader = br
	var closer io.Closer
	if head, _ := br.Peek(2); len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			var le *LimitError
			if errors.As(err, &le) {
				return nil, nil, nil, err
			}
			return nil, nil, nil, fmt.Errorf("reading a gzip blacklist: %w", err)
		}
		src, closer = zr, zr
	}
	c := &capReader{r: src}
	c.bound(lim, lim.binary > lim.text)
	return bufio.NewReaderSize(c, MaxLineBytes), c, closer, nil
}

// bound sets c's limit to lim's for the format: binary or text.
func (c *capReader) bound(lim limits, binary bool) {
	c.max, c.limit = lim.text, "max_text_bytes"
	if binary {
		c.max, c.limit = lim.binary, "max_binary_bytes"
	}
	if !lim.named {
		c.limit = ""
	}
}

// Read reads a whole list in any of the formats: gzip-compressed or not, binary
// (recognized by its magic) or text. It takes up to MaxInputBytes after
// decompression and MaxEntries entries; uploads are read within UploadLimits by an
// Uploader.
func Read(r io.Reader) (*Set, error) { return read(r, time.Now(), fileLimits) }

func read(r io.Reader, now time.Time, lim limits) (*Set, error) {
	br, c, closer, err := open(r, lim)
	if err != nil {
		return nil, err
	}
	if closer != nil {
		defer closer.Close()
	}
	head, _ := br.Peek(len(binaryMagic))
	bin := bytes.Equal(head, binaryMagic)
	c.bound(lim, bin)
	if c.max > 0 && c.n > c.max {
		return nil, c.err()
	}
	if bin {
		return readBinary(br, now, lim)
	}
	return parseText(br, now, lim)
}

// ReadDelta reads a text delta, gzip-compressed or not; see ParseTextDelta.
func ReadDelta(r io.Reader) (*Delta, error) { return readDelta(r, time.Now(), fileLimits) }

func readDelta(r io.Reader, now time.Time, lim limits) (*Delta, error) {
	br, c, closer, err := open(r, lim)
	if err != nil {
		return nil, err
	}
	if closer != nil {
		defer closer.Close()
	}
	c.bound(lim, false)
	return parseTextDelta(br, now, lim)
}
