package blacklist

import (
	"runtime"
	"syscall"
	"testing"
)

func threadNice(t *testing.T) int {
	t.Helper()
	p, err := syscall.Getpriority(syscall.PRIO_PROCESS, syscall.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	return 20 - p // the system call answers 20 - nice
}

// TestLowPriority: a fold runs at nice +buildNice on a thread of its own, the
// caller's thread keeps its priority, and a panic reaches the caller.
func TestLowPriority(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	mine := threadNice(t)
	var inside int
	lowPriority(func() { inside = threadNice(t) })
	if inside != min(mine+buildNice, 19) {
		t.Errorf("a build ran at nice %d, want %d", inside, min(mine+buildNice, 19))
	}
	if n := threadNice(t); n != mine {
		t.Errorf("the caller's thread is at nice %d after a build, was %d", n, mine)
	}
	defer func() {
		if p := recover(); p != "boom" {
			t.Errorf("recovered %v, want the build's panic", p)
		}
	}()
	lowPriority(func() { panic("boom") })
}
