package benchkit

import (
	"strings"
	"testing"

	"github.com/tiergate/tiergate/internal/promtext"
)

func TestProcs(t *testing.T) {
	in := `tiergate_runtime_gomaxprocs 2
tiergate_runtime_gomaxprocs_changes_total{direction="down"} 1
tiergate_runtime_gomaxprocs_changes_total{direction="up"} 2
go_gc_duration_seconds_count 7
`
	ss, err := promtext.Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	p := ProcsOf(ss)
	if p != (Procs{N: 2, Changes: 3}) {
		t.Fatalf("got %+v, want {2 3}", p)
	}
	d := p.Since(Procs{N: 1, Changes: 1})
	if d != (Procs{N: 2, Changes: 2}) {
		t.Errorf("over the row: %+v, want 2 Ps at the end and 2 changes", d)
	}
	if got := d.Note(); got != ", 2 Ps at the end (2 changes)" {
		t.Errorf("note %q", got)
	}
	if got := (*Procs)(nil).Note(); got != "" {
		t.Errorf("note without Ps %q", got)
	}
}
