package datapath

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
)

// BenchmarkTraceEstablished is the per-packet cost of the established-flow path
// (handle, as BenchmarkHandleEstablished, over 256K flows in random order) with
// tracing off, and with tracing configured while the packets are not marked: by
// DSCP (one byte compared), by the probe servers' prefixes (the source looked up
// in 4 prefixes) and by a TCP option kind (the options walked). What unmarked
// packets pay for tracing is each sub-benchmark's ns/op less off's, in the same run.
func BenchmarkTraceEstablished(b *testing.B) {
	probes := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/28"), netip.MustParsePrefix("198.51.100.0/24"),
		netip.MustParsePrefix("2001:db8::/48"), netip.MustParsePrefix("203.0.113.128/25")}
	for _, bc := range []struct {
		name string
		tc   TraceConfig
	}{
		{"off", TraceConfig{}},
		{"dscp_unmarked", TraceConfig{LD: "bench", DSCP: 46}},
		{"sources_unmarked", TraceConfig{LD: "bench", Sources: probes}},
		{"tcp_option_unmarked", TraceConfig{LD: "bench", TCPOption: 253}},
	} {
		b.Run(bc.name, func(b *testing.B) { benchTraceEstablished(b, bc.tc) })
	}
}

func benchTraceEstablished(b *testing.B, tc TraceConfig) {
	const flows = 1 << 18
	cfg := testConfig()
	cfg.Trace = tc
	cfg.External.GatewayMAC = packet.MAC(gwMAC)
	p := cfg.Pools["l7"]
	for i := range p.Members {
		p.Members[i].MAC = packet.MAC(memberMAC[p.Members[i].Address.String()])
	}
	cfg.Pools["l7"] = p
	cfg.Conntrack.Capacity = 2 * flows
	ext := port.NewMem("ext", extMAC, 2, 64, 2048)
	in := port.NewMem("int", intMAC, 2, 64, 2048)
	d, err := NewDistributor(cfg, Options{External: ext, Internal: in})
	if err != nil {
		b.Fatal(err)
	}
	w := d.workers[0]
	s := d.snap.Load()
	w.resync(s)
	if (s.trace != nil) != tc.Enabled() {
		b.Fatalf("tracing on: %v, want %v", s.trace != nil, tc.Enabled())
	}
	buf := port.Buf{Data: make([]byte, 2048)}
	for _, f := range benchFrames(b, flows, true) {
		buf.Off, buf.Len = 128, copy(buf.Data[128:], f)
		if v := w.handleFrame(s, &buf, true); v != vInt {
			b.Fatalf("SYN verdict %d", v)
		}
	}
	acks := benchFrames(b, flows, false)
	rand.Shuffle(len(acks), func(i, j int) { acks[i], acks[j] = acks[j], acks[i] })
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		f := acks[i&(flows-1)]
		buf.Off, buf.Len = 128, copy(buf.Data[128:], f)
		if w.handleFrame(s, &buf, true) != vInt {
			b.Fatal("not forwarded")
		}
	}
	b.StopTimer()
	if r := w.tr.ring.Load(); r != nil && r.Written() != 0 {
		b.Fatalf("%d records of unmarked packets", r.Written())
	}
}

// BenchmarkTracePollEstablished is BenchmarkPollEstablished (one worker, bursts of
// 32, 1M established flows visited in order, port I/O excluded) with tracing off and
// configured by DSCP with no packet marked; it reports Mpps, whose ratio is what
// tracing costs unmarked packets.
func BenchmarkTracePollEstablished(b *testing.B) {
	for _, bc := range []struct {
		name string
		tc   TraceConfig
	}{
		{"off", TraceConfig{}},
		{"dscp_unmarked", TraceConfig{LD: "bench", DSCP: 46}},
	} {
		b.Run(bc.name, func(b *testing.B) { benchTracePoll(b, bc.tc) })
	}
}

func benchTracePoll(b *testing.B, tc TraceConfig) {
	const flows = 1 << 20
	cfg := testConfig()
	cfg.Trace = tc
	cfg.External.GatewayMAC = packet.MAC(gwMAC)
	p := cfg.Pools["l7"]
	for i := range p.Members {
		p.Members[i].MAC = packet.MAC(memberMAC[p.Members[i].Address.String()])
	}
	cfg.Pools["l7"] = p
	cfg.Conntrack.Capacity = 2 * flows
	d, err := NewDistributor(cfg, Options{External: port.NewMem("ext", extMAC, 2, 64, 2048), Internal: port.NewMem("int", intMAC, 2, 64, 2048)})
	if err != nil {
		b.Fatal(err)
	}
	w := d.workers[0]
	w.resync(d.snap.Load())
	t := &testing.T{}
	syn := newGenPort(tcp4(t, vip, 40000, vip, 443, true, false, nil), flows, 32)
	sink := newGenPort(nil, 0, 0)
	w.ext, w.int, w.onePort = syn, sink, false
	for range flows / 32 {
		w.poll(syn, vExt)
	}
	if got := w.table.Len(); got != flows {
		b.Fatalf("%d flows in the table, want %d", got, flows)
	}
	ack := newGenPort(tcp4(t, vip, 40000, vip, 443, false, true, nil), flows, 32)
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N / 32 {
		w.poll(ack, vExt)
	}
	b.StopTimer()
	if sink.sent < uint64(b.N/32*32) {
		b.Fatalf("forwarded %d of %d", sink.sent, b.N)
	}
	if r := w.tr.ring.Load(); r != nil && r.Written() != 0 {
		b.Fatalf("%d records of unmarked packets", r.Written())
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "Mpps")
}
