// Command l4d is the L4 load distributor: a DPDK datapath that tunnels each client
// flow to an L7 node with the client's packet untouched. See l4/l4d and README.md.
package main

import (
	"os"

	"github.com/tiergate/tiergate/l4/l4d"
)

func main() { os.Exit(l4d.Main(os.Args[1:], os.Stdout, os.Stderr)) }
