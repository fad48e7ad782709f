package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// Targets from the issue, on TLS 1.3 full handshakes. They are reported, never tuned
// for.
const (
	targetOffloadGain = 3.5 // l7d CPU per handshake, key local ÷ key on keyserverd
	targetVsNginx     = 2.0 // nginx CPU per handshake ÷ l7d's with the key on keyserverd
)

// summary is the last line of the output. The first seven fields are the headline
// figures the issue asks for, all TLS 1.3; a figure that was not measured is null.
type summary struct {
	// The load-shape matrix: vs_nginx_min, offload_gain_min (over the shapes with a
	// request on each connection), by shape, and its rows; absent when not run.
	*matrixSummary

	L7LocalMs       *float64 `json:"l7_local_cpu_ms_per_hs"`
	L7OffloadMs     *float64 `json:"l7_offload_cpu_ms_per_hs"`
	NginxMs         *float64 `json:"nginx_cpu_ms_per_hs"`
	OffloadGain     *float64 `json:"offload_gain"`
	VsNginx         *float64 `json:"vs_nginx"`
	L7ResumedMs     *float64 `json:"l7_resumed_cpu_ms_per_hs"`
	NginxResumedMs  *float64 `json:"nginx_resumed_cpu_ms_per_hs"`
	OffloadGainMet  *bool    `json:"offload_gain_target_met"`
	VsNginxMet      *bool    `json:"vs_nginx_target_met"`
	KeyserverdMs    *float64 `json:"keyserverd_cpu_ms_per_hs"`
	L7OffloadResMs  *float64 `json:"l7_offload_resumed_cpu_ms_per_hs"`
	L7LocalTLS12    *float64 `json:"l7_local_tls12_cpu_ms_per_hs"`
	L7OffloadTLS12  *float64 `json:"l7_offload_tls12_cpu_ms_per_hs"`
	NginxTLS12      *float64 `json:"nginx_tls12_cpu_ms_per_hs"`
	OffloadGainTLS2 *float64 `json:"offload_gain_tls12"`
	VsNginxTLS12    *float64 `json:"vs_nginx_tls12"`
	L7ResumedTLS12  *float64 `json:"l7_resumed_tls12_cpu_ms_per_hs"`
	NginxResTLS12   *float64 `json:"nginx_resumed_tls12_cpu_ms_per_hs"`

	// ScrapeCost is what scraping l7d's /metrics each second cost it at
	// -scrape-cost-rate handshakes/s; null when not run.
	ScrapeCost *scrapeCost `json:"scrape_cost"`

	Workers       int      `json:"workers"`
	NginxWorkers  int      `json:"nginx_workers"`
	Cores         int      `json:"cores"`
	DurationS     float64  `json:"duration_s"`
	MaxOtherCores float64  `json:"max_other_processes_cores"`
	Profiled      bool     `json:"profiled_l7d_variant"`
	Failures      []string `json:"failures"`
	Rows          []rowSum `json:"rows"`
}

// rowSum is one row of the table.
type rowSum struct {
	Server          string   `json:"server"`
	TLS             string   `json:"tls"`
	Mode            string   `json:"mode"`
	HandshakesPerS  float64  `json:"handshakes_per_s"`
	Handshakes      int      `json:"handshakes"`
	ResumedFraction float64  `json:"resumed_fraction"`
	P50Ms           float64  `json:"p50_ms"`
	P99Ms           float64  `json:"p99_ms"`
	ServerCPUMs     float64  `json:"server_cpu_ms_per_hs"`
	ServerCores     float64  `json:"server_cores"`
	KeyserverdCPUMs *float64 `json:"keyserverd_cpu_ms_per_hs,omitempty"`
	LoadGenCPUMs    float64  `json:"loadgen_cpu_ms_per_hs"`
	BytesPerConn    float64  `json:"server_bytes_per_conn"`
	L7AllocKBPerHS  *float64 `json:"l7d_alloc_kb_per_hs,omitempty"`
	L7GCPer1000HS   *float64 `json:"l7d_gc_cycles_per_1000_hs,omitempty"`
	*benchkit.Procs          // l7d's Ps at the end of the row and its changes; nil for nginx
	Errors          int      `json:"errors"`
	Verified        int64    `json:"chains_verified"`
	OtherCores      float64  `json:"other_processes_cores"`
}

func (b *bench) find(id string, version uint16, mode string) *row {
	for _, r := range b.rows {
		if r.srv.id == id && r.version == version && r.mode == mode {
			return r
		}
	}
	return nil
}

// cpuMs is the server CPU per handshake of a row in ms, or nil when not measured.
func (b *bench) cpuMs(id string, version uint16, mode string) *float64 {
	r := b.find(id, version, mode)
	if r == nil || r.handshakes() == 0 || r.res.CPUErr != nil {
		return nil
	}
	return ptr(round(ms(r.serverCPUPerHS()), 4))
}

func ratio(a, b *float64) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	return ptr(round(*a / *b, 3))
}

func met(r *float64, target float64) *bool {
	if r == nil {
		return nil
	}
	return ptr(*r >= target)
}

func (b *bench) report() {
	w := b.o.out
	msum := b.matrixReport(w)
	if !b.o.classic {
		s := summary{matrixSummary: msum, Cores: runtime.NumCPU(), NginxWorkers: b.o.nginxWorkers, Profiled: b.o.profileDir != "", Failures: b.Failures}
		if s.Failures == nil {
			s.Failures = []string{}
		}
		benchkit.WriteReportEnd(w, b.Failures, s)
		return
	}
	b.header(w)
	rows, maxOther := b.table(w)

	t13, t12 := uint16(tls.VersionTLS13), uint16(tls.VersionTLS12)
	s := summary{
		matrixSummary:  msum,
		L7LocalMs:      b.cpuMs(srvL7Local, t13, modeFull),
		L7OffloadMs:    b.cpuMs(srvL7Offload, t13, modeFull),
		NginxMs:        b.cpuMs(srvNginx, t13, modeFull),
		L7ResumedMs:    b.cpuMs(srvL7Local, t13, modeResumed),
		NginxResumedMs: b.cpuMs(srvNginx, t13, modeResumed),
		L7OffloadResMs: b.cpuMs(srvL7Offload, t13, modeResumed),
		L7LocalTLS12:   b.cpuMs(srvL7Local, t12, modeFull),
		L7OffloadTLS12: b.cpuMs(srvL7Offload, t12, modeFull),
		NginxTLS12:     b.cpuMs(srvNginx, t12, modeFull),
		L7ResumedTLS12: b.cpuMs(srvL7Local, t12, modeResumed),
		NginxResTLS12:  b.cpuMs(srvNginx, t12, modeResumed),
		Workers:        b.o.workers,
		NginxWorkers:   b.o.nginxWorkers,
		Cores:          runtime.NumCPU(),
		DurationS:      b.o.duration.Seconds(),
		MaxOtherCores:  maxOther,
		Profiled:       b.o.profileDir != "",
		Failures:       b.Failures,
		Rows:           rows,
		ScrapeCost:     b.scrapeCost,
	}
	if s.Failures == nil {
		s.Failures = []string{}
	}
	s.OffloadGain = ratio(s.L7LocalMs, s.L7OffloadMs)
	s.VsNginx = ratio(s.NginxMs, s.L7OffloadMs)
	s.OffloadGainTLS2 = ratio(s.L7LocalTLS12, s.L7OffloadTLS12)
	s.VsNginxTLS12 = ratio(s.NginxTLS12, s.L7OffloadTLS12)
	s.OffloadGainMet = met(s.OffloadGain, targetOffloadGain)
	s.VsNginxMet = met(s.VsNginx, targetVsNginx)
	if r := b.find(srvL7Offload, t13, modeFull); r != nil {
		if d, ok := r.keyserverCPUPerHS(); ok && r.res.CPUErr == nil {
			s.KeyserverdMs = ptr(round(ms(d), 4))
		}
	}

	tt := benchkit.Table{Header: []string{"target (TLS 1.3 full handshakes, server CPU per handshake)", "measured", "result"}}
	tt.Row(fmt.Sprintf("offload_gain = l7d key local ÷ l7d key on keyserverd ≥ %.1f", targetOffloadGain),
		ratioText(s.OffloadGain, s.L7LocalMs, s.L7OffloadMs), passMiss(s.OffloadGainMet))
	tt.Row(fmt.Sprintf("vs_nginx = nginx ÷ l7d key on keyserverd ≥ %.1f", targetVsNginx),
		ratioText(s.VsNginx, s.NginxMs, s.L7OffloadMs), passMiss(s.VsNginxMet))
	fmt.Fprintln(w)
	tt.Fprint(w)
	fmt.Fprintln(w)

	fmt.Fprintf(w, "TLS 1.2 full handshakes: offload gain %s; nginx ÷ l7d offload %s\n",
		ratioText(s.OffloadGainTLS2, s.L7LocalTLS12, s.L7OffloadTLS12), ratioText(s.VsNginxTLS12, s.NginxTLS12, s.L7OffloadTLS12))
	fmt.Fprintf(w, "resumed handshakes (TLS 1.3): l7d %s ms, nginx %s ms, nginx ÷ l7d %s; TLS 1.2: l7d %s ms, nginx %s ms, nginx ÷ l7d %s\n",
		num(s.L7ResumedMs), num(s.NginxResumedMs), ratioText(ratio(s.NginxResumedMs, s.L7ResumedMs), nil, nil),
		num(s.L7ResumedTLS12), num(s.NginxResTLS12), ratioText(ratio(s.NginxResTLS12, s.L7ResumedTLS12), nil, nil))
	if r := b.find(srvL7Offload, t13, modeFull); r != nil && s.KeyserverdMs != nil && s.L7OffloadMs != nil && s.L7LocalMs != nil {
		fmt.Fprintf(w, "with the key on keyserverd, a TLS 1.3 handshake costs l7d %.3f ms and keyserverd %.3f ms (SoftHSM RSA-2048 signature, mutual-TLS framing): %.3f ms on this machine, vs %.3f ms in l7d with the key local\n",
			*s.L7OffloadMs, *s.KeyserverdMs, *s.L7OffloadMs+*s.KeyserverdMs, *s.L7LocalMs)
	}
	if sc := b.scrapeCost; sc != nil {
		fmt.Fprintf(w, "scraping l7d's /metrics (%d bytes) once a second at %.0f %s TLS 1.3 handshakes/s (%s): l7d %.4f cores without, %.4f with (%.0f and %.0f handshakes/s made, %d windows each): %+.2f%% per handshake (windows without scrapes %.2f%% apart); one scrape %.3f ms of l7d CPU, %.3f%% of its CPU at one a second: target under 1%%: %s\n",
			sc.ScrapeBytes, sc.TargetRate, sc.Mode, sc.Server, sc.CoresOff, sc.CoresOn, sc.RateOff, sc.RateOn, sc.Pairs, sc.AddedPct, sc.NoisePct, sc.ScrapeMs, sc.AddedPctDirect, passMiss(&sc.Met))
	}
	benchkit.WriteReportEnd(w, b.Failures, s)
}

// header describes the set-up.
func (b *bench) header(w io.Writer) {
	o := b.o
	fmt.Fprintf(w, "\nTLS handshake benchmark: RSA-2048 certificate, ECDHE over X25519, AES-128-GCM (TLS 1.3 TLS_AES_128_GCM_SHA256, TLS 1.2 ECDHE-RSA-AES128-GCM-SHA256)\n")
	fmt.Fprintf(w, "machine:  %d CPUs, %s/%s, %s", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	if b.nginxVersion != "" {
		fmt.Fprintf(w, "; nginx %s with %s", b.nginxVersion, b.nginxOpenSSL)
	}
	fmt.Fprintln(w)
	l7 := "bin/l7d (GOMAXPROCS sized to the load, up to the cores)"
	if o.profileDir != "" {
		l7 = "the profiling variant of l7d (l7d's code in this program, with net/http/pprof; -profile)"
	}
	fmt.Fprintf(w, "servers:  %s, one TCP-only listener, the key in a PEM file or on keyserverd (SoftHSM2 token, mutual TLS,\n", l7)
	fmt.Fprintf(w, "          keyserver/client); nginx, %d worker processes, the same certificate and key file; no session cache,\n", o.nginxWorkers)
	fmt.Fprintf(w, "          session tickets on in all (one per handshake)\n")
	fmt.Fprintf(w, "load:     Go crypto/tls clients in this process, %d workers in a closed loop; an operation is TCP connect, handshake,\n", o.workers)
	fmt.Fprintf(w, "          close_notify, read until the server closes (so TLS 1.3 tickets are read), close; no HTTP request.\n")
	fmt.Fprintf(w, "          Full rows: the client takes tickets but never offers one. Resumed rows: a session cache per worker, whose\n")
	fmt.Fprintf(w, "          first handshake is full. B/conn: bytes the server sent per connection (handshake, ticket, close_notify)\n")
	fmt.Fprintf(w, "          Negotiated version, suite and group checked on every handshake; the chain verified against the CA on one in %d\n", o.verifyEvery)
	fmt.Fprintf(w, "each row: %v warm-up, then %v (or %d operations); rows of one mode and version run back to back\n", o.warmup, o.duration, o.maxOps)
	fmt.Fprintf(w, "CPU:      user + sys from /proc/PID/stat (1/100 s ticks): the server (nginx: master and workers), keyserverd,\n")
	fmt.Fprintf(w, "          and the load generator; per handshake = its CPU over the window ÷ handshakes completed in the window\n")
	fmt.Fprintf(w, "          (resumed rows: ÷ resumed handshakes). Latency: TCP connect + handshake. Others' cores: the rest of the machine\n")
	if o.quietWait > 0 {
		fmt.Fprintf(w, "shared:   before each row, waited up to %v for other processes to use < %.2f cores\n", o.quietWait, o.quietCores)
	}
	fmt.Fprintln(w)
}

// table writes the rows and returns them with the most CPU other processes used
// during one.
func (b *bench) table(w io.Writer) ([]rowSum, float64) {
	t := benchkit.Table{Header: []string{"server", "TLS", "handshake", "hs/s", "p50 ms", "p99 ms",
		"server CPU ms/hs", "server cores", "keyserverd ms/hs", "load gen ms/hs", "resumed", "B/conn", "errors", "others' cores"}}
	var (
		out      []rowSum
		maxOther float64
		last     string
	)
	for _, r := range b.rows {
		group := tls.VersionName(r.version) + r.mode
		if group != last {
			t.Separator()
			last = group
		}
		rs := rowSum{
			Server: r.srv.id, TLS: tls.VersionName(r.version), Mode: r.mode,
			HandshakesPerS: round(r.rate(), 1), Handshakes: r.handshakes(), ResumedFraction: round(r.resumedFraction(), 4),
			P50Ms: round(ms(r.win.handshakes.Percentile(50)), 3), P99Ms: round(ms(r.win.handshakes.Percentile(99)), 3),
			ServerCPUMs: round(ms(r.serverCPUPerHS()), 4), ServerCores: round(r.cores(clockServer), 2),
			LoadGenCPUMs: round(ms(r.cpuPerHS(clockSelf)), 4), Errors: r.res.Errors, Verified: r.verified,
			OtherCores: round(r.otherCores(), 2),
		}
		if r.win.ops > 0 {
			rs.BytesPerConn = round(float64(r.win.bytes)/float64(r.win.ops), 1)
		}
		if kb, gc, ok := r.scrape.perHandshake(); ok {
			rs.L7AllocKBPerHS, rs.L7GCPer1000HS = ptr(round(kb, 1)), ptr(round(gc, 2))
			if p := r.scrape.procs; p.N > 0 {
				rs.Procs = &p
			}
		}
		ksText := "-"
		if d, ok := r.keyserverCPUPerHS(); ok {
			rs.KeyserverdCPUMs = ptr(round(ms(d), 4))
			ksText = fmt.Sprintf("%.3f", *rs.KeyserverdCPUMs)
		}
		resumed := "-"
		if r.mode == modeResumed {
			resumed = fmt.Sprintf("%.1f%%", 100*r.resumedFraction())
		}
		out = append(out, rs)
		maxOther = max(maxOther, rs.OtherCores)
		t.Row(r.srv.label, strings.TrimPrefix(rs.TLS, "TLS "), r.mode, fmt.Sprintf("%.0f", rs.HandshakesPerS),
			fmt.Sprintf("%.2f", rs.P50Ms), fmt.Sprintf("%.2f", rs.P99Ms), fmt.Sprintf("%.3f", rs.ServerCPUMs),
			fmt.Sprintf("%.2f", rs.ServerCores), ksText, fmt.Sprintf("%.3f", rs.LoadGenCPUMs), resumed, fmt.Sprintf("%.0f", rs.BytesPerConn), rs.Errors,
			fmt.Sprintf("%.2f", rs.OtherCores))
	}
	t.Fprint(w)
	var gcNotes []string
	for _, rs := range out {
		if rs.L7AllocKBPerHS != nil {
			gcNotes = append(gcNotes, fmt.Sprintf("%s %s %s %.0f KB, %.1f GC", rs.Server, strings.TrimPrefix(rs.TLS, "TLS "), rs.Mode, *rs.L7AllocKBPerHS, *rs.L7GCPer1000HS)+rs.Procs.Note())
		}
	}
	if len(gcNotes) > 0 {
		fmt.Fprintf(w, "l7d's Go runtime (its /metrics, warm-up included), allocated per handshake, GC cycles per 1000 handshakes, and GOMAXPROCS as sized to the load:\n")
		for i := 0; i < len(gcNotes); i += 2 {
			fmt.Fprintf(w, "  %s\n", strings.Join(gcNotes[i:min(i+2, len(gcNotes))], "; "))
		}
	}
	for _, r := range b.rows {
		if r.mode == modeResumed && r.win.ops > 0 && r.resumedFraction() < 0.99 {
			fmt.Fprintf(w, "note: %s, %s: only %.1f%% of the handshakes resumed; its CPU per resumed handshake includes the full ones\n",
				r.srv.label, tls.VersionName(r.version), 100*r.resumedFraction())
		}
	}
	if maxOther >= 0.2 {
		fmt.Fprintf(w, "warning: other processes used up to %.2f of the %d cores during a row: the machine was shared, figures are noisy\n",
			maxOther, runtime.NumCPU())
	}
	return out, maxOther
}

func ratioText(r, a, b *float64) string {
	if r == nil {
		return "not measured"
	}
	if a == nil || b == nil {
		return fmt.Sprintf("%.2f", *r)
	}
	return fmt.Sprintf("%.2f = %.3f ÷ %.3f ms", *r, *a, *b)
}

func num(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *v)
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
