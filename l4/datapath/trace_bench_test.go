package datapath

import (
	"net/netip"
	"testing"
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
	w, s := benchWorkerCfg(b, 2*flows, func(c *Config) { c.Trace = tc })
	if (s.trace != nil) != tc.Enabled() {
		b.Fatalf("tracing on: %v, want %v", s.trace != nil, tc.Enabled())
	}
	handleEstablished(b, w, s, flows)
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
	w, _ := benchWorkerCfg(b, 2*flows, func(c *Config) { c.Trace = tc })
	pollEstablished(b, w, flows)
	if r := w.tr.ring.Load(); r != nil && r.Written() != 0 {
		b.Fatalf("%d records of unmarked packets", r.Written())
	}
}
