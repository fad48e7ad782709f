// Command bench-handshake measures, first, the load-shape matrix: the server CPU
// time per connection, each a full TLS 1.3 handshake (RSA-2048, X25519) and one
// HTTPS request answered `200 ok` by the server itself (or no request, the _hs
// shapes), in every shape users bring: one client in sequence; closed loops of 8, 32
// and 256; bursts of -burst (2,000) new connections at once; Poisson arrivals at half
// of nginx's best closed-loop rate. This program's Go clients drive every shape;
// h2load (--h1 -n 2000 -c 2000) drives a burst and `openssl s_time -new -tls1_3` the
// sequential ones, each row naming its generator. The last line gains
// vs_nginx_min and offload_gain_min (the least over the shapes with a request),
// vs_nginx_by_shape and offload_gain_by_shape; l7d-offload's figure is l7d's CPU,
// keyserverd's shown beside it.
//
// In each shape with a request and the sequential ones (-floor) it measures the
// floor in the same run: a least crypto/tls server (this program, standard library
// only, the same key, answer and runtime settings as l7d, one P) with the key local
// and with a least key-server round trip (floor.go); the public-key operations' cost
// in Go and OpenSSL; and each server's CPU per connection split into user, system,
// public-key crypto and the rest, with its threads' context switches, timeslices and
// run-queue wait per connection (sched.go).
// The last line gains floor_by_shape and public_key_crypto.
//
// Then (-classic) it measures the server CPU time of TLS handshakes with an
// RSA-2048 certificate and ECDHE (X25519), TLS 1.3 and TLS 1.2, full (no resumption)
// and resumed (session tickets), from one bounded client load against, in the same
// run: l7d with the private key local, l7d with the key on keyserverd (SoftHSM2), and
// nginx from Debian with the same certificate and key.
//
// Each server's CPU time (user + sys, from /proc; nginx's master and workers together)
// over a measured window is divided by the handshakes completed in it. keyserverd's CPU
// and the load generator's are shown beside it. The headline is L7 CPU per full TLS 1.3
// handshake with the key local ÷ with it offloaded (offload_gain), and nginx's ÷ l7d's
// with it offloaded (vs_nginx).
//
// It runs bin/keyserverd, bin/l7d and nginx as child processes on 127.0.0.1, with keys,
// certificates, a SoftHSM2 token and configurations in a temporary directory, all
// removed at the end. The last line of its output is one JSON object with the headline
// figures.
//
// With -profile DIR, l7d runs as a variant with net/http/pprof (l7d's own code built
// into this program) and a CPU and an allocation profile of every l7d row's window
// land in DIR; -servers may then add go-tls, a plain crypto/tls server, to tell what
// l7d adds to crypto/tls.
//
// After those rows, when -servers has l7d-local, the scrape-cost rows: l7d at a
// paced -scrape-cost-rate (1,000) TLS 1.3 handshakes a second (-scrape-cost-mode,
// resumed by default: the rate fits on two cores beside the load generator, and
// l7d's CPU is the least, so the scrapes' share the largest), in windows without
// and with a scrape of its /metrics each second, alternated; and one scrape's CPU
// measured apart, on the idle l7d. The target of controld's dashboard: under 1% of
// l7d's CPU added.
//
//	make build && go run ./bench/handshake [-duration 5s] [-workers 32]
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// defaultWorkers is the load's concurrency: enough handshakes in flight to keep two
// cores busy through keyserverd's round trips, few enough that the Go runtimes on
// either side do not spend their time switching between them.
const defaultWorkers = 32

// Main runs the benchmark and returns the exit status: 0 when every row ran and every
// handshake checked out (whether the targets were met or not), 1 when something
// broke, 2 for bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case benchkit.ServeL7dCommand:
			return benchkit.ServeL7d("bench-handshake", args[1:], stdout, stderr)
		case serveGoTLSCommand:
			return serveGoTLS(args[1:], stderr)
		case serveFloorCommand:
			return serveFloor(args[1:], stderr)
		case serveFloorSignerCommand:
			return serveFloorSigner(args[1:], stderr)
		}
	}
	o := options{out: stdout, log: stderr}
	fs := flag.NewFlagSet("bench-handshake", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bin, "bin", "bin", "`directory` holding keyserverd and l7d (make build)")
	fs.StringVar(&o.nginx, "nginx", "nginx", "nginx `binary` (Debian package nginx)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per row")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "warm-up before each row")
	fs.IntVar(&o.workers, "workers", defaultWorkers, "handshakes in flight (closed loop)")
	fs.IntVar(&o.maxOps, "max-ops", 1_000_000, "end a row early after this many handshakes")
	fs.DurationVar(&o.opTimeout, "op-timeout", 5*time.Second, "bound on one connection: connect, handshake and close")
	fs.IntVar(&o.verifyEvery, "verify-every", 64, "verify the certificate chain against the CA on one handshake in `n` of each worker (and its first)")
	fs.IntVar(&o.nginxWorkers, "nginx-workers", runtime.NumCPU(), "nginx worker_processes")
	fs.Float64Var(&o.quietCores, "quiet-cores", 0.2, "before each row, wait for other processes to use fewer `cores` than this (the machines are shared)")
	fs.DurationVar(&o.quietWait, "quiet-wait", 30*time.Second, "how long to wait for that before measuring anyway (0: do not wait)")
	servers := fs.String("servers", strings.Join(serverNames, ","), "comma-separated servers to measure (for iterating; the summary needs the first three); "+srvGoTLS+", crypto/tls alone, needs -profile")
	versions := fs.String("tls", "1.3,1.2", "comma-separated TLS versions")
	modes := fs.String("modes", strings.Join(modeNames, ","), "comma-separated handshake modes")
	fs.StringVar(&o.profileDir, "profile", "", "run l7d as a profiling variant (l7d's code in this program, with pprof) and write a CPU profile of each l7d row's window to `dir`")
	fs.Float64Var(&o.scrapeRate, "scrape-cost-rate", 1000, "after the other rows, l7d-local at this many TLS 1.3 `handshakes/s`, its /metrics scraped once a second or not, for what the scrapes cost it (0: not run)")
	fs.StringVar(&o.scrapeMode, "scrape-cost-mode", modeResumed, "handshakes of the scrape-cost rows: resumed (1,000/s fits on two cores beside the load generator; the least l7d CPU, so the largest share for the scrapes) or full")
	fs.IntVar(&o.scrapePairs, "scrape-cost-pairs", 2, "windows of the scrape-cost rows without and with the scrapes, alternated, `n` each")
	l7dEnv := fs.String("l7d-env", "", "comma-separated `NAME=value` environment variables for both l7d (GOMAXPROCS=1, GODEBUG=...: for comparing runtime settings)")
	fs.BoolVar(&o.classic, "classic", true, "also the handshake-only rows at -workers by -tls and -modes, and the scrape-cost rows")
	matrix := fs.String("matrix", "all", "load shapes of the matrix: all, none, or comma-separated names (see the report)")
	fs.BoolVar(&o.floor, "floor", true, "in each shape with a request and the sequential ones, also the floor servers: crypto/tls alone with the key local and with a least key-server round trip (the Go floor l7d's figure is read against)")
	fs.BoolVar(&o.breakdown, "breakdown", true, "sample each matrix row's server with Linux perf (Debian package linux-perf) and report where its CPU goes: kernel, key exchange, TLS, Go's scheduler, allocator and GC, HTTP")
	fs.IntVar(&o.burst, "burst", 2000, "connections of the burst shapes")
	fs.DurationVar(&o.matrixDuration, "matrix-duration", 3*time.Second, "measured time of a matrix row (closed, Poisson, s_time)")
	fs.DurationVar(&o.matrixWarmup, "matrix-warmup", 500*time.Millisecond, "warm-up of a closed-loop matrix row")
	fs.DurationVar(&o.matrixServerWarmup, "matrix-server-warmup", time.Second, fmt.Sprintf("before the matrix, each server's warm-up, not measured: %d clients making full handshakes with a request (0: none)", serverWarmupClients))
	fs.IntVar(&o.matrixRepeat, "matrix-repeat", 2, "rows per shape and server (the figures are their median)")
	fs.DurationVar(&o.matrixQuiet, "matrix-quiet-wait", 3*time.Second, "before each matrix row, wait up to this for a quiet machine (0: do not wait)")
	fs.Float64Var(&o.poissonRate, "poisson-rate", 0, "arrival `rate` of the Poisson shapes; 0: half of nginx's best closed-loop rate with a request in this run")
	fs.IntVar(&o.poissonMaxInFlight, "poisson-max-in-flight", 2000, "connections in flight at most in the Poisson shapes (arrivals past it are dropped and counted)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench-handshake: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var err error
	if o.burst <= 0 || o.matrixDuration <= 0 || o.matrixWarmup < 0 || o.matrixServerWarmup < 0 || o.matrixRepeat <= 0 || o.matrixQuiet < 0 || o.poissonRate < 0 || o.poissonMaxInFlight <= 0 {
		fmt.Fprintln(stderr, "bench-handshake: -burst, -matrix-duration, -matrix-repeat and -poisson-max-in-flight must be positive, -matrix-warmup, -matrix-server-warmup, -matrix-quiet-wait and -poisson-rate not negative")
		return 2
	}
	if *l7dEnv != "" {
		o.l7dEnv = strings.Split(*l7dEnv, ",")
	}
	if o.matrix, err = parseShapes(*matrix, matrixShapes(o.burst)); err != nil {
		fmt.Fprintf(stderr, "bench-handshake: -matrix: %v\n", err)
		return 2
	}
	if o.servers, err = benchkit.ParseList(*servers, append(serverNames, srvGoTLS)); err != nil {
		fmt.Fprintf(stderr, "bench-handshake: -servers: %v\n", err)
		return 2
	}
	if slices.Contains(o.servers, srvGoTLS) && o.profileDir == "" {
		fmt.Fprintf(stderr, "bench-handshake: -servers %s is a profiling baseline: it needs -profile\n", srvGoTLS)
		return 2
	}
	if o.scrapeMode != modeFull && o.scrapeMode != modeResumed {
		fmt.Fprintf(stderr, "bench-handshake: -scrape-cost-mode %q: want full or resumed\n", o.scrapeMode)
		return 2
	}
	if o.modes, err = benchkit.ParseList(*modes, modeNames); err != nil {
		fmt.Fprintf(stderr, "bench-handshake: -modes: %v\n", err)
		return 2
	}
	if o.versions, err = parseVersions(*versions); err != nil {
		fmt.Fprintf(stderr, "bench-handshake: -tls: %v\n", err)
		return 2
	}
	if o.duration <= 0 || o.warmup < 0 || o.workers <= 0 || o.maxOps <= 0 || o.opTimeout <= 0 ||
		o.verifyEvery <= 0 || o.nginxWorkers <= 0 || o.quietWait < 0 || o.scrapeRate < 0 || o.scrapePairs <= 0 {
		fmt.Fprintln(stderr, "bench-handshake: -duration, -workers, -max-ops, -op-timeout, -verify-every, -nginx-workers and -scrape-cost-pairs must be positive, -warmup, -quiet-wait and -scrape-cost-rate not negative")
		return 2
	}

	return benchkit.Main("bench-handshake", stderr, func(ctx context.Context) error { return run(ctx, &o) })
}

// parseVersions parses "1.3,1.2", keeping the order given.
func parseVersions(s string) ([]uint16, error) {
	var out []uint16
	for _, f := range strings.Split(s, ",") {
		var v uint16
		switch strings.TrimSpace(f) {
		case "1.3":
			v = tls.VersionTLS13
		case "1.2":
			v = tls.VersionTLS12
		default:
			return nil, fmt.Errorf("%q: want 1.3 or 1.2", f)
		}
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("%q given twice", f)
		}
		out = append(out, v)
	}
	return out, nil
}
