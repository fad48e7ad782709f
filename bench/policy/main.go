// Command bench-policy measures the policy stage of the L7 request path and what a
// proxied request costs, in one run:
//
//   - IP blacklists (policy/blacklist), in this process: lookup time with hits and
//     misses, and bytes per entry, at 1M and 10M entries of random IPv4 addresses,
//     random IPv6 addresses, and a mix of both with 100k CIDRs; the time to parse,
//     build and swap in 1M entries (text, binary, Builder); the time to apply a delta
//     of 10k to 1M, and deltas of 10k to 10M until the list has folded them; and the
//     longest single lookup a goroutine saw while lists were swapped, against a
//     control probing as long beside a busy goroutine.
//   - Routing (policy/route), in this process: the time to match a request against
//     1,000 routes (50 virtual hosts of 20 routes: exact, prefix, regular expression,
//     method and header conditions) over a mix of requests.
//   - HTTPS keep-alive proxying (TLS 1.3, HTTP/1.1, 1 KiB responses from one shared
//     backend) through l7d, nginx and haproxy from Debian, each given the same closed
//     loop of keep-alive connections: server CPU time per request from /proc, beside
//     requests per second, latency and the load generator's CPU. Each proxy is driven
//     by this program's own generator and by wrk (Debian), each row saying which.
//     The floor (go-floor, floor.go), the least Go proxy on net and crypto/tls, is
//     measured beside them, for what the runtime, TLS and the kernel cost alone.
//
// It runs bin/l7d, nginx and haproxy (and the backend) as child processes on
// 127.0.0.1, with certificates and configurations in a temporary directory, all
// removed at the end. The last line of its output is one JSON object with the
// headline figures.
//
//	make build && go run ./bench/policy [-duration 5s] [-conns 32]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs the benchmark and returns the exit status: 0 when every phase ran and
// every answer checked out (whether the targets were met or not), 1 when something
// broke, 2 for bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case benchkit.ServeL7dCommand:
			return benchkit.ServeL7d("bench-policy", args[1:], stdout, stderr)
		case serveBackendCommand:
			return serveBackend(args[1:], stderr)
		case serveFloorCommand:
			return serveFloor(args[1:], stderr)
		}
	}
	o := options{out: stdout, log: stderr}
	fs := flag.NewFlagSet("bench-policy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bin, "bin", "bin", "`directory` holding l7d (make build)")
	fs.StringVar(&o.nginx, "nginx", "nginx", "nginx `binary` (Debian package nginx)")
	fs.StringVar(&o.haproxy, "haproxy", "haproxy", "haproxy `binary` (Debian package haproxy)")
	fs.StringVar(&o.wrk, "wrk", "wrk", "wrk `binary` (Debian package wrk)")
	generators := fs.String("generators", strings.Join(generatorNames, ","), "comma-separated load generators of the proxy rows: "+genOwn+" (this program's, Go crypto/tls) and "+genWrk)
	fs.IntVar(&o.wrkThreads, "wrk-threads", 1, "wrk's threads (-t), which share -conns")
	phaseList := fs.String("phases", strings.Join(phaseNames, ","), "comma-separated phases to run (for iterating; the summary needs them all)")
	sizes := fs.String("bl-sizes", "1M,10M", "comma-separated blacklist `sizes` (k and M suffixes); the 1M update figures need 1M")
	fs.IntVar(&o.lookups, "lookups", 10_000_000, "blacklist lookups timed per set and probe kind")
	fs.IntVar(&o.updateRuns, "update-runs", 3, "times each blacklist update is timed (the median is reported)")
	fs.IntVar(&o.stallRounds, "stall-rounds", 5, "rounds of the blacklist updates beside a lookup goroutine, each followed by the control (the stall target compares the medians of the rounds' longest lookups)")
	fs.IntVar(&o.matches, "matches", 5_000_000, "route matches timed over the mix of requests")
	servers := fs.String("servers", strings.Join(serverNames, ","), "comma-separated proxies to measure")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per proxy row")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "warm-up before each proxy row")
	fs.IntVar(&o.conns, "conns", defaultConns, "keep-alive connections of the load, each with one request in flight (closed loop)")
	fs.IntVar(&o.rounds, "rounds", 2, "rounds over the proxies, in alternating order (l7d, nginx, haproxy, then the reverse)")
	fs.IntVar(&o.maxOps, "max-ops", 10_000_000, "end a proxy row early after this many requests")
	fs.DurationVar(&o.opTimeout, "op-timeout", 5*time.Second, "bound on one request, and on connecting")
	fs.IntVar(&o.workers, "workers", runtime.NumCPU(), "nginx worker_processes and haproxy nbthread (l7d sizes GOMAXPROCS to its load, up to the number of cores)")
	fs.StringVar(&o.backend, "backend", backendNginx, "the shared backend: "+backendNginx+" (a fixed answer from nginx) or "+backendGo+" (fasthttp in a child process)")
	fs.IntVar(&o.backendWorkers, "backend-workers", 1, "worker processes of the nginx backend")
	fs.Float64Var(&o.quietCores, "quiet-cores", 0.2, "before each measurement, wait for other processes to use fewer `cores` than this (the machines are shared)")
	fs.DurationVar(&o.quietWait, "quiet-wait", 30*time.Second, "how long to wait for that before measuring anyway (0: do not wait)")
	fs.StringVar(&o.profileDir, "profile", "", "run l7d as a profiling variant (l7d's code in this program, with pprof) and write CPU and allocation profiles of each l7d row to `dir`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench-policy: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var err error
	if o.phases, err = benchkit.ParseList(*phaseList, phaseNames); err != nil {
		fmt.Fprintf(stderr, "bench-policy: -phases: %v\n", err)
		return 2
	}
	if o.servers, err = benchkit.ParseList(*servers, serverNames); err != nil {
		fmt.Fprintf(stderr, "bench-policy: -servers: %v\n", err)
		return 2
	}
	if o.generators, err = benchkit.ParseList(*generators, generatorNames); err != nil {
		fmt.Fprintf(stderr, "bench-policy: -generators: %v\n", err)
		return 2
	}
	if o.blSizes, err = parseSizes(*sizes); err != nil {
		fmt.Fprintf(stderr, "bench-policy: -bl-sizes: %v\n", err)
		return 2
	}
	if o.backend != backendNginx && o.backend != backendGo {
		fmt.Fprintf(stderr, "bench-policy: -backend %q: want %s or %s\n", o.backend, backendNginx, backendGo)
		return 2
	}
	if o.duration <= 0 || o.warmup < 0 || o.conns <= 0 || o.rounds <= 0 || o.maxOps <= 0 || o.opTimeout <= 0 ||
		o.workers <= 0 || o.backendWorkers <= 0 || o.wrkThreads <= 0 || o.wrkThreads > o.conns || o.lookups <= 0 || o.matches <= 0 || o.updateRuns <= 0 || o.stallRounds <= 0 || o.quietWait < 0 {
		fmt.Fprintln(stderr, "bench-policy: -duration, -conns, -rounds, -wrk-threads (at most -conns), -max-ops, -op-timeout, -workers, -backend-workers, -lookups, -matches, -update-runs and -stall-rounds must be positive, -warmup and -quiet-wait not negative")
		return 2
	}

	return benchkit.Main("bench-policy", stderr, func(ctx context.Context) error { return run(ctx, &o) })
}

// maxBlacklistSize bounds -bl-sizes: the sets, their probes and their builders must
// fit this machine's memory several times over.
const maxBlacklistSize = 50_000_000

// parseSizes parses "1M,10M": counts with an optional k (thousand) or M (million)
// suffix, ascending and without repeats.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mul := 1
		switch {
		case strings.HasSuffix(f, "k"), strings.HasSuffix(f, "K"):
			mul, f = 1_000, f[:len(f)-1]
		case strings.HasSuffix(f, "M"), strings.HasSuffix(f, "m"):
			mul, f = 1_000_000, f[:len(f)-1]
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n > maxBlacklistSize/mul {
			return nil, fmt.Errorf("%q is not a size from 1 to %d", f, maxBlacklistSize)
		}
		n *= mul
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("sizes must ascend without repeats: %d after %d", n, out[len(out)-1])
		}
		out = append(out, n)
	}
	return out, nil
}

// sizeName writes a size as -bl-sizes takes it: 1M, 100k, 1500.
func sizeName(n int) string {
	switch {
	case n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n%1_000 == 0:
		return strconv.Itoa(n/1_000) + "k"
	}
	return strconv.Itoa(n)
}
