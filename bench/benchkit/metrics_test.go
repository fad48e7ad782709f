package benchkit

import (
	"strings"
	"testing"
)

func TestScanMetrics(t *testing.T) {
	in := `# HELP x y
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds_count 12
tiergate_tls_handshakes_total{listener="a",result="ok"} 3
tiergate_tls_handshakes_total{listener="a",result="timeout"} 1.5 1700000000000

`
	type sample struct {
		name, labels string
		v            float64
	}
	var got []sample
	if err := ScanMetrics(strings.NewReader(in), func(n, l string, v float64) { got = append(got, sample{n, l, v}) }); err != nil {
		t.Fatal(err)
	}
	want := []sample{
		{"go_gc_duration_seconds_count", "", 12},
		{"tiergate_tls_handshakes_total", `listener="a",result="ok"`, 3},
		{"tiergate_tls_handshakes_total", `listener="a",result="timeout"`, 1.5},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sample %d: %v, want %v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"x{a=\"1\" 2", "x{a=\"1\"} y", "x y", "x"} {
		if err := ScanMetrics(strings.NewReader(bad), func(string, string, float64) {}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestProcs(t *testing.T) {
	in := `tiergate_runtime_gomaxprocs 2
tiergate_runtime_gomaxprocs_changes_total{direction="down"} 1
tiergate_runtime_gomaxprocs_changes_total{direction="up"} 2
go_gc_duration_seconds_count 7
`
	var p Procs
	var others int
	if err := ScanMetrics(strings.NewReader(in), func(n, _ string, v float64) {
		if !p.Scan(n, v) {
			others++
		}
	}); err != nil {
		t.Fatal(err)
	}
	if p != (Procs{N: 2, Changes: 3}) || others != 1 {
		t.Fatalf("got %+v and %d other samples, want {2 3} and 1", p, others)
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
