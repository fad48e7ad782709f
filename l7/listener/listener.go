// Package listener is the model of one L7 listener (an address served over TLS and
// QUIC, with its timeouts and limits): what l7d's file and the control plane's model
// (control/model) hold, in a package of its own that imports nothing of the L7
// server, so that every node that links the model (l4d too) links none of it. The
// l7 package serves it (l7.Listener is this Listener).
package listener

import (
	"net"
	"strconv"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// Listener is the settings of one address served over TCP (TLS 1.2 and 1.3, HTTP/1.1
// and HTTP/2 by ALPN) and, on the same port, UDP (QUIC v1, HTTP/3): the model that
// l7d's file and the control plane hold, with YAML and JSON names. The zero value of
// every field means the default its comment gives; Defaults fills them in and Validate
// checks them, naming fields by path. Only Pool may change on Reload; the others take
// a restart.
type Listener struct {
	// Name identifies the listener in metrics and logs, and names its routing and
	// its blacklist. Required, unique.
	Name string `yaml:"name" json:"name"`

	// Addr is the "ip:port" to listen on, over TCP and, unless DisableHTTP3, UDP on the
	// same port. Port 0 picks a free port (the same for both). Default ":443".
	Addr string `yaml:"addr" json:"addr"`

	// Pool names the backend pool requests on this listener go to, in the simple form
	// of routing (Config.Backends). Required without Config.Routing, refused with it.
	Pool string `yaml:"pool,omitempty" json:"pool,omitempty"`

	// DisableHTTP3 turns the UDP side off: no QUIC listener and no Alt-Svc header.
	// Default false (HTTP/3 on).
	DisableHTTP3 bool `yaml:"disable_http3,omitempty" json:"disable_http3,omitempty"`

	// QUICServerID, when not 0, makes the QUIC side issue 8-byte connection IDs that
	// carry this server ID (1 to 65535) in clear (QUIC-LB's plaintext format), so L4
	// distributors send all of a connection's packets to this node by its connection
	// ID, even after the client's address changes. It must be unique among the nodes
	// behind the same distributors and equal this node's quic_id in their pools.
	// Default 0: quic-go's random connection IDs.
	QUICServerID uint16 `yaml:"quic_server_id,omitempty" json:"quic_server_id,omitempty"`

	// TCPKeepAlive is the idle time after which the kernel probes an accepted TCP
	// connection (TCP keepalive, with Go's default interval and count). Default 0:
	// off, as in nginx and haproxy: IdleTimeout already closes idle connections,
	// and turning keepalive on costs four setsockopt calls per accepted connection,
	// which is measurable on full handshakes.
	TCPKeepAlive config.Duration `yaml:"tcp_keepalive,omitempty" json:"tcp_keepalive,omitempty"`

	// DeferAccept is how long the kernel keeps a new TCP connection that has sent
	// nothing from accept (TCP_DEFER_ACCEPT, in whole seconds): a connection reaches
	// l7d with its ClientHello (or PROXY header) already there, so the first read
	// never waits, which saves a read and a wakeup per connection. A connection still
	// silent after it is accepted then, and HandshakeTimeout runs from there; the
	// client sees its connection open from the start either way. Default 1s; negative
	// turns it off.
	DeferAccept config.Duration `yaml:"defer_accept,omitempty" json:"defer_accept,omitempty"`

	// HandshakeTimeout bounds the TLS handshake over TCP, from accept, counting only
	// the time it waits for the client (time l7d spends on it, computing or queued
	// behind other handshakes for a core or the keyserver, is not counted, to within
	// a sixteenth of the timeout), and the QUIC handshake (which quic-go also gives
	// up when it hears nothing from the client for half of it): a connection that
	// has not finished its handshake by then is closed, and its place among
	// MaxHandshakes freed. An offloaded key's operation gets as long again of its
	// own. Default 5s.
	HandshakeTimeout config.Duration `yaml:"handshake_timeout,omitempty" json:"handshake_timeout,omitempty"`

	// ReadHeaderTimeout bounds reading a request's headers (HTTP/1.1, HTTP/2), and
	// on HTTP/1.1 the wait for the first request of a new connection. Default 10s.
	ReadHeaderTimeout config.Duration `yaml:"read_header_timeout,omitempty" json:"read_header_timeout,omitempty"`

	// ReadTimeout bounds reading a whole request, body included: on HTTP/1.1 from
	// its headers, on HTTP/2 and HTTP/3 from the stream's start (an HTTP/3 stream's
	// own deadline, which the connection's PINGs do not put off). A body not received
	// in time is answered 408, or its stream reset. Default 60s.
	ReadTimeout config.Duration `yaml:"read_timeout,omitempty" json:"read_timeout,omitempty"`

	// WriteTimeout bounds writing a response to a client that stops reading: one
	// response on HTTP/1.1; on HTTP/2 the connection is closed when no byte could be
	// written for this long; on HTTP/3 the request's stream is reset when a part of
	// its response (its headers, or up to 32 KiB of its body) could not be written
	// for this long, whatever the connection's PINGs. Default 30s.
	WriteTimeout config.Duration `yaml:"write_timeout,omitempty" json:"write_timeout,omitempty"`

	// IdleTimeout closes a connection with no request in progress for this long.
	// Default 60s.
	//
	// On HTTP/1.1, ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout
	// are kept as nginx keeps its timers: a deadline already armed that covers a
	// new one within a sixteenth of its time is not set again, so each may end its
	// connection up to a sixteenth of its time late (3.75 s of the default
	// IdleTimeout), never early. A kept-alive request then sets none in the runtime.
	IdleTimeout config.Duration `yaml:"idle_timeout,omitempty" json:"idle_timeout,omitempty"`

	// MaxHeaderBytes bounds a request's header block; beyond it the answer is 431.
	// On HTTP/1.1 it is also the size of the connection's read buffer. At least
	// 1024. Default 64 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes,omitempty" json:"max_header_bytes,omitempty"`

	// MaxConns bounds the connections open on this listener whose handshake is done,
	// TCP and QUIC together; connections still in their handshake have MaxHandshakes
	// instead. When it is reached a new TCP connection is closed at accept, and a QUIC
	// connection whose handshake completes is closed (H3_EXCESSIVE_LOAD), each counted
	// in tiergate_l7_connections_rejected_total{reason="max_conns"}. Default 10000.
	MaxConns int `yaml:"max_conns,omitempty" json:"max_conns,omitempty"`

	// MaxHandshakes bounds the TCP connections of this listener still in their TLS
	// handshake (from accept to its end), and, as a budget of its own, the QUIC
	// connections still in theirs: a client that opens connections and never
	// finishes a handshake takes these places, not those of MaxConns, and only for
	// HandshakeTimeout. Beyond it a new TCP connection is reset at accept and a new
	// QUIC connection refused, counted in
	// tiergate_l7_connections_rejected_total{reason="max_handshakes"}. Default 1000.
	MaxHandshakes int `yaml:"max_handshakes,omitempty" json:"max_handshakes,omitempty"`

	// MaxHandshakesPerSource bounds the handshakes in progress from one source, TCP
	// and QUIC together, a source being an IPv4 address or an IPv6 /64 (the packet's
	// source, or the one a PROXY header names). Beyond it a new TCP connection is
	// reset at accept, counted with reason="handshakes_per_source"; a QUIC connection
	// is sent a Retry (see QUICRetryAbove) unless it has already proved its address,
	// and is then refused and counted likewise. Default 100.
	MaxHandshakesPerSource int `yaml:"max_handshakes_per_source,omitempty" json:"max_handshakes_per_source,omitempty"`

	// QUICRetryAbove is the number of QUIC handshakes in progress on this listener
	// from which a new QUIC connection must first prove its address: it is sent a
	// Retry (RFC 9000 section 8.1.2), costing a real client one round trip and a
	// client with a spoofed source everything, before any TLS work or signature is
	// done for it. A source already at MaxHandshakesPerSource is sent one too. Each
	// Retry is counted in tiergate_l7_quic_retries_total. Negative: always send a
	// Retry. Default 100.
	QUICRetryAbove int `yaml:"quic_retry_above,omitempty" json:"quic_retry_above,omitempty"`

	// MaxConcurrentStreams bounds the requests in flight on one HTTP/2 or HTTP/3
	// connection. Default 250.
	MaxConcurrentStreams int `yaml:"max_concurrent_streams,omitempty" json:"max_concurrent_streams,omitempty"`

	// MaxRequestBody bounds a request body; beyond it the answer is 413 (when the
	// body says its length), or the request fails as the limit is crossed (its
	// forward to the backend is cut and the answer is 413 if none was sent yet).
	// Bodies are forwarded as they arrive, not held whole (see Config.MaxBodyMemory).
	// Default 16 MiB.
	MaxRequestBody int `yaml:"max_request_body,omitempty" json:"max_request_body,omitempty"`
}

// Defaults of Listener.
const (
	DefaultAddr                   = ":443"
	DefaultDeferAccept            = config.Duration(time.Second)
	DefaultHandshakeTimeout       = config.Duration(5 * time.Second)
	DefaultReadHeaderTimeout      = config.Duration(10 * time.Second)
	DefaultReadTimeout            = config.Duration(60 * time.Second)
	DefaultIdleTimeout            = config.Duration(60 * time.Second)
	DefaultWriteTimeout           = config.Duration(30 * time.Second)
	DefaultMaxHeaderBytes         = 64 << 10
	DefaultMaxConns               = 10000
	DefaultMaxHandshakes          = 1000
	DefaultMaxHandshakesPerSource = 100
	DefaultQUICRetryAbove         = 100
	DefaultMaxConcurrentStreams   = 250
	DefaultMaxRequestBody         = 16 << 20
)

// minHeaderBytes is the least MaxHeaderBytes: below it ordinary requests are refused.
const minHeaderBytes = 1024

// Validate checks l's own settings and returns every problem, each a
// *config.FieldError named by its path within l ("addr", "idle_timeout"). Whether
// its Pool exists, and its name is unique, is for the Config it is in to say.
func (l *Listener) Validate() error {
	var ck config.Checker
	if l.Addr != "" {
		if _, port, err := net.SplitHostPort(l.Addr); err != nil {
			ck.Add("addr", err)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			ck.Addf("addr", "address %q: port is not a number from 0 to 65535", l.Addr)
		}
	}
	for _, d := range []struct {
		path string
		v    config.Duration
	}{
		{"tcp_keepalive", l.TCPKeepAlive}, {"handshake_timeout", l.HandshakeTimeout},
		{"read_header_timeout", l.ReadHeaderTimeout}, {"read_timeout", l.ReadTimeout},
		{"write_timeout", l.WriteTimeout}, {"idle_timeout", l.IdleTimeout},
	} {
		if d.v < 0 {
			ck.Addf(d.path, "%v: timeouts must not be negative", d.v)
		}
	}
	for _, n := range []struct {
		path string
		v    int
	}{
		{"max_header_bytes", l.MaxHeaderBytes}, {"max_conns", l.MaxConns},
		{"max_handshakes", l.MaxHandshakes}, {"max_handshakes_per_source", l.MaxHandshakesPerSource},
		{"max_concurrent_streams", l.MaxConcurrentStreams}, {"max_request_body", l.MaxRequestBody},
	} {
		if n.v < 0 {
			ck.Addf(n.path, "%d: limits must not be negative", n.v)
		}
	}
	if l.MaxHeaderBytes > 0 && l.MaxHeaderBytes < minHeaderBytes {
		ck.Addf("max_header_bytes", "%d: below 1 KiB would refuse ordinary requests", l.MaxHeaderBytes)
	}
	return ck.Err()
}

// Defaults fills in the default of every field left zero.
func (l *Listener) Defaults() {
	setDefault(&l.Addr, DefaultAddr)
	setDefault(&l.DeferAccept, DefaultDeferAccept)
	setDefault(&l.HandshakeTimeout, DefaultHandshakeTimeout)
	setDefault(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	setDefault(&l.ReadTimeout, DefaultReadTimeout)
	setDefault(&l.IdleTimeout, DefaultIdleTimeout)
	setDefault(&l.WriteTimeout, DefaultWriteTimeout)
	setDefault(&l.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&l.MaxConns, DefaultMaxConns)
	setDefault(&l.MaxHandshakes, DefaultMaxHandshakes)
	setDefault(&l.MaxHandshakesPerSource, DefaultMaxHandshakesPerSource)
	setDefault(&l.QUICRetryAbove, DefaultQUICRetryAbove)
	setDefault(&l.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	setDefault(&l.MaxRequestBody, DefaultMaxRequestBody)
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
