// Command bench-blacklist measures how fast a blacklist pushed to controld reaches
// every node, what it costs in the store, and what a list in force costs l4d's
// datapath.
//
// Phases, in one run:
//
//   - l4: `go run ./bench/l4` limited to the rows this benchmark reports (its
//     connection-table phase shrunk with -table, no veth), whose last JSON line
//     gives l4_mpps_with_1m_blacklist_ratio: one datapath worker's
//     established-flow rate with a 1M-entry IPv4 blacklist in force against none,
//     in rounds on the same flows (bench-l4's in-memory ports, and DPDK net_ring
//     when it runs; it says which it reports).
//   - push: real processes from -bin (make build), started by testkit/cluster:
//     controld on its embedded etcd, two keyserverd and two l7d fed only by
//     controld; and -agents simulated nodes in this process, each the real
//     blsync.Follower with a store client of its own, fetching what a node fetches
//     (the manifest, the chunks the watch did not deliver, the deltas) and
//     checking it (each chunk's size and SHA-256, each delta decoded), then
//     reporting the version it would enforce, but building no lookup table
//     (blsync.FollowerConfig.VerifyOnly): a node's table of a 10M list takes some
//     715 MiB, a hundred would not fit in the machine, and the two l7d build
//     theirs. A list of -entries random IPv4 addresses (the binary format) is
//     pushed with PUT /v1/blacklists/global; push_10m_to_applied_s is from the
//     request sent to the last node (l7d or agent) enforcing its version. The
//     store's size for it is the embedded etcd's database in use after the push
//     less before (store_mib_10m). The simulated nodes run when they fit in
//     -agent-memory of the memory available at its start (/proc/meminfo's
//     MemAvailable; a few bytes an entry each), else as many as fit, said in the
//     table and the JSON line (agents_asked, agents); the process's peak
//     resident memory is reported (rss_peak_mib).
//   - delta: -deltas deltas of -delta-entries random IPv4 addresses (NDJSON, an
//     hour's expiry), each with POST /v1/blacklists/global/delta once the one
//     before was applied everywhere, timed from the request to the last node
//     enforcing it (p50, p99).
//
// The agents share this process's two cores with controld, etcd and the l7d: on
// a machine with a core or more per node, a node's apply is its own. Nothing
// crosses the machine: every process listens on loopback or a unix socket in a
// temporary directory, removed at the end. The last line of the output is one
// JSON object with the headline figures and whether each met its target.
//
//	go run ./bench/blacklist [-bin bin] [-entries 10000000] [-agents 100] [-deltas 20]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the benchmark's flags.
type options struct {
	bin          string
	entries      int
	agents       int
	deltas       int
	deltaEntries int
	agentMemory  float64
	skipL4       bool
	l4Args       string
	timeout      time.Duration
	out, log     io.Writer
}

// Main runs the benchmark and returns the exit status: 0 when every phase ran
// (whether the targets were met or not), 1 when something broke, 2 for bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	o := options{out: stdout, log: stderr}
	fs := flag.NewFlagSet("bench-blacklist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bin, "bin", "bin", "`directory` holding controld, keyserverd and l7d (make build)")
	fs.IntVar(&o.entries, "entries", 10_000_000, "IPv4 entries of the list pushed whole")
	fs.IntVar(&o.agents, "agents", 100, "simulated nodes (blsync.Follower verifying only, each with its own store client) beside the two l7d")
	fs.IntVar(&o.deltas, "deltas", 20, "deltas pushed one after the other, each once the one before was applied everywhere")
	fs.IntVar(&o.deltaEntries, "delta-entries", 10_000, "IPv4 addresses added by each delta")
	fs.Float64Var(&o.agentMemory, "agent-memory", 0.6, "share of the memory available at start the simulated nodes may take (fewer run when -agents would take more)")
	fs.BoolVar(&o.skipL4, "skip-l4", false, "skip the l4 phase (go run ./bench/l4)")
	fs.StringVar(&o.l4Args, "l4-args", "-table 1000 -skip-veth", "flags of go run ./bench/l4 for the l4 phase (space-separated)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "longest wait for every node to apply one push")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench-blacklist: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if o.entries < 1 || o.agents < 0 || o.deltas < 1 || o.deltaEntries < 1 || o.timeout <= 0 || o.agentMemory <= 0 || o.agentMemory > 1 {
		fmt.Fprintln(stderr, "bench-blacklist: -entries, -deltas, -delta-entries and -timeout must be positive, -agents not negative, -agent-memory in (0, 1]")
		return 2
	}
	return benchkit.Main("bench-blacklist", stderr, func(ctx context.Context) error { return run(ctx, o) })
}
