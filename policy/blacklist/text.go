package blacklist

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Text upload limits.
const (
	// MaxLineBytes is the longest line a text upload may have, comment included.
	MaxLineBytes = 64 << 10
	// MaxReportedErrors is how many bad lines a *ParseErrors lists; it counts all.
	MaxReportedErrors = 100
	maxErrorText      = 200
)

// Why a line is bad: the Err of a *ParseError wraps one of these.
var (
	ErrAddress      = errors.New("bad address")
	ErrPrefixLength = errors.New("bad prefix length")
	ErrExpiry       = errors.New("bad expiry")
	ErrAttribute    = errors.New("bad attribute")
	ErrSign         = errors.New("a delta line must start with + or -")
	ErrLineTooLong  = fmt.Errorf("line longer than %d bytes", MaxLineBytes)
)

// A ParseError is one bad line of a text upload.
type ParseError struct {
	Line int    // 1-based
	Text string // the line, cut to 200 bytes
	Err  error
}

func (e *ParseError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *ParseError) Unwrap() error { return e.Err }

// ParseErrors reports the bad lines of a text upload, which is then rejected whole.
type ParseErrors struct {
	Errors []*ParseError // the first MaxReportedErrors bad lines, in order
	Count  int           // how many lines were bad
}

func (e *ParseErrors) Error() string {
	var b strings.Builder
	if e.Count == 1 {
		b.WriteString("1 bad line: ")
	} else {
		fmt.Fprintf(&b, "%d bad lines: ", e.Count)
	}
	for i, pe := range e.Errors {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more", e.Count-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(pe.Error())
	}
	return b.String()
}

// Unwrap returns the listed errors, for errors.As and errors.Is.
func (e *ParseErrors) Unwrap() []error {
	errs := make([]error, len(e.Errors))
	for i, pe := range e.Errors {
		errs[i] = pe
	}
	return errs
}

func (e *ParseErrors) add(line int, text []byte, err error) {
	e.Count++
	if len(e.Errors) < MaxReportedErrors {
		if len(text) > maxErrorText {
			text = text[:maxErrorText]
		}
		e.Errors = append(e.Errors, &ParseError{Line: line, Text: string(text), Err: err})
	}
}

// ParseText reads a whole list in the text format (see the package documentation).
// Every bad line is reported, by number, in a *ParseErrors, and then no Set is
// returned. Entries with a ttl expire that long after now; entries already expired
// are left out.
func ParseText(r io.Reader) (*Set, error) { return parseText(r, time.Now(), fileLimits) }

func parseText(r io.Reader, now time.Time, lim limits) (*Set, error) {
	p := textParser{now: now, lim: lim}
	defer p.b.Reset()
	if err := p.run(r); err != nil {
		return nil, err
	}
	return p.b.BuildAt(now), nil
}

// ParseTextDelta reads a delta in the text format: lines "+entry" (an entry line as
// in a whole list, expiry allowed) and "-prefix". Bad lines are reported as by
// ParseText.
func ParseTextDelta(r io.Reader) (*Delta, error) { return parseTextDelta(r, time.Now(), fileLimits) }

func parseTextDelta(r io.Reader, now time.Time, lim limits) (*Delta, error) {
	p := textParser{now: now, delta: &Delta{}, lim: lim}
	if err := p.run(r); err != nil {
		return nil, err
	}
	return p.delta, nil
}

type textParser struct {
	now     time.Time
	lim     limits // entries; the caller bounds the bytes
	delta   *Delta // nil for a whole list
	b       Builder
	entries int
	errs    ParseErrors
}

func (p *textParser) run(r io.Reader) error {
	br := bufio.NewReaderSize(r, MaxLineBytes)
	for n := 1; ; n++ {
		raw, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			p.errs.add(n, raw, ErrLineTooLong)
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			raw = nil
		}
		if n == 1 {
			raw = bytes.TrimPrefix(raw, []byte("\xef\xbb\xbf"))
		}
		if len(raw) > 0 {
			if lerr := p.line(raw); lerr != nil {
				p.errs.add(n, bytes.TrimRight(raw, "\r\n"), lerr)
			}
			if p.entries > p.lim.maxEntries() {
				return p.lim.tooMany()
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading line %d: %w", n, err)
		}
	}
	if p.errs.Count > 0 {
		return &p.errs
	}
	return nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// nextField splits off the first whitespace-separated field of b (already trimmed).
func nextField(b []byte) (field, rest []byte) {
	i := 0
	for i < len(b) && !isSpace(b[i]) {
		i++
	}
	return b[:i], trimSpace(b[i:])
}

func (p *textParser) line(b []byte) error {
	if i := bytes.IndexByte(b, '#'); i >= 0 {
		b = b[:i]
	}
	b = trimSpace(b)
	if len(b) == 0 {
		return nil
	}
	remove := false
	if p.delta != nil {
		switch b[0] {
		case '+':
		case '-':
			remove = true
		default:
			return ErrSign
		}
		b = trimSpace(b[1:])
	}
	field, rest := nextField(b)
	pfx, err := parsePrefix(field)
	if err != nil {
		return err
	}
	exp := time.Time{}
	if len(rest) > 0 {
		if remove {
			return fmt.Errorf("%w: a removal has no expiry: %q", ErrAttribute, rest)
		}
		if exp, err = p.expiry(rest); err != nil {
			return err
		}
	}
	p.entries++
	switch {
	case p.delta == nil:
		p.b.add(pfx, expSeconds(exp))
	case remove:
		p.delta.Remove = append(p.delta.Remove, pfx)
	default:
		p.delta.Add = append(p.delta.Add, Entry{Prefix: pfx, Expires: exp})
	}
	return nil
}

// expiry parses the attributes after the address: one of expires=<RFC 3339 time or
// Unix seconds> and ttl=<Go duration or seconds>.
func (p *textParser) expiry(b []byte) (time.Time, error) {
	var exp time.Time
	seen := ""
	for len(b) > 0 {
		var f []byte
		f, b = nextField(b)
		name, val, ok := bytes.Cut(f, []byte("="))
		if !ok || len(val) == 0 {
			return exp, fmt.Errorf("%w %q: want expires=<time> or ttl=<duration>", ErrAttribute, f)
		}
		attr := string(name)
		if attr != "expires" && attr != "ttl" {
			return exp, fmt.Errorf("%w %q: want expires=<time> or ttl=<duration>", ErrAttribute, f)
		}
		if seen != "" {
			return exp, fmt.Errorf("%w: %s= after %s=", ErrAttribute, attr, seen)
		}
		seen = attr
		var err error
		if attr == "expires" {
			exp, err = parseExpires(val)
		} else {
			exp, err = parseTTL(val, p.now)
		}
		if err != nil {
			return exp, err
		}
	}
	return exp, nil
}

func parseExpires(v []byte) (time.Time, error) {
	if u, ok := parseUint(v); ok {
		if u == 0 || u >= expPermanent {
			return time.Time{}, fmt.Errorf("%w: expires=%s is out of range", ErrExpiry, v)
		}
		return time.Unix(int64(u), 0), nil
	}
	t, err := time.Parse(time.RFC3339, string(v))
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: expires=%q is neither an RFC 3339 time nor Unix seconds", ErrExpiry, v)
	}
	if t.Unix() <= 0 || t.Unix() >= expPermanent {
		return time.Time{}, fmt.Errorf("%w: expires=%s is out of range", ErrExpiry, v)
	}
	return t, nil
}

// maxTTL keeps now+ttl within what an expiry holds.
const maxTTL = 50 * 365 * 24 * time.Hour

func parseTTL(v []byte, now time.Time) (time.Time, error) {
	var d time.Duration
	if u, ok := parseUint(v); ok {
		if u > uint64(maxTTL/time.Second) {
			return time.Time{}, fmt.Errorf("%w: ttl=%s is over %v", ErrExpiry, v, maxTTL)
		}
		d = time.Duration(u) * time.Second
	} else {
		var err error
		if d, err = time.ParseDuration(string(v)); err != nil {
			return time.Time{}, fmt.Errorf("%w: ttl=%q is not a duration", ErrExpiry, v)
		}
	}
	if d <= 0 || d > maxTTL {
		return time.Time{}, fmt.Errorf("%w: ttl=%s is not between 1ns and %v", ErrExpiry, v, maxTTL)
	}
	return now.Add(d), nil
}

// parseUint parses decimal digits only, up to 2^63.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var u uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	return u, true
}

// parsePrefix parses an address or a CIDR prefix, masking host bits and dropping a
// zone. IPv4 is parsed here without allocating; IPv6 by net/netip.
func parsePrefix(f []byte) (netip.Prefix, error) {
	addrPart, lenPart, hasLen := bytes.Cut(f, []byte("/"))
	var a netip.Addr
	if v, ok := parseIPv4(addrPart); ok {
		var b [4]byte
		b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		a = netip.AddrFrom4(b)
	} else {
		var err error
		if a, err = netip.ParseAddr(string(addrPart)); err != nil {
			return netip.Prefix{}, fmt.Errorf("%w %q", ErrAddress, addrPart)
		}
		a = a.WithZone("")
	}
	l := a.BitLen()
	if hasLen {
		n, ok := parseUint(lenPart)
		if !ok || n > uint64(a.BitLen()) || len(lenPart) > 1 && lenPart[0] == '0' {
			return netip.Prefix{}, fmt.Errorf("%w /%s for a %d-bit address", ErrPrefixLength, lenPart, a.BitLen())
		}
		l = int(n)
	}
	return netip.PrefixFrom(a, l).Masked(), nil
}

// parseIPv4 parses a dotted quad of decimal octets without leading zeros.
func parseIPv4(b []byte) (uint32, bool) {
	var v uint32
	i := 0
	for octet := 0; octet < 4; octet++ {
		if octet > 0 {
			if i >= len(b) || b[i] != '.' {
				return 0, false
			}
			i++
		}
		start, n := i, 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			n = n*10 + int(b[i]-'0')
			i++
			if n > 255 {
				return 0, false
			}
		}
		if i == start || i-start > 1 && b[start] == '0' {
			return 0, false
		}
		v = v<<8 | uint32(n)
	}
	return v, i == len(b)
}

// WriteText writes s in the text format: one entry per line, single addresses without
// a prefix length, merged ranges as the prefixes covering them, expiring entries with
// expires=<RFC 3339 UTC>.
func WriteText(w io.Writer, s *Set) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var buf []byte
	for e := range s.All() {
		buf = buf[:0]
		if e.Prefix.IsSingleIP() {
			buf = e.Prefix.Addr().AppendTo(buf)
		} else {
			buf = e.Prefix.AppendTo(buf)
		}
		if !e.Expires.IsZero() {
			buf = append(buf, " expires="...)
			buf = e.Expires.UTC().AppendFormat(buf, time.RFC3339)
		}
		buf = append(buf, '\n')
		if _, err := bw.Write(buf); err != nil {
			return fmt.Errorf("writing a blacklist: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing a blacklist: %w", err)
	}
	return nil
}

// WriteTextDelta writes d in the text delta format, removals first.
func WriteTextDelta(w io.Writer, d *Delta) error {
	bw := bufio.NewWriter(w)
	for _, p := range d.Remove {
		bw.WriteString("-" + p.String() + "\n")
	}
	for _, e := range d.Add {
		bw.WriteString("+" + e.Prefix.String())
		if exp := expSeconds(e.Expires); exp != expPermanent {
			bw.WriteString(" expires=" + strconv.FormatUint(uint64(exp), 10))
		}
		bw.WriteString("\n")
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing a blacklist delta: %w", err)
	}
	return nil
}
