package l7

import (
	"context"
	"crypto/tls"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tiergate/tiergate/internal/config"
)

// captureClientHello returns the first TLS record a Go client sends: its ClientHello.
func captureClientHello(t *testing.T) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		defer a.Close()
		_ = tls.Client(a, &tls.Config{ServerName: "localhost", NextProtos: tcpProtos}).Handshake()
	}()
	_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// captureQUICInitial returns the first datagram a quic-go client sends: its Initial.
func captureQUICInitial(t *testing.T) []byte {
	t.Helper()
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		conn, err := quic.DialAddr(ctx, sink.LocalAddr().String(),
			&tls.Config{ServerName: "localhost", NextProtos: quicProtos}, nil)
		if err == nil {
			conn.CloseWithError(0, "")
		}
	}()
	_ = sink.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 2048)
	n, _, err := sink.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestGarbage sends both ports what a scanner, a fuzzer or a broken client would:
// random bytes, truncated and corrupted ClientHellos and QUIC Initials, connections
// that send nothing. Every TCP connection must be closed within the handshake timeout,
// every QUIC attempt given up, and real requests served afterwards.
func TestGarbage(t *testing.T) {
	const handshakeTimeout = 500 * time.Millisecond
	b := startBackend(t, "b1")
	cfg := baseConfig(t, b.addr)
	cfg.Listeners[0].HandshakeTimeout = config.Duration(handshakeTimeout)
	ts := startServer(t, cfg)
	r := rand.New(rand.NewPCG(1, 2))
	hello := captureClientHello(t)

	var payloads [][]byte
	for _, n := range []int{1, 3, 5, 64, 517, 4096} {
		payloads = append(payloads, randomBytes(r, n))
	}
	for _, n := range []int{1, 5, 6, 9, 43, len(hello) / 2, len(hello) - 1} {
		payloads = append(payloads, hello[:n])
	}
	for range 8 {
		bad := append([]byte(nil), hello...)
		for range 1 + r.IntN(4) {
			i := 5 + r.IntN(len(bad)-5)
			bad[i] ^= byte(1 + r.IntN(255))
		}
		payloads = append(payloads, bad)
	}
	huge := append([]byte(nil), hello...)
	huge[3], huge[4] = 0xff, 0xff // a record longer than what follows
	payloads = append(payloads, huge, nil /* a connection that sends nothing */)

	var wg sync.WaitGroup
	for i, p := range payloads {
		for _, halfClose := range []bool{false, true} {
			wg.Go(func() {
				c, err := net.Dial("tcp", ts.addr)
				if err != nil {
					t.Errorf("payload %d: %v", i, err)
					return
				}
				defer c.Close()
				if len(p) > 0 {
					if _, err := c.Write(p); err != nil {
						return // already closed by the server
					}
				}
				if halfClose {
					_ = c.(*net.TCPConn).CloseWrite()
				}
				wait := handshakeTimeout + time.Second
				if len(p) == 0 && !halfClose {
					// Accepted only when the default DeferAccept (1s) has passed.
					wait += time.Second
				}
				if err := readClosed(c, wait); err != nil {
					t.Errorf("TCP payload %d (%d bytes, half-closed %v): %v", i, len(p), halfClose, err)
				}
			})
		}
	}

	initial := captureQUICInitial(t)
	var datagrams [][]byte
	for _, n := range []int{0, 1, 7, 20, 1200, 1500} {
		datagrams = append(datagrams, randomBytes(r, n))
	}
	for range 16 {
		d := randomBytes(r, 1200)
		d[0] = 0xc0 | d[0]&0x0f             // long header, Initial
		d[1], d[2], d[3], d[4] = 0, 0, 0, 1 // QUIC v1
		datagrams = append(datagrams, d)
	}
	for _, n := range []int{1, 5, 6, 22, 100, len(initial) / 2, len(initial) - 1} {
		datagrams = append(datagrams, initial[:n])
	}
	for range 16 {
		bad := append([]byte(nil), initial...)
		i := r.IntN(len(bad))
		bad[i] ^= byte(1 + r.IntN(255))
		datagrams = append(datagrams, bad)
	}
	// A valid Initial, replayed from a socket that never answers: a half-open QUIC
	// connection the server must give up on.
	datagrams = append(datagrams, initial)
	udpAddr, _ := net.ResolveUDPAddr("udp", ts.addr)
	for i, d := range datagrams {
		wg.Go(func() {
			c, err := net.DialUDP("udp", nil, udpAddr)
			if err != nil {
				t.Errorf("datagram %d: %v", i, err)
				return
			}
			defer c.Close()
			_, _ = c.Write(d)
			// Drain whatever the server answers for a while, without answering back.
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			buf := make([]byte, 2048)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		})
	}
	wg.Wait()

	waitFor(t, "every garbage connection to be closed", func() bool {
		return ts.l().nconns.Load() == 0 && ts.conns(connTLS) == 0 && ts.conns(connH3) == 0
	})
	if n := ts.handshakeCount(t, map[string]string{"result": "ok"}); n != 0 {
		t.Errorf("%v garbage handshakes succeeded", n)
	}
	if n := ts.handshakeCount(t, map[string]string{"result": "timeout"}); n == 0 {
		t.Errorf("no handshake timeout counted")
	}
	for _, proto := range []string{"1.1", "2", "3"} {
		resp, body := get(t, ts.client(t, proto), "GET", ts.url("/after-garbage"), "")
		if resp.StatusCode != http.StatusOK {
			t.Errorf("HTTP/%s after the garbage: %d %s", proto, resp.StatusCode, body)
		}
	}
}
