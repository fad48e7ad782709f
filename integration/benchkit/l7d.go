package benchkit

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"time"

	"github.com/tiergate/tiergate/l7/l7d"
)

// ServeL7dCommand is the hidden first argument that turns a benchmark program into the
// profiling variant of l7d (-profile): l7d's own Main in a process of its own, which the
// rows measure like bin/l7d, with net/http/pprof on a separate address. l7d itself has
// no pprof endpoint.
const ServeL7dCommand = "serve-l7d"

// ServeL7d runs l7d from args (-config FILE -pprof ADDR); prog names the benchmark in
// messages. It returns l7d's exit status.
func ServeL7d(prog string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(prog+" "+ServeL7dCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := fs.String("config", "", "l7d configuration `file`")
	addr := fs.String("pprof", "", "`address` of /debug/pprof/")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *cfg == "" || *addr == "" {
		fmt.Fprintf(stderr, "%s %s: -config and -pprof are required\n", prog, ServeL7dCommand)
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "%s %s: %v\n", prog, ServeL7dCommand, err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go (&http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}).Serve(ln)
	return l7d.Main([]string{"run", "-config", *cfg}, stdout, stderr)
}

// ParseList parses a comma-separated subset of known, keeping known's order.
func ParseList(s string, known []string) ([]string, error) {
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(known, f) {
			return nil, fmt.Errorf("unknown %q (known: %s)", f, strings.Join(known, ", "))
		}
		seen[f] = true
	}
	var out []string
	for _, k := range known {
		if seen[k] {
			out = append(out, k)
		}
	}
	return out, nil
}
