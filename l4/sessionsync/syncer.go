package sessionsync

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
)

// Datapath is what the syncer needs of the load distributor (*datapath.Distributor
// is one): the entries its workers queue, a way to hand them received ones, and
// full syncs.
type Datapath interface {
	// SyncDrain appends up to max queued entries to dst: incremental ones, or when
	// full those of the full sync under way.
	SyncDrain(dst []Entry, full bool, max int) []Entry
	// SyncInstall queues received entries for the workers that own their flows.
	SyncInstall(es []Entry) int
	// SyncInstalled returns a function that reports whether the workers have
	// applied every entry SyncInstall queued before the call.
	SyncInstalled() func() bool
	// SyncFullStart starts a full sync and returns its generation.
	SyncFullStart() uint64
	// SyncFullDone reports whether full sync gen has been queued and drained.
	SyncFullDone(gen uint64) bool
}

// Defaults.
const (
	DefaultPort          = 9187
	DefaultSyncAfter     = 3 * time.Second
	DefaultFlushInterval = 100 * time.Millisecond
	DefaultFullSyncEvery = 4 * time.Minute
	DefaultWarmupTimeout = 30 * time.Second
	DefaultMTU           = 1500
	DefaultFullSyncRate  = 250_000
)

// Config is the session sync of one LD: l4d's `sync:` section, with the same names
// in YAML and JSON. Zero values mean the defaults given; Defaults fills them in and
// Validate checks them, naming fields.
type Config struct {
	// ClusterID identifies the cluster: datagrams of another cluster are dropped
	// (reason foreign). Required, not 0.
	ClusterID uint32 `yaml:"cluster_id" json:"cluster_id"`
	// KeyFile holds the cluster's shared HMAC-SHA256 key: the file's content, less
	// surrounding white space, at least 32 bytes. Required (unless Key is given).
	KeyFile string `yaml:"key_file" json:"key_file,omitempty"`
	// Key is the key itself, for tests and programs; KeyFile fills it in.
	Key []byte `yaml:"-" json:"-"`
	// Listen is the UDP address sync datagrams are received on and sent from, on
	// the internal network. Default ":9187".
	Listen string `yaml:"listen" json:"listen,omitempty"`
	// Peers are the other LDs' listen addresses ("198.18.1.3:9187"; without a port,
	// 9187), which their datagrams come from: datagrams from any other address and
	// port are dropped (unknown_peer). Default
	// none: nothing is sent and the warm-up is over at once.
	Peers []string `yaml:"peers" json:"peers,omitempty"`
	// SyncAfter is how long a connection lives before it is sent: short ones are
	// not worth it (TGW: 3 s). Default 3s.
	SyncAfter config.Duration `yaml:"sync_after" json:"sync_after,omitempty"`
	// FlushInterval is the longest an entry waits for its datagram to fill up
	// (datagrams are sent when they reach the MTU, or at this interval). Default 100ms.
	FlushInterval config.Duration `yaml:"flush_interval" json:"flush_interval,omitempty"`
	// FullSyncEvery is the period of the full sync that re-sends every live long
	// connection. Default 4m; "off" is not offered: a lost datagram is repaired by it.
	FullSyncEvery config.Duration `yaml:"full_sync_every" json:"full_sync_every,omitempty"`
	// FullSyncRate paces a full sync, in entries per second, so that it never
	// competes with forwarding. Default 250000 (a million connections in 4 s).
	FullSyncRate int `yaml:"full_sync_rate" json:"full_sync_rate,omitempty"`
	// WarmupTimeout is how long a starting LD waits for its peers' full syncs
	// before it lets its VIPs be announced anyway. Default 30s.
	WarmupTimeout config.Duration `yaml:"warmup_timeout" json:"warmup_timeout,omitempty"`
	// MTU is the path MTU towards the peers; a datagram is the MTU less the IP and
	// UDP headers. Default 1500.
	MTU int `yaml:"mtu" json:"mtu,omitempty"`
}

// Defaults fills in the defaults of the fields left zero.
func (c *Config) Defaults() {
	if c.Listen == "" {
		c.Listen = fmt.Sprintf(":%d", DefaultPort)
	}
	if c.SyncAfter == 0 {
		c.SyncAfter = config.Duration(DefaultSyncAfter)
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = config.Duration(DefaultFlushInterval)
	}
	if c.FullSyncEvery == 0 {
		c.FullSyncEvery = config.Duration(DefaultFullSyncEvery)
	}
	if c.FullSyncRate == 0 {
		c.FullSyncRate = DefaultFullSyncRate
	}
	if c.WarmupTimeout == 0 {
		c.WarmupTimeout = config.Duration(DefaultWarmupTimeout)
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
}

// Validate checks c (defaults filled in or not) and returns every problem, each a
// *config.FieldError named by the field.
func (c *Config) Validate() error {
	var ck config.Checker
	if c.ClusterID == 0 {
		ck.Addf("cluster_id", "is required (not 0)")
	}
	if c.KeyFile == "" && len(c.Key) == 0 {
		ck.Addf("key_file", "is required")
	}
	if c.Listen != "" {
		if _, err := netip.ParseAddrPort(listenAddr(c.Listen)); err != nil {
			ck.Addf("listen", "%q: %v", c.Listen, err)
		}
	}
	for i, p := range c.Peers {
		if _, err := peerAddr(p); err != nil {
			ck.Addf(fmt.Sprintf("peers[%d]", i), "%q: %v", p, err)
		}
	}
	for _, d := range []struct {
		name string
		v    config.Duration
	}{{"sync_after", c.SyncAfter}, {"flush_interval", c.FlushInterval}, {"full_sync_every", c.FullSyncEvery},
		{"warmup_timeout", c.WarmupTimeout}} {
		if d.v < 0 || d.v.D() > 24*time.Hour {
			ck.Addf(d.name, "%v is outside 0..24h", d.v)
		}
	}
	if c.FullSyncRate < 0 {
		ck.Addf("full_sync_rate", "%d is negative", c.FullSyncRate)
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		ck.Addf("mtu", "%d is outside 576..65535", c.MTU)
	}
	return ck.Err()
}

// listenAddr gives ":9187" an unspecified address for parsing.
func listenAddr(s string) string {
	if strings.HasPrefix(s, ":") {
		return "0.0.0.0" + s
	}
	return s
}

// peerAddr parses a peer, adding the default port.
func peerAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("neither an address nor address:port")
	}
	return netip.AddrPortFrom(a, DefaultPort), nil
}

// LoadKey reads a key file: its content less surrounding white space, at least 32
// bytes.
func LoadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading sync key: %w", err)
	}
	k := []byte(strings.TrimSpace(string(b)))
	if len(k) < 32 {
		return nil, fmt.Errorf("sync key %s: %d bytes, want at least 32", path, len(k))
	}
	return k, nil
}

// Options are how a Syncer runs.
type Options struct {
	// Registerer receives the tiergate_l4_sync_* metrics. Default none.
	Registerer prometheus.Registerer
	// Logger receives the logs. Default slog.Default().
	Logger *slog.Logger
	// Stats, when set, gives the datapath's sync counters for the metrics
	// (datapath.Distributor.SyncStats, converted).
	Stats func() DatapathStats
}

// DatapathStats are the datapath's side of the counters.
type DatapathStats struct {
	Emitted, QueueDropped, Installed uint64
	// Refused by reason (no_rule, no_member, kept, table_full).
	Refused map[string]uint64
	// EncapMismatch counts entries installed whose encapsulation was not this LD's.
	EncapMismatch uint64
}

// Drop reasons of received datagrams.
const (
	DropMalformed   = "malformed"
	DropForeign     = "foreign"
	DropForged      = "forged"
	DropReplayed    = "replayed"
	DropUnknownPeer = "unknown_peer"
)

var dropReasons = []string{DropMalformed, DropForeign, DropForged, DropReplayed, DropUnknownPeer}

// Stats are the syncer's counters.
type Stats struct {
	TxDatagrams, TxEntries, TxBytes uint64
	RxDatagrams, RxEntries, RxBytes uint64
	// Dropped counts received datagrams dropped, by reason.
	Dropped map[string]uint64
	// FullSyncs counts full syncs completed, and FullSyncLast is the last one's
	// duration.
	FullSyncs    uint64
	FullSyncLast time.Duration
	// SendErrors counts datagrams the socket refused.
	SendErrors uint64
}

// peer is one peer: where to send, and its replay window.
type peer struct {
	addr   netip.AddrPort
	window Window
	// installed, once its full sync for our warm-up has arrived, reports whether
	// the workers have applied it; nil before.
	installed atomic.Pointer[func() bool]
	wantAns   atomic.Bool // it asked us for a full sync
}

// arrived reports whether its full sync for our warm-up has arrived.
func (p *peer) arrived() bool { return p.installed.Load() != nil }

// whyInstalling is Ready's reason while the peers' full syncs are being installed.
var whyInstalling = "installing the peers' full sync"

// Syncer sends this LD's long connections to its peers and installs theirs.
type Syncer struct {
	cfg    Config
	dp     Datapath
	opts   Options
	log    *slog.Logger
	peers  []*peer
	byAddr map[netip.AddrPort]*peer
	runs   atomic.Bool

	conn *net.UDPConn

	seq       atomic.Uint64
	started   time.Time
	warm      atomic.Bool
	warmWhy   atomic.Pointer[string]
	fullNow   chan struct{}
	mu        sync.Mutex // Stats
	st        Stats
	closeOnce sync.Once
}

// New validates cfg (defaults filled in), reads the key file and binds the socket.
func New(cfg Config, dp Datapath, opts Options) (*Syncer, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("session sync: invalid config: %w", err)
	}
	if len(cfg.Key) == 0 {
		k, err := LoadKey(cfg.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.Key = k
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Syncer{cfg: cfg, dp: dp, opts: opts, log: opts.Logger,
		fullNow: make(chan struct{}, 1), st: Stats{Dropped: map[string]uint64{}}}
	s.setPeers(cfg.Peers)
	la, err := net.ResolveUDPAddr("udp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("session sync: listen %q: %w", cfg.Listen, err)
	}
	s.conn, err = net.ListenUDP("udp", la)
	if err != nil {
		return nil, fmt.Errorf("session sync: listening on %s: %w", cfg.Listen, err)
	}
	setBuffers(s.conn, socketBuffer)
	s.seq.Store(uint64(time.Now().UnixNano()))
	why := "waiting for the peers' full sync"
	s.warmWhy.Store(&why)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(&collector{s: s}); err != nil {
			s.conn.Close()
			return nil, fmt.Errorf("session sync: registering metrics: %w", err)
		}
	}
	return s, nil
}

// setPeers replaces the peers (parsed by Validate).
func (s *Syncer) setPeers(peers []string) {
	s.peers, s.byAddr = nil, map[netip.AddrPort]*peer{}
	for _, p := range peers {
		ap, _ := peerAddr(p)
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		pe := &peer{addr: ap}
		s.peers = append(s.peers, pe)
		s.byAddr[ap] = pe
	}
	s.warm.Store(len(s.peers) == 0)
}

// SetPeers replaces the peers before Run (a peer's address may only be known once
// its socket is bound, as in tests with port 0).
func (s *Syncer) SetPeers(peers []string) error {
	if s.runs.Load() {
		return errors.New("session sync: SetPeers while running")
	}
	for i, p := range peers {
		if _, err := peerAddr(p); err != nil {
			return fmt.Errorf("session sync: peers[%d] %q: %w", i, p, err)
		}
	}
	s.setPeers(peers)
	return nil
}

// Addr returns the bound UDP address.
func (s *Syncer) Addr() netip.AddrPort {
	return s.conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// WarmedUp reports whether the warm-up is over: every peer's full sync arrived and
// the workers installed it, or the warm-up timeout passed, or there are no peers.
func (s *Syncer) WarmedUp() bool { return s.warm.Load() }

// Ready is the announce gate (BGP): ok once warmed up; why says what it waits for.
func (s *Syncer) Ready() (ok bool, why string) {
	if s.warm.Load() {
		return true, ""
	}
	return false, "session sync: " + *s.warmWhy.Load()
}

// FullSync starts a full sync now (as the period does).
func (s *Syncer) FullSync() {
	select {
	case s.fullNow <- struct{}{}:
	default:
	}
}

// Stats returns a copy of the counters.
func (s *Syncer) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Dropped = make(map[string]uint64, len(s.st.Dropped))
	for k, v := range s.st.Dropped {
		st.Dropped[k] = v
	}
	return st
}

// Run receives and sends until ctx is done, then closes the socket.
func (s *Syncer) Run(ctx context.Context) error {
	if !s.runs.CompareAndSwap(false, true) {
		return errors.New("session sync: Run called twice")
	}
	s.started = time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.receive()
	}()
	err := s.send(ctx)
	s.Close()
	wg.Wait()
	return err
}

// Close closes the socket (Run returns).
func (s *Syncer) Close() { s.closeOnce.Do(func() { s.conn.Close() }) }

func (s *Syncer) drop(reason string) {
	s.mu.Lock()
	s.st.Dropped[reason]++
	s.mu.Unlock()
}

// receive reads datagrams until the socket is closed.
func (s *Syncer) receive() {
	buf := make([]byte, MaxDatagram)
	mac := NewMAC(s.cfg.Key)
	var es []Entry
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p := s.byAddr[netip.AddrPortFrom(from.Addr().Unmap(), from.Port())]
		if p == nil {
			s.drop(DropUnknownPeer)
			continue
		}
		h, body, err := Open(buf[:n], mac, s.cfg.ClusterID)
		switch {
		case errors.Is(err, ErrCluster):
			s.drop(DropForeign)
			continue
		case errors.Is(err, ErrAuth):
			s.drop(DropForged)
			continue
		case err != nil:
			s.drop(DropMalformed)
			continue
		}
		es, err = Decode(es[:0], body, h.Count)
		if err != nil {
			// Authentic but malformed: a peer of another version.
			s.drop(DropMalformed)
			continue
		}
		if !p.window.Accept(h.Seq) {
			s.drop(DropReplayed)
			continue
		}
		s.mu.Lock()
		s.st.RxDatagrams++
		s.st.RxEntries += uint64(len(es))
		s.st.RxBytes += uint64(n)
		s.mu.Unlock()
		switch h.Type {
		case MsgEntries:
			s.dp.SyncInstall(es)
		case MsgFullSyncRequest:
			p.wantAns.Store(true)
			s.FullSync()
		case MsgFullSyncDone:
			if !p.arrived() {
				// Its entries came before the end marker and are queued to the
				// workers; the warm-up is over once they are in the tables.
				installed := s.dp.SyncInstalled()
				p.installed.Store(&installed)
			}
		}
	}
}

// sender is the send loop's state: one batch for incremental entries and one for
// the full sync, each sent when full or after the flush interval.
type sender struct {
	s    *Syncer
	mac  hash.Hash
	inc  *Batch
	full *Batch
	incT time.Time // when the incremental batch got its first entry
	fulT time.Time
	buf  []Entry
}

// send runs the send loop: every few milliseconds it drains the workers' rings.
func (s *Syncer) send(ctx context.Context) error {
	size := s.cfg.MTU - 28
	for _, p := range s.peers {
		if p.addr.Addr().Is6() && !p.addr.Addr().Is4In6() {
			size = s.cfg.MTU - 48
			break
		}
	}
	inc, err := NewBatch(size)
	if err != nil {
		return err
	}
	full, _ := NewBatch(size)
	sd := &sender{s: s, mac: NewMAC(s.cfg.Key), inc: inc, full: full, buf: make([]Entry, 0, 4096)}
	sd.inc.Reset(MsgEntries, s.cfg.ClusterID, 0)
	sd.full.Reset(MsgEntries, s.cfg.ClusterID, 0)

	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	flush := s.cfg.FlushInterval.D()
	period := time.NewTicker(s.cfg.FullSyncEvery.D())
	defer period.Stop()
	warmDeadline := s.started.Add(s.cfg.WarmupTimeout.D())
	var lastAsk time.Time

	var fullGen uint64
	var fullStart time.Time
	var fullPending bool
	rate := float64(s.cfg.FullSyncRate)
	var tokens float64
	last := time.Now()

	for {
		select {
		case <-ctx.Done():
			sd.sendBatch(sd.inc, &sd.incT)
			return nil
		case <-period.C:
			fullPending = true
		case <-s.fullNow:
			fullPending = true
		case now := <-tick.C:
			// Warm-up: ask the peers that have not answered, once a second.
			if !s.warm.Load() {
				all, arrived := true, true
				for _, p := range s.peers {
					installed := p.installed.Load()
					arrived = arrived && installed != nil
					all = all && installed != nil && (*installed)()
				}
				if arrived && !all {
					s.warmWhy.Store(&whyInstalling)
				}
				switch {
				case all:
					s.warm.Store(true)
					s.log.Info("session sync warmed up: every peer's full sync is installed", "after", now.Sub(s.started))
				case now.After(warmDeadline):
					s.warm.Store(true)
					s.log.Warn("session sync warm-up timed out; announcing without every peer's full sync",
						"timeout", s.cfg.WarmupTimeout.D())
				case now.Sub(lastAsk) >= time.Second:
					lastAsk = now
					for _, p := range s.peers {
						if !p.arrived() {
							sd.control(MsgFullSyncRequest, p)
						}
					}
				}
			}
			// Incremental entries first, all of them.
			for {
				sd.buf = s.dp.SyncDrain(sd.buf[:0], false, cap(sd.buf))
				for i := range sd.buf {
					sd.add(sd.inc, &sd.incT, &sd.buf[i], now)
				}
				if len(sd.buf) < cap(sd.buf) {
					break
				}
			}
			if sd.inc.Len() > 0 && now.Sub(sd.incT) >= flush {
				sd.sendBatch(sd.inc, &sd.incT)
			}
			if fullGen == 0 && fullPending {
				fullPending = false
				fullGen = s.dp.SyncFullStart()
				fullStart = now
				tokens = 0
			}
			if fullGen != 0 {
				// Paced: FullSyncRate entries a second; up to 100 ms of it saved up, so a
				// send loop the scheduler kept waiting catches up (the socket buffer
				// holds such a burst).
				tokens = min(tokens+rate*now.Sub(last).Seconds(), rate/10+1)
				if rate == 0 {
					tokens = float64(cap(sd.buf))
				}
				for tokens >= 1 {
					n := min(int(tokens), cap(sd.buf))
					sd.buf = s.dp.SyncDrain(sd.buf[:0], true, n)
					for i := range sd.buf {
						sd.add(sd.full, &sd.fulT, &sd.buf[i], now)
					}
					tokens -= float64(len(sd.buf))
					if len(sd.buf) < n {
						break
					}
				}
				if s.dp.SyncFullDone(fullGen) {
					sd.sendBatch(sd.full, &sd.fulT)
					for _, p := range s.peers {
						if p.wantAns.Swap(false) {
							sd.control(MsgFullSyncDone, p)
						}
					}
					d := now.Sub(fullStart)
					s.mu.Lock()
					s.st.FullSyncs++
					s.st.FullSyncLast = d
					s.mu.Unlock()
					fullGen = 0
				}
			}
			last = now
		}
	}
}

// add puts e in batch b, sending b first when e does not fit.
func (sd *sender) add(b *Batch, t *time.Time, e *Entry, now time.Time) {
	if b.Len() == 0 {
		*t = now
	}
	if b.Add(e) {
		return
	}
	sd.sendBatch(b, t)
	*t = now
	b.Add(e)
}

// sendBatch seals b with the next sequence and sends it to every peer.
func (sd *sender) sendBatch(b *Batch, t *time.Time) {
	if b.Len() == 0 {
		return
	}
	b.SetSeq(sd.s.seq.Add(1))
	msg := b.Seal(sd.mac)
	sd.s.transmit(msg, b.Len(), nil)
	b.Reset(MsgEntries, sd.s.cfg.ClusterID, 0)
	*t = time.Time{}
}

// control sends a datagram of type typ to p.
func (sd *sender) control(typ MsgType, p *peer) {
	var b Batch
	b.limit = HeaderLen + MACLen
	b.buf = make([]byte, 0, b.limit)
	b.Reset(typ, sd.s.cfg.ClusterID, sd.s.seq.Add(1))
	sd.s.transmit(b.Seal(sd.mac), 0, p)
}

// transmit sends msg to p, or to every peer when p is nil.
func (s *Syncer) transmit(msg []byte, entries int, p *peer) {
	targets := s.peers
	if p != nil {
		targets = []*peer{p}
	}
	var sent, errs uint64
	for _, t := range targets {
		if _, err := s.conn.WriteToUDPAddrPort(msg, t.addr); err != nil {
			errs++
			continue
		}
		sent++
	}
	s.mu.Lock()
	s.st.TxDatagrams += sent
	s.st.TxEntries += sent * uint64(entries)
	s.st.TxBytes += sent * uint64(len(msg))
	s.st.SendErrors += errs
	s.mu.Unlock()
}
