package l7

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tiergate/tiergate/keyserver/client"
	"github.com/tiergate/tiergate/keyserver/protocol"
)

// handshake follows one TLS handshake, TCP or QUIC, from the callbacks crypto/tls
// makes during it (which reach it through ClientHelloInfo.Context) to its counting.
type handshake struct {
	start time.Time
	// conn is the TCP connection's clock, which gives a keyserver operation the
	// handshake waits for its deadline; nil for QUIC (none).
	conn *handshakeConn
	// slots are the server's places for a local key's operation.
	slots keySlots

	mu     sync.Mutex
	sig    string // key type of the certificate served
	reason string // failure seen by a callback, if any

	counted atomic.Bool

	// QUIC only: the connection's source and the place it holds (quicHandshaking, …).
	src  source
	quic atomic.Int32
}

type handshakeKey struct{}

func handshakeFrom(ctx context.Context) *handshake {
	hs, _ := ctx.Value(handshakeKey{}).(*handshake)
	return hs
}

func (hs *handshake) fail(reason string) {
	hs.mu.Lock()
	if hs.reason == "" {
		hs.reason = reason
	}
	hs.mu.Unlock()
}

func (hs *handshake) result() (sig, reason string) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	sig = hs.sig
	if sig == "" {
		sig = "none"
	}
	return sig, hs.reason
}

// use notes the certificate chosen for this handshake and returns a copy of it whose
// private key reports its failures here, so a keyserver error or timeout is told apart
// from other handshake failures (crypto/tls keeps only the error's text).
func (hs *handshake) use(cert *tls.Certificate) *tls.Certificate {
	hs.mu.Lock()
	hs.sig = keyType(cert)
	hs.mu.Unlock()
	signer, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return cert
	}
	c := *cert
	rs := &reportingSigner{Signer: signer, hs: hs}
	if d, ok := signer.(crypto.Decrypter); ok {
		c.PrivateKey = &reportingDecrypter{reportingSigner: rs, d: d}
	} else {
		c.PrivateKey = rs
	}
	return &c
}

// keySlots bound the operations of local private keys running at once to the
// server's GOMAXPROCS; the others wait their turn, in order. A full handshake with a
// local RSA key is mostly its signature (1.1 ms for RSA-2048 here, against 0.3 ms
// for the rest), so in a burst the signatures queue here rather than all at once on
// the scheduler's run queues, where every other goroutine (a client's next read, a
// kept-alive request, the handshakes' own answers to their clients) waited behind
// all of them: now it waits behind at most one per core, and the burst's handshakes
// finish in the order they began instead of together at its end. Offloaded keys
// take no slot: their operations wait on the keyserver, not on a core. A nil
// keySlots bounds nothing.
type keySlots chan struct{}

func newKeySlots(n int) keySlots { return make(keySlots, n) }

func (k keySlots) acquire() {
	if k != nil {
		k <- struct{}{}
	}
}

func (k keySlots) release() {
	if k != nil {
		<-k
	}
}

// signLocal signs with a local key in one of slots.
func signLocal(slots keySlots, k crypto.Signer, rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	slots.acquire()
	defer slots.release()
	return k.Sign(rand, digest, opts)
}

// decryptLocal decrypts with a local key in one of slots.
func decryptLocal(slots keySlots, k crypto.Decrypter, rand io.Reader, msg []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	slots.acquire()
	defer slots.release()
	return k.Decrypt(rand, msg, opts)
}

type reportingSigner struct {
	crypto.Signer
	hs *handshake
}

// contextSigner and contextDecrypter are keys whose operations can be bounded by a
// context: the keyserver client's (keyserver/client.RemoteKey).
type contextSigner interface {
	SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error)
}

type contextDecrypter interface {
	DecryptContext(ctx context.Context, ciphertext []byte, opts crypto.DecrypterOpts) ([]byte, error)
}

// context bounds a key operation by its own deadline (HandshakeTimeout from its
// start: see handshakeConn.keyDeadline), which the keyserver client then uses in
// place of its fixed request timeout: in a burst, an operation queued behind a busy
// keyserver is waited for.
func (hs *handshake) context() (context.Context, context.CancelFunc) {
	if hs.conn == nil {
		return context.Background(), func() {}
	}
	return context.WithDeadline(context.Background(), hs.conn.keyDeadline())
}

func (s *reportingSigner) Sign(rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	var sig []byte
	var err error
	if cs, ok := s.Signer.(contextSigner); ok {
		ctx, cancel := s.hs.context()
		sig, err = cs.SignContext(ctx, digest, opts)
		cancel()
	} else {
		sig, err = signLocal(s.hs.slots, s.Signer, rand, digest, opts)
	}
	if err != nil {
		s.hs.fail(classifyKeyError(err))
	}
	return sig, err
}

type reportingDecrypter struct {
	*reportingSigner
	d crypto.Decrypter
}

func (d *reportingDecrypter) Decrypt(rand io.Reader, msg []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	var pt []byte
	var err error
	if cd, ok := d.d.(contextDecrypter); ok {
		ctx, cancel := d.hs.context()
		pt, err = cd.DecryptContext(ctx, msg, opts)
		cancel()
	} else {
		pt, err = decryptLocal(d.hs.slots, d.d, rand, msg, opts)
	}
	if err != nil {
		d.hs.fail(classifyKeyError(err))
	}
	return pt, err
}

// keyType names the key type of a certificate: "rsa", "ecdsa", "ed25519" or "other".
func keyType(cert *tls.Certificate) string {
	var pub crypto.PublicKey
	if s, ok := cert.PrivateKey.(crypto.Signer); ok {
		pub = s.Public()
	} else if cert.Leaf != nil {
		pub = cert.Leaf.PublicKey
	}
	switch pub.(type) {
	case *rsa.PublicKey:
		return "rsa"
	case *ecdsa.PublicKey:
		return "ecdsa"
	case ed25519.PublicKey:
		return "ed25519"
	}
	return "other"
}

// classifyKeyError names a private-key operation's failure.
func classifyKeyError(err error) string {
	if r, ok := keyserverResult(err); ok {
		return r
	}
	return resultKeyserverError
}

// keyserverResult recognises the errors of keyserver/client.
func keyserverResult(err error) (string, bool) {
	var oe *client.OpError
	var pe *protocol.Error
	switch {
	case errors.Is(err, client.ErrTimeout):
		return resultKeyserverTimeout, true
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, client.ErrConnectionLost),
		errors.Is(err, client.ErrClosed), errors.As(err, &oe), errors.As(err, &pe):
		return resultKeyserverError, true
	}
	return "", false
}

// classifyCertError names a GetCertificate failure.
func classifyCertError(err error, isNoCert func(error) bool) string {
	if r, ok := keyserverResult(err); ok {
		return r
	}
	if isNoCert == nil || isNoCert(err) {
		return resultNoCertificate
	}
	return resultOther
}

// classifyTLSError names why a TLS handshake over TCP failed, when no callback did.
// crypto/tls reports most of what it refuses in a ClientHello (after sending the
// alert) as plain errors whose text starts with "tls: ".
func classifyTLSError(err error) string {
	var ne net.Error
	var oe *net.OpError
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &oe) && oe.Op == "remote error":
		return resultClientAlert
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return resultTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return resultClientClosed
	case errors.As(err, &oe) && oe.Op == "local error", errors.As(err, &rh),
		strings.HasPrefix(err.Error(), "tls: "):
		return resultProtocol
	}
	return resultOther
}

// classifyQUICError names why a QUIC handshake failed, from the cause its connection's
// context was cancelled with.
func classifyQUICError(err error) string {
	var te *quic.TransportError
	var ae *quic.ApplicationError
	switch {
	case errors.As(err, new(*quic.HandshakeTimeoutError)), errors.As(err, new(*quic.IdleTimeoutError)):
		return resultTimeout
	case errors.As(err, &te):
		switch {
		case te.Remote && te.ErrorCode.IsCryptoError():
			return resultClientAlert
		case te.Remote:
			return resultClientClosed
		case te.ErrorCode.IsCryptoError():
			return resultProtocol
		}
	case errors.As(err, &ae) && ae.Remote:
		return resultClientClosed
	}
	return resultOther
}

// tlsSource turns the TLS config a listener was given into the configs handshakes use.
// Listeners hold one stable outer config per protocol whose GetConfigForClient asks
// the current snapshot's tlsSource, so Reload swaps certificates for new handshakes
// while session tickets (keyed by the outer config unless the base sets its own keys)
// stay valid.
type tlsSource struct {
	base     *tls.Config
	prepared *tls.Config // base prepared once, when base has no GetConfigForClient
	protos   []string
	minVer   uint16
	isNoCert func(error) bool
}

func newTLSSource(base *tls.Config, protos []string, minVer uint16, isNoCert func(error) bool) *tlsSource {
	src := &tlsSource{base: base, protos: protos, minVer: minVer, isNoCert: isNoCert}
	if base.GetConfigForClient == nil {
		src.prepared = src.prepare(base)
	}
	return src
}

// forClient returns the config for one handshake.
func (src *tlsSource) forClient(chi *tls.ClientHelloInfo) (*tls.Config, error) {
	if src.prepared != nil {
		return src.prepared, nil
	}
	c, err := src.base.GetConfigForClient(chi)
	if err != nil {
		if hs := handshakeFrom(chi.Context()); hs != nil {
			hs.fail(classifyCertError(err, src.isNoCert))
		}
		return nil, err
	}
	if c == nil {
		c = src.base
	}
	return src.prepare(c), nil
}

// prepare clones c with the listener's ALPN protocols and minimum version, and a
// GetCertificate that reports to the handshake which certificate it served or why
// there was none.
func (src *tlsSource) prepare(c *tls.Config) *tls.Config {
	out := c.Clone()
	out.NextProtos = src.protos
	if out.MinVersion < src.minVer {
		out.MinVersion = src.minVer
	}
	out.GetConfigForClient = nil
	// With Certificates set, crypto/tls would skip GetCertificate for a ClientHello
	// without SNI; the wrapper below picks from them instead.
	out.Certificates = nil
	getCert, certs, isNoCert := c.GetCertificate, c.Certificates, src.isNoCert
	out.GetCertificate = func(chi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		hs := handshakeFrom(chi.Context())
		cert, err := pickCertificate(chi, getCert, certs)
		if err != nil {
			if hs != nil {
				hs.fail(classifyCertError(err, isNoCert))
			}
			return nil, err
		}
		if hs == nil {
			return cert, nil
		}
		return hs.use(cert), nil
	}
	return out
}

var errNoCertificates = errors.New("l7: no certificate configured")

// pickCertificate chooses as crypto/tls would: GetCertificate, then the first of
// certs the client supports, then the first of certs.
func pickCertificate(chi *tls.ClientHelloInfo, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), certs []tls.Certificate) (*tls.Certificate, error) {
	if getCert != nil {
		cert, err := getCert(chi)
		if err != nil || cert != nil {
			return cert, err
		}
	}
	if len(certs) == 0 {
		return nil, errNoCertificates
	}
	for i := range certs {
		if chi.SupportsCertificate(&certs[i]) == nil {
			return &certs[i], nil
		}
	}
	return &certs[0], nil
}
