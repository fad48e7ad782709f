package main

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// Targets from the issue. They are reported, never tuned for.
const (
	targetOverhead = 0.85 // keyserverd + SoftHSM at its best level ÷ PKCS#11 direct
	targetTailMul  = 5.0  // p99 ÷ p50 at tailLevel in flight, at most
	tailLevel      = 256
)

// summary is the last line of the output. The first six fields are the headline
// figures the issue asks for.
type summary struct {
	KeyserverSignsPerS float64   `json:"keyserver_rsa2048_signs_per_s"`
	PKCS11DirectPerS   float64   `json:"pkcs11_direct_rsa2048_signs_per_s"`
	OpenSSLSignsPerS   float64   `json:"openssl_rsa2048_signs_per_s"`
	OverheadRatio      float64   `json:"overhead_ratio"`
	P50MsAt256         *float64  `json:"p50_ms_at_256"`
	P99MsAt256         *float64  `json:"p99_ms_at_256"`
	OverheadTargetMet  bool      `json:"overhead_target_met"`
	TailTargetMet      *bool     `json:"p99_target_met"`
	KeyserverBestAt    int       `json:"keyserver_best_in_flight"`
	PKCS11DirectRuns   []float64 `json:"pkcs11_direct_runs_signs_per_s"`

	// CPU per signature: the overhead as the machine's work rather than its
	// throughput, which a shared machine disturbs less.
	KeyserverCPUUs    float64 `json:"keyserver_cpu_us_per_sign"`
	PKCS11DirectCPUUs float64 `json:"pkcs11_direct_cpu_us_per_sign"`
	CPUOverheadRatio  float64 `json:"cpu_overhead_ratio"`

	KeyserverVsOpenSSL float64 `json:"keyserver_vs_openssl_ratio"`
	PKCS11VsOpenSSL    float64 `json:"pkcs11_direct_vs_openssl_ratio"`

	SoftwareKeyserver    float64   `json:"software_keyserver_rsa2048_signs_per_s"`
	SoftwareKeyserverAt  int       `json:"software_keyserver_best_in_flight"`
	SoftwareDirect       float64   `json:"software_direct_rsa2048_signs_per_s"`
	SoftwareDirectRuns   []float64 `json:"software_direct_runs_signs_per_s"`
	SoftwareOverhead     float64   `json:"software_overhead_ratio"`
	SoftwareVsSoftHSM    float64   `json:"software_vs_softhsm_keyserver_ratio"`
	SoftwareVsSoftHSMDir float64   `json:"software_vs_softhsm_direct_ratio"`
	SoftwareP50MsAt256   *float64  `json:"software_p50_ms_at_256"`
	SoftwareP99MsAt256   *float64  `json:"software_p99_ms_at_256"`

	Sessions      int      `json:"pkcs11_sessions"`
	Cores         int      `json:"cores"`
	GOMAXPROCS    int      `json:"gomaxprocs"`
	MaxOtherCores float64  `json:"max_other_processes_cores"`
	DurationS     float64  `json:"duration_s"`
	InProcess     bool     `json:"in_process_keyserver"`
	Failures      []string `json:"failures"`
	Levels        []level  `json:"levels"`
}

// level is one row of the table.
type level struct {
	Config          string   `json:"config"`
	InFlight        int      `json:"in_flight"`
	SignsPerS       float64  `json:"signs_per_s"`
	P50Ms           float64  `json:"p50_ms"`
	P99Ms           float64  `json:"p99_ms"`
	Errors          int      `json:"errors"`
	Verified        int64    `json:"verified"`
	KeyserverdCPUUs *float64 `json:"keyserverd_cpu_us_per_sign,omitempty"`
	BenchCPUUs      float64  `json:"bench_cpu_us_per_sign"`
	CoresBusy       float64  `json:"cores_busy"`
	OtherCores      float64  `json:"other_processes_cores"`
}

func round(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round(a/b, 3)
}

func us(d time.Duration) float64 { return round(float64(d)/float64(time.Microsecond), 1) }

func ms(d time.Duration) float64 { return round(benchkit.Ms(d), 3) }

func (r *row) label() string {
	if r.note == "" {
		return r.config
	}
	return r.config + ", " + r.note
}

func (r *row) rate() float64 {
	if r == nil {
		return 0
	}
	return r.res.Rate()
}

// best returns the row of config with the highest rate.
func (b *bench) best(config string) *row {
	var out *row
	for _, r := range b.rows {
		if r.config == config && (out == nil || r.res.Rate() > out.res.Rate()) {
			out = r
		}
	}
	return out
}

func (b *bench) at(config string, inFlight int) *row {
	for _, r := range b.rows {
		if r.config == config && r.inFlight == inFlight {
			return r
		}
	}
	return nil
}

// baseline is the mean of the runs of an in-process configuration (before and after
// the keyserverd phase it frames).
type baseline struct {
	rate, cpuUs float64
	runs        []float64
}

func (b *bench) baseline(config string) baseline {
	var bl baseline
	var cpu float64
	for _, r := range b.rows {
		if r.config == config {
			bl.runs = append(bl.runs, round(r.rate(), 1))
			bl.rate += r.rate()
			cpu += us(r.cpuPerSign())
		}
	}
	if n := float64(len(bl.runs)); n > 0 {
		bl.rate, bl.cpuUs = bl.rate/n, round(cpu/n, 1)
	}
	return bl
}

// spread is how far apart the runs are, relative to their mean.
func (bl baseline) spread() float64 {
	if len(bl.runs) < 2 || bl.rate == 0 {
		return 0
	}
	lo, hi := bl.runs[0], bl.runs[0]
	for _, v := range bl.runs {
		lo, hi = min(lo, v), max(hi, v)
	}
	return (hi - lo) / bl.rate
}

func (b *bench) report() {
	o := b.o
	ksPKCS11, ksSoft := cfgKSPKCS11, cfgKSSoftware
	if o.inProcess {
		ksPKCS11 += " (in-process)"
		ksSoft += " (in-process)"
	}
	w := o.out
	b.header(w)
	levels, maxOther := b.table(w)

	s := summary{
		Sessions: b.f.sessions, Cores: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		MaxOtherCores: maxOther, DurationS: o.duration.Seconds(), InProcess: o.inProcess,
		Failures: b.Failures, Levels: levels,
	}
	if s.Failures == nil {
		s.Failures = []string{}
	}
	bestKS, direct := b.best(ksPKCS11), b.baseline(cfgPKCS11Direct)
	s.KeyserverSignsPerS = round(bestKS.rate(), 1)
	s.PKCS11DirectPerS = round(direct.rate, 1)
	s.PKCS11DirectRuns = direct.runs
	if b.openssl != nil {
		s.OpenSSLSignsPerS = round(b.openssl.SignPerSec, 1)
	}
	s.OverheadRatio = ratio(bestKS.rate(), direct.rate)
	s.OverheadTargetMet = s.OverheadRatio >= targetOverhead
	if bestKS != nil {
		s.KeyserverBestAt = bestKS.inFlight
		s.KeyserverCPUUs = us(bestKS.cpuPerSign())
		s.PKCS11DirectCPUUs = direct.cpuUs
		s.CPUOverheadRatio = ratio(s.PKCS11DirectCPUUs, s.KeyserverCPUUs)
	}
	s.KeyserverVsOpenSSL = ratio(bestKS.rate(), s.OpenSSLSignsPerS)
	s.PKCS11VsOpenSSL = ratio(direct.rate, s.OpenSSLSignsPerS)

	bestSoft, softDirect := b.best(ksSoft), b.baseline(cfgSoftDirect)
	s.SoftwareKeyserver = round(bestSoft.rate(), 1)
	if bestSoft != nil {
		s.SoftwareKeyserverAt = bestSoft.inFlight
	}
	s.SoftwareDirect = round(softDirect.rate, 1)
	s.SoftwareDirectRuns = softDirect.runs
	s.SoftwareOverhead = ratio(bestSoft.rate(), softDirect.rate)
	s.SoftwareVsSoftHSM = ratio(bestSoft.rate(), bestKS.rate())
	s.SoftwareVsSoftHSMDir = ratio(softDirect.rate, direct.rate)

	tt := benchkit.Table{Header: []string{"target", "measured", "result"}}
	tt.Row(fmt.Sprintf("keyserverd + SoftHSM ÷ PKCS#11 direct ≥ %.2f", targetOverhead),
		fmt.Sprintf("%.3f = %.1f (at %d in flight) ÷ %.1f", s.OverheadRatio, s.KeyserverSignsPerS, s.KeyserverBestAt, s.PKCS11DirectPerS),
		passMiss(s.OverheadTargetMet))
	tailName := fmt.Sprintf("p99 ≤ %.0f × p50 at %d in flight (SoftHSM)", targetTailMul, tailLevel)
	if r := b.at(ksPKCS11, tailLevel); r != nil {
		p50, p99 := ms(r.res.Latencies.Percentile(50)), ms(r.res.Latencies.Percentile(99))
		met := p50 > 0 && p99 <= targetTailMul*p50
		s.P50MsAt256, s.P99MsAt256, s.TailTargetMet = &p50, &p99, &met
		tt.Row(tailName, fmt.Sprintf("%.3f ms = %.2f × %.3f ms", p99, ratio(p99, p50), p50), passMiss(met))
	} else {
		tt.Row(tailName, "not measured (-levels)", "-")
	}
	if r := b.at(ksSoft, tailLevel); r != nil {
		p50, p99 := ms(r.res.Latencies.Percentile(50)), ms(r.res.Latencies.Percentile(99))
		s.SoftwareP50MsAt256, s.SoftwareP99MsAt256 = &p50, &p99
	}
	fmt.Fprintln(w)
	tt.Fprint(w)
	fmt.Fprintln(w)

	if bestSoft != nil && bestKS != nil {
		fmt.Fprintf(w, "software backend vs SoftHSM on the same key: through keyserverd %.1f vs %.1f signs/s (best levels): software %s;\n"+
			"  in-process %.1f vs %.1f signs/s: software %s\n",
			bestSoft.rate(), bestKS.rate(), beats(bestSoft.rate(), bestKS.rate()),
			softDirect.rate, direct.rate, beats(softDirect.rate, direct.rate))
	}
	if bestKS != nil && direct.rate > 0 {
		line := fmt.Sprintf("CPU per signature: PKCS#11 direct %.1f µs; keyserverd + SoftHSM at %d in flight %.1f µs",
			s.PKCS11DirectCPUUs, bestKS.inFlight, s.KeyserverCPUUs)
		if bestKS.serverCPU {
			line += fmt.Sprintf(" (keyserverd %.1f + client %.1f)", us(bestKS.res.CPUPerOp(clockServer)), us(bestKS.res.CPUPerOp(clockSelf)))
		}
		fmt.Fprintf(w, "%s: direct ÷ keyserverd = %.3f\n", line, s.CPUOverheadRatio)
	}
	for _, bl := range []struct {
		name string
		b    baseline
	}{{cfgPKCS11Direct, direct}, {cfgSoftDirect, softDirect}} {
		if len(bl.b.runs) > 1 {
			fmt.Fprintf(w, "baseline drift: %s %v signs/s before and after its keyserverd phase (%.0f%% apart); their mean is used\n",
				bl.name, bl.b.runs, 100*bl.b.spread())
		}
	}
	if b.openssl != nil && bestKS != nil {
		fmt.Fprintf(w, "vs openssl speed: keyserverd + SoftHSM %.0f%%, PKCS#11 direct %.0f%% (%.1f and %.1f signs/s per core vs %.1f)\n",
			100*s.KeyserverVsOpenSSL, 100*s.PKCS11VsOpenSSL, s.KeyserverSignsPerS/float64(s.Cores),
			s.PKCS11DirectPerS/float64(s.Cores), s.OpenSSLSignsPerS/float64(s.Cores))
	}
	benchkit.WriteReportEnd(w, b.Failures, s)
}

// header describes the set-up.
func (b *bench) header(w io.Writer) {
	o, f := b.o, b.f
	server := "bin/keyserverd process"
	if o.inProcess {
		server = "keyserver library inside this process (-inprocess)"
	}
	fmt.Fprintf(w, "\nkeyserver benchmark: RSA-2048 PKCS #1 v1.5 signatures over SHA-256 digests\n")
	fmt.Fprintf(w, "machine:    %d CPUs, GOMAXPROCS %d, %s/%s, %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version())
	if b.openssl != nil {
		fmt.Fprintf(w, ", %s", b.openssl.OpenSSLVersion)
	}
	fmt.Fprintf(w, "\nkeyserver:  %s on 127.0.0.1, mutual TLS 1.3; keyserver/client with %d connections, request timeout %v\n",
		server, clientConns, o.requestTimeout)
	how := "4 × GOMAXPROCS, keyserverd's default"
	if f.sessions != 4*runtime.GOMAXPROCS(0) {
		how = "-sessions"
	}
	fmt.Fprintf(w, "PKCS#11:    SoftHSM2 (%s), %d operation sessions (%s) set in keyserverd and in the direct run (%d goroutines)\n",
		f.tok.Module, f.sessions, how, 2*f.sessions)
	fmt.Fprintf(w, "software:   keyserverd `software: {files: [key.pem]}`; direct = crypto/rsa on the parsed key, GOMAXPROCS goroutines\n")
	fmt.Fprintf(w, "each row:   %v warm-up, then %v or %d signatures; one signature in %d of each worker (and its first) verified with crypto/rsa\n",
		o.warmup, o.duration, o.maxOps, o.verifyEvery)
	fmt.Fprintf(w, "CPU:        µs of CPU per signature, keyserverd's from /proc/PID/stat (1/100 s ticks), this process's from getrusage;\n")
	fmt.Fprintf(w, "            cores busy = both together ÷ wall time; others' cores = every other process on the machine (/proc/stat)\n")
	if o.quietWait > 0 {
		fmt.Fprintf(w, "shared:     before each row, waited up to %v for other processes to use < %.2f cores\n", o.quietWait, o.quietCores)
	}
	fmt.Fprintln(w)
}

// table writes the measurements and returns them with the most CPU other processes
// used during one.
func (b *bench) table(w io.Writer) ([]level, float64) {
	t := benchkit.Table{Header: []string{"configuration", "in flight", "signs/s", "p50 ms", "p99 ms", "errors",
		"keyserverd CPU µs/sign", "bench CPU µs/sign", "cores busy", "others' cores"}}
	if r := b.openssl; r != nil {
		t.Row(r.Command, strconv.Itoa(runtime.NumCPU())+" procs", fmt.Sprintf("%.1f", r.SignPerSec), "-", "-", "-", "-", "-", "-", "-")
	}
	var (
		last     string
		levels   []level
		maxOther float64
	)
	for _, r := range b.rows {
		if r.label() != last {
			t.Separator()
			last = r.label()
		}
		res := r.res
		lv := level{
			Config: r.label(), InFlight: r.inFlight, SignsPerS: round(res.Rate(), 1),
			P50Ms: ms(res.Latencies.Percentile(50)), P99Ms: ms(res.Latencies.Percentile(99)),
			Errors: res.Errors, Verified: r.verified, BenchCPUUs: us(res.CPUPerOp(clockSelf)),
			CoresBusy: round(r.ourCores(), 2), OtherCores: round(r.otherCores(), 2),
		}
		ksCPU := "-"
		if r.serverCPU {
			v := us(res.CPUPerOp(clockServer))
			lv.KeyserverdCPUUs = &v
			ksCPU = fmt.Sprintf("%.1f", v)
		}
		levels = append(levels, lv)
		maxOther = max(maxOther, lv.OtherCores)
		t.Row(lv.Config, lv.InFlight, fmt.Sprintf("%.1f", lv.SignsPerS), fmt.Sprintf("%.3f", lv.P50Ms), fmt.Sprintf("%.3f", lv.P99Ms),
			lv.Errors, ksCPU, fmt.Sprintf("%.1f", lv.BenchCPUUs), fmt.Sprintf("%.2f", lv.CoresBusy), fmt.Sprintf("%.2f", lv.OtherCores))
	}
	t.Fprint(w)
	if maxOther >= 0.2 {
		fmt.Fprintf(w, "warning: other processes used up to %.2f of the %d cores during a measurement: the machine was shared, figures are noisy\n",
			maxOther, runtime.NumCPU())
	}
	return levels, maxOther
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// beats says whether a beats b, and by how much.
func beats(a, b float64) string {
	switch {
	case b == 0 || a == 0:
		return "not measured"
	case a >= b:
		return fmt.Sprintf("beats SoftHSM by %.2f× (+%.0f%%)", a/b, 100*(a/b-1))
	}
	return fmt.Sprintf("does not beat SoftHSM: %.2f× (%.0f%%)", a/b, 100*(a/b-1))
}
