// Package tunnel is l7d's end of the tunnel from the L4 distributors (LDs): it receives
// the clients' packets that LDs encapsulate in GRE or IPIP, hands them to the local
// stack through a TUN device so l7d's listeners on the VIPs accept them with the
// client's real address, and sends each reply back, encapsulated the same way, to the
// LD its flow came from.
//
// It needs no GRE or IPIP support in the kernel. Outer packets arrive on raw IP sockets
// (protocols 47, 4 and 41); the inner packet is checked (outer source one of Config.LDs
// or within Config.LDRanges, the GRE key Config.Key when one is set, inner destination
// a VIP) and written to the TUN device, which carries the VIPs as host addresses, so the
// kernel delivers it locally. The flow it belongs to (inner addresses, ports and
// protocol) is learned with the LD that sent it and the encapsulation used, as TGW's
// return-path learning does. A policy rule sends everything with a VIP as source into
// the TUN device; the endpoint reads these replies, finds the flow (ICMP errors by the
// packet they quote), and sends them to that LD on the raw socket, which builds the
// outer IP header.
//
// A flow stays with the LD it was learned from: a packet of it from another LD is
// delivered, but moves its replies there only once the flow has been quiet on its own
// LD for Config.MoveIdle (the LD failed, or the routers in front moved the flow), so one
// spoofed packet cannot redirect a live flow. An LD of Config.LDs that has sent nothing
// for Config.LDDeadAfter while another has is taken for dead: its flows' replies are
// sent to it and copied to a live LD picked by a hash of the flow (which forwards them
// when the LDs' session sync gave it the flow), and a packet of such a flow from
// another LD moves it at once. A flow that has had no reply yet (one-way
// traffic, as junk is) is forgotten after Config.OneWayIdle, and it and the TCP flows
// that have shown only SYNs are the ones a full table evicts, oldest first. A reply
// whose flow is unknown (untracked, expired, never seen) goes to the LD if exactly one
// has been seen lately, and otherwise to one of Config.LDs chosen by a hash of the flow.
//
// The tunnel format and the rules a tunnel packet must pass (GRE flags, checksum and
// key, protocol types, inner version) are package wire's, which the LDs apply to the
// replies too: a packet one end of the tunnel accepts, the other accepts.
//
// Every packet is counted in tiergate_l7_tunnel_packets_total{dir,result}; the flows
// tracked are tiergate_l7_tunnel_flows, the flows evicted from a full table
// tiergate_l7_tunnel_flow_evictions_total, packets from another LD than their
// flow's tiergate_l7_tunnel_flow_moves_total{result}, and whether each LD is alive
// tiergate_l7_tunnel_ld_alive{ld}.
package tunnel

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/wire"
)

// Defaults of Config.
const (
	DefaultDevice      = "tg0"
	DefaultFlowIdle    = config.Duration(10 * time.Minute)
	DefaultOneWayIdle  = config.Duration(30 * time.Second)
	DefaultMoveIdle    = config.Duration(10 * time.Second)
	DefaultLDDeadAfter = config.Duration(time.Second)
	DefaultMaxFlows    = 1 << 20
	DefaultTable       = 4242
	// DefaultMTU is the TUN device's MTU when every LD is reached over IPv4: 1500
	// less the 20-byte outer IPv4 header and the 4-byte GRE header (4 less again with
	// a Key, whose header is 8 bytes).
	DefaultMTU = 1500 - 20 - greHeaderLen
	// DefaultMTU6 is the default when some LD is reached over IPv6 (40-byte header).
	DefaultMTU6 = 1500 - 40 - greHeaderLen
)

// HalfOpenIdle is how long a flow that has shown only TCP SYNs is kept (when FlowIdle
// is not shorter): longer than Linux takes to give up retransmitting a SYN-ACK (63 s
// with the default five retries), short enough that a SYN flood through the LDs does
// not fill the table for FlowIdle.
const HalfOpenIdle = 75 * time.Second

// Config configures an Endpoint. Its settings are the tunnel endpoint's model, l7d's
// tunnel section, with the same names in YAML and JSON; the fields tagged "-" are the
// objects a program hands over (metrics, logs). The zero value of every optional
// field means the default its comment gives; Defaults fills them in and Validate
// checks them, naming fields by path ("lds[1]", "one_way_idle").
type Config struct {
	// Device is the TUN device's name (at most 15 bytes). It is created by New and
	// removed by Close. Default "tg0".
	Device string `yaml:"device" json:"device,omitempty"`

	// VIPs are the virtual addresses this node serves, IPv4 or IPv6. They are
	// assigned to the TUN device as host addresses (/32, /128), so the listeners can
	// bind to them (or to 0.0.0.0 / ::), and every packet from an LD must be
	// addressed to one of them. Required.
	VIPs []netip.Addr `yaml:"vips" json:"vips"`

	// LDs are the L4 distributors' tunnel addresses, each exactly: packets whose
	// outer source is none of them (nor within LDRanges) are dropped and counted
	// (unknown_ld). Their address families decide which raw sockets are opened, and
	// a reply whose flow is unknown goes to one of them chosen by a hash of the flow.
	// Required unless LDRanges is set: the endpoint is not an open relay.
	LDs []netip.Addr `yaml:"lds" json:"lds,omitempty"`

	// LDRanges are prefixes every address of which is taken as an LD's, for LDs
	// numbered from a range rather than listed. Whoever can send from an address in
	// a range passes the source check, so a range is only as safe as the L7
	// network's filtering of spoofed sources (deploy/tunnel.md); replies of unknown
	// flows are not hashed over ranges. A prefix of length 0 is refused. Default
	// none.
	LDRanges []netip.Prefix `yaml:"ld_ranges" json:"ld_ranges,omitempty"`

	// Key, when not 0, is the GRE key (RFC 2890) the LDs put on every packet (l4d's
	// tunnel.key, which must be the same number): a packet without it or with
	// another, and any IPIP packet (which cannot carry one), is dropped and counted
	// (bad_key); replies carry it. Default 0: no key, none checked or sent.
	Key uint32 `yaml:"key" json:"key,omitempty"`

	// Local is this node's tunnel address: the raw socket of its family is bound to
	// it, so only packets addressed to it are received and replies leave from it.
	// Default: any local address receives, and the kernel picks the source of replies
	// by route.
	Local netip.Addr `yaml:"local" json:"local,omitzero"`

	// FlowIdle is how long a learned return path is kept after a flow's last packet
	// from its LD. It should be longer than the LDs' own idle timeout for established
	// connections, so a connection quiet on both tiers still finds its way back.
	// Default 10m.
	FlowIdle config.Duration `yaml:"flow_idle" json:"flow_idle,omitempty"`

	// OneWayIdle is how long a flow that has had no reply yet is kept after its last
	// packet (a TCP reset or an ICMP error is no reply: what the stack says to junk).
	// A real flow is answered within a round trip; one-way junk is forgotten after
	// this, and is the first evicted when the table is full. Default 30s (never more
	// than FlowIdle).
	OneWayIdle config.Duration `yaml:"one_way_idle" json:"one_way_idle,omitempty"`

	// MoveIdle is how long a flow must have had no packet from its LD before a packet
	// of it from another LD moves its replies there. Until then such packets are
	// delivered but the replies stay with the flow's LD, and the refusal is counted
	// (tiergate_l7_tunnel_flow_moves_total{result="refused"}): a live flow is never
	// redirected by one packet from elsewhere, spoofed or not, while a flow whose LD
	// failed follows its new LD after this long (the LDs share no sessions, so the
	// LD that forwarded a flow is the one that can carry its replies). Negative
	// ("-1s"): never, a flow stays with its first LD until it expires. Default 10s.
	MoveIdle config.Duration `yaml:"move_idle" json:"move_idle,omitempty"`

	// LDDeadAfter is how long an LD of LDs may send this node nothing (no packet of
	// any flow) while another LD of LDs has sent something within it, before it is
	// taken for dead: the replies of its flows are then sent to it and, a copy, to a
	// live LD of LDs chosen by a hash of the flow (one that has sent something within
	// LDDeadAfter), which forwards them when it holds the flow's entry (the LDs' session
	// sync); and a packet of such a flow from another LD moves its replies there at
	// once, without waiting for MoveIdle. The original LD keeps getting every reply, so
	// an LD that is only quiet loses nothing (the other LD drops a copy of a flow it does
	// not hold, and a client may see a packet twice); it is alive again with its next
	// packet. LDRanges are not watched. Counted in
	// tiergate_l7_tunnel_packets_total{dir="out",result="dead_ld"}; each LD's state is
	// tiergate_l7_tunnel_ld_alive{ld}. Negative ("-1s"): never, replies go to the
	// flow's LD only. Default 1s.
	LDDeadAfter config.Duration `yaml:"ld_dead_after" json:"ld_dead_after,omitempty"`

	// MaxFlows bounds the flows tracked (about 150 bytes each). When the table is
	// full a new flow evicts the oldest flow that has had no reply yet or has shown
	// only TCP SYNs; when there is none its packets are still delivered but not
	// tracked (table_full), and its replies take the fallback of an unknown flow.
	// Default 1<<20 (1048576).
	MaxFlows int `yaml:"max_flows" json:"max_flows,omitempty"`

	// MTU is the TUN device's MTU, which the local stack uses for the replies it
	// sends (TCP's MSS follows from it), so it must leave room for the outer headers
	// on the path to the LDs: path MTU less 24 (IPv4 outer) or 44 (IPv6 outer), 4
	// more with a Key. Packets from LDs are delivered whatever their size; the LD
	// clamps the client's MSS so they fit. From 576 to 65535, at least 1280 with an
	// IPv6 VIP. Default 1476 (DefaultMTU), or 1456 (DefaultMTU6) when an LD is IPv6;
	// 1472 and 1452 with a Key.
	MTU int `yaml:"mtu" json:"mtu,omitempty"`

	// Table is the policy routing table that routes replies into the TUN device: New
	// adds "default dev <Device>" to it and a rule "from <VIP> lookup <Table>" per
	// VIP, and Close removes the rules. It must not be used for anything else; 253 to
	// 255 are the kernel's. Default 4242.
	Table int `yaml:"table" json:"table,omitempty"`

	// Registerer receives the endpoint's metrics; Close unregisters them. Default
	// none.
	Registerer prometheus.Registerer `yaml:"-" json:"-"`

	// Logger receives the endpoint's logs. Default slog.Default().
	Logger *slog.Logger `yaml:"-" json:"-"`
}

// hasLDFamily reports whether an LD address or range is IPv6 (v6) or IPv4 (!v6),
// IPv4-mapped addresses counting as IPv4.
func (c *Config) hasLDFamily(v6 bool) bool {
	return slices.ContainsFunc(c.LDs, func(a netip.Addr) bool { return a.Unmap().Is6() == v6 }) ||
		slices.ContainsFunc(c.LDRanges, func(p netip.Prefix) bool { return p.Addr().Unmap().Is6() == v6 })
}

// Validate checks c and returns every problem, each a *config.FieldError named by its
// path within c ("vips[0]", "one_way_idle"). It changes nothing and creates nothing.
func (c *Config) Validate() error {
	var ck config.Checker
	if len(c.Device) > 15 {
		ck.Addf("device", "%q is longer than 15 bytes", c.Device)
	}
	if len(c.VIPs) == 0 {
		ck.Addf("vips", "required: at least one VIP")
	}
	for i, v := range c.VIPs {
		if !v.IsValid() || v.IsUnspecified() || v.Zone() != "" {
			ck.Addf(config.Index("vips", i), "%q is not a usable address", v)
		}
	}
	if len(c.LDs) == 0 && len(c.LDRanges) == 0 {
		ck.Addf("lds", "required unless ld_ranges: packets would be accepted from anywhere")
	}
	for i, a := range c.LDs {
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
			ck.Addf(config.Index("lds", i), "%q is not a usable address", a)
		}
	}
	for i, p := range c.LDRanges {
		if !p.IsValid() {
			ck.Addf(config.Index("ld_ranges", i), "%q is not a valid prefix", p)
		} else if unmapPrefix(p).Bits() == 0 {
			ck.Addf(config.Index("ld_ranges", i), "%s would take packets from anywhere", p)
		}
	}
	if l := c.Local.Unmap(); l.IsValid() && !l.IsUnspecified() && !c.hasLDFamily(l.Is6()) {
		ck.Addf("local", "%s is of a family no LD uses", c.Local)
	}
	if c.FlowIdle < 0 {
		ck.Addf("flow_idle", "%v is negative", c.FlowIdle)
	}
	if c.OneWayIdle < 0 {
		ck.Addf("one_way_idle", "%v is negative", c.OneWayIdle)
	}
	if c.MaxFlows < 0 {
		ck.Addf("max_flows", "%d is negative", c.MaxFlows)
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535 || c.MTU < 1280 && slices.ContainsFunc(c.VIPs, netip.Addr.Is6)) {
		ck.Addf("mtu", "%d is out of range (576 to 65535, at least 1280 with IPv6 VIPs)", c.MTU)
	}
	if c.Table < 0 || c.Table >= 253 && c.Table <= 255 {
		ck.Addf("table", "%d is reserved or invalid", c.Table)
	}
	return ck.Err()
}

// unmapPrefix returns p with an IPv4-mapped address as the IPv4 prefix it covers.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() {
		return netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
	}
	return p
}

// Defaults fills in the default of every field left zero. The MTU's depends on the
// LDs' family and the Key, OneWayIdle's on FlowIdle.
func (c *Config) Defaults() {
	if c.Device == "" {
		c.Device = DefaultDevice
	}
	if c.FlowIdle == 0 {
		c.FlowIdle = DefaultFlowIdle
	}
	if c.OneWayIdle == 0 {
		c.OneWayIdle = min(DefaultOneWayIdle, c.FlowIdle)
	}
	if c.MoveIdle == 0 {
		c.MoveIdle = DefaultMoveIdle
	}
	if c.LDDeadAfter == 0 {
		c.LDDeadAfter = DefaultLDDeadAfter
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = DefaultMaxFlows
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
		if c.hasLDFamily(true) {
			c.MTU = DefaultMTU6
		}
		c.MTU -= wire.SendLen(c.Key) - greHeaderLen
	}
	if c.Table == 0 {
		c.Table = DefaultTable
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// validate checks c, then puts its addresses in the form the endpoint compares
// (IPv4-mapped ones as IPv4, ranges masked, a negative MoveIdle as -1) and fills its
// defaults. c's slices must be its own.
func (c *Config) validate() error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	for i, v := range c.VIPs {
		c.VIPs[i] = v.Unmap()
	}
	for i, a := range c.LDs {
		c.LDs[i] = a.Unmap()
	}
	for i, p := range c.LDRanges {
		c.LDRanges[i] = unmapPrefix(p).Masked()
	}
	if c.Local = c.Local.Unmap(); c.Local.IsUnspecified() {
		c.Local = netip.Addr{}
	}
	if c.MoveIdle < 0 {
		c.MoveIdle = -1 // never
	}
	if c.LDDeadAfter < 0 {
		c.LDDeadAfter = -1 // never
	}
	c.Defaults()
	return nil
}

// result is a label value pair of tiergate_l7_tunnel_packets_total.
type result uint8

const (
	inOK          result = iota // delivered to the TUN device, flow tracked
	inTableFull                 // delivered, but the flow table was full
	inMalformed                 // not a well-formed IP packet, outer or inner
	inTruncated                 // shorter than its headers say
	inBadChecksum               // GRE checksum wrong
	inUnsupported               // GRE version, flags or protocol type we do not take
	inUnknownLD                 // outer source not among Config.LDs or LDRanges
	inBadKey                    // GRE key missing or not Config.Key (or IPIP with a key set)
	inNotLocal                  // outer destination not Config.Local
	inNotVIP                    // inner destination not a VIP
	inError                     // writing to the TUN device failed
	outOK                       // sent to the LD of the reply's flow
	outFallback                 // no flow; sent to the only LD seen lately
	outHashed                   // no flow; sent to an LD of Config.LDs chosen by hash
	outDeadLD                   // the flow's LD is dead: sent to it and to a live LD by hash
	outNoFlow                   // no flow, no single recent LD, no LD address: dropped
	outMalformed                // the local stack's packet did not parse
	outNotVIP                   // source is not a VIP (a route sent it here by mistake)
	outTooBig                   // larger than the path to the LD allows
	outError                    // sending failed otherwise
	numResults
)

var resultLabels = [numResults][2]string{
	inOK: {"in", "ok"}, inTableFull: {"in", "table_full"}, inMalformed: {"in", "malformed"},
	inTruncated: {"in", "truncated"}, inBadChecksum: {"in", "bad_checksum"},
	inUnsupported: {"in", "unsupported"}, inUnknownLD: {"in", "unknown_ld"}, inBadKey: {"in", "bad_key"},
	inNotLocal: {"in", "not_local"}, inNotVIP: {"in", "not_vip"}, inError: {"in", "error"},
	outOK: {"out", "ok"}, outFallback: {"out", "fallback"}, outHashed: {"out", "hashed"},
	outDeadLD: {"out", "dead_ld"},
	outNoFlow: {"out", "no_flow"}, outMalformed: {"out", "malformed"}, outNotVIP: {"out", "not_vip"},
	outTooBig: {"out", "too_big"}, outError: {"out", "error"},
}

func parseResult(err error) result {
	switch err {
	case errTruncated:
		return inTruncated
	case errUnsupported:
		return inUnsupported
	case errChecksum:
		return inBadChecksum
	case errBadKey:
		return inBadKey
	}
	return inMalformed
}

// Stats are an endpoint's counters.
type Stats struct {
	// In counts packets from LDs and Out packets from the local stack, by the result
	// label of tiergate_l7_tunnel_packets_total (ok, unknown_ld, no_flow, ...).
	In, Out map[string]uint64
	// Flows is the number of flows tracked.
	Flows int
	// Evictions counts flows evicted from a full table to make room for a new one.
	Evictions uint64
	// Moves counts packets from another LD than their flow's that moved the flow's
	// replies to that LD (the flow had been quiet on its own for Config.MoveIdle),
	// MovesRefused those that did not.
	Moves, MovesRefused uint64
	// LDAlive says, for each LD of Config.LDs, whether it has sent a packet within
	// Config.LDDeadAfter (always true when that is negative).
	LDAlive map[netip.Addr]bool
}

// core is the part of an Endpoint that decides what happens to packets, apart from the
// devices and sockets: pure, so tests drive it directly.
type core struct {
	cfg    Config
	vips   map[netip.Addr]struct{}
	lds    map[netip.Addr]int // Config.LDs: the index in ldList
	ldList []peer             // Config.LDs, for replies of unknown flows
	// ldSeen is when a packet last came from each LD of ldList (0: never), refreshed
	// at most once per liveGrain.
	ldSeen []atomic.Int64
	dead   int64 // LDDeadAfter in ns; negative: never
	deadFn func(peer) bool
	flows  *flowTable
	recent recentLDs
	start  time.Time
	lim    limits
	idle   int64 // FlowIdle in ns
	move   int64 // MoveIdle in ns; negative: never
	counts [numResults]atomic.Uint64

	evictions, moves, movesRefused atomic.Uint64
}

func newCore(cfg Config) *core {
	c := &core{
		cfg:   cfg,
		vips:  make(map[netip.Addr]struct{}, len(cfg.VIPs)),
		lds:   make(map[netip.Addr]int, len(cfg.LDs)),
		flows: newFlowTable(cfg.MaxFlows),
		start: time.Now(),
		lim: limits{
			idle:     int64(cfg.FlowIdle),
			halfOpen: int64(min(HalfOpenIdle, cfg.FlowIdle.D())),
			oneWay:   int64(min(cfg.OneWayIdle, cfg.FlowIdle)),
		},
		idle: int64(cfg.FlowIdle),
		move: int64(cfg.MoveIdle),
		dead: int64(cfg.LDDeadAfter),
	}
	c.deadFn = c.ldDead
	for _, v := range cfg.VIPs {
		c.vips[v] = struct{}{}
	}
	for _, a := range cfg.LDs {
		if _, dup := c.lds[a]; !dup {
			c.lds[a] = len(c.ldList)
			c.ldList = append(c.ldList, peerFrom(a, modeGRE))
		}
	}
	c.ldSeen = make([]atomic.Int64, len(c.ldList))
	return c
}

// now is the core's clock: monotonic nanoseconds since it started, never 0.
func (c *core) now() int64 { return int64(time.Since(c.start)) + 1 }

func (c *core) count(r result) { c.counts[r].Add(1) }

func (c *core) isVIP(k *[16]byte, v6 bool) bool {
	var a netip.Addr
	if v6 {
		a = netip.AddrFrom16(*k)
	} else {
		a = netip.AddrFrom4([4]byte(k[:4]))
	}
	_, ok := c.vips[a]
	return ok
}

func (c *core) isLD(a netip.Addr) bool {
	if _, ok := c.lds[a]; ok {
		return true
	}
	for _, p := range c.cfg.LDRanges {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ldNoter remembers, per reading goroutine, the last LD noted in core.recent, so the
// shared list is written about once a second per LD rather than per packet.
type ldNoter struct {
	last peer
	at   int64
}

// inbound handles a packet read from a raw socket of family v6 and protocol proto: for
// IPv4, the whole IP packet; for IPv6, the payload after the outer header, with its
// source from. It returns the inner packet to write to the TUN device, or the result
// that drops it.
func (c *core) inbound(v6 bool, proto uint8, pkt []byte, from *[16]byte, n *ldNoter) ([]byte, result) {
	var src netip.Addr
	payload := pkt
	if v6 {
		src = netip.AddrFrom16(*from)
	} else {
		s, d, p, pl, err := outer4(pkt)
		if err != nil {
			return nil, parseResult(err)
		}
		if c.cfg.Local.Is4() && d != c.cfg.Local.As4() {
			return nil, inNotLocal
		}
		src, proto, payload = netip.AddrFrom4(s), p, pl
	}
	if !c.isLD(src) {
		return nil, inUnknownLD
	}
	now := c.now()
	if i, ok := c.lds[src]; ok {
		if s := &c.ldSeen[i]; s.Load() <= now-liveGrain || s.Load() == 0 {
			s.Store(now)
		}
	}
	inner, m, err := decapsulate(proto, payload, c.cfg.Key)
	if err != nil {
		return nil, parseResult(err)
	}
	pi, err := parseFlow(inner)
	if err != nil {
		return nil, parseResult(err)
	}
	if !c.isVIP(&pi.key.dst, pi.key.v6) {
		return nil, inNotVIP
	}
	inner = inner[:pi.size]
	if pi.frag && !pi.first {
		return inner, inOK // no ports: nothing to learn
	}
	p := peerFrom(src, m)
	r := inOK
	switch c.flows.learn(pi.key, p, pi.key.proto == protoTCP && pi.tcpFlags&(tcpSYN|tcpACK) == tcpSYN, now, c.move, c.deadFn) {
	case learnKept:
		return inner, inOK
	case learnFull:
		r = inTableFull
	case learnEvicted:
		c.evictions.Add(1)
	case learnMoved:
		c.moves.Add(1)
	case learnRefused:
		c.movesRefused.Add(1)
	}
	if n.last != p || now-n.at >= refresh {
		c.recent.note(p, now)
		n.last, n.at = p, now
	}
	return inner, r
}

// liveGrain is how stale an LD's last-seen time may get before a packet rewrites it.
const liveGrain = int64(10 * time.Millisecond)

// ldAlive reports whether LD i of ldList has sent a packet within LDDeadAfter of now.
func (c *core) ldAlive(i int, now int64) bool {
	s := c.ldSeen[i].Load()
	return s != 0 && now-s < c.dead
}

// ldDead reports whether p is an LD of Config.LDs taken for dead: it has sent nothing
// for LDDeadAfter (and LDDeadAfter is not negative). Whether another LD is alive is the
// caller's question.
func (c *core) ldDead(p peer) bool {
	if c.dead < 0 {
		return false
	}
	for i := range c.ldList {
		if c.ldList[i].sameLD(p) {
			return !c.ldAlive(i, c.now())
		}
	}
	return false
}

// liveLD returns the LD of Config.LDs other than p that has sent a packet within
// LDDeadAfter of now and that a hash of flow k picks among those (rendezvous hashing:
// a flow keeps its pick while that LD lives, whichever others die or return), with the
// encapsulation it used last; or false when there is none.
func (c *core) liveLD(p peer, k *flowKey, now int64) (peer, bool) {
	h := flowHash(k)
	best, found := -1, uint64(0)
	for i := range c.ldList {
		if c.ldList[i].sameLD(p) || !c.ldAlive(i, now) {
			continue
		}
		if w := (h ^ uint64(i+1)*0xbf58476d1ce4e5b9) * 0x94d049bb133111eb; best < 0 || w > found {
			best, found = i, w
		}
	}
	if best < 0 {
		return peer{}, false
	}
	q := c.ldList[best]
	if m, ok := c.recent.mode(q); ok {
		q.mode = m
	}
	return q, true
}

// outbound handles a packet the local stack wrote to the TUN device and returns the LD
// to send it to, or the result that drops it. fc is the calling goroutine's own cache.
func (c *core) outbound(pkt []byte, fc *fragCache) (peer, result) {
	p, _, r := c.route(pkt, fc)
	return p, r
}

// route is outbound with the LD a copy goes to when the first is dead (result
// outDeadLD).
func (c *core) route(pkt []byte, fc *fragCache) (p, alt peer, r result) {
	pi, err := parseFlow(pkt)
	if err != nil {
		return peer{}, peer{}, outMalformed
	}
	if !c.isVIP(&pi.key.src, pi.key.v6) {
		return peer{}, peer{}, outNotVIP
	}
	now := c.now()
	ok := false
	k := pi.key.reverse() // the flow's key, client to VIP
	if pi.frag && !pi.first {
		if p, alt, ok = fc.get(&pi, now); ok && alt != (peer{}) {
			return p, alt, outDeadLD
		}
	} else if q := icmpEmbedded(&pi); q != nil {
		// An ICMP error is not an answer (to junk, it is all there is): it finds the
		// flow it quotes, and confirms nothing.
		if p, ok = c.flows.reply(k, false); !ok {
			if qk, valid := parseQuoted(q, pi.key.v6); valid {
				k = qk
				p, ok = c.flows.reply(k, false)
			}
		}
	} else {
		// Neither is a TCP reset, what the stack answers a stray segment with.
		p, ok = c.flows.reply(k, pi.key.proto != protoTCP || pi.tcpFlags&tcpRST == 0)
	}
	r = outOK
	if !ok {
		r = outFallback
		if p, ok = c.recent.only(now, c.idle); !ok && (!pi.frag || pi.first) { // later fragments: no ports to hash
			r = outHashed
			p, ok = c.byHash(&k)
		}
		if !ok {
			return peer{}, peer{}, outNoFlow
		}
	}
	if (!pi.frag || pi.first) && c.ldDead(p) {
		if q, live := c.liveLD(p, &k, now); live {
			alt, r = q, outDeadLD
		}
	}
	if pi.frag && pi.first {
		fc.put(&pi, p, alt, now)
	}
	return p, alt, r
}

// byHash returns the LD of Config.LDs that a hash of flow k picks, with the
// encapsulation that LD used last (GRE if it has not been seen), or false when no LD
// address is configured (ranges only).
func (c *core) byHash(k *flowKey) (peer, bool) {
	if len(c.ldList) == 0 {
		return peer{}, false
	}
	p := c.ldList[(flowHash(k)>>32)%uint64(len(c.ldList))]
	if m, ok := c.recent.mode(p); ok {
		p.mode = m
	}
	return p, true
}

// stats returns the counters.
func (c *core) stats() Stats {
	s := Stats{
		In: map[string]uint64{}, Out: map[string]uint64{}, Flows: c.flows.len(),
		Evictions: c.evictions.Load(), Moves: c.moves.Load(), MovesRefused: c.movesRefused.Load(),
		LDAlive: map[netip.Addr]bool{},
	}
	for _, p := range c.ldList {
		s.LDAlive[p.Addr()] = !c.ldDead(p)
	}
	for r := range numResults {
		l := resultLabels[r]
		if l[0] == "in" {
			s.In[l[1]] = c.counts[r].Load()
		} else {
			s.Out[l[1]] = c.counts[r].Load()
		}
	}
	return s
}

// sweepInterval is how often expired flows are removed.
func (c *core) sweepInterval() time.Duration {
	return max(time.Duration(min(c.lim.halfOpen, c.lim.oneWay))/4, time.Millisecond)
}

func (c *core) sweep() int { return c.flows.sweep(c.now(), c.lim) }

// collector exports a core's counters.
type collector struct {
	c         *core
	packets   *prometheus.Desc
	flows     *prometheus.Desc
	evictions *prometheus.Desc
	moves     *prometheus.Desc
	ldAlive   *prometheus.Desc
}

func newCollector(c *core) *collector {
	return &collector{
		c: c,
		packets: prometheus.NewDesc("tiergate_l7_tunnel_packets_total",
			"Packets through the L7 tunnel endpoint, by direction (in: from LDs; out: replies to them) and result (ok; fallback: sent to the only recent LD for want of a flow; hashed: sent to an LD chosen by a hash of the flow for want of a flow and of a single recent LD; anything else: dropped for that reason, except in table_full, delivered untracked).",
			[]string{"dir", "result"}, nil),
		flows: prometheus.NewDesc("tiergate_l7_tunnel_flows",
			"Flows whose return path the L7 tunnel endpoint tracks.", nil, nil),
		evictions: prometheus.NewDesc("tiergate_l7_tunnel_flow_evictions_total",
			"Flows evicted from the L7 tunnel endpoint's full table (the oldest that had had no reply yet or had shown only TCP SYNs) to make room for a new flow.", nil, nil),
		moves: prometheus.NewDesc("tiergate_l7_tunnel_flow_moves_total",
			"Packets from another LD than the one their flow's replies go to, by result: moved (the flow had been quiet on its LD for move_idle; its replies now go to this LD) or refused (delivered, the replies stay).",
			[]string{"result"}, nil),
		ldAlive: prometheus.NewDesc("tiergate_l7_tunnel_ld_alive",
			"Whether an LD of the tunnel's lds has sent a packet within ld_dead_after (1), or is taken for dead (0): the replies of its flows are then copied to a live LD.",
			[]string{"ld"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.packets
	ch <- m.flows
	ch <- m.evictions
	ch <- m.moves
	ch <- m.ldAlive
}

// Collect implements prometheus.Collector.
func (m *collector) Collect(ch chan<- prometheus.Metric) {
	for r := range numResults {
		l := resultLabels[r]
		ch <- prometheus.MustNewConstMetric(m.packets, prometheus.CounterValue, float64(m.c.counts[r].Load()), l[0], l[1])
	}
	ch <- prometheus.MustNewConstMetric(m.flows, prometheus.GaugeValue, float64(m.c.flows.len()))
	ch <- prometheus.MustNewConstMetric(m.evictions, prometheus.CounterValue, float64(m.c.evictions.Load()))
	ch <- prometheus.MustNewConstMetric(m.moves, prometheus.CounterValue, float64(m.c.moves.Load()), "moved")
	ch <- prometheus.MustNewConstMetric(m.moves, prometheus.CounterValue, float64(m.c.movesRefused.Load()), "refused")
	for _, p := range m.c.ldList {
		v := 1.0
		if m.c.ldDead(p) {
			v = 0
		}
		ch <- prometheus.MustNewConstMetric(m.ldAlive, prometheus.GaugeValue, v, p.Addr().String())
	}
}

var _ prometheus.Collector = (*collector)(nil)
