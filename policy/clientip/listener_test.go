package clientip

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/internal/config"
)

// The listener tests run over loopback: 127.0.0.1 is the trusted load balancer,
// 127.0.0.2 an untrusted peer.

const (
	lbAddr       = "127.0.0.1"
	strangerAddr = "127.0.0.2"
)

type proxyListener struct {
	*Listener
	accepted chan net.Conn
}

func listen(t *testing.T, cfg Config, o Options) *proxyListener {
	t.Helper()
	inner, err := net.Listen("tcp", lbAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewListenerWithOptions(inner, r, o)
	if err != nil {
		t.Fatal(err)
	}
	pl := &proxyListener{l, make(chan net.Conn, 16)}
	go func() {
		defer close(pl.accepted)
		for {
			c, err := l.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("Accept: %v", err)
				}
				return
			}
			pl.accepted <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for c := range pl.accepted {
			c.Close()
		}
	})
	return pl
}

func proxyConfig(timeout time.Duration) Config {
	return Config{ProxyProtocol: true, ProxyTrusted: []string{lbAddr + "/32"}, ProxyTimeout: config.Duration(timeout)}
}

func (l *proxyListener) dial(t *testing.T, from string) *net.TCPConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

func (l *proxyListener) next(t *testing.T) *Conn {
	t.Helper()
	select {
	case c, ok := <-l.accepted:
		if !ok {
			t.Fatal("listener closed")
		}
		t.Cleanup(func() { c.Close() })
		return c.(*Conn)
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
	}
	return nil
}

func (l *proxyListener) expectNone(t *testing.T) {
	t.Helper()
	select {
	case c := <-l.accepted:
		t.Fatalf("accepted %v from %v", c.RemoteAddr(), c.(*Conn).Peer())
	case <-time.After(50 * time.Millisecond):
	}
}

func (l *proxyListener) waitRejections(t *testing.T, want Rejections) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.Rejections() != want {
		if time.Now().After(deadline) {
			t.Fatalf("rejections %+v, want %+v", l.Rejections(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expectClosed checks that the server closed c without sending anything.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes, %v; want the connection closed", n, err)
	}
}

// stranger connects from the untrusted address, writes what it is given and checks
// that the connection is closed. The reset may come before the dial returns.
func (l *proxyListener) stranger(t *testing.T, data []byte) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(strangerAddr)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatal(err)
		}
		return
	}
	defer c.Close()
	_, _ = c.Write(data)
	expectClosed(t, c)
}

func TestListenerAcceptsTrustedPeers(t *testing.T) {
	l := listen(t, proxyConfig(0), Options{})
	for _, tc := range []struct {
		name       string
		header     []byte
		remote     string // "" = the socket's peer
		local      string // "" = the socket's own address
		wantSource Source
	}{
		{"v1 TCP4", []byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n"), "203.0.113.7:51234", "192.0.2.1:443", SourceProxy},
		{"v1 TCP6", []byte("PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n"), "[2001:db8::7]:51234", "[2001:db8::1]:443", SourceProxy},
		{"v1 TCP6 mapped", []byte("PROXY TCP6 ::ffff:203.0.113.7 ::ffff:192.0.2.1 1 2\r\n"), "203.0.113.7:1", "192.0.2.1:2", SourceProxy},
		{"v1 UNKNOWN", []byte("PROXY UNKNOWN\r\n"), "", "", SourcePacket},
		{"v2 TCP4", v2(0x21, 0x11, ip("203.0.113.7"), ip("192.0.2.1"), port(51234), port(443)), "203.0.113.7:51234", "192.0.2.1:443", SourceProxy},
		{"v2 TCP6 with TLVs", v2(0x21, 0x21, ip("2001:db8::7"), ip("2001:db8::1"), port(1), port(443), tlv(TLVTypeAuthority, "example.com")), "[2001:db8::7]:1", "[2001:db8::1]:443", SourceProxy},
		{"v2 LOCAL", v2(0x20, 0x00), "", "", SourcePacket},
		{"v2 UNSPEC", v2(0x21, 0x00), "", "", SourcePacket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := l.dial(t, lbAddr)
			// The header and the first bytes of the protocol in one segment.
			if _, err := c.Write(append(bytes.Clone(tc.header), "hello"...)); err != nil {
				t.Fatal(err)
			}
			s := l.next(t)
			wantRemote, wantLocal := c.LocalAddr().String(), c.RemoteAddr().String()
			if tc.remote != "" {
				wantRemote, wantLocal = tc.remote, tc.local
			}
			if got := s.RemoteAddr().String(); got != wantRemote {
				t.Errorf("RemoteAddr %s, want %s", got, wantRemote)
			}
			if _, ok := s.RemoteAddr().(*net.TCPAddr); !ok {
				t.Errorf("RemoteAddr is a %T", s.RemoteAddr())
			}
			if got := s.LocalAddr().String(); got != wantLocal {
				t.Errorf("LocalAddr %s, want %s", got, wantLocal)
			}
			if ap, src := s.Remote(); ap.String() != wantRemote || src != tc.wantSource {
				t.Errorf("Remote() = %v, %v; want %s, %v", ap, src, wantRemote, tc.wantSource)
			}
			if got := s.Peer().String(); got != c.LocalAddr().String() {
				t.Errorf("Peer %s, want %s", got, c.LocalAddr())
			}
			if s.ProxyHeader() == nil || s.NetConn() == nil {
				t.Error("no header or no NetConn")
			}
			buf := make([]byte, 5)
			if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "hello" {
				t.Fatalf("read %q, %v", buf, err)
			}
			// The rest of the stream goes through untouched, both ways.
			go func() { _, _ = c.Write([]byte(" world")) }()
			buf = make([]byte, 6)
			if _, err := io.ReadFull(s, buf); err != nil || string(buf) != " world" {
				t.Fatalf("read %q, %v", buf, err)
			}
			if _, err := s.Write([]byte("ok")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf[:2]); err != nil || string(buf[:2]) != "ok" {
				t.Fatalf("client read %q, %v", buf[:2], err)
			}
		})
	}
	if r := l.Rejections(); r.Total() != 0 {
		t.Errorf("rejections %+v", r)
	}
}

// TestListenerHeaderSplit sends the header one byte per segment.
func TestListenerHeaderSplit(t *testing.T) {
	l := listen(t, proxyConfig(0), Options{})
	for _, header := range [][]byte{
		[]byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n"),
		v2(0x21, 0x11, ip("203.0.113.7"), ip("192.0.2.1"), port(51234), port(443), tlv(TLVTypeNoop, "pad")),
	} {
		c := l.dial(t, lbAddr)
		_ = c.SetNoDelay(true)
		for _, b := range append(header, "data"...) {
			if _, err := c.Write([]byte{b}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
		s := l.next(t)
		if got := s.RemoteAddr().String(); got != "203.0.113.7:51234" {
			t.Errorf("RemoteAddr %s", got)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "data" {
			t.Fatalf("read %q, %v", buf, err)
		}
	}
}

func TestListenerRefuses(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := listen(t, proxyConfig(0), Options{Name: "edge", Registerer: reg})
	valid := []byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n")
	var want Rejections

	// A valid header from a peer outside proxy_trusted.
	l.stranger(t, valid)
	want.Untrusted++
	l.waitRejections(t, want)

	c := l.dial(t, lbAddr)
	_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	expectClosed(t, c)
	want.NotProxy++
	l.waitRejections(t, want)

	c = l.dial(t, lbAddr)
	_, _ = c.Write([]byte("\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"))
	expectClosed(t, c)
	want.NotProxy++
	l.waitRejections(t, want)

	c = l.dial(t, lbAddr)
	_, _ = c.Write([]byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234\r\n"))
	expectClosed(t, c)
	want.Malformed++
	l.waitRejections(t, want)

	c = l.dial(t, lbAddr)
	_, _ = c.Write(append([]byte(sig), 0x21, 0x11, 0xff, 0xff)) // 64 KiB announced
	expectClosed(t, c)
	want.Malformed++
	l.waitRejections(t, want)

	// Truncated: half a header, then the peer closes its side.
	c = l.dial(t, lbAddr)
	_, _ = c.Write(v2(0x21, 0x11, ip("203.0.113.7"), ip("192.0.2.1"), port(51234), port(443))[:20])
	_ = c.CloseWrite()
	expectClosed(t, c)
	want.Truncated++
	l.waitRejections(t, want)

	c = l.dial(t, lbAddr)
	_, _ = c.Write(valid[:10])
	_ = c.CloseWrite()
	expectClosed(t, c)
	want.Truncated++
	l.waitRejections(t, want)

	// Closed before sending anything.
	c = l.dial(t, lbAddr)
	c.Close()
	want.Closed++
	l.waitRejections(t, want)

	l.expectNone(t)

	// Accepting goes on.
	c = l.dial(t, lbAddr)
	_, _ = c.Write(valid)
	if got := l.next(t).RemoteAddr().String(); got != "203.0.113.7:51234" {
		t.Errorf("RemoteAddr %s", got)
	}

	got := counterValues(t, reg, "tiergate_clientip_proxy_rejected_total")
	for reason, n := range map[string]float64{
		ReasonUntrusted: 1, ReasonNotProxy: 2, ReasonMalformed: 2, ReasonTruncated: 2, ReasonClosed: 1, ReasonTimeout: 0,
	} {
		if v := got["edge/"+reason]; v != n {
			t.Errorf("%s{listener=edge,reason=%s} = %v, want %v", "tiergate_clientip_proxy_rejected_total", reason, v, n)
		}
	}
}

func counterValues(t *testing.T, g prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetValue())
			}
			out[strings.Join(labels, "/")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestListenerTimeout: a silent trusted peer is refused after ProxyTimeout, and
// does not hold up the peers behind it.
func TestListenerTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	l := listen(t, proxyConfig(timeout), Options{})
	start := time.Now() // before the dial: the listener's clock starts at its accept
	silent := l.dial(t, lbAddr)

	c := l.dial(t, lbAddr)
	_, _ = c.Write([]byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n"))
	if got := l.next(t).RemoteAddr().String(); got != "203.0.113.7:51234" {
		t.Errorf("RemoteAddr %s", got)
	}
	if d := time.Since(start); d >= timeout {
		t.Errorf("the second peer waited %v, behind the silent one", d)
	}

	expectClosed(t, silent)
	if d := time.Since(start); d < timeout {
		t.Errorf("silent peer closed after %v, before the %v timeout", d, timeout)
	}
	l.waitRejections(t, Rejections{Timeout: 1})

	// A header that starts in time but does not finish.
	slow := l.dial(t, lbAddr)
	_, _ = slow.Write([]byte("PROXY TCP4 "))
	expectClosed(t, slow)
	l.waitRejections(t, Rejections{Timeout: 2})
	l.expectNone(t)
}

// TestListenerMaxPending: with one slot, a silent peer delays the next one until it
// times out, then the next one goes through.
func TestListenerMaxPending(t *testing.T) {
	const timeout = 200 * time.Millisecond
	l := listen(t, proxyConfig(timeout), Options{MaxPending: 1})
	silent := l.dial(t, lbAddr)
	time.Sleep(20 * time.Millisecond) // let the silent peer take the slot
	start := time.Now()
	c := l.dial(t, lbAddr)
	_, _ = c.Write([]byte("PROXY UNKNOWN\r\n"))
	s := l.next(t)
	if d := time.Since(start); d < timeout/2 {
		t.Errorf("accepted after %v although the only slot was taken", d)
	}
	if s.RemoteAddr().String() != c.LocalAddr().String() {
		t.Errorf("RemoteAddr %s", s.RemoteAddr())
	}
	expectClosed(t, silent)
	l.waitRejections(t, Rejections{Timeout: 1})
}

func TestListenerClose(t *testing.T) {
	inner, err := net.Listen("tcp", lbAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(proxyConfig(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(inner, r)
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	silent, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	time.Sleep(20 * time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close waits for a silent peer")
	}
	select {
	case err := <-accepted:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept not released by Close")
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Accept after Close: %v", err)
	}
	expectClosed(t, silent)
	if r := l.Rejections(); r.Total() != 0 {
		t.Errorf("shutdown counted as rejections: %+v", r)
	}
	_ = l.Close()
}

// TestListenerInnerClosed: when the inner listener is closed by someone else, Accept
// reports it from then on.
func TestListenerInnerClosed(t *testing.T) {
	inner, err := net.Listen("tcp", lbAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(proxyConfig(0))
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(inner, r)
	defer l.Close()
	inner.Close()
	for range 2 {
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept: %v", err)
		}
	}
}

func TestListenerPassThrough(t *testing.T) {
	inner, err := net.Listen("tcp", lbAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(inner, r)
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n"))
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*net.TCPConn); !ok {
		t.Errorf("without proxy_protocol, Accept returned a %T", s)
	}
	if ap, src := ConnPeer(s); ap.String() != c.LocalAddr().String() || src != SourcePacket {
		t.Errorf("ConnPeer = %v, %v", ap, src)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "PROXY" {
		t.Errorf("the header was touched: %q, %v", buf, err)
	}
}

func TestConnPeer(t *testing.T) {
	l := listen(t, proxyConfig(0), Options{})
	c := l.dial(t, lbAddr)
	_, _ = c.Write([]byte("PROXY TCP6 2001:db8::7 2001:db8::1 51234 443\r\n"))
	s := l.next(t)
	tc := tls.Server(s, &tls.Config{})
	for _, x := range []net.Conn{s, tc} {
		if ap, src := ConnPeer(x); ap != netip.MustParseAddrPort("[2001:db8::7]:51234") || src != SourceProxy {
			t.Errorf("ConnPeer(%T) = %v, %v", x, ap, src)
		}
	}
	if ap, src := ConnPeer(nil); ap.IsValid() || src != SourcePacket {
		t.Errorf("ConnPeer(nil) = %v, %v", ap, src)
	}
}

func TestListenerSharedRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := listen(t, proxyConfig(0), Options{Name: "a", Registerer: reg})
	b := listen(t, proxyConfig(0), Options{Name: "b", Registerer: reg})
	for _, l := range []*proxyListener{a, b, b} {
		l.stranger(t, nil)
	}
	a.waitRejections(t, Rejections{Untrusted: 1})
	b.waitRejections(t, Rejections{Untrusted: 2})
	got := counterValues(t, reg, "tiergate_clientip_proxy_rejected_total")
	if got["a/untrusted"] != 1 || got["b/untrusted"] != 2 {
		t.Errorf("counters %v", got)
	}

	// A conflicting collector under the same name is an error, not a panic.
	bad := prometheus.NewRegistry()
	bad.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "tiergate_clientip_proxy_rejected_total"}))
	inner, err := net.Listen("tcp", lbAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	r, _ := New(proxyConfig(0))
	if _, err := NewListenerWithOptions(inner, r, Options{Registerer: bad}); err == nil {
		t.Error("conflicting registration accepted")
	}
}

// flakyListener fails its first Accept, as a listener out of file descriptors does.
type flakyListener struct {
	net.Listener
	failed bool
}

var errEMFILE = errors.New("accept: too many open files")

func (f *flakyListener) Accept() (net.Conn, error) {
	if !f.failed {
		f.failed = true
		return nil, errEMFILE
	}
	return f.Listener.Accept()
}

func TestListenerAcceptError(t *testing.T) {
	inner, err := net.Listen("tcp", lbAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(proxyConfig(0))
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(&flakyListener{Listener: inner}, r)
	defer l.Close()
	if _, err := l.Accept(); !errors.Is(err, errEMFILE) {
		t.Fatalf("first Accept: %v, want the inner error", err)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("PROXY TCP4 203.0.113.7 192.0.2.1 51234 443\r\n"))
	s, err := l.Accept()
	if err != nil {
		t.Fatalf("Accept after the error: %v", err)
	}
	defer s.Close()
	if s.RemoteAddr().String() != "203.0.113.7:51234" {
		t.Errorf("RemoteAddr %s", s.RemoteAddr())
	}
}

// TestListenerConcurrent: many peers at once, good and bad, each good one accepted
// with its own address.
func TestListenerConcurrent(t *testing.T) {
	const n = 100
	l := listen(t, proxyConfig(2*time.Second), Options{MaxPending: 8})
	errs := make(chan error, n)
	for i := range n {
		go func() {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			if i%2 == 1 {
				_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
				_, err = c.Read(make([]byte, 1))
				if err == nil {
					err = errors.New("bad peer got data")
				} else {
					err = nil
				}
				errs <- err
				return
			}
			h := ProxyHeader{Version: 1 + i%4/2, Command: CommandProxy,
				Src: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), uint16(1000+i)), Dst: ap("203.0.113.1:443")}
			b, _ := h.AppendBinary(nil)
			_, _ = c.Write(b)
			// The server echoes the port it saw.
			buf := make([]byte, 2)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, buf); err != nil {
				errs <- err
				return
			}
			if got := int(buf[0])<<8 | int(buf[1]); got != 1000+i {
				errs <- errors.New("wrong address seen")
				return
			}
			errs <- nil
		}()
	}
	for range n / 2 {
		s := l.next(t)
		ap, src := s.Remote()
		if src != SourceProxy || ap.Addr() != netip.MustParseAddr("198.18.0.1") {
			t.Errorf("Remote() = %v, %v", ap, src)
		}
		_, _ = s.Write([]byte{byte(ap.Port() >> 8), byte(ap.Port())})
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	l.waitRejections(t, Rejections{NotProxy: n / 2})
}
