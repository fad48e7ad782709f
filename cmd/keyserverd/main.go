// Command keyserverd performs private-key operations for the L7 tier, with keys in a
// PKCS#11 token. See keyserver/keyserverd and README.md.
package main

import (
	"os"

	"github.com/tiergate/tiergate/keyserver/keyserverd"
)

func main() { os.Exit(keyserverd.Main(os.Args[1:], os.Stdout, os.Stderr)) }
