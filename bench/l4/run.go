package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
)

// errNoCgo is why a build without cgo cannot measure DPDK.
var errNoCgo = errors.New("built without cgo: the DPDK measurements need cgo and libdpdk (pkg-config libdpdk)")

// results is everything the report shows.
type results struct {
	table     *tableResult
	inmem     *forwardResults
	ring      *forwardResults
	veth      *vethResult
	eal       []string // EAL arguments, when DPDK ran
	buildDur  time.Duration
	blacklist *blacklistSets
	defence   *defenceResults
	// ringCookies are the SYN proxy's cookie rows over DPDK net_ring, one per round;
	// ringCookiesNA why they were not measured (the datapath lacks the SYN proxy).
	ringCookies   []*phaseResult
	ringCookiesNA string
	skipped       []string
	benchkit.Bench
}

// run measures, in order: the connection table (first, so the resident set has not
// grown with anything else), the in-memory datapath, then, with one EAL for the
// process, the datapath over net_ring and over net_af_packet on veth.
func run(ctx context.Context, o *options) error {
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return fmt.Errorf("creating the CPU profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("starting the CPU profile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	log := slog.New(slog.NewTextHandler(o.log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	res := &results{Bench: benchkit.Bench{Log: o.log, QuietCores: o.quietCores, QuietWait: o.quietWait}}

	if o.phase("table") {
		res.Progress("connection table of %d", o.tableSize)
		t, err := measureTable(o.tableSize)
		if err != nil {
			res.Fail("connection table: %v", err)
		}
		res.table = t
		debug.FreeOSMemory()
	}

	forward, dpdk := o.phase("forward"), o.phase("dpdk") && !o.skipDPDK
	// The SYN proxy's cookie rows run over DPDK net_ring too, within the one EAL of
	// the process.
	cookiesDPDK := o.phase("synproxy") && !o.skipDPDK && haveDPDK
	feature := o.phase("overload") || o.phase("trace") || o.phase("synproxy-established")
	if ctx.Err() == nil && (forward || dpdk || feature) {
		res.Progress("building %d SYN and %d ACK frames", o.flows, o.flows)
		start := time.Now()
		clients := newSpreadClients(o.flows)
		syn := buildFramesOf(o.flows, true, extMAC, [6]byte(gwMAC), 1, clients.client)
		ack := buildFramesOf(o.flows, false, extMAC, [6]byte(gwMAC), 2, clients.client)
		res.buildDur = time.Since(start)
		if o.blEntries > 0 && (forward || dpdk) {
			res.Progress("building a blacklist of %d IPv4 addresses", o.blEntries)
			res.blacklist = newBlacklistSets(o.blEntries, clients, o.blListed)
			o.blPlan = &blacklistPlan{sets: res.blacklist, rounds: o.blRounds, duration: o.blDuration}
		} else if o.blEntries == 0 {
			res.skipped = append(res.skipped, "blacklist rows (-blacklist 0)")
		}

		if forward {
			res.Progress("in-memory ports")
			waitQuiet(ctx, res)
			var err error
			if res.inmem, err = runInMem(ctx, o, syn, ack, log); err != nil {
				res.Fail("in-memory: %v", err)
			}
		}
		if ctx.Err() == nil && (dpdk || cookiesDPDK) {
			runDPDK(ctx, o, res, syn, ack, log)
		}
		if ctx.Err() == nil {
			runDefence(ctx, o, res, syn, ack, log)
		}
	} else if ctx.Err() == nil {
		if cookiesDPDK {
			runDPDK(ctx, o, res, nil, nil, log)
		}
		runDefence(ctx, o, res, nil, nil, log)
	}
	if skipped := slices.DeleteFunc(slices.Clone(allPhases), o.phase); len(skipped) > 0 {
		res.skipped = append(res.skipped, "phases "+strings.Join(skipped, ", ")+" (-phases)")
	}
	if o.skipDPDK && o.phase("dpdk") {
		res.skipped = append(res.skipped, "DPDK net_ring and veth (-skip-dpdk)")
	} else if o.skipVeth && o.phase("dpdk") {
		res.skipped = append(res.skipped, "veth net_af_packet (-skip-veth)")
	}
	if ctx.Err() != nil {
		res.Fail("interrupted")
	}
	report(o, res)
	return res.Err()
}

// runDPDK sets up the veth network (unless skipped: its interfaces must exist before
// the EAL starts), the EAL, and runs the net_ring and veth measurements (phase dpdk)
// and the SYN proxy's cookie rows over net_ring (phase synproxy).
func runDPDK(ctx context.Context, o *options, res *results, syn, ack *frameSet, log *slog.Logger) {
	if !haveDPDK {
		res.Fail("DPDK: %v", errNoCgo)
		return
	}
	removeStale()
	var t *topo
	if !o.skipVeth && o.phase("dpdk") {
		res.Progress("veth namespaces")
		var err error
		if t, err = newTopo(); err != nil {
			res.Fail("veth: setting up the namespaces: %v", err)
			t = nil
		} else {
			defer t.close()
		}
	}
	res.Progress("DPDK EAL")
	defer reserveHugepages(1024)()
	res.eal = ealArgs(t, o.ealLogLevel)
	env, err := startDPDK(res.eal)
	if err != nil {
		res.Fail("DPDK: %v", err)
		return
	}
	defer func() {
		if err := env.close(); err != nil {
			res.Fail("DPDK: cleaning up: %v", err)
		}
	}()
	if o.phase("dpdk") {
		res.Progress("DPDK net_ring")
		waitQuiet(ctx, res)
		if res.ring, err = env.runRing(ctx, o, syn, ack, log); err != nil {
			res.Fail("DPDK net_ring: %v", err)
		}
	}
	if t != nil && ctx.Err() == nil {
		res.Progress("veth net_af_packet")
		waitQuiet(ctx, res)
		if res.veth, err = env.runVeth(ctx, o, t, log); err != nil {
			res.Fail("veth net_af_packet: %v", err)
		}
	}
	if o.phase("synproxy") && ctx.Err() == nil {
		res.Progress("SYN proxy: LD cookie answers over DPDK net_ring, %d rounds", o.defRounds)
		waitQuiet(ctx, res)
		rc, err := env.runRingCookies(ctx, o, log)
		switch {
		case errors.Is(err, errNotAvailable):
			res.ringCookiesNA = err.Error()
		case err != nil:
			res.Fail("SYN proxy over DPDK net_ring: %v", err)
		}
		res.ringCookies = rc
	}
}

// waitQuiet waits (at most -quiet-wait) for other processes to leave the cores
// alone; a measurement goes ahead when they do not, and when the machine cannot be
// read.
func waitQuiet(ctx context.Context, res *results) {
	_ = res.WaitQuiet(ctx, benchkit.SelfCPU)
}
