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
		ln, err := listenTCP("127.0.0.1:0", tc.keepAlive, -1)
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

// TestListenTCPDeferAccept checks the listener's TCP_DEFER_ACCEPT, and that a
// connection that has sent nothing is not accepted while one that has is.
func TestListenTCPDeferAccept(t *testing.T) {
	for _, tc := range []struct {
		deferAccept time.Duration
		want        bool
	}{
		{-1, false},
		{0, false},
		{time.Second, true},
		{2500 * time.Millisecond, true},
	} {
		ln, err := listenTCP("127.0.0.1:0", 0, tc.deferAccept)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := ln.(*net.TCPListener).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var serr error
		raw.Control(func(fd uintptr) {
			v, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_DEFER_ACCEPT)
		})
		if serr != nil {
			t.Fatal(serr)
		}
		// The kernel reports the time its retransmits cover, at least what was set.
		if got := v > 0; got != tc.want || (tc.deferAccept > 2*time.Second && v < 3) {
			t.Errorf("DeferAccept %v: TCP_DEFER_ACCEPT %d", tc.deferAccept, v)
		}
		if tc.want {
			silent, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			talker, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := talker.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			if s.RemoteAddr().String() != talker.LocalAddr().String() {
				t.Errorf("accepted %v first, want the one that sent data (%v), not the silent %v", s.RemoteAddr(), talker.LocalAddr(), silent.LocalAddr())
			}
			s.Close()
			silent.Close()
			talker.Close()
		}
		ln.Close()
	}
}
