//lint:file-ignore SA1019 the TLS 1.2 RSA key exchange is PKCS #1 v1.5 decryption.

package client

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	mrand "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/protocol"
	"github.com/tiergate/tiergate/testkit/testpki"
)

// testKeys are generated once per test binary: RSA key generation is slow under -race.
var testKeys = sync.OnceValue(func() *keySet {
	ks := &keySet{}
	var err error
	if ks.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		panic(err)
	}
	if ks.p256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		panic(err)
	}
	if ks.p384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader); err != nil {
		panic(err)
	}
	if _, ks.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		panic(err)
	}
	return ks
})

type keySet struct {
	rsa  *rsa.PrivateKey
	p256 *ecdsa.PrivateKey
	p384 *ecdsa.PrivateKey
	ed   ed25519.PrivateKey
}

func (ks *keySet) all() []crypto.Signer { return []crypto.Signer{ks.rsa, ks.p256, ks.p384, ks.ed} }

func keyID(t testing.TB, s crypto.Signer) protocol.KeyID {
	t.Helper()
	id, err := backend.KeyIDOf(s.Public())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// testPKI is the mutual-TLS set-up shared by responders and clients.
type testPKI struct {
	ca     *testpki.CA
	server tls.Certificate
	client tls.Certificate
}

var sharedPKI = sync.OnceValue(func() *testPKI {
	ca, err := testpki.NewCA("test keyserver CA")
	if err != nil {
		panic(err)
	}
	srv, err := ca.Leaf("keyserver", "127.0.0.1", "localhost")
	if err != nil {
		panic(err)
	}
	cli, err := ca.Leaf("l7-test")
	if err != nil {
		panic(err)
	}
	return &testPKI{ca: ca, server: srv, client: cli}
})

func (p *testPKI) clientTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.client}, RootCAs: p.ca.Pool()}
}

// responder is a small keyserver for tests: it speaks the protocol over mutual TLS
// and answers with software keys, and can be told to misbehave.
type responder struct {
	t    testing.TB
	tls  *tls.Config
	addr string

	mu    sync.Mutex
	keys  map[protocol.KeyID]crypto.Signer
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup

	maxDelay   atomic.Int64  // each key operation waits a random time up to this (ns)
	delay      atomic.Int64  // and this long besides (ns)
	stall      atomic.Bool   // read requests and never answer (pings included)
	pingDelay  atomic.Int64  // answer pings this late (ns), other requests as they come
	code       atomic.Uint32 // answer key operations with this code when not zero
	wrongPub   atomic.Bool   // answer PublicKey with another key
	fixedSig   atomic.Pointer[[]byte]
	maxPerConn atomic.Int64 // highest number of requests in flight seen on one conn

	accepted  atomic.Int64 // TLS connections accepted
	requests  atomic.Int64 // requests received other than pings
	pings     atomic.Int64
	answered  atomic.Int64      // key operations answered
	ops       [256]atomic.Int64 // requests received by op
	reordered atomic.Int64      // answers written after one with a higher ID
}

func newResponder(t testing.TB, keys ...crypto.Signer) *responder {
	t.Helper()
	p := sharedPKI()
	r := &responder{
		t: t,
		tls: &tls.Config{
			Certificates: []tls.Certificate{p.server},
			ClientCAs:    p.ca.Pool(),
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS13,
		},
		keys:  map[protocol.KeyID]crypto.Signer{},
		conns: map[net.Conn]struct{}{},
	}
	for _, k := range keys {
		r.keys[keyID(t, k)] = k
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(r.close)
	return r
}

func (r *responder) serve(ln net.Listener) {
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns[nc] = struct{}{}
			r.mu.Unlock()
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.serveConn(nc)
				r.mu.Lock()
				delete(r.conns, nc)
				r.mu.Unlock()
				nc.Close()
			}()
		}
	}()
}

// kill closes the listener and every connection, like a crashed server.
func (r *responder) kill() {
	r.mu.Lock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for nc := range r.conns {
		nc.Close()
	}
	r.mu.Unlock()
}

// restart listens again on the same address.
func (r *responder) restart() {
	r.t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", r.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		r.t.Fatalf("relistening on %s: %v", r.addr, err)
	}
	r.serve(ln)
}

func (r *responder) close() {
	r.kill()
	r.wg.Wait()
}

func (r *responder) serveConn(nc net.Conn) {
	tc := tls.Server(nc, r.tls)
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		return
	}
	tc.SetDeadline(time.Time{})
	r.accepted.Add(1)

	done := make(chan struct{})
	out := make(chan []byte, 256)
	var handlers sync.WaitGroup
	var inflight atomic.Int64
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		var last uint64
		var buf []byte
		for {
			var f []byte
			select {
			case f = <-out:
			case <-done:
				return
			}
			buf = buf[:0]
			for {
				id := frameID(f)
				if id < last {
					r.reordered.Add(1)
				}
				last = id
				buf = append(buf, f...)
				if len(buf) > 32<<10 {
					break
				}
				select {
				case f = <-out:
					continue
				default:
				}
				break
			}
			if _, err := tc.Write(buf); err != nil {
				nc.Close()
				return
			}
		}
	}()
	send := func(f []byte) {
		select {
		case out <- f:
		case <-done:
		}
	}

	hdr := make([]byte, protocol.HeaderLen)
	for {
		h, body, err := protocol.ReadFrame(tc, hdr)
		if err != nil {
			break
		}
		req, err := protocol.ParseRequest(h, body)
		if err != nil {
			var pe *protocol.Error
			errors.As(err, &pe)
			send(protocol.AppendError(nil, h.Op, h.ID, pe))
			continue
		}
		if req.Op == protocol.OpPing {
			r.pings.Add(1)
			if r.stall.Load() {
				continue
			}
			f := protocol.AppendResponse(nil, req.Op, req.ID, req.Payload)
			if d := time.Duration(r.pingDelay.Load()); d > 0 {
				handlers.Go(func() {
					select {
					case <-time.After(d):
						send(f)
					case <-done:
					}
				})
				continue
			}
			send(f)
			continue
		}
		r.requests.Add(1)
		r.ops[req.Op].Add(1)
		if r.stall.Load() {
			continue
		}
		n := inflight.Add(1)
		for {
			m := r.maxPerConn.Load()
			if n <= m || r.maxPerConn.CompareAndSwap(m, n) {
				break
			}
		}
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			if d := r.maxDelay.Load(); d > 0 {
				time.Sleep(time.Duration(mrand.Int64N(d)))
			}
			if d := r.delay.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			f := r.answer(req)
			inflight.Add(-1)
			r.answered.Add(1)
			send(f)
		}()
	}
	close(done)
	handlers.Wait()
	<-writerDone
}

func frameID(f []byte) uint64 {
	h, _ := protocol.ParseHeader(f)
	return h.ID
}

func (r *responder) answer(req *protocol.Request) []byte {
	if c := protocol.Code(r.code.Load()); c != protocol.CodeOK && req.Op != protocol.OpPing {
		return protocol.AppendError(nil, req.Op, req.ID, protocol.Errorf(c, "told to answer %s", c))
	}
	body, err := r.do(req)
	if err != nil {
		var pe *protocol.Error
		if !errors.As(err, &pe) {
			pe = protocol.Errorf(protocol.CodeCryptoFailure, "%v", err)
		}
		return protocol.AppendError(nil, req.Op, req.ID, pe)
	}
	return protocol.AppendResponse(nil, req.Op, req.ID, body)
}

func (r *responder) do(req *protocol.Request) ([]byte, error) {
	switch req.Op {
	case protocol.OpListKeys:
		r.mu.Lock()
		var list []protocol.KeyInfo
		for id, k := range r.keys {
			typ, _ := backend.TypeOf(k.Public())
			list = append(list, protocol.KeyInfo{ID: id, Type: typ, Label: "k-" + id.Short()})
		}
		r.mu.Unlock()
		return protocol.AppendKeyList(nil, list), nil
	case protocol.OpImportKey:
		block, _ := pem.Decode(req.Payload)
		if block == nil {
			return nil, protocol.Errorf(protocol.CodeBadRequest, "no PEM block")
		}
		priv, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, protocol.Errorf(protocol.CodeBadRequest, "%v", err)
		}
		s := priv.(crypto.Signer)
		id, err := backend.KeyIDOf(s.Public())
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.keys[id] = s
		r.mu.Unlock()
		return id[:], nil
	}
	r.mu.Lock()
	k := r.keys[req.KeyID]
	r.mu.Unlock()
	if k == nil {
		return nil, protocol.Errorf(protocol.CodeKeyNotFound, "no key %s", req.KeyID.Short())
	}
	if p := r.fixedSig.Load(); p != nil {
		return *p, nil
	}
	hashes := map[protocol.Hash]crypto.Hash{protocol.HashSHA256: crypto.SHA256, protocol.HashSHA384: crypto.SHA384, protocol.HashSHA512: crypto.SHA512}
	switch req.Op {
	case protocol.OpPublicKey:
		pub := k.Public()
		if r.wrongPub.Load() {
			for _, other := range r.keys {
				if keyID(r.t, other) != req.KeyID {
					pub = other.Public()
					break
				}
			}
		}
		return x509.MarshalPKIXPublicKey(pub)
	case protocol.OpRSASignPKCS1, protocol.OpECDSASign:
		return k.Sign(rand.Reader, req.Payload, hashes[req.Hash])
	case protocol.OpRSASignPSS:
		return k.Sign(rand.Reader, req.Payload, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: hashes[req.Hash]})
	case protocol.OpEd25519Sign:
		return k.Sign(rand.Reader, req.Payload, crypto.Hash(0))
	case protocol.OpRSADecrypt:
		priv, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, protocol.Errorf(protocol.CodeBadRequest, "not an RSA key")
		}
		if req.Param == 0 {
			return priv.Decrypt(rand.Reader, req.Payload, nil)
		}
		key := make([]byte, req.Param)
		rand.Read(key)
		if err := rsa.DecryptPKCS1v15SessionKey(nil, priv, req.Payload, key); err != nil {
			return nil, err
		}
		return key, nil
	}
	return nil, protocol.Errorf(protocol.CodeBadRequest, "unsupported op %s", req.Op)
}
