package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"runtime"
	"slices"
	"strings"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// Targets from the issue. They are reported, never tuned for.
const (
	targetEstablishedMpps = 4.0  // per core, through DPDK
	targetNewFlowsMpps    = 1.5  // per core
	targetBytesPerConn    = 64.0 // per connection entry, all-in
	targetTable10MMiB     = 1024.0
	table10M              = 10_000_000
	targetBlacklistRatio  = 0.9 // established flows with a 1M-entry list ÷ without
	blacklist1M           = 1_000_000
	targetSynproxyVsKern  = 3.0  // LD cookie SYN-ACKs per core ÷ the kernel's nftables synproxy (issue 17)
	targetSynproxyEstab   = 0.85 // established flows with the SYN proxy on ÷ off (issue 17)
)

// summary is the last line of the output. The first five fields are the headline
// figures the issue asks for; a figure that was not measured is null.
type summary struct {
	EstablishedDPDK  *float64 `json:"l4_mpps_per_core_established"`
	EstablishedInMem *float64 `json:"l4_mpps_per_core_established_inmem"`
	NewFlows         *float64 `json:"l4_new_flows_mpps_per_core"`
	BytesPerConn     *float64 `json:"l4_bytes_per_conn"`
	Table10MMiB      *float64 `json:"l4_table_10m_mib"`

	// BlacklistRatio is the established-flow rate per core with a 1M-entry IPv4
	// blacklist in force (none of the clients on it) ÷ the rate without, the median
	// of the rounds, through DPDK net_ring when measured and not source-bound, else
	// in memory; null when the list was not 1M entries.
	BlacklistRatio *float64 `json:"l4_mpps_with_1m_blacklist_ratio"`

	// The defence rows (issue 17); null when not measured (or not available).
	// SynproxyCookies is the LD's cookie SYN-ACKs per second of its worker's CPU, in
	// millions; KernelSynproxy the kernel's nftables synproxy's per second of its
	// core's softirq time; SynproxyVsKernel the median of the rounds' ratios.
	SynproxyCookies     *float64 `json:"synproxy_cookies_mpps_per_core"`
	KernelSynproxy      *float64 `json:"kernel_synproxy_mpps_per_core"`
	SynproxyVsKernel    *float64 `json:"synproxy_vs_kernel"`
	SynproxyEstablished *float64 `json:"synproxy_established_ratio"`
	// SynproxyCookiesDPDK is the LD's cookie SYN-ACKs per second of its worker's
	// CPU over DPDK net_ring (the median of its rounds), in millions.
	SynproxyCookiesDPDK *float64 `json:"synproxy_cookies_mpps_per_core_dpdk"`
	// OverloadNs and TraceNs are the worker CPU time per packet of established flows
	// that overload control (normal state, limits set) and tracing (a DSCP marker;
	// no packet marked) add; the ratios are the rates with ÷ without.
	OverloadNs       *float64 `json:"overload_ns_per_packet"`
	OverloadRatio    *float64 `json:"overload_established_ratio"`
	ProtectingNs     *float64 `json:"overload_protecting_ns_per_packet"`
	ProtectingRatio  *float64 `json:"overload_protecting_established_ratio"`
	TraceNs          *float64 `json:"trace_ns_per_packet"`
	TraceRatio       *float64 `json:"trace_established_ratio"`
	TraceOptionNs    *float64 `json:"trace_tcp_option_ns_per_packet"`
	TraceOptionRatio *float64 `json:"trace_tcp_option_established_ratio"`

	Targets map[string]*bool `json:"targets_met"`

	BlacklistEntries        int      `json:"l4_blacklist_entries"`
	BlacklistMiB            *float64 `json:"l4_blacklist_mib,omitempty"`
	BlacklistRatioInMem     *float64 `json:"l4_blacklist_ratio_inmem"`
	BlacklistRatioDPDK      *float64 `json:"l4_blacklist_ratio_dpdk"`
	BlacklistListedInMem    *float64 `json:"l4_blacklist_listed_ratio_inmem"`
	BlacklistListedDPDK     *float64 `json:"l4_blacklist_listed_ratio_dpdk"`
	BlacklistWallRatioInMem *float64 `json:"l4_blacklist_wall_ratio_inmem"`
	BlacklistWallRatioDPDK  *float64 `json:"l4_blacklist_wall_ratio_dpdk"`

	NewFlowsDPDK *float64 `json:"l4_new_flows_mpps_per_core_dpdk"`
	// The same figures divided by the worker thread's CPU time instead of the wall clock.
	EstablishedDPDKCPU  *float64 `json:"l4_mpps_per_worker_cpu_s_established"`
	EstablishedInMemCPU *float64 `json:"l4_mpps_per_worker_cpu_s_established_inmem"`
	NewFlowsCPU         *float64 `json:"l4_new_flows_mpps_per_worker_cpu_s"`
	NewFlowsDPDKCPU     *float64 `json:"l4_new_flows_mpps_per_worker_cpu_s_dpdk"`
	MaxOtherCores       float64  `json:"max_other_processes_cores"`
	AFPacketKpps        *float64 `json:"l4_af_packet_kpps"`
	FeederBound         *bool    `json:"l4_dpdk_feeder_bound"`
	EntrySize           *int     `json:"l4_entry_size_bytes"`
	TableEntries        int      `json:"l4_table_entries"`
	TableMiB            *float64 `json:"l4_table_mib"`
	TableHeapMiB        *float64 `json:"l4_table_heap_growth_mib"`
	TableRSSMiB         *float64 `json:"l4_table_rss_growth_mib"`
	TableInsertNs       *float64 `json:"l4_table_insert_ns"`

	Flows      int      `json:"flows"`
	DurationS  float64  `json:"duration_s"`
	Cores      int      `json:"cores"`
	GOMAXPROCS int      `json:"gomaxprocs"`
	EAL        []string `json:"eal_args,omitempty"`
	Skipped    []string `json:"skipped"`
	Failures   []string `json:"failures"`

	InMem   *forwardResults `json:"inmem"`
	Ring    *forwardResults `json:"dpdk_net_ring"`
	Veth    *vethResult     `json:"veth_af_packet"`
	Table   *tableResult    `json:"table"`
	Defence *defenceResults `json:"defence,omitempty"`
	// SynproxyRing are the SYN proxy's cookie rows over DPDK net_ring.
	SynproxyRing []*phaseResult `json:"synproxy_dpdk_net_ring,omitempty"`
}

func report(o *options, r *results) {
	w := o.out
	s := summary{
		Flows: o.flows, DurationS: o.duration.Seconds(), Cores: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		EAL: r.eal, Skipped: r.skipped, Failures: r.Failures, Targets: map[string]*bool{},
		InMem: r.inmem, Ring: r.ring, Veth: r.veth, Table: r.table, Defence: r.defence, SynproxyRing: r.ringCookies,
	}
	if s.Skipped == nil {
		s.Skipped = []string{}
	}
	if s.Failures == nil {
		s.Failures = []string{}
	}
	header(w, o, r)

	ft := benchkit.Table{Header: []string{"forwarding, one worker", "packets", "seconds", "Mpps", "worker CPU s", "Mpps/CPU s", "idle", "others", "notes"}}
	maxOther := 0.0
	phases := func(name string, f *forwardResults, note string) {
		if f == nil {
			ft.Row(name, "-", "-", "-", "-", "-", "-", "-", "not measured")
			return
		}
		row := func(what string, p *phaseResult, note string) {
			if p == nil {
				ft.Row(name+": "+what, "-", "-", "-", "-", "-", "-", "-", "not measured")
				return
			}
			maxOther = max(maxOther, p.OtherCores)
			ft.Row(name+": "+what, commas(p.Packets), fmt.Sprintf("%.3f", p.Seconds), fmt.Sprintf("%.3f", p.Mpps),
				fmt.Sprintf("%.3f", p.WorkerCPU), fmt.Sprintf("%.3f", p.MppsPerCPU), fmt.Sprintf("%.1f%%", 100*p.Idle),
				fmt.Sprintf("%.2f", p.OtherCores), note)
		}
		row("new flows (SYN)", f.NewFlows, "scheduled (Maglev) and inserted")
		row("first ACK per flow", f.FirstACK, "half-open → established")
		if e := f.Established; e != nil && e.Allocs != nil {
			if note != "" {
				note += "; "
			}
			note += fmt.Sprintf("%.4f allocs/packet", *e.Allocs)
		}
		row("established (ACK)", f.Established, note)
		ft.Separator()
	}
	phases("in-memory", r.inmem, "generator copy included")
	if r.inmem != nil {
		s.NewFlows = mpps(r.inmem.NewFlows)
		s.EstablishedInMem = mpps(r.inmem.Established)
		s.NewFlowsCPU = mppsCPU(r.inmem.NewFlows)
		s.EstablishedInMemCPU = mppsCPU(r.inmem.Established)
	}
	ringNote := ""
	if r.ring != nil && r.ring.Established != nil {
		e := r.ring.Established
		ringNote = fmt.Sprintf("feeder found the ring full %s times", commas(e.FeederFull))
		if e.FeederNoBuf > 0 {
			ringNote += fmt.Sprintf(", the pool empty %s times", commas(e.FeederNoBuf))
		}
		if r.ring.SourceBound {
			ringNote += ": FEEDER-BOUND, a lower bound"
		}
		s.FeederBound = &r.ring.SourceBound
	}
	if !o.skipDPDK && o.phase("dpdk") {
		phases("DPDK net_ring", r.ring, ringNote)
		if r.ring != nil {
			s.NewFlowsDPDK = mpps(r.ring.NewFlows)
			s.EstablishedDPDK = mpps(r.ring.Established)
			s.NewFlowsDPDKCPU = mppsCPU(r.ring.NewFlows)
			s.EstablishedDPDKCPU = mppsCPU(r.ring.Established)
		}
	}
	if o.phase("forward") || o.phase("dpdk") {
		ft.Fprint(w)
		fmt.Fprintln(w, "Mpps = packets ÷ seconds (wall clock, the headline); Mpps/CPU s = packets ÷ the CPU time the worker's thread")
		fmt.Fprintln(w, "had; idle = share of the phase the worker waited for packets (from a poll that found none to the next that")
		fmt.Fprintln(w, "found some); others = cores used by other processes meanwhile.")
		fmt.Fprintln(w)
	}
	maxOther = max(maxOther, blacklistTable(w, r, &s))
	maxOther = max(maxOther, defenceTable(w, r, &s))
	s.MaxOtherCores = round(maxOther, 2)
	if maxOther >= 0.2 {
		fmt.Fprintf(w, "warning: other processes used up to %.2f of the %d cores during a phase: the machine was shared, so the\n", maxOther, runtime.NumCPU())
		fmt.Fprintln(w, "wall-clock figures are low; Mpps/CPU s is what the worker did with the time it had.")
	}
	fmt.Fprintln(w)

	if v := r.veth; v != nil {
		s.AFPacketKpps = ptr(round(v.Kpps, 1))
		vt := benchkit.Table{Header: []string{"veth, net_af_packet (kernel-bound)", "packets", "kpps"}}
		vt.Row("client sent (raw socket)", commas(v.Sent), fmt.Sprintf("%.1f", v.SentKpps))
		vt.Row("LD received (worker's RX queue)", commas(v.Received), "")
		vt.Row("LD forwarded (tunnelled to the sink)", commas(v.Forwarded), fmt.Sprintf("%.1f", v.Kpps))
		vt.Row("sink received (snk0 rx_packets)", commas(v.SinkRx), "")
		vt.Fprint(w)
		fmt.Fprintf(w, "over %.2f s; %d frames refused by the client's socket; %d missed by net_af_packet0", v.Seconds, v.Refused, v.RxMissed)
		if len(v.OtherCount) > 0 {
			fmt.Fprintf(w, "; other datapath counts: %s", formatCounts(v.OtherCount))
		}
		fmt.Fprint(w, "\n\n")
	}

	if t := r.table; t != nil {
		s.EntrySize = &t.EntrySize
		s.TableEntries = t.Entries
		s.BytesPerConn = ptr(round(t.PerEntry, 2))
		s.TableMiB = ptr(round(mib(int64(t.MemoryBytes)), 1))
		s.TableHeapMiB = ptr(round(mib(t.HeapBytes), 1))
		s.TableRSSMiB = ptr(round(mib(t.RSSBytes), 1))
		s.TableInsertNs = ptr(round(t.InsertNs, 1))
		if t.Entries == table10M {
			s.Table10MMiB = s.TableMiB
		}
		tt := benchkit.Table{Header: []string{"connection table (l4/conntrack)", "value"}}
		tt.Row("entry size (conntrack.EntrySize)", fmt.Sprintf("%d B", t.EntrySize))
		tt.Row(fmt.Sprintf("bytes per entry, all-in (MemoryBytes ÷ capacity %s)", commas(uint64(t.Entries))), fmt.Sprintf("%.2f B", t.PerEntry))
		tt.Row(fmt.Sprintf("table holding %s connections (MemoryBytes)", commas(uint64(t.Entries))), fmt.Sprintf("%.1f MiB", mib(int64(t.MemoryBytes))))
		tt.Row("  Go heap growth (runtime.MemStats.HeapAlloc)", fmt.Sprintf("%.1f MiB", mib(t.HeapBytes)))
		tt.Row("  resident set growth (VmRSS)", fmt.Sprintf("%.1f MiB", mib(t.RSSBytes)))
		tt.Row("insert, established, one at a time", fmt.Sprintf("%.0f ns", t.InsertNs))
		tt.Fprint(w)
		fmt.Fprintln(w)
	}

	tg := benchkit.Table{Header: []string{"target (issue 5)", "measured", "result"}}
	row := func(key, name string, met *bool, measured string) {
		s.Targets[key] = met
		tg.Row(name, measured, passMiss(met))
	}
	estText := numUnit(s.EstablishedDPDK, "%.3f Mpps")
	if s.FeederBound != nil && *s.FeederBound {
		estText += " (feeder-bound)"
	}
	row("established_dpdk", fmt.Sprintf("established flows through DPDK ≥ %.0f Mpps per core", targetEstablishedMpps),
		atLeast(s.EstablishedDPDK, targetEstablishedMpps), estText)
	row("new_flows", fmt.Sprintf("new flows ≥ %.1f Mpps per core (in-memory)", targetNewFlowsMpps),
		atLeast(s.NewFlows, targetNewFlowsMpps), numUnit(s.NewFlows, "%.3f Mpps"))
	row("bytes_per_conn", fmt.Sprintf("≤ %.0f B per connection entry (all-in)", targetBytesPerConn),
		atMost(s.BytesPerConn, targetBytesPerConn), numUnit(s.BytesPerConn, "%.2f B"))
	row("table_10m", "10,000,000 connections in ≤ 1 GiB",
		atMost(s.Table10MMiB, targetTable10MMiB), numUnit(s.Table10MMiB, "%.1f MiB"))
	row("blacklist_1m", fmt.Sprintf("established flows with a 1M blacklist ≥ %.1f × without (issue 14)", targetBlacklistRatio),
		atLeast(s.BlacklistRatio, targetBlacklistRatio), numUnit(s.BlacklistRatio, "%.3f ×"))
	row("synproxy_vs_kernel", fmt.Sprintf("SYN-proxy cookie answers per core ≥ %.0f × the kernel's nftables synproxy (issue 17)", targetSynproxyVsKern),
		atLeast(s.SynproxyVsKernel, targetSynproxyVsKern), numUnit(s.SynproxyVsKernel, "%.2f ×"))
	row("synproxy_established", fmt.Sprintf("established flows with the SYN proxy on ≥ %.2f × off (issue 17)", targetSynproxyEstab),
		atLeast(s.SynproxyEstablished, targetSynproxyEstab), numUnit(s.SynproxyEstablished, "%.3f ×"))
	tg.Fprint(w)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "peers, as published (not measured here): DPVS about 2.9 Mpps per worker; IPVS 128 bytes per connection entry.")
	if len(r.skipped) > 0 {
		fmt.Fprintf(w, "skipped: %s\n", strings.Join(r.skipped, "; "))
	}
	benchkit.WriteReportEnd(w, r.Failures, s)
}

// header describes the set-up.
func header(w io.Writer, o *options, r *results) {
	fmt.Fprintf(w, "\nL4 load distributor benchmark (l4/datapath, one worker): forwarding, new flows, connection table memory\n")
	fmt.Fprintf(w, "machine:   %d CPUs, GOMAXPROCS %d, %s/%s, %s\n", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version())
	if !o.phase("forward") && !o.phase("dpdk") {
		fmt.Fprintf(w, "phases:    %s\n", strings.Join(o.phases, ", "))
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, "traffic:   TCP to %s:%d from %s flows (one client address each, spread over the IPv4 unicast space;\n", vip, vipPort, commas(uint64(o.flows)))
	fmt.Fprintf(w, "           ports from %d), each pass in one shuffled\n", clientPortBase)
	fmt.Fprintf(w, "           order; SYN frames %d B (MSS, SACK, timestamps, window scale), ACK frames %d B (timestamps);\n", synFrameLen, ackFrameLen)
	fmt.Fprintf(w, "           built in %.1f s. One rule, 4 members (Maglev), GRE, static neighbours, connection table of %s.\n", r.buildDur.Seconds(), commas(uint64(tableCapacity(o.flows))))
	fmt.Fprintf(w, "phases:    one SYN per flow (new flows, timed from the first burst received to the last flow forwarded); one ACK\n")
	fmt.Fprintf(w, "           per flow (entries become established); then ACKs over the established flows, counted for %v.\n", o.duration)
	fmt.Fprintf(w, "worker:    one goroutine on a locked OS thread, busy poll, bursts of 32 (datapath defaults); Mpps per core.\n")
	fmt.Fprintf(w, "in-memory: the external port is a generator whose RxBurst copies each pre-built frame into a buffer: the copy\n")
	fmt.Fprintf(w, "           stands for the NIC's DMA and runs on the worker's core, so it is inside the figure; the internal\n")
	fmt.Fprintf(w, "           port takes every frame and recycles its buffer.\n")
	if !o.skipDPDK && o.phase("dpdk") {
		fmt.Fprintf(w, "DPDK:      EAL %s\n", strings.Join(r.eal, " "))
		fmt.Fprintf(w, "           a feeder goroutine on the other core (locked thread, registered lcore) allocates mbufs, copies the\n")
		fmt.Fprintf(w, "           frames into them and transmits them on net_ring0 TX queue 0, which is the ring (1024 slots) of its\n")
		fmt.Fprintf(w, "           RX queue 0, polled by the worker; the worker tunnels to net_null0 (no-rx=1), which frees the mbufs.\n")
		fmt.Fprintf(w, "           The worker never transmits on net_ring0 (checked: no out or local counts), so the ring has one\n")
		fmt.Fprintf(w, "           producer. When the ring is full the feeder yields the CPU (sched_yield) and retries. If the worker\n")
		fmt.Fprintf(w, "           waited for packets more than 1%% of the time, the feeder set the pace: the figure is then\n")
		fmt.Fprintf(w, "           feeder-bound, a lower bound.\n")
		if !o.skipVeth {
			fmt.Fprintf(w, "veth:      raw AF_PACKET socket in a client namespace → veth → net_af_packet0 on the LD's end (no\n")
			fmt.Fprintf(w, "           addresses, forwarding off) → worker → net_af_packet1 → veth → sink namespace, whose kernel counts\n")
			fmt.Fprintf(w, "           and drops the GRE. %s ACK flows, at most %s frames or %v. Each device has two queue pairs\n",
				commas(vethFlows), commas(uint64(o.vethFrames)), o.vethDuration)
			fmt.Fprintf(w, "           (the control goroutine needs its own TX queue); the kernel spreads flows over both RX sockets,\n")
			fmt.Fprintf(w, "           so the worker polls both. Kernel-bound: for context only.\n")
		}
	}
	fmt.Fprintln(w)
}

func mpps(p *phaseResult) *float64 {
	if p == nil {
		return nil
	}
	return ptr(round(p.Mpps, 3))
}

func mppsCPU(p *phaseResult) *float64 {
	if p == nil || p.MppsPerCPU == 0 {
		return nil
	}
	return ptr(round(p.MppsPerCPU, 3))
}

func atLeast(v *float64, t float64) *bool {
	if v == nil {
		return nil
	}
	return ptr(*v >= t)
}

func atMost(v *float64, t float64) *bool {
	if v == nil {
		return nil
	}
	return ptr(*v <= t)
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

func numUnit(v *float64, format string) string {
	if v == nil {
		return "not measured"
	}
	return fmt.Sprintf(format, *v)
}

func formatCounts(m map[string]uint64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func ptr[T any](v T) *T { return &v }

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// commas writes n with thousands separators.
func commas[T ~int | ~uint64](n T) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// blacklistTable prints the blacklist rows of both set-ups, fills their summary
// fields, and returns the most cores other processes used during a row.
func blacklistTable(w io.Writer, r *results, s *summary) float64 {
	b := r.blacklist
	if b == nil {
		return 0
	}
	s.BlacklistEntries = b.entries
	s.BlacklistMiB = ptr(round(mib(int64(b.bytes)), 2))
	bt := benchkit.Table{Header: []string{"established flows, blacklist", "round", "packets", "Mpps", "Mpps/CPU s", "× without (CPU s)", "× without (wall)", "idle", "others", "sweep before"}}
	maxOther := 0.0
	setup := func(name string, f *forwardResults) {
		if f == nil || f.Blacklist == nil {
			bt.Row(name, "-", "-", "-", "-", "-", "-", "-", "-", "not measured")
			bt.Separator()
			return
		}
		for i, rd := range f.Blacklist.Rounds {
			row := func(what string, p *phaseResult, cpuRatio, wallRatio, sweep string) {
				maxOther = max(maxOther, p.OtherCores)
				bt.Row(name+": "+what, fmt.Sprint(i+1), commas(p.Packets), fmt.Sprintf("%.3f", p.Mpps), fmt.Sprintf("%.3f", p.MppsPerCPU),
					cpuRatio, wallRatio, fmt.Sprintf("%.1f%%", 100*p.Idle), fmt.Sprintf("%.2f", p.OtherCores), sweep)
			}
			row("no list", rd.Without, "", "", "")
			row(fmt.Sprintf("%s entries, none listed", commas(b.entries)), rd.With, fmt.Sprintf("%.3f", rd.Ratio), fmt.Sprintf("%.3f", rd.WallRatio),
				fmt.Sprintf("≤ %.0f ms", rd.SweepMs))
			row(fmt.Sprintf("%s entries, %s clients listed", commas(b.entries), commas(b.listed)), rd.Listed,
				fmt.Sprintf("%.3f", rd.ListedRatio), fmt.Sprintf("%.3f", rd.ListedWallRatio),
				fmt.Sprintf("≤ %.0f ms, %s flows cut", rd.ListedSweepMs, commas(rd.FlowsRemoved)))
		}
		note := ""
		if f.Blacklist.SourceBound {
			note = "SOURCE-BOUND: the worker waited for packets"
		}
		bt.Row(name+": median of the rounds", "", "", "", "", fmt.Sprintf("%.3f", f.Blacklist.Ratio), fmt.Sprintf("%.3f", f.Blacklist.WallRatio), "", "", note)
		bt.Separator()
	}
	setup("in-memory", r.inmem)
	if r.inmem != nil && r.inmem.Blacklist != nil {
		s.BlacklistRatioInMem = ptr(r.inmem.Blacklist.Ratio)
		s.BlacklistListedInMem = ptr(r.inmem.Blacklist.ListedRatio)
		s.BlacklistWallRatioInMem = ptr(r.inmem.Blacklist.WallRatio)
		s.BlacklistRatio = s.BlacklistRatioInMem
	}
	if len(r.eal) > 0 {
		setup("DPDK net_ring", r.ring)
		if r.ring != nil && r.ring.Blacklist != nil {
			s.BlacklistRatioDPDK = ptr(r.ring.Blacklist.Ratio)
			s.BlacklistListedDPDK = ptr(r.ring.Blacklist.ListedRatio)
			s.BlacklistWallRatioDPDK = ptr(r.ring.Blacklist.WallRatio)
			if !r.ring.Blacklist.SourceBound || s.BlacklistRatio == nil {
				s.BlacklistRatio = s.BlacklistRatioDPDK
			}
		}
	}
	if b.entries != blacklist1M {
		s.BlacklistRatio = nil
	}
	bt.Fprint(w)
	fmt.Fprintf(w, "a list of %s random IPv4 addresses (%.1f MiB, built in %.1f s), none a client's; the third row puts %s\n",
		commas(b.entries), mib(int64(b.bytes)), b.build.Seconds(), commas(b.listed))
	fmt.Fprintln(w, "clients on it in place of as many entries, and counts packets handled (forwarded or dropped as blacklisted).")
	fmt.Fprintln(w, "Each round runs the three rows back to back on the same established flows; × without divides by the")
	fmt.Fprintln(w, "round's no-list row. The headline ratio is the median by worker CPU time, through DPDK when measured and")
	fmt.Fprintln(w, "not source-bound (the feeder then sets the pace, and the worker's CPU time goes to polling), else in memory.")
	fmt.Fprintln(w, "Packets of flows in the table are not looked up: after each change of the list the worker sweeps its")
	fmt.Fprintln(w, "table (sweep before: until the sweep was seen done, idle, counters published every 100 ms) and cuts the")
	fmt.Fprintln(w, "flows of listed clients, whose packets are then new flows, looked up and dropped.")
	fmt.Fprintln(w)
	return maxOther
}
