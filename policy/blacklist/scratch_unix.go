//go:build unix

package blacklist

import "syscall"

func mapAnon(size int) ([]byte, error) {
	return syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
}

func unmap(b []byte) { _ = syscall.Munmap(b) }
