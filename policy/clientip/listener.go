package clientip

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tiergate/tiergate/internal/promreg"
)

// Why a PROXY listener refused a connection: the values of
// tiergate_clientip_proxy_rejected_total{reason}.
const (
	ReasonUntrusted = "untrusted" // the peer is not among ProxyTrusted
	ReasonNotProxy  = "not_proxy" // the connection does not start with a PROXY header
	ReasonMalformed = "malformed" // a PROXY header that breaks the specification or the limits
	ReasonTimeout   = "timeout"   // no complete header within ProxyTimeout
	ReasonTruncated = "truncated" // the peer closed the connection inside the header
	ReasonClosed    = "closed"    // the peer closed or reset the connection before a byte, or another I/O error
)

var reasons = [...]string{ReasonUntrusted, ReasonNotProxy, ReasonMalformed, ReasonTimeout, ReasonTruncated, ReasonClosed}

type reason uint8

const (
	rUntrusted reason = iota
	rNotProxy
	rMalformed
	rTimeout
	rTruncated
	rClosed
)

func reasonOf(err error) reason {
	switch {
	case errors.Is(err, ErrNotProxy):
		return rNotProxy
	case errors.Is(err, ErrMalformed):
		return rMalformed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return rTimeout
	case errors.Is(err, io.ErrUnexpectedEOF):
		return rTruncated
	}
	return rClosed
}

// Rejections counts the connections a Listener refused, by reason.
type Rejections struct {
	Untrusted, NotProxy, Malformed, Timeout, Truncated, Closed uint64
}

// Total is the sum of all reasons.
func (r Rejections) Total() uint64 {
	return r.Untrusted + r.NotProxy + r.Malformed + r.Timeout + r.Truncated + r.Closed
}

// DefaultMaxPending is Options.MaxPending's default.
const DefaultMaxPending = 1024

// Options are a Listener's optional settings.
type Options struct {
	// Name labels the listener in metrics and logs. Default: the inner listener's
	// address.
	Name string

	// Registerer receives tiergate_clientip_proxy_rejected_total{listener,reason}.
	// Several listeners may share one Registerer: the counter is registered once.
	// Default: none.
	Registerer prometheus.Registerer

	// Logger receives a debug line per refused connection. Default slog.Default().
	Logger *slog.Logger

	// MaxPending bounds the connections between the inner Accept and the Listener's
	// Accept: those whose PROXY header is awaited, and those ready but not yet taken.
	// While it is reached, accepting pauses (the kernel's backlog holds new
	// connections). Only ProxyTrusted peers get that far. Default 1024.
	MaxPending int
}

// Listener is a net.Listener that, when its Resolver's ProxyProtocol is on, accepts
// only ProxyTrusted peers and only once they have sent a valid PROXY header, within
// ProxyTimeout. Its connections are *Conn, whose RemoteAddr is the header's source.
// Refused connections are closed and counted, never returned; Accept goes on.
//
// Headers are read by one goroutine per connection (at most Options.MaxPending at
// once), so a slow or silent peer never holds up Accept. Without ProxyProtocol the
// Listener passes the inner listener's connections through untouched.
type Listener struct {
	inner   net.Listener
	r       *Resolver
	proxy   bool
	timeout time.Duration
	name    string
	log     *slog.Logger

	ready   chan *Conn
	errc    chan error    // errors of the inner Accept, to hand to the caller
	done    chan struct{} // closed by Close
	stopped chan struct{} // closed when the accept loop has ended, after stopErr is set
	stopErr error
	sem     chan struct{}
	wg      sync.WaitGroup // the accept loop and the header readers

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex
	pending map[net.Conn]struct{} // connections whose header is being read
	closed  bool

	counts [len(reasons)]atomic.Uint64
	metric [len(reasons)]prometheus.Counter // nil without a Registerer
}

// NewListener wraps inner for r's settings, with default Options.
func NewListener(inner net.Listener, r *Resolver) *Listener {
	l, _ := NewListenerWithOptions(inner, r, Options{}) // fails only on registration
	return l
}

// NewListenerWithOptions wraps inner for r's settings. It fails only when the metric
// cannot be registered.
func NewListenerWithOptions(inner net.Listener, r *Resolver, o Options) (*Listener, error) {
	cfg := r.Config()
	l := &Listener{
		inner:   inner,
		r:       r,
		proxy:   cfg.ProxyProtocol,
		timeout: cfg.ProxyTimeout.D(),
		name:    o.Name,
		log:     o.Logger,
	}
	if l.name == "" {
		l.name = inner.Addr().String()
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	if o.Registerer != nil {
		cv, err := registerRejected(o.Registerer)
		if err != nil {
			return nil, err
		}
		for i, name := range reasons {
			l.metric[i] = cv.WithLabelValues(l.name, name)
		}
	}
	if !l.proxy {
		return l, nil
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	l.ready = make(chan *Conn)
	l.errc = make(chan error)
	l.done = make(chan struct{})
	l.stopped = make(chan struct{})
	l.sem = make(chan struct{}, o.MaxPending)
	l.pending = map[net.Conn]struct{}{}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func registerRejected(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tiergate_clientip_proxy_rejected_total",
		Help: "Connections refused by PROXY protocol listeners, by listener and reason (untrusted, not_proxy, malformed, timeout, truncated, closed).",
	}, []string{"listener", "reason"})
	cv, err := promreg.Register(reg, cv)
	if err != nil {
		return nil, err
	}
	return cv, nil
}

// Accept returns the next connection that passed the PROXY checks.
func (l *Listener) Accept() (net.Conn, error) {
	if !l.proxy {
		return l.inner.Accept()
	}
	select {
	case c := <-l.ready:
		return c, nil
	case err := <-l.errc:
		return nil, err
	case <-l.stopped:
		return nil, l.stopErr
	case <-l.done:
		return nil, l.closedErr()
	}
}

func (l *Listener) closedErr() error {
	return &net.OpError{Op: "accept", Net: l.inner.Addr().Network(), Addr: l.inner.Addr(), Err: net.ErrClosed}
}

// Close closes the inner listener and every connection still sending its header,
// and waits for the goroutines reading headers to end. Connections already
// accepted are left alone.
func (l *Listener) Close() error {
	if !l.proxy {
		return l.inner.Close()
	}
	l.closeOnce.Do(func() {
		close(l.done)
		l.closeErr = l.inner.Close()
		l.mu.Lock()
		l.closed = true
		for c := range l.pending {
			c.Close()
		}
		l.pending = nil
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l.closeErr
}

// Addr is the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Rejections returns the connections refused so far, by reason.
func (l *Listener) Rejections() Rejections {
	c := &l.counts
	return Rejections{
		Untrusted: c[rUntrusted].Load(),
		NotProxy:  c[rNotProxy].Load(),
		Malformed: c[rMalformed].Load(),
		Timeout:   c[rTimeout].Load(),
		Truncated: c[rTruncated].Load(),
		Closed:    c[rClosed].Load(),
	}
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	defer close(l.stopped)
	for {
		c, err := l.inner.Accept()
		if err != nil {
			select {
			case <-l.done:
				l.stopErr = l.closedErr()
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				l.stopErr = err
				return
			}
			// Out of file descriptors and the like: the caller decides whether to back
			// off; the loop resumes when it calls Accept again.
			select {
			case l.errc <- err:
				continue
			case <-l.done:
				l.stopErr = l.closedErr()
				return
			}
		}
		peer := AddrPortOf(c.RemoteAddr())
		if !l.r.ProxyTrusted(peer.Addr()) {
			l.reject(c, peer, rUntrusted, nil)
			continue
		}
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			c.Close()
			l.stopErr = l.closedErr()
			return
		}
		if !l.track(c) {
			<-l.sem
			c.Close()
			continue // Accept fails next, as Close closed the inner listener
		}
		l.wg.Add(1)
		go l.readHeader(c, peer)
	}
}

func (l *Listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.pending[c] = struct{}{}
	return true
}

// untrack reports whether c is still the reader's to finish: false once Close has
// closed it.
func (l *Listener) untrack(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	delete(l.pending, c)
	return true
}

// readHeaderBuffer is the read buffer of a connection while its header is read: a
// version 1 header fits, and a version 2 header's body is read past it.
const readHeaderBuffer = 512

func (l *Listener) readHeader(c net.Conn, peer netip.AddrPort) {
	defer l.wg.Done()
	defer func() { <-l.sem }() // held until the connection is handed over
	err := c.SetReadDeadline(time.Now().Add(l.timeout))
	var h *ProxyHeader
	br := bufio.NewReaderSize(c, readHeaderBuffer)
	if err == nil {
		h, err = ReadProxyHeader(br)
	}
	if err == nil {
		err = c.SetReadDeadline(time.Time{})
	}
	if !l.untrack(c) {
		return // closed by Close
	}
	if err != nil {
		l.reject(c, peer, reasonOf(err), err)
		return
	}
	pc := newConn(c, h, peer, br)
	select {
	case l.ready <- pc:
	case <-l.done:
		c.Close()
	}
}

func (l *Listener) reject(c net.Conn, peer netip.AddrPort, why reason, err error) {
	if tc, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = tc.SetLinger(0) // reset rather than linger in TIME_WAIT
	}
	c.Close()
	l.counts[why].Add(1)
	if m := l.metric[why]; m != nil {
		m.Inc()
	}
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("PROXY protocol connection refused", "listener", l.name, "peer", peer, "reason", reasons[why], "err", err)
	}
}

// AddrPortOf returns a connection address as a netip.AddrPort, IPv4 unmapped; the
// zero AddrPort when it is not an IP address (a Unix socket).
func AddrPortOf(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// Conn is a connection accepted by a PROXY Listener. RemoteAddr is the client the
// PROXY header names (the real peer for LOCAL and address-less headers), LocalAddr
// the destination it names; the socket's own endpoints stay available through Peer
// and NetConn.
type Conn struct {
	net.Conn
	header     *ProxyHeader
	peer       netip.AddrPort
	remote     netip.AddrPort
	source     Source
	remoteAddr net.Addr
	localAddr  net.Addr

	hasRest atomic.Bool
	mu      sync.Mutex
	rest    []byte // bytes read past the header, returned by Read first
}

func newConn(c net.Conn, h *ProxyHeader, peer netip.AddrPort, br *bufio.Reader) *Conn {
	pc := &Conn{Conn: c, header: h, peer: peer, remote: peer, source: SourcePacket}
	pc.remoteAddr = c.RemoteAddr()
	pc.localAddr = c.LocalAddr()
	if h.Command == CommandProxy && h.Src.IsValid() {
		pc.remote = netip.AddrPortFrom(h.Src.Addr().Unmap(), h.Src.Port())
		pc.source = SourceProxy
		pc.remoteAddr = net.TCPAddrFromAddrPort(pc.remote)
		if h.Dst.IsValid() {
			pc.localAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(h.Dst.Addr().Unmap(), h.Dst.Port()))
		}
	}
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		pc.rest = append([]byte(nil), b...)
		pc.hasRest.Store(true)
	}
	return pc
}

// Read reads what followed the PROXY header.
func (c *Conn) Read(p []byte) (int, error) {
	if c.hasRest.Load() {
		c.mu.Lock()
		if len(c.rest) > 0 {
			n := copy(p, c.rest)
			c.rest = c.rest[n:]
			if len(c.rest) == 0 {
				c.rest = nil
				c.hasRest.Store(false)
			}
			c.mu.Unlock()
			return n, nil
		}
		c.mu.Unlock()
	}
	return c.Conn.Read(p)
}

// RemoteAddr is the PROXY header's source, a *net.TCPAddr with IPv4 unmapped, or the
// socket's peer when the header gives no address.
func (c *Conn) RemoteAddr() net.Addr { return c.remoteAddr }

// LocalAddr is the PROXY header's destination (the address the client connected
// to), or the socket's own address when the header gives none.
func (c *Conn) LocalAddr() net.Addr { return c.localAddr }

// Remote is RemoteAddr as a netip.AddrPort, and Source how it was found:
// SourceProxy, or SourcePacket when the header gave no address.
func (c *Conn) Remote() (netip.AddrPort, Source) { return c.remote, c.source }

// Peer is the socket's peer: the proxy that sent the header.
func (c *Conn) Peer() netip.AddrPort { return c.peer }

// ProxyHeader is the header the connection started with.
func (c *Conn) ProxyHeader() *ProxyHeader { return c.header }

// NetConn returns the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// ConnPeer returns the peer of c as a Resolver's FromHeaders wants it: the source of
// its PROXY header (SourceProxy) when c is, or wraps through NetConn methods (as
// *tls.Conn does), a *Conn that got one, else c's remote address (SourcePacket).
func ConnPeer(c net.Conn) (netip.AddrPort, Source) {
	for x := c; x != nil; {
		if pc, ok := x.(*Conn); ok {
			return pc.Remote()
		}
		u, ok := x.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		x = u.NetConn()
	}
	if c == nil {
		return netip.AddrPort{}, SourcePacket
	}
	return AddrPortOf(c.RemoteAddr()), SourcePacket
}

var (
	_ net.Listener = (*Listener)(nil)
	_ net.Conn     = (*Conn)(nil)
)
