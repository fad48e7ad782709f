//go:build cgo

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
)

// vethExt is the LD's external address in the veth measurement.
var vethExt = netip.MustParsePrefix("198.18.2.1/24")

// measureVeth measures forwarding end to end: a raw socket in the client namespace
// sends TCP ACKs to the VIP over veth; the worker receives them on ext, tunnels them
// and sends them on in, over the other pair, to the sink namespace, whose kernel drops
// the GRE (it has no GRE device). missed reads ext's receive-drop counter.
func measureVeth(ctx context.Context, o *options, t *topo, ext, in port.Port, missed func() uint64,
	init func(int) (func(), error), log *slog.Logger) (res *vethResult, err error) {
	macs := make([]packet.MAC, len(memberAddr))
	for i := range macs {
		macs[i] = t.sinkMAC
	}
	cfg := ldConfig(ldSetup{ext: vethExt, gw: vethCli.Addr(), gwMAC: t.cliMAC, memberMACs: macs, capacity: tableCapacity(vethFlows)})
	r, err := startRig("veth net_af_packet", cfg, ext, in, nil, vethFlows, init, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := r.stop(); err == nil {
			err = serr
		}
	}()
	frames := buildFrames(vethFlows, false, ext.MAC(), t.cliMAC, 3)
	snd, err := openSender(t.cli, ifCli)
	if err != nil {
		return nil, err
	}
	defer snd.close()
	sink0, err := linkRxPackets(t.sink, ifSink)
	if err != nil {
		return nil, err
	}
	missed0 := missed()
	rx0, tx0 := r.ext.rx.Load(), r.int.tx.Load()
	sent, refused, el := snd.send(ctx, frames, o.vethFrames, o.vethDuration)
	if err := sleepCtx(ctx, 300*time.Millisecond); err != nil { // let the queues drain
		return nil, err
	}
	res = &vethResult{Sent: sent, Refused: refused, Seconds: el.Seconds(),
		Received: r.ext.rx.Load() - rx0, Forwarded: r.int.tx.Load() - tx0, RxMissed: missed() - missed0}
	sink1, err := linkRxPackets(t.sink, ifSink)
	if err != nil {
		return nil, err
	}
	res.SinkRx = sink1 - sink0
	res.SentKpps = float64(sent) / el.Seconds() / 1e3
	res.Kpps = float64(res.Forwarded) / el.Seconds() / 1e3
	if err := sleepCtx(ctx, 250*time.Millisecond); err != nil { // counters are published every 100 ms
		return res, err
	}
	status := r.d.Status()
	res.OtherCount = map[string]uint64{}
	for k, v := range status.Packets {
		if k != "in/forwarded" && v > 0 {
			res.OtherCount[k] = v
		}
	}
	switch {
	case res.Forwarded == 0:
		return res, fmt.Errorf("nothing forwarded (%d sent, %d received)", sent, res.Received)
	case status.Packets["in/table_full"] > 0 || status.Packets["in/no_member"] > 0 || status.Packets["in/no_neighbor"] > 0:
		return res, fmt.Errorf("drops: table_full %d, no_member %d, no_neighbor %d", status.Packets["in/table_full"],
			status.Packets["in/no_member"], status.Packets["in/no_neighbor"])
	}
	// The internal port also carries what the worker answers itself (local), so the
	// port may have taken more than the distributor counts as forwarded, never less.
	if fwd, took, local := status.Packets["in/forwarded"], r.int.tx.Load(), status.Packets["local/local"]; fwd > took || took > fwd+local {
		return res, fmt.Errorf("the distributor counts %d forwarded and %d answered locally, the internal port took %d", fwd, local, took)
	}
	return res, nil
}

// linkRxPackets returns the received-packet count of dev in namespace ns.
func linkRxPackets(ns, dev string) (uint64, error) {
	var links []struct {
		Stats struct {
			Rx struct {
				Packets uint64 `json:"packets"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := ipJSON(&links, "-n", ns, "-s", "-j", "link", "show", "dev", dev); err != nil {
		return 0, err
	}
	if len(links) != 1 {
		return 0, fmt.Errorf("ip -s link show %s in %s: %d links", dev, ns, len(links))
	}
	return links[0].Stats.Rx.Packets, nil
}

// sender transmits frames on a raw AF_PACKET socket bound to an interface.
type sender struct{ fd int }

// openSender opens a raw socket on dev in namespace ns. It receives nothing (protocol
// 0) and only sends.
func openSender(ns, dev string) (*sender, error) {
	s := &sender{fd: -1}
	err := inNetns(nsPath(ns), func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return fmt.Errorf("finding %s in %s: %w", dev, ns, err)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening a packet socket in %s: %w", ns, err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("binding a packet socket to %s in %s: %w", dev, ns, err)
		}
		s.fd = fd
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (s *sender) close() { unix.Close(s.fd) }

// send writes frames of set in storage order, cycling, until it has tried maxFrames
// or d has passed. It returns the frames the kernel took, those it refused, and the
// time it took.
func (s *sender) send(ctx context.Context, set *frameSet, maxFrames int, d time.Duration) (sent, refused uint64, el time.Duration) {
	start := time.Now()
	deadline := start.Add(d)
	j := 0
	for n := 0; n < maxFrames; n++ {
		if n%1024 == 0 && (time.Now().After(deadline) || ctx.Err() != nil) {
			break
		}
		if _, err := unix.Write(s.fd, set.frame(j)); err != nil {
			refused++
		} else {
			sent++
		}
		if j++; j == set.n {
			j = 0
		}
	}
	return sent, refused, time.Since(start)
}
