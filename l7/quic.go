package l7

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/policy/clientip"
)

var (
	errTooManyHandshakes = errors.New("l7: too many handshakes")
	errShuttingDown      = errors.New("l7: shutting down")
	errFiltered          = errors.New("l7: refused by the accept filter")
)

// States of a QUIC connection, in handshake.quic: which place it holds.
const (
	quicHandshaking int32 = iota // one among MaxHandshakes and its source's
	quicEstablished              // one among MaxConns
	quicEnded                    // none
)

// quicRetry is quic-go's VerifySourceAddress: it is asked about each new QUIC
// connection that has not proved its address yet (no token), before anything else,
// and answers whether to send a Retry instead of starting a handshake: always with a
// negative QUICRetryAbove, else once the listener has QUICRetryAbove handshakes in
// progress or the source its MaxHandshakesPerSource. A spoofed source never sees the
// Retry, so it costs no signature and holds no place.
func (l *listener) quicRetry(addr net.Addr) bool {
	above := l.cfg.QUICRetryAbove
	if above >= 0 && l.quicHS.Load() < int64(above) &&
		l.sources.count(sourceOf(clientip.AddrPortOf(addr).Addr())) < l.cfg.MaxHandshakesPerSource {
		return false
	}
	l.quicRetries.Inc()
	return true
}

// quicConnContext is called by quic-go for each new QUIC connection, at its first
// packet (after a Retry, if one was sent), before any TLS work. It applies the
// AcceptFilter, takes a handshake place (MaxHandshakes, MaxHandshakesPerSource) and
// starts following the handshake: the context it returns reaches the TLS callbacks,
// and is cancelled when the connection ends or its handshake fails, which is when a
// failure is counted and its place given back. A refused connection gets
// CONNECTION_REFUSED.
func (l *listener) quicConnContext(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
	if l.s.draining.Load() {
		return nil, errShuttingDown
	}
	peer := clientip.AddrPortOf(ci.RemoteAddr)
	if f := l.s.state.Load().filter; f != nil && !f(l.cfg.Name, peer) {
		l.rejectedFilter.Inc()
		return nil, errFiltered
	}
	src := sourceOf(peer.Addr())
	if refused := l.admitHandshake(&l.quicHS, src); refused != nil {
		refused.Inc()
		return nil, errTooManyHandshakes
	}
	l.gH3.Inc()
	hs := &handshake{start: time.Now(), src: src, slots: l.s.keySlots}
	ctx = context.WithValue(ctx, handshakeKey{}, hs)
	context.AfterFunc(ctx, func() {
		l.gH3.Dec()
		switch hs.quic.Swap(quicEnded) {
		case quicHandshaking:
			l.handshakeEnded(&l.quicHS, src)
		case quicEstablished:
			l.release()
		}
		if !hs.counted.Load() {
			cause := context.Cause(ctx)
			l.handshakeFailed(hs, transportQUIC, tls.VersionTLS13, classifyQUICError(cause), ci.RemoteAddr, cause)
		}
	})
	return ctx, nil
}

// quicAccepter is the listener the HTTP/3 server accepts from: it counts each
// connection's handshake as it comes out of quic-go's listener, handshake complete,
// and moves it from its handshake place to one among MaxConns, or closes it when
// there is none.
type quicAccepter struct{ l *listener }

func (a quicAccepter) Accept(ctx context.Context) (*quic.Conn, error) {
	for {
		c, err := a.l.qln.Accept(ctx)
		if err != nil {
			return nil, err
		}
		hs := handshakeFrom(c.Context())
		st := c.ConnectionState().TLS
		a.l.handshakeOK(hs, transportQUIC, &st)
		if hs == nil || a.l.established(hs) {
			return c, nil
		}
		_ = c.CloseWithError(quic.ApplicationErrorCode(http3.ErrCodeExcessiveLoad), "too many connections")
	}
}

// established moves a QUIC connection whose handshake is done from its handshake
// place to one among MaxConns; it reports false, the connection to be closed, when
// MaxConns is reached or the connection has ended meanwhile.
func (l *listener) established(hs *handshake) bool {
	if !l.acquire() {
		if hs.quic.CompareAndSwap(quicHandshaking, quicEnded) {
			l.handshakeEnded(&l.quicHS, hs.src)
		}
		return false
	}
	if !hs.quic.CompareAndSwap(quicHandshaking, quicEstablished) {
		l.release()
		return false
	}
	l.handshakeEnded(&l.quicHS, hs.src)
	return true
}

func (a quicAccepter) Addr() net.Addr { return a.l.qln.Addr() }
func (a quicAccepter) Close() error   { return a.l.qln.Close() }

// h3ConnContext attaches the connection's ConnInfo to the context of its requests.
func (l *listener) h3ConnContext(ctx context.Context, c *quic.Conn) context.Context {
	st := c.ConnectionState().TLS
	info := &ConnInfo{Listener: l.cfg.Name, Proto: ProtoHTTP3, Remote: clientip.AddrPortOf(c.RemoteAddr()), TLS: &st}
	return context.WithValue(ctx, connInfoKey{}, info)
}
