// Package conntrack is the load distributor's per-core connection table: it maps a
// client's (address, port, rule) to the L7 member its flow was scheduled to, so every
// packet of a connection reaches the same member even while the pool changes. Memory is
// fixed when the table is made (44–48 bytes per connection all-in for a million or more
// entries: a 40-byte entry plus 4 to 8 bytes of bucket array), every operation is
// O(1) and allocation-free, and when the table is full the oldest unconfirmed entry (a
// flow picked up mid-way that its member has not answered yet), else the oldest
// half-open connection, is evicted, so neither a SYN flood nor a flood of spoofed
// mid-flow packets can lock out new clients.
//
// # Layout
//
// Entries are 40-byte records in one array, found through a power-of-two array of uint32
// bucket heads (chained hashing with uint32 indices). The last entry of each chain holds
// its bucket's number with the top bit set instead of a next index (Linux's hlist_nulls
// marker), so an entry reclaimed by the reaper is unlinked without its hash. Each link
// also carries 3 bits of the linked entry's hash and whether it ends the chain, so a
// lookup that misses usually reads the bucket head and no entry. The caller
// passes the hash of the key to every call; any well-mixed, seeded function of the key
// works (the datapath uses its flow hash), as long as it is the same for a key every
// time. The low bits select the bucket and the top 3 bits are the tag.
//
// # Timeouts
//
// Time is a uint32 count of seconds chosen by the caller (Clock gives a monotonic one),
// read once per burst and passed in as now; comparisons are modulo 2^32, so it may wrap.
// An entry refreshed at now expires at now+timeout of its state: it is alive while
// now ≤ expiry, so it lives at least its timeout and less than a second more.
//
// Half-open entries (StateSynRecv) sit in one FIFO in order of their last packet, so the
// FIFO is sorted by expiry: the reaper pops expired heads and eviction takes the head, the
// least recently seen half-open connection, in O(1). Unconfirmed entries (StateUnconfirmed)
// sit in a second FIFO of the same kind, which eviction empties first; a reply from the
// member (LookupReply) confirms an entry and moves it to the wheel. All other entries sit in a timing
// wheel of one-second slots, placed by expiry. A packet only rewrites its entry's expiry
// and never moves it, so an established flow's packet writes nothing but its own entry;
// when the reaper reaches a slot it frees the entries that have expired and moves the
// rest to the slot of their current expiry, so an active connection is moved about once
// per timeout. A state change (FIN, RST, SYN reuse) re-files the entry at once, so short
// timeouts free memory on time.
//
// # Concurrency
//
// A Table belongs to one goroutine (one lcore); it has no locks. Counters and views it
// returns are for that goroutine, which publishes them.
package conntrack

import (
	"errors"
	"fmt"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// Key identifies a connection on one load distributor: the client's address and port and
// the rule (VIP, protocol, port) the client reached.
type Key struct {
	// Client is the client's address as 16 bytes: netip.Addr.As16, which gives an IPv4
	// address in its IPv4-mapped form ::ffff:a.b.c.d.
	Client [16]byte
	// ClientPort is the client's TCP or UDP port.
	ClientPort uint16
	// Rule is the ID of the rule the packet matched.
	Rule uint16
}

// State is a connection's state, which chooses its timeout.
type State uint8

// Connection states. The zero State is not a valid state.
const (
	// StateSynRecv is a half-open TCP connection: a SYN was seen, no ACK yet.
	StateSynRecv State = iota + 1
	// StateEstablished is a TCP connection that has seen an ACK.
	StateEstablished
	// StateFin is a TCP connection whose client sent a FIN.
	StateFin
	// StateClose is a TCP connection whose client sent a RST.
	StateClose
	// StateUDP is a UDP flow that its member has answered.
	StateUDP
	// StateUnconfirmed is a flow picked up mid-way: a TCP packet without SYN, or a UDP
	// datagram, of a flow the table did not hold. It keeps a short timeout and is the
	// first to be evicted until a reply from its member confirms it (LookupReply), so
	// one-way traffic from spoofed sources cannot fill the table with long-lived
	// entries.
	StateUnconfirmed

	numStates = int(StateUnconfirmed) + 1
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case StateSynRecv:
		return "syn_recv"
	case StateEstablished:
		return "established"
	case StateFin:
		return "fin"
	case StateClose:
		return "close"
	case StateUDP:
		return "udp"
	case StateUnconfirmed:
		return "unconfirmed"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Default timeouts, as LVS and TGW use them.
const (
	DefaultSynRecvTimeout     = config.Duration(30 * time.Second)
	DefaultEstablishedTimeout = config.Duration(900 * time.Second)
	DefaultFinTimeout         = config.Duration(60 * time.Second)
	DefaultCloseTimeout       = config.Duration(10 * time.Second)
	DefaultUDPTimeout         = config.Duration(300 * time.Second)
	DefaultUnconfirmedTimeout = config.Duration(10 * time.Second)
)

// DefaultCapacity is Config.Capacity's default: the entries of a whole load
// distributor, about 45 MB.
const DefaultCapacity = 1_000_000

// MaxTimeout bounds every timeout, keeping expiry times well inside the wrap-safe half
// of the uint32 clock.
const MaxTimeout = 365 * 24 * time.Hour

// MaxCapacity bounds Config.Capacity (2^26 entries, 2.5 GiB of entries per table).
const MaxCapacity = 1 << 26

// Timeouts are the idle timeouts by state, with the same names in YAML and JSON
// (l4d's conntrack.timeouts), written as text ("30s", "15m"). Each is rounded up to
// whole seconds, and is at most MaxTimeout (a year); zero means the default.
type Timeouts struct {
	// SynRecv is for half-open TCP connections (a SYN seen). Default 30s.
	SynRecv config.Duration `yaml:"syn_recv" json:"syn_recv,omitempty"`
	// Established is for established TCP connections. Default 15m.
	Established config.Duration `yaml:"established" json:"established,omitempty"`
	// Fin is for TCP connections after the client's FIN. Default 1m.
	Fin config.Duration `yaml:"fin" json:"fin,omitempty"`
	// Close is for TCP connections after the client's RST. Default 10s.
	Close config.Duration `yaml:"close" json:"close,omitempty"`
	// UDP is for UDP flows. Default 5m.
	UDP config.Duration `yaml:"udp" json:"udp,omitempty"`
	// Unconfirmed is for flows picked up mid-way (a TCP packet without SYN or a UDP
	// datagram of an unknown flow) until a reply from the member confirms them.
	// Default 10s.
	Unconfirmed config.Duration `yaml:"unconfirmed" json:"unconfirmed,omitempty"`
}

// Config is a connection table: the model of l4d's conntrack section (the datapath's
// Config.Conntrack), with the same names in YAML and JSON. The zero value of every
// field means the default its comment gives; Defaults fills them in and Validate
// checks them, naming fields by path ("timeouts.udp").
type Config struct {
	// Capacity is the number of entries, all allocated when the table is made: of one
	// Table for New, which requires it (1 to MaxCapacity); of the whole load
	// distributor in the datapath's configuration, shared equally by its workers.
	// Default 1,000,000 (DefaultCapacity), which Defaults fills in.
	Capacity int `yaml:"capacity" json:"capacity,omitempty"`
	// Timeouts are the idle timeouts by state; zero fields mean the defaults.
	Timeouts Timeouts `yaml:"timeouts" json:"timeouts"`
}

// Validate checks c and returns every problem, each a *config.FieldError named by its
// path within c ("capacity", "timeouts.udp"). Zero values, the defaults, are valid.
func (c *Config) Validate() error {
	var ck config.Checker
	if c.Capacity < 0 {
		ck.Addf("capacity", "%d is negative", c.Capacity)
	} else if c.Capacity > MaxCapacity {
		ck.Addf("capacity", "%d is above %d", c.Capacity, MaxCapacity)
	}
	ck.Nest("timeouts", c.Timeouts.Validate())
	return ck.Err()
}

// Defaults fills in the default of every field left zero, the timeouts' included.
func (c *Config) Defaults() {
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	c.Timeouts.Defaults()
}

// Validate checks the timeouts and returns every problem, each a *config.FieldError
// named by the timeout's name ("udp").
func (to *Timeouts) Validate() error {
	var ck config.Checker
	for _, f := range to.fields() {
		if *f.d < 0 || f.d.D() > MaxTimeout {
			ck.Addf(f.name, "%v is outside 0..%v", *f.d, MaxTimeout)
		}
	}
	return ck.Err()
}

// Defaults fills in the default of every timeout left zero.
func (to *Timeouts) Defaults() {
	for _, f := range to.fields() {
		if *f.d == 0 {
			*f.d = f.def
		}
	}
}

// timeoutField is one of Timeouts, with its state, name and default.
type timeoutField struct {
	state State
	name  string
	d     *config.Duration
	def   config.Duration
}

func (to *Timeouts) fields() []timeoutField {
	return []timeoutField{
		{StateSynRecv, "syn_recv", &to.SynRecv, DefaultSynRecvTimeout},
		{StateEstablished, "established", &to.Established, DefaultEstablishedTimeout},
		{StateFin, "fin", &to.Fin, DefaultFinTimeout},
		{StateClose, "close", &to.Close, DefaultCloseTimeout},
		{StateUDP, "udp", &to.UDP, DefaultUDPTimeout},
		{StateUnconfirmed, "unconfirmed", &to.Unconfirmed, DefaultUnconfirmedTimeout},
	}
}

// Errors returned (wrapped) by New.
var (
	ErrCapacity = errors.New("capacity out of range")
	ErrTimeout  = errors.New("timeout out of range")
)

// Stats are a table's event counters since New.
type Stats struct {
	// Inserts counts entries added.
	Inserts uint64
	// Expired counts entries reclaimed after their timeout: by Expire, by Insert on a
	// full table, or found expired by a lookup.
	Expired uint64
	// Evictions counts live unconfirmed and half-open entries evicted to make room for
	// a new one.
	Evictions uint64
	// EvictedUnconfirmed counts the unconfirmed entries among Evictions.
	EvictedUnconfirmed uint64
	// Confirmed counts unconfirmed entries that a reply from their member confirmed.
	Confirmed uint64
	// InsertFailures counts Insert calls refused because the table was full and held no
	// unconfirmed or half-open entry to evict (or the state was invalid).
	InsertFailures uint64
}

// clockBase is the origin of Clock.
var clockBase = time.Now()

// Clock converts t into the table's time: whole seconds since this package was loaded,
// from t's monotonic clock reading when it has one (time.Now does). A packet loop calls it
// once per burst and passes the result as now.
func Clock(t time.Time) uint32 {
	return uint32(t.Sub(clockBase) / time.Second)
}

// seconds converts a timeout to whole seconds, rounding up; zero gives def.
func seconds(name string, timeout, def config.Duration) (uint32, error) {
	d := timeout.D()
	if d == 0 {
		d = def.D()
	}
	if d < 0 || d > MaxTimeout {
		return 0, fmt.Errorf("making connection table: %s timeout %v: %w (want 0..%v)",
			name, d, ErrTimeout, MaxTimeout)
	}
	return uint32((d + time.Second - 1) / time.Second), nil
}
