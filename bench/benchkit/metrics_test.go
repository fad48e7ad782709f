package benchkit

import (
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/promtext"
)

func TestProcs(t *testing.T) {
	in := `tiergate_runtime_gomaxprocs 2
tiergate_runtime_gomaxprocs_changes_total{direction="down"} 1
tiergate_runtime_gomaxprocs_changes_total{direction="up"} 2
tiergate_runtime_gomaxprocs_seconds_total 13.5
go_gc_duration_seconds_count 7
`
	ss, err := promtext.Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	p := ProcsOf(ss)
	if p.N != 2 || p.Changes != 3 || p.pSeconds != 13.5 || p.at.IsZero() {
		t.Fatalf("got %+v, want 2 Ps, 3 changes, 13.5 P-seconds and the time read", p)
	}
	// The row began 6 s before, at 4.5 P-seconds: 9 over 6 s, 1.5 Ps on average.
	d := p.Since(Procs{N: 1, Changes: 1, pSeconds: 4.5, at: p.at.Add(-6 * time.Second)})
	if d.N != 2 || d.Changes != 2 || d.Mean != 1.5 {
		t.Errorf("over the row: %+v, want 2 Ps at the end, 2 changes and 1.5 on average", d)
	}
	if got := d.Note(); got != ", 2 Ps at the end (2 changes, 1.50 on average)" {
		t.Errorf("note %q", got)
	}
	// An l7d without the counter: no mean.
	old := Procs{N: 2, Changes: 3, at: p.at}.Since(Procs{N: 1, Changes: 1, at: p.at.Add(-time.Second)})
	if old.Mean != 0 {
		t.Errorf("mean without P-seconds %v, want 0", old.Mean)
	}
	if got := old.Note(); got != ", 2 Ps at the end (2 changes)" {
		t.Errorf("note %q", got)
	}
	if got := (*Procs)(nil).Note(); got != "" {
		t.Errorf("note without Ps %q", got)
	}
}
