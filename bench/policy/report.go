package main

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// Targets from the issue. They are reported, never tuned for.
const (
	targetLookup1MNs  = 100.0 // IPv4 lookups in a list of 1M
	targetLookup10MNs = 200.0 // and of 10M
	targetBytesV4     = 8.0   // per IPv4 address
	targetBytesV6     = 24.0  // per IPv6 address
	targetSwap1MMs    = 1000.0
	targetMaxStallUs  = 1000.0
	// An update may add a quarter to the longest lookup the control saw, and 200 µs.
	targetStallVsControl     = 1.25
	targetStallOverControlUs = 200.0
	headlineLookupSize       = 1_000_000
	largeLookupSize          = 10_000_000
)

// summary is the last line of the output. The first ten fields are the headline
// figures the issue asks for; a figure that was not measured is null.
type summary struct {
	BLLookup1MV4  *float64 `json:"bl_lookup_ns_1m_v4"`
	BLLookup10MV4 *float64 `json:"bl_lookup_ns_10m_v4"`
	BLBytesV4     *float64 `json:"bl_bytes_per_entry_v4"`
	BLBytesV6     *float64 `json:"bl_bytes_per_entry_v6"`
	BLSwap1MMs    *float64 `json:"bl_swap_1m_ms"`
	BLMaxStallUs  *float64 `json:"bl_max_stall_us"`
	RouteMatchNs  *float64 `json:"route_match_ns_1k"`
	L7CPUUs       *float64 `json:"l7_cpu_us_per_req"`
	NginxCPUUs    *float64 `json:"nginx_cpu_us_per_req"`
	HAProxyCPUUs  *float64 `json:"haproxy_cpu_us_per_req"`

	Targets map[string]*bool `json:"targets_met"`

	BLLookup1MV6   *float64 `json:"bl_lookup_ns_1m_v6"`
	BLLookup10MV6  *float64 `json:"bl_lookup_ns_10m_v6"`
	BLLookup1MMix  *float64 `json:"bl_lookup_ns_1m_mix"`
	BLLookup10MMix *float64 `json:"bl_lookup_ns_10m_mix"`
	BLHeapBytesV4  *float64 `json:"bl_heap_bytes_per_entry_v4"`
	BLHeapBytesV6  *float64 `json:"bl_heap_bytes_per_entry_v6"`
	BLBinary1MMs   *float64 `json:"bl_swap_1m_binary_ms"`
	BLBuilder1MMs  *float64 `json:"bl_swap_1m_builder_ms"`
	BLDelta10kMs   *float64 `json:"bl_delta_10k_ms"`
	BLDelta10k10M  *float64 `json:"bl_delta_10k_10m_ms"` // on the 10M IPv4 list
	BLSwapStallUs  *float64 `json:"bl_swap_only_max_stall_us"`
	// The longest lookup with no update running, beside a busy goroutine: what the
	// scheduler and the rest of the machine cause on their own.
	BLControlStallUs *float64 `json:"bl_control_max_stall_us"`
	// Per round (-stall-rounds): the longest lookup beside any update of the round and
	// the control's in the same round, and the medians over the rounds, which the
	// stall target compares: a stall an update causes recurs in every round, a pause
	// of the machine lands in one round of either side.
	BLRoundsStallUs       [][2]float64 `json:"bl_rounds_stall_us,omitempty"`
	BLRoundStallUs        *float64     `json:"bl_round_median_stall_us"`
	BLControlRoundStallUs *float64     `json:"bl_control_round_median_stall_us"`

	L7UserUs      *float64 `json:"l7_user_cpu_us_per_req"`
	NginxUserUs   *float64 `json:"nginx_user_cpu_us_per_req"`
	HAProxyUserUs *float64 `json:"haproxy_user_cpu_us_per_req"`
	L7VsNginx     *float64 `json:"nginx_over_l7_cpu"`
	L7VsHAProxy   *float64 `json:"haproxy_over_l7_cpu"`
	L7ReqPerS     *float64 `json:"l7_req_per_s"`
	NginxReqPerS  *float64 `json:"nginx_req_per_s"`
	HAProxyReqPer *float64 `json:"haproxy_req_per_s"`
	// The fields above are of this program's own generator; these of wrk's rows.
	L7CPUUsWrk      *float64 `json:"l7_cpu_us_per_req_wrk"`
	NginxCPUUsWrk   *float64 `json:"nginx_cpu_us_per_req_wrk"`
	HAProxyCPUUsWrk *float64 `json:"haproxy_cpu_us_per_req_wrk"`
	L7VsNginxWrk    *float64 `json:"nginx_over_l7_cpu_wrk"`
	// Server CPU per request by generator and proxy: {"wrk": {"l7d": 40.1, ...}}.
	CPUByGenerator map[string]map[string]float64 `json:"cpu_us_per_req_by_generator"`
	// nginx's CPU per request ÷ l7d's, by generator.
	NginxOverL7ByGenerator map[string]float64 `json:"nginx_over_l7_cpu_by_generator"`
	// The floor (Go net and crypto/tls alone, floor.go): its CPU per request with
	// each generator, and l7d's and nginx's over it.
	FloorCPUUs             *float64           `json:"floor_cpu_us_per_req"`
	FloorCPUUsWrk          *float64           `json:"floor_cpu_us_per_req_wrk"`
	FloorFasthttpCPUUs     *float64           `json:"floor_fasthttp_cpu_us_per_req"`
	FloorFasthttpCPUUsWrk  *float64           `json:"floor_fasthttp_cpu_us_per_req_wrk"`
	L7OverFloorByGenerator map[string]float64 `json:"l7_over_floor_cpu_by_generator,omitempty"`
	NginxOverFloorByGen    map[string]float64 `json:"nginx_over_floor_cpu_by_generator,omitempty"`

	Conns          int     `json:"conns"`
	Rounds         int     `json:"rounds"`
	Workers        int     `json:"proxy_workers"`
	Backend        string  `json:"backend"`
	NginxVersion   string  `json:"nginx_version,omitempty"`
	HAProxyVersion string  `json:"haproxy_version,omitempty"`
	Cores          int     `json:"cores"`
	DurationS      float64 `json:"duration_s"`
	MaxOtherCores  float64 `json:"max_other_processes_cores"`
	Profiled       bool    `json:"profiled_l7d_variant"`

	Failures  []string      `json:"failures"`
	Blacklist []*blSet      `json:"blacklist_sets"`
	Updates   []*blUpdate   `json:"blacklist_updates"`
	Route     *routeResults `json:"route,omitempty"`
	Proxy     []rowSum      `json:"proxy_rows"`
}

// rowSum is one row of the proxy table.
type rowSum struct {
	Server          string   `json:"server"`
	Generator       string   `json:"generator"` // the load generator: bench-policy (this program's) or wrk
	Round           int      `json:"round"`
	ReqPerS         float64  `json:"req_per_s"`
	Requests        int      `json:"requests"`
	P50Ms           float64  `json:"p50_ms"`
	P99Ms           float64  `json:"p99_ms"`
	ServerCPUUs     float64  `json:"server_cpu_us_per_req"`
	ServerUserUs    float64  `json:"server_user_cpu_us_per_req"`
	ServerCores     float64  `json:"server_cores"`
	BackendCPUUs    float64  `json:"backend_cpu_us_per_req"`
	LoadGenCPUUs    float64  `json:"loadgen_cpu_us_per_req"`
	DialsInWindow   int      `json:"conns_opened_in_window"`
	Errors          int      `json:"errors"`
	L7AllocKB       *float64 `json:"l7d_alloc_kb_per_req,omitempty"`
	L7GCPer1000     *float64 `json:"l7d_gc_cycles_per_1000_req,omitempty"`
	*benchkit.Procs          // l7d's Ps at the end of the row and its changes; nil for the others
	OtherCores      float64  `json:"other_processes_cores"`
}

func (b *bench) report() {
	w := b.o.out
	b.header(w)
	s := summary{
		Conns: b.o.conns, Rounds: b.o.rounds, Workers: b.o.workers, Backend: b.o.backend,
		Cores: runtime.NumCPU(), DurationS: b.o.duration.Seconds(), Profiled: b.o.profileDir != "",
		Failures: b.Failures, Targets: map[string]*bool{},
	}
	var maxOther float64
	if b.bl != nil {
		maxOther = max(maxOther, b.blacklistTables(w, &s))
	}
	if b.route != nil {
		maxOther = max(maxOther, b.routeTable(w, &s))
	}
	if b.proxy != nil {
		maxOther = max(maxOther, b.proxyTable(w, &s))
	}
	s.MaxOtherCores = maxOther
	if s.Failures == nil {
		s.Failures = []string{}
	}

	lookupMet := func(v *float64, t float64) *bool { return atMost(v, t) }
	tt := benchkit.Table{Header: []string{"target", "measured", "result"}}
	row := func(key, name string, met *bool, measured string) {
		s.Targets[key] = met
		tt.Row(name, measured, passMiss(met))
	}
	row("bl_lookup_1m_v4", fmt.Sprintf("blacklist lookup, 1M IPv4 addresses ≤ %.0f ns", targetLookup1MNs),
		lookupMet(s.BLLookup1MV4, targetLookup1MNs), numUnit(s.BLLookup1MV4, "%.1f ns"))
	row("bl_lookup_10m_v4", fmt.Sprintf("blacklist lookup, 10M IPv4 addresses ≤ %.0f ns", targetLookup10MNs),
		lookupMet(s.BLLookup10MV4, targetLookup10MNs), numUnit(s.BLLookup10MV4, "%.1f ns"))
	row("bl_bytes_v4", fmt.Sprintf("bytes per IPv4 address ≤ %.0f", targetBytesV4), atMost(s.BLBytesV4, targetBytesV4), numUnit(s.BLBytesV4, "%.2f B"))
	row("bl_bytes_v6", fmt.Sprintf("bytes per IPv6 address ≤ %.0f", targetBytesV6), atMost(s.BLBytesV6, targetBytesV6), numUnit(s.BLBytesV6, "%.2f B"))
	row("bl_swap_1m", fmt.Sprintf("1M entries parsed, built and swapped in ≤ %.0f ms", targetSwap1MMs), atMost(s.BLSwap1MMs, targetSwap1MMs), numUnit(s.BLSwap1MMs, "%.1f ms"))
	row("bl_max_stall", fmt.Sprintf("no lookup stalled over %.0f µs by an update", targetMaxStallUs), atMost(s.BLMaxStallUs, targetMaxStallUs), numUnit(s.BLMaxStallUs, "%.1f µs"))
	stallText, stallMet := "not measured", (*bool)(nil)
	if s.BLRoundStallUs != nil && s.BLControlRoundStallUs != nil {
		limit := targetStallVsControl**s.BLControlRoundStallUs + targetStallOverControlUs
		stallText = fmt.Sprintf("%.1f µs, control %.1f µs: limit %.1f µs (medians of %d rounds' longest)", *s.BLRoundStallUs, *s.BLControlRoundStallUs, limit, len(s.BLRoundsStallUs))
		stallMet = atMost(s.BLRoundStallUs, limit)
	}
	row("bl_stall_vs_control", fmt.Sprintf("longest lookup beside updates ≤ %.2f × the control's + %.0f µs", targetStallVsControl, targetStallOverControlUs), stallMet, stallText)
	cpuText, cpuMet := "not measured", (*bool)(nil)
	if s.L7CPUUs != nil && s.NginxCPUUs != nil {
		cpuText = fmt.Sprintf("l7d %.1f µs, nginx %.1f µs: nginx ÷ l7d = %.2f", *s.L7CPUUs, *s.NginxCPUUs, *s.L7VsNginx)
		cpuMet = atMost(s.L7CPUUs, *s.NginxCPUUs)
	}
	row("l7_cpu_vs_nginx", "l7d CPU per proxied request ≤ nginx's", cpuMet, cpuText)
	cpuText, cpuMet = "not measured", nil
	if s.L7CPUUsWrk != nil && s.NginxCPUUsWrk != nil {
		cpuText = fmt.Sprintf("l7d %.1f µs, nginx %.1f µs: nginx ÷ l7d = %.2f", *s.L7CPUUsWrk, *s.NginxCPUUsWrk, *s.L7VsNginxWrk)
		cpuMet = atMost(s.L7CPUUsWrk, *s.NginxCPUUsWrk)
	}
	row("l7_cpu_vs_nginx_wrk", "the same, driven by wrk", cpuMet, cpuText)
	fmt.Fprintln(w)
	tt.Fprint(w)
	fmt.Fprintln(w)
	if maxOther >= 0.2 {
		fmt.Fprintf(w, "warning: other processes used up to %.2f of the %d cores during a measurement: the machine was shared, figures are noisy\n",
			maxOther, runtime.NumCPU())
	}
	benchkit.WriteReportEnd(w, b.Failures, s)
}

// header describes the set-up.
func (b *bench) header(w io.Writer) {
	o := b.o
	fmt.Fprintf(w, "\npolicy benchmark: blacklists, routing, and HTTPS keep-alive proxying against nginx and haproxy\n")
	fmt.Fprintf(w, "machine:   %d CPUs, GOMAXPROCS %d, %s/%s, %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version())
	if b.bl != nil {
		fmt.Fprintf(w, "blacklist: in this process, List.Contains over arrays of %d probe addresses (hits drawn from the entries, misses at\n", 1<<probeBits)
		fmt.Fprintf(w, "           random and checked; \"mixed\" = half of each, shuffled), %d lookups per figure, fixed seed. Entries: random\n", o.lookups)
		fmt.Fprintf(w, "           addresses (IPv6 in 2000::/3); mix = %.0f%% IPv4 / %.0f%% IPv6 addresses and %dk CIDRs (IPv4 /20-/30, IPv6 /48, /56, /64).\n",
			100*mixV4Share, 100*(1-mixV4Share), mixCIDRs/1000)
		fmt.Fprintf(w, "           B/entry = Set.Bytes ÷ Set.Len; heap = the Go heap's growth (after GC) ÷ Set.Len; build = Builder.Add × n + Build\n")
	}
	if b.route != nil {
		fmt.Fprintf(w, "routing:   policy/route, %d routes in %d virtual hosts (40 exact, 9 wildcard, default) parsed from YAML and compiled;\n", b.route.Routes, b.route.VHosts)
		fmt.Fprintf(w, "           Table.Match over a mix of %d requests (each checked against the route it must match), %d matches\n", len(b.route.Kinds), o.matches)
	}
	if p := b.proxy; p != nil {
		fmt.Fprintf(w, "proxies:   TLS 1.3 (%s, X25519) with one ECDSA P-256 certificate; HTTP/1.1 keep-alive; GET %s → %d-byte answer\n", tlsSuiteName, requestPath, bodySize)
		var names []string
		for _, s := range p.servers {
			names = append(names, withVersion(s))
		}
		fmt.Fprintf(w, "           %s; l7d: bin/l7d, backends/pool form, disable_http3; nginx: upstream keepalive 64, proxy_http_version 1.1;\n", strings.Join(names, "; "))
		fmt.Fprintf(w, "           haproxy: -db, nbthread %d, http-reuse always; no access logs\n", o.workers)
		if p.backend != nil {
			fmt.Fprintf(w, "backend:   %s on 127.0.0.1, shared by all; its CPU is shown, not counted\n", withVersion(p.backend))
		}
		fmt.Fprintf(w, "load:      %d keep-alive connections from Go crypto/tls in this process, each a closed loop (request, read and check the\n", o.conns)
		fmt.Fprintf(w, "           whole answer); %v warm-up (connections open in it), then %v; %d round(s), in alternating order\n", o.warmup, o.duration, o.rounds)
		if slices.Contains(o.generators, genWrk) {
			fmt.Fprintf(w, "           and by wrk (OpenSSL; -t %d -c %d, keep-alive, one request in flight per connection; a %v run not counted,\n", o.wrkThreads, o.conns, o.warmup)
			fmt.Fprintf(w, "           then %v measured, its connections' handshakes included): the generator column says which\n", o.duration)
		}
		fmt.Fprintf(w, "CPU:       user + sys from /proc/PID/stat (1/100 s ticks), every thread; nginx = master + workers; ÷ requests in the window\n")
	}
	if o.quietWait > 0 {
		fmt.Fprintf(w, "shared:    before each measurement, waited up to %v for other processes to use < %.2f cores; others' cores = the rest\n", o.quietWait, o.quietCores)
		fmt.Fprintf(w, "           of the machine during it (/proc/stat)\n")
	}
	fmt.Fprintln(w)
}

// withVersion is an endpoint's label with its version after the program's name:
// "nginx 1.22.1, 2 workers".
func withVersion(e *endpoint) string {
	if e.version == "" {
		return e.label
	}
	name, rest, _ := strings.Cut(e.label, ",")
	if rest != "" {
		rest = "," + rest
	}
	return name + " " + e.version + rest
}

func kindLabel(kind string) string {
	switch kind {
	case kindV4:
		return "IPv4 addresses"
	case kindV6:
		return "IPv6 addresses"
	}
	return fmt.Sprintf("mix with %dk CIDRs", mixCIDRs/1000)
}

// blacklistTables writes the lists and updates and fills their figures in s. It
// returns the most CPU other processes used during a measurement.
func (b *bench) blacklistTables(w io.Writer, s *summary) float64 {
	r := b.bl
	var maxOther float64
	t := benchkit.Table{Header: []string{"blacklist", "size", "entries", "ranges", "B/entry", "heap B/entry", "build ms",
		"hit ns", "miss ns", "mixed ns", "others' cores"}}
	for _, st := range r.sets {
		t.Row(kindLabel(st.Kind), sizeName(st.Size), st.Entries, st.V4Range+st.V6Range, fmt.Sprintf("%.2f", st.BytesPerEntry),
			fmt.Sprintf("%.2f", st.HeapPerEntry), fmt.Sprintf("%.0f", st.BuildMs), fmt.Sprintf("%.1f", st.HitNs),
			fmt.Sprintf("%.1f", st.MissNs), fmt.Sprintf("%.1f", st.MixNs), fmt.Sprintf("%.2f", st.OtherCores))
		maxOther = max(maxOther, st.OtherCores)
	}
	t.Fprint(w)
	fmt.Fprintln(w)

	get := func(kind string, size int, f func(*blSet) float64) *float64 {
		if st := r.set(kind, size); st != nil {
			return ptr(f(st))
		}
		return nil
	}
	mixed := func(st *blSet) float64 { return st.MixNs }
	s.BLLookup1MV4, s.BLLookup10MV4 = get(kindV4, headlineLookupSize, mixed), get(kindV4, largeLookupSize, mixed)
	s.BLLookup1MV6, s.BLLookup10MV6 = get(kindV6, headlineLookupSize, mixed), get(kindV6, largeLookupSize, mixed)
	s.BLLookup1MMix, s.BLLookup10MMix = get(kindMix, headlineLookupSize, mixed), get(kindMix, largeLookupSize, mixed)
	// Bytes per entry: the worst of the sizes measured.
	for _, st := range r.sets {
		switch st.Kind {
		case kindV4:
			s.BLBytesV4, s.BLHeapBytesV4 = maxPtr(s.BLBytesV4, st.BytesPerEntry), maxPtr(s.BLHeapBytesV4, st.HeapPerEntry)
		case kindV6:
			s.BLBytesV6, s.BLHeapBytesV6 = maxPtr(s.BLBytesV6, st.BytesPerEntry), maxPtr(s.BLHeapBytesV6, st.HeapPerEntry)
		}
	}
	s.Blacklist = r.sets

	if len(r.updates) == 0 {
		return maxOther
	}
	ut := benchkit.Table{Header: []string{"update of the 1M IPv4 list (unless said)", "median ms", "runs ms", "longest lookup beside it µs", "lookups > 1 ms", "collections"}}
	gcs := func(u *blUpdate) string {
		if u.GCs == nil {
			return "-"
		}
		return fmt.Sprint(*u.GCs)
	}
	for _, u := range r.updates {
		runs := make([]string, len(u.RunsMs))
		for i, v := range u.RunsMs {
			runs[i] = fmt.Sprintf("%.1f", v)
		}
		stall, over := "-", "-"
		if u.StallUs != nil {
			stall = fmt.Sprintf("%.1f", *u.StallUs)
			over = fmt.Sprintf("%d of %d", *u.Over1ms, *u.Probes)
			s.BLMaxStallUs = maxPtr(s.BLMaxStallUs, *u.StallUs)
		}
		ut.Row(u.Name, fmt.Sprintf("%.1f", u.MedianMs), strings.Join(runs, " "), stall, over, gcs(u))
	}
	if r.swapStallUs != nil {
		ut.Row("swap only: blacklist.MeasureSwapStall", "-", "-", fmt.Sprintf("%.1f", *r.swapStallUs), "-", "-")
		s.BLMaxStallUs = maxPtr(s.BLMaxStallUs, *r.swapStallUs)
		s.BLSwapStallUs = r.swapStallUs
	}
	if c := r.control; c != nil {
		ut.Separator()
		ut.Row(c.Name, "-", fmt.Sprintf("%.1f", c.MedianMs), fmt.Sprintf("%.1f", *c.StallUs), fmt.Sprintf("%d of %d", *c.Over1ms, *c.Probes), gcs(c))
		s.BLControlStallUs = c.StallUs
	}
	ut.Fprint(w)
	if rounds := r.stallRounds(); len(rounds) > 0 {
		rt := benchkit.Table{Header: []string{"round", "longest lookup beside the updates µs", "control µs", "limit µs", "within", "beside: which update, its lookups' window", "control's window"}}
		var upd, ctl []float64
		wins := r.stallRoundWindows()
		for i, v := range rounds {
			limit := targetStallVsControl*v[1] + targetStallOverControlUs
			which, cw := "-", "-"
			if i < len(wins) {
				which, cw = wins[i].update+": "+wins[i].upd.String(), wins[i].ctl.String()
			}
			rt.Row(fmt.Sprint(i+1), fmt.Sprintf("%.1f", v[0]), fmt.Sprintf("%.1f", v[1]), fmt.Sprintf("%.1f", limit), fmt.Sprint(v[0] <= limit), which, cw)
			upd, ctl = append(upd, v[0]), append(ctl, v[1])
		}
		rt.Row("median", fmt.Sprintf("%.1f", median(upd)), fmt.Sprintf("%.1f", median(ctl)), fmt.Sprintf("%.1f", targetStallVsControl*median(ctl)+targetStallOverControlUs), fmt.Sprint(median(upd) <= targetStallVsControl*median(ctl)+targetStallOverControlUs), "", "")
		rt.Fprint(w)
		fmt.Fprintln(w, "window: where the time of the lookups (256 at a time) holding a round's longest went, by the lookup thread's /proc/thread-self/schedstat:\n"+
			"on a CPU as the guest sees it (milliseconds of it are the virtual CPU not running: the hypervisor's steal), in the guest's run queue,\n"+
			"or off any CPU (Go's scheduler had parked the thread: its goroutine waited for a P)")
		s.BLRoundsStallUs = rounds
		s.BLRoundStallUs, s.BLControlRoundStallUs = ptr(median(upd)), ptr(median(ctl))
	}
	fmt.Fprintf(w, "uploads of the 1M list: text %.1f MB, binary %.1f MB (%.2f B/entry); others used %.2f cores during the updates\n",
		float64(r.textBytes)/1e6, float64(r.binaryBytes)/1e6, float64(r.binaryBytes)/float64(updateSize), r.updateOther)
	fmt.Fprintln(w)
	maxOther = max(maxOther, r.updateOther)
	median := func(name string) *float64 {
		if u := r.update(name); u != nil {
			return ptr(u.MedianMs)
		}
		return nil
	}
	s.BLSwap1MMs, s.BLBinary1MMs, s.BLBuilder1MMs, s.BLDelta10kMs = median(updText), median(updBinary), median(updBuilder), median(updDelta)
	s.BLDelta10k10M = median(updDelta10M)
	s.Updates = r.updates
	return maxOther
}

func (b *bench) routeTable(w io.Writer, s *summary) float64 {
	r := b.route
	t := benchkit.Table{Header: []string{"request (1,000 routes)", "route matched", "ns/match"}}
	for _, k := range r.Kinds {
		t.Row(k.Name, k.Route, fmt.Sprintf("%.1f", k.NsMatch))
	}
	t.Separator()
	t.Row("mix of the above", "-", fmt.Sprintf("%.1f", r.MixNs))
	t.Fprint(w)
	fmt.Fprintf(w, "parse + compile of the %d routes: %.1f ms; others used %.2f cores\n\n", r.Routes, r.CompileMs, r.OtherCores)
	s.RouteMatchNs = ptr(r.MixNs)
	s.Route = r
	return r.OtherCores
}

// serverTotals is a server's figures over all its rounds.
type serverTotals struct {
	cpuUs, userUs, rate float64 // CPU per request (total ÷ total requests), its user part; mean rate
}

func (p *proxyResults) totals(id, gen string) *serverTotals {
	var cpu, user time.Duration
	var ops, n int
	var rateSum float64
	for _, r := range p.rows {
		if r.srv.id != id || r.gen != gen || r.res.CPUErr != nil || r.res.Ops == 0 {
			continue
		}
		cpu += r.res.CPU[clockServer]
		user += r.res.CPU[clockUser]
		ops += r.res.Ops
		rateSum += r.res.Rate()
		n++
	}
	if ops == 0 {
		return nil
	}
	per := func(d time.Duration) float64 { return round(float64(d)/float64(ops)/float64(time.Microsecond), 2) }
	return &serverTotals{cpuUs: per(cpu), userUs: per(user), rate: round(rateSum/float64(n), 1)}
}

func (b *bench) proxyTable(w io.Writer, s *summary) float64 {
	p := b.proxy
	t := benchkit.Table{Header: []string{"proxy", "generator", "round", "req/s", "p50 ms", "p99 ms", "server CPU µs/req", "of which user", "server cores",
		"backend µs/req", "load gen µs/req", "conns opened in window", "errors", "others' cores"}}
	var maxOther float64
	for _, r := range p.rows {
		rs := rowSum{
			Server: r.srv.id, Generator: r.gen, Round: r.round + 1, ReqPerS: round(r.res.Rate(), 1), Requests: r.res.Ops,
			P50Ms: round(ms(r.p50), 3), P99Ms: round(ms(r.p99), 3),
			ServerCPUUs: us(r.cpuPerReq(clockServer)), ServerUserUs: us(r.cpuPerReq(clockUser)), ServerCores: round(r.cores(clockServer), 2),
			BackendCPUUs: us(r.cpuPerReq(clockBackend)), LoadGenCPUUs: us(r.cpuPerReq(clockSelf)),
			DialsInWindow: r.dialsInWindow, Errors: r.res.Errors, OtherCores: round(r.otherCores(), 2),
		}
		if kb, gc, ok := r.l7.perRequest(); ok {
			rs.L7AllocKB, rs.L7GCPer1000 = ptr(round(kb, 2)), ptr(round(gc, 3))
			if p := r.l7.procs; p.N > 0 {
				rs.Procs = &p
			}
		}
		s.Proxy = append(s.Proxy, rs)
		maxOther = max(maxOther, rs.OtherCores)
		dials := fmt.Sprintf("%d of %d", rs.DialsInWindow, r.dials)
		if r.gen == genWrk {
			dials = "-"
		}
		t.Row(r.srv.label, r.gen, rs.Round, fmt.Sprintf("%.0f", rs.ReqPerS), fmt.Sprintf("%.3f", rs.P50Ms), fmt.Sprintf("%.3f", rs.P99Ms),
			fmt.Sprintf("%.1f", rs.ServerCPUUs), fmt.Sprintf("%.1f", rs.ServerUserUs), fmt.Sprintf("%.2f", rs.ServerCores), fmt.Sprintf("%.1f", rs.BackendCPUUs),
			fmt.Sprintf("%.1f", rs.LoadGenCPUUs), dials, rs.Errors, fmt.Sprintf("%.2f", rs.OtherCores))
	}
	t.Fprint(w)

	for _, e := range p.servers {
		switch e.id {
		case srvNginx:
			s.NginxVersion = e.version
		case srvHAProxy:
			s.HAProxyVersion = e.version
		}
	}
	var parts []string
	for _, c := range []struct {
		id       string
		cpu, rps **float64
		user     **float64
		cpuWrk   **float64
	}{
		{srvL7d, &s.L7CPUUs, &s.L7ReqPerS, &s.L7UserUs, &s.L7CPUUsWrk},
		{srvNginx, &s.NginxCPUUs, &s.NginxReqPerS, &s.NginxUserUs, &s.NginxCPUUsWrk},
		{srvHAProxy, &s.HAProxyCPUUs, &s.HAProxyReqPer, &s.HAProxyUserUs, &s.HAProxyCPUUsWrk},
		{srvFloor, &s.FloorCPUUs, new(*float64), new(*float64), &s.FloorCPUUsWrk},
		{srvFloorFasthttp, &s.FloorFasthttpCPUUs, new(*float64), new(*float64), &s.FloorFasthttpCPUUsWrk},
	} {
		for _, gen := range generatorNames {
			t := p.totals(c.id, gen)
			if t == nil {
				continue
			}
			if s.CPUByGenerator == nil {
				s.CPUByGenerator = map[string]map[string]float64{}
			}
			if s.CPUByGenerator[gen] == nil {
				s.CPUByGenerator[gen] = map[string]float64{}
			}
			s.CPUByGenerator[gen][c.id] = t.cpuUs
			if gen == genWrk {
				*c.cpuWrk = ptr(t.cpuUs)
			} else {
				*c.cpu, *c.rps, *c.user = ptr(t.cpuUs), ptr(t.rate), ptr(t.userUs)
			}
			parts = append(parts, fmt.Sprintf("%s by %s %.1f µs (user %.1f, kernel %.1f; %.0f req/s)", c.id, gen, t.cpuUs, t.userUs, t.cpuUs-t.userUs, t.rate))
		}
	}
	s.L7VsNginx, s.L7VsHAProxy = ratio(s.NginxCPUUs, s.L7CPUUs), ratio(s.HAProxyCPUUs, s.L7CPUUs)
	s.L7VsNginxWrk = ratio(s.NginxCPUUsWrk, s.L7CPUUsWrk)
	for gen, m := range s.CPUByGenerator {
		l7, okL := m[srvL7d]
		ng, okN := m[srvNginx]
		if okL && okN && l7 > 0 {
			if s.NginxOverL7ByGenerator == nil {
				s.NginxOverL7ByGenerator = map[string]float64{}
			}
			s.NginxOverL7ByGenerator[gen] = round(ng/l7, 3)
		}
	}
	var floorParts []string
	for _, gen := range generatorNames {
		m := s.CPUByGenerator[gen]
		fl, ok := m[srvFloor]
		if !ok || fl <= 0 {
			continue
		}
		part := gen + ":"
		if l7, ok := m[srvL7d]; ok {
			if s.L7OverFloorByGenerator == nil {
				s.L7OverFloorByGenerator = map[string]float64{}
			}
			s.L7OverFloorByGenerator[gen] = round(l7/fl, 3)
			part += fmt.Sprintf(" l7d ÷ floor = %.2f", l7/fl)
		}
		if fh, ok := m[srvFloorFasthttp]; ok {
			part += fmt.Sprintf(" fasthttp alone ÷ floor = %.2f", fh/fl)
			if l7, ok := m[srvL7d]; ok && fh > 0 {
				part += fmt.Sprintf(" l7d ÷ fasthttp alone = %.2f", l7/fh)
			}
		}
		if ng, ok := m[srvNginx]; ok {
			if s.NginxOverFloorByGen == nil {
				s.NginxOverFloorByGen = map[string]float64{}
			}
			s.NginxOverFloorByGen[gen] = round(ng/fl, 3)
			part += fmt.Sprintf(" nginx ÷ floor = %.2f", ng/fl)
		}
		floorParts = append(floorParts, part)
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "server CPU per request over all rounds: %s\n", strings.Join(parts, "; "))
	}
	if len(floorParts) > 0 {
		fmt.Fprintf(w, "against the floor (Go net and crypto/tls alone, one P: what any Go proxy on them pays here): %s\n", strings.Join(floorParts, "; "))
	}
	if s.L7VsNginx != nil || s.L7VsHAProxy != nil {
		fmt.Fprintf(w, "relative to l7d (%s's rows): nginx ÷ l7d = %s, haproxy ÷ l7d = %s (above 1: l7d uses less CPU per request)\n", genOwn, num(s.L7VsNginx, "%.2f"), num(s.L7VsHAProxy, "%.2f"))
	}
	if s.L7VsNginxWrk != nil {
		fmt.Fprintf(w, "relative to l7d (wrk's rows): nginx ÷ l7d = %s\n", num(s.L7VsNginxWrk, "%.2f"))
	}
	var gcNotes []string
	for _, rs := range s.Proxy {
		if rs.L7AllocKB != nil {
			gcNotes = append(gcNotes, fmt.Sprintf("%s round %d: %.2f KB, %.3f GC", rs.Generator, rs.Round, *rs.L7AllocKB, *rs.L7GCPer1000)+rs.Procs.Note())
		}
	}
	if len(gcNotes) > 0 {
		fmt.Fprintf(w, "l7d's Go runtime (its /metrics, warm-up included), allocated per request, GC cycles per 1000 requests, and GOMAXPROCS as sized to the load: %s\n", strings.Join(gcNotes, "; "))
	}
	return maxOther
}

func atMost(v *float64, limit float64) *bool {
	if v == nil {
		return nil
	}
	return ptr(*v <= limit)
}

func ratio(a, b *float64) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	return ptr(round(*a / *b, 3))
}

func maxPtr(cur *float64, v float64) *float64 {
	if cur == nil || v > *cur {
		return ptr(v)
	}
	return cur
}

func num(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

func numUnit(v *float64, format string) string {
	if v == nil {
		return "not measured"
	}
	return fmt.Sprintf(format, *v)
}

func passMiss(ok *bool) string {
	switch {
	case ok == nil:
		return "-"
	case *ok:
		return "PASS"
	}
	return "MISS"
}

func ptr[T any](v T) *T { return &v }

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func us(d time.Duration) float64 { return round(float64(d)/float64(time.Microsecond), 2) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// stallRounds pairs, round by round, the longest lookup beside any update (the
// swap-only measurement included) with the control's longest in that round. Rounds
// in which either side was not measured are left out.
func (r *blacklistResults) stallRounds() [][2]float64 {
	if r == nil || r.control == nil {
		return nil
	}
	var out [][2]float64
	for i, c := range r.control.RoundsStallUs {
		upd, any := 0.0, false
		for _, u := range r.updates {
			if i < len(u.RoundsStallUs) {
				upd, any = max(upd, u.RoundsStallUs[i]), true
			}
		}
		if i < len(r.swapRounds) {
			upd, any = max(upd, r.swapRounds[i]), true
		}
		if any {
			out = append(out, [2]float64{upd, c})
		}
	}
	return out
}

// roundWindows is, for one round, the update whose lookups saw the round's longest
// (or "swap only"), where that window's time went, and the control's.
type roundWindows struct {
	update   string
	upd, ctl stallWindow
}

func (r *blacklistResults) stallRoundWindows() []roundWindows {
	if r == nil || r.control == nil {
		return nil
	}
	var out []roundWindows
	for i := range r.control.RoundsStallUs {
		rw, best := roundWindows{}, -1.0
		for _, u := range r.updates {
			if i < len(u.RoundsStallUs) && u.RoundsStallUs[i] > best {
				best, rw.update = u.RoundsStallUs[i], strings.SplitN(u.Name, ":", 2)[0]
				if i < len(u.RoundsWindow) {
					rw.upd = u.RoundsWindow[i]
				}
			}
		}
		if i < len(r.swapRounds) && r.swapRounds[i] > best {
			rw.update, rw.upd = "swap only", stallWindow{}
		}
		if i < len(r.control.RoundsWindow) {
			rw.ctl = r.control.RoundsWindow[i]
		}
		out = append(out, rw)
	}
	return out
}
