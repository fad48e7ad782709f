package blacklist

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseText(t *testing.T) {
	const text = "\xef\xbb\xbf# risk engine push\n" +
		"203.0.113.7\n" +
		"\n" +
		"198.51.100.0/24   # a range\r\n" +
		"  2001:db8::1 expires=2026-12-01T00:00:00Z\n" +
		"2001:db8:1::/48\tttl=3600s\n" +
		"192.0.2.9 ttl=90\n" +
		"192.0.2.10 expires=1777640400 # Unix seconds: t0 + 1h\n" +
		"203.0.113.77/28\n" + // host bits masked
		"fe80::1%eth0\n" +
		"::ffff:198.18.0.1\n" +
		"198.18.0.0/32\n" +
		"10.0.0.1 # last line without a newline"
	s, err := parseText(strings.NewReader(text), t0, fileLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a    string
		at   time.Duration
		want bool
	}{
		{"203.0.113.7", 0, true},
		{"198.51.100.255", 0, true},
		{"2001:db8::1", 200 * 24 * time.Hour, true},
		{"2001:db8::1", 250 * 24 * time.Hour, false},
		{"2001:db8:1:2::3", 59 * time.Minute, true},
		{"2001:db8:1:2::3", 61 * time.Minute, false},
		{"192.0.2.9", 89 * time.Second, true},
		{"192.0.2.9", 90 * time.Second, false},
		{"192.0.2.10", 59 * time.Minute, true},
		{"192.0.2.10", time.Hour, false},
		{"203.0.113.64", 0, true},
		{"203.0.113.79", 0, true},
		{"203.0.113.80", 0, false},
		{"fe80::1", 0, true},
		{"198.18.0.1", 0, true},
		{"198.18.0.0", 0, true},
		{"10.0.0.1", 0, true},
		{"10.0.0.2", 0, false},
	} {
		if got := s.ContainsAt(addr(c.a), t0.Add(c.at)); got != c.want {
			t.Errorf("%s at +%v: %v, want %v", c.a, c.at, got, c.want)
		}
	}
}

func TestParseTextErrors(t *testing.T) {
	tests := []struct {
		line string
		is   error
		msg  string
	}{
		{"203.0.113.256", ErrAddress, `bad address "203.0.113.256"`},
		{"203.0.113", ErrAddress, "bad address"},
		{"203.0.113.07", ErrAddress, "bad address"},
		{"2001:db8:::1", ErrAddress, "bad address"},
		{"garbage", ErrAddress, `bad address "garbage"`},
		{"1.2.3.4%eth0", ErrAddress, "bad address"},
		{"10.0.0.0/33", ErrPrefixLength, "bad prefix length /33 for a 32-bit address"},
		{"2001:db8::/129", ErrPrefixLength, "/129 for a 128-bit address"},
		{"10.0.0.0/", ErrPrefixLength, "bad prefix length"},
		{"10.0.0.0/08", ErrPrefixLength, "bad prefix length"},
		{"10.0.0.0/-1", ErrPrefixLength, "bad prefix length"},
		{"10.0.0.1 expires=tomorrow", ErrExpiry, `expires="tomorrow" is neither`},
		{"10.0.0.1 expires=2026-13-01T00:00:00Z", ErrExpiry, "bad expiry"},
		{"10.0.0.1 expires=0", ErrExpiry, "out of range"},
		{"10.0.0.1 ttl=-5s", ErrExpiry, "not between"},
		{"10.0.0.1 ttl=0", ErrExpiry, "not between"},
		{"10.0.0.1 ttl=soon", ErrExpiry, "not a duration"},
		{"10.0.0.1 ttl=99999999999", ErrExpiry, "over"},
		{"10.0.0.1 ttl=1h expires=2027-01-01T00:00:00Z", ErrAttribute, "expires= after ttl="},
		{"10.0.0.1 ttl=1h ttl=2h", ErrAttribute, "ttl= after ttl="},
		{"10.0.0.1 color=red", ErrAttribute, `bad attribute "color=red"`},
		{"10.0.0.1 10.0.0.2", ErrAttribute, "bad attribute"},
		{"10.0.0.1 ttl=", ErrAttribute, "bad attribute"},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			s, err := parseText(strings.NewReader("# ok\n10.0.0.9\n"+tt.line+"\n"), t0, fileLimits)
			if s != nil {
				t.Error("a set was returned with an error")
			}
			var pes *ParseErrors
			if !errors.As(err, &pes) || pes.Count != 1 || len(pes.Errors) != 1 {
				t.Fatalf("err = %v, want one *ParseErrors entry", err)
			}
			pe := pes.Errors[0]
			if pe.Line != 3 || pe.Text != tt.line {
				t.Errorf("line %d %q, want 3 %q", pe.Line, pe.Text, tt.line)
			}
			if !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want it to wrap %v", err, tt.is)
			}
			if !strings.Contains(err.Error(), tt.msg) || !strings.Contains(err.Error(), "line 3: ") {
				t.Errorf("err = %q, want it to contain %q", err, tt.msg)
			}
		})
	}
}

func TestParseTextBadLinesAmongMany(t *testing.T) {
	var b strings.Builder
	bad := map[int]string{17: "10.0.0.300", 512: "192.0.2.0/40", 999: "198.51.100.1 ttl=never"}
	for n := 1; n <= 1000; n++ {
		if l, ok := bad[n]; ok {
			b.WriteString(l + "\n")
		} else {
			fmt.Fprintf(&b, "10.%d.%d.1\n", n/256, n%256)
		}
	}
	l := NewList("www", Options{Now: func() time.Time { return t0 }})
	l.Replace(buildAt(t0, entrySpec{p: "203.0.113.7"}))
	err := l.Load(strings.NewReader(b.String()))
	var pes *ParseErrors
	if !errors.As(err, &pes) {
		t.Fatalf("err = %v, want *ParseErrors", err)
	}
	var lines []int
	for _, pe := range pes.Errors {
		lines = append(lines, pe.Line)
	}
	if pes.Count != 3 || !slices.Equal(lines, []int{17, 512, 999}) {
		t.Errorf("bad lines %v (count %d), want [17 512 999]", lines, pes.Count)
	}
	if !l.Contains(addr("203.0.113.7")) || l.Contains(addr("10.0.1.1")) || l.Len() != 1 {
		t.Error("a rejected upload changed the list")
	}
}

func TestParseTextManyErrors(t *testing.T) {
	text := strings.Repeat("nope\n", 250)
	_, err := parseText(strings.NewReader(text), t0, fileLimits)
	var pes *ParseErrors
	if !errors.As(err, &pes) || pes.Count != 250 || len(pes.Errors) != MaxReportedErrors {
		t.Fatalf("err = %v, want 250 counted and %d listed", err, MaxReportedErrors)
	}
	if !strings.HasPrefix(err.Error(), "250 bad lines: line 1: ") || !strings.HasSuffix(err.Error(), "; and 240 more") {
		t.Errorf("message %q", err)
	}
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Line != 1 {
		t.Errorf("errors.As(*ParseError) = %v", pe)
	}
}

func TestParseTextLongLine(t *testing.T) {
	text := "10.0.0.1\n10.0.0.2 # " + strings.Repeat("x", MaxLineBytes+10) + "\n10.0.0.3\nbad\n"
	_, err := parseText(strings.NewReader(text), t0, fileLimits)
	var pes *ParseErrors
	if !errors.As(err, &pes) || pes.Count != 2 {
		t.Fatalf("err = %v, want 2 bad lines", err)
	}
	if pes.Errors[0].Line != 2 || !errors.Is(pes.Errors[0], ErrLineTooLong) || len(pes.Errors[0].Text) != maxErrorText {
		t.Errorf("first error %v (text %d bytes), want line 2 too long", pes.Errors[0], len(pes.Errors[0].Text))
	}
	if pes.Errors[1].Line != 4 {
		t.Errorf("second error at line %d, want 4", pes.Errors[1].Line)
	}
}

type failingReader struct{ after []byte }

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.after) == 0 {
		return 0, errors.New("connection reset")
	}
	n := copy(p, r.after)
	r.after = r.after[n:]
	return n, nil
}

func TestParseTextReadError(t *testing.T) {
	_, err := ParseText(&failingReader{after: []byte("10.0.0.1\n10.0.0.2\n")})
	if err == nil || !strings.Contains(err.Error(), "connection reset") || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("err = %v", err)
	}
}

func TestParseTextDelta(t *testing.T) {
	text := "# delta\n+203.0.113.1\n-198.51.100.0/24\n+ 2001:db8::/64 ttl=60s\n- 192.0.2.1 # spaces after the sign\n+::ffff:192.0.2.9\n"
	d, err := parseTextDelta(strings.NewReader(text), t0, fileLimits)
	if err != nil {
		t.Fatal(err)
	}
	wantAdd := []Entry{
		{Prefix: pfx("203.0.113.1/32")},
		{Prefix: pfx("2001:db8::/64"), Expires: t0.Add(time.Minute)},
		{Prefix: pfx("::ffff:192.0.2.9/128")},
	}
	wantRm := []netip.Prefix{pfx("198.51.100.0/24"), pfx("192.0.2.1/32")}
	if !slices.EqualFunc(d.Add, wantAdd, func(a, b Entry) bool { return a.Prefix == b.Prefix && a.Expires.Equal(b.Expires) }) {
		t.Errorf("Add = %v, want %v", d.Add, wantAdd)
	}
	if !slices.Equal(d.Remove, wantRm) {
		t.Errorf("Remove = %v, want %v", d.Remove, wantRm)
	}

	for _, tt := range []struct {
		text string
		is   error
	}{
		{"203.0.113.1", ErrSign},
		{"*203.0.113.1", ErrSign},
		{"-203.0.113.1 ttl=60", ErrAttribute},
		{"+203.0.113.300", ErrAddress},
		{"+", ErrAddress},
		{"-10.0.0.0/99", ErrPrefixLength},
	} {
		_, err := parseTextDelta(strings.NewReader("+10.0.0.1\n"+tt.text+"\n"), t0, fileLimits)
		var pes *ParseErrors
		if !errors.As(err, &pes) || pes.Count != 1 || pes.Errors[0].Line != 2 || !errors.Is(err, tt.is) {
			t.Errorf("%q: err = %v, want line 2 wrapping %v", tt.text, err, tt.is)
		}
	}

	var buf bytes.Buffer
	if err := WriteTextDelta(&buf, d); err != nil {
		t.Fatal(err)
	}
	d2, err := parseTextDelta(&buf, t0, fileLimits)
	if err != nil {
		t.Fatalf("reading back %q: %v", buf.String(), err)
	}
	if len(d2.Add) != 3 || len(d2.Remove) != 2 || !d2.Add[1].Expires.Equal(t0.Add(time.Minute)) {
		t.Errorf("delta did not round trip: %+v", d2)
	}
}

func TestWriteText(t *testing.T) {
	s := buildAt(t0,
		entrySpec{p: "10.0.0.0/24"}, entrySpec{p: "10.0.1.0/25"}, entrySpec{p: "192.0.2.1", ttl: time.Hour},
		entrySpec{p: "2001:db8::/126"}, entrySpec{p: "2001:db8::1:0/112", ttl: time.Hour},
	)
	var buf bytes.Buffer
	if err := WriteText(&buf, s); err != nil {
		t.Fatal(err)
	}
	want := "10.0.0.0/24\n10.0.1.0/25\n192.0.2.1 expires=2026-05-01T13:00:00Z\n2001:db8::/126\n2001:db8::1:0/112 expires=2026-05-01T13:00:00Z\n"
	if buf.String() != want {
		t.Errorf("WriteText:\n%s\nwant\n%s", buf.String(), want)
	}
	back, err := parseText(&buf, t0, fileLimits)
	if err != nil {
		t.Fatal(err)
	}
	assertSameSet(t, s, back)
}

// assertSameSet compares two sets by their normalized spans.
func assertSameSet(t *testing.T, want, got *Set) {
	t.Helper()
	if w, g := want.spans4(nil), got.spans4(nil); !slices.Equal(w, g) {
		t.Errorf("IPv4 differs:\n got %v\nwant %v", g, w)
	}
	if w, g := want.spans6(nil), got.spans6(nil); !slices.Equal(w, g) {
		t.Errorf("IPv6 differs:\n got %v\nwant %v", g, w)
	}
}
