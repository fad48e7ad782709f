package l7d

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tiergate/tiergate/testkit/netns"
)

// TestRunWithTunnel runs l7d with a tunnel section in an "l7" namespace; the test plays
// the LD from an "ld" namespace: a TCP SYN to the VIP, GRE-encapsulated, is answered
// with a SYN-ACK from the listener, encapsulated back to the LD. On shutdown the
// tunnel's device and rules go away.
func TestRunWithTunnel(t *testing.T) {
	ldNS, l7NS := netns.New(t, "ld"), netns.New(t, "l7")
	netns.Veth(t, ldNS, "eth0", l7NS, "eth0")
	ldNS.Addr("eth0", "198.18.1.1/24")
	l7NS.Addr("eth0", "198.18.1.11/24")

	dir := t.TempDir()
	testCert(t, dir)
	cfg := `
listeners: [{name: web, addr: "203.0.113.10:8443", pool: app, quic_server_id: 7}]
backends: {app: {members: ["127.0.0.1:9"]}}
certificates: {certificates: [{name: www, cert_file: ` + filepath.Join(dir, "www.pem") + `, key_file: ` + filepath.Join(dir, "www.key") + `}]}
admin_listen: "127.0.0.1:9241"
log_level: error
tunnel: {device: tgd0, vips: [203.0.113.10], lds: [198.18.1.1], local: 198.18.1.11, table: 4244}
`
	path := filepath.Join(dir, "l7d.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{Path: path, Stderr: io.Discard}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l7NS.Do(func() error { return d.Run(ctx) }) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("l7d: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("l7d did not stop")
		}
	}
	t.Cleanup(stop)

	// Up once the listener answers on the VIP from inside the namespace.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := l7NS.Do(func() error {
			c, err := net.DialTimeout("tcp", "203.0.113.10:8443", 200*time.Millisecond)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("l7d stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("l7d never listened on the VIP: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out := l7NS.MustRun("ip", "rule", "show"); !strings.Contains(out, "lookup 4244") {
		t.Fatalf("no tunnel rule:\n%s", out)
	}

	var fd int
	ldNS.MustDo(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_GRE); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(int64(3 * time.Second))
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	defer unix.Close(fd)
	client := netip.MustParseAddrPort("198.18.0.50:40000")
	vip := netip.MustParseAddrPort("203.0.113.10:8443")
	syn := append([]byte{0, 0, 0x08, 0x00}, synPacket(client, vip)...)
	if err := unix.Sendto(fd, syn, 0, &unix.SockaddrInet4{Addr: [4]byte{198, 18, 1, 11}}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("no SYN-ACK from l7d through the tunnel: %v", err)
		}
		p := buf[:n]
		hl := int(p[0]&0x0f) * 4
		if n < hl+4+40 || binary.BigEndian.Uint16(p[hl+2:]) != 0x0800 {
			continue
		}
		inner := p[hl+4:]
		tcp := inner[20:]
		if netip.AddrFrom4([4]byte(inner[12:16])) == vip.Addr() && netip.AddrFrom4([4]byte(inner[16:20])) == client.Addr() &&
			binary.BigEndian.Uint16(tcp[2:]) == client.Port() && tcp[13]&0x12 == 0x12 {
			break
		}
	}

	stop()
	if out := l7NS.MustRun("ip", "rule", "show"); strings.Contains(out, "lookup 4244") {
		t.Fatalf("tunnel rule left after shutdown:\n%s", out)
	}
	if _, err := l7NS.Run("ip", "link", "show", "tgd0"); err == nil {
		t.Fatal("tunnel device left after shutdown")
	}
}

// synPacket is an IPv4 TCP SYN from src to dst with valid checksums.
func synPacket(src, dst netip.AddrPort) []byte {
	p := make([]byte, 40)
	p[0], p[8], p[9] = 0x45, 64, unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(p[2:], 40)
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(p[12:], s4[:])
	copy(p[16:], d4[:])
	binary.BigEndian.PutUint16(p[10:], csum(p[:20], 0))
	tcp := p[20:]
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 1000)
	tcp[12], tcp[13] = 5<<4, 0x02
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	pseudo := uint32(binary.BigEndian.Uint16(s4[:2])) + uint32(binary.BigEndian.Uint16(s4[2:])) +
		uint32(binary.BigEndian.Uint16(d4[:2])) + uint32(binary.BigEndian.Uint16(d4[2:])) + unix.IPPROTO_TCP + 20
	binary.BigEndian.PutUint16(tcp[16:], csum(tcp, pseudo))
	return p
}

func csum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
