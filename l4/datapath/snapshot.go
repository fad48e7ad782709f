package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/l4/conntrack"
	"github.com/tiergate/tiergate/l4/packet"
	"github.com/tiergate/tiergate/l4/sched"
)

// Limits of the ID spaces. Rule and member IDs index the workers' counter arrays and
// are what connection-table entries refer to.
const (
	maxRules   = 4096
	maxMembers = 4096
)

const (
	schedMaglev = iota
	schedWRR
	schedWLC
)

// snapshot is everything a worker reads to forward a packet. It is immutable once
// published; the control goroutine builds a new one for every change (config,
// health, drain, neighbour) and swaps it in atomically.
type snapshot struct {
	version uint64

	rules     map[ruleKey]*rule
	ruleList  []ruleEntry       // the same rules, scanned instead of hashed when there are few
	fragRules map[ruleKey]*rule // (VIP, proto, port 0) → the rule fragments go to
	ruleByID  []*rule
	members   []*member // by ID; a member no rule schedules any more stays while flows use it
	vips      map[[16]byte]struct{}
	vipList   [][16]byte            // the same, scanned when there are few
	memberIP  map[[16]byte]struct{} // accepted outer sources of the return path
	tunnelKey uint32                // GRE key sent to members and required on replies; 0: none

	ext, int   side
	mtu        int
	encapMode  packet.EncapMode
	extNeigh   map[netip.Addr]neighHit // on-link destinations on the external side
	icmpRate   int                     // ICMP errors per second per worker; ≤ 0: none
	icmpBurst  int
	extGW4     packet.MAC
	extGW6     packet.MAC
	hasExtGW4  bool
	hasExtGW6  bool
	quicCIDLen int
	timeouts   conntrack.Timeouts
	trace      *traceConf // probe tracing (trace.go); nil when off

	synproxy *pxSnap // the SYN proxy's settings (synproxy.go); nil when no rule is proxied
}

// side is one port's own addresses.
// neighHit is a resolved on-link neighbour as the workers see it: its MAC, and where
// they note when they last used it (Distributor.msClock), so that the control
// goroutine evicts the least recently used first.
type neighHit struct {
	mac  packet.MAC
	used *atomic.Uint32
}

type side struct {
	addr4, addr6 netip.Addr
	pfx4, pfx6   netip.Prefix
}

func (s *side) owns(a [16]byte) bool {
	return s.addr4.IsValid() && s.addr4.As16() == a || s.addr6.IsValid() && s.addr6.As16() == a
}

type rule struct {
	id      uint16
	name    string
	pool    string
	proto   uint8
	port    uint16
	vip     netip.Addr
	quic    bool
	sched   int
	maglev  *sched.Maglev
	ids     []uint16 // schedulable members (up, not drained, weight > 0)
	weights []uint32
	quicIDs map[uint16]uint16 // QUIC server ID → member ID (schedulable members only)
}

type member struct {
	id      uint16
	name    string
	pool    string
	addr    netip.Addr
	weight  uint32
	quicID  uint16
	up      bool
	drained bool
	retired bool // no longer configured; kept while flows refer to it

	encap      *packet.Encap // nil while the next hop's MAC is unknown
	overhead4  int           // bytes added in front of an IPv4 inner packet (Ethernet included)
	overhead6  int
	mss4, mss6 uint16 // MSS clamp for IPv4 / IPv6 inner SYNs
}

// ruleEntry is one rule with its key, for the linear scan of lookupRule.
type ruleEntry struct {
	key ruleKey
	r   *rule
}

// ruleScanMax is the most rules lookupRule scans before it uses the map: a scan of
// a few 20-byte keys costs less than hashing one.
const ruleScanMax = 8

// lookupRule finds the rule of a packet's destination.
func (s *snapshot) lookupRule(k ruleKey) *rule {
	if len(s.ruleList) <= ruleScanMax {
		for i := range s.ruleList {
			if s.ruleList[i].key == k {
				return s.ruleList[i].r
			}
		}
		return nil
	}
	return s.rules[k]
}

func (s *snapshot) isVIP(a netip.Addr) bool { return s.isVIPKey(a.As16()) }

func (s *snapshot) isVIPKey(a [16]byte) bool {
	if len(s.vipList) <= ruleScanMax {
		for i := range s.vipList {
			if s.vipList[i] == a {
				return true
			}
		}
		return false
	}
	_, ok := s.vips[a]
	return ok
}

// memberState is the control goroutine's record of one member across snapshots.
type memberState struct {
	id      uint16
	pool    string
	cfg     MemberConfig
	up      bool
	drained bool // set by the admin API; config Drained also drains
	retired bool
	// retiredAt is when the member left the configuration.
	retiredAt time.Time
	rise      int
	fall      int
	checker   *healthChecker
}

func memberKey(pool, name string) string { return pool + "/" + name }

// buildSnapshot compiles cfg and the control state into a snapshot. maglevs caches
// tables by their inputs so that an unrelated change does not rebuild them.
func (c *control) buildSnapshot() (*snapshot, error) {
	cfg := c.cfg
	s := &snapshot{
		version:    c.version + 1,
		rules:      make(map[ruleKey]*rule, len(cfg.Rules)),
		fragRules:  make(map[ruleKey]*rule),
		vips:       make(map[[16]byte]struct{}),
		memberIP:   make(map[[16]byte]struct{}),
		mtu:        cfg.Tunnel.MTU,
		tunnelKey:  cfg.Tunnel.Key,
		extNeigh:   make(map[netip.Addr]neighHit),
		icmpRate:   cfg.ICMP.Rate,
		icmpBurst:  cfg.ICMP.Burst,
		quicCIDLen: quicCIDLen,
		timeouts:   cfg.Conntrack.Timeouts,
		trace:      newTraceConf(&cfg.Trace),
	}
	if cfg.Tunnel.Mode == ModeIPIP {
		s.encapMode = packet.EncapIPIP
	}
	s.ext = sideOf(cfg.External)
	s.int = sideOf(cfg.Internal)
	if gw := cfg.External.Gateway; gw.IsValid() {
		s.extGW4, s.hasExtGW4 = c.neigh.mac(gw)
	}
	if gw := cfg.External.Gateway6; gw.IsValid() {
		s.extGW6, s.hasExtGW6 = c.neigh.mac(gw)
	}
	for a, n := range c.neigh.entries {
		if n.valid && n.side == sideExt {
			s.extNeigh[a] = neighHit{mac: n.mac, used: &n.used}
		}
	}

	maxID := 0
	for _, ms := range c.members {
		maxID = max(maxID, int(ms.id))
	}
	s.members = make([]*member, maxID+1)
	for _, ms := range c.members {
		m := &member{
			id: ms.id, name: ms.cfg.Name, pool: ms.pool, addr: ms.cfg.Address.Unmap(),
			weight: ms.cfg.Weight, quicID: ms.cfg.QUICID, up: ms.up,
			drained: ms.drained || ms.cfg.Drained, retired: ms.retired,
		}
		s.memberIP[m.addr.As16()] = struct{}{}
		if err := c.prepareEncap(s, m); err != nil {
			return nil, err
		}
		s.members[m.id] = m
	}

	maxRule := 0
	for _, id := range c.ruleIDs {
		maxRule = max(maxRule, int(id))
	}
	s.ruleByID = make([]*rule, maxRule+1)
	for _, rc := range cfg.Rules {
		r := &rule{
			id: c.ruleIDs[rc.Name], name: rc.Name, pool: rc.Pool, proto: protoNumber(rc.Protocol),
			port: rc.Port, vip: rc.VIP.Unmap(), quic: rc.QUIC, quicIDs: map[uint16]uint16{},
		}
		switch rc.Scheduler {
		case SchedWRR:
			r.sched = schedWRR
		case SchedWLC:
			r.sched = schedWLC
		}
		var keys []string
		for _, mc := range cfg.Pools[rc.Pool].Members {
			ms := c.members[memberKey(rc.Pool, mc.Name)]
			m := s.members[ms.id]
			if !m.up || m.drained || m.weight == 0 {
				continue
			}
			r.ids = append(r.ids, m.id)
			r.weights = append(r.weights, m.weight)
			keys = append(keys, mc.Name+"|"+m.addr.String())
			if m.quicID != 0 {
				r.quicIDs[m.quicID] = m.id
			}
		}
		mg, err := c.maglev(keys, r.weights, r.ids)
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", rc.Name, err)
		}
		r.maglev = mg
		k := ruleKey{addr: r.vip.As16(), proto: r.proto, port: r.port}
		s.rules[k] = r
		fk := ruleKey{addr: k.addr, proto: r.proto}
		if prev, ok := s.fragRules[fk]; !ok || r.id < prev.id {
			s.fragRules[fk] = r
		}
		s.ruleByID[r.id] = r
		s.ruleList = append(s.ruleList, ruleEntry{key: k, r: r})
		if _, dup := s.vips[k.addr]; !dup {
			s.vipList = append(s.vipList, k.addr)
		}
		s.vips[k.addr] = struct{}{}
	}
	s.synproxy = buildPxSnap(&cfg, s)
	return s, nil
}

func sideOf(in Interface) side {
	return side{addr4: in.Addr.Addr(), addr6: in.Addr6.Addr(), pfx4: in.Addr.Masked(), pfx6: in.Addr6.Masked()}
}

// prepareEncap fills m's encapsulation template when its next hop is resolved.
func (c *control) prepareEncap(s *snapshot, m *member) error {
	var src netip.Addr
	var gw netip.Addr
	var pfx netip.Prefix
	if m.addr.Is4() {
		src, gw, pfx = s.int.addr4, c.cfg.Internal.Gateway, c.cfg.Internal.Addr
	} else {
		src, gw, pfx = s.int.addr6, c.cfg.Internal.Gateway6, c.cfg.Internal.Addr6
	}
	if !src.IsValid() {
		return fmt.Errorf("member %q: no internal address of its family", m.name)
	}
	hop := m.addr
	if !pfx.Contains(hop) && gw.IsValid() {
		hop = gw
	}
	mac, ok := c.neigh.mac(hop)
	e := &packet.Encap{Mode: s.encapMode, Src: src, Dst: m.addr, SrcMAC: c.intMAC, DstMAC: mac, TTL: c.cfg.Tunnel.TTL, Key: s.tunnelKey}
	m.overhead4 = e.Overhead(false)
	m.overhead6 = e.Overhead(true)
	// MSS = MTU - outer headers (overhead minus Ethernet, the key's 4 bytes
	// included) - inner IP - TCP header.
	m.mss4 = uint16(s.mtu - (m.overhead4 - 14) - 20 - 20)
	m.mss6 = uint16(s.mtu - (m.overhead6 - 14) - 40 - 20)
	if !ok {
		return nil
	}
	if err := e.Prepare(); err != nil {
		return fmt.Errorf("member %q: encapsulation: %w", m.name, err)
	}
	m.encap = e
	return nil
}

// maglev returns the cached table for these inputs or builds it.
func (c *control) maglev(keys []string, weights []uint32, ids []uint16) (*sched.Maglev, error) {
	var sb strings.Builder
	for i := range keys {
		sb.WriteString(keys[i])
		sb.WriteByte('=')
		sb.WriteString(strconv.FormatUint(uint64(weights[i]), 10))
		sb.WriteByte('#')
		sb.WriteString(strconv.FormatUint(uint64(ids[i]), 10))
		sb.WriteByte(';')
	}
	sig := sb.String()
	if m, ok := c.maglevs[sig]; ok {
		c.maglevUsed[sig] = true
		return m, nil
	}
	m, err := sched.NewMaglev(slices.Clone(keys), slices.Clone(weights), slices.Clone(ids), 0)
	if err != nil {
		return nil, err
	}
	c.maglevs[sig] = m
	c.maglevUsed[sig] = true
	return m, nil
}
