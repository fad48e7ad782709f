package blacklist

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Building a Set works on arrays several times the size of the Set it makes: the
// entries as collected, sorted, merged, and (for a delta) the Set in force taken
// apart. On the Go heap they would start collections while the new Set is being
// built, and a collection's mark workers take the processors of the goroutines
// serving lookups for milliseconds at a time. So these arrays live off the heap,
// in anonymous memory mappings the garbage collector neither counts nor scans,
// handed back when the build is done; only the Set's own tables are allocated on
// the heap, and they hold no pointers. The mappings handed back are kept for the
// next build (whose pages are then already in memory: no page faults, no mapping
// calls) up to poolMaxBytes, and unmapped once no build took one for poolIdle.

// scratchMinBytes is the smallest array given a mapping of its own; arrays from
// arenaMinBytes up to it are cut from shared mappings of arenaBytes (a delta's
// arrays are mostly of this size: on the heap, each 10k delta would allocate over
// a megabyte there), and smaller ones are cheaper on the heap.
const (
	scratchMinBytes = 256 << 10
	arenaBytes      = 1 << 20
	arenaMinBytes   = 1 << 10
)

// A scratch holds the mappings of one build. A nil *scratch allocates on the heap.
// The arrays it hands out must hold no pointers, and nothing may keep them after
// free.
type scratch struct {
	maps  [][]byte
	arena []byte // what is left of the last arena mapping
}

// grab returns an empty slice with room for n elements of T, which holds no
// pointers.
func grab[T any](sc *scratch, n int) []T {
	var zero T
	size := int(unsafe.Sizeof(zero)) * n
	if sc == nil || size < arenaMinBytes {
		return make([]T, 0, n)
	}
	var b []byte
	if size < scratchMinBytes {
		b = sc.cut(size)
	} else {
		b = sc.mapping(size)
	}
	if b == nil {
		return make([]T, 0, n)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)[:0]
}

// mapping returns a mapping of at least size bytes, kept or new, which sc holds;
// nil if none can be made.
func (sc *scratch) mapping(size int) []byte {
	b := pool.take(size)
	if b == nil {
		var err error
		if b, err = mapAnon(size); err != nil {
			return nil
		}
		scratchMaps.Add(1)
	}
	scratchMapped.Add(int64(len(b)))
	sc.maps = append(sc.maps, b)
	return b
}

// cut returns size bytes (below scratchMinBytes) from sc's arena, 16-byte aligned,
// starting an arena when the last one is used up; nil if none can be made.
func (sc *scratch) cut(size int) []byte {
	size = (size + 15) &^ 15
	if len(sc.arena) < size {
		if sc.arena = sc.mapping(arenaBytes); sc.arena == nil {
			return nil
		}
	}
	b := sc.arena[:size:size]
	sc.arena = sc.arena[size:]
	return b
}

// free hands back every array sc handed out.
func (sc *scratch) free() {
	if sc == nil {
		return
	}
	for _, b := range sc.maps {
		scratchMapped.Add(-int64(len(b)))
		pool.put(b)
	}
	sc.maps, sc.arena = nil, nil
}

// scratchMapped counts the bytes of the mappings in use by scratches, and
// scratchMaps the mappings made.
var scratchMapped, scratchMaps atomic.Int64

// The mappings kept for the next builds: at most poolMaxBytes, unmapped after
// poolIdle without a take or a put.
const (
	poolMaxBytes = 256 << 20
	poolIdle     = 30 * time.Second
)

var pool mapPool

type mapPool struct {
	mu      sync.Mutex
	free    [][]byte
	bytes   int
	timer   *time.Timer
	idleFor time.Duration // 0: poolIdle; tests shorten it
}

// take returns a kept mapping of size to twice size bytes, the smallest, or nil.
func (p *mapPool) take(size int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	best := -1
	for i, b := range p.free {
		if len(b) >= size && len(b) <= 2*size && (best < 0 || len(b) < len(p.free[best])) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := p.free[best]
	p.free[best] = p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.bytes -= len(b)
	p.idle()
	return b
}

// put keeps b, or unmaps it when the pool is full.
func (p *mapPool) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bytes+len(b) > poolMaxBytes {
		unmap(b)
		return
	}
	p.free = append(p.free, b)
	p.bytes += len(b)
	p.idle()
}

// idle (re)starts the countdown to draining the pool.
func (p *mapPool) idle() {
	d := p.idleFor
	if d == 0 {
		d = poolIdle
	}
	if p.timer == nil {
		p.timer = time.AfterFunc(d, p.drain)
		return
	}
	p.timer.Reset(d)
}

// setIdle sets how long the pool keeps its mappings unused (0: poolIdle).
func (p *mapPool) setIdle(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idleFor = d
}

// drain unmaps every kept mapping.
func (p *mapPool) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.free {
		unmap(b)
	}
	p.free, p.bytes = nil, 0
}

// kept is the number of bytes the pool keeps.
func (p *mapPool) kept() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

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
