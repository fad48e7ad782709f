package datapath

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/l4/trace"
)

const probeDSCP = 46 // EF: the test's marker

// tcp4tos is tcp4 with the IPv4 TOS byte set.
func tcp4tos(t *testing.T, tos uint8, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, syn bool) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 60, TOS: tos, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: syn, ACK: !syn, Seq: 1000, Window: 64240}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	return serialize(t, &layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv4}, ip, tcp)
}

func traceConfig(tc TraceConfig) Config {
	cfg := testConfig()
	cfg.Trace = tc
	return cfg
}

// waitPoints waits until the distributor reports n points f keeps.
func (r *rig) waitPoints(f trace.Filter, n int) []trace.Point {
	r.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	var rep TraceReport
	for time.Now().Before(deadline) {
		rep = r.d.Trace(f)
		if len(rep.Points) >= n {
			return rep.Points
		}
		time.Sleep(2 * time.Millisecond)
	}
	r.t.Fatalf("%d trace points, want %d: %+v", len(rep.Points), n, rep.Points)
	return nil
}

// TestTraceForwarded: a marked SYN tunnelled to a member records a trace point with
// the LD's ID, the member and the packet; unmarked packets next to it record none.
func TestTraceForwarded(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := startRig(t, traceConfig(TraceConfig{LD: "ld-test", DSCP: probeDSCP}), Options{Registerer: reg})
	r.resolve()
	probe := netip.MustParseAddr("192.0.2.9")
	r.ext.Inject(tcp4tos(t, 0, client, 40001, vip, 443, true))
	r.ext.Inject(tcp4tos(t, probeDSCP<<2|1, probe, 40002, vip, 443, true)) // ECN bits do not matter
	r.ext.Inject(tcp4tos(t, 45<<2, client, 40003, vip, 443, true))
	sent := waitSent(t, r.int, 3)
	var outer netip.Addr
	for _, f := range sent {
		tu := decodeTunnelled(t, f)
		ip := tu.innerPk.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if ip.SrcIP.Equal(probe.AsSlice()) {
			outer = tu.outerDst
			if ip.TOS != probeDSCP<<2|1 {
				t.Errorf("the probe was tunnelled with TOS %#x: its marker must stay on the inner packet", ip.TOS)
			}
		}
	}
	pts := r.waitPoints(trace.Filter{}, 1)
	if len(pts) != 1 {
		t.Fatalf("%d points, want only the probe's: %+v", len(pts), pts)
	}
	p := pts[0]
	wantMember := map[string]string{"198.18.1.11": "l7/a", "198.18.1.12": "l7/b"}[outer.String()]
	if p.Kind != "trace" || p.Action != "tunnel" || p.Direction != "in" || p.LD != "ld-test" || p.Worker != 0 ||
		p.Member != wantMember || p.MemberAddress != outer.String() || p.Src != probe.String() ||
		p.Dst != vip.String() || p.SrcPort != 40002 || p.DstPort != 443 || p.Protocol != "tcp" || p.Length != 40 {
		t.Fatalf("trace point %+v; want tunnel to %s (%s) from %s", p, wantMember, outer, probe)
	}
	if !strings.HasPrefix(p.Sample, "45b9") || len(p.Sample) != 80 {
		t.Errorf("sample %q: want the 40-byte IP packet", p.Sample)
	}
	if time.Since(p.Time) > time.Minute || p.Time.After(time.Now()) {
		t.Errorf("time %v", p.Time)
	}
	rep := r.d.Trace(trace.Filter{})
	if !rep.Enabled || rep.LD != "ld-test" {
		t.Errorf("report: enabled %v ld %q", rep.Enabled, rep.LD)
	}
	waitMetrics(t, reg, map[string]float64{
		"tiergate_l4_trace_points_total{direction=in,ld=ld-test}":  1,
		"tiergate_l4_trace_points_total{direction=out,ld=ld-test}": 0,
	})
}

// ip4only is an IPv4 packet (no Ethernet header) with TCP flags syn/ack.
func ip4only(t *testing.T, tos uint8, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, syn, ack bool) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, TOS: tos, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: syn, ACK: ack, Seq: 5000, Ack: 1001, Window: 64240}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	return serialize(t, ip, tcp)
}

// TestTraceDrops: marked packets dropped for any reason (no rule, a blacklist, a bad
// checksum that stops the parse) record drop points with the reason and a sample;
// the same drops of unmarked packets record nothing.
func TestTraceDrops(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := startRig(t, traceConfig(TraceConfig{LD: "ld-test", DSCP: probeDSCP, SampleBytes: 24}), Options{Registerer: reg})
	r.resolve()
	probe, listed := netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("192.0.2.66")
	r.d.SetBlacklists(listOf("global", listed))
	marked := probeDSCP << 2

	r.ext.Inject(tcp4tos(t, 0, client, 40001, vip, 444, true)) // no rule, unmarked
	r.ext.Inject(tcp4tos(t, 0, listed, 40002, vip, 443, true)) // listed, unmarked
	r.waitCount(dirIn, resNoRule, 1)
	r.waitCount(dirIn, resBlacklisted, 1)

	r.ext.Inject(tcp4tos(t, uint8(marked), probe, 40011, vip, 444, true))
	r.ext.Inject(tcp4tos(t, uint8(marked), listed, 40012, vip, 443, true))
	bad := tcp4tos(t, uint8(marked), probe, 40013, vip, 443, true)
	bad[14+10] ^= 0xff // the IPv4 header checksum
	r.ext.Inject(bad)
	pts := r.waitPoints(trace.Filter{}, 3)
	if len(pts) != 3 {
		t.Fatalf("%d points, want the 3 marked drops: %+v", len(pts), pts)
	}
	byReason := map[string]trace.Point{}
	for _, p := range pts {
		if p.Kind != "drop" || p.Action != "" || p.Direction != "in" || p.LD != "ld-test" {
			t.Errorf("point %+v: want an in drop point of ld-test", p)
		}
		byReason[p.Reason] = p
	}
	nr, ok := byReason["no_rule"]
	if !ok || nr.Src != probe.String() || nr.DstPort != 444 || nr.Sample != hex.EncodeToString(tcp4tos(t, uint8(marked), probe, 40011, vip, 444, true)[14:14+24]) {
		t.Errorf("no_rule drop point %+v", nr)
	}
	if bl, ok := byReason["blacklisted"]; !ok || bl.Src != listed.String() || !strings.HasPrefix(bl.Sample, "45b8") {
		t.Errorf("blacklisted drop point %+v", bl)
	}
	// A frame that does not parse is sampled from its Ethernet header.
	if bc, ok := byReason["bad_checksum"]; !ok || bc.Sample != hex.EncodeToString(bad[:24]) || bc.Length != len(bad) {
		t.Errorf("bad_checksum drop point %+v, want a sample of %x", bc, bad[:24])
	}
	if got := r.d.Trace(trace.Filter{Reason: "no_rule"}).Points; len(got) != 1 || got[0].Reason != "no_rule" {
		t.Errorf("filter reason=no_rule: %+v", got)
	}
	if got := r.d.Trace(trace.Filter{Src: netip.PrefixFrom(listed, 32)}).Points; len(got) != 1 || got[0].Reason != "blacklisted" {
		t.Errorf("filter src=%s: %+v", listed, got)
	}
	waitMetrics(t, reg, map[string]float64{
		"tiergate_l4_trace_drops_total{reason=no_rule}":           1,
		"tiergate_l4_trace_drops_total{reason=blacklisted}":       1,
		"tiergate_l4_trace_drops_total{reason=bad_checksum}":      1,
		"tiergate_l4_trace_points_total{direction=in,ld=ld-test}": 0,
	})
}

// TestTraceReply: with the probe server's address as the marker, the member's reply
// to it is traced on its way out (the reply to the client), and a reply to no flow
// is a drop point of direction out.
func TestTraceReply(t *testing.T) {
	probe := netip.MustParseAddr("192.0.2.9")
	r := startRig(t, traceConfig(TraceConfig{LD: "ld-test", Sources: []netip.Prefix{netip.PrefixFrom(probe, 32)}}), Options{})
	r.resolve()
	r.ext.Inject(tcp4(t, probe, 40020, vip, 443, true, false, nil))
	tu := decodeTunnelled(t, waitSent(t, r.int, 1)[0])
	r.int.Inject(gre4(t, tu.outerDst, ip4only(t, 0, vip, 443, probe, 40020, true, true)))
	waitSent(t, r.ext, 1)
	r.int.Inject(gre4(t, tu.outerDst, ip4only(t, 0, vip, 443, probe, 40021, true, true))) // no such flow
	// The member's reply to another client is not the probe's.
	r.int.Inject(gre4(t, tu.outerDst, ip4only(t, 0, vip, 443, client, 40022, true, true)))
	r.waitCount(dirOut, resReturnNoFlow, 2)
	pts := r.waitPoints(trace.Filter{}, 3)
	if len(pts) != 3 {
		t.Fatalf("%d points, want 3: %+v", len(pts), pts)
	}
	// Newest first: the drop, the reply, the tunnel.
	if p := pts[2]; p.Action != "tunnel" || p.Src != probe.String() || p.MemberAddress != tu.outerDst.String() {
		t.Errorf("the SYN's point: %+v", p)
	}
	if p := pts[1]; p.Kind != "trace" || p.Action != "reply" || p.Direction != "out" || p.Src != vip.String() ||
		p.Dst != probe.String() || p.DstPort != 40020 || p.Member != "" || !strings.HasPrefix(p.Sample, "4500") {
		t.Errorf("the reply's point: %+v", p)
	}
	if p := pts[0]; p.Kind != "drop" || p.Reason != "return_no_flow" || p.Direction != "out" || p.DstPort != 40021 {
		t.Errorf("the stray reply's point: %+v", p)
	}
	if got := r.d.Trace(trace.Filter{Src: netip.PrefixFrom(probe, 32), Kind: "trace"}).Points; len(got) != 2 {
		t.Errorf("filter src=%s kind=trace: %d points, want the SYN and its reply", probe, len(got))
	}
}

// TestTraceTxFull: a marked packet the port does not take is a tx_full drop point,
// and no longer a trace point in the counters.
func TestTraceTxFull(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := startRig(t, traceConfig(TraceConfig{LD: "ld-test", DSCP: probeDSCP}), Options{Registerer: reg})
	r.resolve()
	r.int.SetTxLimit(0)
	r.ext.Inject(tcp4tos(t, probeDSCP<<2, client, 40030, vip, 443, true))
	r.waitCount(dirIn, resTxFull, 1)
	pts := r.waitPoints(trace.Filter{Kind: "drop"}, 1)
	if p := pts[0]; p.Reason != "tx_full" || p.Protocol != "gre" || p.Src != ldInt.String() {
		t.Errorf("tx_full drop point %+v: want the GRE frame as it was to be sent", p)
	}
	waitMetrics(t, reg, map[string]float64{
		"tiergate_l4_trace_drops_total{reason=tx_full}":           1,
		"tiergate_l4_trace_points_total{direction=in,ld=ld-test}": 0,
	})
}

// TestTraceOff: with no criterion nothing is recorded, whatever the packets carry,
// and no ring is allocated; turning it on by Apply starts recording, and off stops.
func TestTraceOff(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := startRig(t, testConfig(), Options{Registerer: reg})
	r.resolve()
	r.ext.Inject(tcp4tos(t, probeDSCP<<2, client, 40040, vip, 443, true))
	r.ext.Inject(tcp4tos(t, probeDSCP<<2, client, 40041, vip, 444, true))
	r.waitCount(dirIn, resNoRule, 1)
	r.waitCount(dirIn, resForwarded, 1)
	rep := r.d.Trace(trace.Filter{})
	if rep.Enabled || len(rep.Points) != 0 || r.d.workers[0].tr.ring.Load() != nil {
		t.Fatalf("tracing off: %+v", rep)
	}
	for k := range gather(t, reg) {
		if strings.HasPrefix(k, "tiergate_l4_trace_") {
			t.Errorf("metric %s with tracing off", k)
		}
	}
	if err := r.d.Apply(traceConfig(TraceConfig{LD: "ld-2", DSCP: probeDSCP})); err != nil {
		t.Fatal(err)
	}
	r.ext.Inject(tcp4tos(t, probeDSCP<<2, client, 40042, vip, 444, true))
	if p := r.waitPoints(trace.Filter{}, 1); p[0].LD != "ld-2" || p[0].Reason != "no_rule" {
		t.Fatalf("after Apply: %+v", p)
	}
	if err := r.d.Apply(testConfig()); err != nil {
		t.Fatal(err)
	}
	r.waitCount(dirIn, resNoRule, 2)
	r.ext.Inject(tcp4tos(t, probeDSCP<<2, client, 40043, vip, 444, true))
	r.waitCount(dirIn, resNoRule, 3)
	if rep := r.d.Trace(trace.Filter{}); rep.Enabled || len(rep.Points) != 1 {
		t.Fatalf("after tracing was turned off: enabled %v, %d points, want the one kept", rep.Enabled, len(rep.Points))
	}
}

// TestTraceConfigValidate: Config.Validate names the trace section's fields.
func TestTraceConfigValidate(t *testing.T) {
	cfg := traceConfig(TraceConfig{DSCP: 70, Records: 3})
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "trace.dscp") || !strings.Contains(err.Error(), "trace.records") {
		t.Fatalf("Validate: %v, want trace.dscp and trace.records named", err)
	}
	cfg = traceConfig(TraceConfig{DSCP: 1})
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if d := cfg.withDefaults(); d.Trace.LD == "" || d.Trace.Records != trace.DefaultRecords {
		t.Errorf("defaults: %+v", d.Trace)
	}
}

// TestTraceIPv6: the DSCP marker reads an IPv6 packet's traffic class; a marked
// packet to an address that is neither a VIP nor the LD's is a not_local drop point.
func TestTraceIPv6(t *testing.T) {
	r := startRig(t, traceConfig(TraceConfig{LD: "ld-test", DSCP: probeDSCP}), Options{})
	r.resolve()
	src, dst := netip.MustParseAddr("2001:db8::9"), netip.MustParseAddr("2001:db8::99")
	frame := func(tc uint8, sport uint16) []byte {
		ip := &layers.IPv6{Version: 6, TrafficClass: tc, HopLimit: 60, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: 53}
		_ = udp.SetNetworkLayerForChecksum(ip)
		return serialize(t, &layers.Ethernet{SrcMAC: gwMAC, DstMAC: extMAC[:], EthernetType: layers.EthernetTypeIPv6}, ip, udp)
	}
	r.ext.Inject(frame(0, 1000))
	r.ext.Inject(frame(probeDSCP<<2, 1001))
	r.waitCount(dirIn, resNotLocal, 2)
	pts := r.waitPoints(trace.Filter{}, 1)
	if len(pts) != 1 || pts[0].Reason != "not_local" || pts[0].Src != src.String() || pts[0].SrcPort != 1001 ||
		pts[0].Protocol != "udp" || !strings.HasPrefix(pts[0].Sample, "6b8") {
		t.Fatalf("points %+v: want the marked packet's not_local drop", pts)
	}
}

// TestTraceRate: past Config.Trace.Rate (here 1 a second, in bursts of 32) marked
// packets are counted as suppressed instead of recorded, and still forwarded.
func TestTraceRate(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := startRig(t, traceConfig(TraceConfig{LD: "ld-test", DSCP: probeDSCP, Rate: 1}), Options{Registerer: reg})
	r.resolve()
	const n = 40
	for i := range n {
		r.ext.Inject(tcp4tos(t, probeDSCP<<2, client, uint16(41000+i), vip, 443, true))
	}
	waitSent(t, r.int, n)
	r.waitCount(dirIn, resForwarded, n)
	got := gather(t, reg)
	rec, supp := got["tiergate_l4_trace_points_total{direction=in,ld=ld-test}"], got["tiergate_l4_trace_suppressed_total"]
	pts := len(r.d.Trace(trace.Filter{Limit: 1000}).Points)
	// One more token a second: a slow machine may record a few more than the burst.
	if rec < 32 || rec > 36 || rec+supp != n || float64(pts) != rec {
		t.Fatalf("recorded %v (%d points), suppressed %v; want 32 (a burst) and the rest of %d suppressed", rec, pts, supp, n)
	}
}
