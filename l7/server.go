// Package l7 is the L7 tier of Tiergate as a library: it terminates TLS over TCP
// (HTTP/1.1 with fasthttp, HTTP/2 with net/http) and QUIC (HTTP/3 with quic-go) on the
// same port, and proxies every request, through one protocol-agnostic handler and one
// decision hook, to a backend pool over kept-alive HTTP/1.1.
//
// Every request, whatever its protocol, becomes a Request (fasthttp's request type
// plus the connection it came on) and goes through Config.Decider, the one place
// where routing policies, client-IP rules and blacklists plug in. TLS handshakes over
// TCP and QUIC are counted alike, with the reason of each failure: a missing
// certificate, a keyserver error or timeout (told apart by wrapping the certificate's
// private key for the handshake), a client alert, a timeout.
//
// HTTP/2 is served by net/http's own server, fed with connections whose handshake
// chose h2: golang.org/x/net/http2.Server is deprecated in favour of it, and from Go
// 1.27 only wraps it.
package l7

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Server is an L7 server. Create it with NewServer, then Start or Run it.
type Server struct {
	cfg       Config
	log       *slog.Logger
	m         *metrics
	listeners []*listener

	state    atomic.Pointer[snapshot] // what requests and handshakes read
	reloadMu sync.Mutex               // serialises Reload, the one writer of state
	draining atomic.Bool

	mu      sync.Mutex
	started bool
	stopped bool
}

// snapshot is the configuration requests and handshakes read, swapped whole by Reload.
type snapshot struct {
	cfg       Config
	pools     map[string]*pool
	decider   Decider
	listeners []listenerState // by listener index
}

type listenerState struct {
	pool    string
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
	}
	s.state.Store(s.compile(cfg, nil))
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

// compile builds the snapshot of cfg, keeping the backend connections of old's pools
// where they did not change.
func (s *Server) compile(cfg Config, old *snapshot) *snapshot {
	snap := &snapshot{cfg: cfg, pools: map[string]*pool{}, decider: cfg.Decider}
	for name, pc := range cfg.Backends {
		var prev *pool
		if old != nil {
			prev = old.pools[name]
		}
		snap.pools[name] = newPool(name, pc, s.m, prev)
	}
	for _, lc := range cfg.Listeners {
		snap.listeners = append(snap.listeners, listenerState{
			pool:    lc.Pool,
			tcpTLS:  newTLSSource(lc.TLS, tcpProtos, tlsVersion12, cfg.IsNoCertificate),
			quicTLS: newTLSSource(lc.TLS, quicProtos, tlsVersion13, cfg.IsNoCertificate),
		})
	}
	return snap
}

const (
	tlsVersion12 = 0x0303
	tlsVersion13 = 0x0304
)

// Start binds every listener, TCP and UDP, failing if any address cannot be bound,
// and serves in the background until Shutdown.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return errors.New("l7: already started or shut down")
	}
	for i, l := range s.listeners {
		if err := l.bind(); err != nil {
			for _, b := range s.listeners[:i] {
				b.closeSockets()
			}
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
		return nil
	}
	return s.shutdownStarted(ctx, s.listeners)
}

func (s *Server) shutdownStarted(ctx context.Context, ls []*listener) error {
	s.draining.Store(true)
	errs := make([]error, len(ls))
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() { errs[i] = l.shutdown(ctx) })
	}
	wg.Wait()
	for _, p := range s.state.Load().pools {
		p.closeIdle(nil)
	}
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

// Reload swaps in cfg's backend pools, Decider, IsNoCertificate and, per listener,
// Pool and TLS, atomically: requests read either the old configuration or the new
// one, and new handshakes use the new certificates. Backend connections of unchanged
// pool members are kept. Listeners must be the same, in the same order, with the same
// addresses, timeouts and limits: changing those takes a restart, and Reload returns
// an error naming the first difference, changing nothing. Registerer and Logger are
// not reloaded.
func (s *Server) Reload(cfg Config) error {
	cfg, err := prepare(cfg)
	if err != nil {
		return err
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	old := s.state.Load()
	if err := checkReload(old.cfg.Listeners, cfg.Listeners); err != nil {
		return err
	}
	cfg.Registerer, cfg.Logger = old.cfg.Registerer, old.cfg.Logger
	snap := s.compile(cfg, old)
	s.state.Store(snap)
	for name, p := range old.pools {
		p.closeIdle(snap.pools[name])
	}
	s.log.Info("configuration reloaded", "pools", len(snap.pools))
	return nil
}
