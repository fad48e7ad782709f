package main

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// The targets.
const (
	targetPushS        = 20.0   // push_10m_to_applied_s ≤
	targetDeltaP99Ms   = 1000.0 // delta_10k_p99_ms ≤
	targetStoreMiB     = 64.0   // store_mib_10m ≤
	targetL4BlackRatio = 0.9    // l4_mpps_with_1m_blacklist_ratio ≥
)

// summary is the JSON last line. A figure not measured is null.
type summary struct {
	PushToAppliedS *float64 `json:"push_10m_to_applied_s"`
	DeltaP50Ms     *float64 `json:"delta_10k_p50_ms"`
	DeltaP99Ms     *float64 `json:"delta_10k_p99_ms"`
	StoreMiB       *float64 `json:"store_mib_10m"`
	L4Ratio        *float64 `json:"l4_mpps_with_1m_blacklist_ratio"`

	// The push in parts: answered, stored (its version known), the two l7d, and
	// the first and last simulated node to apply it.
	PushAnsweredS    *float64  `json:"push_answered_s"`
	PushStoredS      *float64  `json:"push_stored_s"`
	PushL7AppliedS   []float64 `json:"push_l7d_applied_s,omitempty"`
	PushAgentsFirstS *float64  `json:"push_agents_first_applied_s"`
	PushAgentsLastS  *float64  `json:"push_agents_last_applied_s"`
	// PushCPUS is the CPU time, in seconds, of controld, each l7d and the
	// benchmark's process (the simulated nodes) during the push, in that order.
	PushCPUS []float64 `json:"push_cpu_s,omitempty"`
	// The deltas as the two l7d alone applied them.
	DeltaL7P50Ms *float64 `json:"delta_10k_l7d_p50_ms"`
	DeltaL7P99Ms *float64 `json:"delta_10k_l7d_p99_ms"`
	// The store: the database file's growth beside the space in use, and the
	// list's chunks.
	StoreFileMiB *float64 `json:"store_file_mib_10m"`
	Chunks       int      `json:"chunks_10m"`
	ChunkMiB     *float64 `json:"chunk_mib_10m"`
	ListMiB      float64  `json:"list_binary_mib"`

	Entries int `json:"entries"`
	// Agents is the simulated nodes run: AgentsAsked (-agents) or as many as
	// fitted in memory (AgentsNote says why).
	AgentsAsked  int    `json:"agents_asked"`
	Agents       int    `json:"agents"`
	AgentsNote   string `json:"agents_note,omitempty"`
	L7d          int    `json:"l7d"`
	Deltas       int    `json:"deltas"`
	DeltaEntries int    `json:"delta_entries"`
	CPUs         int    `json:"cpus"`
	// RSSPeakMiB is the benchmark process's peak resident memory (the simulated
	// nodes and the pushed list).
	RSSPeakMiB float64 `json:"rss_peak_mib"`
	L4Source   string  `json:"l4_source,omitempty"`

	Targets map[string]*bool `json:"targets_met"`
}

func ptr(v float64) *float64 { return &v }

func secs(d time.Duration) *float64 {
	return ptr(float64(d.Round(time.Millisecond)) / float64(time.Second))
}
func msOf(d time.Duration) *float64 {
	return ptr(float64(d.Round(100*time.Microsecond)) / float64(time.Millisecond))
}

func atMost(v *float64, limit float64) *bool {
	if v == nil {
		return nil
	}
	ok := *v <= limit
	return &ok
}

func atLeast(v *float64, limit float64) *bool {
	if v == nil {
		return nil
	}
	ok := *v >= limit
	return &ok
}

func fmtOr(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

func met(b *bool) string {
	switch {
	case b == nil:
		return "not measured"
	case *b:
		return "met"
	}
	return "NOT met"
}

// write prints the table and the JSON line.
func (r *report) write(w io.Writer) {
	o := r.opts
	s := summary{Entries: o.entries, AgentsAsked: o.agents, Agents: r.agentsRun, AgentsNote: r.agentFitNote, Deltas: o.deltas, DeltaEntries: o.deltaEntries, CPUs: runtime.NumCPU(), RSSPeakMiB: r.peakRSSMiB,
		L4Ratio: r.l4Ratio, L4Source: r.l4Source, ListMiB: float64(r.listBytes) / (1 << 20), L7d: len(r.l7Applied)}
	if r.lastApplied > 0 {
		s.PushToAppliedS = secs(r.lastApplied)
		s.PushAnsweredS, s.PushStoredS = secs(r.answered), secs(r.stored)
		for _, d := range r.l7Applied {
			s.PushL7AppliedS = append(s.PushL7AppliedS, *secs(d))
		}
		for _, d := range r.pushCPU {
			s.PushCPUS = append(s.PushCPUS, *secs(d))
		}
		if r.agentsRun > 0 {
			s.PushAgentsFirstS, s.PushAgentsLastS = secs(r.agentsFirst), secs(r.agentsLast)
		}
		s.StoreMiB, s.StoreFileMiB = ptr(r.storeInUseMiB), ptr(r.storeFileMiB)
		s.Chunks, s.ChunkMiB = r.chunks, ptr(float64(r.chunkBytes)/(1<<20))
	}
	if len(r.deltaLat) > 0 {
		s.DeltaP50Ms, s.DeltaP99Ms = msOf(r.deltaLat.Percentile(50)), msOf(r.deltaLat.Percentile(99))
		s.DeltaL7P50Ms, s.DeltaL7P99Ms = msOf(r.deltaL7Lat.Percentile(50)), msOf(r.deltaL7Lat.Percentile(99))
	}
	s.Targets = map[string]*bool{
		"push_10m_to_applied_s":           atMost(s.PushToAppliedS, targetPushS),
		"delta_10k_p99_ms":                atMost(s.DeltaP99Ms, targetDeltaP99Ms),
		"store_mib_10m":                   atMost(s.StoreMiB, targetStoreMiB),
		"l4_mpps_with_1m_blacklist_ratio": atLeast(s.L4Ratio, targetL4BlackRatio),
	}

	fmt.Fprintf(w, "bench-blacklist: %d-entry IPv4 list (%.1f MiB binary) pushed through controld to %d l7d and %d simulated nodes in this process, on %d CPUs\n",
		o.entries, s.ListMiB, s.L7d, r.agentsRun, s.CPUs)
	if r.agentFitNote != "" {
		fmt.Fprintf(w, "simulated nodes: %s\n", r.agentFitNote)
	}
	t := benchkit.Table{Header: []string{"figure", "value", "target", "", "measured by"}}
	t.Row("push_10m_to_applied_s", fmtOr(s.PushToAppliedS, "%.2f s"), fmt.Sprintf("≤ %.0f s", targetPushS), met(s.Targets["push_10m_to_applied_s"]),
		"PUT sent → last node (l7d or simulated) enforcing its version")
	t.Row("  answered / stored", fmtOr(s.PushAnsweredS, "%.2f s")+" / "+fmtOr(s.PushStoredS, "%.2f s"), "", "", "PUT's 202; the operation's version known")
	for i, d := range s.PushL7AppliedS {
		t.Row(fmt.Sprintf("  l7d %d applied", i+1), fmt.Sprintf("%.2f s", d), "", "", "its status (GET /v1/blacklists/global, polled every 20ms)")
	}
	t.Row("  simulated first / last", fmtOr(s.PushAgentsFirstS, "%.2f s")+" / "+fmtOr(s.PushAgentsLastS, "%.2f s"), "", "",
		fmt.Sprintf("blsync.Follower's Changed, %d in this process verifying only (peak RSS %.0f MiB)", r.agentsRun, r.peakRSSMiB))
	if n := len(s.PushCPUS); n >= 2 {
		var l7 []string
		for _, v := range s.PushCPUS[1 : n-1] {
			l7 = append(l7, fmt.Sprintf("%.1f", v))
		}
		t.Row("  CPU: controld / l7d / simulated", fmt.Sprintf("%.1f / %s / %.1f s", s.PushCPUS[0], strings.Join(l7, ", "), s.PushCPUS[n-1]), "", "",
			"/proc/<pid>/stat from the push sent to the last node applying it")
	}
	t.Row("delta_10k_p99_ms", fmtOr(s.DeltaP99Ms, "%.0f ms"), fmt.Sprintf("≤ %.0f ms", targetDeltaP99Ms), met(s.Targets["delta_10k_p99_ms"]),
		fmt.Sprintf("POST …/delta sent → last node enforcing it, %d deltas", len(r.deltaLat)))
	t.Row("  p50", fmtOr(s.DeltaP50Ms, "%.0f ms"), "", "", "")
	t.Row("  the l7d alone p50 / p99", fmtOr(s.DeltaL7P50Ms, "%.0f ms")+" / "+fmtOr(s.DeltaL7P99Ms, "%.0f ms"), "", "", "")
	t.Row("store_mib_10m", fmtOr(s.StoreMiB, "%.1f MiB"), fmt.Sprintf("≤ %.0f MiB", targetStoreMiB), met(s.Targets["store_mib_10m"]),
		"embedded etcd's db in use after the push − before (Status, 2s after)")
	t.Row("  db file growth; chunks", fmtOr(s.StoreFileMiB, "%.1f MiB")+fmt.Sprintf("; %d, %s", s.Chunks, fmtOr(s.ChunkMiB, "%.1f MiB")), "", "", "")
	t.Row("l4_mpps_with_1m_blacklist_ratio", fmtOr(s.L4Ratio, "%.3f ×"), fmt.Sprintf("≥ %.1f", targetL4BlackRatio), met(s.Targets["l4_mpps_with_1m_blacklist_ratio"]),
		r.l4Source+fmt.Sprintf(" (%s, %v)", o.l4Args, r.l4Duration.Round(time.Second)))
	t.Fprint(w)
	fmt.Fprintf(w, "cluster of controld, 2 keyserverd and 2 l7d up in %v\n", r.clusterStartup.Round(time.Millisecond))
	benchkit.WriteReportEnd(w, r.failures, s)
}
