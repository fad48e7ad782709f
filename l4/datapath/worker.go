package datapath

import (
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/l4/sched"
	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/wire"
)

const (
	defaultBurst = 32
	maxBurst     = 256
	quicCIDLen   = wire.ConnIDLen
	// publishEvery is how often a worker publishes its counters for metrics.
	publishEvery = 100 * time.Millisecond
)

// where a packet goes after handling.
type verdict uint8

const (
	vDrop verdict = iota
	vExt          // transmit on the external port
	vInt          // transmit on the internal port
	vBack         // transmit on the port it came from
	vGone         // consumed (copied to the control goroutine); free the buffer
)

// worker is one run-to-completion loop: it owns one RX queue on each port, one TX
// queue, and its shard of the connection table. Nothing in it is shared with other
// workers, so the packet path takes no lock.
type worker struct {
	d       *Distributor
	id      int
	ext     port.Port
	int     port.Port
	onePort bool
	table   *conntrack.Table
	seed    uint64
	burst   int
	ipid    uint16
	extMAC  packet.MAC
	intMAC  packet.MAC

	rx    []port.Buf
	pk    []packet.Packet // parsed headers of the burst in rx
	perr  []error
	hash  []uint64 // flow hash of pk[i], 0 when it has no flow
	txExt []port.Buf
	txInt []port.Buf
	// how each packet in txExt / txInt was counted, so a packet the port does
	// not take is moved to tx_full.
	txExtMeta []counted
	txIntMeta []counted
	last      counted // what the packet being handled was counted as
	inExt     bool    // the packet being handled came in on the external port
	drop      []port.Buf
	txOne     []port.Buf

	// scheduling state of this lcore, rebuilt when the snapshot changes.
	snapVer uint64
	wrr     []*sched.WRR
	wlc     []*sched.WLC

	now  uint32 // conntrack clock
	mono int64  // nanoseconds since the distributor's epoch, read with now
	ms   uint32 // the same in milliseconds, modulo 2^32 (Distributor.msClock)

	icmp tokenBucket // ICMP errors sent

	// The blacklists as this worker applies them (see blSync): the lists in force,
	// nil for none; their Sets when the last sweep of the table began; the position of
	// the sweep under way, 0 when none is.
	bl      *[]*blacklist.List
	blSeen  []*blacklist.Set
	blSweep uint32
	blDrop  func(*conntrack.Key) bool // w.sweepDrop, made once

	c   counters // written only by this worker
	pub *published

	sync *workerSync // session sync (sync.go); nil when off

	px    *workerProxy // SYN proxy (synproxy.go); nil until a rule is proxied
	pxPub pxPublished

	ov workerOverload // overload protection and rule limits (overload.go)

	// tmark is set while the packet being handled is a marked probe (trace.go);
	// it is computed only when tracing is on.
	tmark bool
	tr    workerTrace
}

// tokenBucket limits a rate on the worker's nanosecond clock: a token every interval,
// at most depth/interval of them saved up.
type tokenBucket struct {
	rate, burst int   // what set was last given
	interval    int64 // nanoseconds per token; 0: never a token
	depth       int64
	avail       int64 // nanoseconds of credit
	last        int64
}

// set configures the bucket for rate tokens per second and bursts of burst, full.
// The same settings again change nothing.
func (b *tokenBucket) set(rate, burst int) {
	if rate == b.rate && burst == b.burst {
		return
	}
	b.rate, b.burst = rate, burst
	if rate <= 0 || burst <= 0 {
		b.interval = 0
		return
	}
	b.interval = max(1, int64(time.Second)/int64(rate))
	b.depth = int64(burst) * b.interval
	b.avail = b.depth
}

// ready reports whether a token is there at now (refilling first); take spends it.
func (b *tokenBucket) ready(now int64) bool {
	if b.interval == 0 {
		return false
	}
	if d := now - b.last; d > 0 {
		b.avail = min(b.depth, b.avail+d)
		b.last = now
	}
	return b.avail >= b.interval
}

func (b *tokenBucket) take() { b.avail -= b.interval }

// counters are plain integers: only the worker writes them; it copies them into
// published (atomics) every publishEvery, which is what metrics read.
type counters struct {
	packets        [numDirs][numResults]uint64
	blSweeps       uint64 // sweeps of the table for a blacklist change, completed
	blRemoved      uint64 // entries they removed
	rule           [maxRules]uint64
	newFlows       [maxRules]uint64
	member         [maxMembers]uint64
	icmpSent       uint64
	icmpSuppressed uint64
}

type published struct {
	packets   [numDirs][numResults]atomic.Uint64
	rule      [maxRules]atomic.Uint64
	newFlows  [maxRules]atomic.Uint64
	member    [maxMembers]atomic.Uint64
	conns     [maxMembers]atomic.Uint64
	tableLen  atomic.Int64
	halfOpen  atomic.Int64
	unconf    atomic.Int64
	evictions atomic.Uint64
	icmpSent  atomic.Uint64
	icmpSupp  atomic.Uint64
	blSweeps  atomic.Uint64
	blRemoved atomic.Uint64
	expired   atomic.Uint64
	insertErr atomic.Uint64
}

// counted is how a packet was counted.
type counted struct {
	d    direction
	r    result
	mark bool // a marked probe, recorded by tracePoint
}

func (w *worker) count(d direction, r result) {
	w.c.packets[d][r]++
	w.last = counted{d: d, r: r}
	if w.tmark {
		w.tracePoint(d, r)
	}
}

// run polls until stop is set. It runs on a locked OS thread.
func (w *worker) run(stop *atomic.Bool, idleSleep time.Duration) {
	var idle int
	lastPub := time.Now()
	for !stop.Load() {
		now := time.Now()
		w.now = conntrack.Clock(now)
		w.mono = int64(now.Sub(w.d.epoch))
		w.ms = uint32(w.mono / int64(time.Millisecond))
		if w.px != nil {
			w.pxTick()
		}
		w.ovLoop()
		n := w.poll(w.ext, vExt)
		if !w.onePort {
			n += w.poll(w.int, vInt)
		}
		w.table.Expire(w.now, 64)
		if w.sync != nil {
			n += w.syncStep()
		}
		w.blSync()
		if w.blSweep != 0 {
			// A sweep under way is work: an idle worker does not sleep between steps.
			w.sweepStep()
			n++
		}
		if w.id == 0 {
			n += w.sendControl()
		}
		if now.Sub(lastPub) >= publishEvery {
			w.publish()
			lastPub = now
		}
		w.ov.busy = n > 0
		if n > 0 {
			idle = 0
			continue
		}
		idle++
		if idle > 64 {
			if idleSleep > 0 {
				time.Sleep(idleSleep)
			} else {
				runtime.Gosched()
			}
		}
	}
	w.publish()
}

// poll receives one burst from p (which is the side self) and handles it.
func (w *worker) poll(p port.Port, self verdict) int {
	n := p.RxBurst(w.id, w.rx)
	if n == 0 {
		return 0
	}
	s := w.d.snap.Load()
	if s.version != w.snapVer {
		w.resync(s)
	}
	w.ovSync()
	w.txExt, w.txInt, w.drop = w.txExt[:0], w.txInt[:0], w.drop[:0]
	w.txExtMeta, w.txIntMeta = w.txExtMeta[:0], w.txIntMeta[:0]
	// First pass: parse the burst and start loading the connection-table lines
	// of its flows, so that the cache misses of the burst overlap instead of being
	// taken one packet at a time.
	w.blSync()
	for i := range n {
		b := &w.rx[i]
		pk := &w.pk[i]
		w.perr[i] = packet.Parse(b.Data[b.Off:b.Off+b.Len], pk)
		w.hash[i] = 0
		if w.perr[i] == nil && pk.L4 >= 0 && !pk.Fragment && (pk.Proto == packet.ProtoTCP || pk.Proto == packet.ProtoUDP) {
			w.hash[i] = packet.FlowHash(w.seed, pk)
		}
	}
	w.table.PrefetchBurst(w.hash[:n])
	for i := range n {
		b := &w.rx[i]
		v := w.handle(s, b, &w.pk[i], w.perr[i], w.hash[i], self == vExt)
		if v == vBack {
			v = self
		}
		switch v {
		case vExt:
			w.txExt = append(w.txExt, *b)
			w.txExtMeta = append(w.txExtMeta, w.last)
		case vInt:
			w.txInt = append(w.txInt, *b)
			w.txIntMeta = append(w.txIntMeta, w.last)
		default:
			w.drop = append(w.drop, *b)
		}
	}
	w.flush(w.ext, w.txExt, w.txExtMeta)
	if w.onePort {
		w.flush(w.ext, w.txInt, w.txIntMeta)
	} else {
		w.flush(w.int, w.txInt, w.txIntMeta)
	}
	if len(w.drop) > 0 {
		p.Free(w.drop)
	}
	return n
}

// flush transmits bufs on p; what the port does not take is freed and counted as
// tx_full instead of what meta says it was counted as.
func (w *worker) flush(p port.Port, bufs []port.Buf, meta []counted) {
	if len(bufs) == 0 {
		return
	}
	sent := p.TxBurst(w.id, bufs)
	if sent < len(bufs) {
		for i, m := range meta[sent:] {
			w.c.packets[m.d][m.r]--
			w.c.packets[m.d][resTxFull]++
			if m.mark {
				w.traceTxFull(&bufs[sent+i], m)
			}
		}
		p.Free(bufs[sent:])
	}
}

// resync rebuilds the per-lcore scheduler state for a new snapshot.
func (w *worker) resync(s *snapshot) {
	w.snapVer = s.version
	// Validated with the config; an error here would be a bug, and the table
	// keeps its timeouts.
	_ = w.table.SetTimeouts(s.timeouts)
	w.icmp.set(s.icmpRate, s.icmpBurst)
	w.traceSync(s)
	w.wrr = make([]*sched.WRR, len(s.ruleByID))
	w.wlc = make([]*sched.WLC, len(s.ruleByID))
	for id, r := range s.ruleByID {
		if r == nil {
			continue
		}
		switch r.sched {
		case schedWRR:
			w.wrr[id] = sched.NewWRR(r.ids, r.weights)
		case schedWLC:
			w.wlc[id] = sched.NewWLC(r.ids, r.weights)
		}
	}
	w.pxResync(s)
}

// handleFrame parses one frame and handles it.
func (w *worker) handleFrame(s *snapshot, b *port.Buf, fromExt bool) verdict {
	var p packet.Packet
	err := packet.Parse(b.Data[b.Off:b.Off+b.Len], &p)
	w.blSync()
	return w.handle(s, b, &p, err, 0, fromExt)
}

// handle decides what to do with one received frame, parsed into p (or failed
// with perr), and rewrites it in place. h is the flow hash of p, or 0 to compute
// it when needed.
func (w *worker) handle(s *snapshot, b *port.Buf, p *packet.Packet, perr error, h uint64, fromExt bool) verdict {
	frame := b.Data[b.Off : b.Off+b.Len]
	w.inExt = fromExt
	if s.trace != nil {
		w.traceMark(s, frame, p, perr)
	}
	if perr != nil {
		w.count(dirIn, parseResult(perr))
		return vDrop
	}
	switch p.EtherType {
	case packet.EtherTypeARP:
		return w.toControl(frame, fromExt)
	case packet.EtherTypeIPv4:
	case packet.EtherTypeIPv6:
		// ::ffff:a.b.c.d is an IPv4 address written as IPv6, never a real source or
		// destination on the wire (RFC 4291 2.5.5.2); as 16 bytes it would pass
		// for the IPv4 address it maps.
		if p.Dst.Is4In6() || p.Src.Is4In6() {
			w.count(dirIn, resV4Mapped)
			return vDrop
		}
	default:
		w.count(dirIn, resUnsupported)
		return vDrop
	}
	dst := p.Dst.As16()

	// Neighbour discovery goes to the control goroutine.
	if p.Proto == packet.ProtoICMPv6 && p.L4 >= 0 && p.ICMPType >= 133 && p.ICMPType <= 137 {
		return w.toControl(frame, fromExt)
	}

	if s.isVIPKey(dst) {
		return w.toVIP(s, b, frame, p, dst, h)
	}
	if s.int.owns(dst) || s.ext.owns(dst) {
		return w.toLD(s, b, frame, p, fromExt)
	}
	w.count(dirIn, resNotLocal)
	return vDrop
}

// toVIP handles a packet addressed to a VIP: it finds the flow's member and
// tunnels the packet to it.
func (w *worker) toVIP(s *snapshot, b *port.Buf, frame []byte, p *packet.Packet, dst [16]byte, h uint64) verdict {
	// Blacklists: a TCP or UDP packet is checked when it makes a new flow
	// (flowMember) or is routed by its QUIC connection ID; anything else (fragments,
	// ICMP) every time.
	if w.bl != nil && (p.Fragment || p.Proto != packet.ProtoTCP && p.Proto != packet.ProtoUDP) && blocked(*w.bl, p.Src) {
		w.count(dirIn, resBlacklisted)
		return vDrop
	}
	if p.Fragment {
		r := s.fragRules[ruleKey{addr: dst, proto: p.Proto}]
		if r == nil {
			w.count(dirIn, resNoRule)
			return vDrop
		}
		id, ok := r.maglev.Lookup(packet.PairHash(w.seed, p.Src, p.Dst))
		if !ok {
			w.count(dirIn, resNoMember)
			return vDrop
		}
		return w.forward(s, b, p, r, id)
	}
	switch p.Proto {
	case packet.ProtoTCP, packet.ProtoUDP:
	case packet.ProtoICMP, packet.ProtoICMPv6:
		if packet.EchoReply(frame, p) {
			w.count(dirLocal, resLocal)
			return vBack
		}
		return w.icmpError(s, b, frame, p)
	default:
		w.count(dirIn, resNoRule)
		return vDrop
	}
	r := s.lookupRule(ruleKey{addr: dst, proto: p.Proto, port: p.DstPort})
	if r == nil {
		w.count(dirIn, resNoRule)
		return vDrop
	}
	if h == 0 {
		h = packet.FlowHash(w.seed, p)
	}
	if r.quic {
		if id, ok := w.quicMember(s, r, frame, p); ok {
			if w.bl != nil && blocked(*w.bl, p.Src) {
				w.count(dirIn, resBlacklisted)
				return vDrop
			}
			w.quicFlow(r, p, h, id)
			return w.forward(s, b, p, r, id)
		}
	}
	if w.px != nil && w.px.ever[r.id] && p.Proto == packet.ProtoTCP {
		return w.synproxyIn(s, b, frame, p, r, h)
	}
	id, res := w.flowMember(s, r, p, p.Src, p.SrcPort, h)
	if res != resForwarded {
		w.count(dirIn, res)
		return vDrop
	}
	return w.forward(s, b, p, r, id)
}

// sweepBudget is how many positions of the connection table a worker's sweep visits
// per loop (one or two lookups per packet of a full burst).
const sweepBudget = 32

// blSync picks up the blacklists in force and, when they or what one of them holds
// changed since the last sweep began, starts a sweep of the table: flows whose client
// is now listed are removed, so that their next packet is a new flow, checked and
// dropped. A change during a sweep starts it again.
func (w *worker) blSync() {
	bl := w.d.bl.Load()
	if bl == w.bl {
		if bl == nil {
			return
		}
		same := true
		for i, l := range *bl {
			if l.Snapshot() != w.blSeen[i] {
				same = false
				break
			}
		}
		if same {
			return
		}
	}
	w.bl = bl
	w.blSeen = w.blSeen[:0]
	w.blSweep = 0
	if bl == nil {
		return
	}
	for _, l := range *bl {
		w.blSeen = append(w.blSeen, l.Snapshot())
	}
	w.blSweep = 1
}

// sweepStep does one step of the sweep under way.
func (w *worker) sweepStep() {
	if w.blDrop == nil {
		w.blDrop = w.sweepDrop
	}
	next, removed := w.table.Sweep(w.blSweep, sweepBudget, w.blDrop)
	w.c.blRemoved += uint64(removed)
	w.blSweep = next
	if next == 0 {
		w.c.blSweeps++
	}
}

// sweepDrop reports whether the client of a flow is on a blacklist.
func (w *worker) sweepDrop(k *conntrack.Key) bool {
	a := netip.AddrFrom16(k.Client)
	for _, l := range *w.bl {
		if l.Contains(a) {
			return true
		}
	}
	return false
}

// blocked reports whether src is on one of the lists, and counts the hit on the
// first list that has it.
func blocked(lists []*blacklist.List, src netip.Addr) bool {
	for _, l := range lists {
		if l.Contains(src) {
			l.Hit(blacklist.SourcePacket)
			return true
		}
	}
	return false
}

// flowMember finds the flow (client, clientPort) of rule r in the table, or
// schedules and inserts it.
func (w *worker) flowMember(s *snapshot, r *rule, p *packet.Packet, client netip.Addr, clientPort uint16, h uint64) (uint16, result) {
	k := conntrack.Key{Client: client.As16(), ClientPort: clientPort, Rule: r.id}
	var id uint16
	var ok bool
	tcp := p.Proto == packet.ProtoTCP
	if tcp {
		id, ok = w.table.LookupTCP(&k, h, p.TCPFlags, w.now)
	} else {
		id, ok = w.table.LookupUDP(&k, h, w.now)
	}
	if ok {
		if int(id) < len(s.members) {
			if m := s.members[id]; m != nil && (m.up || m.retired || m.drained) {
				return id, resForwarded
			}
		}
		// The member failed its health check: the flow is rescheduled, so that
		// the client hears from a live member at once.
		w.table.Delete(&k, h)
	}
	if w.bl != nil && blocked(*w.bl, client) {
		return 0, resBlacklisted
	}
	if w.ov.active {
		if res := w.admitNew(r, p); res != resForwarded {
			return 0, res
		}
	}
	id, ok = w.schedule(r, h)
	if !ok {
		return 0, resNoMember
	}
	// A flow picked up mid-way (a TCP packet without SYN: an LD restart, an ECMP
	// change; any UDP datagram) stays unconfirmed, with a short timeout and first to
	// be evicted, until its member's reply confirms it: one-way packets from spoofed
	// sources cannot fill the table with long-lived entries.
	st := conntrack.StateUnconfirmed
	if tcp {
		if p.TCPFlags&packet.TCPRst != 0 {
			return id, resForwarded // never create an entry for a reset
		}
		if p.TCPFlags&(packet.TCPSyn|packet.TCPAck) == packet.TCPSyn {
			st = conntrack.StateSynRecv
		}
	}
	if _, ok := w.table.Insert(&k, h, id, st, w.now); !ok {
		return 0, resTableFull
	}
	w.c.newFlows[r.id]++
	return id, resForwarded
}

func (w *worker) schedule(r *rule, h uint64) (uint16, bool) {
	switch r.sched {
	case schedWRR:
		if int(r.id) < len(w.wrr) && w.wrr[r.id] != nil {
			return w.wrr[r.id].Next()
		}
	case schedWLC:
		if int(r.id) < len(w.wlc) && w.wlc[r.id] != nil {
			return w.wlc[r.id].Pick(w.table.MemberCounts())
		}
	}
	return r.maglev.Lookup(h)
}

// quicMember routes a QUIC packet by the connection ID its member issued:
// Handshake and short-header packets carry it; Initial and 0-RTT packets carry a
// client-chosen ID and go by the 5-tuple.
func (w *worker) quicMember(s *snapshot, r *rule, frame []byte, p *packet.Packet) (uint16, bool) {
	if p.L4+8 > p.End {
		return 0, false
	}
	cid, long, typ, ok := packet.QUICDestConnID(frame[p.L4+8:p.End], s.quicCIDLen)
	if !ok || long && typ != 2 {
		return 0, false
	}
	sid, ok := wire.DecodeConnID(cid)
	if !ok {
		return 0, false
	}
	id, ok := r.quicIDs[sid]
	return id, ok
}

// quicFlow keeps an entry for the client address and port of a QUIC packet routed
// by its connection ID, so that the member's replies to that address find a flow
// (after the client moves to a new address or port, or the flow moves to this LD).
// A new entry is unconfirmed until the member replies; a full table only means the
// replies are dropped (return_no_flow) until there is room.
func (w *worker) quicFlow(r *rule, p *packet.Packet, h uint64, id uint16) {
	k := conntrack.Key{Client: p.Src.As16(), ClientPort: p.SrcPort, Rule: r.id}
	if _, ok := w.table.LookupUDP(&k, h, w.now); !ok {
		w.table.Insert(&k, h, id, conntrack.StateUnconfirmed, w.now)
	}
}

// icmpError sends an ICMP error about a flow (fragmentation needed, unreachable,
// ...) to the flow's member, found from the quoted header.
func (w *worker) icmpError(s *snapshot, b *port.Buf, frame []byte, p *packet.Packet) verdict {
	var in packet.Packet
	if err := packet.ICMPEmbedded(frame, p, &in); err != nil {
		w.count(dirIn, resNoRule)
		return vDrop
	}
	// The quoted packet went from the VIP to the client.
	r := s.rules[ruleKey{addr: in.Src.As16(), proto: in.Proto, port: in.SrcPort}]
	if r == nil {
		w.count(dirIn, resNoRule)
		return vDrop
	}
	// The flow as the client sends it, for its hash.
	flow := packet.Packet{Src: in.Dst, Dst: in.Src, SrcPort: in.DstPort, DstPort: in.SrcPort, Proto: in.Proto}
	h := packet.FlowHash(w.seed, &flow)
	k := conntrack.Key{Client: in.Dst.As16(), ClientPort: in.DstPort, Rule: r.id}
	// Look only: an ICMP error says nothing about the flow's state.
	id, _, ok := w.table.Lookup(&k, h, w.now)
	if !ok {
		if id, ok = w.schedule(r, h); !ok {
			w.count(dirIn, resNoMember)
			return vDrop
		}
	} else if w.px != nil {
		w.pxICMP(frame, p, &in, &k, h)
	}
	return w.forward(s, b, p, r, id)
}

// forward tunnels the IP packet of frame p to member id.
func (w *worker) forward(s *snapshot, b *port.Buf, p *packet.Packet, r *rule, id uint16) verdict {
	if w.ov.pkts && !w.admitPacket(r) {
		w.count(dirIn, resOverloadQuota)
		return vDrop
	}
	if int(id) >= len(s.members) || s.members[id] == nil {
		w.count(dirIn, resNoMember)
		return vDrop
	}
	m := s.members[id]
	if m.encap == nil {
		w.count(dirIn, resNoNeighbor)
		return vDrop
	}
	v6 := p.EtherType == packet.EtherTypeIPv6
	ovh := m.overhead4
	if v6 {
		ovh = m.overhead6
	}
	innerLen := p.End - p.L3
	if innerLen+ovh-14 > s.mtu {
		return w.tooBig(s, b, p, s.mtu-(ovh-14))
	}
	if p.Proto == packet.ProtoTCP && p.TCPFlags&packet.TCPSyn != 0 && p.L4 >= 0 {
		mss := m.mss4
		if v6 {
			mss = m.mss6
		}
		packet.ClampMSS(b.Data[b.Off:b.Off+b.Len], p, mss)
	}
	w.ipid++
	start, err := m.encap.Write(b.Data, b.Off+p.L3, innerLen, w.ipid)
	if err != nil {
		w.count(dirIn, resTooBig)
		return vDrop
	}
	b.Len = b.Off + p.L3 + innerLen - start
	b.Off = start
	if w.tmark {
		w.tr.hop = m
	}
	w.count(dirIn, resForwarded)
	w.c.rule[r.id]++
	w.c.member[id]++
	return vInt
}

// tooBig drops a packet that does not fit the tunnel (too_big) and, when it may not
// be fragmented (IPv4 DF, or IPv6), turns its buffer into the ICMP error a router
// sends back: fragmentation needed or packet too big, with mtu, the largest inner
// packet that fits, from the LD's external address; rate-limited per worker.
func (w *worker) tooBig(s *snapshot, b *port.Buf, p *packet.Packet, mtu int) verdict {
	w.count(dirIn, resTooBig)
	v6 := p.EtherType == packet.EtherTypeIPv6
	if s.icmpRate < 0 || !v6 && b.Data[b.Off+p.L3+6]&0x40 == 0 {
		return vDrop
	}
	if !w.icmp.ready(w.mono) {
		w.c.icmpSuppressed++
		return vDrop
	}
	src, mac := s.ext.addr4, w.intMAC
	if v6 {
		src = s.ext.addr6
	}
	if w.inExt || w.onePort {
		mac = w.extMAC
	}
	w.ipid++
	start, n, err := packet.TooBig(b.Data, b.Off, p, src, mac, mtu, w.ipid)
	if err != nil {
		return vDrop // not a packet to answer (an ICMP error, a later fragment, ...)
	}
	w.icmp.take()
	w.c.icmpSent++
	b.Off, b.Len = start, n
	return vBack
}

// toLD handles a packet addressed to one of the LD's own addresses: the tunnel
// back from members, and echo requests.
func (w *worker) toLD(s *snapshot, b *port.Buf, frame []byte, p *packet.Packet, fromExt bool) verdict {
	switch p.Proto {
	case packet.ProtoGRE, packet.ProtoIPIP, packet.ProtoIPv6:
		return w.fromMember(s, b, frame, p, fromExt)
	case packet.ProtoICMP, packet.ProtoICMPv6:
		if packet.EchoReply(frame, p) {
			w.count(dirLocal, resLocal)
			return vBack
		}
	}
	w.count(dirLocal, resUnsupported)
	return vDrop
}

// fromMember decapsulates a reply from a member and sends the client's packet
// out of the external port. It takes only what a member sends: on the internal port
// to the LD's internal address, from a member's address, with the tunnel key when one
// is set, from a VIP, and for a flow in the connection table (which the reply
// confirms). Anything else would let whoever reaches the LD make it send
// VIP-sourced packets anywhere.
func (w *worker) fromMember(s *snapshot, b *port.Buf, frame []byte, p *packet.Packet, fromExt bool) verdict {
	if fromExt && !w.onePort || !s.int.owns(p.Dst.As16()) {
		w.count(dirOut, resReturnWrongPort)
		return vDrop
	}
	if _, ok := s.memberIP[p.Src.As16()]; !ok {
		w.count(dirOut, resReturnNotMember)
		return vDrop
	}
	var t wire.Tunnel
	if p.Fragment || p.L4 < 0 || p.End > len(frame) || wire.Decap(p.Proto, frame[p.L4:p.End], &t) != nil {
		w.count(dirOut, resBadTunnel)
		return vDrop
	}
	if !t.GRE.KeyMatches(s.tunnelKey) {
		w.count(dirOut, resReturnBadKey)
		return vDrop
	}
	inner := p.L4 + t.Inner
	var ip packet.Packet
	if err := packet.ParseIP(frame, inner, &ip); err != nil {
		w.count(dirOut, resBadTunnel)
		return vDrop
	}
	if s.trace != nil {
		w.traceInner(s, frame, &ip)
	}
	if ip.EtherType == packet.EtherTypeIPv6 && (ip.Src.Is4In6() || ip.Dst.Is4In6()) {
		w.count(dirOut, resV4Mapped)
		return vDrop
	}
	if !s.isVIP(ip.Src) {
		w.count(dirOut, resBadTunnel)
		return vDrop
	}
	if w.px != nil && ip.Proto == packet.ProtoTCP {
		if v, done := w.synproxyOut(s, b, frame, &ip, inner); done {
			return v
		}
	}
	if !w.replyFlow(s, frame, &ip) {
		w.count(dirOut, resReturnNoFlow)
		return vDrop
	}
	return w.toClient(s, b, frame, &ip, inner, p.End)
}

// toClient sends the member's packet ip, which starts at inner in frame and whose
// bytes end at end, decapsulated to the client through the external port: its TTL
// decremented, in an Ethernet header to the next hop.
func (w *worker) toClient(s *snapshot, b *port.Buf, frame []byte, ip *packet.Packet, inner, end int) verdict {
	if inner < 14 {
		w.count(dirOut, resMalformed)
		return vDrop
	}
	mac, ok := w.nextHop(s, ip.Dst)
	if !ok {
		w.count(dirOut, resNoNeighbor)
		return vDrop
	}
	if !packet.DecTTL(frame, inner) {
		w.count(dirOut, resTTL)
		return vDrop
	}
	et := uint16(packet.EtherTypeIPv4)
	if ip.EtherType == packet.EtherTypeIPv6 {
		et = packet.EtherTypeIPv6
	}
	start := b.Off + inner - 14
	packet.WriteEthernet(b.Data, start, mac, w.extMAC, et)
	b.Off = start
	b.Len = end - inner + 14
	w.count(dirOut, resForwarded)
	return vExt
}

// replyFlow reports whether ip, a member's packet from a VIP, belongs to a flow in
// the connection table: a TCP or UDP reply (which confirms the flow, or refreshes it),
// or an ICMP error about a packet of the flow. A reply cut into fragments passes only
// with its first fragment, which carries the ports.
func (w *worker) replyFlow(s *snapshot, frame []byte, ip *packet.Packet) bool {
	var flow packet.Packet // the flow as the client sends it
	switch ip.Proto {
	case packet.ProtoTCP, packet.ProtoUDP:
		if ip.L4 < 0 {
			return false
		}
		flow = packet.Packet{Src: ip.Dst, Dst: ip.Src, SrcPort: ip.DstPort, DstPort: ip.SrcPort, Proto: ip.Proto}
	case packet.ProtoICMP, packet.ProtoICMPv6:
		// The error quotes the client's packet to the VIP.
		if packet.ICMPEmbedded(frame, ip, &flow) != nil || flow.Src != ip.Dst || flow.Dst != ip.Src ||
			flow.Proto != packet.ProtoTCP && flow.Proto != packet.ProtoUDP {
			return false
		}
	default:
		return false
	}
	r := s.lookupRule(ruleKey{addr: flow.Dst.As16(), proto: flow.Proto, port: flow.DstPort})
	if r == nil {
		return false
	}
	k := conntrack.Key{Client: flow.Src.As16(), ClientPort: flow.SrcPort, Rule: r.id}
	h := packet.FlowHash(w.seed, &flow)
	if ip.Proto != flow.Proto {
		_, _, ok := w.table.Lookup(&k, h, w.now) // an error says nothing of the flow's state
		return ok
	}
	confirmed := conntrack.StateEstablished
	if flow.Proto == packet.ProtoUDP {
		confirmed = conntrack.StateUDP
	}
	_, ok := w.table.LookupReply(&k, h, confirmed, w.now)
	return ok
}

// nextHop is the MAC to send a packet for dst to on the external side: the
// neighbour itself when on link, else the gateway.
func (w *worker) nextHop(s *snapshot, dst netip.Addr) (packet.MAC, bool) {
	dst = dst.Unmap()
	if dst.Is4() {
		if s.ext.pfx4.IsValid() && s.ext.pfx4.Contains(dst) {
			return w.neighbour(s, dst)
		}
		return s.extGW4, s.hasExtGW4
	}
	if s.ext.pfx6.IsValid() && s.ext.pfx6.Contains(dst) {
		return w.neighbour(s, dst)
	}
	return s.extGW6, s.hasExtGW6
}

// neighbour is the MAC of an on-link destination; when unknown, the control
// goroutine is asked to resolve it (the packet is dropped, as a router does while
// it resolves).
func (w *worker) neighbour(s *snapshot, dst netip.Addr) (packet.MAC, bool) {
	n, ok := s.extNeigh[dst]
	if !ok {
		select {
		case w.d.ctlResolve <- dst:
		default:
		}
		return packet.MAC{}, false
	}
	if n.used.Load() != w.ms {
		n.used.Store(w.ms) // once a millisecond at most: the least recently used is evicted first
	}
	return n.mac, true
}

// sendControl transmits up to 16 frames the control goroutine queued.
func (w *worker) sendControl() int {
	for i := range 16 {
		var f ctlFrame
		select {
		case f = <-w.d.ctlTx:
		default:
			return i
		}
		p := w.int
		if f.ext {
			p = w.ext
		}
		if p.Alloc(w.txOne) != 1 {
			return i
		}
		b := &w.txOne[0]
		if b.Off+len(f.data) > len(b.Data) {
			p.Free(w.txOne)
			continue
		}
		b.Len = copy(b.Data[b.Off:], f.data)
		if p.TxBurst(w.id, w.txOne) != 1 {
			p.Free(w.txOne)
		}
	}
	return 16
}

// toControl hands a copy of frame to the control goroutine.
func (w *worker) toControl(frame []byte, fromExt bool) verdict {
	if len(w.d.ctlFrames) == cap(w.d.ctlFrames) {
		// Full: drop before copying, so a flood of ARP costs no allocation.
		w.count(dirLocal, resControlFull)
		return vGone
	}
	msg := ctlFrame{data: append([]byte(nil), frame...), ext: fromExt}
	select {
	case w.d.ctlFrames <- msg:
		w.count(dirLocal, resLocal)
	default:
		w.count(dirLocal, resControlFull)
	}
	return vGone
}

// publish copies the counters into their atomic mirror for metrics.
func (w *worker) publish() {
	pub := w.pub
	for d := range numDirs {
		for r := range numResults {
			pub.packets[d][r].Store(w.c.packets[d][r])
		}
	}
	s := w.d.snap.Load()
	for id, r := range s.ruleByID {
		if r != nil {
			pub.rule[id].Store(w.c.rule[id])
			pub.newFlows[id].Store(w.c.newFlows[id])
		}
	}
	counts := w.table.MemberCounts()
	for id, m := range s.members {
		if m != nil {
			pub.member[id].Store(w.c.member[id])
			if id < len(counts) {
				pub.conns[id].Store(uint64(counts[id]))
			}
		}
	}
	pub.tableLen.Store(int64(w.table.Len()))
	pub.halfOpen.Store(int64(w.table.HalfOpen()))
	pub.unconf.Store(int64(w.table.Unconfirmed()))
	pub.blSweeps.Store(w.c.blSweeps)
	pub.blRemoved.Store(w.c.blRemoved)
	pub.icmpSent.Store(w.c.icmpSent)
	pub.icmpSupp.Store(w.c.icmpSuppressed)
	st := w.table.Stats()
	pub.evictions.Store(st.Evictions)
	pub.expired.Store(st.Expired)
	pub.insertErr.Store(st.InsertFailures)
	w.pxPublish()
	w.ovPublish(s)
}
