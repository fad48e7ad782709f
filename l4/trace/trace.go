// Package trace is the L4 distributor's drop-point and trace-point telemetry, as TGW
// describes it: a probe packet the operator marks (a DSCP value, a probe server's
// source address, a TCP option) is recorded by every LD it passes, with the LD's ID,
// the worker, the time and what became of it (tunnelled to a member, replied to the
// client, answered locally), and when it is dropped, with the reason and a sample of
// its bytes.
//
// The package holds the marker (Config, Marker), the bounded per-worker record ring
// that a worker writes without a lock and readers copy under a per-record sequence
// lock (Ring), and the records as the admin API shows them (Point, Filter). The
// datapath decides what is recorded (l4/datapath/trace.go).
package trace

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/tiergate/tiergate/internal/config"
)

// Limits and defaults of Config.
const (
	DefaultRecords     = 1024
	MinRecords         = 16
	MaxRecords         = 65536
	DefaultSampleBytes = 128
	MaxSampleBytes     = 256
	MaxSources         = 64
	DefaultRate        = 1000
)

// Config turns tracing on and says which packets are marked. Its zero value traces
// nothing: no criterion, no records, and the datapath then tests one pointer per
// packet and nothing else.
//
// A packet is marked when it meets every criterion that is set (DSCP, Sources,
// TCPOption): a probe is typically sent from the probe servers' addresses with a
// DSCP value no production traffic uses. At least one criterion turns tracing on.
type Config struct {
	// LD is this LD's ID in the records (TGW's unique LD ID), e.g. "ld-sh-03".
	// Default: the host name, or the external address when the host has no name.
	LD string `yaml:"ld" json:"ld,omitempty"`

	// DSCP, 1..63, marks packets whose IPv4 DSCP (the TOS byte's upper six bits) or
	// IPv6 traffic class's upper six bits equal it; the ECN bits are ignored. A
	// Linux prober sets it with setsockopt IP_TOS (or IPV6_TCLASS) = DSCP << 2, or
	// ping -Q. Default 0: the DSCP is not a criterion (0 is every ordinary packet's).
	DSCP uint8 `yaml:"dscp" json:"dscp,omitempty"`

	// Sources are the probe servers' addresses or prefixes: a packet to a VIP from
	// one of them, or a member's reply to one, is marked. At most 64. Default none:
	// the address is not a criterion.
	Sources []netip.Prefix `yaml:"sources" json:"sources,omitempty"`

	// TCPOption, 2..255, marks TCP segments that carry an option of this kind (e.g.
	// 253 or 254, RFC 4727's experimental kinds, which hosts ignore). Only TCP is
	// then marked, and only when the option is in the header's option space; the
	// options of every TCP segment are walked, so it costs more than DSCP. Default 0:
	// not a criterion.
	TCPOption uint8 `yaml:"tcp_option" json:"tcp_option,omitempty"`

	// Records is how many records each worker keeps (a ring: the oldest is
	// overwritten), 16..65536. Memory is workers × records × (80 + sample_bytes
	// rounded up to 8) bytes: 208 KiB per worker by default. A change of records or
	// sample_bytes starts new rings, without the records so far. Default 1024.
	Records int `yaml:"records" json:"records,omitempty"`

	// SampleBytes is how much of a marked packet a record keeps, from its IP header
	// (from its Ethernet header when it could not be parsed, or when it was dropped
	// as tx_full after it was rewritten), 1..256. Default 128.
	SampleBytes int `yaml:"sample_bytes" json:"sample_bytes,omitempty"`

	// Rate is the most records each worker writes per second (in bursts of a tenth
	// of it, at least 32). A marker such as a DSCP value can be set by anyone, and a
	// record costs far more than forwarding: past the rate, marked packets are only
	// counted (tiergate_l4_trace_suppressed_total), so a flood of marked packets
	// costs the LD little more than an unmarked one. Default 1000.
	Rate int `yaml:"rate" json:"rate,omitempty"`
}

// Enabled reports whether c sets a criterion, which turns tracing on.
func (c *Config) Enabled() bool {
	return c.DSCP != 0 || len(c.Sources) > 0 || c.TCPOption != 0
}

// WithDefaults returns c with its defaults filled in; ext is the LD's external
// address, the LD ID when the host has no name. A config that traces nothing is
// returned as it is, so that it reads back as it was written.
func (c Config) WithDefaults(ext netip.Addr) Config {
	if !c.Enabled() {
		return c
	}
	if c.LD == "" {
		if h, err := os.Hostname(); err == nil && h != "" {
			c.LD = h
		} else if ext.IsValid() {
			c.LD = ext.String()
		}
	}
	if c.Records == 0 {
		c.Records = DefaultRecords
	}
	if c.SampleBytes == 0 {
		c.SampleBytes = DefaultSampleBytes
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	return c
}

// Validate reports every problem of c, each a config.FieldError naming its field
// ("dscp", "sources[1]").
func (c *Config) Validate() error {
	var ck config.Checker
	if c.DSCP > 63 {
		ck.Addf("dscp", "%d is outside 1..63", c.DSCP)
	}
	if c.TCPOption == 1 {
		ck.Addf("tcp_option", "1 is NOP, in every segment: want 2..255")
	}
	if len(c.Sources) > MaxSources {
		ck.Addf("sources", "%d prefixes: at most %d", len(c.Sources), MaxSources)
	}
	for i, p := range c.Sources {
		if !p.IsValid() {
			ck.Addf(config.Index("sources", i), "not a prefix")
		} else if p.Addr().Zone() != "" {
			ck.Addf(config.Index("sources", i), "%v has a zone", p)
		}
	}
	if c.Records != 0 && (c.Records < MinRecords || c.Records > MaxRecords) {
		ck.Addf("records", "%d is outside %d..%d", c.Records, MinRecords, MaxRecords)
	}
	if c.SampleBytes < 0 || c.SampleBytes > MaxSampleBytes {
		ck.Addf("sample_bytes", "%d is outside 1..%d", c.SampleBytes, MaxSampleBytes)
	}
	if c.Rate < 0 || c.Rate > 10_000_000 {
		ck.Addf("rate", "%d is outside 1..10000000", c.Rate)
	}
	if len(c.LD) > 64 {
		ck.Addf("ld", "%d bytes: at most 64", len(c.LD))
	}
	if !c.Enabled() && (c.Records != 0 || c.SampleBytes != 0 || c.Rate != 0 || c.LD != "") {
		ck.Addf("", "no criterion (dscp, sources or tcp_option) is set, so nothing would be traced")
	}
	return ck.Err()
}

// Marker decides whether a packet is marked. It is built from a valid Config and
// read-only afterwards, so workers share it.
type Marker struct {
	dscp   uint8 // 0: not a criterion
	tcpOpt uint8 // 0: not a criterion
	src    []netip.Prefix
}

// NewMarker compiles c's criteria, or returns nil when c traces nothing.
func NewMarker(c *Config) *Marker {
	if !c.Enabled() {
		return nil
	}
	m := &Marker{dscp: c.DSCP, tcpOpt: c.TCPOption}
	for _, p := range c.Sources {
		m.src = append(m.src, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p.Addr())).Masked())
	}
	return m
}

func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}

// Match reports whether the IP packet at frame[l3:] is marked. l4 is the offset of
// its transport header (-1: none), proto its transport protocol, and peer the probe's
// side of it: the source of a packet to a VIP, the destination of a reply.
func (m *Marker) Match(frame []byte, l3, l4 int, proto uint8, peer netip.Addr) bool {
	if m.dscp != 0 {
		if l3 < 0 || l3+2 > len(frame) {
			return false
		}
		var tc byte
		switch frame[l3] >> 4 {
		case 4:
			tc = frame[l3+1]
		case 6:
			tc = frame[l3]<<4 | frame[l3+1]>>4
		default:
			return false
		}
		if tc>>2 != m.dscp {
			return false
		}
	}
	if m.src != nil && !m.fromSource(peer) {
		return false
	}
	if m.tcpOpt != 0 && (proto != 6 || !hasTCPOption(frame, l4, m.tcpOpt)) {
		return false
	}
	return true
}

func (m *Marker) fromSource(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range m.src {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// MatchFrame is Match for an Ethernet frame that did not parse: it finds the IP
// header (after one optional 802.1Q tag) and the TCP header of an IPv4 packet or of
// an IPv6 one without extension headers itself, checking every bound. The peer is
// the packet's source.
func (m *Marker) MatchFrame(frame []byte) bool {
	if len(frame) < 14 {
		return false
	}
	l3 := 14
	et := uint16(frame[12])<<8 | uint16(frame[13])
	if et == 0x8100 {
		if len(frame) < 18 {
			return false
		}
		et, l3 = uint16(frame[16])<<8|uint16(frame[17]), 18
	}
	var src netip.Addr
	l4, proto := -1, uint8(0)
	switch et {
	case 0x0800:
		if len(frame) < l3+20 || frame[l3]>>4 != 4 {
			return false
		}
		src = netip.AddrFrom4([4]byte(frame[l3+12 : l3+16]))
		proto = frame[l3+9]
		if ihl := int(frame[l3]&0x0f) * 4; ihl >= 20 {
			l4 = l3 + ihl
		}
	case 0x86dd:
		if len(frame) < l3+40 || frame[l3]>>4 != 6 {
			return false
		}
		src = netip.AddrFrom16([16]byte(frame[l3+8 : l3+24]))
		proto, l4 = frame[l3+6], l3+40
	default:
		return false
	}
	return m.Match(frame, l3, l4, proto, src)
}

// hasTCPOption reports whether the TCP header at frame[l4:] carries an option of
// kind, walking the option space its data offset gives (within frame).
func hasTCPOption(frame []byte, l4 int, kind uint8) bool {
	if l4 < 0 || l4+20 > len(frame) {
		return false
	}
	end := min(l4+int(frame[l4+12]>>4)*4, len(frame))
	for i := l4 + 20; i < end; {
		k := frame[i]
		switch k {
		case 0:
			return false
		case 1:
			i++
			continue
		}
		if k == kind {
			return true
		}
		if i+1 >= end || frame[i+1] < 2 {
			return false
		}
		i += int(frame[i+1])
	}
	return false
}

// String describes the criteria, for logs.
func (m *Marker) String() string {
	if m == nil {
		return "off"
	}
	return fmt.Sprintf("dscp=%d sources=%v tcp_option=%d", m.dscp, m.src, m.tcpOpt)
}
