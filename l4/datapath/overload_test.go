package datapath

import (
	"errors"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/port"
)

var vipB = netip.MustParseAddr("203.0.113.11")

// overloadConfig is testConfig with a second TCP rule ("b", on vipB) and protection
// on a low capacity, measured by forwarded packets only (so that a busy machine's
// scheduling does not count as load).
func overloadConfig() Config {
	cfg := testConfig()
	cfg.Rules = append(cfg.Rules, RuleConfig{Name: "b", VIP: vipB, Protocol: "tcp", Port: 443, Pool: "l7"})
	cfg.Overload = OverloadConfig{
		Mode: OverloadOn, CapacityPPS: 200, Signals: []string{SignalPPS},
		Interval: config.Duration(200 * time.Millisecond), Hold: config.Duration(time.Second), MinQuota: 1,
		ShareWindow: config.Duration(time.Second), KeepShare: 3,
	}
	return cfg
}

// ruleID returns the ID of the rule named name.
func (r *rig) ruleID(name string) int {
	r.t.Helper()
	for id, ru := range r.d.snap.Load().ruleByID {
		if ru != nil && ru.name == name {
			return id
		}
	}
	r.t.Fatalf("no rule %q", name)
	return 0
}

// ruleCounts returns a rule's new flows, rule_limit and overload_quota drops as the
// workers last published them.
func (r *rig) ruleCounts(id int) (newFlows, limit, quota uint64) {
	for _, w := range r.d.workers {
		newFlows += w.pub.newFlows[id].Load()
		limit += w.ov.pub.drops[id][ovKindLimit].Load()
		quota += w.ov.pub.drops[id][ovKindQuota].Load()
	}
	return
}

// waitRule waits until a rule's new flows and drops add up to want (every SYN sent
// has been decided and published).
func (r *rig) waitRule(id int, want uint64) (newFlows, limit, quota uint64) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		newFlows, limit, quota = r.ruleCounts(id)
		if newFlows+limit+quota >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if newFlows+limit+quota != want {
		r.t.Fatalf("rule %d: %d new flows + %d rule_limit + %d overload_quota, want %d SYNs decided", id, newFlows, limit, quota, want)
	}
	return
}

// clientAddr is the n-th of many client addresses (198.18.128.0/17 is not on the
// LD's links).
func clientAddr(n int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18, 128 + byte(n>>8&0x7f), byte(n)})
}

// TestOverloadThrottlesTheSurgingRule: past the watermark, the rule whose new
// connections surge is held to a quota while the other rule keeps its whole rate, and
// the surging rule's established flows keep flowing; the quotas are lifted once the
// surge ends.
func TestOverloadThrottlesTheSurgingRule(t *testing.T) {
	r := newRig(t, overloadConfig())
	r.resolve()
	a, b := r.ruleID("web"), r.ruleID("b")
	if st := r.d.Status().Overload; !st.Enabled || st.State != ovStateNormal {
		t.Fatalf("overload status %+v, want enabled and normal", st)
	}

	// Five established flows of rule a, from their own client.
	est := netip.MustParseAddr("192.0.2.200")
	for i := range 5 {
		r.ext.Inject(tcp4(t, est, uint16(5000+i), vip, 443, true, false, nil))
	}
	waitSent(t, r.int, 5)
	data := make([][]byte, 5)
	for i := range data {
		data[i] = tcp4(t, est, uint16(5000+i), vip, 443, false, true, []byte("established"))
	}

	var sentA, sentB, sentData, n int
	synA := func(k int) {
		for range k {
			r.ext.Inject(tcp4(t, clientAddr(n), uint16(1024+n%60000), vip, 443, true, false, nil))
			n++
			sentA++
		}
	}
	synB := func() {
		r.ext.Inject(tcp4(t, clientAddr(n), uint16(1024+n%60000), vipB, 443, true, false, nil))
		n++
		sentB++
	}
	var dataSeen int
	drain := func() {
		for _, f := range r.int.Drain() {
			if len(f) < 14+20+4+40 || f[12] != 0x08 || f[13] != 0 || f[14+9] != 47 {
				continue
			}
			// Outer Ethernet, IPv4 and GRE; the inner IPv4 packet's source and TCP payload.
			in := f[14+20+4:]
			ihl := int(in[0]&0xf) * 4
			doff := int(in[ihl+12]>>4) * 4
			if netip.AddrFrom4([4]byte(in[12:16])) == est && len(in) > ihl+doff {
				dataSeen++
			}
		}
		r.ext.Drain()
	}
	// run sends, every 10 ms for d, perTick SYNs of rule a, a SYN of rule b every 50
	// ms (20/s) and a data packet of an established flow every 100 ms, until d
	// passes or stop says so.
	run := func(d time.Duration, perTick int, stop func() bool) {
		start := time.Now()
		for tick := 0; time.Since(start) < d; tick++ {
			synA(perTick)
			if tick%5 == 0 {
				synB()
			}
			if tick%10 == 0 {
				r.ext.Inject(data[sentData%5])
				sentData++
			}
			drain()
			if stop != nil && stop() {
				return
			}
			time.Sleep(time.Until(start.Add(time.Duration(tick+1) * 10 * time.Millisecond)))
		}
	}

	// Calm: rule b at 20/s, 30 packets/s forwarded of a capacity of 200.
	run(time.Second, 0, nil)
	if r.d.ov.protecting.Load() {
		t.Fatal("protecting at 20% load")
	}
	// Surge: rule a at 800 SYNs per second, four times the capacity.
	protecting := func() bool { return r.d.ov.protecting.Load() }
	run(5*time.Second, 8, protecting)
	if !protecting() {
		t.Fatalf("not protecting after a surge of 800 new connections/s on a capacity of 200 pps (load %v)", r.d.ov.loadShare(ovSignalMax))
	}
	// Let the quotas settle, then go on for two seconds.
	run(2*time.Second, 8, nil)
	st := r.d.Status().Overload
	if st.State != ovStateProtecting || st.Protections != 1 {
		t.Fatalf("status %+v, want protecting once", st)
	}
	var quotaA, quotaB float64
	for _, rs := range st.Rules {
		switch rs.Name {
		case "web":
			quotaA = rs.ConnQuota
		case "b":
			quotaB = rs.ConnQuota
		}
	}
	if quotaA <= 0 || quotaB < 20 {
		t.Fatalf("quotas web %v b %v: want a quota for the surging rule and at least b's 20/s for b", quotaA, quotaB)
	}

	nfA, limA, qA := r.waitRule(a, uint64(sentA+5))
	nfB, limB, qB := r.waitRule(b, uint64(sentB))
	drain()
	t.Logf("rule a: %d SYNs, %d admitted, %d over quota; rule b: %d SYNs, %d admitted; quotas %.0f/s %.0f/s; load %.2f",
		sentA, nfA, qA, sentB, nfB, quotaA, quotaB, st.Load)
	if qB != 0 || limB != 0 || nfB != uint64(sentB) {
		t.Fatalf("rule b, under its share, lost new connections: %d of %d admitted (%d over quota)", nfB, sentB, qB)
	}
	if limA != 0 || qA < uint64(sentA)/3 {
		t.Fatalf("rule a's surge was not throttled: %d of %d SYNs over quota", qA, sentA)
	}
	deadline := time.Now().Add(3 * time.Second)
	for dataSeen < sentData && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		drain()
	}
	if dataSeen != sentData {
		t.Fatalf("%d of %d packets of rule a's established flows forwarded while protecting", dataSeen, sentData)
	}

	// The surge ends: calm for longer than the hold lifts the quotas.
	run(5*time.Second, 0, func() bool { return !r.d.ov.protecting.Load() })
	if r.d.ov.protecting.Load() {
		t.Fatalf("still protecting after the surge ended (load %v)", r.d.ov.loadShare(ovSignalMax))
	}
	if q := r.d.ov.q.Load(); q != nil {
		t.Fatalf("quotas %+v still published after protection was lifted", q)
	}
}

// TestRuleLimits: a rule's static limits cap its concurrent connections and its new
// connections per second (rule_limit), without protection, and never its
// established flows.
func TestRuleLimits(t *testing.T) {
	cfg := testConfig()
	cfg.Rules[0].Limits = RuleLimits{MaxConns: 3}
	cfg.Rules = append(cfg.Rules, RuleConfig{Name: "b", VIP: vipB, Protocol: "tcp", Port: 443, Pool: "l7",
		Limits: RuleLimits{NewConnsPerSecond: 2}})
	reg := prometheus.NewRegistry()
	r := startRig(t, cfg, Options{Registerer: reg})
	r.resolve()
	a, b := r.ruleID("web"), r.ruleID("b")

	for i := range 5 {
		r.ext.Inject(tcp4(t, client, uint16(2000+i), vip, 443, true, false, nil))
	}
	nf, lim, _ := r.waitRule(a, 5)
	if nf != 3 || lim != 2 {
		t.Fatalf("max_conns 3: %d of 5 connections made, %d refused; want 3 and 2", nf, lim)
	}
	r.waitCount(dirIn, resRuleLimit, 2)
	waitSent(t, r.int, 3)
	// The three connections' packets pass.
	for i := range 3 {
		r.ext.Inject(tcp4(t, client, uint16(2000+i), vip, 443, false, true, []byte("x")))
	}
	waitSent(t, r.int, 3)

	// 2 per second, bursts of one: of 20 SYNs at once, one passes.
	frames := make([][]byte, 20)
	for i := range frames {
		frames[i] = tcp4(t, client, uint16(3000+i), vipB, 443, true, false, nil)
	}
	start := time.Now()
	r.ext.Inject(frames...)
	nf, lim, _ = r.waitRule(b, 20)
	// A token comes every 500 ms: at most one more if handling the burst took that long.
	if extra := int(time.Since(start) / (500 * time.Millisecond)); nf < 1 || int(nf) > 1+extra {
		t.Fatalf("new_conns_per_second 2: %d of 20 SYNs at once passed (%d refused)", nf, lim)
	}
	if rs := r.d.Status().Overload; rs.Enabled || rs.State != ovStateNormal {
		t.Fatalf("static limits alone turned protection on: %+v", rs)
	}
	// The metrics: the drops by rule and reason, the rules' connections, the state.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			k := mf.GetName()
			for _, l := range m.GetLabel() {
				k += "," + l.GetName() + "=" + l.GetValue()
			}
			got[k] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	for k, want := range map[string]float64{
		"tiergate_l4_rule_limited_total,reason=rule_limit,rule=web":     2,
		"tiergate_l4_rule_limited_total,reason=overload_quota,rule=web": 0,
		"tiergate_l4_rule_limited_total,reason=rule_limit,rule=b":       float64(lim),
		"tiergate_l4_rule_connections,rule=web":                         3,
		"tiergate_l4_overload_state":                                    0,
		"tiergate_l4_rule_quota,kind=connections,rule=web":              0,
		"tiergate_l4_packets_total,dir=in,result=rule_limit":            float64(2 + lim),
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
}

// TestOverloadOffByDefault: the zero configuration publishes nothing to enforce, so
// the workers check nothing.
func TestOverloadOffByDefault(t *testing.T) {
	r := newRig(t, testConfig())
	r.resolve() // the control goroutine runs: Apply goes through it
	if q := r.d.ov.q.Load(); q != nil {
		t.Fatalf("quotas published for a configuration with no limits: %+v", q)
	}
	if st := r.d.Status().Overload; st.Enabled {
		t.Fatalf("protection on without capacity_pps: %+v", st)
	}
	cfg := testConfig()
	cfg.Overload.CapacityPPS = 1000
	if err := r.d.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	if st := r.d.Status().Overload; !st.Enabled {
		t.Fatalf("protection off with capacity_pps set (mode auto): %+v", st)
	}
}

func TestOverloadConfigValidation(t *testing.T) {
	cfg := testConfig()
	cfg.Overload = OverloadConfig{Mode: "sometimes", High: 0.5, Low: 0.6, Interval: config.Duration(time.Millisecond),
		Signals: []string{"pps", "cpu"}, Quotas: "fair", CapacityPPS: -1}
	cfg.Rules[0].Limits = RuleLimits{NewConnsPerSecond: -1, MaxConns: -2, Weight: -3}
	err := cfg.Validate()
	want := []string{"overload.mode", "overload.capacity_pps", "overload.low", "overload.interval",
		"overload.signals[1]", "overload.quotas", "rules[0].limits.new_conns_per_second",
		"rules[0].limits.max_conns", "rules[0].limits.weight"}
	for _, f := range want {
		found := false
		for _, e := range unwrapAll(err) {
			var fe *config.FieldError
			if errors.As(e, &fe) && fe.Path == f {
				found = true
			}
		}
		if !found {
			t.Errorf("no error for %s in %v", f, err)
		}
	}
	if cfg := testConfig(); cfg.Validate() != nil {
		t.Fatalf("the zero overload config is refused: %v", cfg.Validate())
	}
	if !strings.Contains(err.Error(), "overload.quotas") {
		t.Fatal(err)
	}
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unwrapAll(e)...)
		}
		return out
	}
	return []error{err}
}

// BenchmarkOverloadCheck is the per-packet cost of overload protection and rule
// limits in the worker: on the established path (a flow in the table) with nothing
// in force, while protecting with connection quotas (nothing more to check), and with
// packet quotas (a token bucket per packet); on the new-flow path with nothing in
// force and while protecting (a quota bucket per SYN, never empty here). Compare the
// sub-benchmarks' ns/op with each other in one run.
func BenchmarkOverloadCheck(b *testing.B) {
	const flows = 1 << 16
	setup := func(b *testing.B, protect, packets bool, capacity int) (*worker, *snapshot) {
		w, s := benchWorker(b, capacity)
		if protect {
			n := len(s.ruleByID)
			q := &ovQuotas{protecting: true, packets: packets, rules: make([]ovRuleQuota, n)}
			for i := range q.rules {
				q.rules[i].quota, q.rules[i].pktQuota = 1e12, 1e12
			}
			w.d.ov.q.Store(q)
		}
		w.ovSync()
		return w, s
	}
	run := func(b *testing.B, w *worker, s *snapshot, frames [][]byte) {
		buf := port.Buf{Data: make([]byte, 2048)}
		runtime.GC()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			f := frames[i&(flows-1)]
			buf.Off, buf.Len = 128, copy(buf.Data[128:], f)
			if w.handleFrame(s, &buf, true) != vInt {
				b.Fatal("not forwarded")
			}
		}
	}
	for _, c := range []struct {
		name             string
		protect, packets bool
	}{{"off", false, false}, {"protecting", true, false}, {"packet_quotas", true, true}} {
		b.Run("established/"+c.name, func(b *testing.B) {
			w, s := setup(b, c.protect, c.packets, 2*flows)
			syns := benchFrames(b, flows, true)
			buf := port.Buf{Data: make([]byte, 2048)}
			for _, f := range syns {
				buf.Off, buf.Len = 128, copy(buf.Data[128:], f)
				w.handleFrame(s, &buf, true)
			}
			run(b, w, s, benchFrames(b, flows, false))
		})
	}
	for _, c := range []struct {
		name    string
		protect bool
	}{{"off", false}, {"protecting", true}} {
		b.Run("new/"+c.name, func(b *testing.B) {
			// A table of half as many entries as flows: each SYN's entry has been
			// evicted (oldest half-open first) by the time its flow comes round
			// again, so every SYN is a new flow.
			w, s := setup(b, c.protect, false, flows/2)
			run(b, w, s, benchFrames(b, flows, true))
		})
	}
}

// TestPacketQuota: with packet quotas in force, a rule's packets past its quota are
// dropped as overload_quota, those of established flows included, and other rules'
// packets pass.
func TestPacketQuota(t *testing.T) {
	w, s := benchWorker(t, 1024)
	buf := port.Buf{Data: make([]byte, 2048)}
	handle := func(f []byte) verdict {
		buf.Off, buf.Len = 128, copy(buf.Data[128:], f)
		return w.handleFrame(s, &buf, true)
	}
	if v := handle(tcp4(t, client, 4000, vip, 443, true, false, nil)); v != vInt {
		t.Fatalf("SYN verdict %d", v)
	}
	web := 0
	for id, r := range s.ruleByID {
		if r != nil && r.name == "web" {
			web = id
		}
	}
	// 5 packets a second for the LD's one worker, bursts of one; no quota for the others.
	q := &ovQuotas{protecting: true, packets: true, rules: make([]ovRuleQuota, len(s.ruleByID))}
	q.rules[web].pktQuota = 5
	w.d.ov.q.Store(q)
	w.ovSync()
	if !w.ov.pkts {
		t.Fatal("packet quotas not in force in the worker")
	}
	w.mono = int64(time.Hour)
	ack := tcp4(t, client, 4000, vip, 443, false, true, []byte("data"))
	passed := 0
	for range 20 {
		if handle(ack) == vInt {
			passed++
		}
	}
	if passed != 1 || w.ov.drops[web][ovKindPacket] != 19 || w.c.packets[dirIn][resOverloadQuota] != 19 {
		t.Fatalf("%d of 20 packets passed a quota of 5/s with bursts of 1 (%d dropped)", passed, w.ov.drops[web][ovKindPacket])
	}
	w.mono += int64(200 * time.Millisecond)
	if handle(ack) != vInt {
		t.Fatal("no packet passed 200 ms later at 5/s")
	}
	// Another rule has no packet quota.
	for i := range 20 {
		if v := handle(udp4(t, client, uint16(6000+i), vip, 443, []byte("initial"))); v != vInt {
			t.Fatalf("a packet of the quic rule, which has no packet quota, got verdict %d", v)
		}
	}
}
