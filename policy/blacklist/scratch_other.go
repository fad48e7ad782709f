//go:build !unix

package blacklist

func mapAnon(size int) ([]byte, error) { return make([]byte, size), nil }

func unmap([]byte) {}
