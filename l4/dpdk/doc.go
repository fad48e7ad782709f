// Package dpdk is the project's thin cgo binding to DPDK 22.11 (Debian's libdpdk): EAL
// set-up, lcore registration of Go threads, mbuf pools, ethdev ports and burst I/O. Its
// Port implements port.Port, so the datapath that runs over the in-memory port in tests
// runs over a NIC (or a virtual device) in production.
//
// The binding crosses the cgo boundary once per burst, never per packet: RxBurst makes
// one call to rte_eth_rx_burst and then reads each mbuf's fields from Go, TxBurst writes
// them from Go and makes one call to rte_eth_tx_burst, and Alloc and Free are one bulk
// call per 64 buffers.
//
// # Threads
//
// Init runs rte_eal_init once per process, on a thread of its own that becomes the
// main lcore and then only waits for Cleanup, so no goroutine ever runs with the main
// lcore's identity. A goroutine that drives a queue calls runtime.LockOSThread, then
// RegisterThread, which gives its thread an lcore ID so mempool per-lcore caches work
// on it. Other goroutines (the control plane) may call any function: DPDK treats their
// threads as non-EAL threads, and mempool operations then bypass the caches.
//
// Each queue of a Port is driven by one goroutine at a time; Alloc and Free may be
// called from any goroutine.
//
// Without cgo the package builds with the same API, and Init reports ErrUnavailable.
package dpdk
