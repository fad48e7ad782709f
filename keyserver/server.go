// Package keyserver is keyserverd as a library: a mutual-TLS server that performs
// private-key operations (RSA and ECDSA signatures, Ed25519, RSA decryption) for the L7
// tier, with keys held by a PKCS#11 token or, for development, in software.
//
// Many requests share one connection (see keyserver/protocol); each is worked on in
// its own goroutine, bounded per connection, and answered as soon as it is done, in any
// order. The client side is keyserver/client.
package keyserver

import (
	"bufio"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/keyserver/softkey"
)

// Server is a keyserver. Create it with NewServer, then Start or Run it.
//
// What can change while it serves (the keys, the backends, the client rules) is owned
// by one goroutine: imports and Apply are closures queued to it (do), so they run one
// after another, and request handlers read immutable snapshots (keys, rules,
// backends) with no lock.
type Server struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	keys     atomic.Pointer[keySet]
	rules    atomic.Pointer[ruleSet]
	backends atomic.Pointer[[]backend.Backend]

	ops       chan func()   // changes, run in order by the owner goroutine
	ownerDone chan struct{} // closed when the owner stops, at Shutdown
	stopOwner sync.Once

	mu          sync.Mutex
	ln          net.Listener
	conns       map[*serverConn]struct{} // every connection, in its handshake or not
	handshaking int                      // connections in their TLS handshake
	bySource    map[netip.Prefix]int     // of those, by source
	authed      int                      // connections past their handshake
	closing     bool
	doneConn    sync.WaitGroup
	accepted    chan struct{}
}

// NewServer validates cfg, fills in defaults and loads every backend's keys.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.populate()
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "keyserver"),
		m:         newMetrics(cfg.Registerer),
		conns:     map[*serverConn]struct{}{},
		bySource:  map[netip.Prefix]int{},
		accepted:  make(chan struct{}),
		ops:       make(chan func()),
		ownerDone: make(chan struct{}),
	}
	ks, err := newKeySet(cfg.Backends)
	if err != nil {
		return nil, err
	}
	s.keys.Store(ks)
	s.setRules(compileRules(cfg.Clients, cfg.AllowAllClients, cfg.Deny))
	bs := slices.Clone(cfg.Backends)
	s.backends.Store(&bs)
	s.m.keys.Set(float64(len(ks.list)))
	go s.own()
	return s, nil
}

// setRules puts rs in force, and says so loudly when it lets every client in.
func (s *Server) setRules(rs *ruleSet) {
	s.rules.Store(rs)
	if rs.allowAll {
		s.m.allowAll.Set(1)
		s.log.Warn("allow_all_clients: no client rules, every certificate the client CA issued may sign with every key; name the clients in clients rules")
	} else {
		s.m.allowAll.Set(0)
	}
}

// AllowsAllClients reports whether the rules in force let every client with a
// certificate of the client CA use every key (Config.AllowAllClients).
func (s *Server) AllowsAllClients() bool { return s.rules.Load().allowAll }

// own runs the queued changes until Shutdown.
func (s *Server) own() {
	for {
		select {
		case op := <-s.ops:
			op()
		case <-s.ownerDone:
			return
		}
	}
}

// ErrServerClosed is returned by changes made after Shutdown.
var ErrServerClosed = errors.New("keyserver: server shut down")

// do runs op on the owner goroutine and waits for it.
func (s *Server) do(op func()) error {
	done := make(chan struct{})
	select {
	case s.ops <- func() { op(); close(done) }:
	case <-s.ownerDone:
		return ErrServerClosed
	}
	<-done
	return nil
}

// Update is a change of what a running Server serves, applied whole by Apply.
type Update struct {
	// Clients replaces the client rules (Config.Clients). Connections already open
	// follow them from their next request.
	Clients []ClientRule
	// AllowAllClients replaces Config.AllowAllClients.
	AllowAllClients bool
	// Deny replaces the deny list (Config.Deny); an open connection of a certificate
	// it names is closed at its next request.
	Deny DenyList
	// Backends, when not nil, replace the backends (Config.Backends): the keys
	// offered become theirs, and imports go to the first. Nil keeps the backends.
	Backends []backend.Backend
}

// Apply validates u and, only when all of it is good, swaps it in at once: a bad
// rule or a backend whose keys cannot be listed changes nothing. It returns the
// backends that u replaced (none when u.Backends is nil); the caller closes them once
// the requests already using their keys are done (a request takes the keys in force
// when it starts).
func (s *Server) Apply(u Update) (replaced []backend.Backend, err error) {
	if err := validateAccess(u.Clients, u.AllowAllClients, u.Deny); err != nil {
		return nil, fmt.Errorf("keyserver: %w", err)
	}
	if u.Backends != nil && len(u.Backends) == 0 {
		return nil, errors.New("keyserver: at least one key backend is required")
	}
	rules := compileRules(u.Clients, u.AllowAllClients, u.Deny)
	if e := s.do(func() {
		var ks *keySet
		if u.Backends != nil {
			if ks, err = newKeySet(u.Backends); err != nil {
				return
			}
			replaced = *s.backends.Load()
			bs := slices.Clone(u.Backends)
			s.backends.Store(&bs)
			s.keys.Store(ks)
			s.m.keys.Set(float64(len(ks.list)))
		}
		s.setRules(rules)
	}); e != nil {
		return nil, e
	}
	if err != nil {
		return nil, err
	}
	s.log.Info("applied", "client_rules", len(u.Clients), "keys", len(s.keys.Load().list), "backends_replaced", len(replaced))
	return replaced, nil
}

// Backends returns the backends in force.
func (s *Server) Backends() []backend.Backend { return slices.Clone(*s.backends.Load()) }

// Start listens on cfg.Addr and serves in the background until Shutdown.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("keyserver: listening on %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ln)
}

// Serve serves connections accepted from ln in the background until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.ln != nil || s.closing {
		s.mu.Unlock()
		return errors.New("keyserver: already serving or shut down")
	}
	s.ln = ln
	s.mu.Unlock()
	s.log.Info("serving", "addr", ln.Addr().String(), "keys", len(s.keys.Load().list))
	go s.acceptLoop(ln)
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

// Addr returns the listening address, or nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// ErrNoKeys is Healthy's answer for a server that serves but holds no key yet.
var ErrNoKeys = errors.New("no keys loaded")

// Healthy reports whether the server is serving and has at least one key.
func (s *Server) Healthy() error {
	s.mu.Lock()
	serving, closing := s.ln != nil, s.closing
	s.mu.Unlock()
	switch {
	case closing:
		return errors.New("shutting down")
	case !serving:
		return errors.New("not serving yet")
	case len(s.keys.Load().list) == 0:
		return ErrNoKeys
	}
	return nil
}

// Shutdown stops accepting, stops reading new requests, lets in-flight requests
// finish and their answers reach the client, then closes every connection. If ctx
// ends first, the remaining connections are closed at once and ctx's error returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	ln := s.ln
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for _, c := range conns {
		c.drain()
	}
	done := make(chan struct{})
	go func() { s.doneConn.Wait(); close(done) }()
	defer s.stopOwner.Do(func() { close(s.ownerDone) })
	select {
	case <-done:
		s.log.Info("shut down", "drained_conns", len(conns))
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		<-done
		return fmt.Errorf("keyserver: shutdown deadline passed, connections closed: %w", ctx.Err())
	}
}

func (s *Server) acceptLoop(ln net.Listener) {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off rather than spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		src := sourceOf(nc.RemoteAddr())
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			nc.Close()
			return
		}
		// A connection in its handshake is not authenticated yet: it counts against
		// a budget of its own, and its source's share of it, never against the
		// places of authenticated clients (max_conns).
		var refused string
		switch {
		case s.handshaking >= s.cfg.Limits.MaxHandshakes:
			refused = rejectTooManyHandshakes
		case s.bySource[src] >= s.cfg.Limits.MaxHandshakesPerSource:
			refused = rejectSourceHandshakes
		}
		if refused != "" {
			s.mu.Unlock()
			s.m.rejections.WithLabelValues(refused).Inc()
			nc.Close()
			continue
		}
		s.handshaking++
		s.bySource[src]++
		s.m.handshaking.Set(float64(s.handshaking))
		c := &serverConn{s: s, nc: nc, src: src}
		s.conns[c] = struct{}{}
		s.doneConn.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// sourceOf is the source a connection's handshake counts against: its IPv4
// address, or its IPv6 /64 (one host's share of addresses).
func sourceOf(a net.Addr) netip.Prefix {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{}
	}
	ip := ap.Addr().Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// handshakeDone takes c out of the handshake budget and, when its handshake
// succeeded, admits it among the authenticated connections if there is room.
func (s *Server) handshakeDone(c *serverConn, ok bool) (admitted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handshaking--
	if s.bySource[c.src]--; s.bySource[c.src] <= 0 {
		delete(s.bySource, c.src)
	}
	s.m.handshaking.Set(float64(s.handshaking))
	if !ok || s.authed >= s.cfg.Limits.MaxConns {
		return false
	}
	s.authed++
	c.admitted = true
	return true
}

func (s *Server) removeConn(c *serverConn) {
	s.mu.Lock()
	delete(s.conns, c)
	if c.admitted {
		s.authed--
	}
	s.mu.Unlock()
	s.doneConn.Done()
}

// Import stores a PEM private key in the first backend under label and offers it at
// once. Importing a key that is already there returns its ID.
func (s *Server) Import(label string, pemKey []byte) (protocol.KeyID, error) {
	priv, err := softkey.ParsePEM(pemKey)
	if err != nil {
		return protocol.KeyID{}, protocol.Errorf(protocol.CodeBadRequest, "parsing key %q: %v", label, err)
	}
	var id protocol.KeyID
	if e := s.do(func() { id, err = s.importKey(label, priv) }); e != nil {
		return protocol.KeyID{}, protocol.Errorf(protocol.CodeInternal, "importing key %q: %v", label, e)
	}
	return id, err
}

// importKey is Import on the owner goroutine.
func (s *Server) importKey(label string, priv crypto.PrivateKey) (protocol.KeyID, error) {
	b := (*s.backends.Load())[0]
	k, err := b.Import(label, priv)
	if err != nil {
		if errors.Is(err, backend.ErrUnsupportedKey) {
			return protocol.KeyID{}, protocol.Errorf(protocol.CodeBadRequest, "importing key %q: %v", label, err)
		}
		return protocol.KeyID{}, protocol.Errorf(protocol.CodeCryptoFailure, "importing key %q into %s: %v", label, b.Name(), err)
	}
	ks, err := s.keys.Load().with(k, b.Name())
	if err != nil {
		return protocol.KeyID{}, protocol.Errorf(protocol.CodeInternal, "%v", err)
	}
	s.keys.Store(ks)
	s.m.keys.Set(float64(len(ks.list)))
	s.log.Info("key imported", "key", k.ID.String(), "label", label, "backend", b.Name())
	return k.ID, nil
}

// Keys lists the keys the server offers.
func (s *Server) Keys() []protocol.KeyInfo {
	ks := s.keys.Load()
	out := make([]protocol.KeyInfo, 0, len(ks.list))
	for _, k := range ks.list {
		out = append(out, protocol.KeyInfo{ID: k.ID, Type: k.Type, Label: k.Label})
	}
	return out
}

// serverConn is one client connection: a reader that decodes frames and starts a
// goroutine per request, and a writer that coalesces answers into few writes.
type serverConn struct {
	s        *Server
	nc       net.Conn
	src      netip.Prefix // the source its handshake counted against
	admitted bool         // past its handshake, counted in Server.authed; under Server.mu
	tc       *tls.Conn
	names    []string          // the certificate's names that client rules match
	serial   *big.Int          // the certificate's serial number, for the deny list
	spki     [sha256.Size]byte // the SHA-256 of its SubjectPublicKeyInfo
	rules    *ruleSet          // the rules grant was found in
	grant    *grant            // what the client may do; the reader's, handed to each request
	denied   bool              // the deny list of rules names the certificate
	limit    *bucket           // the client's rate limiter under rules; nil: none
	peer     string

	out      chan []byte   // encoded answers for the writer
	sem      chan struct{} // in-flight slots
	inFlight sync.WaitGroup
	draining atomic.Bool
}

func (c *serverConn) serve() {
	defer c.s.removeConn(c)
	defer c.nc.Close()

	c.tc = tls.Server(c.nc, c.s.cfg.TLS)
	ctx, cancel := context.WithTimeout(context.Background(), c.s.cfg.Limits.HandshakeTimeout.D())
	err := c.tc.HandshakeContext(ctx)
	cancel()
	if !c.s.handshakeDone(c, err == nil) {
		if err == nil {
			c.s.m.rejections.WithLabelValues(rejectTooManyConns).Inc()
			return
		}
		reason := classifyHandshakeError(err)
		c.s.m.rejections.WithLabelValues(reason).Inc()
		c.s.log.Debug("handshake refused", "remote", c.nc.RemoteAddr().String(), "reason", reason, "err", err)
		return
	}
	c.s.m.conns.Inc()
	defer c.s.m.conns.Dec()
	st := c.tc.ConnectionState()
	leaf := st.PeerCertificates[0]
	c.peer = leaf.Subject.CommonName
	c.names = certNames(leaf)
	c.serial = leaf.SerialNumber
	c.spki = sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	if g, ok := c.currentGrant(); !ok {
		c.refuseDenied()
		return
	} else if g.rule == noRule {
		// Authenticated, but no rule names this client: it may still ping, and every key
		// request is answered not_authorized (and counted) so the client sees why.
		c.s.m.rejections.WithLabelValues(rejectNoRule).Inc()
	}
	c.s.m.handshakes.Inc()
	c.out = make(chan []byte, c.s.cfg.Limits.MaxInFlightPerConn+16)
	c.sem = make(chan struct{}, c.s.cfg.Limits.MaxInFlightPerConn)

	writerDone := make(chan struct{})
	go c.writeLoop(writerDone)
	c.readLoop()
	c.inFlight.Wait() // every started request has queued its answer
	close(c.out)
	<-writerDone
}

// currentGrant returns what the client may do under the rules in force, and false
// when their deny list names its certificate; it looks again only when the rules
// changed. Only the reader calls it.
func (c *serverConn) currentGrant() (*grant, bool) {
	if rs := c.s.rules.Load(); rs != c.rules {
		c.rules, c.grant = rs, rs.grantFor(c.names)
		c.denied = rs.deny.denies(c.serial, c.spki)
		c.limit = rs.limiter(c.grant, c.spki)
	}
	return c.grant, !c.denied
}

// refuseDenied counts and logs a connection closed for its certificate being on the
// deny list.
func (c *serverConn) refuseDenied() {
	c.s.m.rejections.WithLabelValues(rejectDenied).Inc()
	c.s.log.Warn("client certificate on the deny list: connection closed", "peer", c.peer,
		"serial", c.serial.Text(16), "spki_sha256", hex.EncodeToString(c.spki[:]), "remote", c.nc.RemoteAddr().String())
}

// drain stops the reader at its next frame boundary (or at once if it is waiting for
// one); requests already read still get their answers.
func (c *serverConn) drain() {
	c.draining.Store(true)
	c.nc.SetReadDeadline(time.Now())
}

func (c *serverConn) readLoop() {
	br := bufio.NewReaderSize(c.tc, 16<<10)
	hdr := make([]byte, protocol.HeaderLen)
	for {
		if c.draining.Load() {
			return
		}
		c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.Limits.IdleTimeout.D()))
		if c.draining.Load() { // drain may have set its deadline before ours
			return
		}
		h, body, err := protocol.ReadFrame(br, hdr)
		if err != nil {
			var fe *protocol.FrameError
			switch {
			case errors.As(err, &fe):
				c.reject(h.Op, h.ID, fe.Err)
			case errors.Is(err, protocol.ErrTruncated):
				c.reject(h.Op, h.ID, protocol.Errorf(protocol.CodeBadRequest, "%v", err))
			case err == io.EOF || c.draining.Load():
			default:
				c.s.log.Debug("read failed", "peer", c.peer, "err", err)
			}
			return
		}
		start := time.Now()
		req, err := protocol.ParseRequest(h, body)
		if err != nil {
			c.reject(h.Op, h.ID, err.(*protocol.Error))
			continue
		}
		g, ok := c.currentGrant()
		if !ok {
			c.refuseDenied()
			return
		}
		if c.limit != nil && req.Op != protocol.OpPing && req.Op != protocol.OpListKeys && !c.limit.allow(start) {
			c.s.m.rejections.WithLabelValues(rejectRateLimited).Inc()
			c.s.m.op(req.Op, protocol.CodeOverloaded, 0)
			c.out <- protocol.AppendError(nil, req.Op, req.ID,
				protocol.Errorf(protocol.CodeOverloaded, "client rule %q: over its rate limit of %g requests a second", g.rule, g.rate.PerSecond))
			continue
		}
		select {
		case c.sem <- struct{}{}:
		default:
			c.s.m.rejections.WithLabelValues(rejectOverloaded).Inc()
			c.s.m.op(req.Op, protocol.CodeOverloaded, 0)
			c.out <- protocol.AppendError(nil, req.Op, req.ID,
				protocol.Errorf(protocol.CodeOverloaded, "%d requests in flight on this connection", cap(c.sem)))
			continue
		}
		c.inFlight.Add(1)
		c.s.m.inFlight.Inc()
		go c.handle(g, req, start)
	}
}

// reject answers a request that could not be decoded.
func (c *serverConn) reject(op protocol.Op, id uint64, e *protocol.Error) {
	c.s.m.rejections.WithLabelValues(rejectBadRequest).Inc()
	if op.Known() {
		c.s.m.op(op, e.Code, 0)
	}
	c.out <- protocol.AppendError(nil, op, id, e)
}

func (c *serverConn) handle(g *grant, req *protocol.Request, start time.Time) {
	body, err := c.s.serve(g, req, start)
	code := protocol.CodeOf(err)
	var frame []byte
	if err != nil {
		var pe *protocol.Error
		if !errors.As(err, &pe) {
			pe = &protocol.Error{Code: protocol.CodeInternal, Message: err.Error()}
		}
		switch code {
		case protocol.CodeNotAuthorized:
			c.s.m.rejections.WithLabelValues(rejectNotAuthorized).Inc()
		case protocol.CodeDeadlineExceeded:
			c.s.m.rejections.WithLabelValues(rejectDeadline).Inc()
		case protocol.CodeOverloaded:
			c.s.m.rejections.WithLabelValues(rejectBackendBusy).Inc()
		}
		frame = protocol.AppendError(make([]byte, 0, protocol.HeaderLen+len(pe.Message)), req.Op, req.ID, pe)
	} else {
		frame = protocol.AppendResponse(make([]byte, 0, protocol.HeaderLen+len(body)), req.Op, req.ID, body)
	}
	c.s.m.op(req.Op, code, time.Since(start).Seconds())
	c.out <- frame
	c.s.m.inFlight.Dec()
	<-c.sem
	c.inFlight.Done()
}

// writeLoop writes answers as they come, flushing only when no more are queued, so a
// burst of answers leaves in one TLS record and one write.
func (c *serverConn) writeLoop(done chan<- struct{}) {
	defer close(done)
	bw := bufio.NewWriterSize(c.tc, 32<<10)
	failed := false
	for frame := range c.out {
		if failed {
			continue // keep draining so handlers never block
		}
		bw.Write(frame)
		if len(c.out) > 0 && bw.Buffered() < 16<<10 {
			continue
		}
		c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.Limits.WriteTimeout.D()))
		if err := bw.Flush(); err != nil {
			c.s.log.Debug("write failed", "peer", c.peer, "err", err)
			failed = true
			c.nc.Close() // unblocks the reader
		}
	}
}

// serve performs one request, read at start, for a client holding grant g.
func (s *Server) serve(g *grant, req *protocol.Request, start time.Time) ([]byte, error) {
	if !g.allowsOp(req.Op) {
		if req.Op == protocol.OpImportKey {
			return nil, protocol.Errorf(protocol.CodeNotAuthorized, "client rule %q may not import keys", g.rule)
		}
		return nil, protocol.Errorf(protocol.CodeNotAuthorized, "client rule %q may not ask for %s (its ops)", g.rule, req.Op)
	}
	switch req.Op {
	case protocol.OpPing:
		return req.Payload, nil
	case protocol.OpListKeys:
		var infos []protocol.KeyInfo
		for _, k := range s.keys.Load().list {
			if g.allows(k) {
				infos = append(infos, protocol.KeyInfo{ID: k.ID, Type: k.Type, Label: k.Label})
			}
		}
		return protocol.AppendKeyList(nil, infos), nil
	case protocol.OpImportKey:
		id, err := s.Import(req.Label, req.Payload)
		if err != nil {
			return nil, err
		}
		return id[:], nil
	}

	k := s.keys.Load().byID[req.KeyID]
	if k == nil {
		return nil, protocol.Errorf(protocol.CodeKeyNotFound, "no key %s", req.KeyID)
	}
	if !g.allows(k) {
		return nil, protocol.Errorf(protocol.CodeNotAuthorized, "client rule %q may not use key %s", g.rule, req.KeyID.Short())
	}
	if want := opKeyType(req.Op); want != 0 && want != k.Type {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "%s on a %s key", req.Op, k.Type)
	}

	if req.Op == protocol.OpPublicKey {
		return k.spki, nil
	}

	// The backend's turn: not once the client has given up, and not past the wait
	// for a backend session that the server allows.
	deadline, clients := s.backendDeadline(req, start)
	if !time.Now().Before(deadline) {
		return nil, lateError(req, clients, s.cfg.Limits.BackendWait.D())
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var out []byte
	var err error
	switch req.Op {
	case protocol.OpRSASignPKCS1, protocol.OpECDSASign:
		out, err = sign(ctx, k, req.Payload, cryptoHash(req.Hash))
	case protocol.OpRSASignPSS:
		out, err = sign(ctx, k, req.Payload, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: cryptoHash(req.Hash)})
	case protocol.OpEd25519Sign:
		out, err = sign(ctx, k, req.Payload, crypto.Hash(0))
	case protocol.OpRSADecrypt:
		out, err = decrypt(ctx, k, req.Payload, int(req.Param))
	default:
		return nil, protocol.Errorf(protocol.CodeBadRequest, "operation %s not served", req.Op)
	}
	if errors.Is(err, backend.ErrBusy) {
		return nil, lateError(req, clients, s.cfg.Limits.BackendWait.D())
	}
	return out, err
}

// backendDeadline is when a request read at start must have been taken by its
// backend: its client's deadline when it sent one, the server's backend_wait
// otherwise. clients reports the first. A client that says how long it waits is
// waited for: a burst of handshakes that the backend serves within their deadline is
// served whole, where backend_wait shed its tail to be sent again at the back of the
// queue. The work of a request whose client gave up is still never done.
func (s *Server) backendDeadline(req *protocol.Request, start time.Time) (deadline time.Time, clients bool) {
	if req.Timeout > 0 {
		return start.Add(req.Timeout), true
	}
	return start.Add(s.cfg.Limits.BackendWait.D()), false
}

// lateError answers a request the backend could not take before its deadline: the
// client's (deadline_exceeded) or the server's backend_wait (overloaded).
func lateError(req *protocol.Request, clients bool, wait time.Duration) error {
	if clients {
		return protocol.Errorf(protocol.CodeDeadlineExceeded, "request %d: its deadline of %v passed before the backend could take it; dropped", req.ID, req.Timeout)
	}
	return protocol.Errorf(protocol.CodeOverloaded, "request %d: the backend could not take it within backend_wait %v", req.ID, wait)
}

func sign(ctx context.Context, k *keyEntry, msg []byte, opts crypto.SignerOpts) ([]byte, error) {
	var sig []byte
	var err error
	if cs, ok := k.Signer.(backend.ContextSigner); ok {
		sig, err = cs.SignContext(ctx, msg, opts)
	} else {
		sig, err = k.Signer.Sign(rand.Reader, msg, opts)
	}
	if err != nil {
		if errors.Is(err, backend.ErrBusy) {
			return nil, err
		}
		return nil, protocol.Errorf(protocol.CodeCryptoFailure, "signing with key %s: %v", k.ID.Short(), err)
	}
	return sig, nil
}

// decryptWith runs d's decryption, under ctx when d takes one.
func decryptWith(ctx context.Context, d crypto.Decrypter, ct []byte) ([]byte, error) {
	if cd, ok := d.(backend.ContextDecrypter); ok {
		return cd.DecryptContext(ctx, ct, nil)
	}
	return d.Decrypt(rand.Reader, ct, nil)
}

// decrypt performs RSA PKCS #1 v1.5 decryption. With sessionKeyLen > 0 (TLS 1.2 RSA key
// exchange) a padding failure or a plaintext of another length yields sessionKeyLen
// random bytes instead of an error, as rsa.DecryptPKCS1v15SessionKey does, so the
// answer tells an attacker nothing about the padding (Bleichenbacher).
func decrypt(ctx context.Context, k *keyEntry, ct []byte, sessionKeyLen int) ([]byte, error) {
	d, ok := k.Signer.(crypto.Decrypter)
	if !ok {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "key %s cannot decrypt", k.ID.Short())
	}
	if sessionKeyLen > 0 {
		random := make([]byte, sessionKeyLen)
		if _, err := rand.Read(random); err != nil {
			return nil, protocol.Errorf(protocol.CodeInternal, "reading randomness: %v", err)
		}
		pt, err := decryptWith(ctx, d, ct)
		if errors.Is(err, backend.ErrBusy) {
			// Decided before the token saw the ciphertext: it tells nothing about it.
			return nil, err
		}
		if err != nil || len(pt) != sessionKeyLen {
			return random, nil
		}
		return pt, nil
	}
	pt, err := decryptWith(ctx, d, ct)
	if errors.Is(err, backend.ErrBusy) {
		return nil, err
	}
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeCryptoFailure, "decrypting with key %s: %v", k.ID.Short(), err)
	}
	return pt, nil
}

func opKeyType(op protocol.Op) protocol.KeyType {
	switch op {
	case protocol.OpRSASignPKCS1, protocol.OpRSASignPSS, protocol.OpRSADecrypt:
		return protocol.KeyRSA
	case protocol.OpECDSASign:
		return protocol.KeyECDSA
	case protocol.OpEd25519Sign:
		return protocol.KeyEd25519
	}
	return 0
}

func cryptoHash(h protocol.Hash) crypto.Hash {
	switch h {
	case protocol.HashSHA256:
		return crypto.SHA256
	case protocol.HashSHA384:
		return crypto.SHA384
	case protocol.HashSHA512:
		return crypto.SHA512
	}
	return 0
}

// classifyHandshakeError names why a client's TLS handshake failed.
func classifyHandshakeError(err error) string {
	var unknownCA x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &unknownCA):
		return rejectUnknownCA
	case errors.As(err, &invalid):
		return rejectBadClientCert
	case isNoCert(err):
		return rejectNoClientCert
	}
	return rejectHandshake
}

// isNoCert reports a missing client certificate, which crypto/tls reports with this
// text only.
func isNoCert(err error) bool {
	return strings.Contains(err.Error(), "client didn't provide a certificate")
}
