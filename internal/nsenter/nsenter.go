//go:build linux

// Package nsenter runs a function inside a network namespace, for the tests, the
// demo and the benchmarks that build their own hosts. Sockets, TUN devices and
// netlink handles the function opens belong to the namespace and stay there.
package nsenter

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs f on an OS thread that has entered the network namespace at path (such
// as /run/netns/NAME), then returns the thread to its own namespace. If it cannot,
// the thread stays locked and ends with its goroutine, so no other goroutine ever
// runs in the wrong namespace. Goroutines that f starts run in the caller's
// namespace.
func Do(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening network namespace %s: %w", path, err)
			return
		}
		err = unix.Setns(target, unix.CLONE_NEWNET)
		unix.Close(target)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering network namespace %s: %w", path, err)
			return
		}
		ferr := f()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leaving network namespace %s: %w", path, err))
			return // the thread stays locked and exits with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
