package l7

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tiergate/tiergate/policy/clientip"
)

var (
	errTooManyConns = errors.New("l7: too many connections")
	errShuttingDown = errors.New("l7: shutting down")
	errFiltered     = errors.New("l7: refused by the accept filter")
)

// quicConnContext is called by quic-go for each new QUIC connection, at its first
// packet, before any TLS work. It applies the AcceptFilter, enforces MaxConns and
// starts following the handshake: the context it returns reaches the TLS callbacks,
// and is cancelled when the connection ends or its handshake fails, which is when a
// failure is counted. A refused connection gets CONNECTION_REFUSED.
func (l *listener) quicConnContext(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
	if l.s.draining.Load() {
		return nil, errShuttingDown
	}
	if f := l.s.state.Load().filter; f != nil && !f(l.cfg.Name, clientip.AddrPortOf(ci.RemoteAddr)) {
		l.rejectedFilter.Inc()
		return nil, errFiltered
	}
	if !l.acquire() {
		return nil, errTooManyConns
	}
	l.gH3.Inc()
	hs := &handshake{start: time.Now()}
	ctx = context.WithValue(ctx, handshakeKey{}, hs)
	context.AfterFunc(ctx, func() {
		l.gH3.Dec()
		l.release()
		if !hs.counted.Load() {
			cause := context.Cause(ctx)
			l.handshakeFailed(hs, tls.VersionTLS13, classifyQUICError(cause), ci.RemoteAddr, cause)
		}
	})
	return ctx, nil
}

// quicAccepter is the listener the HTTP/3 server accepts from: it counts each
// connection's handshake as it comes out of quic-go's listener, handshake complete.
type quicAccepter struct{ l *listener }

func (a quicAccepter) Accept(ctx context.Context) (*quic.Conn, error) {
	c, err := a.l.qln.Accept(ctx)
	if err != nil {
		return nil, err
	}
	st := c.ConnectionState().TLS
	a.l.handshakeOK(handshakeFrom(c.Context()), &st)
	return c, nil
}

func (a quicAccepter) Addr() net.Addr { return a.l.qln.Addr() }
func (a quicAccepter) Close() error   { return a.l.qln.Close() }

// h3ConnContext attaches the connection's ConnInfo to the context of its requests.
func (l *listener) h3ConnContext(ctx context.Context, c *quic.Conn) context.Context {
	st := c.ConnectionState().TLS
	info := &ConnInfo{Listener: l.cfg.Name, Proto: ProtoHTTP3, Remote: clientip.AddrPortOf(c.RemoteAddr()), TLS: &st}
	return context.WithValue(ctx, connInfoKey{}, info)
}
