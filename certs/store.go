package certs

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
)

// Store serves TLS handshakes from the current Set and swaps in a new one on each
// successful Load or Commit. It takes no lock: handshakes read an immutable Set and
// ticket state through atomic pointers. Prepare, GetCertificate, Set and TLSConfig
// may be called from any goroutine; Load and Commit, which change what is served,
// from one at a time (a daemon's one owner of its configuration).
type Store struct {
	opts Options
	log  *slog.Logger

	set     atomic.Pointer[Set]
	tickets atomic.Pointer[ticketState]
	m       *metrics // its series are written by Commit alone
}

// NewStore returns a Store with no certificates: handshakes fail until the first
// successful Load.
func NewStore(opts Options) *Store {
	opts.populate()
	s := &Store{opts: opts, log: opts.Logger.With("component", "certs")}
	s.m = newMetrics(opts.Registerer, s.log)
	s.tickets.Store(newTicketState(nil))
	return s
}

// Set returns the current Set, or nil before the first successful Load.
func (s *Store) Set() *Set { return s.set.Load() }

// GetCertificate is tls.Config.GetCertificate over the current Set (see Set.Select).
func (s *Store) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	set := s.set.Load()
	if set == nil {
		return nil, errNotLoaded
	}
	c, err := set.Select(hello)
	if err != nil {
		return nil, err
	}
	return c.TLS, nil
}

var errNotLoaded = fmt.Errorf("%w: no certificates are loaded", ErrNoCertificate)

// TLSConfig returns a new server config that takes its certificates from the Store
// (GetCertificate) and seals and opens session tickets with the Store's current
// ticket keys (WrapSession and UnwrapSession), with TLS 1.2 as the minimum version and
// no NextProtos. Clone it and set what each listener needs (ALPN); the clones follow
// every later Load, certificates and ticket keys alike. Do not replace its
// GetCertificate, WrapSession or UnwrapSession (wrapping them is fine).
func (s *Store) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.GetCertificate,
		WrapSession:    s.wrapSession,
		UnwrapSession:  s.unwrapSession,
	}
}

func (s *Store) wrapSession(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
	return s.tickets.Load().cfg.EncryptTicket(cs, ss)
}

// unwrapSession opens a ticket sealed with any current key; a ticket it cannot open
// yields (nil, nil), a full handshake.
func (s *Store) unwrapSession(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
	return s.tickets.Load().cfg.DecryptTicket(identity, cs)
}

// TicketKeys returns how many configured ticket keys are in use; 0 means crypto/tls's
// per-process random keys.
func (s *Store) TicketKeys() int { return len(s.tickets.Load().keys) }

// applyTickets puts keys in use, keeping the current state when they are unchanged.
func (s *Store) applyTickets(keys [][TicketKeyLen]byte) {
	if s.tickets.Load().sameKeys(keys) {
		return
	}
	s.tickets.Store(newTicketState(keys))
	s.log.Info("session ticket keys changed", "keys", len(keys))
}

// warnTicketFileModes warns of ticket key files that others than their owner may read.
func warnTicketFileModes(files []string, log *slog.Logger) {
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn("ticket key file is readable by others than its owner; whoever reads it can decrypt recorded sessions", "file", f, "mode", fi.Mode().Perm().String())
		}
	}
}
