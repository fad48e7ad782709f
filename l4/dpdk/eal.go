//go:build cgo && !nodpdk

package dpdk

/*
#cgo pkg-config: libdpdk
#cgo CFLAGS: -D_GNU_SOURCE

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>

// tg_eal_init runs rte_eal_init and gives the calling thread its CPU affinity back (EAL
// pins the main lcore, and Go threads cloned from it would inherit the pin). It returns
// the number of parsed arguments or -rte_errno.
static int tg_eal_init(int argc, char **argv) {
	cpu_set_t set;
	int have = pthread_getaffinity_np(pthread_self(), sizeof(set), &set) == 0;
	int ret = rte_eal_init(argc, argv);
	int err = ret < 0 ? rte_errno : 0;
	if (have)
		pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	return ret < 0 ? -err : ret;
}

static int tg_eal_cleanup(void) {
	int ret = rte_eal_cleanup();
	return ret < 0 ? -rte_errno : 0;
}

static int tg_thread_register(unsigned *lcore) {
	if (rte_thread_register() < 0)
		return -rte_errno;
	*lcore = rte_lcore_id();
	return 0;
}

static unsigned tg_lcore_id(void) { return rte_lcore_id(); }
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

var eal struct {
	mu    sync.Mutex
	state ealState
	argv  **C.char    // given to rte_eal_init, which may keep pointers into it
	strs  []*C.char   // the strings, in their original order (EAL may permute argv)
	calls chan func() // run on the main lcore's thread
	// ifaces maps each interface a net_af_packet device binds to that device's name
	// (see ErrSharedInterface).
	ifaces map[string]string
}

type ealState int

const (
	ealNone ealState = iota
	ealReady
	ealFailed
	ealClosed
)

// errno turns a DPDK return value (negative errno) into an Errno.
func errno(rc C.int) error {
	if rc < 0 {
		rc = -rc
	}
	return Errno(rc)
}

// Init initialises the EAL with args (EAL arguments, without a program name). It runs
// rte_eal_init on a thread of its own, which becomes the main lcore and then only waits
// for Cleanup: no goroutine ever runs on it. Init can succeed only once per process: a
// second call, or one after a failure, returns ErrInitialized.
func Init(args []string) error {
	eal.mu.Lock()
	defer eal.mu.Unlock()
	if eal.state != ealNone {
		return ErrInitialized
	}
	if err := checkLayout(); err != nil {
		return err
	}
	ifaces := map[string]string{}
	for _, d := range vdevArgs(args) {
		if err := bindIface(ifaces, d); err != nil {
			return fmt.Errorf("dpdk: initialising the EAL with %q: %w", args, err)
		}
	}
	eal.ifaces = ifaces
	eal.state = ealFailed
	argv := append([]string{"tiergate"}, args...)
	cargv := (**C.char)(C.calloc(C.size_t(len(argv)+1), C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	view := unsafe.Slice(cargv, len(argv)+1)
	for i, a := range argv {
		view[i] = C.CString(a)
	}
	eal.argv = cargv
	eal.strs = append([]*C.char(nil), view[:len(argv)]...)
	eal.calls = make(chan func())
	res := make(chan C.int)
	go mainLcore(C.int(len(argv)), cargv, res)
	if rc := <-res; rc < 0 {
		return fmt.Errorf("dpdk: initialising the EAL with %q: %w", args, errno(rc))
	}
	eal.state = ealReady
	return nil
}

// mainLcore runs rte_eal_init on a locked thread, reports the result, then runs the
// functions sent on eal.calls until it is closed. It never unlocks, so the thread, with
// its EAL thread state, ends with the goroutine.
func mainLcore(argc C.int, argv **C.char, res chan<- C.int) {
	runtime.LockOSThread()
	rc := C.tg_eal_init(argc, argv)
	res <- rc
	if rc < 0 {
		return
	}
	for f := range eal.calls {
		f()
	}
}

// Cleanup releases the EAL's resources (rte_eal_cleanup, on the main lcore) and ends
// the main lcore's thread. Close ports and free pools first; no DPDK function may be
// called afterwards.
func Cleanup() error {
	eal.mu.Lock()
	defer eal.mu.Unlock()
	if eal.state != ealReady {
		return ErrNotInitialized
	}
	eal.state = ealClosed
	res := make(chan C.int)
	eal.calls <- func() { res <- C.tg_eal_cleanup() }
	rc := <-res
	close(eal.calls)
	if rc < 0 {
		return fmt.Errorf("dpdk: cleaning up the EAL: %w", errno(rc))
	}
	for _, s := range eal.strs {
		C.free(unsafe.Pointer(s))
	}
	C.free(unsafe.Pointer(eal.argv))
	eal.argv, eal.strs = nil, nil
	return nil
}

// AttachDevice probes and attaches a device while the EAL runs (rte_dev_probe), for
// example "net_af_packet1,iface=eth1" or a PCI address; OpenPort can then open its port.
// A device closed with Port.Close cannot be attached again under the same name.
//
// A net_af_packet device on an interface that another one already binds is refused
// with ErrSharedInterface.
func AttachDevice(devargs string) error {
	eal.mu.Lock()
	defer eal.mu.Unlock()
	if eal.state != ealReady {
		return ErrNotInitialized
	}
	ifc := AFPacketInterface(devargs)
	if err := bindIface(eal.ifaces, devargs); err != nil {
		return fmt.Errorf("dpdk: attaching device %q: %w", devargs, err)
	}
	cargs := C.CString(devargs)
	defer C.free(unsafe.Pointer(cargs))
	if rc := C.rte_dev_probe(cargs); rc < 0 {
		delete(eal.ifaces, ifc)
		return fmt.Errorf("dpdk: attaching device %q: %w", devargs, errno(rc))
	}
	return nil
}

// releaseIface forgets the interface the device named dev bound, once it is closed.
func releaseIface(dev string) {
	eal.mu.Lock()
	defer eal.mu.Unlock()
	for ifc, d := range eal.ifaces {
		if d == dev {
			delete(eal.ifaces, ifc)
		}
	}
}

// ready returns ErrNotInitialized unless Init succeeded and Cleanup has not run.
func ready() error {
	eal.mu.Lock()
	defer eal.mu.Unlock()
	if eal.state != ealReady {
		return ErrNotInitialized
	}
	return nil
}

// LcoreCount returns the number of EAL lcores (rte_lcore_count); threads registered
// with RegisterThread are not counted.
func LcoreCount() int { return int(C.rte_lcore_count()) }

// Lcores returns the IDs of the EAL lcores, the main one included, in increasing order.
func Lcores() []uint {
	var ids []uint
	for i := C.rte_get_next_lcore(math.MaxUint32, 0, 0); i < C.RTE_MAX_LCORE; i = C.rte_get_next_lcore(i, 0, 0) {
		ids = append(ids, uint(i))
	}
	return ids
}

// MainLcore returns the main lcore's ID.
func MainLcore() uint { return uint(C.rte_get_main_lcore()) }

// LcoreID returns the calling thread's lcore ID, or LcoreAny. It is meaningful only on
// a goroutine locked to its thread.
func LcoreID() uint { return uint(C.tg_lcore_id()) }

// RegisterThread makes the calling thread an lcore (rte_thread_register) and returns
// its lcore ID. Call it after runtime.LockOSThread on the goroutine that will drive a
// queue, and UnregisterThread before unlocking.
func RegisterThread() (lcore uint, err error) {
	if err := ready(); err != nil {
		return LcoreAny, err
	}
	var id C.uint
	if rc := C.tg_thread_register(&id); rc < 0 {
		return LcoreAny, fmt.Errorf("dpdk: registering the thread as an lcore: %w", errno(rc))
	}
	return uint(id), nil
}

// UnregisterThread releases the calling thread's lcore ID (rte_thread_unregister).
func UnregisterThread() { C.rte_thread_unregister() }
