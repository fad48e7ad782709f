package crowdsec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/policy/blacklist"
)

// A Decision is one decision as CrowdSec's Local API gives it to a bouncer
// (GET /v1/decisions/stream), and as Tiergate's API takes it
// (POST /v1/blacklists/{name}/decisions).
type Decision struct {
	// ID is the Local API's identifier of the decision; 0 when the decision is
	// pushed without one.
	ID int64 `json:"id,omitempty"`
	// Value is what is decided on: an address for scope Ip, a CIDR prefix for
	// scope Range.
	Value string `json:"value"`
	// Scope is Ip or Range (compared without regard to case); a decision of
	// another scope (Country, AS, Username, …) is skipped.
	Scope string `json:"scope"`
	// Type is the remedy: ban, captcha, …; only the configured types are enforced.
	Type string `json:"type"`
	// Duration is how long the decision still lasts from the moment of the answer,
	// a Go duration ("3h59m58.5s"); negative once it is over (deleted decisions);
	// empty for a decision that never ends.
	Duration string `json:"duration,omitempty"`
	// Origin is where the decision came from: crowdsec, cscli, CAPI, lists, …
	Origin string `json:"origin,omitempty"`
	// Scenario is what led to it ("crowdsecurity/ssh-bf", "manual 'ban' from …").
	Scenario string `json:"scenario,omitempty"`
}

// A Stream is an answer of GET /v1/decisions/stream: the decisions new since the
// bouncer's last pull (every active one with startup=true), and those deleted or
// expired since.
type Stream struct {
	New     []Decision `json:"new"`
	Deleted []Decision `json:"deleted"`
}

// MaxDecisions bounds the decisions of one answer, new and deleted together.
const MaxDecisions = blacklist.MaxEntries

// DefaultMaxAnswerBytes is the default bound of an answer's body: room for a few
// hundred thousand decisions (CrowdSec's community blocklist is tens of thousands).
const DefaultMaxAnswerBytes = 128 << 20

// An AnswerError is an answer of the Local API (or a pushed body) that is not a
// usable decision stream: a status other than 200, a body over the bound, or one
// that does not decode.
type AnswerError struct {
	// URL is what was asked (without the API key, which is only in a header);
	// empty for a pushed body.
	URL string
	// Status is the HTTP status of the answer; 200 when the body is at fault.
	Status int
	// Reason says what is wrong.
	Reason string
}

func (e *AnswerError) Error() string {
	var b strings.Builder
	b.WriteString("crowdsec: ")
	if e.URL != "" {
		fmt.Fprintf(&b, "GET %s: ", e.URL)
	}
	if e.Status != 0 && e.Status != 200 {
		fmt.Fprintf(&b, "status %d: ", e.Status)
	}
	b.WriteString(e.Reason)
	return b.String()
}

// DecodeStream reads one decision stream (the JSON object {"new":[…],
// "deleted":[…]}, either list null or absent) of at most limit bytes (≤ 0:
// DefaultMaxAnswerBytes) from r. Anything else, a body over limit or one with more
// than MaxDecisions decisions is an *AnswerError. Fields it does not know are
// ignored, as the Local API adds some across versions.
func DecodeStream(r io.Reader, limit int64) (*Stream, error) {
	if limit <= 0 {
		limit = DefaultMaxAnswerBytes
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, &AnswerError{Status: 200, Reason: "reading the body: " + err.Error()}
	}
	if int64(len(data)) > limit {
		return nil, &AnswerError{Status: 200, Reason: fmt.Sprintf("the body is over %d bytes", limit)}
	}
	return decodeStream(data)
}

func decodeStream(data []byte) (*Stream, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return nil, &AnswerError{Status: 200, Reason: "the body is not a JSON object {\"new\":[…],\"deleted\":[…]}: " + snippet(data)}
	}
	var s Stream
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&s); err != nil {
		return nil, &AnswerError{Status: 200, Reason: "decoding the decisions: " + err.Error()}
	}
	if dec.More() {
		return nil, &AnswerError{Status: 200, Reason: "more than one JSON value in the body"}
	}
	if len(s.New)+len(s.Deleted) > MaxDecisions {
		return nil, &AnswerError{Status: 200, Reason: fmt.Sprintf("more than %d decisions", MaxDecisions)}
	}
	return &s, nil
}

// DecodePush reads decisions pushed to Tiergate's API: a stream as the Local
// API answers it ({"new":[…],"deleted":[…]}) or a JSON array of decisions, taken
// as new ones; at most limit bytes (≤ 0: DefaultMaxAnswerBytes). Errors are
// *AnswerError, as DecodeStream's.
func DecodePush(r io.Reader, limit int64) (*Stream, error) {
	if limit <= 0 {
		limit = DefaultMaxAnswerBytes
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, &AnswerError{Reason: "reading the body: " + err.Error()}
	}
	if int64(len(data)) > limit {
		return nil, &AnswerError{Reason: fmt.Sprintf("the body is over %d bytes", limit)}
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '[' {
		return decodeStream(data)
	}
	var ds []Decision
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&ds); err != nil {
		return nil, &AnswerError{Reason: "decoding the decisions: " + err.Error()}
	}
	if dec.More() {
		return nil, &AnswerError{Reason: "more than one JSON value in the body"}
	}
	if len(ds) > MaxDecisions {
		return nil, &AnswerError{Reason: fmt.Sprintf("more than %d decisions", MaxDecisions)}
	}
	return &Stream{New: ds}, nil
}

// Check returns the problems of the decisions of scope Ip or Range in s, each
// by its place ("new[3].value: …"), joined; nil when there is none. Decisions of
// other scopes are not checked: they are skipped, as the Local API's are.
func Check(s *Stream) error {
	var ck config.Checker
	for _, part := range []struct {
		name string
		ds   []Decision
	}{{"new", s.New}, {"deleted", s.Deleted}} {
		for i := range part.ds {
			d := &part.ds[i]
			_, _, err := d.Target(time.Time{})
			switch err {
			case errValue:
				what := "an address"
				if strings.EqualFold(d.Scope, "range") {
					what = "a CIDR prefix"
				}
				ck.Addf(config.At(config.Index(part.name, i), "value"), "%q is not %s", d.Value, what)
			case errDuration:
				ck.Addf(config.At(config.Index(part.name, i), "duration"), "%q is not a duration (\"4h\", \"90s\")", d.Duration)
			}
		}
	}
	return ck.Err()
}

// snippet is the start of a body, for an error.
func snippet(b []byte) string {
	const n = 120
	if len(b) > n {
		return fmt.Sprintf("%q…", b[:n])
	}
	return fmt.Sprintf("%q", b)
}

// Why a decision was skipped: the reasons of Skipped.
const (
	SkipScope    = "scope"    // not Ip or Range
	SkipType     = "type"     // a type not enforced
	SkipValue    = "value"    // not an address (Ip) or prefix (Range)
	SkipDuration = "duration" // not a duration
	SkipExpired  = "expired"  // a new decision already over
	SkipFilter   = "filter"   // its origin or scenario is filtered out
)

// Errors of Target, by the reasons of Skipped.
var (
	errScope    = errors.New(SkipScope)
	errValue    = errors.New(SkipValue)
	errDuration = errors.New(SkipDuration)
)

// Target returns what d decides on as a prefix (a single address as a /32 or
// /128, IPv4-mapped IPv6 addresses as IPv4, host bits masked) and when d ends:
// at + its duration, zero for none. The error's text is the skip reason
// (SkipScope, SkipValue, SkipDuration); with SkipDuration the prefix is given.
func (d *Decision) Target(at time.Time) (netip.Prefix, time.Time, error) {
	var p netip.Prefix
	switch {
	case strings.EqualFold(d.Scope, "ip"):
		a, err := netip.ParseAddr(d.Value)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, time.Time{}, errValue
		}
		a = a.Unmap()
		p = netip.PrefixFrom(a, a.BitLen())
	case strings.EqualFold(d.Scope, "range"):
		q, err := netip.ParsePrefix(d.Value)
		if err != nil {
			return netip.Prefix{}, time.Time{}, errValue
		}
		if a := q.Addr(); a.Is4In6() && q.Bits() >= 96 {
			q = netip.PrefixFrom(a.Unmap(), q.Bits()-96)
		}
		p = q.Masked()
	default:
		return netip.Prefix{}, time.Time{}, errScope
	}
	if d.Duration == "" {
		return p, time.Time{}, nil
	}
	dur, err := time.ParseDuration(d.Duration)
	if err != nil {
		return p, time.Time{}, errDuration
	}
	return p, at.Add(dur), nil
}

// A Filter says which decisions are enforced.
type Filter struct {
	// Types are the decision types enforced. Default ["ban"].
	Types []string
	// Origins, when given, are the only origins taken (crowdsec, cscli, CAPI,
	// lists, …). Default any.
	Origins []string
	// ScenariosContaining, when given, takes only the decisions whose scenario
	// contains one of these strings. Default any.
	ScenariosContaining []string
	// ScenariosNotContaining leaves out the decisions whose scenario contains one
	// of these strings. Default none.
	ScenariosNotContaining []string
}

// takes returns "" when f enforces d, else the skip reason.
func (f *Filter) takes(d *Decision) string {
	types := f.Types
	if len(types) == 0 {
		types = []string{"ban"}
	}
	if !anyEqualFold(types, d.Type) {
		return SkipType
	}
	if len(f.Origins) > 0 && !anyEqualFold(f.Origins, d.Origin) {
		return SkipFilter
	}
	if len(f.ScenariosContaining) > 0 && !anyIn(f.ScenariosContaining, d.Scenario) {
		return SkipFilter
	}
	if anyIn(f.ScenariosNotContaining, d.Scenario) {
		return SkipFilter
	}
	return ""
}

func anyEqualFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

func anyIn(list []string, s string) bool {
	for _, x := range list {
		if x != "" && strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// Skipped counts the decisions left out, by reason (SkipScope, SkipType, …).
type Skipped map[string]int

// Total is the number of decisions skipped.
func (s Skipped) Total() int {
	n := 0
	for _, v := range s {
		n += v
	}
	return n
}

// ToDelta turns a stream into one change of a list, with no memory of earlier
// streams: every deleted decision's target is removed, then every new decision's
// enforced by f is added with its expiry (at + its duration). A target both
// deleted and new is therefore in the list after it. What is skipped is counted
// in the returned Skipped; a deleted decision is never filtered by type or origin,
// since removing what is not listed does nothing. The reasons are the additions'
// scenarios, one for each.
func ToDelta(s *Stream, f *Filter, at time.Time) (d *blacklist.Delta, reasons []string, skipped Skipped) {
	d = &blacklist.Delta{}
	skipped = Skipped{}
	for i := range s.Deleted {
		p, _, err := s.Deleted[i].Target(at)
		if err != nil && err != errDuration {
			skipped[err.Error()]++
			continue
		}
		d.Remove = append(d.Remove, p)
	}
	for i := range s.New {
		dec := &s.New[i]
		if why := f.takes(dec); why != "" {
			skipped[why]++
			continue
		}
		p, exp, err := dec.Target(at)
		if err != nil {
			skipped[err.Error()]++
			continue
		}
		if !exp.IsZero() && !exp.After(at) {
			skipped[SkipExpired]++
			continue
		}
		d.Add = append(d.Add, blacklist.Entry{Prefix: p, Expires: exp})
		reasons = append(reasons, dec.Scenario)
	}
	return d, reasons, skipped
}
