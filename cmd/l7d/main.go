// Command l7d terminates TLS 1.2/1.3 and QUIC/HTTP/3 with private keys offloaded to
// keyserverd, and proxies requests to backend pools. See l7/l7d and README.md.
package main

import (
	"os"

	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/l7/l7d"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "run" {
		l7.ExecWithRuntimeSettings() // the runtime's idle wake-ups (l7/runtime.go)
	}
	os.Exit(l7d.Main(os.Args[1:], os.Stdout, os.Stderr))
}
