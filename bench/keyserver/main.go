// Command bench-keyserver measures RSA-2048 signatures per second, and their latency,
// through keyserverd (mutual TLS, the wire protocol, keyserver/client) with the
// SoftHSM2 and software backends at several request counts in flight, against the
// same key signing in-process through PKCS#11 and crypto/rsa, and against `openssl
// speed` on the same machine.
//
// It runs bin/keyserverd as a child process on 127.0.0.1 with a SoftHSM2 token, keys
// and certificates it creates in a temporary directory, all removed at the end. The
// last line of its output is one JSON object with the headline figures.
//
//	make build && go run ./bench/keyserver [-duration 5s] [-bin bin]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs the benchmark and returns the exit status: 0 when every phase ran and every
// signature checked out (whether the targets were met or not), 1 when something broke,
// 2 for bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	o := options{out: stdout, log: stderr}
	fs := flag.NewFlagSet("bench-keyserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bin, "bin", "bin", "`directory` holding keyserverd (make build)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per configuration and in-flight level")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "warm-up before each measurement")
	fs.IntVar(&o.maxOps, "max-ops", 1_000_000, "end a measurement early after this many signatures")
	levels := fs.String("levels", "1,16,256,1024", "comma-separated `counts` of requests in flight through keyserverd")
	fs.IntVar(&o.verifyEvery, "verify-every", 32, "verify one signature in `n` of each worker with crypto/rsa (and each worker's first)")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 10*time.Second,
		"keyserver client RequestTimeout; the whole request gets 3× this (generous, so that queueing at 1024 in flight is measured, not cut off)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write CPU profiles of this process during the keyserverd phases to `prefix`-pkcs11.pprof and prefix-software.pprof")
	fs.BoolVar(&o.inProcess, "inprocess", false, "run the keyserver inside this process instead of bin/keyserverd (for profiling both sides in one profile)")
	phaseList := fs.String("phases", strings.Join(phaseNames, ","), "comma-separated phases to run (for iterating; the summary needs them all)")
	fs.IntVar(&o.sessions, "sessions", 0, "PKCS#11 operation sessions in keyserverd and in the direct run (default 4 × GOMAXPROCS, keyserverd's own default)")
	fs.Float64Var(&o.quietCores, "quiet-cores", 0.2, "before each measurement, wait for other processes to use fewer `cores` than this (the machines are shared)")
	fs.DurationVar(&o.quietWait, "quiet-wait", 30*time.Second, "how long to wait for that before measuring anyway (0: do not wait)")
	fs.IntVar(&o.opensslSeconds, "openssl-seconds", 0, "seconds for openssl speed (default: -duration rounded up)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench-keyserver: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var err error
	if o.levels, err = parseLevels(*levels); err != nil {
		fmt.Fprintf(stderr, "bench-keyserver: -levels: %v\n", err)
		return 2
	}
	if o.phases, err = parsePhases(*phaseList); err != nil {
		fmt.Fprintf(stderr, "bench-keyserver: -phases: %v\n", err)
		return 2
	}
	if o.duration <= 0 || o.warmup < 0 || o.maxOps <= 0 || o.verifyEvery <= 0 || o.requestTimeout <= 0 || o.sessions < 0 || o.quietWait < 0 {
		fmt.Fprintln(stderr, "bench-keyserver: -duration, -max-ops, -verify-every and -request-timeout must be positive, -warmup not negative")
		return 2
	}
	if o.opensslSeconds <= 0 {
		o.opensslSeconds = int((o.duration + time.Second - 1) / time.Second)
	}

	return benchkit.Main("bench-keyserver", stderr, func(ctx context.Context) error { return run(ctx, &o) })
}

func parseLevels(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parsePhases(s string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(phaseNames, f) {
			return nil, fmt.Errorf("unknown phase %q (known: %s)", f, strings.Join(phaseNames, ", "))
		}
		out[f] = true
	}
	return out, nil
}
