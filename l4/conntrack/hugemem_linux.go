package conntrack

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugeMin is the smallest array put in its own mapping: below it, the Go heap.
const hugeMin = 4 << 20

// hugeAlloc returns a zeroed array of n T in memory of its own, advised to the kernel
// as transparent huge pages, and a function that unmaps it. A table of a million
// connections spans tens of megabytes read at random: with 4 KiB pages nearly every
// lookup also misses the TLB (and under virtualisation a TLB miss is a two-level page
// walk), which costs more than the cache miss itself; 2 MiB pages cover the table
// with a few hundred TLB entries. When the mapping fails, or the array is small, it
// comes from the Go heap and the function is nil. T must hold no pointers.
func hugeAlloc[T any](n int) ([]T, func()) {
	var zero T
	size := n * int(unsafe.Sizeof(zero))
	if size < hugeMin {
		return make([]T, n), nil
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return make([]T, n), nil
	}
	// Advice only: without THP (or with it disabled) the mapping still works.
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(mem))), n), func() { _ = unix.Munmap(mem) }
}

// releaseWith unmaps the table's own mappings when the table becomes unreachable.
func releaseWith(t *Table, frees ...func()) {
	var fs []func()
	for _, f := range frees {
		if f != nil {
			fs = append(fs, f)
		}
	}
	if len(fs) == 0 {
		return
	}
	runtime.AddCleanup(t, func(fs []func()) {
		for _, f := range fs {
			f()
		}
	}, fs)
}
