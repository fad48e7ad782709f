// Command bench-control measures how fast the control plane carries a configuration
// write to the nodes, and what a node agent costs.
//
// The store is controld's embedded etcd (control/store), run in a child process of
// this program so that its memory and CPU are not counted as the agents'. The nodes
// are the real node agent (control/agent) in this process, each with a client
// connection of its own, a cache file of its own and its status written under a
// lease, as in a daemon: only Apply is the benchmark's (it records when each
// revision arrived).
//
// Phases:
//
//   - propagate: N agents (-agents, 100) and a configuration of -pools pools. Writes
//     (one pool changed each) arrive in three shapes: one at a time, each once every
//     agent applied the one before (sequential); bursts of -burst writes back to back
//     (burst); and a Poisson arrival rate of -rate writes per second (rate). For each
//     write, the time from the store's answer (the write accepted) to the last agent
//     having applied a snapshot at or past its revision.
//   - watch: the same writes and shapes seen by N plain etcd watchers (clientv3
//     Watch on the same prefix, one client each), which decode nothing and check
//     nothing: the floor any agent built on etcd's watch can reach, measured in the
//     same run.
//   - rss: a child process starts -rss-agents (1000) agents against the same store
//     and reports its resident memory before and after they all applied the
//     configuration: MiB per 1000 agents.
//   - cert: real processes from -bin (make build), started by testkit/cluster:
//     controld on its own embedded etcd, two keyserverd on SoftHSM2 tokens and two
//     l7d fed only by controld. -cert-uploads uploads of a new version of a bound
//     certificate (POST /v1/certificates/www/versions), each timed from the
//     upload's 201 to both l7d serving it to new TLS handshakes (the serial seen
//     by a client of each): cert_upload_to_served_ms is the median.
//
// Nothing crosses the machine: the store listens on a unix socket in a temporary
// directory, removed at the end. The last line of the output is one JSON object
// with the headline figures.
//
//	go run ./bench/control [-agents 100] [-writes 100] [-rss-agents 1000]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the benchmark's flags.
type options struct {
	agents      int
	rssAgents   int
	writes      int
	burst       int
	rate        float64
	pools       int
	phases      []string
	timeout     time.Duration
	certUploads int
	bin         string
	cpuProf     string
	memProf     string
	out, log    io.Writer
}

// phaseNames are the phases, in the order they run.
var phaseNames = []string{"propagate", "watch", "rss", "cert"}

// Main runs the benchmark (or one of its child processes) and returns the exit
// status: 0 when every phase ran, 1 when something broke, 2 for bad flags.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == childStore {
		return serveStore(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == childRSS {
		return rssChild(args[1:], stdout, stderr)
	}
	o := options{out: stdout, log: stderr}
	fs := flag.NewFlagSet("bench-control", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.agents, "agents", 100, "node agents in the propagate phase (and plain watchers in the watch phase)")
	fs.IntVar(&o.rssAgents, "rss-agents", 1000, "node agents started in the rss phase")
	fs.IntVar(&o.writes, "writes", 100, "writes per load shape")
	fs.IntVar(&o.burst, "burst", 10, "writes back to back in each burst of the burst shape")
	fs.Float64Var(&o.rate, "rate", 20, "writes per second (Poisson arrivals) in the rate shape")
	fs.IntVar(&o.pools, "pools", 200, "pools in the configuration every agent checks whole on each revision")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "longest wait for the agents to apply one write before the run fails")
	phases := fs.String("phases", strings.Join(phaseNames, ","), "comma-separated phases to run")
	fs.IntVar(&o.certUploads, "cert-uploads", 10, "certificate uploads timed in the cert phase")
	fs.StringVar(&o.bin, "bin", "bin", "`directory` holding controld, l7d and keyserverd (make build), for the certificate phase")
	fs.StringVar(&o.cpuProf, "cpuprofile", "", "write a CPU profile of this process (the agents) during the propagate phase to `file`")
	fs.StringVar(&o.memProf, "memprofile", "", "write a heap profile of the rss phase's agents, once they applied the configuration, to `file`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench-control: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var err error
	if o.phases, err = benchkit.ParseList(*phases, phaseNames); err != nil {
		fmt.Fprintf(stderr, "bench-control: -phases: %v\n", err)
		return 2
	}
	if o.agents < 1 || o.rssAgents < 1 || o.writes < 1 || o.burst < 1 || o.rate <= 0 || o.pools < 1 || o.certUploads < 1 {
		fmt.Fprintln(stderr, "bench-control: -agents, -rss-agents, -writes, -burst, -rate, -pools and -cert-uploads must be positive")
		return 2
	}
	return benchkit.Main("bench-control", stderr, func(ctx context.Context) error { return run(ctx, o) })
}
