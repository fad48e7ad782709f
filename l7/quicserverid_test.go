package l7

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/tiergate/tiergate/wire"
)

// cidProxy relays UDP between one client and a server and records the connection IDs
// on the wire: the source IDs of the server's long-header packets, and the destination
// IDs of the client's short-header packets (the first wire.ConnIDLen bytes after the first
// byte), the ones a distributor routes by.
type cidProxy struct {
	front *net.UDPConn
	mu    sync.Mutex
	scids [][]byte // server's long-header source IDs
	dcids [][]byte // client's short-header destination IDs (first 8 bytes)
}

func newCIDProxy(t *testing.T, server string) *cidProxy {
	t.Helper()
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	saddr, _ := net.ResolveUDPAddr("udp", server)
	back, err := net.DialUDP("udp", nil, saddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close(); back.Close() })
	p := &cidProxy{front: front}
	var client net.Addr
	var cmu sync.Mutex
	go func() { // client → server
		b := make([]byte, 65536)
		for {
			n, from, err := front.ReadFrom(b)
			if err != nil {
				return
			}
			cmu.Lock()
			client = from
			cmu.Unlock()
			if n > wire.ConnIDLen && b[0]&0x80 == 0 {
				p.mu.Lock()
				p.dcids = append(p.dcids, append([]byte(nil), b[1:1+wire.ConnIDLen]...))
				p.mu.Unlock()
			}
			back.Write(b[:n])
		}
	}()
	go func() { // server → client
		b := make([]byte, 65536)
		for {
			n, err := back.Read(b)
			if err != nil {
				return
			}
			if n > 6 && b[0]&0x80 != 0 {
				if dl := int(b[5]); 6+dl < n {
					if sl := int(b[6+dl]); 7+dl+sl <= n {
						p.mu.Lock()
						p.scids = append(p.scids, append([]byte(nil), b[7+dl:7+dl+sl]...))
						p.mu.Unlock()
					}
				}
			}
			cmu.Lock()
			to := client
			cmu.Unlock()
			front.WriteTo(b[:n], to)
		}
	}()
	return p
}

func TestQUICServerID(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   uint16
	}{
		{"server id", 0x1234},
		{"server id 1", 1},
		{"none", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBackend(t, "b1")
			cfg := baseConfig(t, b.addr)
			cfg.Listeners[0].QUICServerID = tc.id
			ts := startServer(t, cfg)
			px := newCIDProxy(t, ts.addr)
			tr := &http3.Transport{
				TLSClientConfig: ts.clientTLS(),
				Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
					return quic.DialAddrEarly(ctx, px.front.LocalAddr().String(), tc, qc)
				},
			}
			c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			for range 3 {
				if resp, body := get(t, c, "GET", ts.url("/"), ""); resp.StatusCode != 200 {
					t.Fatalf("HTTP/3 through the proxy: %d %s", resp.StatusCode, body)
				}
			}
			// Close while the proxy still relays, so the server sees the connection end.
			tr.Close()
			waitFor(t, "the server's QUIC connection to close", func() bool { return ts.conns(connH3) == 0 })
			px.mu.Lock()
			defer px.mu.Unlock()
			if len(px.scids) == 0 || len(px.dcids) == 0 {
				t.Fatalf("saw %d server source IDs and %d client short-header IDs", len(px.scids), len(px.dcids))
			}
			for _, ids := range [][][]byte{px.scids, px.dcids} {
				for _, id := range ids {
					got, ok := wire.DecodeConnID(id)
					if tc.id == 0 {
						if ok && len(id) == wire.ConnIDLen {
							t.Errorf("without a server ID, connection ID % x decodes to %d", id, got)
						}
						continue
					}
					if !ok || got != tc.id || len(id) != wire.ConnIDLen {
						t.Errorf("connection ID % x: server ID %d, %v; want %d", id, got, ok, tc.id)
					}
				}
			}
		})
	}
}
