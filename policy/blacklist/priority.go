package blacklist

import "runtime"

// A List folds an overlay into new tables in the background (some 100 ms of a core
// per million entries), beside the lookups it serves. The fold runs on a thread of
// its own at a lower scheduling priority (nice +buildNice on Linux): when it and a
// thread serving lookups want the same core, the kernel gives the core to the
// lookups, and the fold, which nobody waits for, takes longer. The thread ends with
// the fold (the thread of a goroutine that exits locked is not reused), so nothing
// else runs at its priority; threads the runtime starts meanwhile are made by its
// template thread, at the process's priority. Builds made for a caller (Replace of
// a new list, a delta rebuilt) run at the caller's priority: a caller waits for
// them.
const buildNice = 10

// lowPriority runs f on a thread of its own at the fold's priority and returns when
// it has; a panic in f is raised again in the caller.
func lowPriority(f func()) {
	done := make(chan any, 1)
	go func() {
		var ok bool
		defer func() {
			if !ok {
				done <- recover()
			}
		}()
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		lowerThreadPriority()
		f()
		ok = true
		done <- nil
	}()
	if p := <-done; p != nil {
		panic(p)
	}
}
