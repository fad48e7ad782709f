// Command l4d is the L4 load distributor: a DPDK datapath that tunnels each client
// flow to an L7 node with the client's packet untouched. See l4/l4d and README.md.

// Plain TCP listeners, not Go's default MPTCP ones: the BGP speaker's (l4/bgp) take
// TCP MD5 keys and TTL security, which MPTCP sockets refuse.
//
//go:debug multipathtcp=0
package main

import (
	"os"

	"github.com/tiergate/tiergate/l4/l4d"
)

func main() { os.Exit(l4d.Main(os.Args[1:], os.Stdout, os.Stderr)) }
