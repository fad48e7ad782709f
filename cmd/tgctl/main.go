// Command tgctl is the command line of the control plane, over controld's API. See
// control/tgctl and README.md.
package main

import (
	"os"

	"github.com/tiergate/tiergate/control/tgctl"
)

func main() { os.Exit(tgctl.Main(os.Args[1:], os.Stdout, os.Stderr)) }
