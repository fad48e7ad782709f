package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"
)

// ErrShuttingDown is the health of a daemon that has begun to stop: its /healthz
// answers 503 "shutting down".
var ErrShuttingDown = errors.New("shutting down")

// DefaultGrace is LameDuck's Grace when none is set.
const DefaultGrace = 5 * time.Second

// LameDuck is the stop sequence of a daemon that load balancers or health checkers
// send traffic to: first stop advertising health (/healthz answers 503 "shutting
// down") while still serving, wait Delay so that they take the daemon out of
// rotation, then stop accepting and shut down, giving what is in progress Grace to
// finish. The zero LameDuck stops at once with DefaultGrace.
type LameDuck struct {
	// Delay is how long the daemon goes on serving, unhealthy, before it stops
	// accepting (the configuration's lame_duck). Zero, the default, means no wait.
	Delay time.Duration
	// Grace bounds the shutdown after the delay. Zero means DefaultGrace.
	Grace time.Duration
	// Logger, when set, is told when the lame-duck period begins.
	Logger *slog.Logger

	stopping atomic.Bool
}

// Healthy returns a health check that reports ErrShuttingDown once Stop has begun,
// and before that what check reports (nil check: healthy).
func (l *LameDuck) Healthy(check func() error) func() error {
	return func() error {
		if l.stopping.Load() {
			return ErrShuttingDown
		}
		if check == nil {
			return nil
		}
		return check()
	}
}

// Stopping reports whether Stop has begun.
func (l *LameDuck) Stopping() bool { return l.stopping.Load() }

// Stop makes Healthy report ErrShuttingDown, waits Delay (cut short when ctx ends),
// then calls shutdown with a context that ends after Grace and returns its error.
func (l *LameDuck) Stop(ctx context.Context, shutdown func(context.Context) error) error {
	l.stopping.Store(true)
	if l.Delay > 0 {
		if l.Logger != nil {
			l.Logger.Info("lame duck: /healthz answers 503 until the daemon stops accepting", "lame_duck", l.Delay)
		}
		t := time.NewTimer(l.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	grace := l.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return shutdown(sctx)
}
