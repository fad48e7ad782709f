package dpdk

import (
	"errors"
	"math"
	"syscall"
)

const (
	// MaxBurst is the most packets one RxBurst returns, and the chunk TxBurst hands to
	// the driver at a time.
	MaxBurst = 256
	// DefaultDesc is the ring size of a queue when PortConfig leaves it 0.
	DefaultDesc = 1024
	// Headroom is the headroom DPDK leaves in front of a fresh mbuf's data
	// (RTE_PKTMBUF_HEADROOM).
	Headroom = 128
	// DefaultDataRoom is the data room of an mbuf when NewMempool is given 0: 2048
	// bytes of packet plus Headroom (RTE_MBUF_DEFAULT_BUF_SIZE).
	DefaultDataRoom = 2048 + Headroom
	// LcoreAny is the lcore ID of a thread that is not an lcore (LCORE_ID_ANY).
	LcoreAny = math.MaxUint32
)

// PortConfig is how OpenPort sets a port up. The zero value is one RX and one TX queue
// of DefaultDesc descriptors, not promiscuous, MTU left as the driver has it.
type PortConfig struct {
	// RxQueues is the number of receive queues (0: 1).
	RxQueues int
	// TxQueues is the number of transmit queues (0: 1).
	TxQueues int
	// RxDesc is the number of descriptors per receive queue (0: DefaultDesc), adjusted
	// to the driver's limits.
	RxDesc uint16
	// TxDesc is the number of descriptors per transmit queue (0: DefaultDesc), adjusted
	// to the driver's limits.
	TxDesc uint16
	// Promiscuous makes the port receive frames for any destination MAC.
	Promiscuous bool
	// MTU is set before the port starts (0: leave it).
	MTU int
}

// Stats are a port's basic counters (rte_eth_stats) plus the binding's own. Drivers
// fill what they know: the null and ring drivers count packets but not bytes.
type Stats struct {
	// RxPackets and RxBytes count frames received.
	RxPackets, RxBytes uint64
	// TxPackets and TxBytes count frames transmitted.
	TxPackets, TxBytes uint64
	// RxMissed counts frames the device dropped because a receive queue was full.
	RxMissed uint64
	// RxErrors counts erroneous frames received.
	RxErrors uint64
	// TxErrors counts frames the device failed to transmit.
	TxErrors uint64
	// RxNoMbuf counts receive mbuf allocation failures.
	RxNoMbuf uint64
	// MultiSeg counts multi-segment packets RxBurst dropped.
	MultiSeg uint64
}

// Errno is a DPDK or system error number as DPDK functions report it. It matches the
// syscall.Errno of the same value under errors.Is.
type Errno int

// DPDK's own error numbers (rte_errno.h), above the system ones.
const (
	errSecondary Errno = 1001 // E_RTE_SECONDARY
	errNoConfig  Errno = 1002 // E_RTE_NO_CONFIG
)

// Error returns the error's text, as rte_strerror has it.
func (e Errno) Error() string {
	switch e {
	case errSecondary:
		return "Invalid call in secondary process"
	case errNoConfig:
		return "Missing rte_config structure"
	}
	return syscall.Errno(e).Error()
}

// Is reports whether target is the syscall.Errno with the same number.
func (e Errno) Is(target error) bool {
	t, ok := target.(syscall.Errno)
	return ok && int(t) == int(e)
}

// Sentinel errors.
var (
	// ErrUnavailable is returned by Init when the package was built without DPDK
	// (without cgo, or with the nodpdk build tag).
	ErrUnavailable = errors.New("dpdk: built without DPDK (needs cgo and libdpdk-dev; not built with -tags nodpdk)")
	// ErrInitialized is returned by Init after its first call.
	ErrInitialized = errors.New("dpdk: EAL already initialised (once per process)")
	// ErrNotInitialized is returned when the EAL is not (or no longer) initialised.
	ErrNotInitialized = errors.New("dpdk: EAL not initialised")
	// ErrPortOpen is returned by OpenPort for a port that is already open.
	ErrPortOpen = errors.New("dpdk: port already open")
	// ErrStarted is returned by Start on a started port.
	ErrStarted = errors.New("dpdk: port already started")
	// ErrClosed is returned by the methods of a closed Port.
	ErrClosed = errors.New("dpdk: port closed")
)
