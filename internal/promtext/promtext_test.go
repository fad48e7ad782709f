package promtext

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const exposition = `# HELP tiergate_keyserver_ops_total Operations.
# TYPE tiergate_keyserver_ops_total counter
tiergate_keyserver_ops_total{op="rsa_sign_pss",result="ok"} 9
tiergate_keyserver_ops_total{op="ping",result="ok"} 4
tiergate_keyserver_ops_total{op="rsa_sign_pss",result="error"} 1 1700000000000
# TYPE tiergate_l4_member_up gauge
tiergate_l4_member_up{member="l7b",pool="l7"} 0
tiergate_l4_member_up{member="l7a",pool="l7"} 1
tiergate_l4_member_upper 7
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.0001
go_gc_duration_seconds_sum 0.25
go_gc_duration_seconds_count 12
# TYPE tiergate_op_seconds histogram
tiergate_op_seconds_bucket{op="sign",le="0.01"} 3
tiergate_op_seconds_bucket{op="sign",le="+Inf"} 5
tiergate_op_seconds_sum{op="sign"} 0.4
tiergate_op_seconds_count{op="sign"} 5
tiergate_escaped{path="a\"b\\c"} 2
`

func TestParse(t *testing.T) {
	ss, err := Parse(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, s := range ss {
		lines = append(lines, s.String())
	}
	want := []string{
		`go_gc_duration_seconds{quantile="0.5"} 0.0001`,
		`go_gc_duration_seconds_sum 0.25`,
		`go_gc_duration_seconds_count 12`,
		`tiergate_escaped{path="a\"b\\c"} 2`,
		`tiergate_keyserver_ops_total{op="ping",result="ok"} 4`,
		`tiergate_keyserver_ops_total{op="rsa_sign_pss",result="error"} 1`,
		`tiergate_keyserver_ops_total{op="rsa_sign_pss",result="ok"} 9`,
		`tiergate_l4_member_up{member="l7a",pool="l7"} 1`,
		`tiergate_l4_member_up{member="l7b",pool="l7"} 0`,
		`tiergate_l4_member_upper 7`,
		`tiergate_op_seconds_bucket{le="0.01",op="sign"} 3`,
		`tiergate_op_seconds_bucket{le="+Inf",op="sign"} 5`,
		`tiergate_op_seconds_sum{op="sign"} 0.4`,
		`tiergate_op_seconds_count{op="sign"} 5`,
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("samples:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if got := ss.Sum("tiergate_keyserver_ops_total", `result="ok"`, `!op="ping"`); got != 9 {
		t.Errorf("ok operations but pings: %v, want 9", got)
	}
	if got := ss.Sum("tiergate_keyserver_ops_total"); got != 14 {
		t.Errorf("all operations: %v, want 14", got)
	}
	if got := ss.Sum("tiergate_keyserver_ops_total", `result="absent"`); got != 0 {
		t.Errorf("no match: %v", got)
	}
	if got := ss.Sum("tiergate_l4_member_upper", `member=""`); got != 7 {
		t.Errorf("an absent label matches \"\": %v", got)
	}
	if got := ss.Sum("go_gc_duration_seconds_count"); got != 12 {
		t.Errorf("summary count %v", got)
	}
	if got := ss.By("tiergate_l4_member_up", "member"); !reflect.DeepEqual(got, map[string]float64{"l7a": 1, "l7b": 0}) {
		t.Errorf("By member: %v", got)
	}
	if got := len(ss.Select("tiergate_l4_member")); got != 0 {
		t.Errorf("a name's prefix selects %d samples", got)
	}
}

func TestParseErrors(t *testing.T) {
	for _, bad := range []string{
		"tiergate_x{a=\"b\" 1\n",
		"tiergate_x notanumber\n",
		"tiergate_x 1", // no end of line
		"# TYPE tiergate_x counter\n# TYPE tiergate_x gauge\ntiergate_x 1\n",
	} {
		if ss, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed as %v", bad, ss)
		}
	}
}

func TestMalformedMatcher(t *testing.T) {
	for _, m := range []string{`result=ok`, `result`, `="ok"`, `!result`} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("matcher %q accepted", m)
				}
			}()
			Samples{}.Select("x", m)
		}()
	}
}

// TestGet scrapes what client_golang serves, as the daemons do.
func TestGet(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tiergate_test_total", Help: "h"}, []string{"result"})
	reg.MustRegister(c)
	c.WithLabelValues("ok").Add(3)
	c.WithLabelValues("error").Inc()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	ss, err := Get(context.Background(), srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got := ss.Sum("tiergate_test_total", `result="ok"`); got != 3 {
		t.Errorf("ok = %v, want 3", got)
	}

	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	if _, err := Get(context.Background(), nil, notFound.URL); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Get of a 404 = %v", err)
	}
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "not metrics {\n") }))
	defer garbage.Close()
	if _, err := Get(context.Background(), nil, garbage.URL); err == nil || !strings.Contains(err.Error(), "scraping "+garbage.URL) {
		t.Errorf("Get of garbage = %v", err)
	}
}

// FuzzParse: any input parses or is refused, never panics, and every sample has a
// name and a label string that names its labels.
func FuzzParse(f *testing.F) {
	f.Add(exposition)
	f.Add("x 1\n")
	f.Add("x{a=\"\\n\"} NaN\n")
	f.Add("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n")
	f.Add("{\"utf8.name\"} 1\n")
	f.Add("x{")
	f.Fuzz(func(t *testing.T, in string) {
		ss, err := Parse(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, s := range ss {
			if s.Name == "" {
				t.Errorf("sample with no name from %q", in)
			}
			ls := s.LabelString()
			for k := range s.Labels {
				if !strings.Contains(ls, k+"=") {
					t.Errorf("label string %q lacks %q", ls, k)
				}
			}
		}
	})
}
