package ui

import (
	"context"
	"math"
	"sort"
	"time"
)

// Source answers the dashboard: Scraper or Prometheus.
type Source interface {
	// Dashboard returns the panels' series over the window before now.
	Dashboard(ctx context.Context, window time.Duration) (*Dashboard, error)
}

// Dashboard is the answer of GET /v1/ui/dashboard.
type Dashboard struct {
	// Source is "scrape" or "prometheus".
	Source string `json:"source"`
	// IntervalSeconds is the time between points.
	IntervalSeconds float64 `json:"interval_seconds"`
	// Times are the points' Unix times in seconds, oldest first; every series has
	// a value (or null) for each.
	Times        []float64   `json:"times"`
	Panels       []PanelData `json:"panels"`
	Targets      []Target    `json:"targets"`
	Certificates []Cert      `json:"certificates"`
}

// PanelData is one chart's series.
type PanelData struct {
	Panel
	Series []Series `json:"series"`
	// Omitted is how many series were left out past MaxSeriesPerPanel (those
	// with the lowest latest values).
	Omitted int `json:"omitted,omitempty"`
}

// MaxSeriesPerPanel bounds the series of a chart the dashboard answers (a
// thousand nodes would be a thousand lines and megabytes a refresh): those
// with the highest latest values are kept.
const MaxSeriesPerPanel = 40

// trim keeps of each panel the MaxSeriesPerPanel series with the highest latest
// values, in their order.
func (d *Dashboard) trim() {
	for i := range d.Panels {
		p := &d.Panels[i]
		if len(p.Series) <= MaxSeriesPerPanel {
			continue
		}
		latest := func(s Series) float64 {
			for j := len(s.Values) - 1; j >= 0; j-- {
				if s.Values[j] != nil {
					return *s.Values[j]
				}
			}
			return math.Inf(-1)
		}
		idx := make([]int, len(p.Series))
		for j := range idx {
			idx[j] = j
		}
		sort.SliceStable(idx, func(a, b int) bool { return latest(p.Series[idx[a]]) > latest(p.Series[idx[b]]) })
		keep := idx[:MaxSeriesPerPanel]
		sort.Ints(keep)
		kept := make([]Series, 0, MaxSeriesPerPanel)
		for _, j := range keep {
			kept = append(kept, p.Series[j])
		}
		p.Omitted += len(p.Series) - len(kept)
		p.Series = kept
	}
}

// Series is one line of a chart: its name, labels and values (null where there
// is none).
type Series struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	Values []*float64        `json:"values"`
}

// Target is a node scraped (or Prometheus's target): whether its last scrape
// worked, when and why not.
type Target struct {
	Node string `json:"node"`
	Role string `json:"role,omitempty"`
	URL  string `json:"url,omitempty"`
	// Up says the last scrape worked.
	Up bool `json:"up"`
	// Lost says the node no longer reports to the store.
	Lost bool `json:"lost,omitempty"`
	// LastSeen is the time of its last good scrape (zero: never).
	LastSeen time.Time `json:"last_seen,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// Cert is a served certificate's expiry as a node reports it.
type Cert struct {
	Name     string    `json:"name"`
	Subject  string    `json:"subject"`
	Node     string    `json:"node"`
	Expires  time.Time `json:"expires"`
	DaysLeft float64   `json:"days_left"`
}

func ptr(v float64) *float64 { return &v }
