package datapath

import (
	"encoding/binary"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/l4/sessionsync"
	"github.com/tiergate/tiergate/l4/synproxy"
)

// SYN proxy (l4/synproxy): per rule (RuleConfig.SynProxy), the LD answers a client's
// SYN itself with a SYN cookie and keeps nothing; an ACK whose cookie checks creates
// the connection (pending: ProxyPending), and the LD sends the member a SYN in the
// client's name with the options the cookie kept. The member's SYN-ACK comes back
// through the tunnel as every reply does: the LD records the deltas between the two
// handshakes (sequence numbers, timestamps, window scale), answers the member with the
// ACK that completes its handshake and does not pass the SYN-ACK on. From then on
// every packet of the connection is translated: the member's sequence numbers,
// TSvals and windows for the client; the client's acknowledgments, SACK blocks and
// TSecrs for the member.
//
// The client's first data usually arrives right behind its ACK, before the member's
// SYN-ACK: the worker holds one packet per pending connection (a copy, in a small
// table of pxHeld slots, one taken when the cookie checks), and sends it to the
// member right after the ACK that completes the member's handshake, so the first
// request waits one round trip to the member and not the client's retransmission
// timer (200 ms or more). A second packet while the connection is pending, or one
// of a connection whose slot another took, is dropped (synproxy_wait) and sent
// again by the client. The
// client's retransmission of its first segment while still pending (the SYN to the
// member, or its SYN-ACK, was lost) makes the LD send the member its SYN again: that
// segment carries the cookie as the ACK did.
//
// A rule's mode: "on" proxies every new connection; "auto" proxies the new
// connections a worker sees while its table is SynProxyConfig.AutoOn or more half-open
// (a SYN flood), until it falls below AutoOff and AutoHold has passed; "off" or ""
// never. With "auto", an ACK without a flow is checked as a cookie whatever the state
// (a cookie the LD sent while it proxied), and one that does not check is a flow
// picked up mid-way, as without the proxy; with "on" it is dropped
// (synproxy_bad_cookie).
//
// A rule once proxied stays on the proxy's path (the lookups that read the proxy
// state) even when it is set "off", so that its proxied connections go on being
// translated; other rules, and an LD without the proxy, take the path they took
// before. Fragments of a proxied connection (which the LD does not reassemble) are not
// translated; members' replies fit the tunnel (the MSS clamp), and clients' are routed
// by address pair as before.

// SynProxy modes of RuleConfig.SynProxy.
const (
	SynProxyOff  = "off"
	SynProxyOn   = "on"
	SynProxyAuto = "auto"
)

const (
	pxOff uint8 = iota
	pxOn
	pxAuto
)

func pxModeOf(s string) uint8 {
	switch strings.ToLower(s) {
	case SynProxyOn:
		return pxOn
	case SynProxyAuto:
		return pxAuto
	}
	return pxOff
}

// SynProxyConfig is the SYN proxy's global settings (l4d's synproxy section); which
// rules are proxied is each rule's SynProxy. Zero fields mean the defaults.
type SynProxyConfig struct {
	// AutoOn is the share of a worker's connection table in half-open entries at
	// which rules with synproxy "auto" are proxied by that worker. Default 0.1.
	AutoOn float64 `yaml:"auto_on" json:"auto_on,omitempty"`
	// AutoOff is the share below which they are no longer proxied, once AutoHold has
	// passed. Below AutoOn. Default half of AutoOn.
	AutoOff float64 `yaml:"auto_off" json:"auto_off,omitempty"`
	// AutoHold is the least time "auto" stays on once on. Default 30s.
	AutoHold config.Duration `yaml:"auto_hold" json:"auto_hold,omitempty"`
	// MSS is the MSS the LD's SYN-ACK advertises, at most the tunnel's (what a
	// SYN's MSS is clamped to). Default the tunnel's.
	MSS uint16 `yaml:"mss" json:"mss,omitempty"`
	// WScale is the window scale the LD's SYN-ACK advertises to clients that offer
	// window scaling (with timestamps), 1 to 14; a member that uses another has its
	// windows rescaled. Default 7, Linux's for a large receive buffer.
	WScale uint8 `yaml:"wscale" json:"wscale,omitempty"`
	// Secret is what the cookie keys are derived from: LDs that share it accept each
	// other's cookies (a client's ACK that an ECMP change sends to another LD).
	// Changing it (or Rotate) on reload invalidates the cookies in flight: those
	// clients' ACKs are dropped as bad cookies and they connect again. Default:
	// random at start, this LD's own.
	Secret string `yaml:"secret" json:"secret,omitempty"`
	// Rotate is how often the cookie key changes; a cookie made under the previous
	// key still checks. At least 3m. Default 1h.
	Rotate config.Duration `yaml:"rotate" json:"rotate,omitempty"`
}

const (
	defaultPxAutoOn   = 0.1
	defaultPxAutoHold = 30 * time.Second
	defaultPxWScale   = 7
	defaultPxRotate   = time.Hour
	// pxWindow is the window of the LD's SYN-ACK (unscaled, as in every SYN).
	pxWindow = 65535
)

func (c SynProxyConfig) withDefaults() SynProxyConfig {
	if c.AutoOn == 0 {
		c.AutoOn = defaultPxAutoOn
	}
	if c.AutoOff == 0 {
		c.AutoOff = c.AutoOn / 2
	}
	if c.AutoHold == 0 {
		c.AutoHold = config.Duration(defaultPxAutoHold)
	}
	if c.WScale == 0 {
		c.WScale = defaultPxWScale
	}
	if c.Rotate == 0 {
		c.Rotate = config.Duration(defaultPxRotate)
	}
	return c
}

// validateSynProxy checks the synproxy section (defaults filled in) and the rules'
// modes.
func validateSynProxy(ck *config.Checker, d *Config) {
	c := d.SynProxy
	if math.IsNaN(c.AutoOn) || c.AutoOn <= 0 || c.AutoOn > 1 {
		ck.Addf("synproxy.auto_on", "%v is outside (0, 1]", c.AutoOn)
	}
	if math.IsNaN(c.AutoOff) || c.AutoOff < 0 || c.AutoOff >= c.AutoOn {
		ck.Addf("synproxy.auto_off", "%v is outside [0, auto_on)", c.AutoOff)
	}
	if c.AutoHold < 0 {
		ck.Addf("synproxy.auto_hold", "%v is negative", c.AutoHold)
	}
	if c.MSS != 0 && c.MSS < 536 {
		ck.Addf("synproxy.mss", "%d is below 536", c.MSS)
	}
	if c.WScale > synproxy.MaxWScale {
		ck.Addf("synproxy.wscale", "%d is above %d", c.WScale, synproxy.MaxWScale)
	}
	if c.Rotate.D() < 3*time.Minute {
		ck.Addf("synproxy.rotate", "%v is below 3m", c.Rotate)
	}
	for i, r := range d.Rules {
		switch strings.ToLower(r.SynProxy) {
		case "", SynProxyOff:
		case SynProxyOn, SynProxyAuto:
			if protoNumber(r.Protocol) != packet.ProtoTCP {
				ck.Addf(config.Index("rules", i)+".synproxy", "needs protocol tcp")
			}
		default:
			ck.Addf(config.Index("rules", i)+".synproxy", "%q is not on, off or auto", r.SynProxy)
		}
	}
}

// pxSnap is the SYN proxy's part of a snapshot: nil when no rule is proxied.
type pxSnap struct {
	cfg        SynProxyConfig
	modes      []uint8 // by rule ID
	mss4, mss6 uint16  // advertised: the tunnel's clamp, or cfg.MSS below it
}

// buildPxSnap compiles the proxy's settings for snapshot s (rules and members
// built), or returns nil when no rule is proxied.
func buildPxSnap(cfg *Config, s *snapshot) *pxSnap {
	var px *pxSnap
	for _, rc := range cfg.Rules {
		m := pxModeOf(rc.SynProxy)
		if m == pxOff {
			continue
		}
		if px == nil {
			px = &pxSnap{cfg: cfg.SynProxy.withDefaults(), modes: make([]uint8, len(s.ruleByID))}
		}
		for _, r := range s.ruleByID {
			if r != nil && r.name == rc.Name {
				px.modes[r.id] = m
			}
		}
	}
	if px == nil {
		return nil
	}
	px.mss4, px.mss6 = math.MaxUint16, math.MaxUint16
	for _, m := range s.members {
		if m != nil && m.mss4 != 0 {
			px.mss4, px.mss6 = min(px.mss4, m.mss4), min(px.mss6, m.mss6)
		}
	}
	if px.mss4 == math.MaxUint16 {
		px.mss4, px.mss6 = uint16(s.mtu-20-8-40), uint16(s.mtu-40-8-60)
	}
	if c := px.cfg.MSS; c != 0 {
		px.mss4, px.mss6 = min(px.mss4, c), min(px.mss6, c)
	}
	return px
}

// workerProxy is a worker's SYN proxy state, made when a snapshot first proxies a
// rule.
type workerProxy struct {
	ever    [maxRules]bool // rules that were proxied: their flows may carry proxy state
	snap    *pxSnap        // of the snapshot in force; nil when no rule is proxied now
	keys    *synproxy.Keys
	secret  string
	rotate  config.Duration
	epochNs int64 // the distributor's epoch as Unix nanoseconds
	unix    int64 // seconds, read each loop
	tsNow   uint32
	minute  uint32

	auto      bool  // "auto" rules are proxied by this worker
	autoSince int64 // worker nanoseconds when it went on

	held []pxHeldPkt // pxHeld slots, by flow hash

	c pxCounters
}

// pxHeld is how many pending connections' first packets a worker holds at once,
// and pxHeldMax the largest frame it holds; pxHeldAge is how long (table seconds) a
// held packet waits for its member at most.
const (
	pxHeld    = 64
	pxHeldMax = 2048
	pxHeldAge = 2
)

// pxHeldPkt is a client's packet held until its member answers.
// The slot is taken when the connection's cookie checks (pxReserve), with the
// client's first sequence number, and the packet copied into it later.
type pxHeldPkt struct {
	key  conntrack.Key
	at   uint32 // table time it was taken; 0: the slot is free
	seq  uint32 // the client's ISN + 1, from its cookie ACK
	n    int    // 0: no packet held yet
	data [pxHeldMax]byte
}

type pxCounters struct {
	cookiesSent, cookiesOK, cookiesBad, conns uint64
}

// pxPublished is what metrics read of a worker's proxy (worker.pxPub).
type pxPublished struct {
	cookiesSent, cookiesOK, cookiesBad, conns atomic.Uint64
	auto                                      atomic.Bool
}

// pxResync picks up the proxy's settings of a new snapshot.
func (w *worker) pxResync(s *snapshot) {
	if s.synproxy == nil {
		if w.px != nil {
			w.px.snap = nil
		}
		return
	}
	if w.px == nil {
		w.px = &workerProxy{epochNs: w.d.epoch.UnixNano()}
		w.table.EnableProxy()
	}
	px := w.px
	if px.held == nil {
		px.held = make([]pxHeldPkt, pxHeld)
	}
	px.snap = s.synproxy
	for id, m := range s.synproxy.modes {
		if m != pxOff {
			px.ever[id] = true
		}
	}
	if px.keys == nil || px.secret != px.snap.cfg.Secret || px.rotate != px.snap.cfg.Rotate {
		px.secret, px.rotate = px.snap.cfg.Secret, px.snap.cfg.Rotate
		px.keys = synproxy.NewKeys([]byte(px.secret), px.rotate.D())
	}
	w.pxTick()
}

// pxTick reads the clocks the cookies use, rotates the keys and updates the auto
// state; once per loop.
func (w *worker) pxTick() {
	px := w.px
	ns := px.epochNs + w.mono
	px.unix = ns / int64(time.Second)
	px.tsNow = uint32(ns / int64(time.Millisecond))
	px.minute = synproxy.Minute(px.unix)
	px.keys.Update(px.unix)
	if px.snap == nil {
		px.auto = false
		return
	}
	share := float64(w.table.HalfOpen()) / float64(w.table.Cap())
	switch {
	case !px.auto && share >= px.snap.cfg.AutoOn:
		px.auto, px.autoSince = true, w.mono
	case px.auto && share < px.snap.cfg.AutoOff && w.mono-px.autoSince >= int64(px.snap.cfg.AutoHold):
		px.auto = false
	}
}

// pxActive reports whether the worker proxies rule r's new connections now.
func (w *worker) pxActive(r *rule) bool {
	sn := w.px.snap
	if sn == nil || int(r.id) >= len(sn.modes) {
		return false
	}
	switch sn.modes[r.id] {
	case pxOn:
		return true
	case pxAuto:
		return w.px.auto
	}
	return false
}

// pxMode is rule r's mode in force.
func (w *worker) pxMode(r *rule) uint8 {
	sn := w.px.snap
	if sn == nil || int(r.id) >= len(sn.modes) {
		return pxOff
	}
	return sn.modes[r.id]
}

func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

// synproxyIn handles a client's TCP packet to a rule on the proxy's path (see the
// notes at the top).
func (w *worker) synproxyIn(s *snapshot, b *port.Buf, frame []byte, p *packet.Packet, r *rule, h uint64) verdict {
	k := conntrack.Key{Client: p.Src.As16(), ClientPort: p.SrcPort, Rule: r.id}
	id, ref, ok := w.table.LookupTCPRef(&k, h, p.TCPFlags, w.now)
	if ok {
		px := w.table.Proxy(ref)
		switch {
		case px != nil && p.TCPFlags&(packet.TCPSyn|packet.TCPAck) == packet.TCPSyn:
			// A SYN on a proxied connection's entry: the client opens a new one
			// from the same port (the old one closed). Its translation is not the
			// new one's: the entry goes, and the SYN is a new flow's.
			w.table.Delete(&k, h)
		case px == nil:
			if int(id) < len(s.members) {
				if m := s.members[id]; m != nil && (m.up || m.retired || m.drained) {
					return w.forward(s, b, p, r, id)
				}
			}
			// The member failed its health check: the flow goes to a live member
			// (flowMember's rule), whose answer the client hears at once; only a
			// SYN is a new connection for the proxy.
			w.table.Delete(&k, h)
			if p.TCPFlags&(packet.TCPSyn|packet.TCPAck) != packet.TCPSyn {
				return w.pxPlain(s, b, p, r, h)
			}
		case px.Flags&conntrack.ProxyPending != 0:
			if w.pxHold(&k, h, b) {
				return vDrop
			}
			if v, ok := w.pxResyn(s, b, frame, p, r, id, &k, h); ok {
				return v
			}
			w.count(dirIn, resSynProxyWait)
			return vDrop
		default:
			// A proxied connection stays with its member: another has never seen
			// its handshake.
			d := synproxy.Delta{SeqDelta: px.SeqDelta, TSDelta: px.TSDelta, WShift: px.WShift}
			if d.ToMember(frame[p.L4:p.End]) != nil {
				w.count(dirIn, resMalformed)
				return vDrop
			}
			return w.forward(s, b, p, r, id)
		}
	}
	active := w.pxActive(r)
	switch p.TCPFlags & (packet.TCPSyn | packet.TCPAck | packet.TCPRst) {
	case packet.TCPSyn:
		if active {
			return w.pxCookie(s, b, frame, p, r)
		}
	case packet.TCPAck:
		if w.pxMode(r) != pxOff {
			if v, done := w.pxOpen(s, b, frame, p, r, h, &k, active); done {
				return v
			}
		}
	case packet.TCPRst:
	default:
		if active {
			w.count(dirIn, resSynProxyBadCookie)
			return vDrop
		}
	}
	return w.pxPlain(s, b, p, r, h)
}

// pxPlain handles p as a rule without the proxy does.
func (w *worker) pxPlain(s *snapshot, b *port.Buf, p *packet.Packet, r *rule, h uint64) verdict {
	id, res := w.flowMember(s, r, p, p.Src, p.SrcPort, h)
	if res != resForwarded {
		w.count(dirIn, res)
		return vDrop
	}
	return w.forward(s, b, p, r, id)
}

// pxTuple is the cookie's tuple of p.
func pxTuple(p *packet.Packet) synproxy.Tuple {
	return synproxy.Tuple{Src: p.Src.As16(), Dst: p.Dst.As16(), SrcPort: p.SrcPort, DstPort: p.DstPort}
}

// pxCookie answers a client's SYN with the LD's SYN-ACK, in place: nothing is kept.
func (w *worker) pxCookie(s *snapshot, b *port.Buf, frame []byte, p *packet.Packet, r *rule) verdict {
	if w.bl != nil && blocked(*w.bl, p.Src) {
		w.count(dirIn, resBlacklisted)
		return vDrop
	}
	px, sn := w.px, w.px.snap
	var o synproxy.Options
	if synproxy.ParseOptions(frame[p.L4:p.End], &o) != nil {
		w.count(dirIn, resMalformed)
		return vDrop
	}
	adv := sn.mss4
	if p.EtherType == packet.EtherTypeIPv6 {
		adv = sn.mss6
	}
	mss := uint16(536)
	if o.HasMSS {
		mss = o.MSS
	}
	tu := pxTuple(p)
	cookie := px.keys.Cookie(&tu, be32(frame[p.L4+4:]), px.minute, synproxy.MSSIndex(min(mss, adv)))
	ts := synproxy.CookieTSval(px.tsNow, synproxy.Negotiated{WScale: o.WScale, HasWScale: o.HasWScale, SACK: o.SACKPerm})
	mac := w.intMAC
	if w.inExt || w.onePort {
		mac = w.extMAC
	}
	w.ipid++
	n, err := synproxy.WriteSynAck(b.Data[b.Off:], p, &o, &synproxy.SynAck{Cookie: cookie, MSS: adv, Window: pxWindow,
		WScale: sn.cfg.WScale, TSval: ts, SrcMAC: mac, IPID: w.ipid})
	if err != nil {
		w.count(dirIn, resMalformed)
		return vDrop
	}
	b.Len = n
	px.c.cookiesSent++
	w.count(dirLocal, resLocal)
	return vBack
}

// pxOpen checks a client's ACK without a flow as a cookie ACK: when it checks, it
// creates the proxied connection, pending, and turns the ACK into the SYN to the
// member. done false: not a cookie, and the rule is not proxied now (a flow picked up
// mid-way).
func (w *worker) pxOpen(s *snapshot, b *port.Buf, frame []byte, p *packet.Packet, r *rule, h uint64, k *conntrack.Key, active bool) (verdict, bool) {
	px := w.px
	t := frame[p.L4:p.End]
	seq, ack := be32(t[4:]), be32(t[8:])
	tu := pxTuple(p)
	mss, ok := px.keys.Check(&tu, seq, ack, px.minute)
	var o synproxy.Options
	if ok && synproxy.ParseOptions(t, &o) != nil {
		ok = false
	}
	var neg synproxy.Negotiated
	if ok && o.HasTS() {
		neg, ok = synproxy.DecodeTSecr(px.tsNow, o.TSecr)
	}
	if !ok {
		if !active {
			return 0, false
		}
		px.c.cookiesBad++
		w.count(dirIn, resSynProxyBadCookie)
		return vDrop, true
	}
	px.c.cookiesOK++
	if w.bl != nil && blocked(*w.bl, p.Src) {
		w.count(dirIn, resBlacklisted)
		return vDrop, true
	}
	if w.ov.active {
		// The connection is new now, not at its SYN (which made nothing): the
		// rule's limits and overload quota admit it here.
		q := *p
		q.TCPFlags = packet.TCPSyn
		if res := w.admitNew(r, &q); res != resForwarded {
			w.count(dirIn, res)
			return vDrop, true
		}
	}
	id, ok := w.schedule(r, h)
	if !ok {
		w.count(dirIn, resNoMember)
		return vDrop, true
	}
	st := conntrack.Proxy{SeqDelta: ack - 1, TSDelta: o.TSecr, Win: binary.BigEndian.Uint16(t[14:])}
	if o.HasTS() {
		st.Flags |= conntrack.ProxyTS
		if neg.HasWScale {
			st.Flags |= conntrack.ProxyWScale
			st.WShift = int8(px.snap.cfg.WScale) // the LD's scale until the member's is known
		}
		if neg.SACK {
			st.Flags |= conntrack.ProxySACK
		}
	}
	if _, ok := w.table.InsertProxy(k, h, id, st, w.now); !ok {
		w.count(dirIn, resTableFull)
		return vDrop, true
	}
	w.c.newFlows[r.id]++
	px.c.conns++
	w.pxReserve(k, h, seq)
	if !w.pxSyn(b, p, seq, mss, neg, &o) {
		w.table.Delete(k, h)
		w.count(dirIn, resMalformed)
		return vDrop, true
	}
	return w.forward(s, b, p, r, id), true
}

// pxSyn turns the client's packet in b (seq its sequence number, the client's ISN +
// 1; o its options) into the SYN to the member, with the MSS and options the cookie
// kept; false when it does not fit the buffer.
func (w *worker) pxSyn(b *port.Buf, p *packet.Packet, seq uint32, mss uint16, neg synproxy.Negotiated, o *synproxy.Options) bool {
	win := uint32(binary.BigEndian.Uint16(b.Data[b.Off+p.L4+14:]))
	if o.HasTS() && neg.HasWScale {
		win <<= neg.WScale
	}
	end, err := synproxy.WriteSyn(b.Data[b.Off:], p, &synproxy.Syn{ISN: seq - 1, Window: uint16(min(win, 0xffff)), MSS: mss,
		Negotiated: neg, HasTS: o.HasTS(), TSval: o.TSval})
	if err != nil {
		return false
	}
	b.Len = end
	p.End = end
	p.TCPFlags = packet.TCPSyn
	return true
}

// pxResyn answers a client's packet that comes again while its connection is
// pending (a retransmission: the member has not answered, so the SYN to it, or its
// SYN-ACK, may have been lost) by sending the member the SYN again, made from this
// packet as from the first ACK: it carries the cookie too. false: not a packet that
// checks (a later segment), which is dropped.
func (w *worker) pxResyn(s *snapshot, b *port.Buf, frame []byte, p *packet.Packet, r *rule, id uint16, k *conntrack.Key, h uint64) (verdict, bool) {
	px := w.px
	t := frame[p.L4:p.End]
	seq, ack := be32(t[4:]), be32(t[8:])
	// Only the client's first segment again: a later one would check as a cookie
	// with another MSS now and then (the check tolerates a few units of the ISN).
	if sl := w.pxSlot(k, h); sl == nil || sl.seq != seq {
		return 0, false
	}
	tu := pxTuple(p)
	mss, ok := px.keys.Check(&tu, seq, ack, px.minute)
	var o synproxy.Options
	if !ok || synproxy.ParseOptions(t, &o) != nil {
		return 0, false
	}
	var neg synproxy.Negotiated
	if o.HasTS() {
		if neg, ok = synproxy.DecodeTSecr(px.tsNow, o.TSecr); !ok {
			return 0, false
		}
	}
	if !w.pxSyn(b, p, seq, mss, neg, &o) {
		return 0, false
	}
	return w.forward(s, b, p, r, id), true
}

// synproxyOut handles a member's TCP packet (ip, the inner packet at inner in the
// frame) of a rule on the proxy's path; done false: the rule is not, and fromMember
// goes on.
func (w *worker) synproxyOut(s *snapshot, b *port.Buf, frame []byte, ip *packet.Packet, inner int) (verdict, bool) {
	if ip.L4 < 0 {
		return 0, false
	}
	r := s.lookupRule(ruleKey{addr: ip.Src.As16(), proto: packet.ProtoTCP, port: ip.SrcPort})
	if r == nil || !w.px.ever[r.id] {
		return 0, false
	}
	flow := packet.Packet{Src: ip.Dst, Dst: ip.Src, SrcPort: ip.DstPort, DstPort: ip.SrcPort, Proto: packet.ProtoTCP}
	h := packet.FlowHash(w.seed, &flow)
	k := conntrack.Key{Client: ip.Dst.As16(), ClientPort: ip.DstPort, Rule: r.id}
	id, ref, ok := w.table.LookupReplyRef(&k, h, w.now)
	if !ok {
		w.count(dirOut, resReturnNoFlow)
		return vDrop, true
	}
	px := w.table.Proxy(ref)
	if px == nil {
		return w.toClient(s, b, frame, ip, inner, ip.End), true
	}
	if ip.Fragment {
		w.count(dirOut, resMalformed)
		return vDrop, true
	}
	t := frame[ip.L4:ip.End]
	var o synproxy.Options
	if synproxy.ParseOptions(t, &o) != nil {
		w.count(dirOut, resMalformed)
		return vDrop, true
	}
	pending := px.Flags&conntrack.ProxyPending != 0
	switch fl := t[13]; {
	case fl&(packet.TCPSyn|packet.TCPAck) == packet.TCPSyn|packet.TCPAck:
		isn := be32(t[4:])
		if pending {
			cookie, ldTS, ldWS := px.SeqDelta, px.TSDelta, px.WShift
			px.SeqDelta = isn - cookie
			px.TSDelta = 0
			if px.Flags&conntrack.ProxyTS != 0 && o.HasTS() {
				px.TSDelta = ldTS - o.TSval
			}
			px.WShift = 0
			if px.Flags&conntrack.ProxyWScale != 0 {
				var mws int8
				if o.HasWScale {
					mws = int8(o.WScale)
				}
				px.WShift = mws - ldWS
			}
			w.table.EstablishProxy(ref, h, w.now)
		}
		// The ACK that completes the member's handshake, in the client's name;
		// the SYN-ACK goes no further (also when the member sends it again).
		w.ipid++
		a := synproxy.Ack{Seq: be32(t[8:]), Ack: isn + 1, Window: px.Win, IPID: w.ipid}
		if px.Flags&conntrack.ProxyTS != 0 && o.HasTS() {
			a.HasTS, a.TSval, a.TSecr = true, o.TSecr, o.TSval
		}
		end, err := synproxy.WriteAck(b.Data[b.Off:], ip, &a)
		if err != nil {
			w.count(dirOut, resMalformed)
			return vDrop, true
		}
		ip.End, ip.TCPFlags = end, packet.TCPAck
		if pending {
			w.pxRelease(s, r, &k, h, id, px)
		}
		return w.forward(s, b, ip, r, id), true
	case pending && fl&packet.TCPRst != 0:
		// The member refused the connection: the client hears it, at the sequence
		// number it expects.
		d := synproxy.Delta{SeqDelta: be32(t[4:]) - (px.SeqDelta + 1)}
		_ = d.ToClient(t)
	case pending:
		w.count(dirOut, resSynProxyWait)
		return vDrop, true
	default:
		d := synproxy.Delta{SeqDelta: px.SeqDelta, TSDelta: px.TSDelta, WShift: px.WShift}
		_ = d.ToClient(t)
	}
	return w.toClient(s, b, frame, ip, inner, ip.End), true
}

// pxPublish copies the proxy's counters for metrics.
func (w *worker) pxPublish() {
	px := w.px
	if px == nil {
		return
	}
	w.pxPub.cookiesSent.Store(px.c.cookiesSent)
	w.pxPub.cookiesOK.Store(px.c.cookiesOK)
	w.pxPub.cookiesBad.Store(px.c.cookiesBad)
	w.pxPub.conns.Store(px.c.conns)
	w.pxPub.auto.Store(px.auto)
}

var (
	descPxCookies = prometheus.NewDesc("tiergate_l4_synproxy_cookies_total",
		"SYN proxy cookies: sent (SYN-ACKs the LD answered SYNs with), ok and bad (ACKs checked).", []string{"result"}, nil)
	descPxConns = prometheus.NewDesc("tiergate_l4_synproxy_connections_total",
		"Connections the SYN proxy opened to members (cookie checked).", nil, nil)
	descPxActive = prometheus.NewDesc("tiergate_l4_synproxy_active",
		"Workers proxying the rule's new connections now (synproxy on: all; auto: those whose table passed synproxy.auto_on).", []string{"rule", "mode"}, nil)
)

func pxDescribe(ch chan<- *prometheus.Desc) {
	ch <- descPxCookies
	ch <- descPxConns
	ch <- descPxActive
}

func (c *collector) pxCollect(ch chan<- prometheus.Metric, s *snapshot) {
	if s.synproxy == nil {
		return
	}
	var sent, ok, bad, conns uint64
	auto := 0
	for _, w := range c.d.workers {
		sent += w.pxPub.cookiesSent.Load()
		ok += w.pxPub.cookiesOK.Load()
		bad += w.pxPub.cookiesBad.Load()
		conns += w.pxPub.conns.Load()
		if w.pxPub.auto.Load() {
			auto++
		}
	}
	ch <- prometheus.MustNewConstMetric(descPxCookies, prometheus.CounterValue, float64(sent), "sent")
	ch <- prometheus.MustNewConstMetric(descPxCookies, prometheus.CounterValue, float64(ok), "ok")
	ch <- prometheus.MustNewConstMetric(descPxCookies, prometheus.CounterValue, float64(bad), "bad")
	ch <- prometheus.MustNewConstMetric(descPxConns, prometheus.CounterValue, float64(conns))
	for id, r := range s.ruleByID {
		if r == nil || id >= len(s.synproxy.modes) || s.synproxy.modes[id] == pxOff {
			continue
		}
		n, mode := len(c.d.workers), SynProxyOn
		if s.synproxy.modes[id] == pxAuto {
			n, mode = auto, SynProxyAuto
		}
		ch <- prometheus.MustNewConstMetric(descPxActive, prometheus.GaugeValue, float64(n), r.name, mode)
	}
}

// SynProxyStats are the SYN proxy's counters, summed over the workers.
type SynProxyStats struct {
	// CookiesSent counts the SYN-ACKs the LD answered SYNs with; CookiesOK and
	// CookiesBad the ACKs whose cookie checked or did not.
	CookiesSent uint64 `json:"cookies_sent"`
	CookiesOK   uint64 `json:"cookies_ok"`
	CookiesBad  uint64 `json:"cookies_bad"`
	// Connections counts the connections the proxy opened to members.
	Connections uint64 `json:"connections"`
	// AutoWorkers counts the workers proxying "auto" rules now.
	AutoWorkers int `json:"auto_workers"`
}

// SynProxyStats returns the SYN proxy's counters as the workers last published them.
func (d *Distributor) SynProxyStats() SynProxyStats {
	var st SynProxyStats
	for _, w := range d.workers {
		st.CookiesSent += w.pxPub.cookiesSent.Load()
		st.CookiesOK += w.pxPub.cookiesOK.Load()
		st.CookiesBad += w.pxPub.cookiesBad.Load()
		st.Connections += w.pxPub.conns.Load()
		if w.pxPub.auto.Load() {
			st.AutoWorkers++
		}
	}
	return st
}

// pxEmit adds a proxied connection's translation to the entry e of k sent to the
// peers.
func (w *worker) pxEmit(k *conntrack.Key, e *sessionsync.Entry) {
	if px, ok := w.table.ProxyOf(k, w.flowHash(e)); ok && px.Flags&conntrack.ProxyPending == 0 {
		e.Proxied, e.Proxy = true, px
	}
}

// pxInstall installs an entry received from a peer: a proxied one with its
// translation, its rule then on the proxy's path whatever this LD's configuration
// says of it.
func (w *worker) pxInstall(r *rule, k *conntrack.Key, h uint64, id uint16, e *sessionsync.Entry) bool {
	if !e.Proxied {
		return w.table.Install(k, h, id, e.State, e.TTL, w.now)
	}
	if w.px == nil {
		w.px = &workerProxy{epochNs: w.d.epoch.UnixNano()}
		w.px.keys = synproxy.NewKeys(nil, defaultPxRotate)
		w.pxTick()
	}
	w.px.ever[r.id] = true
	return w.table.InstallProxy(k, h, id, e.State, e.TTL, w.now, e.Proxy)
}

// pxReserve takes the slot of a connection whose cookie just checked, its client's
// first sequence number seq, for pxHold and pxResyn. A slot another connection
// holds is taken over once older than pxHeldAge (its packet, if any, counted
// dropped).
func (w *worker) pxReserve(k *conntrack.Key, h uint64, seq uint32) {
	if w.px.held == nil {
		return
	}
	sl := &w.px.held[h%pxHeld]
	if sl.at != 0 && sl.key != *k {
		if w.now-sl.at <= pxHeldAge {
			return
		}
		if sl.n != 0 {
			w.c.packets[dirIn][resSynProxyWait]++
		}
	}
	sl.key, sl.at, sl.seq, sl.n = *k, max(w.now, 1), seq, 0
}

// pxSlot is the slot connection k reserved, or nil.
func (w *worker) pxSlot(k *conntrack.Key, h uint64) *pxHeldPkt {
	if w.px.held == nil {
		return nil
	}
	if sl := &w.px.held[h%pxHeld]; sl.at != 0 && sl.key == *k {
		return sl
	}
	return nil
}

// pxHold keeps a copy of the frame in b, a packet of the pending connection k, for
// pxRelease, and reports whether it did: not when the connection has no slot or a
// packet held already, or the frame is too large.
func (w *worker) pxHold(k *conntrack.Key, h uint64, b *port.Buf) bool {
	sl := w.pxSlot(k, h)
	if sl == nil || sl.n != 0 || b.Len > pxHeldMax {
		return false
	}
	sl.n = copy(sl.data[:], b.Data[b.Off:b.Off+b.Len])
	return true
}

// pxRelease sends the packet held for connection k, now established, to its member:
// after the ACK that completes the member's handshake in the same burst (the member
// takes a data segment whose ACK acknowledges its SYN-ACK as completing it too).
func (w *worker) pxRelease(s *snapshot, r *rule, k *conntrack.Key, h uint64, id uint16, px *conntrack.Proxy) {
	sl := w.pxSlot(k, h)
	if sl == nil {
		return
	}
	sl.at = 0
	if sl.n == 0 {
		return
	}
	if w.int.Alloc(w.txOne) != 1 {
		w.c.packets[dirIn][resSynProxyWait]++
		return
	}
	nb := w.txOne[0]
	if nb.Off+sl.n > len(nb.Data) {
		w.int.Free(w.txOne)
		w.c.packets[dirIn][resSynProxyWait]++
		return
	}
	nb.Len = copy(nb.Data[nb.Off:], sl.data[:sl.n])
	var p packet.Packet
	d := synproxy.Delta{SeqDelta: px.SeqDelta, TSDelta: px.TSDelta, WShift: px.WShift}
	if packet.Parse(nb.Data[nb.Off:nb.Off+nb.Len], &p) != nil || p.L4 < 0 || d.ToMember(nb.Data[nb.Off+p.L4:nb.Off+p.End]) != nil {
		w.int.Free(w.txOne)
		w.c.packets[dirIn][resSynProxyWait]++
		return
	}
	if w.forward(s, &nb, &p, r, id) != vInt {
		w.int.Free(w.txOne)
		return
	}
	w.txInt = append(w.txInt, nb)
	w.txIntMeta = append(w.txIntMeta, w.last)
}

// pxICMP rewrites an ICMP error about a proxied connection's packet to its client
// (fragmentation needed, packet too big, unreachable: in is the quoted packet) for
// the member: the quoted sequence number is the client's view, which the member's
// stack would not recognise as its own (and so ignore a path MTU it must learn).
func (w *worker) pxICMP(frame []byte, p *packet.Packet, in *packet.Packet, k *conntrack.Key, h uint64) {
	px, ok := w.table.ProxyOf(k, h)
	if !ok || px.Flags&conntrack.ProxyPending != 0 || in.Proto != packet.ProtoTCP || in.L4 < 0 || in.L4+8 > p.End {
		return
	}
	synproxy.AddSeq32(frame[p.L4:p.End], in.L4+4-p.L4, 2, px.SeqDelta)
}
