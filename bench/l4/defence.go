package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/l4/datapath"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/testkit/synflood"
)

// The defence rows (issue 17): the SYN proxy's cookie answers per core against the
// kernel's nftables synproxy, established flows with the SYN proxy on ÷ off, and what
// overload control and tracing cost each packet of established flows.

// defencePhases are the phases of the defence rows.
var defencePhases = []string{"synproxy", "synproxy-established", "overload", "trace"}

// synFloodSources are the spoofed clients of the LD's SYN-proxy rows: 198.19.0.0/16,
// which no other in-memory row uses (their clients are spread over the IPv4 space).
var synFloodSources = netip.MustParsePrefix("198.19.0.0/16")

// defenceResults are the defence rows.
type defenceResults struct {
	Synproxy    *synproxyResults `json:"synproxy,omitempty"`
	Established *featureResults  `json:"synproxy_established,omitempty"`
	Overload    *featureResults  `json:"overload,omitempty"`
	Protecting  *featureResults  `json:"overload_protecting,omitempty"`
	Trace       *featureResults  `json:"trace_dscp,omitempty"`
	TraceOption *featureResults  `json:"trace_tcp_option,omitempty"`
	// NotAvailable says, per row, why it was not measured (a datapath feature not
	// there yet).
	NotAvailable map[string]string `json:"not_available,omitempty"`
}

// synproxyRound is one round of the SYN-proxy rows: the LD's cookie answers on one
// worker, then (or before) the kernel's SYN proxy on one core.
type synproxyRound struct {
	LD     *phaseResult          `json:"ld"`
	Kernel *kernelSynproxyResult `json:"kernel"`
	// Ratio is the LD's SYN-ACKs per second of its worker's CPU ÷ the kernel's per
	// second of its core's softirq time.
	Ratio float64 `json:"ratio"`
}

// synproxyResults are the SYN-proxy rows.
type synproxyResults struct {
	Rounds []synproxyRound `json:"rounds"`
	// Medians of the rounds.
	LDMppsPerCore     float64 `json:"ld_mpps_per_core"`
	KernelMppsPerCore float64 `json:"kernel_mpps_per_core"`
	Ratio             float64 `json:"ratio"`
	// Over every LD round: SYNs the worker received, SYN-ACKs it sent, and frames
	// sent to members (none is expected: the flood costs the L7 nodes nothing).
	Received  uint64 `json:"ld_syns_received"`
	Answered  uint64 `json:"ld_synacks_sent"`
	ToMembers uint64 `json:"ld_frames_to_members"`
	Frames    int    `json:"ld_distinct_syns"`
	// KernelErr is why the kernel peer was not measured, LDErr why the LD was not
	// (its datapath lacks the SYN proxy), if they were not.
	KernelErr string `json:"kernel_error,omitempty"`
	LDErr     string `json:"ld_error,omitempty"`
}

// featureRound is one round of a feature's rows: established flows without the
// feature and with it, on the same flows.
type featureRound struct {
	Off *phaseResult `json:"off"`
	On  *phaseResult `json:"on"`
	// Ratio is On's Mpps per worker CPU second ÷ Off's; NsPerPacket the worker CPU
	// time the feature added per packet; WallRatio the same ratio by the wall clock.
	Ratio       float64 `json:"ratio"`
	NsPerPacket float64 `json:"ns_per_packet"`
	WallRatio   float64 `json:"wall_ratio"`
}

// featureResults are one feature's rows.
type featureResults struct {
	// What describes the feature's configuration.
	What   string         `json:"what"`
	Rounds []featureRound `json:"rounds"`
	// Medians of the rounds.
	Ratio       float64 `json:"ratio"`
	NsPerPacket float64 `json:"ns_per_packet"`
	WallRatio   float64 `json:"wall_ratio"`
	// SourceBound is set when the worker waited for packets more than 1% of a phase.
	SourceBound bool `json:"source_bound"`
}

// errNotAvailable is a datapath feature the rows need that l4/datapath lacks.
var errNotAvailable = errors.New("not available")

// setJSON sets the field of the struct v points to whose JSON name is name to the
// JSON value js (unknown fields in it refused), or returns errNotAvailable when the
// struct has no such field. The defence rows configure the datapath's new features
// through their configuration names (the contract), so that this program builds
// and reports "not available" before a feature has landed.
func setJSON(v any, name, js string) error {
	rv := reflect.ValueOf(v).Elem()
	rt := rv.Type()
	for i := range rt.NumField() {
		if tag, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ","); tag == name {
			dec := json.NewDecoder(strings.NewReader(js))
			dec.DisallowUnknownFields()
			if err := dec.Decode(rv.Field(i).Addr().Interface()); err != nil {
				return fmt.Errorf("setting %s.%s to %s: %w", rt.Name(), name, js, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: l4/datapath's %s has no field %q", errNotAvailable, rt.Name(), name)
}

// setRules sets the field name of every rule of cfg to js (setJSON).
func setRules(cfg *datapath.Config, name, js string) error {
	cfg.Rules = slices.Clone(cfg.Rules)
	for i := range cfg.Rules {
		if err := setJSON(&cfg.Rules[i], name, js); err != nil {
			return err
		}
	}
	return nil
}

// runDefence runs the selected defence rows.
func runDefence(ctx context.Context, o *options, res *results, syn, ack *frameSet, log *slog.Logger) {
	if !slices.ContainsFunc(defencePhases, o.phase) {
		return
	}
	dr := &defenceResults{NotAvailable: map[string]string{}}
	res.defence = dr
	if o.phase("synproxy") && ctx.Err() == nil {
		res.Progress("SYN proxy: LD cookie answers and the kernel's nftables synproxy, %d rounds", o.defRounds)
		s, err := runSynproxyRows(ctx, o, log)
		if err != nil {
			res.Fail("SYN proxy rows: %v", err)
		}
		if s != nil && s.LDErr != "" {
			dr.NotAvailable["synproxy"] = s.LDErr
		}
		dr.Synproxy = s
	}
	if o.phase("synproxy-established") && ctx.Err() == nil {
		res.Progress("SYN proxy: established flows with it on and off, %d flows, %d rounds", syn.n, o.defRounds)
		waitQuiet(ctx, res)
		f, err := runSynproxyEstablished(ctx, o, syn, ack, log)
		switch {
		case errors.Is(err, errNotAvailable):
			dr.NotAvailable["synproxy-established"] = err.Error()
		case err != nil:
			res.Fail("SYN proxy, established flows: %v", err)
		}
		dr.Established = f
	}
	if !o.phase("overload") && !o.phase("trace") || ctx.Err() != nil {
		return
	}
	res.Progress("established flows for the overload and trace rows")
	waitQuiet(ctx, res)
	if err := runFeatureRows(ctx, o, res, dr, syn, ack, log); err != nil {
		res.Fail("overload and trace rows: %v", err)
	}
}

// buildSynFlood returns n spoofed SYNs from synFloodSources to the VIP, as
// testkit/synflood writes them, in a frame set.
func buildSynFlood(n int) (*frameSet, error) {
	b, err := synflood.NewBuilder(synflood.Config{
		Sources: synFloodSources, Dst: netip.AddrPortFrom(vip, vipPort),
		SrcMAC: [6]byte(gwMAC), DstMAC: extMAC, Seed: 17,
	})
	if err != nil {
		return nil, err
	}
	if b.FrameLen() != synFrameLen || synFrameLen > frameStride {
		return nil, fmt.Errorf("synflood frames are %d bytes, the frame sets' SYNs %d", b.FrameLen(), synFrameLen)
	}
	f := &frameSet{kind: "spoofed SYN", data: make([]byte, n*frameStride), n: n, length: synFrameLen, stride: frameStride}
	for j := range n {
		b.Next(f.frame(j))
	}
	return f, nil
}

// synproxyCapacity is the connection table of the cookie rows: the SYNs make no entry.
const synproxyCapacity = 1 << 16

// runSynproxyRows measures, in rounds, the LD's SYN-ACK cookie answers on one worker
// over in-memory ports and the kernel's nftables synproxy on one core, alternating
// which goes first. The LD's distributor runs only during its own rows (its worker
// busy-polls), so the kernel's rows have the machine's cores to themselves.
func runSynproxyRows(ctx context.Context, o *options, log *slog.Logger) (*synproxyResults, error) {
	cfg := ldConfig(ldSetup{ext: ldExt, gw: ldExtGW, gwMAC: gwMAC, memberMACs: memberMACs(), capacity: synproxyCapacity})
	n := min(o.flows, 1_000_000)
	res := &synproxyResults{Frames: n}
	haveLD := true
	if err := setRules(&cfg, "synproxy", `"on"`); errors.Is(err, errNotAvailable) {
		res.LDErr, haveLD = err.Error(), false
	} else if err != nil {
		return nil, err
	}
	set, err := buildSynFlood(n)
	if err != nil {
		return nil, err
	}
	var kt *ksTopo
	if kt, err = openKernelSynproxy(); err != nil {
		res.KernelErr = err.Error()
		kt = nil
	} else {
		defer kt.close()
	}
	var failed error
	for i := 0; i < o.defRounds && ctx.Err() == nil; i++ {
		var rd synproxyRound
		ld := func() error {
			if !haveLD {
				return nil
			}
			p, err := ldCookieRound(ctx, cfg, set, o.defDuration, log, res)
			rd.LD = p
			return err
		}
		kern := func() error {
			if kt == nil {
				return nil
			}
			k, err := kt.measure(ctx, o.defDuration)
			rd.Kernel = k
			if err != nil {
				return fmt.Errorf("kernel synproxy: %w", err)
			}
			return nil
		}
		first, second := ld, kern
		if i%2 == 1 {
			first, second = kern, ld
		}
		if err := first(); err != nil {
			failed = err
			break
		}
		if err := second(); err != nil {
			failed = err
			break
		}
		if rd.LD != nil && rd.Kernel != nil && rd.Kernel.MppsPerCore > 0 {
			rd.Ratio = ratio(rd.LD.MppsPerCPU, rd.Kernel.MppsPerCore)
		}
		res.Rounds = append(res.Rounds, rd)
	}
	if haveLD {
		res.LDMppsPerCore = medianOf(res.Rounds, func(r synproxyRound) float64 { return r.LD.MppsPerCPU })
	}
	if kt != nil {
		res.KernelMppsPerCore = medianOf(res.Rounds, func(r synproxyRound) float64 { return r.Kernel.MppsPerCore })
	}
	if haveLD && kt != nil {
		res.Ratio = medianOf(res.Rounds, func(r synproxyRound) float64 { return r.Ratio })
	}
	if failed != nil {
		return res, failed
	}
	if kt == nil {
		// The LD's rows are shown, but the comparison the rows exist for is missing.
		return res, fmt.Errorf("the kernel's SYN proxy: %s", res.KernelErr)
	}
	if res.ToMembers != 0 {
		return res, fmt.Errorf("%d frames of the spoofed SYN flood reached the members", res.ToMembers)
	}
	return res, nil
}

// ldCookieRound starts a distributor whose rule has the SYN proxy on, feeds it the
// spoofed SYNs for a settling time and then d, and counts the SYN-ACKs it sends back
// on the external port per second of the worker's CPU time.
func ldCookieRound(ctx context.Context, cfg datapath.Config, set *frameSet, d time.Duration,
	log *slog.Logger, acc *synproxyResults) (p *phaseResult, err error) {
	pool := newGenPool(genPoolSize)
	g := &genPort{name: "gen", mac: extMAC, pool: pool}
	sink := &sinkPort{name: "sink", mac: intMAC, pool: pool}
	r, err := startRig("in-memory SYN proxy", cfg, g, sink, memSource{g}, 0, nil, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := r.stop(); err == nil {
			err = serr
		}
	}()
	rx0, answered0, members0 := r.ext.rx.Load(), r.ext.tx.Load(), r.int.tx.Load()
	p, err = r.timedCount(ctx, set, d, &r.ext.tx, r.ext, false, nil)
	acc.Received += r.ext.rx.Load() - rx0
	acc.Answered += r.ext.tx.Load() - answered0
	acc.ToMembers += r.int.tx.Load() - members0
	if err != nil {
		return p, err
	}
	if err := checkAnswered(r, rx0, answered0); err != nil {
		return p, err
	}
	if err := checkSynAck(r.ext, set); err != nil {
		return p, fmt.Errorf("%s: the first SYN-ACK: %w", r.name, err)
	}
	if st := r.d.Status(); st.Conns != 0 {
		return p, fmt.Errorf("%s: the spoofed SYNs left %d entries in the table", r.name, st.Conns)
	}
	return p, nil
}

// checkAnswered checks that r's worker answered every SYN it received since rx0 (its
// external port's receive count then) with a SYN-ACK (tx0, its transmit count).
func checkAnswered(r *rig, rx0, tx0 uint64) error {
	if rx, tx := r.ext.rx.Load()-rx0, r.ext.tx.Load()-tx0; rx != tx {
		return fmt.Errorf("%s: %d spoofed SYNs received, %d SYN-ACKs sent (datapath counts: %s)", r.name, rx, tx,
			formatCounts(r.d.Status().Packets))
	}
	return nil
}

// checkSynAck checks the frame m sampled: a SYN-ACK from the VIP answering one of the
// SYNs of set (acknowledging its sequence number, echoing its timestamp), with MSS,
// SACK permitted, timestamps and window scale, and a correct TCP checksum.
func checkSynAck(m *meter, set *frameSet) error {
	sp := m.sample.Load()
	if sp == nil {
		return errors.New("no frame was sampled")
	}
	f := *sp
	var p packet.Packet
	if err := packet.Parse(f, &p); err != nil {
		return err
	}
	if p.Proto != packet.ProtoTCP || p.TCPFlags != packet.TCPSyn|packet.TCPAck || p.Src != vip || p.SrcPort != vipPort ||
		!synFloodSources.Contains(p.Dst) {
		return fmt.Errorf("protocol %d %v:%d → %v:%d flags %#x", p.Proto, p.Src, p.SrcPort, p.Dst, p.DstPort, p.TCPFlags)
	}
	if !packet.VerifyL4Checksum(f, &p) {
		return errors.New("bad TCP checksum")
	}
	tcp := f[p.L4:p.End]
	opts := tcpOptions(tcp)
	for _, k := range []byte{2, 4, 8, 3} {
		if _, ok := opts[k]; !ok {
			return fmt.Errorf("no TCP option %d in % x", k, tcp)
		}
	}
	for j := range set.n {
		s := set.frame(j)
		var sp packet.Packet
		if packet.Parse(s, &sp) != nil || sp.Src != p.Dst || sp.SrcPort != p.DstPort {
			continue
		}
		seq := binary.BigEndian.Uint32(s[sp.L4+4:])
		if ack := binary.BigEndian.Uint32(tcp[8:]); ack != seq+1 {
			return fmt.Errorf("acknowledges %d, the SYN's sequence number is %d", ack, seq)
		}
		tsval := binary.BigEndian.Uint32(tcpOptions(s[sp.L4:sp.End])[8])
		if ecr := binary.BigEndian.Uint32(opts[8][4:]); ecr != tsval {
			return fmt.Errorf("echoes timestamp %d, the SYN's is %d", ecr, tsval)
		}
		return nil
	}
	return fmt.Errorf("answers %v:%d, which sent no SYN", p.Dst, p.DstPort)
}

// tcpOptions returns the options of a TCP segment by kind (a malformed list ends it).
func tcpOptions(tcp []byte) map[byte][]byte {
	m := map[byte][]byte{}
	if len(tcp) < 20 {
		return m
	}
	o := tcp[20:min(len(tcp), int(tcp[12]>>4)*4)]
	for i := 0; i < len(o); {
		switch o[i] {
		case 0:
			return m
		case 1:
			i++
			continue
		}
		if i+1 >= len(o) || o[i+1] < 2 || i+int(o[i+1]) > len(o) {
			return m
		}
		m[o[i]] = o[i+2 : i+int(o[i+1])]
		i += int(o[i+1])
	}
	return m
}

// timedCount feeds frames of set for a settling time (and until ready, when not nil,
// returns) and then d (longer if nothing
// was counted in d), and counts what counter (a meter's) gained meanwhile, per second
// of the worker's CPU. Once the source has stopped, every frame sent must have been
// received, and with all, transmitted on the internal port; the sample is taken
// from sampled's transmissions.
func (r *rig) timedCount(ctx context.Context, set *frameSet, d time.Duration, counter interface{ Load() uint64 },
	sampled *meter, all bool, ready func() error) (*phaseResult, error) {
	r.ext.arm(0)
	r.int.arm(0)
	rx0, tx0 := r.ext.rx.Load(), r.int.tx.Load()
	sampled.takeSample()
	f := r.src.feed(set, -1)
	err := sleepCtx(ctx, settle)
	if err == nil && ready != nil {
		err = ready()
	}
	probe := startProbe()
	t0, c0, cpu0 := nanotime(), counter.Load(), threadCPU(int(r.tid.Load()))
	polls0, empty0, idle0, allocs0 := r.ext.polls.Load(), r.ext.empty.Load(), r.ext.idle.Load(), heapAllocs()
	if err == nil {
		err = sleepCtx(ctx, d)
	}
	// On a loaded machine the worker may have had no CPU at all in d: measure on,
	// in steps of d, until it handled something (at most 10 s).
	for limit := time.Now().Add(10 * time.Second); err == nil && counter.Load() == c0 && time.Now().Before(limit); {
		err = sleepCtx(ctx, d)
	}
	t1, c1, cpu1 := nanotime(), counter.Load(), threadCPU(int(r.tid.Load()))
	polls1, empty1, idle1, allocs1 := r.ext.polls.Load(), r.ext.empty.Load(), r.ext.idle.Load(), heapAllocs()
	others := probe.others()
	st := f.stop()
	if err == nil {
		err = st.err
	}
	if err == nil {
		deadline := time.Now().Add(2 * time.Second)
		for r.ext.rx.Load()-rx0 != st.sent || all && r.int.tx.Load()-tx0 != st.sent {
			if err = r.wait(ctx, deadline); err != nil {
				err = fmt.Errorf("after the source stopped: %d frames sent, %d received, %d forwarded: %w",
					st.sent, r.ext.rx.Load()-rx0, r.int.tx.Load()-tx0, err)
				break
			}
		}
		// Packets are counted as received before they are handled: two more polls
		// and the last burst has been handled.
		for p := r.ext.polls.Load(); err == nil && r.ext.polls.Load() < p+2; {
			err = r.wait(ctx, deadline)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s, %s phase: %w", r.name, set.kind, err)
	}
	if c1 == c0 {
		return nil, fmt.Errorf("%s, %s phase: nothing counted in %v", r.name, set.kind, d)
	}
	p := newPhaseResult(c1-c0, time.Duration(t1-t0), time.Duration(cpu1-cpu0), others, st)
	p.Polls, p.EmptyPolls = polls1-polls0, empty1-empty0
	p.Idle = float64(idle1-idle0) / float64(t1-t0)
	p.Allocs = ptr(float64(allocs1-allocs0) / float64(c1-c0))
	return p, nil
}

// runFeatureRows establishes the flows of ack on one in-memory worker, then measures
// the established flows with each feature configured and not, in rounds (the order
// alternating), switching the configuration with Apply on the same flows.
func runFeatureRows(ctx context.Context, o *options, res *results, dr *defenceResults, syn, ack *frameSet, log *slog.Logger) (err error) {
	pool := newGenPool(genPoolSize)
	g := &genPort{name: "gen", mac: extMAC, pool: pool}
	sink := &sinkPort{name: "sink", mac: intMAC, pool: pool}
	base := ldConfig(ldSetup{ext: ldExt, gw: ldExtGW, gwMAC: gwMAC, memberMACs: memberMACs(), capacity: tableCapacity(ack.n)})
	fs, missing := featureSet(o, base)
	for name, err := range missing {
		if !errors.Is(err, errNotAvailable) {
			return fmt.Errorf("%s: %w", name, err)
		}
		dr.NotAvailable[name] = err.Error()
	}
	if len(fs) == 0 {
		return nil
	}
	r, err := startRig("in-memory (defence rows)", base, g, sink, memSource{g}, ack.n, nil, log)
	if err != nil {
		return err
	}
	defer func() {
		if serr := r.stop(); err == nil {
			err = serr
		}
	}()
	// The flows: one SYN each (syn has the clients of ack), then one ACK each.
	if _, err := r.counted(ctx, syn, syn.n); err != nil {
		return err
	}
	if _, err := r.counted(ctx, ack, ack.n); err != nil {
		return err
	}
	if err := r.checkStatus(ctx, r.int.tx.Load(), int64(ack.n)); err != nil {
		return fmt.Errorf("after establishing the flows: %w", err)
	}
	for _, ft := range fs {
		res.Progress("%s: %d rounds", ft.name, o.defRounds)
		fr, err := runFeature(ctx, r, ack, base, ft, o.defRounds, o.defDuration)
		if err != nil {
			return fmt.Errorf("%s: %w", ft.name, err)
		}
		*ft.dst(dr) = fr
	}
	return r.d.Apply(base)
}

// feature is one configuration measured against the base.
type feature struct {
	name, what string
	on         datapath.Config
	dst        func(*defenceResults) **featureResults
	// ready, when set, waits (while the flows' packets arrive) until the
	// configuration is in the state to measure.
	ready func(r *rig) func() error
}

// featureSet is the features of the selected phases; a feature the datapath lacks is
// left out, and why is returned.
func featureSet(o *options, base datapath.Config) (fs []feature, missing map[string]error) {
	missing = map[string]error{}
	add := func(name, what string, dst func(*defenceResults) **featureResults, set ...[2]string) *feature {
		c := base
		for _, kv := range set {
			var err error
			if field, ok := strings.CutPrefix(kv[0], "rules."); ok {
				err = setRules(&c, field, kv[1])
			} else {
				err = setJSON(&c, kv[0], kv[1])
			}
			if err != nil {
				missing[name] = err
				return nil
			}
		}
		fs = append(fs, feature{name: name, what: what, on: c, dst: dst})
		return &fs[len(fs)-1]
	}
	if o.phase("overload") {
		// The busy signal is left out: a benchmark's worker is always busy, which
		// would make the LD protect.
		if f := add("overload", "overload on, capacity 1e9 pps, signals pps and table (normal state, checked); static "+
			"limits on the rule that never bind",
			func(d *defenceResults) **featureResults { return &d.Overload },
			[2]string{"overload", `{"mode": "on", "capacity_pps": 1000000000, "signals": ["pps", "table"], "interval": "200ms"}`},
			[2]string{"rules.limits", `{"new_conns_per_second": 1e9, "max_conns": 1000000000, "weight": 1}`}); f != nil {
			f.ready = func(r *rig) func() error {
				return func() error { return waitOverload(r, "normal", 300*time.Millisecond) }
			}
		}
		if f := add("overload (protecting)", "overload on, capacity 1,000 pps: past the watermark, protecting (quotas on new "+
			"connections; established flows are never cut, checked: every packet forwarded)",
			func(d *defenceResults) **featureResults { return &d.Protecting },
			[2]string{"overload", `{"mode": "on", "capacity_pps": 1000, "interval": "200ms"}`}); f != nil {
			f.ready = func(r *rig) func() error { return func() error { return waitOverload(r, "protecting", 0) } }
		}
	}
	if o.phase("trace") {
		add("trace (DSCP)", "tracing on, marker DSCP 46; no packet marked",
			func(d *defenceResults) **featureResults { return &d.Trace },
			[2]string{"trace", `{"dscp": 46}`})
		add("trace (TCP option)", "tracing on, marker TCP option 253 (every segment's options walked); no packet marked",
			func(d *defenceResults) **featureResults { return &d.TraceOption },
			[2]string{"trace", `{"tcp_option": 253}`})
	}
	return fs, missing
}

// runFeature measures the established flows of ack without (base) and with on, in
// rounds, the order alternating so a drift of the machine's load favours neither.
func runFeature(ctx context.Context, r *rig, ack *frameSet, base datapath.Config, ft feature,
	rounds int, d time.Duration) (*featureResults, error) {
	res := &featureResults{What: ft.what}
	on := ft.on
	measure := func(cfg datapath.Config, name string) (*phaseResult, error) {
		if err := r.d.Apply(cfg); err != nil {
			return nil, fmt.Errorf("applying the %s configuration: %w", name, err)
		}
		var ready func() error
		if ft.ready != nil && name == "on" {
			ready = ft.ready(r)
		}
		p, err := r.timedCount(ctx, ack, d, &r.int.tx, r.int, true, ready)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := r.checkSample(ack.kind); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		res.SourceBound = res.SourceBound || p.starved()
		return p, nil
	}
	for i := range rounds {
		var rd featureRound
		var err error
		if i%2 == 0 {
			if rd.Off, err = measure(base, "off"); err == nil {
				rd.On, err = measure(on, "on")
			}
		} else {
			if rd.On, err = measure(on, "on"); err == nil {
				rd.Off, err = measure(base, "off")
			}
		}
		if err != nil {
			return res, err
		}
		rd.Ratio = ratio(rd.On.MppsPerCPU, rd.Off.MppsPerCPU)
		rd.WallRatio = ratio(rd.On.Mpps, rd.Off.Mpps)
		if rd.On.MppsPerCPU > 0 && rd.Off.MppsPerCPU > 0 {
			rd.NsPerPacket = round(1e3/rd.On.MppsPerCPU-1e3/rd.Off.MppsPerCPU, 2)
		}
		res.Rounds = append(res.Rounds, rd)
	}
	res.Ratio = medianOf(res.Rounds, func(r featureRound) float64 { return r.Ratio })
	res.WallRatio = medianOf(res.Rounds, func(r featureRound) float64 { return r.WallRatio })
	res.NsPerPacket = medianOf(res.Rounds, func(r featureRound) float64 { return r.NsPerPacket })
	return res, nil
}

// medianOf is the median of f over rs (the lower middle one for an even count).
func medianOf[T any](rs []T, f func(T) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// waitOverload waits until r's overload protection is in state (at most 10 s), and
// then that it stays so for hold (measured loads in between).
func waitOverload(r *rig, state string, hold time.Duration) error {
	deadline := time.Now().Add(10 * time.Second)
	for r.d.Status().Overload.State != state {
		if time.Now().After(deadline) {
			st := r.d.Status().Overload
			return fmt.Errorf("overload protection still %q (load %.2f) after 10s, want %s", st.State, st.Load, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if st := r.d.Status().Overload; st.State != state {
			return fmt.Errorf("overload protection went %q (load %.2f), want %s", st.State, st.Load, state)
		}
	}
	return nil
}
