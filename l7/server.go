// Package l7 is the L7 tier of Tiergate as a library: it terminates TLS over TCP
// (HTTP/1.1 with fasthttp, HTTP/2 with net/http) and QUIC (HTTP/3 with quic-go) on the
// same port, and routes every request, through one protocol-agnostic handler, by a
// routing policy (package route) to backend pools over kept-alive HTTP/1.1.
//
// Policy plugs in at three points. Config.AcceptFilter sees each connection's peer
// before any TLS work (blacklists drop connections there), and
// ListenerConfig.WrapListener puts a PROXY protocol reader in front of TLS. Every
// request, whatever its protocol, becomes a Request (fasthttp's request type plus the
// connection it came on) and goes through Config.Decider (the client IP, from
// headers sent by trusted proxies; a direct answer for blacklisted clients), then the
// routing table: its route picks a member of a pool (balancing, health, retries, rate
// limits) or answers. TLS handshakes over TCP and QUIC are counted alike, with the
// reason of each failure: a missing certificate, a keyserver error or timeout (told
// apart by wrapping the certificate's private key for the handshake), a client alert,
// a timeout.
//
// Routes match fasthttp's normalised, percent-decoded path (URI().Path(): "." and
// ".." segments resolved, "//" collapsed), so a route cannot be bypassed by spelling
// its path another way; the backend receives the request target as the client sent
// it (DisablePathNormalizing), since rewriting it could change its meaning for the
// backend ("%2F" within a segment).
//
// HTTP/2 is served by net/http's own server, fed with connections whose handshake
// chose h2: golang.org/x/net/http2.Server is deprecated in favour of it, and from Go
// 1.27 only wraps it.
package l7

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tiergate/tiergate/policy/route"
)

// Server is an L7 server. Create it with NewServer, then Start or Run it.
type Server struct {
	cfg       Config
	log       *slog.Logger
	m         *metrics
	router    *route.Router
	listeners []*listener
	bodies    *bodyBudget // MaxBodyMemory
	keySlots  keySlots    // local keys' operations in progress, GOMAXPROCS at most

	state    atomic.Pointer[snapshot] // what requests and handshakes read; written by Start and Commit
	draining atomic.Bool

	mu      sync.Mutex
	started bool
	stopped bool
}

// snapshot is the configuration requests and handshakes read, swapped whole by Reload.
type snapshot struct {
	cfg       Config
	routing   *route.Config // cfg.Routing, or the simple form made from cfg
	table     *route.Table  // routing compiled; nil before Start
	upstreams *upstreams    // the clients of table's members
	decider   Decider
	filter    func(listener string, remote netip.AddrPort) bool
	listeners []listenerState // by listener index
}

type listenerState struct {
	tcpTLS  *tlsSource
	quicTLS *tlsSource
}

// NewServer validates cfg and fills in its defaults. It opens no socket: Start does.
func NewServer(cfg Config) (*Server, error) {
	cfg, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg,
		log: cfg.Logger.With("component", "l7"),
		m:   newMetrics(cfg.Registerer),

		keySlots: newKeySlots(runtime.GOMAXPROCS(0)),
	}
	s.bodies = &bodyBudget{max: cfg.MaxBodyMemory, inUse: s.m.bodyMemory, refused: s.m.bodyRefused}
	s.router = route.NewRouter(route.Options{Registerer: cfg.Registerer, Logger: cfg.Logger})
	s.state.Store(s.compile(cfg, routingOf(&cfg), nil, nil))
	for i, lc := range cfg.Listeners {
		s.listeners = append(s.listeners, newListener(s, i, lc))
	}
	return s, nil
}

// prepare validates and populates a copy of cfg, leaving the caller's slices alone.
func prepare(cfg Config) (Config, error) {
	cfg.Listeners = append([]ListenerConfig(nil), cfg.Listeners...)
	if err := cfg.validate(); err != nil {
		return Config{}, err
	}
	cfg.populate()
	return cfg, nil
}

// routingOf returns the routing policy of a prepared cfg.
func routingOf(cfg *Config) *route.Config {
	if cfg.Routing != nil {
		return cfg.Routing
	}
	return simpleRouting(cfg)
}

// compile builds the snapshot of cfg, whose routing policy is routing, over table
// (routing compiled; nil before Start), keeping the backend clients of old's members
// where they did not change.
func (s *Server) compile(cfg Config, routing *route.Config, table *route.Table, old *snapshot) *snapshot {
	snap := &snapshot{cfg: cfg, routing: routing, table: table, decider: cfg.Decider, filter: cfg.AcceptFilter}
	if table != nil {
		var prev *upstreams
		if old != nil {
			prev = old.upstreams
		}
		snap.upstreams = newUpstreams(table, s.m, prev)
	}
	for _, lc := range cfg.Listeners {
		snap.listeners = append(snap.listeners, listenerState{
			tcpTLS:  newTLSSource(lc.TLS, tcpProtos, tlsVersion12, cfg.IsNoCertificate),
			quicTLS: newTLSSource(lc.TLS, quicProtos, tlsVersion13, cfg.IsNoCertificate),
		})
	}
	return snap
}

// applyRouting applies cfg's routing to the Router, then stores the snapshot of cfg
// over the Router's new table and closes the idle connections of members old had and
// it has not. On error nothing changes.
func (s *Server) applyRouting(cfg Config, old *snapshot) (*snapshot, error) {
	routing := routingOf(&cfg)
	if err := s.router.Apply(routing); err != nil {
		return nil, fmt.Errorf("l7: routing: %w", err)
	}
	snap := s.compile(cfg, routing, s.router.Table(), old)
	s.state.Store(snap)
	old.upstreams.closeIdle(snap.upstreams)
	return snap, nil
}

const (
	tlsVersion12 = 0x0303
	tlsVersion13 = 0x0304
)

// Start applies the routing policy (starting its health checks), binds every
// listener, TCP and UDP, failing if any address cannot be bound, and serves in the
// background until Shutdown. A Start that fails leaves the server shut down.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return errors.New("l7: already started or shut down")
	}
	cur := s.state.Load()
	_, err := s.applyRouting(cur.cfg, cur)
	if err != nil {
		s.stopped = true
		s.router.Close()
		return err
	}
	for i, l := range s.listeners {
		if err := l.bind(); err != nil {
			for _, b := range s.listeners[:i] {
				b.closeSockets()
			}
			s.stopped = true
			s.closeRouting()
			return err
		}
	}
	for i, l := range s.listeners {
		if err := l.start(); err != nil {
			// Nothing has been served yet: stop what started, release the rest.
			s.stopped = true
			_ = s.shutdownStarted(context.Background(), s.listeners[:i])
			for _, b := range s.listeners[i:] {
				b.closeSockets()
			}
			return err
		}
	}
	s.started = true
	return nil
}

// Run starts the server and serves until ctx is done, then shuts down gracefully,
// giving in-flight requests up to grace to finish.
func (s *Server) Run(ctx context.Context, grace time.Duration) error {
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return s.Shutdown(sctx)
}

// Shutdown stops accepting connections, TCP and QUIC; closes connections that are
// handshaking or idle; lets requests in flight finish (HTTP/1.1 connections close
// after their response, HTTP/2 and HTTP/3 ones get GOAWAY); then closes everything.
// If ctx ends first, the remaining connections are closed at once and ctx's error is
// returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	started := s.started
	s.mu.Unlock()
	if !started {
		s.closeRouting()
		return nil
	}
	return s.shutdownStarted(ctx, s.listeners)
}

// closeRouting stops the health checks and closes the idle backend connections.
func (s *Server) closeRouting() {
	s.router.Close()
	s.state.Load().upstreams.closeIdle(nil)
}

func (s *Server) shutdownStarted(ctx context.Context, ls []*listener) error {
	s.draining.Store(true)
	errs := make([]error, len(ls))
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() { errs[i] = l.shutdown(ctx) })
	}
	wg.Wait()
	s.closeRouting()
	err := errors.Join(errs...)
	if err == nil {
		s.log.Info("shut down")
	}
	return err
}

// Addrs returns each listener's bound TCP address, by name; its UDP socket has the
// same port. Empty before Start.
func (s *Server) Addrs() map[string]net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]net.Addr{}
	if !s.started {
		return out
	}
	for _, l := range s.listeners {
		out[l.cfg.Name] = l.tcpLn.Addr()
	}
	return out
}

// Connections is the client connections the server holds, TCP and QUIC, in their
// TLS handshake and past it: the load its live heap grows with. It takes no lock.
func (s *Server) Connections() int64 {
	var n int64
	for _, l := range s.listeners {
		n += l.nconns.Load() + l.tcpHS.Load() + l.quicHS.Load()
	}
	return n
}

// Served is the work the server has done since it started: the HTTP requests it
// answered and the TLS handshakes it completed, over all listeners. It reads the
// counters the requests and handshakes keep anyway, and takes no lock; l7d's
// GOMAXPROCS sizing asks it whether a P it added served more (internal/autoprocs).
func (s *Server) Served() uint64 {
	var n uint64
	var m dto.Metric
	for _, l := range s.listeners {
		n += l.hsDone.Load()
		for _, c := range []prometheus.Counter{l.reqH1, l.reqH2, l.reqH3} {
			m.Reset()
			if c != nil && c.Write(&m) == nil {
				n += uint64(m.GetCounter().GetValue())
			}
		}
	}
	return n
}

// Healthy reports whether the server is serving.
func (s *Server) Healthy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return errors.New("shutting down")
	case !s.started:
		return errors.New("not serving yet")
	}
	return nil
}

// Reload swaps in cfg's routing (Routing, or Backends and listeners' Pool),
// Decider, AcceptFilter, IsNoCertificate and listeners' TLS, atomically: the routing
// policy is applied to the Router first (its health and rate-limit state carried
// over), then one snapshot holding all of it is stored, so requests read either the
// old configuration or the new one, never a mix, and new handshakes use the new
// certificates. Backend connections of unchanged pool members are kept. Listeners
// must be the same, in the same order, with the same addresses, timeouts and limits:
// changing those takes a restart, and Reload returns an error naming the first
// difference, changing nothing. Registerer and Logger are not reloaded.
//
// Reload is Prepare then Commit, and is called as Commit is; a caller that applies the server's configuration
// together with other things (certificates, blacklists) prepares them all first and
// commits only when every one was good.
func (s *Server) Reload(cfg Config) error {
	p, err := s.Prepare(cfg)
	if err != nil {
		return err
	}
	s.Commit(p)
	return nil
}

// Prepared is a configuration that Prepare checked, ready for Commit. Nothing of it
// is in force until then.
type Prepared struct {
	cfg     Config
	routing *route.Config
}

// Prepare does everything of Reload that can fail, and changes nothing: it validates
// cfg and fills in its defaults, checks that its listeners are those the server runs
// (see Reload) and validates its routing policy.
func (s *Server) Prepare(cfg Config) (*Prepared, error) {
	cfg, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	cur := s.state.Load().cfg
	if err := checkReload(cur.Listeners, cfg.Listeners); err != nil {
		return nil, err
	}
	if cfg.MaxBodyMemory != cur.MaxBodyMemory {
		return nil, fmt.Errorf("l7: reload: max_body_memory changed (%d → %d); %w", cur.MaxBodyMemory, cfg.MaxBodyMemory, ErrRestartRequired)
	}
	cfg.Registerer, cfg.Logger = cur.Registerer, cur.Logger
	routing := routingOf(&cfg)
	if err := routing.Validate(); err != nil {
		return nil, fmt.Errorf("l7: routing: %w", err)
	}
	return &Prepared{cfg: cfg, routing: routing}, nil
}

// Commit puts a configuration Prepare returned in force, which cannot fail: the
// routing policy to the Router, then one snapshot with the rest. Commits (and
// Reloads) come from one goroutine at a time, the daemon's one owner of its
// configuration, and not during Start: the snapshot has a single writer, so requests
// and handshakes read it with no lock.
func (s *Server) Commit(p *Prepared) {
	old := s.state.Load()
	if old.table == nil {
		// Not started: Start applies the routing.
		s.state.Store(s.compile(p.cfg, p.routing, nil, old))
		return
	}
	s.router.Commit(p.routing)
	snap := s.compile(p.cfg, p.routing, s.router.Table(), old)
	s.state.Store(snap)
	old.upstreams.closeIdle(snap.upstreams)
	s.log.Info("configuration reloaded", "pools", len(snap.routing.Pools), "listeners", len(snap.routing.Listeners))
}
