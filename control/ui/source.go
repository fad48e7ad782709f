package ui

import (
	"context"
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
