//go:build cgo && !nodpdk

package dpdk

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#cgo noescape tg_alloc
#cgo nocallback tg_alloc
#cgo noescape tg_free
#cgo nocallback tg_free
#cgo noescape tg_rx_burst
#cgo nocallback tg_rx_burst
#cgo noescape tg_tx_burst
#cgo nocallback tg_tx_burst

// The burst functions take arrays of mbuf pointers typed uintptr_t, so that Go keeps
// them in pointer-free arrays (which cgo need not inspect and may keep on the stack).

static uint16_t tg_rx_burst(uint16_t port, uint16_t queue, uintptr_t *pkts, uint16_t n) {
	return rte_eth_rx_burst(port, queue, (struct rte_mbuf **)pkts, n);
}

static uint16_t tg_tx_burst(uint16_t port, uint16_t queue, uintptr_t *pkts, uint16_t n) {
	return rte_eth_tx_burst(port, queue, (struct rte_mbuf **)pkts, n);
}

// tg_alloc allocates up to n mbufs: all at once if the pool has them, else one by one
// until it runs out. It returns how many.
static unsigned tg_alloc(struct rte_mempool *mp, uintptr_t *pkts, unsigned n) {
	if (rte_pktmbuf_alloc_bulk(mp, (struct rte_mbuf **)pkts, n) == 0)
		return n;
	unsigned i;
	for (i = 0; i < n; i++) {
		struct rte_mbuf *m = rte_pktmbuf_alloc(mp);
		if (m == NULL)
			break;
		pkts[i] = (uintptr_t)m;
	}
	return i;
}

static void tg_free(uintptr_t *pkts, unsigned n) {
	rte_pktmbuf_free_bulk((struct rte_mbuf **)pkts, n);
}

static int tg_chain(uintptr_t head, uintptr_t tail) {
	return rte_pktmbuf_chain((struct rte_mbuf *)head, (struct rte_mbuf *)tail);
}

static int tg_link(uint16_t port, int *up, uint32_t *speed) {
	struct rte_eth_link link;
	memset(&link, 0, sizeof(link));
	int rc = rte_eth_link_get_nowait(port, &link);
	*up = link.link_status;
	*speed = link.link_speed;
	return rc;
}

enum {
	tg_off_buf_addr = offsetof(struct rte_mbuf, buf_addr),
	tg_off_data_off = offsetof(struct rte_mbuf, data_off),
	tg_off_nb_segs = offsetof(struct rte_mbuf, nb_segs),
	tg_off_ol_flags = offsetof(struct rte_mbuf, ol_flags),
	tg_off_pkt_len = offsetof(struct rte_mbuf, pkt_len),
	tg_off_data_len = offsetof(struct rte_mbuf, data_len),
	tg_off_buf_len = offsetof(struct rte_mbuf, buf_len),
	tg_off_next = offsetof(struct rte_mbuf, next),
	tg_size_mbuf = sizeof(struct rte_mbuf),
	tg_headroom = RTE_PKTMBUF_HEADROOM,
	tg_default_buf_size = RTE_MBUF_DEFAULT_BUF_SIZE,
	tg_e_rte_secondary = E_RTE_SECONDARY,
	tg_e_rte_no_config = E_RTE_NO_CONFIG,
};
static unsigned tg_lcore_id_any(void) { return LCORE_ID_ANY; }
*/
import "C"

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tiergate/tiergate/l4/port"
)

// allocChunk is how many mbufs Alloc and Free handle per C call.
const allocChunk = 64

// Port is an open ethdev port. It implements port.Port.
type Port struct {
	id   uint16
	name string
	mac  [6]byte
	pool *Mempool
	rx   []rxQueue
	tx   []txQueue

	mu      sync.Mutex
	started bool
	closed  bool
}

type rxQueue struct {
	pkts     [MaxBurst]uintptr // mbufs from rte_eth_rx_burst
	bad      [MaxBurst]uintptr // multi-segment mbufs to free
	multiSeg atomic.Uint64
}

type txQueue struct {
	pkts [MaxBurst]uintptr // mbufs for rte_eth_tx_burst
}

// open tracks open ports by ID.
var open struct {
	mu    sync.Mutex
	ports map[uint16]*Port
}

// PortCount returns the number of available ethdev ports (rte_eth_dev_count_avail).
func PortCount() int { return int(C.rte_eth_dev_count_avail()) }

// Ports returns the IDs of the available ethdev ports.
func Ports() []uint16 {
	var ids []uint16
	for p := C.rte_eth_find_next_owned_by(0, 0); p < C.RTE_MAX_ETHPORTS; p = C.rte_eth_find_next_owned_by(C.uint16_t(p+1), 0) {
		ids = append(ids, uint16(p))
	}
	return ids
}

// PortByName returns the ID of the ethdev port named name (a PCI address such as
// 0000:3b:00.0, or a virtual device such as net_af_packet0).
func PortByName(name string) (uint16, error) {
	if err := ready(); err != nil {
		return 0, err
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var id C.uint16_t
	if rc := C.rte_eth_dev_get_port_by_name(cname, &id); rc < 0 {
		return 0, fmt.Errorf("dpdk: looking up port %q: %w", name, errno(rc))
	}
	return uint16(id), nil
}

// PortName returns the device name of port id.
func PortName(id uint16) (string, error) {
	var buf [C.RTE_ETH_NAME_MAX_LEN]C.char
	if rc := C.rte_eth_dev_get_name_by_port(C.uint16_t(id), &buf[0]); rc < 0 {
		return "", fmt.Errorf("dpdk: naming port %d: %w", id, errno(rc))
	}
	return C.GoString(&buf[0]), nil
}

// OpenPort configures port id with cfg, sets up its queues with receive buffers from
// pool, and starts it. name is how Name reports it (empty: the device name).
func OpenPort(id uint16, name string, cfg PortConfig, pool *Mempool) (*Port, error) {
	if err := ready(); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, fmt.Errorf("dpdk: opening port %d: no mempool", id)
	}
	if C.rte_eth_dev_is_valid_port(C.uint16_t(id)) == 0 {
		return nil, fmt.Errorf("dpdk: opening port %d: %w", id, Errno(C.ENODEV))
	}
	if name == "" {
		n, err := PortName(id)
		if err != nil {
			return nil, err
		}
		name = n
	}
	if cfg.RxQueues == 0 {
		cfg.RxQueues = 1
	}
	if cfg.TxQueues == 0 {
		cfg.TxQueues = 1
	}
	if cfg.RxDesc == 0 {
		cfg.RxDesc = DefaultDesc
	}
	if cfg.TxDesc == 0 {
		cfg.TxDesc = DefaultDesc
	}
	if cfg.MTU < 0 || cfg.MTU > math.MaxUint16 {
		return nil, fmt.Errorf("dpdk: opening port %q: MTU %d out of range", name, cfg.MTU)
	}

	open.mu.Lock()
	defer open.mu.Unlock()
	if open.ports[id] != nil {
		return nil, fmt.Errorf("dpdk: opening port %q (%d): %w", name, id, ErrPortOpen)
	}

	var info C.struct_rte_eth_dev_info
	if rc := C.rte_eth_dev_info_get(C.uint16_t(id), &info); rc < 0 {
		return nil, fmt.Errorf("dpdk: reading device info of port %q: %w", name, errno(rc))
	}
	if cfg.RxQueues < 0 || cfg.RxQueues > int(info.max_rx_queues) || cfg.TxQueues < 0 || cfg.TxQueues > int(info.max_tx_queues) {
		return nil, fmt.Errorf("dpdk: configuring port %q with %d RX and %d TX queues: the device supports %d and %d",
			name, cfg.RxQueues, cfg.TxQueues, info.max_rx_queues, info.max_tx_queues)
	}
	var conf C.struct_rte_eth_conf
	if rc := C.rte_eth_dev_configure(C.uint16_t(id), C.uint16_t(cfg.RxQueues), C.uint16_t(cfg.TxQueues), &conf); rc < 0 {
		return nil, fmt.Errorf("dpdk: configuring port %q with %d RX and %d TX queues: %w", name, cfg.RxQueues, cfg.TxQueues, errno(rc))
	}
	rxDesc, txDesc := C.uint16_t(cfg.RxDesc), C.uint16_t(cfg.TxDesc)
	if rc := C.rte_eth_dev_adjust_nb_rx_tx_desc(C.uint16_t(id), &rxDesc, &txDesc); rc < 0 {
		return nil, fmt.Errorf("dpdk: sizing the rings of port %q: %w", name, errno(rc))
	}
	socket := C.rte_eth_dev_socket_id(C.uint16_t(id))
	for q := range cfg.RxQueues {
		if rc := C.rte_eth_rx_queue_setup(C.uint16_t(id), C.uint16_t(q), rxDesc, C.uint(socket), nil, pool.mp); rc < 0 {
			return nil, fmt.Errorf("dpdk: setting up RX queue %d of port %q: %w", q, name, errno(rc))
		}
	}
	for q := range cfg.TxQueues {
		if rc := C.rte_eth_tx_queue_setup(C.uint16_t(id), C.uint16_t(q), txDesc, C.uint(socket), nil); rc < 0 {
			return nil, fmt.Errorf("dpdk: setting up TX queue %d of port %q: %w", q, name, errno(rc))
		}
	}
	if cfg.MTU > 0 {
		if rc := C.rte_eth_dev_set_mtu(C.uint16_t(id), C.uint16_t(cfg.MTU)); rc < 0 {
			return nil, fmt.Errorf("dpdk: setting the MTU of port %q to %d: %w", name, cfg.MTU, errno(rc))
		}
	}
	if cfg.Promiscuous {
		if rc := C.rte_eth_promiscuous_enable(C.uint16_t(id)); rc < 0 {
			return nil, fmt.Errorf("dpdk: making port %q promiscuous: %w", name, errno(rc))
		}
	}
	var addr C.struct_rte_ether_addr
	if rc := C.rte_eth_macaddr_get(C.uint16_t(id), &addr); rc < 0 {
		return nil, fmt.Errorf("dpdk: reading the MAC address of port %q: %w", name, errno(rc))
	}
	p := &Port{
		id:   id,
		name: name,
		pool: pool,
		rx:   make([]rxQueue, cfg.RxQueues),
		tx:   make([]txQueue, cfg.TxQueues),
	}
	for i := range p.mac {
		p.mac[i] = byte(addr.addr_bytes[i])
	}
	if err := p.start(); err != nil {
		return nil, err
	}
	if open.ports == nil {
		open.ports = make(map[uint16]*Port)
	}
	open.ports[id] = p
	return p, nil
}

// ID returns the ethdev port ID.
func (p *Port) ID() uint16 { return p.id }

// Pool returns the mempool that receive queues and Alloc take mbufs from.
func (p *Port) Pool() *Mempool { return p.pool }

// Start starts a stopped port; ErrStarted if it runs.
func (p *Port) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return ErrClosed
	case p.started:
		return fmt.Errorf("dpdk: starting port %q: %w", p.name, ErrStarted)
	}
	return p.startLocked()
}

func (p *Port) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked()
}

func (p *Port) startLocked() error {
	if rc := C.rte_eth_dev_start(C.uint16_t(p.id)); rc < 0 {
		return fmt.Errorf("dpdk: starting port %q: %w", p.name, errno(rc))
	}
	p.started = true
	return nil
}

// Stop stops the port (rte_eth_dev_stop); stopping a stopped port does nothing. No
// goroutine may be in RxBurst or TxBurst on it.
func (p *Port) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	return p.stopLocked()
}

func (p *Port) stopLocked() error {
	if !p.started {
		return nil
	}
	if rc := C.rte_eth_dev_stop(C.uint16_t(p.id)); rc < 0 {
		return fmt.Errorf("dpdk: stopping port %q: %w", p.name, errno(rc))
	}
	p.started = false
	return nil
}

// Close stops and closes the port (rte_eth_dev_close), which releases a virtual device
// for good. No goroutine may be in RxBurst or TxBurst on it, and none may call them
// again. Closing a closed port does nothing.
func (p *Port) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if err := p.stopLocked(); err != nil {
		return err
	}
	p.closed = true
	open.mu.Lock()
	delete(open.ports, p.id)
	open.mu.Unlock()
	dev, _ := PortName(p.id)
	if rc := C.rte_eth_dev_close(C.uint16_t(p.id)); rc < 0 {
		return fmt.Errorf("dpdk: closing port %q: %w", p.name, errno(rc))
	}
	releaseIface(dev)
	return nil
}

// SetMTU sets the port's MTU (rte_eth_dev_set_mtu). Some drivers accept it only while
// the port is stopped.
func (p *Port) SetMTU(mtu int) error {
	if mtu <= 0 || mtu > math.MaxUint16 {
		return fmt.Errorf("dpdk: setting the MTU of port %q to %d: out of range", p.name, mtu)
	}
	if rc := C.rte_eth_dev_set_mtu(C.uint16_t(p.id), C.uint16_t(mtu)); rc < 0 {
		return fmt.Errorf("dpdk: setting the MTU of port %q to %d: %w", p.name, mtu, errno(rc))
	}
	return nil
}

// Link reports the link state without waiting (rte_eth_link_get_nowait).
func (p *Port) Link() (up bool, speedMbps uint32, err error) {
	var cup C.int
	var speed C.uint32_t
	if rc := C.tg_link(C.uint16_t(p.id), &cup, &speed); rc < 0 {
		return false, 0, fmt.Errorf("dpdk: reading the link of port %q: %w", p.name, errno(rc))
	}
	return cup != 0, uint32(speed), nil
}

// Stats returns the port's basic counters.
func (p *Port) Stats() (Stats, error) {
	var st C.struct_rte_eth_stats
	if rc := C.rte_eth_stats_get(C.uint16_t(p.id), &st); rc < 0 {
		return Stats{}, fmt.Errorf("dpdk: reading the stats of port %q: %w", p.name, errno(rc))
	}
	s := Stats{
		RxPackets: uint64(st.ipackets),
		RxBytes:   uint64(st.ibytes),
		TxPackets: uint64(st.opackets),
		TxBytes:   uint64(st.obytes),
		RxMissed:  uint64(st.imissed),
		RxErrors:  uint64(st.ierrors),
		TxErrors:  uint64(st.oerrors),
		RxNoMbuf:  uint64(st.rx_nombuf),
	}
	for i := range p.rx {
		s.MultiSeg += p.rx[i].multiSeg.Load()
	}
	return s, nil
}

// XStats returns the port's extended statistics by name.
func (p *Port) XStats() (map[string]uint64, error) {
	id := C.uint16_t(p.id)
	for range 3 { // the set can change between the calls; retry then
		n := C.rte_eth_xstats_get_names(id, nil, 0)
		if n < 0 {
			return nil, fmt.Errorf("dpdk: counting the xstats of port %q: %w", p.name, errno(n))
		}
		if n == 0 {
			return map[string]uint64{}, nil
		}
		names := make([]C.struct_rte_eth_xstat_name, n)
		vals := make([]C.struct_rte_eth_xstat, n)
		got := C.rte_eth_xstats_get_names(id, &names[0], C.uint(n))
		if got < 0 {
			return nil, fmt.Errorf("dpdk: naming the xstats of port %q: %w", p.name, errno(got))
		}
		if got > n {
			continue
		}
		gotv := C.rte_eth_xstats_get(id, &vals[0], C.uint(n))
		if gotv < 0 {
			return nil, fmt.Errorf("dpdk: reading the xstats of port %q: %w", p.name, errno(gotv))
		}
		if gotv > n {
			continue
		}
		out := make(map[string]uint64, gotv)
		for _, v := range vals[:gotv] {
			if v.id < C.uint64_t(got) {
				out[C.GoString(&names[v.id].name[0])] = uint64(v.value)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("dpdk: reading the xstats of port %q: the set kept changing", p.name)
}

// Name returns the port's name.
func (p *Port) Name() string { return p.name }

// MAC returns the port's MAC address, as read when it was opened.
func (p *Port) MAC() [6]byte { return p.mac }

// RxQueues returns the number of receive queues.
func (p *Port) RxQueues() int { return len(p.rx) }

// TxQueues returns the number of transmit queues.
func (p *Port) TxQueues() int { return len(p.tx) }

// Headroom returns the headroom of a fresh mbuf.
func (p *Port) Headroom() int { return Headroom }

// mbufAt returns the mbuf whose address *h holds. Reading the address through a pointer
// to the word keeps the uintptr-to-pointer conversion off Go's heap rules: the mbuf
// lives in DPDK's memory.
func mbufAt(h *uintptr) *C.struct_rte_mbuf {
	return *(**C.struct_rte_mbuf)(unsafe.Pointer(h))
}

// bufOf describes mbuf h (at *h) as a port.Buf.
func bufOf(h *uintptr) port.Buf {
	m := mbufAt(h)
	return port.Buf{
		Data:   unsafe.Slice((*byte)(m.buf_addr), int(m.buf_len)),
		Off:    int(m.data_off),
		Len:    int(m.data_len),
		Handle: *h,
	}
}

// RxBurst receives up to min(len(bufs), MaxBurst) packets from queue with one call to
// rte_eth_rx_burst. Multi-segment packets are freed, counted in Stats.MultiSeg, and not
// returned.
func (p *Port) RxBurst(queue int, bufs []port.Buf) int {
	q := &p.rx[queue]
	n := min(len(bufs), MaxBurst)
	if n == 0 {
		return 0
	}
	got := int(C.tg_rx_burst(C.uint16_t(p.id), C.uint16_t(queue), (*C.uintptr_t)(unsafe.Pointer(&q.pkts[0])), C.uint16_t(n)))
	bufs = bufs[:n]
	k, bad := 0, 0
	for i := range got {
		m := mbufAt(&q.pkts[i])
		if m.nb_segs != 1 {
			q.bad[bad] = q.pkts[i]
			bad++
			continue
		}
		bufs[k] = port.Buf{
			Data:   unsafe.Slice((*byte)(m.buf_addr), int(m.buf_len)),
			Off:    int(m.data_off),
			Len:    int(m.data_len),
			Handle: q.pkts[i],
		}
		k++
	}
	if bad > 0 {
		C.tg_free((*C.uintptr_t)(unsafe.Pointer(&q.bad[0])), C.uint(bad))
		q.multiSeg.Add(uint64(bad))
	}
	return k
}

// TxBurst writes each buffer's Off and Len into its mbuf and transmits bufs on queue
// with one call to rte_eth_tx_burst per MaxBurst buffers. It returns how many the
// driver took, from the front. A frame outside its buffer panics.
func (p *Port) TxBurst(queue int, bufs []port.Buf) int {
	q := &p.tx[queue]
	sent := 0
	for len(bufs) > 0 {
		n := min(len(bufs), MaxBurst)
		for i := range n {
			b := &bufs[i]
			if b.Off < 0 || b.Len < 0 || b.Off+b.Len > len(b.Data) {
				badFrame(p.name, b.Off, b.Len, len(b.Data))
			}
			m := mbufAt(&b.Handle)
			m.data_off = C.uint16_t(b.Off)
			m.data_len = C.uint16_t(b.Len)
			m.pkt_len = C.uint32_t(b.Len)
			m.ol_flags = 0 // no offloads; drop RX flags
			q.pkts[i] = b.Handle
		}
		k := int(C.tg_tx_burst(C.uint16_t(p.id), C.uint16_t(queue), (*C.uintptr_t)(unsafe.Pointer(&q.pkts[0])), C.uint16_t(n)))
		sent += k
		if k < n {
			break
		}
		bufs = bufs[n:]
	}
	return sent
}

//go:noinline
func badFrame(name string, off, n, size int) {
	panic(fmt.Sprintf("dpdk: TxBurst on port %q: frame [%d:%d+%d] outside its %d-byte buffer", name, off, off, n, size))
}

// Alloc fills bufs with fresh mbufs from the port's pool (Off = Headroom, Len = 0) and
// returns how many; fewer when the pool runs out.
func (p *Port) Alloc(bufs []port.Buf) int {
	var pkts [allocChunk]uintptr
	total := 0
	for total < len(bufs) {
		n := min(len(bufs)-total, allocChunk)
		k := int(C.tg_alloc(p.pool.mp, (*C.uintptr_t)(unsafe.Pointer(&pkts[0])), C.uint(n)))
		for i := range k {
			bufs[total+i] = bufOf(&pkts[i])
		}
		total += k
		if k < n {
			break
		}
	}
	return total
}

// Free returns bufs to their pools with one call to rte_pktmbuf_free_bulk per 64.
func (p *Port) Free(bufs []port.Buf) { FreeBufs(bufs) }

// FreeBufs returns mbufs (of any pool) to their pools.
func FreeBufs(bufs []port.Buf) {
	var pkts [allocChunk]uintptr
	for len(bufs) > 0 {
		n := min(len(bufs), allocChunk)
		for i := range n {
			pkts[i] = bufs[i].Handle
		}
		C.tg_free((*C.uintptr_t)(unsafe.Pointer(&pkts[0])), C.uint(n))
		bufs = bufs[n:]
	}
}

// chain appends mbuf tail to the packet whose first segment is head
// (rte_pktmbuf_chain), making a multi-segment packet.
func chain(head, tail uintptr) error {
	if rc := C.tg_chain(C.uintptr_t(head), C.uintptr_t(tail)); rc < 0 {
		return fmt.Errorf("dpdk: chaining mbufs: %w", errno(rc))
	}
	return nil
}

// checkLayout compares the mbuf field offsets Go uses with C's offsetof, and the
// package's constants with DPDK's.
func checkLayout() error {
	var m C.struct_rte_mbuf
	for _, f := range []struct {
		name   string
		goOff  uintptr
		cOff   uintptr
		goSize uintptr
		cSize  uintptr
	}{
		{"buf_addr", unsafe.Offsetof(m.buf_addr), C.tg_off_buf_addr, unsafe.Sizeof(m.buf_addr), 8},
		{"data_off", unsafe.Offsetof(m.data_off), C.tg_off_data_off, unsafe.Sizeof(m.data_off), 2},
		{"nb_segs", unsafe.Offsetof(m.nb_segs), C.tg_off_nb_segs, unsafe.Sizeof(m.nb_segs), 2},
		{"ol_flags", unsafe.Offsetof(m.ol_flags), C.tg_off_ol_flags, unsafe.Sizeof(m.ol_flags), 8},
		{"pkt_len", unsafe.Offsetof(m.pkt_len), C.tg_off_pkt_len, unsafe.Sizeof(m.pkt_len), 4},
		{"data_len", unsafe.Offsetof(m.data_len), C.tg_off_data_len, unsafe.Sizeof(m.data_len), 2},
		{"buf_len", unsafe.Offsetof(m.buf_len), C.tg_off_buf_len, unsafe.Sizeof(m.buf_len), 2},
		{"next", unsafe.Offsetof(m.next), C.tg_off_next, unsafe.Sizeof(m.next), 8},
		{"(struct)", 0, 0, unsafe.Sizeof(m), C.tg_size_mbuf},
	} {
		if f.goOff != f.cOff || f.goSize != f.cSize {
			return fmt.Errorf("dpdk: struct rte_mbuf field %s: Go sees offset %d size %d, C has offset %d size %d", f.name, f.goOff, f.goSize, f.cOff, f.cSize)
		}
	}
	for _, c := range []struct {
		name  string
		goVal uint64
		cVal  uint64
	}{
		{"RTE_PKTMBUF_HEADROOM", Headroom, C.tg_headroom},
		{"RTE_MBUF_DEFAULT_BUF_SIZE", DefaultDataRoom, C.tg_default_buf_size},
		{"E_RTE_SECONDARY", uint64(errSecondary), C.tg_e_rte_secondary},
		{"E_RTE_NO_CONFIG", uint64(errNoConfig), C.tg_e_rte_no_config},
		{"LCORE_ID_ANY", LcoreAny, uint64(C.tg_lcore_id_any())},
	} {
		if c.goVal != c.cVal {
			return fmt.Errorf("dpdk: constant %s is %d in Go, %d in C", c.name, c.goVal, c.cVal)
		}
	}
	return nil
}

// Interface guard.
var _ port.Port = (*Port)(nil)
