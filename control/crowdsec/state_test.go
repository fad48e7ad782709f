package crowdsec

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
)

func newState() *Bouncer {
	return &Bouncer{filter: &Filter{}, active: map[netip.Prefix]map[int64]held{}, ranges: map[netip.Prefix]struct{}{}}
}

func dec(id int64, scope, value, dur string) Decision {
	return Decision{ID: id, Scope: scope, Value: value, Type: "ban", Duration: dur, Scenario: fmt.Sprint("s", id)}
}

// show is a delta in a stable text: "-p" for each removal, "+p@end" for each
// addition (end as seconds from at, or "never"), sorted.
func show(d *blacklist.Delta, at time.Time) []string {
	var out []string
	for _, p := range d.Remove {
		out = append(out, "-"+p.String())
	}
	for _, e := range d.Add {
		end := "never"
		if !e.Expires.IsZero() {
			end = fmt.Sprint(e.Expires.Sub(at).Round(time.Second))
		}
		out = append(out, "+"+e.Prefix.String()+"@"+end)
	}
	slices.Sort(out)
	return out
}

// The bouncer's state of decisions, by ID, turned into deltas: what each
// stream must write.
func TestStateDeltas(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	b := newState()
	step := func(what string, s Stream, want ...string) {
		t.Helper()
		d, reasons := b.change(&s, at, Skipped{})
		if got := show(d, at); !slices.Equal(got, want) {
			t.Errorf("%s: delta %q, want %q", what, got, want)
		}
		if len(reasons) != len(d.Add) {
			t.Errorf("%s: %d reasons for %d additions", what, len(reasons), len(d.Add))
		}
	}
	step("a decision that never ends", Stream{New: []Decision{dec(1, "Ip", "198.51.100.1", "")}}, "+198.51.100.1/32@never")
	step("a second decision, of 1h, on it", Stream{New: []Decision{dec(2, "Ip", "198.51.100.1", "1h")}}, "+198.51.100.1/32@never")
	step("the one that never ends deleted", Stream{Deleted: []Decision{dec(1, "Ip", "198.51.100.1", "-1s")}},
		"+198.51.100.1/32@1h0m0s", "-198.51.100.1/32")
	step("a deletion of a decision not held", Stream{Deleted: []Decision{dec(9, "Ip", "198.51.100.1", "-1s")}})
	step("a range and a host in it", Stream{New: []Decision{dec(3, "Range", "198.18.0.0/15", "2h"), dec(4, "Ip", "198.18.0.1", "30m")}},
		"+198.18.0.0/15@2h0m0s", "+198.18.0.1/32@30m0s")
	step("the host in the range deleted: the range added again", Stream{Deleted: []Decision{dec(4, "Ip", "198.18.0.1", "-1s")}},
		"+198.18.0.0/15@2h0m0s", "-198.18.0.1/32")
	step("a host in the range, then the range deleted: the host added again",
		Stream{New: []Decision{dec(5, "Ip", "198.18.0.9", "1h")}, Deleted: []Decision{dec(3, "Range", "198.18.0.0/15", "-1s")}},
		"+198.18.0.9/32@1h0m0s", "-198.18.0.0/15")
	step("a deleted decision and a new one on the same address in one stream",
		Stream{New: []Decision{dec(6, "Ip", "198.18.0.9", "3h")}, Deleted: []Decision{dec(5, "Ip", "198.18.0.9", "-1s")}},
		"+198.18.0.9/32@3h0m0s")
	step("the same decision sent again, its end a moment later", Stream{New: []Decision{dec(6, "Ip", "198.18.0.9", "3h0m1s")}},
		"+198.18.0.9/32@3h0m1s")

	// A resync writes the difference from every active decision.
	b.fullAt = at
	d, _ := b.resync(&Stream{New: []Decision{
		dec(2, "Ip", "198.51.100.1", "59m59.5s"), // the same end, within the slack
		dec(6, "Ip", "198.18.0.9", "1h"),         // its end moved earlier
		dec(7, "Ip", "2001:db8::7", "10m"),       // new
	}}, at)
	if got, want := show(d, at), []string{"+198.18.0.9/32@1h0m0s", "+2001:db8::7/128@10m0s", "-198.18.0.9/32"}; !slices.Equal(got, want) {
		t.Errorf("resync: delta %q, want %q", got, want)
	}
	d, _ = b.resync(&Stream{}, at.Add(30*time.Minute))
	if got, want := show(d, at), []string{"-198.18.0.9/32", "-198.51.100.1/32"}; !slices.Equal(got, want) {
		t.Errorf("resync with none active, 30m on: delta %q, want %q (what has ended not removed)", got, want)
	}
}
