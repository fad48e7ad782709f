// Command tgdemo runs the Tiergate stack on one machine: `make demo`. See internal/demo.
package main

import (
	"os"

	"github.com/tiergate/tiergate/internal/demo"
)

func main() { os.Exit(demo.Main(os.Args[1:], os.Stdout, os.Stderr)) }
