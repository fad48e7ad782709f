// Package port is the datapath's view of a network port: burst receive and transmit of
// packet buffers on numbered queues, and buffer allocation. It also provides Mem, an
// in-memory port, so every per-packet decision is tested and benchmarked without DPDK.
package port

// Buf is one packet buffer. Data is the whole buffer, headroom included; the frame is
// Data[Off:Off+Len]. Handle identifies the underlying buffer for the port that produced
// it (an mbuf pointer for DPDK, a pool slot for Mem).
//
// A worker keeps a fixed array of Bufs and reuses it every burst, so the datapath does
// not allocate per packet. To prepend a header, lower Off (into the headroom) and raise
// Len; to strip one, raise Off and lower Len.
type Buf struct {
	// Data is the whole buffer, headroom included.
	Data []byte
	// Off is where the frame starts in Data.
	Off int
	// Len is the frame length in bytes.
	Len int
	// Handle identifies the buffer to the port (and pool) it came from.
	Handle uintptr
}

// Frame returns the frame bytes, Data[Off:Off+Len].
func (b *Buf) Frame() []byte { return b.Data[b.Off : b.Off+b.Len] }

// Port is a network port as a datapath worker sees it: burst receive and transmit on
// numbered queues, buffer allocation, and its MAC address.
//
// One goroutine drives each queue; methods for different queues may be called
// concurrently, and Alloc and Free may be called from any goroutine. Buffers are not
// tied to a port: a buffer received on one port may be transmitted on another of the
// same kind.
type Port interface {
	// Name is the port's configured name (for logs and metric labels).
	Name() string
	// MAC is the port's Ethernet address.
	MAC() [6]byte
	// RxQueues is the number of receive queues.
	RxQueues() int
	// TxQueues is the number of transmit queues.
	TxQueues() int
	// RxBurst fills bufs[:n] with received packets (n ≤ len(bufs)) and returns n. The
	// caller owns them until it transmits or frees them.
	RxBurst(queue int, bufs []Buf) int
	// TxBurst transmits bufs, each with the Off and Len the caller set, and returns how
	// many it took, from the front. The rest still belong to the caller, who frees them
	// or retries.
	TxBurst(queue int, bufs []Buf) int
	// Alloc fills bufs with fresh buffers (Off = Headroom(), Len = 0) and returns how many
	// it could allocate.
	Alloc(bufs []Buf) int
	// Free returns bufs to their pool.
	Free(bufs []Buf)
	// Headroom is the Off of a freshly allocated buffer; received frames usually start
	// there too.
	Headroom() int
}
