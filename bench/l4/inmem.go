package main

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// genPoolSize is the number of generator buffers: a few bursts' worth, like a NIC
// ring's mbufs in flight.
const genPoolSize = 4096

// memSource feeds a genPort (or a sinkPort).
type memSource struct {
	g interface {
		start(set *frameSet, count int64) *genFeed
	}
}

func (s memSource) feed(set *frameSet, count int64) feeding {
	return &memFeeding{f: s.g.start(set, count)}
}

// memFeeding is one run of the generator.
type memFeeding struct {
	f *genFeed
}

// stop stops the generator, waits until the worker's RxBurst has seen it (the worker
// busy-polls), and reports what it handed out.
func (m *memFeeding) stop() feedStats {
	m.f.stop.Store(true)
	deadline := time.Now().Add(2 * time.Second)
	for !m.f.stopped.Load() {
		if time.Now().After(deadline) {
			return feedStats{sent: m.f.handed.Load(), err: errors.New("the worker stopped polling the generator")}
		}
		time.Sleep(100 * time.Microsecond)
	}
	return feedStats{sent: m.f.handed.Load()}
}

// runInMem measures the datapath on in-memory ports: the generator as the external
// port, the sink as the internal one.
func runInMem(ctx context.Context, o *options, syn, ack *frameSet, log *slog.Logger) (*forwardResults, error) {
	pool := newGenPool(genPoolSize)
	g := &genPort{name: "gen", mac: extMAC, pool: pool}
	sink := &sinkPort{name: "sink", mac: intMAC, pool: pool}
	cfg := ldConfig(ldSetup{ext: ldExt, gw: ldExtGW, gwMAC: gwMAC, memberMACs: memberMACs(), capacity: tableCapacity(o.flows)})
	r, err := startRig("in-memory", cfg, g, sink, memSource{g}, o.flows, nil, log)
	if err != nil {
		return nil, err
	}
	res, err := runForward(ctx, r, syn, ack, o.duration, o.blPlan)
	if serr := r.stop(); err == nil {
		err = serr
	}
	return res, err
}

// tableCapacity is the connection table size for flows: twice the flows, at least 2M,
// so the table is never full and the half-open queue never evicts.
func tableCapacity(flows int) int { return max(2*flows, 2_000_000) }
