package blacklist

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Building a Set works on arrays several times the size of the Set it makes: the
// entries as collected, sorted, merged, and (for a delta) the Set in force taken
// apart. On the Go heap they would start collections while the new Set is being
// built, and a collection's mark workers take the processors of the goroutines
// serving lookups for milliseconds at a time. So these arrays live off the heap,
// in anonymous memory mappings the garbage collector neither counts nor scans,
// and are unmapped as soon as the build is done; only the Set's own tables are
// allocated on the heap, and they hold no pointers.

// scratchMinBytes is the smallest array taken from a mapping; smaller ones are
// cheaper on the heap.
const scratchMinBytes = 256 << 10

// A scratch holds the mappings of one build. A nil *scratch allocates on the heap.
// The arrays it hands out must hold no pointers, and nothing may keep them after
// free.
type scratch struct {
	maps [][]byte
}

// grab returns an empty slice with room for n elements of T, which holds no
// pointers.
func grab[T any](sc *scratch, n int) []T {
	var zero T
	size := int(unsafe.Sizeof(zero)) * n
	if sc == nil || size < scratchMinBytes {
		return make([]T, 0, n)
	}
	b, err := mapAnon(size)
	if err != nil {
		return make([]T, 0, n)
	}
	scratchMapped.Add(int64(len(b)))
	sc.maps = append(sc.maps, b)
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)[:0]
}

// free unmaps every array sc handed out.
func (sc *scratch) free() {
	if sc == nil {
		return
	}
	for _, b := range sc.maps {
		unmap(b)
		scratchMapped.Add(-int64(len(b)))
	}
	sc.maps = nil
}

// scratchMapped counts the bytes mapped by scratches and not yet unmapped.
var scratchMapped atomic.Int64

// builderMem is the scratch of a Builder, which lives as long as the Builder: it is
// unmapped by Builder.Reset, or when the Builder is collected.
type builderMem struct {
	sc *scratch
}

func newBuilderMem() *builderMem {
	m := &builderMem{sc: &scratch{}}
	runtime.AddCleanup(m, (*scratch).free, m.sc)
	return m
}
