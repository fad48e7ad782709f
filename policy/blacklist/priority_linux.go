package blacklist

import "syscall"

// lowerThreadPriority adds buildNice to the calling thread's nice value (at most
// 19, the lowest priority).
func lowerThreadPriority() {
	tid := syscall.Gettid()
	p, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
	if err != nil {
		return
	}
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, min(20-p+buildNice, 19)) // the system call answers 20 - nice
}
