package main

import (
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"time"

	"github.com/tiergate/tiergate/integration/benchkit"
)

// Targets from the issue. They are reported, never tuned for.
const (
	targetOverhead = 0.85 // keyserverd + SoftHSM ÷ PKCS#11 direct, at its best level
	targetTailMul  = 5.0  // p99 ÷ p50 at 256 in flight, at most
	tailLevel      = 256
)

// summary is the last line of the output. The first six fields are the headline
// figures the issue asks for.
type summary struct {
	KeyserverSignsPerS   float64  `json:"keyserver_rsa2048_signs_per_s"`
	PKCS11DirectPerS     float64  `json:"pkcs11_direct_rsa2048_signs_per_s"`
	OpenSSLSignsPerS     float64  `json:"openssl_rsa2048_signs_per_s"`
	OverheadRatio        float64  `json:"overhead_ratio"`
	P50MsAt256           *float64 `json:"p50_ms_at_256"`
	P99MsAt256           *float64 `json:"p99_ms_at_256"`
	KeyserverBestAt      int      `json:"keyserver_best_in_flight"`
	CPUOverheadRatio     float64  `json:"cpu_overhead_ratio"`
	KeyserverCPUUs       float64  `json:"keyserver_cpu_us_per_sign"`
	PKCS11DirectCPUUs    float64  `json:"pkcs11_direct_cpu_us_per_sign"`
	KeyserverVsOpenSSL   float64  `json:"keyserver_vs_openssl_ratio"`
	PKCS11VsOpenSSL      float64  `json:"pkcs11_direct_vs_openssl_ratio"`
	SoftwareKeyserver    float64  `json:"software_keyserver_rsa2048_signs_per_s"`
	SoftwareDirect       float64  `json:"software_direct_rsa2048_signs_per_s"`
	SoftwareOverhead     float64  `json:"software_overhead_ratio"`
	SoftwareVsSoftHSM    float64  `json:"software_vs_softhsm_keyserver_ratio"`
	SoftwareVsSoftHSMDir float64  `json:"software_vs_softhsm_direct_ratio"`
	OverheadTargetMet    bool     `json:"overhead_target_met"`
	TailTargetMet        *bool    `json:"p99_target_met"`
	Sessions             int      `json:"pkcs11_sessions"`
	Cores                int      `json:"cores"`
	MaxOtherCores        float64  `json:"max_other_processes_cores"`
	GOMAXPROCS           int      `json:"gomaxprocs"`
	DurationS            float64  `json:"duration_s"`
	InProcess            bool     `json:"in_process_keyserver"`
	Failures             []string `json:"failures"`
	Levels               []level  `json:"levels"`
}

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

func rate(r *row) float64 {
	if r == nil {
		return 0
	}
	return r.res.Rate()
}

func (b *bench) report() {
	o, f := b.o, b.f
	ksPKCS11, ksSoft := cfgKSPKCS11, cfgKSSoftware
	server := "bin/keyserverd process"
	if o.inProcess {
		ksPKCS11 += " (in-process)"
		ksSoft += " (in-process)"
		server = "keyserver library inside this process (-inprocess)"
	}
	w := o.out
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
	fmt.Fprintf(w, "each row:   %v warm-up, then %v or %d signatures; one signature in %d of each worker (and its first) verified with crypto/rsa\n",
		o.warmup, o.duration, o.maxOps, o.verifyEvery)
	fmt.Fprintf(w, "CPU:        µs of CPU per signature, keyserverd's from /proc/PID/stat (1/100 s ticks), this process's from getrusage;\n")
	fmt.Fprintf(w, "            cores busy = both together ÷ wall time; others' cores = every other process on the machine (/proc/stat)\n")
	if o.quietWait > 0 {
		fmt.Fprintf(w, "shared machine: each row first waited up to %v for other processes to use < %.2f cores\n", o.quietWait, o.quietCores)
	}
	fmt.Fprintln(w)

	t := benchkit.Table{Header: []string{"configuration", "in flight", "signs/s", "p50 ms", "p99 ms", "errors",
		"keyserverd CPU µs/sign", "bench CPU µs/sign", "cores busy", "others' cores"}}
	if r := b.openssl; r != nil {
		t.Row(r.Command, strconv.Itoa(runtime.NumCPU())+" procs", fmt.Sprintf("%.1f", r.SignPerSec), "-", "-", "-", "-", "-", "-", "-")
	}
	last := ""
	var levels []level
	var maxOther float64
	for _, r := range b.rows {
		if r.config != last {
			t.Separator()
			last = r.config
		}
		res := r.res
		lv := level{
			Config: r.config, InFlight: r.inFlight, SignsPerS: round(res.Rate(), 1),
			P50Ms: round(benchkit.Ms(res.Latencies.Percentile(50)), 3), P99Ms: round(benchkit.Ms(res.Latencies.Percentile(99)), 3),
			Errors: res.Errors, Verified: r.verified, BenchCPUUs: us(res.CPUPerOp(clockSelf)),
		}
		ksCPU := "-"
		lv.CoresBusy, lv.OtherCores = round(r.ourCores(), 2), round(r.otherCores(), 2)
		if r.serverCPU {
			v := us(res.CPUPerOp(clockServer))
			lv.KeyserverdCPUUs = &v
			ksCPU = fmt.Sprintf("%.1f", v)
		}
		levels = append(levels, lv)
		t.Row(r.config, r.inFlight, fmt.Sprintf("%.1f", lv.SignsPerS), fmt.Sprintf("%.3f", lv.P50Ms), fmt.Sprintf("%.3f", lv.P99Ms),
			lv.Errors, ksCPU, fmt.Sprintf("%.1f", lv.BenchCPUUs), fmt.Sprintf("%.2f", lv.CoresBusy), fmt.Sprintf("%.2f", lv.OtherCores))
		maxOther = max(maxOther, lv.OtherCores)
	}
	t.Fprint(w)
	if maxOther >= 0.2 {
		fmt.Fprintf(w, "warning: other processes used up to %.2f of the %d cores during a measurement: the machine was shared, figures are noisy\n",
			maxOther, runtime.NumCPU())
	}

	s := summary{
		Sessions: f.sessions, Cores: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		DurationS: o.duration.Seconds(), InProcess: o.inProcess, Failures: b.failures, Levels: levels,
		MaxOtherCores: maxOther,
	}
	if s.Failures == nil {
		s.Failures = []string{}
	}
	bestKS := b.best(ksPKCS11)
	direct := b.best(cfgPKCS11Direct)
	s.KeyserverSignsPerS = round(rate(bestKS), 1)
	if bestKS != nil {
		s.KeyserverBestAt = bestKS.inFlight
	}
	s.PKCS11DirectPerS = round(rate(direct), 1)
	if b.openssl != nil {
		s.OpenSSLSignsPerS = round(b.openssl.SignPerSec, 1)
	}
	s.OverheadRatio = ratio(rate(bestKS), rate(direct))
	if bestKS != nil && direct != nil {
		s.KeyserverCPUUs, s.PKCS11DirectCPUUs = us(bestKS.cpuPerSign()), us(direct.cpuPerSign())
		s.CPUOverheadRatio = ratio(s.PKCS11DirectCPUUs, s.KeyserverCPUUs)
	}
	s.KeyserverVsOpenSSL = ratio(rate(bestKS), s.OpenSSLSignsPerS)
	s.PKCS11VsOpenSSL = ratio(rate(direct), s.OpenSSLSignsPerS)
	bestSoft, softDirect := b.best(ksSoft), b.best(cfgSoftDirect)
	s.SoftwareKeyserver = round(rate(bestSoft), 1)
	s.SoftwareDirect = round(rate(softDirect), 1)
	s.SoftwareOverhead = ratio(rate(bestSoft), rate(softDirect))
	s.SoftwareVsSoftHSM = ratio(rate(bestSoft), rate(bestKS))
	s.SoftwareVsSoftHSMDir = ratio(rate(softDirect), rate(direct))
	s.OverheadTargetMet = s.OverheadRatio >= targetOverhead

	tt := benchkit.Table{Header: []string{"target", "measured", "result"}}
	tt.Row(fmt.Sprintf("keyserverd + SoftHSM ÷ PKCS#11 direct ≥ %.2f", targetOverhead),
		fmt.Sprintf("%.3f (%.1f at %d in flight ÷ %.1f)", s.OverheadRatio, s.KeyserverSignsPerS, s.KeyserverBestAt, s.PKCS11DirectPerS),
		passMiss(s.OverheadTargetMet))
	if r := b.at(ksPKCS11, tailLevel); r != nil {
		p50 := round(benchkit.Ms(r.res.Latencies.Percentile(50)), 3)
		p99 := round(benchkit.Ms(r.res.Latencies.Percentile(99)), 3)
		met := p50 > 0 && p99 <= targetTailMul*p50
		s.P50MsAt256, s.P99MsAt256, s.TailTargetMet = &p50, &p99, &met
		tt.Row(fmt.Sprintf("p99 ≤ %.0f × p50 at %d in flight (SoftHSM)", targetTailMul, tailLevel),
			fmt.Sprintf("%.3f ms = %.2f × %.3f ms", p99, ratio(p99, p50), p50), passMiss(met))
	} else {
		tt.Row(fmt.Sprintf("p99 ≤ %.0f × p50 at %d in flight (SoftHSM)", targetTailMul, tailLevel), "not measured (-levels)", "-")
	}
	fmt.Fprintln(w)
	tt.Fprint(w)

	fmt.Fprintln(w)
	if bestSoft != nil && bestKS != nil {
		fmt.Fprintf(w, "software backend vs SoftHSM on the same key: through keyserverd %.1f vs %.1f signs/s: software %s; direct %.1f vs %.1f signs/s: software %s\n",
			rate(bestSoft), rate(bestKS), beats(rate(bestSoft), rate(bestKS)),
			rate(softDirect), rate(direct), beats(rate(softDirect), rate(direct)))
	}
	if bestKS != nil && direct != nil {
		fmt.Fprintf(w, "CPU per signature: PKCS#11 direct %.1f µs; keyserverd + SoftHSM at %d in flight %.1f µs (keyserverd %.1f + client %.1f): direct ÷ keyserverd = %.3f\n",
			s.PKCS11DirectCPUUs, bestKS.inFlight, s.KeyserverCPUUs, us(bestKS.res.CPUPerOp(clockServer)), us(bestKS.res.CPUPerOp(clockSelf)), s.CPUOverheadRatio)
	}
	if b.openssl != nil && bestKS != nil {
		fmt.Fprintf(w, "keyserverd + SoftHSM reaches %.0f%% of openssl speed (%.1f signs/s per core vs %.1f); PKCS#11 direct %.0f%%\n",
			100*s.KeyserverVsOpenSSL, s.KeyserverSignsPerS/float64(runtime.NumCPU()), s.OpenSSLSignsPerS/float64(runtime.NumCPU()),
			100*s.PKCS11VsOpenSSL)
	}
	if len(b.failures) > 0 {
		fmt.Fprintf(w, "FAILURES (%d):\n", len(b.failures))
		for _, m := range b.failures {
			fmt.Fprintf(w, "  %s\n", m)
		}
	}
	js, _ := json.Marshal(s)
	fmt.Fprintf(w, "%s\n", js)
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// beats says by how much a beats b.
func beats(a, b float64) string {
	switch {
	case b == 0 || a == 0:
		return "not measured"
	case a >= b:
		return fmt.Sprintf("beats SoftHSM by %.2f× (+%.0f%%)", a/b, 100*(a/b-1))
	}
	return fmt.Sprintf("is slower than SoftHSM: %.2f× (%.0f%%)", a/b, 100*(a/b-1))
}
