package benchkit

import (
	"fmt"

	"github.com/tiergate/tiergate/internal/promtext"
)

// Procs is l7d's GOMAXPROCS sizing (internal/autoprocs) as its metrics show it: the
// Ps at the time of a scrape and the changes so far. In a report's JSON it is two
// fields, l7d_gomaxprocs_end and l7d_gomaxprocs_changes.
type Procs struct {
	N       float64 `json:"l7d_gomaxprocs_end"`
	Changes float64 `json:"l7d_gomaxprocs_changes"`
}

// ProcsOf reads Procs from a scrape of l7d's metrics.
func ProcsOf(ss promtext.Samples) Procs {
	return Procs{
		N:       ss.Sum("tiergate_runtime_gomaxprocs"),
		Changes: ss.Sum("tiergate_runtime_gomaxprocs_changes_total"), // summed over directions
	}
}

// Since is p for a row that began when o was scraped: the Ps at its end and the
// changes during it.
func (p Procs) Since(o Procs) Procs { return Procs{N: p.N, Changes: p.Changes - o.Changes} }

// Note is ", N Ps at the end (K changes)" for a report line; "" for nil.
func (p *Procs) Note() string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf(", %.0f Ps at the end (%.0f changes)", p.N, p.Changes)
}
