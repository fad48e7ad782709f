//go:build !linux

package blacklist

func lowerThreadPriority() {}
