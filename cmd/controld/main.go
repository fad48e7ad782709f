// Command controld is the control plane's API server over the cluster
// configuration's store. See control/controld and README.md.
package main

import (
	"os"

	"github.com/tiergate/tiergate/control/controld"
)

func main() { os.Exit(controld.Main(os.Args[1:], os.Stdout, os.Stderr)) }
