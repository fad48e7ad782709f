package sessionsync

import (
	"net"
	"syscall"
)

// socketBuffer is the socket buffer size asked for in each direction: a full sync
// arrives in bursts (FullSyncRate a second, in 2 ms steps) that a receiver busy
// installing must be able to hold for a while.
const socketBuffer = 8 << 20

// setBuffers sets conn's receive and send buffers to n bytes: past the system's
// limits (net.core.rmem_max) when the process may (CAP_NET_ADMIN), else as far as
// they allow.
func setBuffers(conn *net.UDPConn, n int) {
	_ = conn.SetReadBuffer(n)
	_ = conn.SetWriteBuffer(n)
	rc, err := conn.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n)
		_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, n)
	})
}
