package ui

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxPromBytes bounds an answer of the Prometheus server read.
const maxPromBytes = 32 << 20

// PrometheusConfig configures a Prometheus source.
type PrometheusConfig struct {
	// URL is the server's base URL (http://127.0.0.1:9090). Required.
	URL string
	// Step is the time between points. Default DefaultInterval (2s); at least 1s.
	Step time.Duration
	// RateWindow is the range of the rates: at least two of Prometheus's own
	// scrape intervals must fall in it. Default 4 × Step, at least 30s.
	RateWindow time.Duration
	// NodeLabel is the label that names a node in Prometheus. Default "instance".
	NodeLabel string
	// Timeout bounds each query. Default 10s.
	Timeout time.Duration
	// Client queries. Default a client with no proxy.
	Client *http.Client
}

// Prometheus answers the dashboard with PromQL over a Prometheus server's HTTP
// API. It is a Source.
type Prometheus struct{ cfg PrometheusConfig }

// NewPrometheus returns a Prometheus source.
func NewPrometheus(cfg PrometheusConfig) (*Prometheus, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("-prometheus %q: want the server's http or https URL", cfg.URL)
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.Step <= 0 {
		cfg.Step = DefaultInterval
	}
	cfg.Step = max(cfg.Step, time.Second)
	if cfg.RateWindow <= 0 {
		cfg.RateWindow = max(4*cfg.Step, 30*time.Second)
	}
	if cfg.NodeLabel == "" {
		cfg.NodeLabel = "instance"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{Proxy: nil}}
	}
	return &Prometheus{cfg: cfg}, nil
}

// promSeries is one series of a query's answer.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Values [][2]any          `json:"values"` // range: [[t, "v"], ...]
	Value  [2]any            `json:"value"`  // instant: [t, "v"]
}

// query runs a PromQL query at the API path (query or query_range) with params.
func (p *Prometheus) query(ctx context.Context, path string, params url.Values) ([]promSeries, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.URL+"/api/v1/"+path, strings.NewReader(params.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("querying Prometheus %q: %w", params.Get("query"), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPromBytes))
	if err != nil {
		return nil, fmt.Errorf("querying Prometheus %q: %w", params.Get("query"), err)
	}
	res, err := parseAnswer(body)
	if err != nil {
		return nil, fmt.Errorf("querying Prometheus %q: %s: %w", params.Get("query"), resp.Status, err)
	}
	return res, nil
}

// parseAnswer reads an answer of Prometheus's query API.
func parseAnswer(body []byte) ([]promSeries, error) {
	var ans struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string       `json:"resultType"`
			Result     []promSeries `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		return nil, fmt.Errorf("the answer is not its JSON: %w", err)
	}
	if ans.Status != "success" {
		return nil, fmt.Errorf("%s: %s", ans.ErrorType, ans.Error)
	}
	return ans.Data.Result, nil
}

// QueryRange runs expr over [start, end] at step, the values aligned on the
// points start + k×step (null where there is none).
func (p *Prometheus) QueryRange(ctx context.Context, expr string, start time.Time, n int) ([]Series, error) {
	end := start.Add(time.Duration(n-1) * p.cfg.Step)
	res, err := p.query(ctx, "query_range", url.Values{"query": {expr},
		"start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)},
		"step": {strconv.FormatFloat(p.cfg.Step.Seconds(), 'f', -1, 64)}})
	if err != nil {
		return nil, err
	}
	return align(res, start, p.cfg.Step, n), nil
}

// align puts a range answer's values on the n points start + k×step (null
// where there is none); values off the points, or not numbers, are left out.
func align(res []promSeries, start time.Time, step time.Duration, n int) []Series {
	out := make([]Series, 0, len(res))
	for _, r := range res {
		vals := make([]*float64, n)
		for _, tv := range r.Values {
			t, ok := tv[0].(float64)
			s, ok2 := tv[1].(string)
			if !ok || !ok2 {
				continue
			}
			kf := math.Round((t - float64(start.Unix())) / step.Seconds())
			v, err := strconv.ParseFloat(s, 64)
			if !(kf >= 0 && kf < float64(n)) || err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			vals[int(kf)] = ptr(v)
		}
		out = append(out, Series{Labels: r.Metric, Values: vals})
	}
	return out
}

// Instant runs expr now.
func (p *Prometheus) Instant(ctx context.Context, expr string) ([]Series, error) {
	res, err := p.query(ctx, "query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	out := make([]Series, 0, len(res))
	for _, r := range res {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			continue
		}
		out = append(out, Series{Labels: r.Metric, Values: []*float64{ptr(v)}})
	}
	return out, nil
}

// Dashboard runs every panel's PromQL over the window.
func (p *Prometheus) Dashboard(ctx context.Context, window time.Duration) (*Dashboard, error) {
	step := p.cfg.Step
	end := time.Now().Truncate(step)
	n := int(window/step) + 1
	start := end.Add(-time.Duration(n-1) * step)
	d := &Dashboard{Source: "prometheus", IntervalSeconds: step.Seconds(), Times: make([]float64, n), Targets: []Target{}, Certificates: []Cert{}}
	for i := range d.Times {
		d.Times[i] = float64(start.Add(time.Duration(i) * step).Unix())
	}
	d.Panels = make([]PanelData, len(Panels))
	errs := make([]error, len(Panels))
	var wg sync.WaitGroup
	for pi, pn := range Panels {
		d.Panels[pi] = PanelData{Panel: pn, Series: []Series{}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range pn.Queries {
				q := &pn.Queries[i]
				ss, err := p.QueryRange(ctx, q.PromQL(p.cfg.NodeLabel, p.cfg.RateWindow), start, n)
				if err != nil {
					errs[pi] = err
					return
				}
				prefix := ""
				if i < len(pn.Names) {
					prefix = pn.Names[i]
				}
				for _, s := range ss {
					vals := make([]string, len(q.By))
					labels := map[string]string{}
					for j, l := range q.By {
						pl := l
						if l == NodeLabel {
							pl = p.cfg.NodeLabel
						}
						vals[j] = s.Labels[pl]
						labels[l] = vals[j]
					}
					s.Name, s.Labels = seriesName(prefix, q.By, vals), labels
					d.Panels[pi].Series = append(d.Panels[pi].Series, s)
				}
			}
			slices.SortFunc(d.Panels[pi].Series, func(a, b Series) int { return strings.Compare(a.Name, b.Name) })
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	ups, err := p.Instant(ctx, "up")
	if err != nil {
		return nil, err
	}
	for _, u := range ups {
		t := Target{Node: u.Labels[p.cfg.NodeLabel], Role: u.Labels["job"], Up: *u.Values[0] == 1}
		if !t.Up {
			t.Error = "Prometheus's last scrape of it failed"
		}
		d.Targets = append(d.Targets, t)
	}
	slices.SortFunc(d.Targets, func(a, b Target) int { return strings.Compare(a.Node, b.Node) })
	certs, err := p.Instant(ctx, CertMetric)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for _, c := range certs {
		exp := time.Unix(int64(*c.Values[0]), 0).UTC()
		d.Certificates = append(d.Certificates, Cert{Name: c.Labels["name"], Subject: c.Labels["subject"], Node: c.Labels[p.cfg.NodeLabel],
			Expires: exp, DaysLeft: math.Round(exp.Sub(now).Hours()/24*10) / 10})
	}
	slices.SortStableFunc(d.Certificates, func(a, b Cert) int { return a.Expires.Compare(b.Expires) })
	d.trim()
	return d, nil
}
