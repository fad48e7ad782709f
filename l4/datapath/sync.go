package datapath

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/sessionsync"
)

// Session sync hooks (l4/sessionsync runs the sender and receiver).
//
// Each worker owns its table, so each worker does its own sync work, in its loop,
// between bursts: nothing else touches a table.
//
//   - Out: the table records its entries' state changes (conntrack.EnableEvents; a
//     packet of an established flow changes nothing, so the established-flow path
//     does no more work). A flow that becomes established (or a confirmed UDP flow)
//     goes into a FIFO with the time; once it has lived SyncOptions.After and is
//     still in the table, the worker marks it sent and queues it, with its member's
//     address and the encapsulation, on its outgoing ring. Later state changes (fin,
//     close) and deletions of an entry that was sent, or received, are queued at
//     once. The sender drains the rings (Distributor.SyncDrain).
//   - Full sync: SyncFullStart asks every worker to walk its table, a few hundred
//     positions per loop, queueing every live established, fin or UDP entry (those
//     received from peers from worker 0 only: see below), young ones too, which
//     also repairs what a full FIFO or ring dropped, on a second ring that the
//     sender drains at its own pace; a full ring pauses the walk, so a full sync
//     never takes more from the packet loop than a bounded step.
//   - In: SyncInstall queues received entries on the workers' incoming rings; each
//     worker installs them in its own table (conntrack.Table.Install), marked
//     synced, with the member the peer chose, found by its address in the rule's
//     pool: the entry keeps its L7 node whatever this LD's scheduler would pick.
//
// Which worker sees a flow is decided outside the LD: the NIC's RSS (its own key and
// redirection table) or, for net_af_packet, the kernel's PACKET_FANOUT_HASH, a
// symmetric flow hash with a random key drawn at each boot (and rollover to another
// socket when one is full). Neither can be computed here, and it differs between
// LDs. So with more than one worker a received entry is installed in every worker's
// table: the worker the port gives the flow's packets to finds it; the copies in
// the others are never hit and go with their timeout (or the peer's deletion). That
// costs a synced connection one entry per worker; with one worker, one.

// SyncOptions turn session sync on (EnableSync).
type SyncOptions struct {
	// After is how long a connection lives before it is sent to the peers.
	// Default 3s.
	After time.Duration
	// Queue is the length of each worker's rings (outgoing, full sync, incoming),
	// in entries. Default 16384. The FIFO of connections waiting to have lived
	// After holds up to 262,144 per worker (or its table's capacity).
	Queue int
}

// SyncStats are the workers' session sync counters, summed.
type SyncStats struct {
	// Emitted counts entries queued for the peers (incremental and full sync).
	Emitted uint64
	// QueueDropped counts entries not queued because a ring or the delay FIFO
	// was full (a full sync repairs them).
	QueueDropped uint64
	// Installed counts received entries a worker installed or deleted.
	Installed uint64
	// Refused counts received entries not installed, by reason: no_rule (no rule
	// for the VIP, protocol and port), no_member (no member with that address in
	// the rule's pool), kept (this LD made the flow itself and keeps it),
	// table_full.
	NoRule, NoMember, Kept, TableFull uint64
	// EncapMismatch counts received entries whose encapsulation is not this LD's
	// (installed all the same: the member is the one that matters).
	EncapMismatch uint64
}

// spsc is a ring of entries with one producer and one consumer goroutine.
type spsc struct {
	buf  []sessionsync.Entry
	mask uint64
	_    [48]byte
	head atomic.Uint64 // next to read
	_    [56]byte
	tail atomic.Uint64 // next to write
}

func newSPSC(n int) *spsc {
	size := 1
	for size < n {
		size <<= 1
	}
	return &spsc{buf: make([]sessionsync.Entry, size), mask: uint64(size - 1)}
}

func (r *spsc) push(e *sessionsync.Entry) bool {
	t := r.tail.Load()
	if t-r.head.Load() > r.mask {
		return false
	}
	r.buf[t&r.mask] = *e
	r.tail.Store(t + 1)
	return true
}

func (r *spsc) pop(dst []sessionsync.Entry, max int) []sessionsync.Entry {
	h, t := r.head.Load(), r.tail.Load()
	n := min(t-h, uint64(max))
	for i := range n {
		dst = append(dst, r.buf[(h+i)&r.mask])
	}
	r.head.Store(h + n)
	return dst
}

func (r *spsc) empty() bool { return r.head.Load() == r.tail.Load() }

func (r *spsc) full() bool { return r.tail.Load()-r.head.Load() > r.mask }

// delayed is a connection waiting to have lived SyncOptions.After.
type delayed struct {
	key  conntrack.Key
	hash uint64
	at   int64 // worker nanoseconds when it became established
}

// poolAddr finds a member by its pool and address.
type poolAddr struct {
	pool string
	addr [16]byte
}

// workerSync is one worker's sync state.
type workerSync struct {
	after            int64
	out, full, in    *spsc
	delay            []delayed
	dHead, dN        int
	events           []conntrack.Event
	inBuf            []sessionsync.Entry
	memVer           uint64
	members          map[poolAddr]uint16
	fullGen, fullPos uint64
	fullDone         atomic.Uint64
	inApplied        atomic.Uint64 // entries taken off in and installed (or refused)
	fullFn           func(v *conntrack.View) bool
	fullSnap         *snapshot

	emitted, qDropped, installed, noRule, noMember, kept, tableFull, encapMis atomic.Uint64
}

// syncShared is the distributor's side of sync.
type syncShared struct {
	fullReq     atomic.Uint64
	inMu, outMu sync.Mutex
}

// syncWalkStep is how many table positions a full sync visits per worker loop.
const syncWalkStep = 256

// syncInStep is how many received entries a worker installs per loop.
const syncInStep = 256

// EnableSync turns session sync on; call it before Run. Without it the workers do
// no sync work and SyncDrain returns nothing.
func (d *Distributor) EnableSync(o SyncOptions) error {
	if d.started.Load() {
		return errors.New("datapath: EnableSync after Run")
	}
	if o.After == 0 {
		o.After = 3 * time.Second
	}
	if o.After < 0 {
		return errors.New("datapath: sync after is negative")
	}
	if o.Queue == 0 {
		o.Queue = 1 << 14
	}
	if o.Queue < 1 || o.Queue > 1<<24 {
		return errors.New("datapath: sync queue outside 1..16777216")
	}
	d.sync = &syncShared{}
	for _, w := range d.workers {
		w.table.EnableEvents(max(1024, o.Queue/4))
		w.sync = &workerSync{
			after: int64(o.After), out: newSPSC(o.Queue), full: newSPSC(o.Queue), in: newSPSC(o.Queue),
			delay: make([]delayed, min(1<<18, w.table.Cap())),
		}
		ws, wk := w.sync, w
		ws.fullFn = func(v *conntrack.View) bool { return wk.fullVisit(v) }
	}
	return nil
}

// SyncDrain appends to dst up to max entries the workers queued: incremental ones,
// or when full those of the full sync under way. One goroutine at a time.
func (d *Distributor) SyncDrain(dst []sessionsync.Entry, full bool, max int) []sessionsync.Entry {
	if d.sync == nil {
		return dst
	}
	d.sync.outMu.Lock()
	defer d.sync.outMu.Unlock()
	for _, w := range d.workers {
		if len(dst) >= max {
			break
		}
		r := w.sync.out
		if full {
			r = w.sync.full
		}
		dst = r.pop(dst, max-len(dst))
	}
	return dst
}

// SyncInstall queues received entries for the workers (every worker when there are
// several: see the package notes) and returns how many it queued; it waits a little
// for room in a full ring, then counts the entry as QueueDropped.
func (d *Distributor) SyncInstall(es []sessionsync.Entry) int {
	if d.sync == nil {
		return 0
	}
	d.sync.inMu.Lock()
	defer d.sync.inMu.Unlock()
	queued := 0
	for i := range es {
		ok := false
		for _, w := range d.workers {
			if w.sync.in.push(&es[i]) || waitPush(w.sync.in, &es[i]) {
				ok = true
			} else {
				w.sync.qDropped.Add(1)
			}
		}
		if ok {
			queued++
		}
	}
	return queued
}

// SyncInstalled returns a function that reports whether the workers have installed
// (or refused, and counted) every entry SyncInstall queued before the call. The
// session sync's warm-up waits on it: a peer's full sync is in this LD's tables, not
// just on its rings, before the LD announces its VIPs. The function never turns
// true once the workers have stopped.
func (d *Distributor) SyncInstalled() func() bool {
	if d.sync == nil {
		return func() bool { return true }
	}
	d.sync.inMu.Lock()
	marks := make([]uint64, len(d.workers))
	for i, w := range d.workers {
		marks[i] = w.sync.in.tail.Load()
	}
	d.sync.inMu.Unlock()
	return func() bool {
		for i, w := range d.workers {
			if w.sync.inApplied.Load() < marks[i] {
				return false
			}
		}
		return true
	}
}

// waitPush retries a push onto a full incoming ring for up to a second, while the
// worker installs what it holds (a full sync arrives faster than a busy worker takes
// it; the socket's buffer holds the datagrams meanwhile).
func waitPush(r *spsc, e *sessionsync.Entry) bool {
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		time.Sleep(20 * time.Microsecond)
		if r.push(e) {
			return true
		}
	}
	return false
}

// SyncFullStart asks every worker to walk its table and queue its long connections
// for a full sync, and returns the full sync's generation, for SyncFullDone.
func (d *Distributor) SyncFullStart() uint64 {
	if d.sync == nil {
		return 0
	}
	return d.sync.fullReq.Add(1)
}

// SyncFullDone reports whether every worker has walked its table for full sync gen
// (or a later one) and the full-sync rings are empty.
func (d *Distributor) SyncFullDone(gen uint64) bool {
	if d.sync == nil {
		return true
	}
	for _, w := range d.workers {
		if w.sync.fullDone.Load() < gen || !w.sync.full.empty() {
			return false
		}
	}
	return true
}

// SyncStats returns the workers' sync counters, summed.
func (d *Distributor) SyncStats() SyncStats {
	var st SyncStats
	if d.sync == nil {
		return st
	}
	for _, w := range d.workers {
		s := w.sync
		st.Emitted += s.emitted.Load()
		st.QueueDropped += s.qDropped.Load()
		st.Installed += s.installed.Load()
		st.NoRule += s.noRule.Load()
		st.NoMember += s.noMember.Load()
		st.Kept += s.kept.Load()
		st.TableFull += s.tableFull.Load()
		st.EncapMismatch += s.encapMis.Load()
	}
	return st
}

// syncStep does one loop's sync work and returns how much it did (0 when idle).
func (w *worker) syncStep() int {
	ws := w.sync
	work := 0
	s := w.d.snap.Load()
	if w.table.PendingEvents() {
		var dropped uint64
		ws.events, dropped = w.table.Events(ws.events[:0])
		ws.qDropped.Add(dropped)
		for i := range ws.events {
			w.syncEvent(s, &ws.events[i])
		}
		work += len(ws.events)
	}
	for ws.dN > 0 {
		dl := &ws.delay[ws.dHead]
		if w.mono-dl.at < ws.after || ws.out.full() {
			// Not due yet, or the sender is behind: the FIFO holds them meanwhile.
			break
		}
		if m, st, exp, ok := w.table.MarkSent(&dl.key, dl.hash, w.now); ok && st != conntrack.StateClose &&
			st != conntrack.StateSynRecv && st != conntrack.StateUnconfirmed {
			w.emit(s, ws.out, &dl.key, m, st, exp, sessionsync.OpUpsert)
		}
		ws.dHead = (ws.dHead + 1) % len(ws.delay)
		ws.dN--
		work++
	}
	if !ws.in.empty() {
		ws.inBuf = ws.in.pop(ws.inBuf[:0], syncInStep)
		for i := range ws.inBuf {
			w.install(s, &ws.inBuf[i])
		}
		ws.inApplied.Add(uint64(len(ws.inBuf)))
		work += len(ws.inBuf)
	}
	if ws.fullGen == 0 {
		if req := w.d.sync.fullReq.Load(); req > ws.fullDone.Load() {
			ws.fullGen, ws.fullPos = req, 1
		}
	}
	if ws.fullGen != 0 {
		ws.fullSnap = s
		next := w.table.Walk(uint32(ws.fullPos), syncWalkStep, w.now, ws.fullFn)
		ws.fullSnap = nil
		work++
		if next == 0 {
			ws.fullDone.Store(ws.fullGen)
			ws.fullGen = 0
		} else {
			ws.fullPos = uint64(next)
		}
	}
	return work
}

// fullVisit queues one entry of a full sync; false when the ring is full.
func (w *worker) fullVisit(v *conntrack.View) bool {
	if v.Synced && w.id != 0 {
		return true // every worker holds the copies: worker 0 sends them
	}
	switch v.State {
	case conntrack.StateEstablished, conntrack.StateFin, conntrack.StateUDP:
	default:
		return true
	}
	if w.sync.full.full() {
		return false
	}
	w.emit(w.sync.fullSnap, w.sync.full, &v.Key, v.Member, v.State, v.Expire, sessionsync.OpUpsert)
	v.MarkSent = !v.Synced
	return true
}

// syncEvent handles one state change or deletion of the table.
func (w *worker) syncEvent(s *snapshot, ev *conntrack.Event) {
	ws := w.sync
	switch {
	case ev.State == 0:
		if ev.Shared {
			w.emit(s, ws.out, &ev.Key, 0, 0, 0, sessionsync.OpDelete)
		}
	case ev.Shared:
		if m, st, exp, ok := w.table.MarkSent(&ev.Key, ev.Hash, w.now); ok {
			w.emit(s, ws.out, &ev.Key, m, st, exp, sessionsync.OpUpsert)
		}
	case ev.State == conntrack.StateEstablished || ev.State == conntrack.StateUDP:
		if ws.dN == len(ws.delay) {
			ws.qDropped.Add(1)
			return
		}
		ws.delay[(ws.dHead+ws.dN)%len(ws.delay)] = delayed{key: ev.Key, hash: ev.Hash, at: w.mono}
		ws.dN++
	}
}

// emit queues entry k (member, state and expiry for an upsert) on r.
func (w *worker) emit(s *snapshot, r *spsc, k *conntrack.Key, member uint16, st conntrack.State, expire uint32, op sessionsync.Op) {
	if int(k.Rule) >= len(s.ruleByID) || s.ruleByID[k.Rule] == nil {
		return
	}
	rl := s.ruleByID[k.Rule]
	e := sessionsync.Entry{
		Client: k.Client, ClientPort: k.ClientPort, VIP: rl.vip.As16(), VIPPort: rl.port,
		Proto: rl.proto, Op: op, Encap: encapOf(s),
	}
	if op == sessionsync.OpUpsert {
		if int(member) >= len(s.members) || s.members[member] == nil {
			return
		}
		e.Member = s.members[member].addr.As16()
		e.State = st
		if w.px != nil {
			w.pxEmit(k, &e)
		}
		if d := int32(expire - w.now); d > 0 {
			e.TTL = uint32(d)
		}
	} else {
		e.Member = [16]byte{10: 0xff, 11: 0xff}
	}
	if !r.push(&e) {
		w.sync.qDropped.Add(1)
		return
	}
	w.sync.emitted.Add(1)
}

func encapOf(s *snapshot) sessionsync.Encap {
	switch {
	case s.encapMode == packet.EncapIPIP:
		return sessionsync.EncapIPIP
	case s.tunnelKey != 0:
		return sessionsync.EncapGREKey
	}
	return sessionsync.EncapGRE
}

// flowHash is the flow hash of e's flow as the client sends it, as the packet path
// computes it.
func (w *worker) flowHash(e *sessionsync.Entry) uint64 {
	p := packet.Packet{Src: sessionsync.Addr(e.Client), Dst: sessionsync.Addr(e.VIP),
		SrcPort: e.ClientPort, DstPort: e.VIPPort, Proto: e.Proto}
	return packet.FlowHash(w.seed, &p)
}

// install applies one received entry to the worker's table.
func (w *worker) install(s *snapshot, e *sessionsync.Entry) {
	ws := w.sync
	r := s.lookupRule(ruleKey{addr: e.VIP, proto: e.Proto, port: e.VIPPort})
	if r == nil {
		ws.noRule.Add(1)
		return
	}
	k := conntrack.Key{Client: e.Client, ClientPort: e.ClientPort, Rule: r.id}
	h := w.flowHash(e)
	if e.Op == sessionsync.OpDelete {
		w.table.RemoveSynced(&k, h)
		ws.installed.Add(1)
		return
	}
	if ws.memVer != s.version || ws.members == nil {
		ws.members = make(map[poolAddr]uint16, len(s.members))
		for _, m := range s.members {
			if m != nil {
				ws.members[poolAddr{m.pool, m.addr.As16()}] = m.id
			}
		}
		ws.memVer = s.version
	}
	id, ok := ws.members[poolAddr{r.pool, netip.AddrFrom16(e.Member).Unmap().As16()}]
	if !ok {
		ws.noMember.Add(1)
		return
	}
	if e.Encap != encapOf(s) {
		ws.encapMis.Add(1)
	}
	if w.pxInstall(r, &k, h, id, e) {
		ws.installed.Add(1)
		return
	}
	if w.table.Len() >= w.table.Cap() {
		ws.tableFull.Add(1)
	} else {
		ws.kept.Add(1)
	}
}

var _ sessionsync.Datapath = (*Distributor)(nil)
