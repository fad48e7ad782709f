package ui

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/promtext"
)

// FuzzPromAnswer feeds Prometheus API answers (bytes from the server -prometheus
// names) to the parser and the alignment of their values on the points: no
// panic, every value a finite number on one of the points.
func FuzzPromAnswer(f *testing.F) {
	f.Add([]byte(`{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"instance":"a:1","resumed":"false"},"values":[[1700000000,"12.5"],[1700000002,"NaN"],[1700000004,"+Inf"],[1699999990,"1"]]}]}}`))
	f.Add([]byte(`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"up"},"value":[1700000000.5,"1"]}]}}`))
	f.Add([]byte(`{"status":"error","errorType":"bad_data","error":"parse error at char 3"}`))
	f.Add([]byte(`{"status":"success","data":{"result":[{"values":[[1e308,"1"],["x",2],[-1e308,"1e400"]]}]}}`))
	f.Add([]byte(`[]`))
	start := time.Unix(1_700_000_000, 0)
	f.Fuzz(func(t *testing.T, body []byte) {
		res, err := parseAnswer(body)
		if err != nil {
			return
		}
		for _, s := range align(res, start, 2*time.Second, 10) {
			if len(s.Values) != 10 {
				t.Fatalf("%d values, want 10", len(s.Values))
			}
			for _, v := range s.Values {
				if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0)) {
					t.Fatalf("value %v kept", *v)
				}
			}
		}
	})
}

// FuzzScrape feeds a node's /metrics answer (bytes from the node) to the scraper's
// sums: no panic, at most MaxSeriesPerNode kept.
func FuzzScrape(f *testing.F) {
	f.Add([]byte("# TYPE tiergate_tls_handshakes_total counter\ntiergate_tls_handshakes_total{listener=\"web\",resumed=\"true\",result=\"ok\"} 5\n"))
	f.Add([]byte("# TYPE tiergate_tls_handshake_seconds histogram\ntiergate_tls_handshake_seconds_bucket{le=\"0.01\"} 3\ntiergate_tls_handshake_seconds_bucket{le=\"+Inf\"} 4\ntiergate_tls_handshake_seconds_sum 0.1\ntiergate_tls_handshake_seconds_count 4\n"))
	f.Add([]byte("tiergate_tls_certificate_expiry_seconds{name=\"www\",subject=\"CN=x\"} 1e300\ntiergate_blacklist_entries{list=\"global\"} -1\n"))
	s := NewScraper(ScraperConfig{Nodes: nil})
	f.Fuzz(func(t *testing.T, text []byte) {
		ss, err := promtext.Parse(bytes.NewReader(text))
		if err != nil {
			return
		}
		sums, _ := s.sum("n", ss, time.Unix(1_700_000_000, 0))
		kept := 0
		for _, m := range sums {
			kept += len(m)
		}
		if kept > MaxSeriesPerNode {
			t.Fatalf("%d sums kept, over %d", kept, MaxSeriesPerNode)
		}
		// Two rounds of it, the second doubled: every panel evaluates.
		twice := make([]map[string]float64, len(sums))
		for i, m := range sums {
			if m != nil {
				twice[i] = map[string]float64{}
				for k, v := range m {
					twice[i][k] = 2 * v
				}
			}
		}
		t0 := time.Unix(1_700_000_000, 0)
		s.rounds = []*round{{t: t0, nodes: map[string][]map[string]float64{"n": sums}}, {t: t0.Add(2 * time.Second), nodes: map[string][]map[string]float64{"n": twice}}}
		if _, err := s.Dashboard(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
	})
}
