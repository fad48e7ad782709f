package datapath

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"
)

// healthChecker probes one member on its own goroutine and reports each result to
// the control goroutine, which counts rises and falls.
type healthChecker struct {
	key    string // memberKey
	target string // ip:port
	cfg    HealthConfig
	cancel context.CancelFunc
}

type healthResult struct {
	key     string
	checker *healthChecker
	ok      bool
	err     error
}

func (c *control) healthTarget(ms *memberState) string {
	if ms.cfg.HealthAddr != "" {
		return ms.cfg.HealthAddr
	}
	h := c.cfg.Pools[ms.pool].Health
	return netip.AddrPortFrom(ms.cfg.Address.Unmap(), h.Port).String()
}

// restartHealth starts a checker for every configured member whose check is not
// running with the same settings, and stops the others. It does nothing before
// Run (c.ctx unset).
func (c *control) restartHealth() {
	if c.ctx == nil {
		return
	}
	for k, ms := range c.members {
		h := c.cfg.Pools[ms.pool].Health
		target := c.healthTarget(ms)
		if ms.retired || h.Type == "none" {
			if ms.checker != nil {
				ms.checker.cancel()
				ms.checker = nil
			}
			if h.Type == "none" && !ms.up {
				ms.up = true
				c.dirty = true
			}
			continue
		}
		if ms.checker != nil && ms.checker.target == target && ms.checker.cfg == h {
			continue
		}
		if ms.checker != nil {
			ms.checker.cancel()
		}
		ctx, cancel := context.WithCancel(c.ctx)
		hc := &healthChecker{key: k, target: target, cfg: h, cancel: cancel}
		ms.checker = hc
		ms.rise, ms.fall = 0, 0
		go hc.run(ctx, c.health)
	}
}

func (c *control) stopHealth() {
	for _, ms := range c.members {
		if ms.checker != nil {
			ms.checker.cancel()
			ms.checker = nil
		}
	}
}

// healthResult applies one probe result: Fall failures in a row take an up member
// down, Rise successes bring a down one up.
func (c *control) healthResult(r healthResult) {
	ms := c.members[r.key]
	if ms == nil || ms.checker != r.checker {
		return // a result from a checker since replaced
	}
	h := c.cfg.Pools[ms.pool].Health
	if r.ok {
		ms.fall = 0
		ms.rise++
		if !ms.up && ms.rise >= h.Rise {
			ms.up = true
			c.dirty = true
			c.log.Info("l4: member up", "pool", ms.pool, "member", ms.cfg.Name)
		}
		return
	}
	ms.rise = 0
	ms.fall++
	if ms.up && ms.fall >= h.Fall {
		ms.up = false
		c.dirty = true
		c.log.Warn("l4: member down", "pool", ms.pool, "member", ms.cfg.Name, "err", r.err)
	}
}

func (hc *healthChecker) run(ctx context.Context, out chan<- healthResult) {
	client := &http.Client{
		Timeout:   hc.cfg.Timeout.D(),
		Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
	}
	t := time.NewTicker(hc.cfg.Interval.D())
	defer t.Stop()
	for {
		err := hc.probe(ctx, client)
		select {
		case out <- healthResult{key: hc.key, checker: hc, ok: err == nil, err: err}:
		case <-ctx.Done():
			return
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (hc *healthChecker) probe(ctx context.Context, client *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, hc.cfg.Timeout.D())
	defer cancel()
	switch hc.cfg.Type {
	case "http":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+hc.target+hc.cfg.Path, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode >= 400 {
			return fmt.Errorf("health check %s: status %s", hc.target, strconv.Itoa(resp.StatusCode))
		}
		return nil
	default:
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", hc.target)
		if err != nil {
			return err
		}
		return conn.Close()
	}
}
