// Command tgdemo runs the Tiergate stack on one machine: `make demo`. See demo/.
package main

import (
	"os"

	"github.com/tiergate/tiergate/demo"
)

func main() { os.Exit(demo.Main(os.Args[1:], os.Stdout, os.Stderr)) }
