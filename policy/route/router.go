package route

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Router. The zero Options are valid.
type Options struct {
	// Registerer receives the Router's metrics. Default: none registered.
	Registerer prometheus.Registerer

	// Logger receives health transitions, ejections and reloads. Default
	// slog.Default().
	Logger *slog.Logger

	// Dialer opens the connections of TCP health checks, and of HTTP ones unless
	// HTTPClient is set. Default a net.Dialer.
	Dialer Dialer

	// HTTPClient makes the requests of HTTP health checks; each check bounds its
	// request by its timeout. Default: a client of Dialer's connections, one per
	// check, that follows no redirect and ignores proxy settings.
	HTTPClient *http.Client
}

// Router holds the current Table and the runtime state that outlives it (members'
// health, ejection and outstanding requests; rate limiters), and runs the active
// health checks. Its methods are safe for concurrent use; Table, Pick and what
// they return never block on Apply.
type Router struct {
	rt     *env
	probe  prober
	client *http.Client // made here, closed by Close; nil when Options had one

	mu     sync.Mutex // serialises Apply and Close, guards st and checkers
	st     *state
	closed bool
}

// NewRouter returns a Router with an empty Table (no listener, no pool).
func NewRouter(opts Options) *Router {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	r := &Router{rt: &env{log: log.With("component", "route"), m: newMetrics()}}
	r.probe.dialer = opts.Dialer
	if r.probe.dialer == nil {
		r.probe.dialer = &net.Dialer{}
	}
	r.probe.client = opts.HTTPClient
	if r.probe.client == nil {
		r.client = newCheckClient(r.probe.dialer)
		r.probe.client = r.client
	}
	t, st := compile(&Config{}, r.rt, nil, nil)
	r.st = st
	r.rt.current.Store(t)
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(r.rt.m.collectors()...)
		opts.Registerer.MustRegister(memberCollector{r})
	}
	return r
}

// Table returns the current Table. A request should load it once and use it
// throughout, so that it sees one configuration from its start to its end.
func (r *Router) Table() *Table { return r.rt.current.Load() }

// Apply validates c, compiles it and makes it the current Table in one atomic
// step; on error nothing changes and the error is Validate's. Members (by pool name
// and address) and rate limiters (by listener and route name, with the same
// settings) that c keeps, keep their state; health checkers start for new members,
// restart for members whose pool's check changed, and stop for members that are
// gone. Requests that loaded the previous Table finish on it. c is not retained.
func (r *Router) Apply(c *Config) error {
	if err := c.Validate(); err != nil {
		r.rt.m.applies.WithLabelValues("invalid").Inc()
		return err
	}
	if !r.Commit(c) {
		return errors.New("route: apply on a closed router")
	}
	return nil
}

// Commit is Apply's second half, for a c that has passed Validate (and has not been
// changed since): it compiles c and makes it the current Table, which cannot fail. A
// caller that must apply several things together validates each first, then commits
// them all. It returns false, changing nothing, once the Router is closed.
func (r *Router) Commit(c *Config) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	t, next := compile(c, r.rt, r.st, r.rt.current.Load())
	r.rt.current.Store(t)

	for key, s := range r.st.members {
		if next.members[key] != s {
			if s.checker != nil {
				s.checker.stop()
				s.checker = nil
			}
			s.forget()
		}
	}
	for key, s := range next.members {
		want := next.checks[key]
		if s.checker != nil && (want == nil || s.checker.cfg != *want) {
			s.checker.stop()
			s.checker = nil
		}
		if want == nil {
			// Nothing would ever bring it back.
			s.down.Store(false)
		} else if s.checker == nil {
			r.startChecker(s, *want)
		}
	}
	r.st = next
	r.rt.changed()
	r.rt.m.applies.WithLabelValues("ok").Inc()
	r.rt.log.Info("routing configuration applied", "listeners", len(t.listeners),
		"routes", len(t.routes), "pools", len(t.poolList), "members", len(next.members))
	return true
}

// Pick picks a member of the current Table's pool named pool; see Balancer.Pick.
// It returns ErrUnknownPool when there is no such pool.
func (r *Router) Pick(pool string, clientIP netip.Addr, header HeaderFunc, exclude func(*Member) bool) (*Member, error) {
	b := r.Table().Pool(pool)
	if b == nil {
		return nil, ErrUnknownPool
	}
	return b.Pick(clientIP, header, exclude)
}

// Close stops the health checkers and ends ejections. The current Table stays
// usable, its members frozen in their health state; Apply fails from now on.
func (r *Router) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	var wg sync.WaitGroup
	for _, s := range r.st.members {
		if c := s.checker; c != nil {
			s.checker = nil
			wg.Go(c.stop)
		}
	}
	wg.Wait()
	for _, s := range r.st.members {
		s.forget()
	}
	if r.client != nil {
		r.client.CloseIdleConnections()
	}
}
