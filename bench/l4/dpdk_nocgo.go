//go:build !cgo

package main

import (
	"context"
	"log/slog"
)

// haveDPDK tells whether this build has the DPDK binding (it needs cgo).
const haveDPDK = false

// dpdkEnv stands in for the DPDK set-up in a build without cgo.
type dpdkEnv struct{}

func ealArgs(*topo, string) []string { return nil }

func startDPDK([]string) (*dpdkEnv, error) { return nil, errNoCgo }

func (*dpdkEnv) close() error { return errNoCgo }

func (*dpdkEnv) runRing(context.Context, *options, *frameSet, *frameSet, *slog.Logger) (*forwardResults, error) {
	return nil, errNoCgo
}

func (*dpdkEnv) runVeth(context.Context, *options, *topo, *slog.Logger) (*vethResult, error) {
	return nil, errNoCgo
}

func reserveHugepages(int) func() { return func() {} }

func (*dpdkEnv) runRingCookies(context.Context, *options, *slog.Logger) ([]*phaseResult, error) {
	return nil, errNoCgo
}
