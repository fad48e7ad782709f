package benchkit

import (
	"fmt"
	"time"

	"github.com/tiergate/tiergate/internal/promtext"
)

// Procs is l7d's GOMAXPROCS sizing (internal/autoprocs) as its metrics show it: the
// Ps at the time of a scrape, the changes so far, and, over a row (Since), the mean
// Ps. In a report's JSON it is three fields, l7d_gomaxprocs_end,
// l7d_gomaxprocs_changes and l7d_gomaxprocs_mean.
type Procs struct {
	N       float64 `json:"l7d_gomaxprocs_end"`
	Changes float64 `json:"l7d_gomaxprocs_changes"`
	// Mean is the Ps in use on average between two scrapes (Since); 0 when unknown.
	Mean float64 `json:"l7d_gomaxprocs_mean,omitempty"`

	pSeconds float64   // tiergate_runtime_gomaxprocs_seconds_total
	at       time.Time // when the scrape was read
}

// ProcsOf reads Procs from a scrape of l7d's metrics, taken now.
func ProcsOf(ss promtext.Samples) Procs {
	return Procs{
		N:        ss.Sum("tiergate_runtime_gomaxprocs"),
		Changes:  ss.Sum("tiergate_runtime_gomaxprocs_changes_total"), // summed over directions
		pSeconds: ss.Sum("tiergate_runtime_gomaxprocs_seconds_total"),
		at:       time.Now(),
	}
}

// Since is p for a row that began when o was scraped: the Ps at its end, the
// changes during it and the mean Ps over it. The mean is counted at l7d's sampling
// intervals (100 ms), so it is off by up to an interval's Ps at each end.
func (p Procs) Since(o Procs) Procs {
	d := Procs{N: p.N, Changes: p.Changes - o.Changes, pSeconds: p.pSeconds, at: p.at}
	if wall := p.at.Sub(o.at).Seconds(); wall > 0 && p.pSeconds > o.pSeconds {
		d.Mean = (p.pSeconds - o.pSeconds) / wall
	}
	return d
}

// Note is ", N Ps at the end (K changes, M on average)" for a report line; "" for
// nil. The mean is left out when unknown.
func (p *Procs) Note() string {
	if p == nil {
		return ""
	}
	if p.Mean > 0 {
		return fmt.Sprintf(", %.0f Ps at the end (%.0f changes, %.2f on average)", p.N, p.Changes, p.Mean)
	}
	return fmt.Sprintf(", %.0f Ps at the end (%.0f changes)", p.N, p.Changes)
}
