package l7

import (
	"net"
	"syscall"
	"testing"
	"time"
)

func TestListenTCPKeepAlive(t *testing.T) {
	for _, tc := range []struct {
		keepAlive time.Duration
		on        int
		idle      int
	}{
		{0, 0, 0},
		{45 * time.Second, 1, 45},
	} {
		ln, err := listenTCP("127.0.0.1:0", tc.keepAlive)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := s.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var on, idle int
		var serr error
		raw.Control(func(fd uintptr) {
			on, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
			if serr == nil && on == 1 {
				idle, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
			}
		})
		if serr != nil {
			t.Fatal(serr)
		}
		if on != tc.on || idle != tc.idle {
			t.Errorf("TCPKeepAlive %v: SO_KEEPALIVE %d, TCP_KEEPIDLE %d; want %d, %d", tc.keepAlive, on, idle, tc.on, tc.idle)
		}
		s.Close()
		c.Close()
		ln.Close()
	}
}
