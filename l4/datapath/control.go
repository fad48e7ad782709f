package datapath

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/port"
	"github.com/tiergate/tiergate/l4/sched"
)

// Neighbour resolution timings.
const (
	resolveRetry   = time.Second      // between requests while unresolved
	neighRefresh   = 60 * time.Second // a resolved entry is re-requested after this
	neighStale     = 5 * time.Minute  // and forgotten after this without an answer
	neighOnDemand  = 2 * time.Minute  // an on-demand entry (a client) lives this long unused
	controlTick    = 200 * time.Millisecond
	resolveRetries = 5 // requests before an unanswered address is given up on
)

type ctlFrame struct {
	data []byte
	ext  bool
}

const (
	sideExt = iota
	sideInt
)

// neighbour is one resolved (or being resolved) next hop.
type neighbour struct {
	mac     packet.MAC
	valid   bool
	side    int
	wanted  bool // a gateway or member: always kept resolved, never evicted
	static  bool // configured MAC: never resolved, never aged
	learned time.Time
	asked   time.Time
	tries   int
	// used is when the entry was last used, in milliseconds of the distributor's
	// clock (msClock): by a worker (through the snapshot's neighHit), or by the
	// request that created it.
	used atomic.Uint32
}

// pinned reports whether e is never evicted: a gateway, a member's next hop, or static.
func (e *neighbour) pinned() bool { return e.wanted || e.static }

// idle is how long e has not been used, at msClock now.
func (e *neighbour) idle(now uint32) time.Duration {
	return time.Duration(int32(now-e.used.Load())) * time.Millisecond
}

// msClock is t in milliseconds since the distributor's epoch, modulo 2^32: the clock
// of neighbour use, which workers read from their own clock.
func (d *Distributor) msClock(t time.Time) uint32 {
	return uint32(t.Sub(d.epoch) / time.Millisecond)
}

type neighbours struct {
	entries map[netip.Addr]*neighbour
}

func (n *neighbours) mac(a netip.Addr) (packet.MAC, bool) {
	e := n.entries[a.Unmap()]
	if e == nil || !e.valid {
		return packet.MAC{}, false
	}
	return e.mac, true
}

// control owns the configuration, IDs, member health, drains and neighbours. It
// runs on one goroutine; every mutation reaches it through Distributor.do.
type control struct {
	d       *Distributor
	log     *slog.Logger
	cfg     Config
	version uint64
	dirty   bool

	ruleIDs map[string]uint16
	members map[string]*memberState // by memberKey(pool, name)
	neigh   neighbours

	maglevs    map[string]*sched.Maglev
	maglevUsed map[string]bool

	extMAC, intMAC packet.MAC
	health         chan healthResult
	ctx            context.Context
}

func newControl(d *Distributor, cfg Config) (*control, error) {
	c := &control{
		d:          d,
		log:        d.log,
		ruleIDs:    map[string]uint16{},
		members:    map[string]*memberState{},
		neigh:      neighbours{entries: map[netip.Addr]*neighbour{}},
		maglevs:    map[string]*sched.Maglev{},
		maglevUsed: map[string]bool{},
		extMAC:     packet.MAC(d.opts.External.MAC()),
		intMAC:     packet.MAC(d.opts.Internal.MAC()),
		health:     make(chan healthResult, 64),
	}
	if err := c.apply(cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// apply installs cfg: IDs for new rules and members, retirement for removed ones,
// then a new snapshot.
func (c *control) apply(cfg Config) error {
	ruleIDs := map[string]uint16{}
	used := map[uint16]bool{}
	for _, r := range cfg.Rules {
		if id, ok := c.ruleIDs[r.Name]; ok {
			ruleIDs[r.Name] = id
			used[id] = true
		}
	}
	next := uint16(0)
	for _, r := range cfg.Rules {
		if _, ok := ruleIDs[r.Name]; ok {
			continue
		}
		for used[next] {
			next++
		}
		if int(next) >= maxRules {
			return fmt.Errorf("datapath: more than %d rules", maxRules)
		}
		ruleIDs[r.Name] = next
		used[next] = true
	}

	// Members: keep IDs of those that stay, retire those that go (they keep their
	// ID while flows use them), give new ones free IDs.
	keep := map[string]bool{}
	for pn, p := range cfg.Pools {
		for _, m := range p.Members {
			keep[memberKey(pn, m.Name)] = true
		}
	}
	members := map[string]*memberState{}
	usedM := map[uint16]bool{}
	for k, ms := range c.members {
		// Changes go to copies, so that a config rejected below leaves the
		// members in force untouched.
		cp := *ms
		members[k] = &cp
		usedM[ms.id] = true
	}
	nextM := uint16(0)
	for _, pn := range sortedKeys(cfg.Pools) {
		p := cfg.Pools[pn]
		for _, mc := range p.Members {
			k := memberKey(pn, mc.Name)
			if ms, ok := members[k]; ok {
				if ms.cfg.Address != mc.Address {
					// A new address is a new member for flows: retire the old one.
					members[k+"\x00"+ms.cfg.Address.String()] = ms
					ms.retired = true
					ms.retiredAt = time.Now()
					delete(members, k)
				} else {
					ms.cfg = mc
					ms.retired = false
					continue
				}
			}
			for usedM[nextM] {
				nextM++
			}
			if int(nextM) >= maxMembers {
				return fmt.Errorf("datapath: more than %d members", maxMembers)
			}
			members[k] = &memberState{id: nextM, pool: pn, cfg: mc, up: true}
			usedM[nextM] = true
		}
	}
	now := time.Now()
	for k, ms := range members {
		if !keep[k] && !ms.retired {
			ms.retired = true
			ms.retiredAt = now
		}
	}
	old := c.cfg
	oldRules, oldMembers := c.ruleIDs, c.members
	c.cfg, c.ruleIDs, c.members = cfg, ruleIDs, members
	clear(c.maglevUsed)
	c.wantNeighbours()
	s, err := c.buildSnapshot()
	if err != nil {
		c.cfg, c.ruleIDs, c.members = old, oldRules, oldMembers
		c.wantNeighbours()
		return err
	}
	for sig := range c.maglevs {
		if !c.maglevUsed[sig] {
			delete(c.maglevs, sig)
		}
	}
	c.publish(s)
	c.ovApply()
	c.restartHealth()
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (c *control) publish(s *snapshot) {
	c.version = s.version
	c.d.snap.Store(s)
	c.dirty = false
}

// rebuild publishes a new snapshot after a change of health, drain or neighbours.
func (c *control) rebuild() {
	clear(c.maglevUsed)
	s, err := c.buildSnapshot()
	if err != nil {
		c.log.Error("l4: rebuilding the forwarding state", "err", err)
		return
	}
	c.publish(s)
}

// memberConns is the number of flows referring to member id, as the workers last
// published it.
func (c *control) memberConns(id uint16) uint64 {
	var n uint64
	for _, w := range c.d.workers {
		n += w.pub.conns[id].Load()
	}
	return n
}

func (c *control) setDrained(pool, name string, drained bool) error {
	ms := c.members[memberKey(pool, name)]
	if ms == nil || ms.retired {
		return fmt.Errorf("%w: %s/%s", ErrNoMember, pool, name)
	}
	if ms.drained != drained {
		ms.drained = drained
		c.rebuild()
	}
	return nil
}

// run is the control loop.
func (c *control) run(ctx context.Context, closed <-chan struct{}) {
	c.ctx = ctx
	c.restartHealth()
	defer c.stopHealth()
	c.resolveAll(time.Now())
	tick := time.NewTicker(controlTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-closed:
			return
		case op := <-c.d.ops:
			op(c)
		case f := <-c.d.ctlFrames:
			c.handleFrame(f)
		case a := <-c.d.ctlResolve:
			c.resolveOnDemand(a)
		case r := <-c.health:
			c.healthResult(r)
		case now := <-tick.C:
			c.resolveAll(now)
			c.reapRetired()
			c.ovTick(now)
		}
		if c.dirty {
			c.rebuild()
		}
		c.d.neighCount.Store(int64(len(c.neigh.entries)))
	}
}

// reapRetired forgets retired members no flow has referred to for a while (the
// workers' counts are published every publishEvery, so a fresh zero is not
// trusted).
func (c *control) reapRetired() {
	for k, ms := range c.members {
		if ms.retired && time.Since(ms.retiredAt) > 10*publishEvery && c.memberConns(ms.id) == 0 {
			delete(c.members, k)
			c.dirty = true
		}
	}
}

// wantNeighbours marks the gateways and members' next hops as always resolved.
func (c *control) wantNeighbours() {
	for _, e := range c.neigh.entries {
		e.wanted = false
	}
	for a, e := range c.neigh.entries {
		if e.static {
			delete(c.neigh.entries, a)
		}
	}
	want := func(a netip.Addr, side int, static packet.MAC) {
		if !a.IsValid() {
			return
		}
		a = a.Unmap()
		e := c.neigh.entries[a]
		if e == nil {
			e = &neighbour{side: side}
			c.neigh.entries[a] = e
		}
		e.wanted = true
		if static != (packet.MAC{}) {
			e.static, e.valid, e.mac = true, true, static
		}
	}
	defer func() {
		for len(c.neigh.entries) > c.cfg.MaxNeighbours && c.evictNeighbour() {
		}
	}()
	want(c.cfg.External.Gateway, sideExt, c.cfg.External.GatewayMAC)
	want(c.cfg.External.Gateway6, sideExt, c.cfg.External.Gateway6MAC)
	for _, ms := range c.members {
		a := ms.cfg.Address.Unmap()
		pfx, gw := c.cfg.Internal.Addr, c.cfg.Internal.Gateway
		if a.Is6() {
			pfx, gw = c.cfg.Internal.Addr6, c.cfg.Internal.Gateway6
		}
		if !pfx.Contains(a) && gw.IsValid() {
			a = gw
		}
		want(a, sideInt, ms.cfg.MAC)
	}
}

// resolveAll sends requests for unresolved and aging neighbours and forgets stale
// ones.
func (c *control) resolveAll(now time.Time) {
	clock := c.d.msClock(now)
	for a, e := range c.neigh.entries {
		if e.static {
			continue
		}
		switch {
		case !e.wanted && e.idle(clock) > neighOnDemand && now.Sub(e.asked) > neighOnDemand:
			delete(c.neigh.entries, a)
			if e.valid {
				c.dirty = true
			}
		case e.valid && now.Sub(e.learned) > neighStale:
			e.valid = false
			e.tries = 0
			c.dirty = true
			c.request(a, e, now)
		case !e.valid && now.Sub(e.asked) >= resolveRetry && (e.wanted || e.tries < resolveRetries):
			c.request(a, e, now)
		case e.valid && e.wanted && now.Sub(e.learned) > neighRefresh && now.Sub(e.asked) >= resolveRetry:
			c.request(a, e, now)
		}
	}
}

// resolveOnDemand starts resolving an on-link client a worker could not reach. When
// the table is full it makes room by evicting the least recently used entry that is
// not pinned, or gives up when every entry is.
func (c *control) resolveOnDemand(a netip.Addr) {
	a = a.Unmap()
	now := time.Now()
	e := c.neigh.entries[a]
	if e == nil {
		if len(c.neigh.entries) >= c.cfg.MaxNeighbours && !c.evictNeighbour() {
			c.d.neighRefused.Add(1)
			return
		}
		e = &neighbour{side: sideExt}
		c.neigh.entries[a] = e
	}
	e.used.Store(c.d.msClock(now))
	if !e.valid && now.Sub(e.asked) >= resolveRetry {
		c.request(a, e, now)
	}
}

// evictNeighbour forgets the entry that is not pinned and was used least recently, and
// reports whether there was one.
func (c *control) evictNeighbour() bool {
	var victim netip.Addr
	var oldest uint32
	for a, e := range c.neigh.entries {
		if e.pinned() {
			continue
		}
		if u := e.used.Load(); !victim.IsValid() || int32(u-oldest) < 0 {
			victim, oldest = a, u
		}
	}
	if !victim.IsValid() {
		return false
	}
	if c.neigh.entries[victim].valid {
		c.dirty = true
	}
	delete(c.neigh.entries, victim)
	c.d.neighEvictions.Add(1)
	return true
}

// request sends an ARP request or a neighbour solicitation for a.
func (c *control) request(a netip.Addr, e *neighbour, now time.Time) {
	e.asked = now
	e.tries++
	p, mac, src := c.sidePort(e.side, a)
	if !src.IsValid() {
		return
	}
	var frame []byte
	if a.Is4() {
		frame = packet.AppendARP(nil, packet.Broadcast, mac, &packet.ARP{
			Op: 1, SenderMAC: mac, SenderIP: src, TargetIP: a,
		})
	} else {
		frame = packet.AppendNS(nil, mac, src, a)
	}
	c.send(p, frame)
}

// sidePort is the port, MAC and own address of family a on a side.
func (c *control) sidePort(side int, a netip.Addr) (port.Port, packet.MAC, netip.Addr) {
	in, p, mac := c.cfg.External, c.d.opts.External, c.extMAC
	if side == sideInt {
		in, p, mac = c.cfg.Internal, c.d.opts.Internal, c.intMAC
	}
	if a.Is4() {
		return p, mac, in.Addr.Addr()
	}
	return p, mac, in.Addr6.Addr()
}

// send transmits frame on p. The control goroutine owns no TX queue: worker 0
// sends its frames on its own queue between bursts (so a port needs only one TX
// queue per worker, which is all some drivers offer).
func (c *control) send(p port.Port, frame []byte) {
	if len(frame) < 60 {
		frame = append(frame, make([]byte, 60-len(frame))...)
	}
	select {
	case c.d.ctlTx <- ctlFrame{data: frame, ext: p == c.d.opts.External}:
	default:
		c.log.Warn("l4: control transmit queue full; dropping a control packet", "port", p.Name())
	}
}

// handleFrame answers ARP and neighbour solicitations for the LD's addresses and
// VIPs, and learns neighbours from what it sees.
func (c *control) handleFrame(f ctlFrame) {
	var p packet.Packet
	if err := packet.Parse(f.data, &p); err != nil {
		return
	}
	side := sideInt
	pt, mac := c.d.opts.Internal, c.intMAC
	if f.ext {
		side = sideExt
		pt, mac = c.d.opts.External, c.extMAC
	}
	s := c.d.snap.Load()
	switch p.EtherType {
	case packet.EtherTypeARP:
		var a packet.ARP
		if packet.ParseARP(f.data, &p, &a) != nil {
			return
		}
		c.learn(a.SenderIP, a.SenderMAC, side)
		if a.Op == 1 && c.answers(s, a.TargetIP, f.ext) {
			reply := packet.AppendARP(nil, a.SenderMAC, mac, &packet.ARP{
				Op: 2, SenderMAC: mac, SenderIP: a.TargetIP, TargetMAC: a.SenderMAC, TargetIP: a.SenderIP,
			})
			c.send(pt, reply)
		}
	case packet.EtherTypeIPv6:
		var nd packet.ND
		if packet.ParseND(f.data, &p, &nd) != nil {
			return
		}
		switch nd.Type {
		case 135: // solicitation
			if nd.HasLinkAddr && !p.Src.IsUnspecified() {
				c.learn(p.Src, nd.LinkAddr, side)
			}
			if c.answers(s, nd.Target, f.ext) && !p.Src.IsUnspecified() {
				var srcMAC packet.MAC
				copy(srcMAC[:], f.data[6:12])
				c.send(pt, packet.AppendNA(nil, mac, srcMAC, nd.Target, p.Src, nd.Target, true))
			}
		case 136: // advertisement
			if nd.HasLinkAddr {
				c.learn(nd.Target, nd.LinkAddr, side)
			}
		}
	}
}

// answers tells whether the LD answers ARP/ND for a on a side: its own address
// there, and on the external side every VIP.
func (c *control) answers(s *snapshot, a netip.Addr, ext bool) bool {
	a = a.Unmap()
	if ext {
		_, vip := s.vips[a.As16()]
		return vip || s.ext.owns(a.As16())
	}
	return s.int.owns(a.As16())
}

// learn records a's MAC when a is a neighbour the LD wants or is resolving.
func (c *control) learn(a netip.Addr, mac packet.MAC, side int) {
	a = a.Unmap()
	e := c.neigh.entries[a]
	if e == nil || e.static || mac == (packet.MAC{}) {
		return
	}
	if !e.valid || e.mac != mac || e.side != side {
		c.dirty = true
	}
	e.mac, e.valid, e.side, e.learned, e.tries = mac, true, side, time.Now(), 0
}
