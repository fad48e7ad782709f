//go:build !linux

package sessionsync

import "net"

// socketBuffer is the socket buffer size asked for in each direction.
const socketBuffer = 8 << 20

// setBuffers sets conn's buffers as far as the system allows.
func setBuffers(conn *net.UDPConn, n int) {
	_ = conn.SetReadBuffer(n)
	_ = conn.SetWriteBuffer(n)
}
