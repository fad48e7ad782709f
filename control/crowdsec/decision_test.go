package crowdsec

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
)

// lapiAnswer is an answer of crowdsec 1.4.6's Local API, as it was printed.
const lapiAnswer = `{"deleted":[{"duration":"-564.068477ms","id":1,"origin":"cscli","scenario":"test","scope":"Ip","type":"ban","value":"198.51.100.7"}],` +
	`"new":[{"duration":"29.360256083s","id":3,"origin":"cscli","scenario":"manual 'captcha' from 'x'","scope":"Ip","type":"captcha","value":"2001:db8::5"},` +
	`{"duration":"1h59m59.020675386s","id":2,"origin":"cscli","scenario":"manual 'ban' from 'x'","scope":"Range","type":"ban","value":"203.0.113.0/24"},` +
	`{"duration":"3h59m34.4s","id":4,"origin":"cscli","scenario":"manual 'ban' from 'x'","scope":"Country","type":"ban","value":"FR"}]}`

func TestDecodeStream(t *testing.T) {
	s, err := DecodeStream(strings.NewReader(lapiAnswer), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.New) != 3 || len(s.Deleted) != 1 {
		t.Fatalf("decoded %d new, %d deleted; want 3, 1", len(s.New), len(s.Deleted))
	}
	want := Decision{ID: 2, Value: "203.0.113.0/24", Scope: "Range", Type: "ban", Duration: "1h59m59.020675386s", Origin: "cscli", Scenario: "manual 'ban' from 'x'"}
	if s.New[1] != want {
		t.Fatalf("new[1] = %+v, want %+v", s.New[1], want)
	}
	s, err = DecodeStream(strings.NewReader(`{"deleted":null,"new":null}`), 0)
	if err != nil || len(s.New)+len(s.Deleted) != 0 {
		t.Fatalf("null lists: %+v, %v", s, err)
	}
	for _, bad := range []struct{ body, says string }{
		{``, "not a JSON object"},
		{`[]`, "not a JSON object"},
		{`<html>`, "not a JSON object"},
		{`{"new":[{"value":1}]}`, "decoding the decisions"},
		{`{"new":{}}`, "decoding the decisions"},
		{`{"new":[]} {}`, "more than one JSON value"},
		{`{"new":[` + strings.Repeat(`{"value":"198.51.100.1"},`, 100) + `{}]}`, "over 1024 bytes"},
	} {
		_, err := DecodeStream(strings.NewReader(bad.body), 1024)
		var ae *AnswerError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("DecodeStream(%.40q) = %v; want an *AnswerError saying %q", bad.body, err, bad.says)
		}
	}
}

func TestTarget(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		d    Decision
		p    string
		ends time.Duration // 0: never
		err  string
	}{
		{d: Decision{Scope: "Ip", Value: "198.51.100.7", Duration: "4h"}, p: "198.51.100.7/32", ends: 4 * time.Hour},
		{d: Decision{Scope: "ip", Value: "2001:db8::5", Duration: "1m0.5s"}, p: "2001:db8::5/128", ends: 60500 * time.Millisecond},
		{d: Decision{Scope: "Ip", Value: "::ffff:198.51.100.8"}, p: "198.51.100.8/32"},
		{d: Decision{Scope: "Range", Value: "203.0.113.9/24", Duration: "1s"}, p: "203.0.113.0/24", ends: time.Second},
		{d: Decision{Scope: "RANGE", Value: "2001:db8::/32"}, p: "2001:db8::/32"},
		{d: Decision{Scope: "Range", Value: "::ffff:198.51.100.0/120"}, p: "198.51.100.0/24"},
		{d: Decision{Scope: "Ip", Value: "198.51.100.0/24"}, err: SkipValue},
		{d: Decision{Scope: "Ip", Value: "fe80::1%eth0"}, err: SkipValue},
		{d: Decision{Scope: "Range", Value: "198.51.100.7"}, err: SkipValue},
		{d: Decision{Scope: "Country", Value: "FR"}, err: SkipScope},
		{d: Decision{Scope: "", Value: "198.51.100.7"}, err: SkipScope},
		{d: Decision{Scope: "Ip", Value: "198.51.100.7", Duration: "4 hours"}, p: "198.51.100.7/32", err: SkipDuration},
	} {
		p, ends, err := c.d.Target(at)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("%+v: error %v, want %s", c.d, err, c.err)
			}
			if c.p != "" && p.String() != c.p {
				t.Errorf("%+v: prefix %s with the error, want %s", c.d, p, c.p)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", c.d, err)
			continue
		}
		if p.String() != c.p {
			t.Errorf("%+v: prefix %s, want %s", c.d, p, c.p)
		}
		want := time.Time{}
		if c.ends != 0 {
			want = at.Add(c.ends)
		}
		if !ends.Equal(want) {
			t.Errorf("%+v: ends %v, want %v", c.d, ends, want)
		}
	}
}

func TestToDelta(t *testing.T) {
	s, err := DecodeStream(strings.NewReader(lapiAnswer), 0)
	if err != nil {
		t.Fatal(err)
	}
	s.New = append(s.New,
		Decision{ID: 5, Scope: "Ip", Value: "198.51.100.7", Type: "ban", Duration: "-1s"},
		Decision{ID: 6, Scope: "Ip", Value: "not-an-ip", Type: "ban"},
		Decision{ID: 7, Scope: "Ip", Value: "198.51.100.9", Type: "Ban", Origin: "CAPI"},
	)
	at := time.Now()
	d, reasons, skipped := ToDelta(s, &Filter{}, at)
	if len(d.Remove) != 1 || d.Remove[0] != netip.MustParsePrefix("198.51.100.7/32") {
		t.Errorf("removals %v, want [198.51.100.7/32]", d.Remove)
	}
	if len(d.Add) != 2 || d.Add[0].Prefix.String() != "203.0.113.0/24" || d.Add[1].Prefix.String() != "198.51.100.9/32" {
		t.Fatalf("additions %v, want 203.0.113.0/24 and 198.51.100.9/32", d.Add)
	}
	if got := d.Add[0].Expires.Sub(at); got != 2*time.Hour-979324614 {
		t.Errorf("203.0.113.0/24 ends in %v, want its duration", got)
	}
	if len(reasons) != 2 || reasons[0] != "manual 'ban' from 'x'" || reasons[1] != "" {
		t.Errorf("reasons %q, want the additions' scenarios", reasons)
	}
	if !d.Add[1].Expires.IsZero() {
		t.Errorf("a decision without duration ends at %v, want never", d.Add[1].Expires)
	}
	want := Skipped{SkipType: 1, SkipScope: 1, SkipExpired: 1, SkipValue: 1}
	if len(skipped) != len(want) || skipped.Total() != 4 {
		t.Errorf("skipped %v, want %v", skipped, want)
	}
	for k, v := range want {
		if skipped[k] != v {
			t.Errorf("skipped %v, want %v", skipped, want)
		}
	}
	// Filters: origins and scenarios.
	_, _, skipped = ToDelta(s, &Filter{Types: []string{"ban", "captcha"}, Origins: []string{"crowdsec"}}, at)
	if skipped[SkipFilter] != 6 {
		t.Errorf("origins crowdsec: skipped %v, want all 6 new filtered", skipped)
	}
	d, _, _ = ToDelta(s, &Filter{Types: []string{"captcha"}, ScenariosNotContaining: []string{"ban"}}, at)
	if len(d.Add) != 1 || d.Add[0].Prefix.String() != "2001:db8::5/128" {
		t.Errorf("captcha only: additions %v, want 2001:db8::5/128", d.Add)
	}
	d, _, _ = ToDelta(s, &Filter{ScenariosContaining: []string{"nothing"}}, at)
	if len(d.Add) != 0 {
		t.Errorf("scenarios containing nothing: additions %v", d.Add)
	}
}

// A removal and an addition of one target in one stream leave it listed, the
// order of the Delta being removals, then additions.
func TestToDeltaDeletionsFirst(t *testing.T) {
	s := &Stream{
		New:     []Decision{{ID: 2, Scope: "Ip", Value: "198.51.100.7", Type: "ban", Duration: "1h"}},
		Deleted: []Decision{{ID: 1, Scope: "Ip", Value: "198.51.100.7", Type: "ban", Duration: "-1s"}},
	}
	d, _, _ := ToDelta(s, &Filter{}, time.Now())
	l := blacklist.NewList("t", blacklist.Options{})
	if err := l.Apply(d); err != nil {
		t.Fatal(err)
	}
	if !l.Contains(netip.MustParseAddr("198.51.100.7")) {
		t.Fatal("deleted and new in one stream: not listed")
	}
}

func FuzzDecodeStream(f *testing.F) {
	for _, seed := range []string{
		lapiAnswer,
		`{"deleted":null,"new":null}`,
		`{"new":[{"id":1,"value":"198.51.100.7","scope":"Ip","type":"ban","duration":"4h"}]}`,
		`{"new":[{"value":"2001:db8::/33","scope":"Range","type":"ban","duration":"-1h"}],"deleted":[{"value":"::ffff:1.2.3.4","scope":"ip"}]}`,
		`{"new":[{"value":"1.2.3.4/0","scope":"Range","type":"ban","duration":"9223372036s"}]}`,
		`{"new":[{"value":"1.2.3.4","scope":"Ip","type":"ban","duration":"1e9h"}]}`,
		`[]`, `{`, `{"new":[1]}`,
	} {
		f.Add([]byte(seed))
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeStream(strings.NewReader(string(data)), 1<<20)
		if err != nil {
			var ae *AnswerError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not an *AnswerError", err)
			}
			return
		}
		d, reasons, skipped := ToDelta(s, &Filter{Types: []string{"ban", "captcha"}}, at)
		if len(reasons) != len(d.Add) {
			t.Fatalf("%d reasons for %d additions", len(reasons), len(d.Add))
		}
		if len(d.Add)+skipped.Total() > len(s.New)+len(s.Deleted) {
			t.Fatalf("%d added and %d skipped of %d decisions", len(d.Add), skipped.Total(), len(s.New)+len(s.Deleted))
		}
		for _, e := range d.Add {
			if !e.Prefix.IsValid() || e.Prefix != e.Prefix.Masked() {
				t.Fatalf("addition %v: not a masked prefix", e.Prefix)
			}
			if !e.Expires.IsZero() && !e.Expires.After(at) {
				t.Fatalf("addition %v ends %v, not after %v", e.Prefix, e.Expires, at)
			}
		}
		for _, p := range d.Remove {
			if !p.IsValid() {
				t.Fatalf("removal %v: invalid", p)
			}
		}
		var b blacklist.Builder
		for _, e := range d.Add {
			b.Add(e.Prefix, e.Expires)
		}
		set := b.BuildAt(at)
		for _, e := range d.Add {
			if !set.ContainsAt(e.Prefix.Addr(), at) {
				t.Fatalf("addition %v not in the set built of the additions", e.Prefix)
			}
		}
	})
}

func TestDecodePushAndCheck(t *testing.T) {
	s, err := DecodePush(strings.NewReader(` [{"value":"198.51.100.7","scope":"Ip","type":"ban","duration":"4h"}] `), 0)
	if err != nil || len(s.New) != 1 || len(s.Deleted) != 0 || s.New[0].Value != "198.51.100.7" {
		t.Fatalf("an array: %+v, %v", s, err)
	}
	s, err = DecodePush(strings.NewReader(lapiAnswer), 0)
	if err != nil || len(s.New) != 3 || len(s.Deleted) != 1 {
		t.Fatalf("a stream: %+v, %v", s, err)
	}
	if err := Check(s); err != nil {
		t.Errorf("Check of the Local API's answer: %v", err)
	}
	for _, bad := range []struct{ body, says string }{
		{`[{"value":1}]`, "decoding the decisions"},
		{`[] []`, "more than one JSON value"},
		{`"x"`, "not a JSON object"},
	} {
		_, err := DecodePush(strings.NewReader(bad.body), 0)
		var ae *AnswerError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("DecodePush(%q) = %v; want an *AnswerError saying %q", bad.body, err, bad.says)
		}
	}
	s = &Stream{
		New: []Decision{
			{Scope: "Ip", Value: "198.51.100.7", Duration: "4h"},
			{Scope: "Ip", Value: "198.51.100.0/24"},
			{Scope: "Range", Value: "nope"},
			{Scope: "Country", Value: "nope"},
			{Scope: "Ip", Value: "198.51.100.8", Duration: "soon"},
		},
		Deleted: []Decision{{Scope: "ip", Value: "x"}},
	}
	err = Check(s)
	want := []string{
		`new[1].value: "198.51.100.0/24" is not an address`,
		`new[2].value: "nope" is not a CIDR prefix`,
		`new[4].duration: "soon" is not a duration`,
		`deleted[0].value: "x" is not an address`,
	}
	if err == nil || strings.Count(err.Error(), "\n") != len(want)-1 {
		t.Fatalf("Check = %v; want %d problems", err, len(want))
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Check = %v; want %q", err, w)
		}
	}
}

func FuzzDecodePush(f *testing.F) {
	for _, seed := range []string{lapiAnswer, `[]`, `[{"value":"2001:db8::1","scope":"Ip","type":"ban"}]`, `[{"value":"x","scope":"Range"}]`, `[`, `null`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodePush(strings.NewReader(string(data)), 1<<20)
		if err != nil {
			var ae *AnswerError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not an *AnswerError", err)
			}
			return
		}
		// Check passes exactly when no Ip or Range decision is skipped for its
		// value or duration.
		checked := Check(&Stream{New: s.New}) == nil
		bad := 0
		for i := range s.New {
			if _, _, err := s.New[i].Target(time.Time{}); err == errValue || err == errDuration {
				bad++
			}
		}
		if checked != (bad == 0) {
			t.Fatalf("Check passed %v with %d bad decisions", checked, bad)
		}
	})
}
