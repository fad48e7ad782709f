package tgctl

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// topDashboard is what tgctl top reads of GET /v1/ui/dashboard (control/ui).
type topDashboard struct {
	Source          string  `json:"source"`
	IntervalSeconds float64 `json:"interval_seconds"`
	Panels          []struct {
		ID     string `json:"id"`
		Series []struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
			Values []*float64        `json:"values"`
		} `json:"series"`
	} `json:"panels"`
	Targets []struct {
		Node  string `json:"node"`
		Role  string `json:"role"`
		Up    bool   `json:"up"`
		Lost  bool   `json:"lost"`
		Error string `json:"error"`
	} `json:"targets"`
}

// TopFigures are the handshake figures tgctl top shows, each the latest of the
// dashboard's series (0 when there is none yet).
type TopFigures struct {
	Time   time.Time `json:"time"`
	Source string    `json:"source"`
	// Full and Resumed are the cluster's successful handshakes per second, over
	// TCP and QUIC together.
	Full    float64 `json:"full_per_second"`
	Resumed float64 `json:"resumed_per_second"`
	// Transports are the same by transport (tcp, quic), busiest first.
	Transports []TopRow `json:"transports"`
	// Failures are the failed handshakes per second by reason.
	Failures map[string]float64 `json:"failures_per_second"`
	// LatencyP50 and LatencyP99 are the handshakes' latency in seconds (a
	// transport's p99 is in Transports), and KeyserverP50/P99 the keyserver
	// operations'.
	LatencyP50   float64 `json:"latency_p50_seconds"`
	LatencyP99   float64 `json:"latency_p99_seconds"`
	KeyserverP50 float64 `json:"keyserver_p50_seconds"`
	KeyserverP99 float64 `json:"keyserver_p99_seconds"`
	// Nodes are the figures of each node scraped, Listeners of each listener.
	Nodes     []TopRow `json:"nodes"`
	Listeners []TopRow `json:"listeners"`
}

// TopRow is one node's, listener's or transport's handshakes per second.
type TopRow struct {
	Name    string  `json:"name"`
	Full    float64 `json:"full_per_second"`
	Resumed float64 `json:"resumed_per_second"`
	// QUIC is how many of Full and Resumed were over QUIC (a node's, a
	// listener's); LatencyP99 is a transport's p99 handshake latency in seconds.
	QUIC       float64 `json:"quic_per_second,omitempty"`
	LatencyP99 float64 `json:"latency_p99_seconds,omitempty"`
	// State is a node's: up, down (its scrape failed: Error) or lost.
	State string `json:"state,omitempty"`
	Error string `json:"error,omitempty"`
}

func latest(vs []*float64) float64 {
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i] != nil {
			return *vs[i]
		}
	}
	return 0
}

// figures reduces a dashboard to the handshake figures.
func figures(d *topDashboard, now time.Time) TopFigures {
	f := TopFigures{Time: now.UTC().Truncate(time.Second), Source: d.Source, Failures: map[string]float64{}, Transports: []TopRow{}, Nodes: []TopRow{}, Listeners: []TopRow{}}
	nodes, listeners, transports := map[string]*TopRow{}, map[string]*TopRow{}, map[string]*TopRow{}
	row := func(m map[string]*TopRow, name string) *TopRow {
		r := m[name]
		if r == nil {
			r = &TopRow{Name: name}
			m[name] = r
		}
		return r
	}
	add := func(m map[string]*TopRow, name string, labels map[string]string, v float64) {
		r := row(m, name)
		if labels["resumed"] == "true" {
			r.Resumed += v
		} else {
			r.Full += v
		}
		if labels["transport"] == "quic" {
			r.QUIC += v
		}
	}
	for _, p := range d.Panels {
		for _, s := range p.Series {
			v := latest(s.Values)
			switch p.ID {
			case "handshakes":
				if s.Labels["resumed"] == "true" {
					f.Resumed += v
				} else {
					f.Full += v
				}
				if tr := s.Labels["transport"]; tr != "" {
					add(transports, tr, s.Labels, v)
				}
			case "handshakes_node":
				add(nodes, s.Labels["node"], s.Labels, v)
			case "handshakes_listener":
				add(listeners, s.Labels["listener"], s.Labels, v)
			case "handshake_failures":
				f.Failures[s.Labels["result"]] += v
			case "handshake_latency", "keyserver_latency":
				p50, p99 := &f.LatencyP50, &f.LatencyP99
				if p.ID == "keyserver_latency" {
					p50, p99 = &f.KeyserverP50, &f.KeyserverP99
				}
				if tr := s.Labels["transport"]; tr != "" && p.ID == "handshake_latency" {
					row(transports, tr).LatencyP99 = v // the only quantile by transport
				} else if s.Name == "p50" {
					*p50 = v
				} else if s.Name == "p99" {
					*p99 = v
				}
			}
		}
	}
	for _, t := range d.Targets {
		r := nodes[t.Node]
		if r == nil {
			r = &TopRow{Name: t.Node}
			nodes[t.Node] = r
		}
		switch {
		case t.Lost:
			r.State = "lost"
		case t.Up:
			r.State = "up"
		default:
			r.State, r.Error = "down", t.Error
		}
	}
	for _, m := range []struct {
		from map[string]*TopRow
		to   *[]TopRow
	}{{nodes, &f.Nodes}, {listeners, &f.Listeners}, {transports, &f.Transports}} {
		for _, r := range m.from {
			*m.to = append(*m.to, *r)
		}
		slices.SortFunc(*m.to, func(a, b TopRow) int {
			if c := cmpFloat(b.Full+b.Resumed, a.Full+a.Resumed); c != 0 {
				return c
			}
			if a.Name < b.Name {
				return -1
			}
			return 1
		})
	}
	return f
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func rate(v float64) string {
	if v >= 100 {
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func ms(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v*1000, 'f', 2, 64) + "ms"
}

// topTable writes f as the terminal shows it.
func topTable(t *tabwriter.Writer, f TopFigures) {
	fmt.Fprintf(t, "%s  handshakes/s: %s full, %s resumed; latency p50 %s p99 %s; keyserver p50 %s p99 %s (from %s)\n",
		f.Time.Format(time.TimeOnly), rate(f.Full), rate(f.Resumed), ms(f.LatencyP50), ms(f.LatencyP99), ms(f.KeyserverP50), ms(f.KeyserverP99), f.Source)
	if len(f.Failures) > 0 {
		fmt.Fprint(t, "failures/s:")
		for _, reason := range sortedMapKeys(f.Failures) {
			fmt.Fprintf(t, " %s %s", reason, rate(f.Failures[reason]))
		}
		fmt.Fprintln(t)
	}
	fmt.Fprintln(t)
	if len(f.Transports) > 0 {
		row(t, "TRANSPORT", "FULL/S", "RESUMED/S", "P99")
		for _, r := range f.Transports {
			row(t, r.Name, rate(r.Full), rate(r.Resumed), ms(r.LatencyP99))
		}
		fmt.Fprintln(t)
	}
	row(t, "NODE", "STATE", "FULL/S", "RESUMED/S", "QUIC/S", "ERROR")
	for _, r := range f.Nodes {
		row(t, r.Name, orDash(r.State), rate(r.Full), rate(r.Resumed), rate(r.QUIC), orDash(r.Error))
	}
	if len(f.Listeners) > 0 {
		fmt.Fprintln(t)
		row(t, "LISTENER", "FULL/S", "RESUMED/S", "QUIC/S")
		for _, r := range f.Listeners {
			row(t, r.Name, rate(r.Full), rate(r.Resumed), rate(r.QUIC))
		}
	}
}

func sortedMapKeys(m map[string]float64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (o *options) topCommand() *cobra.Command {
	var once bool
	var interval time.Duration
	var count int
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Handshakes per second, live: the cluster's, each node's and listener's, failures and latency",
		Long: `The handshake figures of controld's /ui dashboard, live in the terminal: full and
resumed handshakes per second of the cluster, over TCP and over QUIC (with each
transport's p99 latency), of each node and of each listener (with how many of
them were over QUIC), failures per second by reason, the handshakes' and the keyserver operations'
latency p50 and p99, and each node's state (up, down: its metrics could not be
read, lost). Refreshed every --interval (1s at least) until interrupted, or
--count times; --once prints them once (-o json or yaml for a script).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < time.Second {
				return usagef("--interval %s: at least 1s", interval)
			}
			if once {
				count = 1
			}
			out := cmd.OutOrStdout()
			tty := isTerminal(out)
			for i := 0; count <= 0 || i < count; i++ {
				if i > 0 {
					select {
					case <-cmd.Context().Done():
						return nil
					case <-time.After(interval):
					}
				}
				var d topDashboard
				if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/ui/dashboard?window=60", what: "reading the dashboard"}, &d); err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				if tty {
					io.WriteString(out, "\x1b[H\x1b[2J")
				} else if i > 0 {
					io.WriteString(out, "\n")
				}
				f := figures(&d, time.Now())
				if err := o.printer(cmd).data(f, func(t *tabwriter.Writer) { topTable(t, f) }); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&once, "once", false, "print the figures once and exit")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "time between refreshes (at least 1s)")
	cmd.Flags().IntVar(&count, "count", 0, "refreshes before exiting (0: until interrupted)")
	return cmd
}
