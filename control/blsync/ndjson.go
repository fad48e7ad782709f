package blsync

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
)

// Line is one line of an NDJSON push: an address or a CIDR, an optional expiry
// (absolute, RFC 3339 or Unix seconds, or a duration from the push, a Go duration
// or seconds) and reason, and for a delta whether it adds (the default) or
// removes:
//
//	{"ip": "198.51.100.7", "duration": "4h", "reason": "scanner"}
//	{"cidr": "2001:db8::/48", "expires": "2026-12-01T00:00:00Z"}
//	{"ip": "203.0.113.9", "op": "remove"}
type Line struct {
	IP       string          `json:"ip,omitempty"`
	CIDR     string          `json:"cidr,omitempty"`
	Expires  json.RawMessage `json:"expires,omitempty"`
	Duration json.RawMessage `json:"duration,omitempty"`
	Reason   string          `json:"reason,omitempty"`
	Op       string          `json:"op,omitempty"`
}

// MaxReasonBytes bounds a line's reason.
const MaxReasonBytes = 256

// maxTTL bounds a duration (as policy/blacklist's text format does).
const maxTTL = 50 * 365 * 24 * time.Hour

// Errors of NDJSON lines, wrapped in a *blacklist.ParseError with the line's
// number.
var (
	ErrLineJSON   = errors.New("not a JSON object of ip or cidr, expires or duration, reason and op")
	ErrLineTarget = errors.New("want exactly one of ip and cidr")
	ErrLineExpiry = errors.New("bad expiry")
	ErrLineOp     = errors.New(`op: want "add" or "remove"`)
)

// NDJSON is a parsed NDJSON push: a delta (a whole list's entries are its
// additions) and the reasons of its additions.
type NDJSON struct {
	Delta   blacklist.Delta
	Reasons []string
}

// ParseNDJSON reads an NDJSON push, one Line per line (blank lines skipped), with
// durations counted from now. A whole list (delta false) takes no removals. Every
// bad line is reported by its number in a *blacklist.ParseErrors, and then
// nothing is returned; more than maxEntries lines is a *blacklist.LimitError.
func ParseNDJSON(r io.Reader, delta bool, now time.Time, maxEntries int) (*NDJSON, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), blacklist.MaxLineBytes)
	out := &NDJSON{}
	var perr blacklist.ParseErrors
	bad := func(n int, text []byte, err error) {
		perr.Count++
		if len(perr.Errors) < blacklist.MaxReportedErrors {
			if len(text) > 200 {
				text = text[:200]
			}
			perr.Errors = append(perr.Errors, &blacklist.ParseError{Line: n, Text: string(text), Err: err})
		}
	}
	n := 0
	hasReason := false
	for sc.Scan() {
		n++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(out.Delta.Add)+len(out.Delta.Remove) >= maxEntries {
			return nil, &blacklist.LimitError{Limit: "max_entries", Max: int64(maxEntries)}
		}
		var l Line
		if !lineFast(b, &l) && !lineSlow(b, &l) {
			bad(n, b, ErrLineJSON)
			continue
		}
		p, exp, remove, err := l.entry(delta, now)
		if err != nil {
			bad(n, b, err)
			continue
		}
		if remove {
			out.Delta.Remove = append(out.Delta.Remove, p)
			continue
		}
		out.Delta.Add = append(out.Delta.Add, blacklist.Entry{Prefix: p, Expires: exp})
		out.Reasons = append(out.Reasons, l.Reason)
		hasReason = hasReason || l.Reason != ""
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			bad(n+1, nil, blacklist.ErrLineTooLong)
		} else {
			return nil, err
		}
	}
	if perr.Count > 0 {
		return nil, &perr
	}
	if !hasReason {
		out.Reasons = nil
	}
	return out, nil
}

// lineSlow reads a line with encoding/json, refusing unknown members.
func lineSlow(b []byte, l *Line) bool {
	*l = Line{}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(l) == nil && !dec.More()
}

// entry checks a line and returns what it says.
func (l *Line) entry(delta bool, now time.Time) (p netip.Prefix, exp time.Time, remove bool, err error) {
	switch l.Op {
	case "", "add":
	case "remove":
		if !delta {
			return p, exp, false, fmt.Errorf("%w: a whole list only adds", ErrLineOp)
		}
		remove = true
	default:
		return p, exp, false, ErrLineOp
	}
	if (l.IP == "") == (l.CIDR == "") {
		return p, exp, false, ErrLineTarget
	}
	if l.IP != "" {
		a, err := netip.ParseAddr(l.IP)
		if err != nil {
			return p, exp, false, fmt.Errorf("%w: %w", blacklist.ErrAddress, err)
		}
		a = a.WithZone("")
		p = netip.PrefixFrom(a, a.BitLen())
	} else {
		if p, err = netip.ParsePrefix(l.CIDR); err != nil {
			return p, exp, false, fmt.Errorf("%w: %w", blacklist.ErrPrefixLength, err)
		}
		p = p.Masked()
	}
	if len(l.Reason) > MaxReasonBytes {
		return p, exp, false, fmt.Errorf("reason of %d bytes, over %d", len(l.Reason), MaxReasonBytes)
	}
	if len(l.Expires) > 0 && len(l.Duration) > 0 {
		return p, exp, false, fmt.Errorf("%w: expires and duration together", ErrLineExpiry)
	}
	if remove && (len(l.Expires) > 0 || len(l.Duration) > 0) {
		return p, exp, false, fmt.Errorf("%w: a removal has no expiry", ErrLineExpiry)
	}
	switch {
	case len(l.Expires) > 0:
		exp, err = parseExpires(l.Expires)
	case len(l.Duration) > 0:
		var d time.Duration
		if d, err = parseDuration(l.Duration); err == nil {
			exp = now.Add(d)
		}
	}
	if err != nil {
		return p, exp, false, fmt.Errorf("%w: %w", ErrLineExpiry, err)
	}
	return p, exp, remove, nil
}

// parseExpires reads an RFC 3339 time or Unix seconds.
func parseExpires(raw json.RawMessage) (time.Time, error) {
	if s, ok := plainString(raw); ok {
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			return t, checkTime(t)
		}
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return unixTime(n)
		}
		return time.Time{}, fmt.Errorf("%q: want RFC 3339 or Unix seconds", s)
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return time.Time{}, fmt.Errorf("%s: want RFC 3339 or Unix seconds", raw)
	}
	return unixTime(n)
}

func unixTime(n int64) (time.Time, error) {
	if n <= 0 || n >= 1<<32 {
		return time.Time{}, fmt.Errorf("%d: want Unix seconds from 1 to 2^32-1", n)
	}
	return time.Unix(n, 0), nil
}

func checkTime(t time.Time) error {
	if t.Unix() <= 0 || t.Unix() >= 1<<32 {
		return fmt.Errorf("%v: out of range", t)
	}
	return nil
}

// plainString returns the JSON string raw holds, if it is one.
func plainString(raw json.RawMessage) (string, bool) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' && !bytes.ContainsRune(raw, '\\') {
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

// parseDuration reads a Go duration ("4h", "90s") or seconds.
func parseDuration(raw json.RawMessage) (time.Duration, error) {
	var d time.Duration
	if s, ok := plainString(raw); ok {
		var err error
		if d, err = time.ParseDuration(strings.TrimSpace(s)); err != nil {
			n, err2 := strconv.ParseInt(s, 10, 64)
			if err2 != nil || n > int64(maxTTL/time.Second) {
				return 0, fmt.Errorf("%q: want a duration (4h, 90s) or seconds", s)
			}
			d = time.Duration(n) * time.Second
		}
	} else {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n > int64(maxTTL/time.Second) {
			return 0, fmt.Errorf("%s: want a duration (4h, 90s) or seconds", raw)
		}
		d = time.Duration(n) * time.Second
	}
	if d <= 0 || d > maxTTL {
		return 0, fmt.Errorf("%v: want above 0 and at most 50 years", d)
	}
	return d, nil
}
