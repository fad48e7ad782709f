package ui

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Kinds of Query.
const (
	KindRate     = "rate"     // per-second rate of a counter
	KindQuantile = "quantile" // a quantile of a histogram's rate (its _bucket series)
	KindGauge    = "gauge"    // a gauge's value
)

// NodeLabel is the label a Query groups by to show each node: the node's name
// with Scraper, the instance label with Prometheus.
const NodeLabel = "node"

// Matcher selects samples by one label: Label equal to Value, or not equal
// when Not. An absent label counts as "".
type Matcher struct {
	Label string
	Value string
	Not   bool
}

// Query is what one panel's series are: Metric's samples passing every matcher,
// as Kind, aggregated by the labels By (NodeLabel among them for one series per
// node), with Agg ("sum", the default, or "max" and "min" for gauges).
type Query struct {
	Kind     string
	Metric   string
	Match    []Matcher
	By       []string
	Agg      string
	Quantile float64 // for KindQuantile
}

// Panel is a chart of the page: its id, title, unit and the queries whose
// series it draws (several quantiles in one chart, say).
type Panel struct {
	ID      string  `json:"id"`
	Title   string  `json:"title"`
	Unit    string  `json:"unit"`
	Queries []Query `json:"-"`
	// Names prefix each query's series names (p50, p99), "" for none.
	Names []string `json:"-"`
}

func ne(label, value string) Matcher { return Matcher{Label: label, Value: value, Not: true} }
func eq(label, value string) Matcher { return Matcher{Label: label, Value: value} }

// Panels are the dashboard's charts, in the page's order.
var Panels = []Panel{
	{ID: "handshakes", Title: "TLS handshakes/s, full and resumed, over TCP and QUIC, cluster", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_tls_handshakes_total", Match: []Matcher{eq("result", "ok")}, By: []string{"transport", "resumed"}}}},
	{ID: "handshakes_node", Title: "Handshakes/s by node and transport", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_tls_handshakes_total", Match: []Matcher{eq("result", "ok")}, By: []string{NodeLabel, "transport", "resumed"}}}},
	{ID: "handshakes_listener", Title: "Handshakes/s by listener and transport", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_tls_handshakes_total", Match: []Matcher{eq("result", "ok")}, By: []string{"listener", "transport", "resumed"}}}},
	{ID: "handshake_failures", Title: "Handshake failures/s by transport and reason", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_tls_handshakes_total", Match: []Matcher{ne("result", "ok")}, By: []string{"transport", "result"}}}},
	{ID: "handshake_failures_node", Title: "Handshake failures/s by node and reason", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_tls_handshakes_total", Match: []Matcher{ne("result", "ok")}, By: []string{NodeLabel, "result"}}}},
	{ID: "handshake_latency", Title: "Handshake latency p50 / p99, and p99 over TCP and QUIC", Unit: "s", Names: []string{"p50", "p99", "p99"},
		Queries: []Query{
			{Kind: KindQuantile, Metric: "tiergate_tls_handshake_seconds", Quantile: 0.5},
			{Kind: KindQuantile, Metric: "tiergate_tls_handshake_seconds", Quantile: 0.99},
			{Kind: KindQuantile, Metric: "tiergate_tls_handshake_seconds", Quantile: 0.99, By: []string{"transport"}}}},
	{ID: "keyserver_latency", Title: "Keyserver operation latency p50 / p99, and p99 by node (a keyserverd's serving, an l7d's as its client)", Unit: "s", Names: []string{"p50", "p99", "p99"},
		Queries: []Query{
			{Kind: KindQuantile, Metric: "tiergate_keyserver_op_seconds", Quantile: 0.5},
			{Kind: KindQuantile, Metric: "tiergate_keyserver_op_seconds", Quantile: 0.99},
			{Kind: KindQuantile, Metric: "tiergate_keyserver_op_seconds", Quantile: 0.99, By: []string{NodeLabel}}}},
	{ID: "keyserver_inflight", Title: "Keyserver operations in flight, by node (keyserverd and l7d)", Unit: "",
		Queries: []Query{{Kind: KindGauge, Metric: "tiergate_keyserver_inflight", By: []string{NodeLabel}}}},
	{ID: "keyserver_errors", Title: "Keyserver operations failed/s, by result", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_keyserver_ops_total", Match: []Matcher{ne("result", "ok")}, By: []string{"result"}}}},
	{ID: "requests", Title: "HTTP requests/s by code", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_http_requests_total", By: []string{"code"}}}},
	{ID: "blacklist_size", Title: "Blacklist entries, by list", Unit: "",
		Queries: []Query{{Kind: KindGauge, Metric: "tiergate_blacklist_entries", By: []string{"list"}, Agg: "max"}}},
	{ID: "blacklist_hits", Title: "Blacklist hits/s, by list", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_blacklist_hits_total", By: []string{"list"}}}},
	{ID: "l4_packets", Title: "L4 packets/s forwarded, by LD", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_l4_packets_total", Match: []Matcher{eq("result", "forwarded")}, By: []string{NodeLabel}}}},
	{ID: "l4_drops", Title: "L4 drops/s by reason, by LD", Unit: "/s",
		Queries: []Query{{Kind: KindRate, Metric: "tiergate_l4_packets_total", Match: []Matcher{ne("result", "forwarded"), ne("result", "local")}, By: []string{NodeLabel, "result"}}}},
}

// CertMetric is the gauge the certificates' days left come from.
const CertMetric = "tiergate_tls_certificate_expiry_seconds"

// sampleName is the name of the samples q reads.
func (q *Query) sampleName() string {
	if q.Kind == KindQuantile {
		return q.Metric + "_bucket"
	}
	return q.Metric
}

// matches reports whether a sample's labels pass q's matchers.
func (q *Query) matches(labels map[string]string) bool {
	for _, m := range q.Match {
		if (labels[m.Label] == m.Value) == m.Not {
			return false
		}
	}
	return true
}

// PromQL is q in PromQL, its node label nodeLabel ("instance"), rates over
// window.
func (q *Query) PromQL(nodeLabel string, window time.Duration) string {
	var sel strings.Builder
	sel.WriteString(q.sampleName())
	if len(q.Match) > 0 {
		sel.WriteByte('{')
		for i, m := range q.Match {
			if i > 0 {
				sel.WriteByte(',')
			}
			op := "="
			if m.Not {
				op = "!="
			}
			sel.WriteString(m.Label + op + strconv.Quote(m.Value))
		}
		sel.WriteByte('}')
	}
	by := make([]string, 0, len(q.By)+1)
	for _, l := range q.By {
		if l == NodeLabel {
			l = nodeLabel
		}
		by = append(by, l)
	}
	agg := q.Agg
	if agg == "" {
		agg = "sum"
	}
	rng := "[" + strconv.FormatInt(int64(window/time.Second), 10) + "s]"
	switch q.Kind {
	case KindRate:
		return fmt.Sprintf("%s by (%s) (rate(%s%s))", agg, strings.Join(by, ", "), sel.String(), rng)
	case KindQuantile:
		return fmt.Sprintf("histogram_quantile(%g, sum by (%s) (rate(%s%s)))", q.Quantile, strings.Join(append([]string{"le"}, by...), ", "), sel.String(), rng)
	default:
		return fmt.Sprintf("%s by (%s) (%s)", agg, strings.Join(by, ", "), sel.String())
	}
}

// seriesName names a series by its group's label values: "full" and "resumed"
// for the resumed label, "TCP" and "QUIC" for the transport label (none shown
// when absent: a node from before it), label=value otherwise, "all" for none.
func seriesName(prefix string, by []string, values []string) string {
	parts := make([]string, 0, len(by)+1)
	if prefix != "" {
		parts = append(parts, prefix)
	}
	for i, l := range by {
		v := values[i]
		switch {
		case l == "resumed" && v == "true":
			parts = append(parts, "resumed")
		case l == "resumed":
			parts = append(parts, "full")
		case l == "transport" && v == "":
		case l == "transport":
			parts = append(parts, strings.ToUpper(v))
		case l == NodeLabel, l == "result", l == "code", l == "listener", l == "list":
			parts = append(parts, v)
		default:
			parts = append(parts, l+"="+v)
		}
	}
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, " ")
}

// bucket is one cumulative bucket of a histogram.
type bucket struct {
	le    float64
	count float64
}

// quantile is histogram_quantile's estimate of the q-quantile of buckets
// (cumulative counts), NaN when there is no observation.
func quantile(q float64, buckets []bucket) float64 {
	if len(buckets) < 2 { // +Inf alone says nothing of where the values are
		return math.NaN()
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	if !math.IsInf(buckets[len(buckets)-1].le, 1) {
		return math.NaN()
	}
	// Counts must not decrease with le (they may, from rates of separate scrapes).
	for i := 1; i < len(buckets); i++ {
		if buckets[i].count < buckets[i-1].count {
			buckets[i].count = buckets[i-1].count
		}
	}
	total := buckets[len(buckets)-1].count
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	i := sort.Search(len(buckets)-1, func(i int) bool { return buckets[i].count >= rank })
	if i == len(buckets)-1 {
		return buckets[len(buckets)-2].le
	}
	if i == 0 && buckets[0].le <= 0 {
		return buckets[0].le
	}
	start, end := 0.0, buckets[i].le
	countBefore := 0.0
	if i > 0 {
		start, countBefore = buckets[i-1].le, buckets[i-1].count
	}
	inBucket := buckets[i].count - countBefore
	if inBucket <= 0 {
		return end
	}
	return start + (end-start)*(rank-countBefore)/inBucket
}

// groupKey joins label values into a map key.
func groupKey(values []string) string { return strings.Join(values, "\x00") }

func splitKey(key string, n int) []string {
	if n == 0 {
		return nil
	}
	return strings.SplitN(key, "\x00", n)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
