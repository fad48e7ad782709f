package l7

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/valyala/fasthttp"

	"github.com/tiergate/tiergate/policy/clientip"
)

// listener serves one ListenerConfig: a TCP socket whose TLS connections go to the
// fasthttp server (HTTP/1.1) or the net/http server (HTTP/2) by ALPN, and a UDP socket
// on the same port for QUIC and HTTP/3.
type listener struct {
	s      *Server
	idx    int
	cfg    ListenerConfig
	log    *slog.Logger
	altSvc []byte // nil without HTTP/3

	tcpTLS  *tls.Config // stable outer configs; see tlsSource
	quicTLS *tls.Config

	tcpLn net.Listener
	udp   *net.UDPConn
	tr    *quic.Transport
	qln   *quic.Listener

	h1  *fasthttp.Server
	h2  *http.Server
	h2q *connQueue
	h3  *http3.Server

	nconns  atomic.Int64  // TCP and QUIC connections past their handshake, against MaxConns
	tcpHS   atomic.Int64  // TCP connections in their TLS handshake, against MaxHandshakes
	quicHS  atomic.Int64  // QUIC handshakes in progress, against MaxHandshakes
	hsDone  atomic.Uint64 // TLS handshakes completed, TCP and QUIC (Server.Served)
	sources *sourceCounts // handshakes in progress by source, against MaxHandshakesPerSource

	mu     sync.Mutex
	conns  map[*tls.Conn]*tcpConn
	closed bool
	connWG sync.WaitGroup // one per tracked TCP connection
	bg     sync.WaitGroup // accept loop and protocol servers
	work   *workers       // goroutines serving TCP connections

	gTLS, gHTTP1, gH2, gH3      prometheus.Gauge
	rejectedMax, rejectedFilter prometheus.Counter
	rejectedHandshakes          prometheus.Counter // MaxHandshakes reached
	rejectedPerSource           prometheus.Counter // MaxHandshakesPerSource reached
	quicRetries                 prometheus.Counter
	reqH1, reqH2, reqH3         prometheus.Counter
}

// Phases of a TCP connection.
const (
	phaseHandshake int32 = iota
	phaseHTTP1
	phaseHTTP2
)

// tcpConn is a tracked TCP connection.
type tcpConn struct {
	l     *listener
	raw   net.Conn
	tc    *tls.Conn // over hsc
	hsc   handshakeConn
	start time.Time
	info  ConnInfo // set once the handshake is done
	gauge prometheus.Gauge
	src   source // the peer, as handshakes are counted by
	// held is the place the connection holds: among the handshakes until its
	// handshake is done, then among MaxConns. Written by the goroutine serving the
	// connection before it hands the connection on.
	held uint8

	phase atomic.Int32
	idle  atomic.Bool // HTTP/1.1: waiting for the next request
}

// Places a tcpConn holds.
const (
	heldHandshake uint8 = iota
	heldNone
	heldConn
)

var drainDeadline = time.Unix(1, 0) // a deadline in the past: reads fail at once

func newListener(s *Server, idx int, cfg ListenerConfig) *listener {
	l := &listener{
		s:       s,
		idx:     idx,
		cfg:     cfg,
		log:     s.log.With("listener", cfg.Name),
		conns:   map[*tls.Conn]*tcpConn{},
		sources: newSourceCounts(),
	}
	m := s.m
	l.gTLS = m.conns.WithLabelValues(cfg.Name, connTLS)
	l.gHTTP1 = m.conns.WithLabelValues(cfg.Name, connHTTP1)
	l.gH2 = m.conns.WithLabelValues(cfg.Name, connH2)
	l.rejectedMax = m.connsRejected.WithLabelValues(cfg.Name, "max_conns")
	l.rejectedFilter = m.connsRejected.WithLabelValues(cfg.Name, "filtered")
	l.rejectedHandshakes = m.connsRejected.WithLabelValues(cfg.Name, "max_handshakes")
	l.rejectedPerSource = m.connsRejected.WithLabelValues(cfg.Name, "handshakes_per_source")
	l.quicRetries = m.quicRetries.WithLabelValues(cfg.Name)
	l.reqH1 = m.requestsByProto.WithLabelValues(cfg.Name, ProtoHTTP1)
	l.reqH2 = m.requestsByProto.WithLabelValues(cfg.Name, ProtoHTTP2)
	if !cfg.DisableHTTP3 {
		l.gH3 = m.conns.WithLabelValues(cfg.Name, connH3)
		l.reqH3 = m.requestsByProto.WithLabelValues(cfg.Name, ProtoHTTP3)
	}

	l.tcpTLS = &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: tcpProtos,
		GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			return l.s.state.Load().listeners[l.idx].tcpTLS.forClient(chi)
		},
	}
	l.quicTLS = &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: quicProtos,
		GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			return l.s.state.Load().listeners[l.idx].quicTLS.forClient(chi)
		},
	}

	fastLog := fastLogger{l.log}
	l.h1 = &fasthttp.Server{
		Handler:      l.serveH1,
		ErrorHandler: l.h1Error,
		ConnState:    l.h1State,
		// ReadTimeout is the time to read a body; a request without one keeps the
		// deadline of its header (ReadHeaderTimeout), saving the deadline's set. A
		// zero RequestConfig leaves the deadline and the server's limits be.
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			if !hasBody(h) {
				return fasthttp.RequestConfig{}
			}
			return fasthttp.RequestConfig{ReadTimeout: cfg.ReadTimeout.D()}
		},
		ReadTimeout:                  cfg.ReadHeaderTimeout.D(),
		WriteTimeout:                 cfg.WriteTimeout.D(),
		IdleTimeout:                  cfg.IdleTimeout.D(),
		ReadBufferSize:               cfg.MaxHeaderBytes,
		MaxRequestBodySize:           cfg.MaxRequestBody,
		StreamRequestBody:            true, // forwarded as it arrives (serveH1)
		Concurrency:                  cfg.MaxConns,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		SecureErrorLogMessage:        true,
		Logger:                       fastLog,
	}

	l.h2q = newConnQueue()
	l.h2 = &http.Server{
		Handler:           l,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout.D(),
		ReadTimeout:       cfg.ReadTimeout.D(),
		IdleTimeout:       cfg.IdleTimeout.D(),
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: cfg.MaxConcurrentStreams,
			WriteByteTimeout:     cfg.WriteTimeout.D(),
		},
		ConnContext: l.h2ConnContext,
		ConnState:   l.h2State,
		ErrorLog:    slog.NewLogLogger(l.log.Handler(), slog.LevelDebug),
	}
	return l
}

var (
	tcpProtos  = []string{"h2", "http/1.1"}
	quicProtos = []string{http3.NextProtoH3}
)

// bind opens the TCP socket and, unless HTTP/3 is off, the UDP socket on the same
// port, then wraps the TCP socket with WrapListener.
func (l *listener) bind() error {
	if err := l.bindSockets(); err != nil {
		return err
	}
	if l.cfg.WrapListener == nil {
		return nil
	}
	wrapped, err := l.cfg.WrapListener(l.tcpLn)
	if err != nil {
		l.closeSockets()
		return fmt.Errorf("l7: listener %q: wrapping the TCP listener: %w", l.cfg.Name, err)
	}
	l.tcpLn = wrapped
	return nil
}

// listenTCP listens on addr; accepted connections get TCP keepalive after
// keepAlive of idle time, or none when it is 0 (Go's default would turn it on), and
// are accepted once they have sent something or deferAccept has passed (none when
// it is not positive; Listener.Defaults makes 0 one second).
func listenTCP(addr string, keepAlive, deferAccept time.Duration) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	if deferAccept > 0 {
		secs := int((deferAccept + time.Second - 1) / time.Second)
		lc.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT, secs)
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("setting TCP_DEFER_ACCEPT: %w", serr)
			}
			return nil
		}
	}
	if keepAlive > 0 {
		lc.KeepAlive = keepAlive
	}
	return lc.Listen(context.Background(), "tcp", addr)
}

// bindSockets opens the sockets. With port 0 the UDP port is the one the kernel gave
// TCP; when another socket holds it over UDP, it tries again with a fresh TCP port.
func (l *listener) bindSockets() error {
	_, port, _ := net.SplitHostPort(l.cfg.Addr)
	for attempt := 1; ; attempt++ {
		tln, err := listenTCP(l.cfg.Addr, l.cfg.TCPKeepAlive.D(), l.cfg.DeferAccept.D())
		if err != nil {
			return fmt.Errorf("l7: listener %q: listening on tcp %s: %w", l.cfg.Name, l.cfg.Addr, err)
		}
		if l.cfg.DisableHTTP3 {
			l.tcpLn = tln
			return nil
		}
		ta := tln.Addr().(*net.TCPAddr)
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ta.IP, Port: ta.Port, Zone: ta.Zone})
		if err == nil {
			l.tcpLn, l.udp = tln, udp
			l.altSvc = []byte(`h3=":` + strconv.Itoa(ta.Port) + `"; ma=86400`)
			return nil
		}
		tln.Close()
		if port != "0" || attempt == 5 {
			return fmt.Errorf("l7: listener %q: listening on udp %s: %w", l.cfg.Name, ta, err)
		}
	}
}

// start serves the bound sockets in the background.
func (l *listener) start() error {
	if l.udp != nil {
		l.tr = &quic.Transport{Conn: l.udp, ConnContext: l.quicConnContext, VerifySourceAddress: l.quicRetry}
		if l.cfg.QUICServerID != 0 {
			l.tr.ConnectionIDGenerator = connIDGenerator{serverID: l.cfg.QUICServerID}
		}
		ln, err := l.tr.Listen(l.quicTLS, &quic.Config{
			// quic-go gives up on a handshake idle for this long, or not done in twice it.
			HandshakeIdleTimeout: l.cfg.HandshakeTimeout.D() / 2,
			MaxIdleTimeout:       l.cfg.IdleTimeout.D(),
			MaxIncomingStreams:   int64(l.cfg.MaxConcurrentStreams),
		})
		if err != nil {
			return fmt.Errorf("l7: listener %q: starting QUIC on %s: %w", l.cfg.Name, l.udp.LocalAddr(), err)
		}
		l.qln = ln
		l.h3 = &http3.Server{
			Handler:        l,
			MaxHeaderBytes: l.cfg.MaxHeaderBytes,
			IdleTimeout:    l.cfg.IdleTimeout.D(),
			ConnContext:    l.h3ConnContext,
			Logger:         l.log,
		}
		l.bg.Go(func() {
			if err := l.h3.ServeListener(quicAccepter{l}); err != nil && !errors.Is(err, http.ErrServerClosed) {
				l.log.Error("HTTP/3 server stopped", "err", err)
			}
		})
	}
	l.bg.Go(func() {
		if err := l.h2.Serve(l.h2q); err != nil && !errors.Is(err, http.ErrServerClosed) {
			l.log.Error("HTTP/2 server stopped", "err", err)
		}
	})
	l.work = newWorkers(l.serveTCP, workerIdle)
	l.bg.Go(l.acceptLoop)
	l.log.Info("serving", "addr", l.tcpLn.Addr().String(), "http3", l.udp != nil)
	return nil
}

// closeSockets releases what bind opened, for a Start that failed.
func (l *listener) closeSockets() {
	if l.tcpLn != nil {
		l.tcpLn.Close()
	}
	if l.udp != nil {
		l.udp.Close()
	}
}

func (l *listener) acquire() bool {
	if l.nconns.Add(1) > int64(l.cfg.MaxConns) {
		l.nconns.Add(-1)
		l.rejectedMax.Inc()
		return false
	}
	return true
}

func (l *listener) release() { l.nconns.Add(-1) }

func (l *listener) acceptLoop() {
	var backoff time.Duration
	for {
		nc, err := l.tcpLn.Accept()
		if err != nil {
			if l.s.draining.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off rather than spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.log.Warn("accept failed", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		peer := clientip.AddrPortOf(nc.RemoteAddr())
		if f := l.s.state.Load().filter; f != nil && !f(l.cfg.Name, peer) {
			l.rejectedFilter.Inc()
			reset(nc)
			continue
		}
		// A handshake that would find MaxConns full when it is done is not begun.
		if l.nconns.Load() >= int64(l.cfg.MaxConns) {
			l.rejectedMax.Inc()
			nc.Close()
			continue
		}
		src := sourceOf(peer.Addr())
		if refused := l.admitHandshake(&l.tcpHS, src); refused != nil {
			refused.Inc()
			reset(nc)
			continue
		}
		c := &tcpConn{l: l, raw: nc, start: time.Now(), gauge: l.gTLS, src: src}
		c.hsc = handshakeConn{Conn: nc, l: l}
		c.tc = tls.Server(&c.hsc, l.tcpTLS)
		if !l.track(c) {
			nc.Close()
			l.handshakeEnded(&l.tcpHS, src)
			continue
		}
		c.gauge.Inc()
		l.work.run(c)
	}
}

func (l *listener) track(c *tcpConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c.tc] = c
	l.connWG.Add(1)
	return true
}

// untrack forgets a connection that has been closed; it may be called more than once.
func (l *listener) untrack(tc *tls.Conn) {
	l.mu.Lock()
	c := l.conns[tc]
	delete(l.conns, tc)
	l.mu.Unlock()
	if c == nil {
		return
	}
	c.gauge.Dec()
	switch c.held {
	case heldHandshake:
		l.handshakeEnded(&l.tcpHS, c.src)
	case heldConn:
		l.release()
	}
	l.connWG.Done()
}

func (l *listener) lookup(tc *tls.Conn) *tcpConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[tc]
}

// serveTCP does the TLS handshake and hands the connection to HTTP/1.1 or HTTP/2.
func (l *listener) serveTCP(c *tcpConn) {
	hs := &handshake{start: c.start, conn: &c.hsc, slots: l.s.keySlots}
	c.hsc.start(c.start, l.cfg.HandshakeTimeout.D())
	if l.s.draining.Load() {
		c.raw.Close()
		l.untrack(c.tc)
		return
	}
	err := c.tc.HandshakeContext(context.WithValue(context.Background(), handshakeKey{}, hs))
	if err != nil {
		l.handshakeFailed(hs, transportTCP, c.tc.ConnectionState().Version, classifyTLSError(err), c.raw.RemoteAddr(), err)
		c.raw.Close()
		l.untrack(c.tc)
		return
	}
	st := c.tc.ConnectionState()
	l.handshakeOK(hs, transportTCP, &st)
	l.handshakeEnded(&l.tcpHS, c.src)
	c.held = heldNone
	if !l.acquire() {
		c.raw.Close()
		l.untrack(c.tc)
		return
	}
	c.held = heldConn
	c.hsc.end()
	remote, source := clientip.ConnPeer(c.raw)
	c.info = ConnInfo{Listener: l.cfg.Name, Remote: remote, Source: source, TLS: &st}
	if l.s.draining.Load() {
		c.tc.Close()
		l.untrack(c.tc)
		return
	}

	c.gauge.Dec()
	if st.NegotiatedProtocol == "h2" {
		c.info.Proto = ProtoHTTP2
		c.gauge = l.gH2
		c.gauge.Inc()
		c.phase.Store(phaseHTTP2)
		if !l.h2q.push(c.tc) {
			c.tc.Close()
			l.untrack(c.tc)
		}
		return // the HTTP/2 server untracks it when it closes (h2State)
	}
	c.info.Proto = ProtoHTTP1
	c.gauge = l.gHTTP1
	c.gauge.Inc()
	c.idle.Store(true)
	c.phase.Store(phaseHTTP1)
	_ = l.h1.ServeConn(&h1Conn{Conn: c.tc, c: c}) // closes the connection
	l.untrack(c.tc)
}

func (l *listener) handshakeOK(hs *handshake, transport string, st *tls.ConnectionState) {
	if hs == nil || !hs.counted.CompareAndSwap(false, true) {
		return
	}
	sig, _ := hs.result()
	if st.DidResume {
		sig = "none" // no signature in a resumed handshake
	}
	l.hsDone.Add(1)
	resumed := boolLabel(st.DidResume)
	l.s.m.handshakes.WithLabelValues(l.cfg.Name, transport, versionLabel(st.Version), resumed, sig, resultOK).Inc()
	l.s.m.handshakeSeconds.WithLabelValues(l.cfg.Name, transport, resumed).Observe(time.Since(hs.start).Seconds())
}

func (l *listener) handshakeFailed(hs *handshake, transport string, version uint16, reason string, remote net.Addr, err error) {
	if !hs.counted.CompareAndSwap(false, true) {
		return
	}
	sig, seen := hs.result()
	if seen != "" {
		reason = seen
	}
	l.s.m.handshakes.WithLabelValues(l.cfg.Name, transport, versionLabel(version), "false", sig, reason).Inc()
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("TLS handshake failed", "remote", fmt.Sprint(remote), "result", reason, "err", err)
	}
}

// h1Conn is a connection served by fasthttp. It is a *tls.Conn, so fasthttp knows
// its requests came over TLS (https URIs). While the server drains, a read deadline
// fasthttp sets on an idle connection (waiting for its next request) is moved to the
// past, so it closes instead of waiting; a request being read is left to finish.
//
// Once a read has failed (the client's close_notify, its FIN, a reset, a timeout),
// Close closes the TCP connection without sending close_notify, as nginx does after
// the peer's: the client has gone or is going, and the alert (a record sealed and a
// write made to a socket whose peer has closed, which answers it with a reset) was a
// tenth of the CPU fasthttp spent on a connection of one request.
//
// Its deadlines are lazy (lazyDeadlines): fasthttp sets a write deadline before each
// response, which the one armed for an earlier response usually covers. fasthttp
// sets them all on the goroutine serving the connection (the HTTP/2 server, which
// sets them from two, keeps the TLS connection's own). What is set under them is
// in the past: shutdown's and h1State's drainDeadline, which stays in force over a
// deadline the lazy layer skips, and crypto/tls's close_notify's last write
// deadline, as the connection closes.
//
// Its read deadline is extended lazily as well as set lazily (lazyDeadlines): fasthttp
// sets the idle deadline (IdleTimeout) after each response and the header deadline
// (ReadHeaderTimeout, shorter) at the next request's first byte, so the deadline
// alternates and each set would reach the runtime. An extension of a deadline still
// armed in the future is only recorded (want); when the armed one fires first, Read
// arms the one recorded and reads again, which the TLS layer allows after a timeout.
// A kept-alive connection whose requests follow each other within the lazy slack
// of ReadHeaderTimeout then sets no deadline in the runtime at all; an idle one is
// woken once, when its header deadline passes, to arm its idle deadline.
type h1Conn struct {
	*tls.Conn
	c        *tcpConn
	lazy     lazyDeadlines
	want     time.Time // the read deadline last set; later than lazy.read when extended lazily
	readDone bool      // a Read failed; fasthttp reads and closes on one goroutine
	reset    error     // a Read found the connection reset by the client
}

func (w *h1Conn) Read(p []byte) (int, error) {
	for {
		n, err := w.Conn.Read(p)
		if err != nil && n == 0 && w.extend(err) {
			continue
		}
		if err != nil {
			w.readDone = true
			if errors.Is(err, syscall.ECONNRESET) {
				w.reset = err
			}
		}
		return n, err
	}
}

// droppedWrites counts the writes dropped after a reset (tests).
var droppedWrites atomic.Int64

// Write fails at once, writing nothing, once a read has found the connection reset:
// the client is gone and nothing can reach it. fasthttp answers a connection whose
// first request failed to arrive with an error response; a client that resets the
// connection after its handshake (one that closes with the session tickets unread,
// as openssl s_time does) would otherwise have the response sealed and written to
// the reset socket, refused with EPIPE and a SIGPIPE delivered to l7d, on each such
// connection.
func (w *h1Conn) Write(p []byte) (int, error) {
	if w.reset != nil {
		droppedWrites.Add(1)
		return 0, w.reset
	}
	return w.Conn.Write(p)
}

// extend reports whether err is the armed read deadline firing before the one set
// (w.want), which it then arms. An idle connection of a draining server is left to
// close: its deadline was moved to the past on purpose.
func (w *h1Conn) extend(err error) bool {
	if w.want.IsZero() || !w.want.After(w.lazy.read) || !timedOut(err) || w.idleDraining() {
		return false
	}
	left := time.Until(w.want)
	if left <= 0 {
		return false
	}
	return w.lazy.setReadLeft(w.Conn, w.want, left) == nil
}

// idleDraining reports a connection with no request in progress on a server that
// is shutting down: its read deadline is drainDeadline.
func (w *h1Conn) idleDraining() bool { return w.c.idle.Load() && w.c.l.s.draining.Load() }

func (w *h1Conn) Close() error {
	if w.readDone {
		return w.c.hsc.Close() // a held response first (handshakeConn.holdNext)
	}
	return w.Conn.Close()
}

func (w *h1Conn) SetReadDeadline(t time.Time) error {
	if w.idleDraining() {
		t = drainDeadline
	}
	w.want = t
	left := until(t)
	// An extension of a deadline armed in the future: Read arms it if that one
	// fires first.
	if a := w.lazy.read; left > 0 && !a.IsZero() && a.Before(t) && a.Sub(t)+left > 0 {
		return nil
	}
	return w.lazy.setReadLeft(w.Conn, t, left)
}

func (w *h1Conn) SetWriteDeadline(t time.Time) error { return w.lazy.setWrite(w.Conn, t) }

func (w *h1Conn) SetDeadline(t time.Time) error { return w.lazy.set(w.Conn, t) }

func (l *listener) h1State(nc net.Conn, st fasthttp.ConnState) {
	w, ok := nc.(*h1Conn)
	if !ok {
		return
	}
	switch st {
	case fasthttp.StateActive:
		w.c.idle.Store(false)
	case fasthttp.StateIdle:
		w.c.idle.Store(true)
		if l.s.draining.Load() {
			_ = w.Conn.SetReadDeadline(drainDeadline)
		}
	}
}

func (l *listener) h2ConnContext(ctx context.Context, nc net.Conn) context.Context {
	if tc, ok := nc.(*tls.Conn); ok {
		if c := l.lookup(tc); c != nil {
			return context.WithValue(ctx, connInfoKey{}, &c.info)
		}
	}
	return ctx
}

func (l *listener) h2State(nc net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	if tc, ok := nc.(*tls.Conn); ok {
		l.untrack(tc)
	}
}

// shutdown stops accepting, lets requests in flight finish and connections close
// within ctx, then closes what is left.
func (l *listener) shutdown(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	conns := make([]*tcpConn, 0, len(l.conns))
	for _, c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()

	l.tcpLn.Close()
	if l.qln != nil {
		l.qln.Close()
	}
	// Handshaking and idle HTTP/1.1 connections close now; those reading or
	// answering a request close after it (Connection: close).
	for _, c := range conns {
		switch c.phase.Load() {
		case phaseHandshake:
			_ = c.raw.SetDeadline(drainDeadline)
		case phaseHTTP1:
			if c.idle.Load() {
				_ = c.raw.SetReadDeadline(drainDeadline)
			}
		}
	}

	var wg sync.WaitGroup
	var h2Err, h3Err error
	wg.Go(func() { h2Err = l.h2.Shutdown(ctx) })
	if l.h3 != nil {
		wg.Go(func() { h3Err = l.h3.Shutdown(ctx) })
	}
	tcpDone := make(chan struct{})
	go func() { l.connWG.Wait(); close(tcpDone) }()

	var err error
	select {
	case <-tcpDone:
	case <-ctx.Done():
		err = fmt.Errorf("l7: listener %q: shutdown deadline passed, connections closed: %w", l.cfg.Name, ctx.Err())
		l.mu.Lock()
		for _, c := range l.conns {
			c.raw.Close()
		}
		l.mu.Unlock()
		l.h2.Close()
	}
	wg.Wait()
	if l.tr != nil {
		l.tr.Close()
	}
	if l.udp != nil {
		l.udp.Close()
	}
	l.bg.Wait()
	if l.work != nil {
		l.work.close()
	}
	if err == nil && h2Err != nil {
		err = fmt.Errorf("l7: listener %q: HTTP/2 shutdown: %w", l.cfg.Name, h2Err)
	}
	if err == nil && h3Err != nil {
		err = fmt.Errorf("l7: listener %q: HTTP/3 shutdown: %w", l.cfg.Name, h3Err)
	}
	return err
}

// reset closes c with a TCP reset rather than a FIN, so a refused peer costs no
// TIME_WAIT state.
func reset(c net.Conn) {
	for x := c; x != nil; {
		if tc, ok := x.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
			break
		}
		u, ok := x.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		x = u.NetConn()
	}
	c.Close()
}

// connQueue is the net.Listener the HTTP/2 server accepts from: connections whose
// handshake chose h2.
type connQueue struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnQueue() *connQueue {
	return &connQueue{ch: make(chan net.Conn), closed: make(chan struct{})}
}

func (q *connQueue) push(c net.Conn) bool {
	select {
	case <-q.closed:
		return false
	default:
	}
	select {
	case q.ch <- c:
		return true
	case <-q.closed:
		return false
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.closed:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.closed) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return queueAddr{} }

type queueAddr struct{}

func (queueAddr) Network() string { return "tls" }
func (queueAddr) String() string  { return "h2" }

// fastLogger sends fasthttp's logs to slog at debug level.
type fastLogger struct{ log *slog.Logger }

func (f fastLogger) Printf(format string, args ...any) {
	f.log.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}
