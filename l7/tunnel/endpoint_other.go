//go:build !linux

package tunnel

import (
	"context"
	"errors"
	"slices"
)

// Endpoint is a tunnel endpoint; it exists only on Linux.
type Endpoint struct{}

var errNotLinux = errors.New("tunnel: the tunnel endpoint needs Linux (TUN, raw sockets, policy routing)")

// New fails: the endpoint needs Linux.
func New(cfg Config) (*Endpoint, error) {
	cfg.VIPs = slices.Clone(cfg.VIPs)
	cfg.LDs = slices.Clone(cfg.LDs)
	cfg.LDRanges = slices.Clone(cfg.LDRanges)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return nil, errNotLinux
}

// Device returns "".
func (e *Endpoint) Device() string { return "" }

// Stats returns no counters.
func (e *Endpoint) Stats() Stats { return Stats{} }

// Run fails.
func (e *Endpoint) Run(context.Context) error { return errNotLinux }

// Close does nothing.
func (e *Endpoint) Close() error { return nil }
