//go:build cgo && !nodpdk

package dpdk

/*
#include <stdlib.h>
#include <rte_errno.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

static struct rte_mempool *tg_pool_create(const char *name, unsigned n, unsigned cache,
		uint16_t data_room, int socket, int *err) {
	struct rte_mempool *mp = rte_pktmbuf_pool_create(name, n, cache, 0, data_room, socket);
	*err = mp == NULL ? rte_errno : 0;
	return mp;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Mempool is a pool of packet buffers (mbufs), created by rte_pktmbuf_pool_create.
type Mempool struct {
	mp   *C.struct_rte_mempool
	name string
	once sync.Once
}

// NewMempool creates a pool of n mbufs named name (unique in the process) with a
// per-lcore cache of cacheSize mbufs (0: no cache; at most 512, and n should be at
// least 1.5 times it) and dataRoomSize bytes of buffer each, headroom included (0:
// DefaultDataRoom), on NUMA socket socket (negative: any).
func NewMempool(name string, n, cacheSize, dataRoomSize uint, socket int) (*Mempool, error) {
	if err := ready(); err != nil {
		return nil, err
	}
	if dataRoomSize == 0 {
		dataRoomSize = DefaultDataRoom
	}
	if dataRoomSize <= Headroom || dataRoomSize > 0xffff {
		return nil, fmt.Errorf("dpdk: creating mempool %q: data room %d not in (%d, 65535]", name, dataRoomSize, Headroom)
	}
	if socket < 0 {
		socket = C.SOCKET_ID_ANY
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr C.int
	mp := C.tg_pool_create(cname, C.uint(n), C.uint(cacheSize), C.uint16_t(dataRoomSize), C.int(socket), &cerr)
	if mp == nil {
		return nil, fmt.Errorf("dpdk: creating mempool %q of %d mbufs (cache %d, %d bytes): %w", name, n, cacheSize, dataRoomSize, errno(cerr))
	}
	return &Mempool{mp: mp, name: name}, nil
}

// Name returns the pool's name.
func (m *Mempool) Name() string { return m.name }

// Avail returns how many mbufs are free, per-lcore caches included.
func (m *Mempool) Avail() int { return int(C.rte_mempool_avail_count(m.mp)) }

// InUse returns how many mbufs are allocated.
func (m *Mempool) InUse() int { return int(C.rte_mempool_in_use_count(m.mp)) }

// Free releases the pool (rte_mempool_free). No mbuf of it may be in use, and no open
// port may use it. Calling Free again does nothing.
func (m *Mempool) Free() {
	m.once.Do(func() { C.rte_mempool_free(m.mp) })
}
