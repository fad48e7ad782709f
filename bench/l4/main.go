// Command bench-l4 measures the L4 load distributor's datapath (l4/datapath) on one
// worker, in one run:
//
//   - forwarding on in-memory ports with 1,000,000 flows: a generator port copies
//     pre-built client → VIP TCP frames into buffers (standing for the NIC's DMA) and
//     the worker tunnels them to members in GRE; first one SYN per flow (new flows:
//     scheduled and inserted), then ACKs over the established flows for -duration;
//   - the same through DPDK with net_ring (no kernel): a feeder on the other core
//     transmits the frames on net_ring0 queue 0, which loops to the RX queue the worker
//     polls, and the worker transmits to net_null0;
//   - the connection table's bytes per entry, and the memory of a table holding
//     10,000,000 connections (its own count, the Go heap and the resident set);
//   - the established-flow rate with a blacklist of 1,000,000 IPv4 addresses in force
//     (every packet's source looked up; none listed, then 1% of the clients listed)
//     against none, in rounds of the three rows on the same flows, in memory and over
//     net_ring; the clients of those two set-ups are spread over the IPv4 space;
//   - end-to-end packets per second through veth pairs with net_af_packet, from a raw
//     socket in a client namespace to a sink namespace (kernel-bound; for context);
//   - the defence rows (issue 17), in rounds that alternate their order: the SYN
//     proxy's cookie SYN-ACKs per second of the worker's CPU, answering a spoofed SYN
//     flood (testkit/synflood's frames) on in-memory ports (and over DPDK net_ring,
//     the SYN-ACKs sent to net_null), against the kernel's own
//     SYN proxy (nftables synproxy) answering the same kind of flood over veth in a
//     namespace, its receive path steered to one core whose softirq time is counted;
//     established flows with the SYN proxy on ÷ off; and what overload control and
//     tracing (unmarked packets) add per packet of established flows.
//
// It prints a readable table, the targets with PASS or MISS, and as its very last line
// one JSON object with the headline figures. It needs root (namespaces, DPDK) and
// libdpdk (make deps); addresses come from 198.18.0.0/15 and 203.0.113.0/24 and nothing
// leaves the namespaces it makes, which it removes at the end, on SIGINT and SIGTERM,
// and (left by a killed run) at the next start.
//
//	go run ./bench/l4 [-flows 1000000] [-duration 3s] [-blacklist 1000000] [-skip-dpdk] [-skip-veth]
//	    [-phases all|table,forward,dpdk,synproxy,synproxy-established,overload,trace|defence]
//	    [-defence-rounds 5] [-defence-duration 1s]
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

// options are the flags.
type options struct {
	out, log     io.Writer
	flows        int
	duration     time.Duration
	skipDPDK     bool
	skipVeth     bool
	cpuprofile   string
	tableSize    int
	vethFrames   int
	vethDuration time.Duration
	quietCores   float64
	quietWait    time.Duration
	ealLogLevel  string
	// blacklist rows: entries of the list (0: none), rounds, the time of each row,
	// and the share of the flows whose clients are listed in the third row.
	blEntries  int
	blRounds   int
	blDuration time.Duration
	blListed   float64
	blPlan     *blacklistPlan // built by run
	// phases are the measurements to run (-phases), in the order of allPhases.
	phases []string
	// defence rows: rounds, and the time of each row in a round.
	defRounds   int
	defDuration time.Duration
}

// allPhases are the measurements, as -phases names them: the connection table, the
// in-memory forwarding (with its blacklist rows), DPDK (net_ring with its blacklist
// rows, and veth), and the defence rows (defencePhases).
var allPhases = append([]string{"table", "forward", "dpdk"}, defencePhases...)

// phase reports whether the measurement named name runs.
func (o *options) phase(name string) bool { return slices.Contains(o.phases, name) }

// parsePhases reads -phases: "all", or a comma-separated list of allPhases where
// "defence" stands for defencePhases.
func parsePhases(s string) ([]string, error) {
	if s == "all" {
		return allPhases, nil
	}
	var names []string
	for _, f := range strings.Split(s, ",") {
		if strings.TrimSpace(f) == "defence" {
			names = append(names, defencePhases...)
		} else {
			names = append(names, f)
		}
	}
	return benchkit.ParseList(strings.Join(names, ","), allPhases)
}

// Main runs the benchmark and returns the exit status: 0 when every measurement ran
// and checked out (whether the targets were met or not), 1 when something failed, 2
// for bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	o := options{out: stdout, log: stderr}
	fs := flag.NewFlagSet("bench-l4", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.flows, "flows", 1_000_000, "established flows (and new flows) through the datapath")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "measured time of the established-flow phases")
	fs.BoolVar(&o.skipDPDK, "skip-dpdk", false, "skip the DPDK measurements (net_ring and veth)")
	fs.BoolVar(&o.skipVeth, "skip-veth", false, "skip the veth measurement (net_af_packet)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to `file`")
	fs.IntVar(&o.tableSize, "table", 10_000_000, "connections in the table whose memory is measured")
	fs.IntVar(&o.vethFrames, "veth-frames", 2_000_000, "most frames the veth client sends")
	fs.DurationVar(&o.vethDuration, "veth-duration", 5*time.Second, "longest the veth client sends")
	fs.StringVar(&o.ealLogLevel, "eal-log-level", "error", "DPDK EAL log `level` (error, warning, info, debug)")
	fs.Float64Var(&o.quietCores, "quiet-cores", 0.2, "before each forwarding measurement, wait for other processes to use fewer `cores` than this (the machines are shared)")
	fs.DurationVar(&o.quietWait, "quiet-wait", 10*time.Second, "how long to wait for that before measuring anyway (0: do not wait)")
	fs.IntVar(&o.blEntries, "blacklist", 1_000_000, "IPv4 `entries` of the blacklist of the blacklist rows (0: no blacklist rows)")
	fs.IntVar(&o.blRounds, "blacklist-rounds", 3, "rounds of the blacklist rows (without, with, with some clients listed)")
	fs.DurationVar(&o.blDuration, "blacklist-duration", time.Second, "measured time of each blacklist row")
	fs.Float64Var(&o.blListed, "blacklist-listed", 0.01, "share of the flows whose clients are on the list in the third blacklist row")
	phases := fs.String("phases", "all", "the measurements to run, comma-separated: "+strings.Join(allPhases, ", ")+
		" (defence: the last "+strconv.Itoa(len(defencePhases))+"), or all")
	fs.IntVar(&o.defRounds, "defence-rounds", 5, "rounds of the defence rows (each row once per round, the order alternating)")
	fs.DurationVar(&o.defDuration, "defence-duration", time.Second, "measured time of each defence row in a round")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if o.phases, err = parsePhases(*phases); err != nil {
		fmt.Fprintf(stderr, "bench-l4: -phases: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench-l4: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	switch {
	case o.flows < 1 || o.flows > maxFlows:
		fmt.Fprintf(stderr, "bench-l4: -flows %d: want 1 to %d\n", o.flows, maxFlows)
		return 2
	case o.tableSize < 1 || o.tableSize > maxTable:
		fmt.Fprintf(stderr, "bench-l4: -table %d: want 1 to %d\n", o.tableSize, maxTable)
		return 2
	case o.blEntries < 0 || o.blEntries > maxBlacklist || o.blRounds < 1 || o.blDuration <= 0 || o.blListed < 0 || o.blListed > 1:
		fmt.Fprintf(stderr, "bench-l4: -blacklist wants 0 to %d, -blacklist-rounds at least 1, -blacklist-duration positive, -blacklist-listed 0 to 1\n", maxBlacklist)
		return 2
	case o.defRounds < 1 || o.defDuration <= 0:
		fmt.Fprintln(stderr, "bench-l4: -defence-rounds must be at least 1, -defence-duration positive")
		return 2
	case o.duration <= 0 || o.vethDuration <= 0 || o.vethFrames < 1 || o.quietWait < 0:
		fmt.Fprintln(stderr, "bench-l4: -duration, -veth-duration and -veth-frames must be positive, -quiet-wait not negative")
		return 2
	}

	return benchkit.Main("bench-l4", stderr, func(ctx context.Context) error { return run(ctx, &o) })
}

// maxBlacklist bounds -blacklist.
const maxBlacklist = 10_000_000

// maxTable bounds -table: 64 bytes per entry must fit this machine's memory easily.
const maxTable = 50_000_000
