package blsync

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
)

func TestParseNDJSON(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	in := `{"ip":"198.51.100.7","duration":"4h","reason":"scanner"}

{"cidr":"2001:db8::1/48","expires":"2030-01-01T00:00:00Z"}
{"ip":"203.0.113.9","expires":1900000000}
{"ip":"203.0.113.10","duration":60}
{"ip":"192.0.2.1","op":"remove"}
`
	got, err := ParseNDJSON(strings.NewReader(in), true, now, 100)
	if err != nil {
		t.Fatal(err)
	}
	d := got.Delta
	if len(d.Add) != 4 || len(d.Remove) != 1 || d.Remove[0] != netip.MustParsePrefix("192.0.2.1/32") {
		t.Fatalf("delta %+v", d)
	}
	if d.Add[0].Prefix != netip.MustParsePrefix("198.51.100.7/32") || !d.Add[0].Expires.Equal(now.Add(4*time.Hour)) || got.Reasons[0] != "scanner" {
		t.Fatalf("first line %+v %q", d.Add[0], got.Reasons)
	}
	if d.Add[1].Prefix != netip.MustParsePrefix("2001:db8::/48") || d.Add[1].Expires.Year() != 2030 {
		t.Fatalf("second line %+v", d.Add[1])
	}
	if !d.Add[2].Expires.Equal(time.Unix(1900000000, 0)) || !d.Add[3].Expires.Equal(now.Add(time.Minute)) {
		t.Fatalf("expiries %+v", d.Add)
	}

	// A whole list takes no removal; every bad line is named by its number.
	bad := `{"ip":"198.51.100.7"}
{"ip":"198.51.100.300"}
{"ip":"1.2.3.4","cidr":"1.2.3.0/24"}
{"ip":"1.2.3.4","duration":"soon"}
not json
{"ip":"1.2.3.4","op":"remove"}
{"ip":"1.2.3.4","color":"red"}
`
	_, err = ParseNDJSON(strings.NewReader(bad), false, now, 100)
	var pe *blacklist.ParseErrors
	if !errors.As(err, &pe) || pe.Count != 6 {
		t.Fatalf("err %v: want 6 bad lines", err)
	}
	for i, want := range []int{2, 3, 4, 5, 6, 7} {
		if pe.Errors[i].Line != want {
			t.Fatalf("bad line %d numbered %d, want %d", i, pe.Errors[i].Line, want)
		}
	}
	if !errors.Is(pe.Errors[0].Err, blacklist.ErrAddress) || !errors.Is(pe.Errors[1].Err, ErrLineTarget) || !errors.Is(pe.Errors[2].Err, ErrLineExpiry) {
		t.Fatalf("reasons %v", pe)
	}
	var le *blacklist.LimitError
	if _, err := ParseNDJSON(strings.NewReader(strings.Repeat(`{"ip":"1.2.3.4"}`+"\n", 3)), false, now, 2); !errors.As(err, &le) {
		t.Fatalf("over max entries: %v", err)
	}
}

func FuzzParseNDJSON(f *testing.F) {
	f.Add([]byte(`{"ip":"198.51.100.7","duration":"4h","reason":"x"}`+"\n"+`{"cidr":"10.0.0.0/8","op":"remove"}`), true)
	f.Add([]byte(`{"ip":"::ffff:1.2.3.4","expires":"2030-01-01T00:00:00Z"}`), false)
	f.Add([]byte(`{"cidr":"2001:db8::/129","expires":99999999999}`), true)
	f.Add([]byte("{}\n\n[1]\n"), false)
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, data []byte, delta bool) {
		got, err := ParseNDJSON(strings.NewReader(string(data)), delta, now, 1000)
		if err != nil {
			return
		}
		if !delta && len(got.Delta.Remove) > 0 {
			t.Fatal("a whole list with removals")
		}
		for _, e := range got.Delta.Add {
			if !e.Prefix.IsValid() || e.Prefix != e.Prefix.Masked() {
				t.Fatalf("entry %v", e)
			}
		}
		if got.Reasons != nil && len(got.Reasons) != len(got.Delta.Add) {
			t.Fatal("reasons not one per addition")
		}
		l := blacklist.NewList("x", blacklist.Options{})
		if err := l.Apply(&got.Delta); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzLineFast: the fast reading of a line accepts only what encoding/json
// accepts, and reads it the same.
func FuzzLineFast(f *testing.F) {
	for _, s := range []string{
		`{"ip":"198.51.100.7","duration":"4h","reason":"scanner"}`,
		`{ "cidr" : "10.0.0.0/8" , "expires" : 1900000000 }`,
		`{"ip":"1.2.3.4","expires":1e9}`, `{"ip":"1.2.3.4","expires":-0.5E+3}`, `{"ip":"1.2.3.4","expires":01}`,
		`{"ip":"1.2.3.4","ip":"1.2.3.5"}`, `{"ip":"1.2.3.4","x":1}`, `{"ip":"a\"b"}`, `{}`, `{"op":"remove","ip":"::1"}`,
		`{"ip":"1.2.3.4"} x`, `{"reason":"é"}`, `{"ip":1}`, `{"duration":"4h",}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast, slow Line
		if !lineFast(b, &fast) {
			return
		}
		if !lineSlow(b, &slow) {
			t.Fatalf("%q: read fast, refused by encoding/json", b)
		}
		if fast.IP != slow.IP || fast.CIDR != slow.CIDR || fast.Reason != slow.Reason || fast.Op != slow.Op ||
			string(fast.Expires) != string(slow.Expires) || string(fast.Duration) != string(slow.Duration) {
			t.Fatalf("%q: fast %+v, encoding/json %+v", b, fast, slow)
		}
	})
}
