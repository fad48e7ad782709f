package benchkit

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ScanMetrics reads the Prometheus text format from r (at most 16 MiB) and calls
// sample for every sample line: the metric name, its label set without braces ("" if
// none) and its value. Comments and blank lines are skipped; a value that does not
// parse is an error naming the line.
func ScanMetrics(r io.Reader, sample func(name, labels string, value float64)) error {
	sc := bufio.NewScanner(io.LimitReader(r, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, rest := line, "", ""
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return fmt.Errorf("metrics line %q: no end to the label set", line)
			}
			name, labels, rest = line[:i], line[i+1:j], line[j+1:]
		} else if n, v, found := strings.Cut(line, " "); found {
			name, rest = n, v
		}
		// A sample may end with a timestamp after its value.
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return fmt.Errorf("metrics line %q: %w", line, err)
		}
		sample(name, labels, v)
	}
	return sc.Err()
}

// Procs is l7d's GOMAXPROCS sizing (internal/autoprocs) as its metrics show it: the
// Ps at the time of a scrape and the changes so far. In a report's JSON it is two
// fields, l7d_gomaxprocs_end and l7d_gomaxprocs_changes.
type Procs struct {
	N       float64 `json:"l7d_gomaxprocs_end"`
	Changes float64 `json:"l7d_gomaxprocs_changes"`
}

// Scan takes one sample from ScanMetrics and reports whether it was one of Procs'.
func (p *Procs) Scan(name string, v float64) bool {
	switch name {
	case "tiergate_runtime_gomaxprocs":
		p.N = v
	case "tiergate_runtime_gomaxprocs_changes_total":
		p.Changes += v // summed over directions
	default:
		return false
	}
	return true
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
