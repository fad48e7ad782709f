package datapath

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/overload"
	"github.com/tiergate/tiergate/l4/packet"
)

// Values of OverloadConfig.Mode and OverloadConfig.Quotas, and the load signals of
// OverloadConfig.Signals.
const (
	OverloadAuto   = "auto"   // on when capacity_pps is set (default)
	OverloadOn     = "on"     // on; with capacity_pps 0 the load is busy share and table fill only
	OverloadOff    = "off"    // never protecting (static limits still apply)
	QuotasByWeight = "weight" // quotas follow limits.weight (default)
	QuotasByShare  = "share"  // quotas follow each rule's recent share of new connections

	SignalBusy  = "busy"  // the busiest worker's share of time spent working
	SignalTable = "table" // the fullest worker's connection-table fill
	SignalPPS   = "pps"   // forwarded packets per second over capacity_pps
)

// OverloadConfig is the LD's protection against more load than it can carry, as the
// CLB write-ups describe it: it watches its own load and, past the high watermark,
// gives each rule a quota of new connections per second (and, with Packets, of packets
// per second) that token buckets in every worker enforce, so that one VIP's surge
// cannot starve the others; once the load has stayed below the low watermark for
// Hold, it lifts the quotas. Established connections are never cut: a packet of a flow
// in the connection table is never refused a connection quota, and neither is a TCP
// packet without SYN that makes an entry (a connection picked up mid-way after a
// restart or an ECMP change). A quota's token buckets hold a second's worth of
// connections (a fifth of a second's worth of packets). The zero value protects only
// when CapacityPPS is set.
type OverloadConfig struct {
	// Mode is "auto" (default: on when capacity_pps is set, else off), "on" or
	// "off". With "on" and no capacity_pps, the load is the busy share and the
	// table fill only.
	Mode string `yaml:"mode" json:"mode,omitempty"`
	// CapacityPPS is the packets per second the whole LD (all its workers, both
	// directions) can forward; the pps signal is the packets it forwarded (to members
	// and back to clients) per second over it. Packets it drops are not counted:
	// quotas cannot make them fewer. Default 0: unknown, no pps signal.
	CapacityPPS int64 `yaml:"capacity_pps" json:"capacity_pps,omitempty"`
	// High is the watermark, a share of capacity, at which protection starts.
	// Default 0.7 (the CLB write-up's 70%).
	High float64 `yaml:"high" json:"high,omitempty"`
	// Low is the watermark below which protection is lifted, once the load has
	// stayed under it for Hold. Default 0.5; below High.
	Low float64 `yaml:"low" json:"low,omitempty"`
	// Hold is how long the load must stay below Low before quotas are lifted.
	// Default 5s.
	Hold config.Duration `yaml:"hold" json:"hold,omitempty"`
	// Interval is how often the load is measured and quotas recomputed, at least
	// 200ms. Default 1s.
	Interval config.Duration `yaml:"interval" json:"interval,omitempty"`
	// Signals are the load signals that count: "busy", "table", "pps"; the load is
	// the largest. Default all three ("pps" only counts when capacity_pps is set).
	Signals []string `yaml:"signals" json:"signals,omitempty"`
	// Quotas is how the budget of new connections is shared between rules while
	// protecting: "weight" (default), by each rule's limits.weight, or "share", by
	// each rule's share of the new connections while the LD was not protecting (an
	// average over about ShareWindow). Either way a rule that asks for less than its
	// part keeps its whole part, and only what it leaves goes to the others.
	Quotas string `yaml:"quotas" json:"quotas,omitempty"`
	// ShareWindow is the averaging window of the shares of "share". Default 60s.
	ShareWindow config.Duration `yaml:"share_window" json:"share_window,omitempty"`
	// Packets adds packet quotas: while protecting, each rule also gets a quota of
	// packets per second (shared like the connection quotas, from the packets it
	// was sent), and every packet to the rule over it is dropped, those of
	// established flows included (TCP resends them; the connections stay). Default
	// false: only new connections are limited.
	Packets bool `yaml:"packets" json:"packets,omitempty"`
	// MinQuota is the least quota a rule gets while protecting, in new connections
	// (or packets) per second for the whole LD. Default 10.
	MinQuota float64 `yaml:"min_quota" json:"min_quota,omitempty"`
	// KeepShare makes a rule's quota while protecting at least KeepShare times its
	// average rate while the LD was not protecting (over ShareWindow): a rule that has
	// not surged keeps its rate even when the load does not fall with the quotas
	// (the members' replies, their retransmissions to spoofed clients, established
	// flows) and the budget with it. Default 1.5; negative: no such floor.
	KeepShare float64 `yaml:"keep_share" json:"keep_share,omitempty"`
}

// RuleLimits are a rule's static limits, always in force when set (CLB's resource
// isolation), and its weight in overload quotas. A limit is for the whole LD; each of
// W workers enforces 1/W of it (flows are spread evenly over workers by the ports'
// hash), the concurrent connections rounded up. New connections refused by a limit
// are dropped as rule_limit; established flows are never cut.
type RuleLimits struct {
	// NewConnsPerSecond caps the new connections (TCP SYNs, UDP datagrams of new
	// flows) per second, with bursts of up to a fifth of a second's worth. Default 0:
	// none.
	NewConnsPerSecond float64 `yaml:"new_conns_per_second" json:"new_conns_per_second,omitempty"`
	// MaxConns caps the rule's entries in the connection table (half-open,
	// unconfirmed and established). Default 0: none.
	MaxConns int `yaml:"max_conns" json:"max_conns,omitempty"`
	// Weight is the rule's weight in overload quotas by weight. Default 1.
	Weight float64 `yaml:"weight" json:"weight,omitempty"`
}

const (
	defaultOvHigh      = 0.7
	defaultOvLow       = 0.5
	defaultOvHold      = 5 * time.Second
	defaultOvInterval  = time.Second
	defaultOvWindow    = time.Minute
	defaultOvMinQuota  = 10
	defaultOvKeep      = 1.5
	minOvInterval      = controlTick
	ovBurst            = 200 * time.Millisecond // bucket depth of limits and packet quotas, in time at their rate
	ovQuotaBurst       = time.Second            // bucket depth of connection quotas
	ovKindLimit        = 0
	ovKindQuota        = 1
	ovKindPacket       = 2
	numOvKinds         = 3
	ovStateNormal      = "normal"
	ovStateProtecting  = "protecting"
	ovSignalCount      = 4 // busy, table, pps, max
	ovSignalMax        = 3
	ovSignalBusyIndex  = 0
	ovSignalTableIndex = 1
	ovSignalPPSIndex   = 2
)

func (o OverloadConfig) withDefaults() OverloadConfig {
	if o.Mode == "" {
		o.Mode = OverloadAuto
	}
	if o.High == 0 {
		o.High = defaultOvHigh
	}
	if o.Low == 0 {
		o.Low = defaultOvLow
	}
	if o.Hold == 0 {
		o.Hold = config.Duration(defaultOvHold)
	}
	if o.Interval == 0 {
		o.Interval = config.Duration(defaultOvInterval)
	}
	if len(o.Signals) == 0 {
		o.Signals = []string{SignalBusy, SignalTable, SignalPPS}
	}
	if o.Quotas == "" {
		o.Quotas = QuotasByWeight
	}
	if o.ShareWindow == 0 {
		o.ShareWindow = config.Duration(defaultOvWindow)
	}
	if o.MinQuota == 0 {
		o.MinQuota = defaultOvMinQuota
	}
	if o.KeepShare == 0 {
		o.KeepShare = defaultOvKeep
	}
	return o
}

// enabled reports whether watermark protection is on (defaults filled in).
func (o *OverloadConfig) enabled() bool {
	return o.Mode == OverloadOn || o.Mode == OverloadAuto && o.CapacityPPS > 0
}

func (o *OverloadConfig) signal(name string) bool {
	for _, s := range o.Signals {
		if s == name {
			return true
		}
	}
	return false
}

// validateOverload checks Config.Overload and every rule's limits (defaults filled in).
func validateOverload(ck *config.Checker, d *Config) {
	o := &d.Overload
	bad := ck.Addf
	switch o.Mode {
	case OverloadAuto, OverloadOn, OverloadOff:
	default:
		bad("overload.mode", "%q is not auto, on or off", o.Mode)
	}
	if o.CapacityPPS < 0 {
		bad("overload.capacity_pps", "%d is negative", o.CapacityPPS)
	}
	if !(o.High > 0 && o.High <= 1) {
		bad("overload.high", "%v is outside (0, 1]", o.High)
	}
	if !(o.Low > 0 && o.Low < o.High) {
		bad("overload.low", "%v must be positive and below high (%v)", o.Low, o.High)
	}
	if o.Hold < 0 {
		bad("overload.hold", "%v is negative", o.Hold)
	}
	if o.Interval.D() < minOvInterval {
		bad("overload.interval", "%v is below %v", o.Interval, minOvInterval)
	}
	for i, s := range o.Signals {
		switch s {
		case SignalBusy, SignalTable, SignalPPS:
		default:
			bad(config.Index("overload.signals", i), "%q is not busy, table or pps", s)
		}
	}
	switch o.Quotas {
	case QuotasByWeight, QuotasByShare:
	default:
		bad("overload.quotas", "%q is not weight or share", o.Quotas)
	}
	if o.ShareWindow < 0 {
		bad("overload.share_window", "%v is negative", o.ShareWindow)
	}
	if !(o.MinQuota >= 0) || math.IsInf(o.MinQuota, 0) {
		bad("overload.min_quota", "%v is not a rate", o.MinQuota)
	}
	if math.IsNaN(o.KeepShare) || math.IsInf(o.KeepShare, 0) {
		bad("overload.keep_share", "%v is not a factor", o.KeepShare)
	}
	for i, r := range d.Rules {
		f := config.Index("rules", i) + ".limits"
		if !(r.Limits.NewConnsPerSecond >= 0) || math.IsInf(r.Limits.NewConnsPerSecond, 0) {
			bad(f+".new_conns_per_second", "%v is not a rate", r.Limits.NewConnsPerSecond)
		}
		if r.Limits.MaxConns < 0 {
			bad(f+".max_conns", "%d is negative", r.Limits.MaxConns)
		}
		if !(r.Limits.Weight >= 0) || math.IsInf(r.Limits.Weight, 0) {
			bad(f+".weight", "%v is not a weight", r.Limits.Weight)
		}
	}
}

// ovQuotas is what the workers enforce, published by the control goroutine
// (ovShared.q) and swapped whole. Values are for the whole LD; a worker enforces its
// share.
type ovQuotas struct {
	protecting bool
	packets    bool // packet quotas in force
	rules      []ovRuleQuota
}

// ovRuleQuota is one rule's limits and quotas (0: none).
type ovRuleQuota struct {
	cps      float64 // static new connections per second
	maxConns int     // static concurrent connections
	quota    float64 // new connections per second while protecting
	pktQuota float64 // packets per second while protecting, with Packets
}

// ovShared is the overload protection's state in the Distributor: what the workers
// enforce, what metrics and the status read, and the control goroutine's own part.
type ovShared struct {
	q           atomic.Pointer[ovQuotas]
	protecting  atomic.Bool
	since       atomic.Int64 // Unix nanoseconds of the last change of state
	load        [ovSignalCount]atomic.Uint64
	protections atomic.Uint64
	cfg         atomic.Pointer[OverloadConfig] // in force, for Status
	ctl         ovControl                      // the control goroutine's only
}

func (o *ovShared) loadShare(i int) float64 { return math.Float64frombits(o.load[i].Load()) }

// ovControl is the control goroutine's part: the controllers and the counters as
// last read.
type ovControl struct {
	cfg     OverloadConfig
	limits  []ovRuleQuota // static limits by rule ID, from the config
	names   []string      // rule names by rule ID
	weights []float64     // by rule ID
	conns   *overload.Controller
	pkts    *overload.Controller
	last    time.Time
	prev    []ovPrev // by worker: its counters as last read
	// the quotas last published, by rule ID, kept across a new configuration
	lastConns, lastPkts map[int]float64
}

// ovPrev is one worker's counters as the control goroutine last read them.
type ovPrev struct {
	at, busy int64
	fwd      uint64
	rules    []ovRuleCounts // by rule ID
	// the rates last computed, used again while the worker has not published since
	// (a worker held off its core for longer than the interval)
	fwdRate, busyShare float64
	ruleRates          []ovRuleRates
}

// ovRuleCounts are a rule's counters in one worker.
type ovRuleCounts struct {
	newFlows, drops, pkts, pdrops uint64
}

// ovRates are what the workers did per second since the last read: each worker's
// counters over the time between its own publications (every publishEvery), so that
// an interval that saw one publication more or less than the last is not misread.
type ovRates struct {
	fwd  float64 // packets forwarded per second, both directions
	busy float64 // the busiest worker's busy share
	fill float64 // the fullest worker's connection-table fill
	// by rule ID: new flows admitted and refused by the quota, packets forwarded and refused, per second
	rules []ovRuleRates
}

type ovRuleRates struct {
	newFlows, drops, pkts, pdrops float64
}

// workerOverload is a worker's part: the buckets it enforces and its counters.
type workerOverload struct {
	q      *ovQuotas // the quotas the buckets were set from
	active bool      // some limit or quota applies: new connections are checked
	pkts   bool      // packet quotas in force: every packet to a VIP is checked
	rules  []ovWorkerRule

	// The busy share: a loop that did work counts as busy from its start to the
	// next loop's start (the worker's clock, read once a loop anyway).
	loopStart int64
	busy      bool
	busyNs    int64

	drops [maxRules][numOvKinds]uint64
	pub   ovPublished
}

type ovWorkerRule struct {
	maxConns uint32
	cps      overload.Bucket
	quota    overload.Bucket
	pkt      overload.Bucket
	hasCPS   bool
	hasQuota bool
	hasPkt   bool
}

// ovPublished mirrors a worker's overload counters for the control goroutine and
// metrics.
type ovPublished struct {
	at     atomic.Int64 // the worker's clock (mono) when it last published
	busyNs atomic.Int64
	drops  [maxRules][numOvKinds]atomic.Uint64
	conns  [maxRules]atomic.Uint32
}

// ovLoop accounts the loop that just ended as busy or idle; the worker calls it at
// the start of each loop, with its clock read.
func (w *worker) ovLoop() {
	if w.ov.busy {
		w.ov.busyNs += w.mono - w.ov.loopStart
	}
	w.ov.loopStart = w.mono
}

// ovSync picks up new quotas: one atomic load per burst.
func (w *worker) ovSync() {
	q := w.d.ov.q.Load()
	if q == w.ov.q {
		return
	}
	o := &w.ov
	o.q = q
	o.active, o.pkts = false, false
	if q == nil {
		o.rules = o.rules[:0]
		return
	}
	if cap(o.rules) < len(q.rules) {
		nr := make([]ovWorkerRule, len(q.rules))
		copy(nr, o.rules)
		o.rules = nr
	}
	o.rules = o.rules[:len(q.rules)]
	n := float64(len(w.d.workers))
	set := func(b *overload.Bucket, rate float64, depth time.Duration) bool {
		if rate <= 0 {
			b.Set(0, 0)
			return false
		}
		r := rate / n
		b.Set(r, int(math.Ceil(r*depth.Seconds())))
		return true
	}
	for id := range q.rules {
		rq, wr := &q.rules[id], &o.rules[id]
		wr.maxConns = 0
		if rq.maxConns > 0 {
			wr.maxConns = uint32((rq.maxConns + len(w.d.workers) - 1) / len(w.d.workers))
		}
		wr.hasCPS = set(&wr.cps, rq.cps, ovBurst)
		// A second's worth: a rule under its quota whose clients' connections bunch
		// up (as they do behind a NAT or a stalled client) is not cut by the bunching.
		wr.hasQuota = q.protecting && set(&wr.quota, rq.quota, ovQuotaBurst)
		wr.hasPkt = q.protecting && q.packets && set(&wr.pkt, rq.pktQuota, ovBurst)
		if wr.maxConns > 0 || wr.hasCPS || wr.hasQuota {
			o.active = true
		}
		if wr.hasPkt {
			o.pkts = true
		}
	}
}

// admitNew decides whether a new flow of rule r may be made now: the rule's static
// limits (rule_limit), then its overload quota (overload_quota). A TCP packet other
// than a SYN is a connection picked up mid-way (an LD restart, an ECMP change),
// never refused; a reset makes no entry. A token is spent only when every check
// passes.
func (w *worker) admitNew(r *rule, p *packet.Packet) result {
	if p.Proto == packet.ProtoTCP && p.TCPFlags&(packet.TCPSyn|packet.TCPAck|packet.TCPRst) != packet.TCPSyn {
		return resForwarded
	}
	o := &w.ov
	if int(r.id) >= len(o.rules) {
		return resForwarded
	}
	wr := &o.rules[r.id]
	if wr.maxConns > 0 && w.table.RuleConns(r.id) >= wr.maxConns || wr.hasCPS && !wr.cps.Ready(w.mono) {
		o.drops[r.id][ovKindLimit]++
		return resRuleLimit
	}
	if wr.hasQuota && !wr.quota.Ready(w.mono) {
		o.drops[r.id][ovKindQuota]++
		return resOverloadQuota
	}
	if wr.hasCPS {
		wr.cps.Take()
	}
	if wr.hasQuota {
		wr.quota.Take()
	}
	return resForwarded
}

// admitPacket reports whether a packet to rule r fits its packet quota (only called
// while packet quotas are in force).
func (w *worker) admitPacket(r *rule) bool {
	o := &w.ov
	if int(r.id) >= len(o.rules) || !o.rules[r.id].hasPkt || o.rules[r.id].pkt.Allow(w.mono) {
		return true
	}
	o.drops[r.id][ovKindPacket]++
	return false
}

// ovPublish copies the worker's overload counters into their atomic mirror.
func (w *worker) ovPublish(s *snapshot) {
	o := &w.ov
	o.pub.busyNs.Store(o.busyNs)
	for id, r := range s.ruleByID {
		if r == nil {
			continue
		}
		for k := range numOvKinds {
			o.pub.drops[id][k].Store(o.drops[id][k])
		}
		o.pub.conns[id].Store(w.table.RuleConns(uint16(id)))
	}
	o.pub.at.Store(w.mono)
}

// ovApply takes a new configuration: the rules' static limits and weights, and the
// controllers' parameters. The control goroutine calls it after each apply.
func (c *control) ovApply() {
	oc := &c.d.ov.ctl
	oc.cfg = c.cfg.Overload
	cfg := oc.cfg
	c.d.ov.cfg.Store(&cfg)
	n := 0
	for _, id := range c.ruleIDs {
		n = max(n, int(id)+1)
	}
	oc.limits = make([]ovRuleQuota, n)
	oc.names = make([]string, n)
	oc.weights = make([]float64, n)
	for _, rc := range c.cfg.Rules {
		id := c.ruleIDs[rc.Name]
		oc.limits[id] = ovRuleQuota{cps: rc.Limits.NewConnsPerSecond, maxConns: rc.Limits.MaxConns}
		oc.names[id] = rc.Name
		oc.weights[id] = rc.Limits.Weight
		if oc.weights[id] == 0 {
			oc.weights[id] = 1
		}
	}
	p := overload.Params{High: oc.cfg.High, Low: oc.cfg.Low, Hold: oc.cfg.Hold.D(),
		ByShare: oc.cfg.Quotas == QuotasByShare, ShareWindow: oc.cfg.ShareWindow.D(), Floor: oc.cfg.MinQuota,
		Keep: oc.cfg.KeepShare}
	if oc.conns == nil {
		oc.conns, oc.pkts = overload.NewController(p), overload.NewController(p)
	}
	oc.conns.P, oc.pkts.P = p, p
	if oc.prev == nil {
		oc.prev = make([]ovPrev, len(c.d.workers))
	}
	for i := range oc.prev {
		if len(oc.prev[i].rules) < n {
			oc.prev[i].rules = append(oc.prev[i].rules, make([]ovRuleCounts, n-len(oc.prev[i].rules))...)
		}
	}
	prot := false
	if q := c.d.ov.q.Load(); q != nil && oc.cfg.enabled() {
		prot = q.protecting
	}
	if !oc.cfg.enabled() {
		// Turned off: forget the state, so that turning it on starts normal.
		oc.conns, oc.pkts = overload.NewController(p), overload.NewController(p)
	}
	if !prot {
		oc.lastConns, oc.lastPkts = nil, nil
	}
	c.ovPublish(prot, oc.lastConns, oc.lastPkts)
	if !prot && c.d.ov.protecting.Load() {
		c.d.ov.since.Store(time.Now().UnixNano())
		c.d.ov.protecting.Store(false)
	}
}

// ovPublish publishes the static limits with the quotas given by rule ID (none for
// a rule not in them).
func (c *control) ovPublish(protecting bool, conns, pkts map[int]float64) {
	oc := &c.d.ov.ctl
	oc.lastConns, oc.lastPkts = conns, pkts
	q := &ovQuotas{protecting: protecting, packets: protecting && oc.cfg.Packets, rules: make([]ovRuleQuota, len(oc.limits))}
	copy(q.rules, oc.limits)
	enforce := protecting
	for id := range q.rules {
		q.rules[id].quota = conns[id]
		q.rules[id].pktQuota = pkts[id]
		if q.rules[id].cps > 0 || q.rules[id].maxConns > 0 {
			enforce = true
		}
	}
	if !enforce {
		q = nil // nothing to enforce: the workers check nothing
	}
	c.d.ov.q.Store(q)
}

// ovTick measures the load once an interval and, when protection is on, updates the
// quotas. The control goroutine calls it on its tick.
func (c *control) ovTick(now time.Time) {
	oc := &c.d.ov.ctl
	if oc.conns == nil {
		return
	}
	if oc.last.IsZero() {
		oc.last = now
		c.ovRead()
		return
	}
	dt := now.Sub(oc.last)
	if dt < oc.cfg.Interval.D()-controlTick/2 {
		return
	}
	oc.last = now
	rates := c.ovRead()
	var rules, prules []overload.Rule
	for id, name := range oc.names {
		if name == "" {
			continue
		}
		rr := rates.rules[id]
		rules = append(rules, overload.Rule{ID: id, Weight: oc.weights[id], Demand: rr.newFlows + rr.drops, Admitted: rr.newFlows})
		prules = append(prules, overload.Rule{ID: id, Weight: oc.weights[id], Demand: rr.pkts + rr.pdrops, Admitted: rr.pkts})
	}
	load := overload.Load{Busy: min(rates.busy, 1), Table: rates.fill}
	if oc.cfg.CapacityPPS > 0 {
		load.PPS = rates.fwd / float64(oc.cfg.CapacityPPS)
	}
	sig := [ovSignalCount]float64{load.Busy, load.Table, load.PPS}
	var counted overload.Load
	if oc.cfg.signal(SignalBusy) {
		counted.Busy = load.Busy
	}
	if oc.cfg.signal(SignalTable) {
		counted.Table = load.Table
	}
	if oc.cfg.signal(SignalPPS) {
		counted.PPS = load.PPS
	}
	sig[ovSignalMax] = counted.Max()
	for i, v := range sig {
		c.d.ov.load[i].Store(math.Float64bits(v))
	}
	if !oc.cfg.enabled() {
		return
	}
	r := oc.conns.Step(now, sig[ovSignalMax], rules)
	rp := oc.pkts.Follow(now, sig[ovSignalMax], prules, r)
	// The quotas first, then the state: whoever sees the state sees its quotas in force.
	switch {
	case r.Protecting:
		conns := make(map[int]float64, len(rules))
		pkts := make(map[int]float64, len(prules))
		for i, x := range r.Quotas {
			conns[rules[i].ID] = x
		}
		for i, x := range rp.Quotas {
			pkts[prules[i].ID] = x
		}
		c.ovPublish(true, conns, pkts)
	case r.Changed:
		c.ovPublish(false, nil, nil)
	}
	if r.Changed {
		c.d.ov.since.Store(now.UnixNano())
		if r.Protecting {
			c.d.ov.protections.Add(1)
			c.log.Warn("l4: overload: protecting, new connections get quotas per rule", "load", sig[ovSignalMax],
				"busy", load.Busy, "table", load.Table, "pps", load.PPS, "budget", r.Budget)
		} else {
			c.log.Info("l4: overload: load below the low watermark, quotas lifted", "load", sig[ovSignalMax])
		}
		c.d.ov.protecting.Store(r.Protecting)
	}
}

// ovRead reads the workers' published counters and returns what they did per second
// since the last read. A worker that has not published since counts with its rates
// of the last read.
func (c *control) ovRead() ovRates {
	oc := &c.d.ov.ctl
	r := ovRates{rules: make([]ovRuleRates, len(oc.names))}
	for i, w := range c.d.workers {
		pv := &oc.prev[i]
		if len(pv.ruleRates) < len(oc.names) {
			pv.ruleRates = append(pv.ruleRates, make([]ovRuleRates, len(oc.names)-len(pv.ruleRates))...)
		}
		if at := w.ov.pub.at.Load(); at > pv.at {
			dt := float64(at - pv.at)
			sec := dt / float64(time.Second)
			pv.at = at
			fwd := w.pub.packets[dirIn][resForwarded].Load() + w.pub.packets[dirOut][resForwarded].Load()
			pv.fwdRate = float64(fwd-pv.fwd) / sec
			pv.fwd = fwd
			b := w.ov.pub.busyNs.Load()
			pv.busyShare = float64(b-pv.busy) / dt
			pv.busy = b
			for id, name := range oc.names {
				if name == "" || id >= len(pv.rules) {
					continue
				}
				now := ovRuleCounts{
					newFlows: w.pub.newFlows[id].Load(),
					// what passed the rule's static limits: those are not the quotas' to lift
					drops:  w.ov.pub.drops[id][ovKindQuota].Load(),
					pkts:   w.pub.rule[id].Load(),
					pdrops: w.ov.pub.drops[id][ovKindPacket].Load(),
				}
				p := pv.rules[id]
				pv.ruleRates[id] = ovRuleRates{
					newFlows: float64(now.newFlows-p.newFlows) / sec,
					drops:    float64(now.drops-p.drops) / sec,
					pkts:     float64(now.pkts-p.pkts) / sec,
					pdrops:   float64(now.pdrops-p.pdrops) / sec,
				}
				pv.rules[id] = now
			}
		}
		r.fwd += pv.fwdRate
		r.busy = max(r.busy, pv.busyShare)
		if capa := w.table.Cap(); capa > 0 {
			r.fill = max(r.fill, float64(w.pub.tableLen.Load())/float64(capa))
		}
		for id := range r.rules {
			rr, x := &r.rules[id], pv.ruleRates[id]
			rr.newFlows += x.newFlows
			rr.drops += x.drops
			rr.pkts += x.pkts
			rr.pdrops += x.pdrops
		}
	}
	return r
}

// OverloadStatus is the overload protection's view in Status.
type OverloadStatus struct {
	// Enabled is whether watermark protection is on (Mode, CapacityPPS).
	Enabled bool `json:"enabled"`
	// State is "normal" or "protecting", Since when it last changed.
	State string    `json:"state"`
	Since time.Time `json:"since,omitzero"`
	// Load is the load the watermarks compare, and Busy, Table and PPS its signals
	// (shares of capacity), as last measured.
	Load  float64 `json:"load"`
	Busy  float64 `json:"busy"`
	Table float64 `json:"table"`
	PPS   float64 `json:"pps"`
	// Protections counts the times protection started.
	Protections uint64 `json:"protections"`
	// Rules are the rules' limits, quotas and drops.
	Rules []RuleOverloadStatus `json:"rules"`
}

// RuleOverloadStatus is one rule's limits, quotas (per second, for the LD; 0: none)
// and the new connections and packets they refused.
type RuleOverloadStatus struct {
	Name              string  `json:"name"`
	NewConnsPerSecond float64 `json:"new_conns_per_second,omitempty"`
	MaxConns          int     `json:"max_conns,omitempty"`
	Connections       uint64  `json:"connections"`
	ConnQuota         float64 `json:"conn_quota,omitempty"`
	PacketQuota       float64 `json:"packet_quota,omitempty"`
	RuleLimitDrops    uint64  `json:"rule_limit_drops"`
	QuotaDrops        uint64  `json:"overload_quota_drops"`
}

// overloadStatus reads the overload protection's state for Status.
func (d *Distributor) overloadStatus(s *snapshot) OverloadStatus {
	cfg := d.ovConfig()
	st := OverloadStatus{Enabled: cfg.enabled(), State: ovStateNormal, Protections: d.ov.protections.Load(),
		Load: d.ov.loadShare(ovSignalMax), Busy: d.ov.loadShare(ovSignalBusyIndex),
		Table: d.ov.loadShare(ovSignalTableIndex), PPS: d.ov.loadShare(ovSignalPPSIndex), Rules: []RuleOverloadStatus{}}
	if d.ov.protecting.Load() {
		st.State = ovStateProtecting
	}
	if ns := d.ov.since.Load(); ns != 0 {
		st.Since = time.Unix(0, ns).UTC()
	}
	q := d.ov.q.Load()
	for id, r := range s.ruleByID {
		if r == nil {
			continue
		}
		rs := RuleOverloadStatus{Name: r.name}
		if q != nil && id < len(q.rules) {
			rq := q.rules[id]
			rs.NewConnsPerSecond, rs.MaxConns, rs.ConnQuota, rs.PacketQuota = rq.cps, rq.maxConns, rq.quota, rq.pktQuota
		}
		for _, w := range d.workers {
			rs.Connections += uint64(w.ov.pub.conns[id].Load())
			rs.RuleLimitDrops += w.ov.pub.drops[id][ovKindLimit].Load()
			rs.QuotaDrops += w.ov.pub.drops[id][ovKindQuota].Load() + w.ov.pub.drops[id][ovKindPacket].Load()
		}
		st.Rules = append(st.Rules, rs)
	}
	return st
}

// ovConfig is the overload configuration in force, kept for readers other than the
// control goroutine.
func (d *Distributor) ovConfig() OverloadConfig {
	if p := d.ov.cfg.Load(); p != nil {
		return *p
	}
	return OverloadConfig{}
}

var (
	descOvState = prometheus.NewDesc("tiergate_l4_overload_state",
		"Overload protection: 0 normal, 1 protecting (rules' new connections get quotas).", nil, nil)
	descOvLoad = prometheus.NewDesc("tiergate_l4_overload_load",
		"The LD's load as a share of what it carries, by signal: busy (busiest worker's time working), table (fullest connection table), pps (forwarded packets per second over capacity_pps), max (of the signals that count: what the watermarks compare).",
		[]string{"signal"}, nil)
	descOvProtections = prometheus.NewDesc("tiergate_l4_overload_protections_total",
		"Times overload protection started (the load reached the high watermark).", nil, nil)
	descRuleQuota = prometheus.NewDesc("tiergate_l4_rule_quota",
		"A rule's overload quota per second for the whole LD while protecting, by kind (connections: new connections; packets, with overload.packets); 0 when none.",
		[]string{"rule", "kind"}, nil)
	descRuleLimited = prometheus.NewDesc("tiergate_l4_rule_limited_total",
		"A rule's packets dropped by its static limits (rule_limit) or its overload quota (overload_quota).", []string{"rule", "reason"}, nil)
	descRuleConns = prometheus.NewDesc("tiergate_l4_rule_connections",
		"A rule's entries in the connection tables (what limits.max_conns caps).", []string{"rule"}, nil)
)

var ovSignalNames = [ovSignalCount]string{SignalBusy, SignalTable, SignalPPS, "max"}

func ovDescribe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOvState, descOvLoad, descOvProtections, descRuleQuota, descRuleLimited, descRuleConns} {
		ch <- d
	}
}

// ovCollect reports the overload metrics.
func (c *collector) ovCollect(ch chan<- prometheus.Metric, s *snapshot) {
	d := c.d
	ch <- prometheus.MustNewConstMetric(descOvState, prometheus.GaugeValue, b2f(d.ov.protecting.Load()))
	for i, n := range ovSignalNames {
		ch <- prometheus.MustNewConstMetric(descOvLoad, prometheus.GaugeValue, d.ov.loadShare(i), n)
	}
	ch <- prometheus.MustNewConstMetric(descOvProtections, prometheus.CounterValue, float64(d.ov.protections.Load()))
	q := d.ov.q.Load()
	for id, r := range s.ruleByID {
		if r == nil {
			continue
		}
		var cq, pq float64
		if q != nil && id < len(q.rules) {
			cq, pq = q.rules[id].quota, q.rules[id].pktQuota
		}
		var lim, quota, conns uint64
		for _, w := range d.workers {
			lim += w.ov.pub.drops[id][ovKindLimit].Load()
			quota += w.ov.pub.drops[id][ovKindQuota].Load() + w.ov.pub.drops[id][ovKindPacket].Load()
			conns += uint64(w.ov.pub.conns[id].Load())
		}
		ch <- prometheus.MustNewConstMetric(descRuleQuota, prometheus.GaugeValue, cq, r.name, "connections")
		ch <- prometheus.MustNewConstMetric(descRuleQuota, prometheus.GaugeValue, pq, r.name, "packets")
		ch <- prometheus.MustNewConstMetric(descRuleLimited, prometheus.CounterValue, float64(lim), r.name, resultNames[resRuleLimit])
		ch <- prometheus.MustNewConstMetric(descRuleLimited, prometheus.CounterValue, float64(quota), r.name, resultNames[resOverloadQuota])
		ch <- prometheus.MustNewConstMetric(descRuleConns, prometheus.GaugeValue, float64(conns), r.name)
	}
}
