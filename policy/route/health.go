package route

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"time"
)

// Defaults of HealthCheck.
const (
	DefaultCheckPath          = "/"
	DefaultCheckInterval      = 5 * time.Second
	DefaultCheckTimeout       = 2 * time.Second
	DefaultHealthyThreshold   = 2
	DefaultUnhealthyThreshold = 3
)

// Dialer opens connections; *net.Dialer is one.
type Dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// healthConfig is a compiled HealthCheck, comparable so that a reload can tell
// whether a member's checker must restart.
type healthConfig struct {
	tcp       bool
	path      string
	host      string
	expect    [10]uint64 // bit set of the statuses that pass; all zero: any 2xx
	interval  time.Duration
	timeout   time.Duration
	healthy   int
	unhealthy int
}

func compileHealthCheck(hc *HealthCheck) *healthConfig {
	if hc == nil {
		return nil
	}
	c := &healthConfig{
		tcp:       hc.Type == CheckTCP,
		path:      hc.Path,
		host:      hc.Host,
		interval:  hc.Interval.D(),
		timeout:   hc.Timeout.D(),
		healthy:   hc.HealthyThreshold,
		unhealthy: hc.UnhealthyThreshold,
	}
	setDefault(&c.interval, DefaultCheckInterval)
	setDefault(&c.timeout, min(DefaultCheckTimeout, c.interval))
	setDefault(&c.healthy, DefaultHealthyThreshold)
	setDefault(&c.unhealthy, DefaultUnhealthyThreshold)
	if !c.tcp {
		setDefault(&c.path, DefaultCheckPath)
	}
	for _, s := range hc.ExpectStatus {
		c.expect[s/64] |= 1 << (s % 64)
	}
	return c
}

func (c *healthConfig) passes(status int) bool {
	if c.expect == [10]uint64{} {
		return status >= 200 && status <= 299
	}
	return status >= 0 && status < 640 && c.expect[status/64]&(1<<(status%64)) != 0
}

// checker is the goroutine probing one member.
type checker struct {
	cfg    healthConfig
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the checker and waits for its goroutine: after it, the checker no longer
// changes the member's state.
func (c *checker) stop() {
	c.cancel()
	<-c.done
}

// prober runs the probes of a Router's checkers.
type prober struct {
	dialer Dialer
	client *http.Client
}

func (r *Router) startChecker(s *memberState, cfg healthConfig) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &checker{cfg: cfg, cancel: cancel, done: make(chan struct{})}
	s.checker = c
	go func() {
		defer close(c.done)
		r.probe.run(ctx, s, &c.cfg)
	}()
}

// run checks the member every interval until ctx ends, and moves it down after
// cfg.unhealthy failures in a row and up after cfg.healthy successes in a row. The
// first check comes after a random part of a quarter interval, so that members and
// nodes do not all check at once.
func (p *prober) run(ctx context.Context, s *memberState, cfg *healthConfig) {
	t := time.NewTimer(rand.N(cfg.interval/4 + 1))
	defer t.Stop()
	successes, failures := 0, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		err := p.check(ctx, s.addr, cfg)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			successes, failures = successes+1, 0
			s.rt.m.healthChecks.WithLabelValues(s.pool, "ok").Inc()
			if s.down.Load() && successes >= cfg.healthy {
				s.down.Store(false)
				s.rt.m.transitions.WithLabelValues(s.pool, "up").Inc()
				s.rt.log.Info("pool member up", "pool", s.pool, "member", s.addr, "successes", successes)
				s.rt.changed()
			}
		} else {
			successes, failures = 0, failures+1
			s.rt.m.healthChecks.WithLabelValues(s.pool, "fail").Inc()
			if !s.down.Load() && failures >= cfg.unhealthy {
				s.down.Store(true)
				s.rt.m.transitions.WithLabelValues(s.pool, "down").Inc()
				s.rt.log.Warn("pool member down", "pool", s.pool, "member", s.addr, "failures", failures, "err", err)
				s.rt.changed()
			}
		}
		t.Reset(max(0, cfg.interval-time.Since(start)))
	}
}

// check probes addr once.
func (p *prober) check(ctx context.Context, addr string, cfg *healthConfig) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if cfg.tcp {
		c, err := p.dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+cfg.path, nil)
	if err != nil {
		return err
	}
	if cfg.host != "" {
		req.Host = cfg.host
	}
	req.Header.Set("User-Agent", "tiergate-health-check")
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if !cfg.passes(resp.StatusCode) {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// newCheckClient is the HTTP client of health checks when Options has none: a new
// connection per check (a kept-alive connection would hide a member that stopped
// accepting), no proxy from the environment, no redirects followed.
func newCheckClient(d Dialer) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:            d.DialContext,
			DisableKeepAlives:      true,
			DisableCompression:     true,
			MaxResponseHeaderBytes: 64 << 10,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
