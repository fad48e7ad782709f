// Package client is the L7 tier's side of the keyserver protocol: it keeps a few
// long-lived mutual-TLS connections to each keyserverd, multiplexes many concurrent
// private-key operations over them, and fails over between servers.
//
// A RemoteKey is a crypto.Signer and crypto.Decrypter whose private half lives on the
// keyservers, so tls.Certificate{PrivateKey: key} works unchanged in crypto/tls (TLS
// 1.3) and quic-go: the handshake goroutine blocks on its answer while the connection
// carries other handshakes' requests. One exception: in TLS 1.2, crypto/tls refuses a
// crypto.Decrypter whose public key is not RSA, so ECDSA and Ed25519 certificates
// take RemoteKey.PrivateKey() (or come from Client.TLSCertificate, which does that).
//
// Each connection has one writer goroutine, which coalesces the frames queued by
// concurrent callers into one write, and one reader goroutine, which hands each answer
// to the caller waiting for its request ID; answers come in any order.
//
// A request that fails on one server for a reason another server may not share (a
// broken connection, a timeout, overload, an internal error, a missing key) is retried
// on another server: among those with a connection up, the one with the fewest
// requests in flight, ties broken round-robin, and a server whose health ping went
// unanswered (or where a request's last moments ran out) comes last until it answers
// again. An attempt waits as long as the caller does (its deadline, within Timeout);
// after RequestTimeout its connection is checked by a ping. When every server has been
// tried, and at least one failure was transient, the client pauses ReconnectMin and
// tries them all again, until Config.Timeout. A refusal (not authorized, bad request, crypto
// failure) is returned at once as a *protocol.Error. When every server failed, a
// Config.Fallback key for the operation's key, if any, serves it locally.
//
// Errors are *OpError values that wrap the last attempt's error: match them with
// errors.Is against protocol.ErrNotAuthorized and friends, ErrTimeout,
// ErrUnavailable, ErrConnectionLost or ErrClosed.
package client

import (
	"context"
	"crypto"
	cryptorand "crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tiergate/tiergate/keyserver/protocol"
)

// ALPN is the keyserver protocol's version 1, which the client offers (after
// ALPNDeadline) when Config.TLS names no protocols.
const ALPN = protocol.ALPN

// ALPNDeadline is version 1 with request deadlines: on a connection that negotiated
// it, each request carries the time its caller still waits (the attempt's timeout,
// or less when the context ends sooner), so a keyserver drops work nobody waits for.
const ALPNDeadline = protocol.ALPNDeadline

// Client is a pool of connections to a set of keyservers. It is safe for concurrent
// use.
type Client struct {
	cfg     Config
	tls     *tls.Config
	log     *slog.Logger
	m       *metrics
	servers []*server

	rr      atomic.Uint64 // round-robin start for server choice
	ctx     context.Context
	cancel  context.CancelFunc
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup // slot supervisors

	stateMu sync.Mutex
	stateCh chan struct{} // closed and replaced whenever a slot changes state

	lastFallbackLog atomic.Int64
}

// server is one keyserver and its connection slots.
type server struct {
	idx   int
	addr  string
	slots []*slot
	m     *serverMetrics

	up       atomic.Int32 // connections up
	inflight atomic.Int64 // attempts in flight
	penalty  atomic.Int64 // unix nanoseconds until which the server is avoided
	timeouts atomic.Int32 // attempts timed out since the server last sent a frame

	attempts, failures, dials, dialErrors atomic.Uint64
	dialErr                               atomic.Pointer[string]
}

// answered notes that the server sent a frame: it is alive, lift any penalty.
func (s *server) answered() {
	if s.penalty.Load() != 0 {
		s.penalty.Store(0)
	}
	if s.timeouts.Load() != 0 {
		s.timeouts.Store(0)
	}
}

// timedOut puts the server last in the order of choice for a while: a request timed
// out there. The period starts at base and doubles with each timeout, up to limit,
// until the server sends anything (a health ping's answer, say).
func (s *server) timedOut(base, limit time.Duration) {
	n := min(s.timeouts.Add(1), 16)
	s.penalty.Store(time.Now().Add(min(base<<(n-1), limit)).UnixNano())
}

func (s *server) setDialErr(err error) {
	msg := err.Error()
	s.dialErr.Store(&msg)
}

// pickConn returns the server's live connection with the fewest requests in flight.
func (s *server) pickConn() *conn {
	var best *conn
	var bestN int64
	for _, sl := range s.slots {
		cn := sl.conn.Load()
		if cn == nil {
			continue
		}
		if n := cn.inflight.Load(); best == nil || n < bestN {
			best, bestN = cn, n
		}
	}
	return best
}

// New validates cfg and returns a client that connects to the servers in the
// background: it does not wait for any connection. Requests made before a connection
// is up wait for one (within Timeout).
func New(cfg Config) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Defaults()
	cfg.Fallback = maps.Clone(cfg.Fallback)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("keyserver client: registering metrics: %w", err)
	}
	tc := cfg.TLS.Clone()
	tc.MinVersion = tls.VersionTLS13
	if cfg.ServerName != "" {
		tc.ServerName = cfg.ServerName
	}
	if len(tc.NextProtos) == 0 {
		tc.NextProtos = []string{ALPNDeadline, ALPN}
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		cfg:     cfg,
		tls:     tc,
		log:     cfg.Logger.With("component", "keyserver-client"),
		m:       m,
		ctx:     ctx,
		cancel:  cancel,
		closing: make(chan struct{}),
		stateCh: make(chan struct{}),
	}
	for i, addr := range cfg.Servers {
		s := &server{idx: i, addr: addr, m: m.server(addr)}
		for range cfg.ConnsPerServer {
			s.slots = append(s.slots, &slot{srv: s})
		}
		c.servers = append(c.servers, s)
	}
	for _, s := range c.servers {
		for _, sl := range s.slots {
			c.wg.Add(1)
			go c.runSlot(sl)
		}
	}
	return c, nil
}

// Close fails pending requests with ErrClosed, closes every connection and waits for
// the client's goroutines to end. Later requests fail with ErrClosed.
func (c *Client) Close() error {
	c.once.Do(func() {
		close(c.closing)
		c.cancel()
	})
	c.wg.Wait()
	return nil
}

func (c *Client) isClosed() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// sleep waits d, or less if the client closes; it reports whether the client is open.
func (c *Client) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.closing:
		return false
	}
}

// backoff returns the jittered delay before the n-th (from 1) reconnection attempt.
func (c *Client) backoff(n int) time.Duration {
	d := c.cfg.ReconnectMin.D()
	for i := 1; i < n && d < c.cfg.ReconnectMax.D(); i++ {
		d *= 2
	}
	d = min(d, c.cfg.ReconnectMax.D())
	// Equal jitter: half fixed, half random, so that clients restarted together do not
	// reconnect in lock step.
	return d/2 + rand.N(d/2+1)
}

func (c *Client) setState(s *slot, state int32) {
	if s.state.Swap(state) == state {
		return
	}
	c.stateMu.Lock()
	close(c.stateCh)
	c.stateCh = make(chan struct{})
	c.stateMu.Unlock()
}

func (c *Client) stateChanged() <-chan struct{} {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	return c.stateCh
}

// testHookPickWaiting, when set by a test, runs when exchange finds no connection
// up but one connecting, before it waits for a slot to change state.
var testHookPickWaiting func()

// pick states.
const (
	pickNone    = iota // every untried server is down
	pickServer         // a server with a live connection
	pickWaiting        // no untried server is up, but one is connecting
)

// pick chooses, among the servers not in tried, one with a live connection: the one
// with the fewest attempts in flight, ties broken round-robin, servers that recently
// timed out last.
func (c *Client) pick(tried uint64, now int64) (*server, int) {
	n := uint64(len(c.servers))
	start := c.rr.Add(1)
	var best *server
	var bestScore int64
	waiting := false
	for i := range n {
		s := c.servers[(start+i)%n]
		if tried&(1<<s.idx) != 0 {
			continue
		}
		if s.up.Load() == 0 {
			if !waiting {
				for _, sl := range s.slots {
					if sl.state.Load() == slotConnecting {
						waiting = true
						break
					}
				}
			}
			continue
		}
		score := s.inflight.Load()
		if s.penalty.Load() > now {
			score += 1 << 40
		}
		if best == nil || score < bestScore {
			best, bestScore = s, score
		}
	}
	switch {
	case best != nil:
		return best, pickServer
	case waiting:
		return nil, pickWaiting
	}
	return nil, pickNone
}

// unavailable describes why no server could take a request.
func (c *Client) unavailable() error {
	var b strings.Builder
	for _, s := range c.servers {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(s.addr)
		if p := s.dialErr.Load(); p != nil {
			b.WriteString(": ")
			b.WriteString(*p)
		} else {
			b.WriteString(": not connected")
		}
	}
	return fmt.Errorf("%w (%s)", ErrUnavailable, b.String())
}

// exchange sends req to the keyservers, failing over between them, and returns the
// answer body. The error, if any, is the last attempt's (not yet an *OpError); the
// outcome classifies it and attempts counts the attempts made on servers.
func (c *Client) exchange(ctx context.Context, req *protocol.Request) (body []byte, out outcome, attempts int, err error) {
	if c.isClosed() {
		return nil, outClosed, 0, ErrClosed
	}
	start := time.Now()
	deadline := start.Add(c.cfg.Timeout.D())
	timer := getTimer(c.cfg.Timeout.D())
	defer putTimer(timer)

	var tried uint64
	transient := false // a failure in this round may not recur on a retry
	// The last answer a server gave (overloaded, internal, key not found): when the
	// overall deadline cuts the final attempt short, that answer says more about why
	// the request failed than the timeout does.
	var answer error
	var answerOut outcome
	for {
		now := time.Now()
		remaining := deadline.Sub(now)
		if remaining <= 0 {
			if err == nil {
				err, out = ErrTimeout, outTimeout
			}
			return nil, out, attempts, err
		}
		if ctx.Err() != nil {
			return nil, outCanceled, attempts, ctx.Err()
		}
		s, state := c.pick(tried, now.UnixNano())
		switch state {
		case pickServer:
			if attempts > 0 {
				c.m.failover()
			}
			attempts++
			// The attempt waits as long as its caller does: until the caller's deadline
			// (a TLS handshake's own) or Timeout, whichever comes first. A server busy
			// with a burst answers late but answers; giving up on it at RequestTimeout
			// sent the request to the back of another queue, or of the same one, and
			// failed requests whose caller still waited. The connection is instead
			// checked by a ping after RequestTimeout, and a stalled server's failed ping
			// fails the attempt over.
			budget := remaining
			if d, ok := ctx.Deadline(); ok {
				budget = min(remaining, max(time.Until(d), time.Millisecond))
			}
			timer.Reset(budget)
			body, aerr := c.attempt(ctx, s, req, budget, timer)
			if aerr == nil {
				return body, outcome(protocol.CodeOK), attempts, nil
			}
			o := classify(aerr)
			if o != outCanceled && o != outClosed {
				aerr = &serverError{addr: s.addr, err: aerr}
			}
			err, out = aerr, o
			var pe *protocol.Error
			if errors.As(aerr, &pe) {
				answer, answerOut = err, out
			} else if o == outTimeout && remaining < c.cfg.RequestTimeout.D() && answer != nil {
				err, out = answer, answerOut
			}
			if !o.retryable() {
				return nil, out, attempts, err
			}
			tried |= 1 << s.idx
			if o != outcome(protocol.CodeKeyNotFound) {
				transient = true
			}
			continue

		case pickWaiting:
			if testHookPickWaiting != nil {
				testHookPickWaiting()
			}
			// Take the channel before looking again: a slot that changes state after
			// this closes ch, and one that changed before shows in the second pick.
			// Whatever the second pick finds other than a slot still connecting (one
			// came up, or the last one failed its dial) is decided from the top.
			ch := c.stateChanged()
			if _, st := c.pick(tried, now.UnixNano()); st != pickWaiting {
				continue
			}
			timer.Reset(remaining)
			select {
			case <-ch:
				continue
			case <-timer.C:
				if err == nil {
					err, out = fmt.Errorf("%w: still connecting", ErrTimeout), outTimeout
				}
				return nil, out, attempts, err
			case <-ctx.Done():
				return nil, outCanceled, attempts, ctx.Err()
			case <-c.closing:
				return nil, outClosed, attempts, ErrClosed
			}
		}

		// Every server was tried or is down.
		if err == nil {
			return nil, outUnavailable, attempts, c.unavailable()
		}
		if !transient {
			return nil, out, attempts, err
		}
		// Another round may succeed (a server reconnected, load went down): pause
		// briefly, then try every server again.
		tried, transient = 0, false
		timer.Reset(min(c.cfg.ReconnectMin.D(), remaining))
		select {
		case <-timer.C:
		case <-ctx.Done():
			return nil, outCanceled, attempts, ctx.Err()
		case <-c.closing:
			return nil, outClosed, attempts, ErrClosed
		}
	}
}

// attempt sends req once to s, waiting for its answer at most budget (timer's
// period), which the request carries as its deadline.
func (c *Client) attempt(ctx context.Context, s *server, req *protocol.Request, budget time.Duration, timer *time.Timer) ([]byte, error) {
	cn := s.pickConn()
	if cn == nil {
		return nil, &connLostError{cause: fmt.Errorf("no connection up")}
	}
	s.attempts.Add(1)
	s.inflight.Add(1)
	check := time.Duration(0)
	if budget > c.cfg.RequestTimeout.D() {
		check = c.cfg.RequestTimeout.D()
	}
	body, err := cn.roundTrip(ctx, req, budget, timer, c.closing, false, check)
	s.inflight.Add(-1)
	o := classify(err)
	s.m.attempt(o)
	if err != nil {
		s.failures.Add(1)
		if o == outTimeout && check == 0 {
			c.penalize(s)
			cn.requestPing()
		}
	}
	return body, err
}

// penalize puts s last in the choice of servers (server.timedOut) for
// RequestTimeout, doubling with each timeout in a row up to PingInterval.
func (c *Client) penalize(s *server) {
	s.timedOut(c.cfg.RequestTimeout.D(), max(c.cfg.RequestTimeout.D(), c.cfg.PingInterval.D()))
}

// fallbackOp is the local operation request may run when every server failed.
type fallbackOp struct {
	signer  crypto.Signer
	digest  []byte // or ciphertext
	opts    crypto.SignerOpts
	decrypt bool
	decOpts crypto.DecrypterOpts
}

func (f *fallbackOp) run() ([]byte, error) {
	if !f.decrypt {
		opts := f.opts
		if pss, ok := opts.(*rsa.PSSOptions); ok {
			// What the keyservers do (OpRSASignPSS), whatever salt length was asked.
			opts = &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: pss.Hash}
		}
		return f.signer.Sign(cryptorand.Reader, f.digest, opts)
	}
	d, ok := f.signer.(crypto.Decrypter)
	if !ok {
		return nil, fmt.Errorf("fallback key %T cannot decrypt", f.signer)
	}
	return d.Decrypt(cryptorand.Reader, f.digest, f.decOpts)
}

// request runs req with fail-over and records its metrics; fb, when not nil, is run
// if every server failed with a retryable error.
func (c *Client) request(ctx context.Context, req *protocol.Request, fb *fallbackOp) ([]byte, error) {
	start := time.Now()
	c.m.addInflight(1)
	body, out, attempts, err := c.exchange(ctx, req)
	c.m.addInflight(-1)
	if err != nil && fb != nil && out.retryable() {
		b, ferr := fb.run()
		if ferr == nil {
			c.m.fallback()
			c.m.op(req.Op, outFallback, start)
			c.logFallback(req, err)
			return b, nil
		}
		err = fmt.Errorf("%w; local fallback key failed too: %v", err, ferr)
	}
	c.m.op(req.Op, out, start)
	if err != nil {
		return nil, &OpError{Op: req.Op, Key: req.KeyID, Attempts: attempts, Err: err}
	}
	return body, nil
}

// logFallback logs the use of a fallback key, at most once per 10 seconds.
func (c *Client) logFallback(req *protocol.Request, err error) {
	now := time.Now().UnixNano()
	last := c.lastFallbackLog.Load()
	if now-last < int64(10*time.Second) || !c.lastFallbackLog.CompareAndSwap(last, now) {
		return
	}
	c.log.Warn("keyserver operation served by a local fallback key", "op", req.Op.String(), "key", req.KeyID.Short(), "err", err)
}

// Do sends any request, with fail-over, and returns the answer's body. req.ID is
// ignored (each connection assigns its own), and req is not modified.
func (c *Client) Do(ctx context.Context, req *protocol.Request) ([]byte, error) {
	if err := checkRequest(req); err != nil {
		return nil, &OpError{Op: req.Op, Key: req.KeyID, Err: err}
	}
	return c.request(ctx, req, nil)
}

// checkRequest rejects what no keyserver would accept, before anything is sent.
func checkRequest(req *protocol.Request) error {
	if !req.Op.Known() {
		return protocol.Errorf(protocol.CodeBadRequest, "unknown operation")
	}
	n := len(req.Payload)
	switch {
	case hasKey(req.Op):
		n += protocol.KeyIDLen + 3
	case req.Op == protocol.OpImportKey:
		if len(req.Label) > protocol.MaxLabel {
			return protocol.Errorf(protocol.CodeBadRequest, "label of %d bytes exceeds %d", len(req.Label), protocol.MaxLabel)
		}
		n += 2 + len(req.Label)
	}
	if n > protocol.MaxBody {
		return protocol.Errorf(protocol.CodeBadRequest, "request body of %d bytes exceeds %d", n, protocol.MaxBody)
	}
	return nil
}

// Ping sends a ping to one keyserver (failing over like any request) and checks the
// echo.
func (c *Client) Ping(ctx context.Context) error {
	var payload [8]byte
	binary.BigEndian.PutUint64(payload[:], rand.Uint64())
	req := protocol.Request{Op: protocol.OpPing, Payload: payload[:]}
	body, err := c.request(ctx, &req, nil)
	if err != nil {
		return err
	}
	if string(body) != string(payload[:]) {
		return &OpError{Op: protocol.OpPing, Err: fmt.Errorf("answer does not echo the request")}
	}
	return nil
}

// ListKeys returns the keys one keyserver lets this client use.
func (c *Client) ListKeys(ctx context.Context) ([]protocol.KeyInfo, error) {
	req := protocol.Request{Op: protocol.OpListKeys}
	body, err := c.request(ctx, &req, nil)
	if err != nil {
		return nil, err
	}
	keys, err := protocol.ParseKeyList(body)
	if err != nil {
		return nil, &OpError{Op: protocol.OpListKeys, Err: fmt.Errorf("parsing answer: %w", err)}
	}
	return keys, nil
}

// Import stores a PEM private key under label on one keyserver and returns its ID.
// Servers that share a key store (one HSM cluster) then all offer it; otherwise the
// key must be imported into each.
func (c *Client) Import(ctx context.Context, label string, pemKey []byte) (protocol.KeyID, error) {
	req := protocol.Request{Op: protocol.OpImportKey, Label: label, Payload: pemKey}
	if err := checkRequest(&req); err != nil {
		return protocol.KeyID{}, &OpError{Op: req.Op, Err: err}
	}
	body, err := c.request(ctx, &req, nil)
	if err != nil {
		return protocol.KeyID{}, err
	}
	var id protocol.KeyID
	if len(body) != protocol.KeyIDLen {
		return id, &OpError{Op: req.Op, Err: fmt.Errorf("answer of %d bytes is not a key ID", len(body))}
	}
	copy(id[:], body)
	return id, nil
}

// ServerStats is a snapshot of one keyserver's state as seen by the client.
type ServerStats struct {
	Addr       string
	Conns      int    // connections up
	InFlight   int    // attempts waiting for an answer
	Attempts   uint64 // attempts sent
	Failures   uint64 // attempts that failed (timeout, transport or error answer)
	Dials      uint64 // connection attempts
	DialErrors uint64 // connection attempts that failed
}

// Stats returns a snapshot of every server's state, in Config.Servers order.
func (c *Client) Stats() []ServerStats {
	out := make([]ServerStats, len(c.servers))
	for i, s := range c.servers {
		out[i] = ServerStats{
			Addr:       s.addr,
			Conns:      int(s.up.Load()),
			InFlight:   int(s.inflight.Load()),
			Attempts:   s.attempts.Load(),
			Failures:   s.failures.Load(),
			Dials:      s.dials.Load(),
			DialErrors: s.dialErrors.Load(),
		}
	}
	return out
}

// Healthy reports whether at least one connection to a keyserver is up.
func (c *Client) Healthy() bool {
	for _, s := range c.servers {
		if s.up.Load() > 0 {
			return true
		}
	}
	return false
}
