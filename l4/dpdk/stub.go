//go:build !cgo || nodpdk

package dpdk

import "github.com/tiergate/tiergate/l4/port"

// This file gives the package its API when it is built without DPDK: Init reports
// ErrUnavailable, everything else ErrNotInitialized or nothing, so code that uses the
// package builds (and its DPDK-free parts test) on hosts without libdpdk.

// Init reports ErrUnavailable: the package was built without DPDK.
func Init(args []string) error { return ErrUnavailable }

// Cleanup reports ErrNotInitialized.
func Cleanup() error { return ErrNotInitialized }

// AttachDevice reports ErrNotInitialized.
func AttachDevice(devargs string) error { return ErrNotInitialized }

// LcoreCount returns 0.
func LcoreCount() int { return 0 }

// Lcores returns nil.
func Lcores() []uint { return nil }

// MainLcore returns LcoreAny.
func MainLcore() uint { return LcoreAny }

// LcoreID returns LcoreAny.
func LcoreID() uint { return LcoreAny }

// RegisterThread reports ErrNotInitialized.
func RegisterThread() (lcore uint, err error) { return LcoreAny, ErrNotInitialized }

// UnregisterThread does nothing.
func UnregisterThread() {}

// Mempool is a pool of mbufs; without DPDK none can be made.
type Mempool struct{}

// NewMempool reports ErrNotInitialized.
func NewMempool(name string, n, cacheSize, dataRoomSize uint, socket int) (*Mempool, error) {
	return nil, ErrNotInitialized
}

// Name returns "".
func (m *Mempool) Name() string { return "" }

// Avail returns 0.
func (m *Mempool) Avail() int { return 0 }

// InUse returns 0.
func (m *Mempool) InUse() int { return 0 }

// Free does nothing.
func (m *Mempool) Free() {}

// PortCount returns 0.
func PortCount() int { return 0 }

// Ports returns nil.
func Ports() []uint16 { return nil }

// PortByName reports ErrNotInitialized.
func PortByName(name string) (uint16, error) { return 0, ErrNotInitialized }

// PortName reports ErrNotInitialized.
func PortName(id uint16) (string, error) { return "", ErrNotInitialized }

// OpenPort reports ErrNotInitialized.
func OpenPort(id uint16, name string, cfg PortConfig, pool *Mempool) (*Port, error) {
	return nil, ErrNotInitialized
}

// Port is an open ethdev port; without DPDK none can be opened.
type Port struct{}

// ID returns 0.
func (p *Port) ID() uint16 { return 0 }

// Pool returns nil.
func (p *Port) Pool() *Mempool { return nil }

// Start reports ErrClosed.
func (p *Port) Start() error { return ErrClosed }

// Stop reports ErrClosed.
func (p *Port) Stop() error { return ErrClosed }

// Close does nothing.
func (p *Port) Close() error { return nil }

// SetMTU reports ErrClosed.
func (p *Port) SetMTU(mtu int) error { return ErrClosed }

// Link reports ErrClosed.
func (p *Port) Link() (up bool, speedMbps uint32, err error) { return false, 0, ErrClosed }

// Stats reports ErrClosed.
func (p *Port) Stats() (Stats, error) { return Stats{}, ErrClosed }

// XStats reports ErrClosed.
func (p *Port) XStats() (map[string]uint64, error) { return nil, ErrClosed }

// Name returns "".
func (p *Port) Name() string { return "" }

// MAC returns the zero address.
func (p *Port) MAC() [6]byte { return [6]byte{} }

// RxQueues returns 0.
func (p *Port) RxQueues() int { return 0 }

// TxQueues returns 0.
func (p *Port) TxQueues() int { return 0 }

// Headroom returns Headroom.
func (p *Port) Headroom() int { return Headroom }

// RxBurst returns 0.
func (p *Port) RxBurst(queue int, bufs []port.Buf) int { return 0 }

// TxBurst returns 0.
func (p *Port) TxBurst(queue int, bufs []port.Buf) int { return 0 }

// Alloc returns 0.
func (p *Port) Alloc(bufs []port.Buf) int { return 0 }

// Free does nothing.
func (p *Port) Free(bufs []port.Buf) {}

// FreeBufs does nothing.
func FreeBufs(bufs []port.Buf) {}

// Interface guard.
var _ port.Port = (*Port)(nil)
