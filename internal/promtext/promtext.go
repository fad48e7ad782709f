// Package promtext reads the Prometheus text format that the daemons serve on
// /metrics, for the demo, the benchmarks and the end-to-end tests: one parser (the
// Prometheus project's own, expfmt), its metric families flattened into the samples
// the text shows, and one way to pick samples by name and labels.
package promtext

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// MaxBytes bounds how much of a response Parse reads.
const MaxBytes = 16 << 20

// Sample is one sample line of the text format: a summary or histogram gives several
// (name{quantile=...}, name_bucket{le=...}, name_sum, name_count), as the text shows
// them.
type Sample struct {
	Name   string
	Labels map[string]string // nil when the sample has none
	Value  float64
}

// LabelString is the sample's label set as the text format writes it, names sorted:
// `{op="sign",result="ok"}`, or "" when it has none.
func (s Sample) LabelString() string {
	if len(s.Labels) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(s.Labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(s.Labels[k]))
	}
	b.WriteByte('}')
	return b.String()
}

// String is the sample as a line of the text format, without its timestamp.
func (s Sample) String() string {
	return s.Name + s.LabelString() + " " + strconv.FormatFloat(s.Value, 'g', -1, 64)
}

// Samples is what a scrape read, sorted by name and then by label set.
type Samples []Sample

// Parse reads the text format from r (at most MaxBytes).
func Parse(r io.Reader) (Samples, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(io.LimitReader(r, MaxBytes))
	if err != nil {
		return nil, fmt.Errorf("parsing Prometheus text: %w", err)
	}
	var ss Samples
	for _, name := range slices.Sorted(maps.Keys(families)) {
		ss = appendFamily(ss, families[name])
	}
	return ss, nil
}

// appendFamily appends mf's samples, its metrics ordered by label set.
func appendFamily(ss Samples, mf *dto.MetricFamily) Samples {
	type metric struct {
		key    string
		labels map[string]string
		m      *dto.Metric
	}
	ms := make([]metric, 0, len(mf.GetMetric()))
	for _, m := range mf.GetMetric() {
		var labels map[string]string
		if len(m.GetLabel()) > 0 {
			labels = make(map[string]string, len(m.GetLabel()))
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
		}
		ms = append(ms, metric{Sample{Labels: labels}.LabelString(), labels, m})
	}
	slices.SortStableFunc(ms, func(a, b metric) int { return cmp.Compare(a.key, b.key) })
	name := mf.GetName()
	for _, x := range ms {
		m := x.m
		switch {
		case m.Counter != nil:
			ss = append(ss, Sample{name, x.labels, m.Counter.GetValue()})
		case m.Gauge != nil:
			ss = append(ss, Sample{name, x.labels, m.Gauge.GetValue()})
		case m.Untyped != nil:
			ss = append(ss, Sample{name, x.labels, m.Untyped.GetValue()})
		case m.Summary != nil:
			for _, q := range m.Summary.GetQuantile() {
				ss = append(ss, Sample{name, with(x.labels, "quantile", q.GetQuantile()), q.GetValue()})
			}
			ss = append(ss, Sample{name + "_sum", x.labels, m.Summary.GetSampleSum()},
				Sample{name + "_count", x.labels, float64(m.Summary.GetSampleCount())})
		case m.Histogram != nil:
			for _, b := range m.Histogram.GetBucket() {
				ss = append(ss, Sample{name + "_bucket", with(x.labels, "le", b.GetUpperBound()), float64(b.GetCumulativeCount())})
			}
			ss = append(ss, Sample{name + "_sum", x.labels, m.Histogram.GetSampleSum()},
				Sample{name + "_count", x.labels, float64(m.Histogram.GetSampleCount())})
		}
	}
	return ss
}

// with returns labels and name=v, v written as the text format writes bounds.
func with(labels map[string]string, name string, v float64) map[string]string {
	l := make(map[string]string, len(labels)+1)
	maps.Copy(l, labels)
	switch {
	case math.IsInf(v, 1):
		l[name] = "+Inf"
	case math.IsInf(v, -1):
		l[name] = "-Inf"
	default:
		l[name] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return l
}

// Get scrapes url through hc (nil: a client with a five-second timeout): the
// answer must be 200 OK in the text format.
func Get(ctx context.Context, hc *http.Client, url string) (Samples, error) {
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	ss, err := Parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	return ss, nil
}

// Select returns the samples named name whose labels pass every matcher. A matcher
// is `label="value"` (the label has that value; absent counts as "") or
// `!label="value"` (it has not). A malformed matcher panics: it is the caller's
// mistake, not the scrape's.
func (ss Samples) Select(name string, matchers ...string) Samples {
	type matcher struct {
		label, value string
		not          bool
	}
	ms := make([]matcher, len(matchers))
	for i, s := range matchers {
		m := matcher{}
		s, m.not = strings.CutPrefix(s, "!")
		label, quoted, ok := strings.Cut(s, "=")
		v, err := strconv.Unquote(quoted)
		if !ok || label == "" || err != nil {
			panic(fmt.Sprintf("promtext: matcher %q is not label=\"value\" or !label=\"value\"", matchers[i]))
		}
		m.label, m.value = label, v
		ms[i] = m
	}
	var out Samples
next:
	for _, s := range ss {
		if s.Name != name {
			continue
		}
		for _, m := range ms {
			if (s.Labels[m.label] == m.value) == m.not {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// Sum adds up the values of Select(name, matchers...): 0 when none match.
func (ss Samples) Sum(name string, matchers ...string) float64 {
	var sum float64
	for _, s := range ss.Select(name, matchers...) {
		sum += s.Value
	}
	return sum
}

// By returns the values of the samples named name by their label label (a per-member
// gauge by member, say); samples without it are left out, and samples that share a
// value of it are added up.
func (ss Samples) By(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range ss.Select(name) {
		if v, ok := s.Labels[label]; ok {
			out[v] += s.Value
		}
	}
	return out
}
