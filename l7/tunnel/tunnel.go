// Package tunnel is l7d's end of the tunnel from the L4 distributors (LDs): it receives
// the clients' packets that LDs encapsulate in GRE or IPIP, hands them to the local
// stack through a TUN device so l7d's listeners on the VIPs accept them with the
// client's real address, and sends each reply back, encapsulated the same way, to the
// LD its flow came from.
//
// It needs no GRE or IPIP support in the kernel. Outer packets arrive on raw IP sockets
// (protocols 47, 4 and 41); the inner packet is checked (outer source among Config.LDs,
// inner destination a VIP) and written to the TUN device, which carries the VIPs as
// host addresses, so the kernel delivers it locally. The flow it belongs to (inner
// addresses, ports and protocol) is learned with the LD that sent it and the
// encapsulation used, as TGW's return-path learning does. A policy rule sends
// everything with a VIP as source into the TUN device; the endpoint reads these replies,
// finds the flow (ICMP errors by the packet they quote), and sends them to that LD on
// the raw socket, which builds the outer IP header. A reply that matches no flow goes to
// the LD if exactly one has been seen lately, and is dropped otherwise.
//
// The tunnel format and the rules a tunnel packet must pass (GRE flags and checksum,
// protocol types, inner version) are package wire's, which the LDs apply to the replies
// too: a packet one end of the tunnel accepts, the other accepts.
//
// Every packet is counted in tiergate_l7_tunnel_packets_total{dir,result}; the flows
// tracked are tiergate_l7_tunnel_flows.
package tunnel

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config.
const (
	DefaultDevice   = "tg0"
	DefaultFlowIdle = 10 * time.Minute
	DefaultMaxFlows = 1 << 20
	DefaultTable    = 4242
	// DefaultMTU is the TUN device's MTU when every LD is reached over IPv4: 1500
	// less the 20-byte outer IPv4 header and the 4-byte GRE header.
	DefaultMTU = 1500 - 20 - greHeaderLen
	// DefaultMTU6 is the default when some LD is reached over IPv6 (40-byte header).
	DefaultMTU6 = 1500 - 40 - greHeaderLen
)

// HalfOpenIdle is how long a flow that has shown only TCP SYNs is kept (when FlowIdle
// is not shorter): longer than Linux takes to give up retransmitting a SYN-ACK (63 s
// with the default five retries), short enough that a SYN flood through the LDs does
// not fill the table for FlowIdle.
const HalfOpenIdle = 75 * time.Second

// Config configures an Endpoint. The zero value of every optional field means its
// documented default.
type Config struct {
	// Device is the TUN device's name (at most 15 bytes). It is created by New and
	// removed by Close. Default "tg0".
	Device string

	// VIPs are the virtual addresses this node serves, IPv4 or IPv6. They are
	// assigned to the TUN device as host addresses (/32, /128), so the listeners can
	// bind to them, and every packet from an LD must be addressed to one of them.
	// Required.
	VIPs []netip.Addr

	// LDs are the addresses packets may come from: the L4 distributors' tunnel
	// addresses. Packets from other sources are dropped and counted (unknown_ld).
	// Their address families decide which raw sockets are opened. Required: the
	// endpoint is not an open relay.
	LDs []netip.Prefix

	// Local is this node's tunnel address: the raw socket of its family is bound to
	// it, so only packets addressed to it are received and replies leave from it.
	// Default: any local address receives, and the kernel picks the source of replies
	// by route.
	Local netip.Addr

	// FlowIdle is how long a learned return path is kept after a flow's last packet
	// from its LD. It should be longer than the LDs' own idle timeout for established
	// connections, so a connection quiet on both tiers still finds its way back.
	// Default 10m.
	FlowIdle time.Duration

	// MaxFlows bounds the flows tracked (about 100 bytes each). When the table is full
	// a new flow's packets are still delivered, but its replies fall back as for an
	// unknown flow. Default 1<<20.
	MaxFlows int

	// MTU is the TUN device's MTU, which the local stack uses for the replies it
	// sends (TCP's MSS follows from it), so it must leave room for the outer headers
	// on the path to the LDs: path MTU less 24 (IPv4 outer) or 44 (IPv6 outer).
	// Packets from LDs are delivered whatever their size; the LD clamps the client's
	// MSS so they fit. Default 1476 (DefaultMTU), or 1456 (DefaultMTU6) when an LD
	// prefix is IPv6.
	MTU int

	// Table is the policy routing table that routes replies into the TUN device: New
	// adds "default dev <Device>" to it and a rule "from <VIP> lookup <Table>" per
	// VIP, and Close removes the rules. It must not be used for anything else.
	// Default 4242.
	Table int

	// Registerer receives the endpoint's metrics; Close unregisters them. Default
	// none.
	Registerer prometheus.Registerer

	// Logger receives the endpoint's logs. Default slog.Default().
	Logger *slog.Logger
}

// Validate checks c as New does, without creating anything.
func (c Config) Validate() error {
	c.VIPs = slices.Clone(c.VIPs)
	c.LDs = slices.Clone(c.LDs)
	return c.validate()
}

// validate checks c and fills its defaults.
func (c *Config) validate() error {
	if c.Device == "" {
		c.Device = DefaultDevice
	}
	if len(c.Device) > 15 {
		return fmt.Errorf("tunnel: device name %q is longer than 15 bytes", c.Device)
	}
	if len(c.VIPs) == 0 {
		return errors.New("tunnel: no VIPs")
	}
	for i, v := range c.VIPs {
		if !v.IsValid() || v.IsUnspecified() || v.Zone() != "" {
			return fmt.Errorf("tunnel: VIP %q is not a usable address", v)
		}
		c.VIPs[i] = v.Unmap()
	}
	if len(c.LDs) == 0 {
		return errors.New("tunnel: no LDs: packets would be accepted from anywhere")
	}
	v6LD := false
	for i, p := range c.LDs {
		if !p.IsValid() {
			return fmt.Errorf("tunnel: LD prefix %q is not valid", p)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
		}
		c.LDs[i] = p.Masked()
		v6LD = v6LD || c.LDs[i].Addr().Is6()
	}
	if c.Local.IsValid() {
		c.Local = c.Local.Unmap()
		if c.Local.IsUnspecified() {
			c.Local = netip.Addr{}
		} else if !slices.ContainsFunc(c.LDs, func(p netip.Prefix) bool { return p.Addr().Is4() == c.Local.Is4() }) {
			return fmt.Errorf("tunnel: local address %s is of a family no LD uses", c.Local)
		}
	}
	if c.FlowIdle == 0 {
		c.FlowIdle = DefaultFlowIdle
	}
	if c.FlowIdle < 0 {
		return fmt.Errorf("tunnel: negative flow idle time %s", c.FlowIdle)
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = DefaultMaxFlows
	}
	if c.MaxFlows < 0 {
		return fmt.Errorf("tunnel: negative flow limit %d", c.MaxFlows)
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
		if v6LD {
			c.MTU = DefaultMTU6
		}
	}
	if c.MTU < 576 || c.MTU > 65535 || c.MTU < 1280 && slices.ContainsFunc(c.VIPs, netip.Addr.Is6) {
		return fmt.Errorf("tunnel: MTU %d out of range (576 to 65535, at least 1280 with IPv6 VIPs)", c.MTU)
	}
	if c.Table == 0 {
		c.Table = DefaultTable
	}
	if c.Table < 0 || c.Table >= 253 && c.Table <= 255 {
		return fmt.Errorf("tunnel: routing table %d is reserved or invalid", c.Table)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
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
	inUnknownLD                 // outer source not among Config.LDs
	inNotLocal                  // outer destination not Config.Local
	inNotVIP                    // inner destination not a VIP
	inError                     // writing to the TUN device failed
	outOK                       // sent to the LD of the reply's flow
	outFallback                 // no flow; sent to the only LD seen lately
	outNoFlow                   // no flow and no single recent LD: dropped
	outMalformed                // the local stack's packet did not parse
	outNotVIP                   // source is not a VIP (a route sent it here by mistake)
	outTooBig                   // larger than the path to the LD allows
	outError                    // sending failed otherwise
	numResults
)

var resultLabels = [numResults][2]string{
	inOK: {"in", "ok"}, inTableFull: {"in", "table_full"}, inMalformed: {"in", "malformed"},
	inTruncated: {"in", "truncated"}, inBadChecksum: {"in", "bad_checksum"},
	inUnsupported: {"in", "unsupported"}, inUnknownLD: {"in", "unknown_ld"},
	inNotLocal: {"in", "not_local"}, inNotVIP: {"in", "not_vip"}, inError: {"in", "error"},
	outOK: {"out", "ok"}, outFallback: {"out", "fallback"}, outNoFlow: {"out", "no_flow"},
	outMalformed: {"out", "malformed"}, outNotVIP: {"out", "not_vip"},
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
}

// core is the part of an Endpoint that decides what happens to packets, apart from the
// devices and sockets: pure, so tests drive it directly.
type core struct {
	cfg      Config
	vips     map[netip.Addr]struct{}
	flows    *flowTable
	recent   recentLDs
	start    time.Time
	idle     int64 // FlowIdle in ns
	halfIdle int64 // min(HalfOpenIdle, FlowIdle) in ns
	counts   [numResults]atomic.Uint64
}

func newCore(cfg Config) *core {
	c := &core{
		cfg:      cfg,
		vips:     make(map[netip.Addr]struct{}, len(cfg.VIPs)),
		flows:    newFlowTable(cfg.MaxFlows),
		start:    time.Now(),
		idle:     int64(cfg.FlowIdle),
		halfIdle: int64(min(HalfOpenIdle, cfg.FlowIdle)),
	}
	for _, v := range cfg.VIPs {
		c.vips[v] = struct{}{}
	}
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
	for _, p := range c.cfg.LDs {
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
	inner, m, err := decapsulate(proto, payload)
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
	now := c.now()
	p := peerFrom(src, m)
	r := inOK
	switch c.flows.learn(pi.key, p, pi.key.proto == protoTCP && pi.tcpFlags&(tcpSYN|tcpACK) == tcpSYN, now) {
	case learnKept:
		return inner, inOK
	case learnFull:
		r = inTableFull
	}
	if n.last != p || now-n.at >= refresh {
		c.recent.note(p, now)
		n.last, n.at = p, now
	}
	return inner, r
}

// outbound handles a packet the local stack wrote to the TUN device and returns the LD
// to send it to, or the result that drops it. fc is the calling goroutine's own cache.
func (c *core) outbound(pkt []byte, fc *fragCache) (peer, result) {
	pi, err := parseFlow(pkt)
	if err != nil {
		return peer{}, outMalformed
	}
	if !c.isVIP(&pi.key.src, pi.key.v6) {
		return peer{}, outNotVIP
	}
	now := c.now()
	var p peer
	ok := false
	if pi.frag && !pi.first {
		p, ok = fc.get(&pi, now)
	} else {
		p, ok = c.flows.lookup(pi.key.reverse())
		if !ok {
			if q := icmpEmbedded(&pi); q != nil {
				if k, valid := parseQuoted(q, pi.key.v6); valid {
					p, ok = c.flows.lookup(k)
				}
			}
		}
	}
	r := outOK
	if !ok {
		if p, ok = c.recent.only(now, c.idle); !ok {
			return peer{}, outNoFlow
		}
		r = outFallback
	}
	if pi.frag && pi.first {
		fc.put(&pi, p, now)
	}
	return p, r
}

// stats returns the counters.
func (c *core) stats() Stats {
	s := Stats{In: map[string]uint64{}, Out: map[string]uint64{}, Flows: c.flows.len()}
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
	return max(time.Duration(c.halfIdle)/4, time.Millisecond)
}

func (c *core) sweep() int { return c.flows.sweep(c.now(), c.idle, c.halfIdle) }

// collector exports a core's counters.
type collector struct {
	c       *core
	packets *prometheus.Desc
	flows   *prometheus.Desc
}

func newCollector(c *core) *collector {
	return &collector{
		c: c,
		packets: prometheus.NewDesc("tiergate_l7_tunnel_packets_total",
			"Packets through the L7 tunnel endpoint, by direction (in: from LDs; out: replies to them) and result (ok, fallback: sent to the only recent LD for want of a flow; anything else: dropped for that reason, except in table_full, delivered untracked).",
			[]string{"dir", "result"}, nil),
		flows: prometheus.NewDesc("tiergate_l7_tunnel_flows",
			"Flows whose return path the L7 tunnel endpoint tracks.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.packets
	ch <- m.flows
}

// Collect implements prometheus.Collector.
func (m *collector) Collect(ch chan<- prometheus.Metric) {
	for r := range numResults {
		l := resultLabels[r]
		ch <- prometheus.MustNewConstMetric(m.packets, prometheus.CounterValue, float64(m.c.counts[r].Load()), l[0], l[1])
	}
	ch <- prometheus.MustNewConstMetric(m.flows, prometheus.GaugeValue, float64(m.c.flows.len()))
}

var _ prometheus.Collector = (*collector)(nil)
