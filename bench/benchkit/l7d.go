package benchkit

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tiergate/tiergate/l7"
	"github.com/tiergate/tiergate/l7/l7d"
)

// FloorEnv is the environment of the benchmarks' floor servers (the least Go
// servers l7d's figures are read against): the GODEBUG setting l7d re-executes
// itself with (l7.SysmonGODEBUG, see l7.ExecWithRuntimeSettings) and one P, as
// l7d's GOMAXPROCS controller starts with.
var FloorEnv = []string{"GODEBUG=" + l7.SysmonGODEBUG, "GOMAXPROCS=1"}

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

// ProfiledL7d is how a benchmark program starts the profiling variant of l7d (its
// own executable with ServeL7dCommand) on the configuration file cfg: the path and
// arguments to run, and the URL of its pprof endpoint, ending in "/".
func ProfiledL7d(cfg string) (path string, args []string, pprofURL string, err error) {
	pp, err := FreeAddr()
	if err != nil {
		return "", nil, "", err
	}
	if path, err = os.Executable(); err != nil {
		return "", nil, "", err
	}
	return path, []string{ServeL7dCommand, "-config", cfg, "-pprof", pp}, "http://" + pp + "/debug/pprof/", nil
}

// FetchProfiles collects, after delay, a CPU profile and an allocation profile of
// seconds each from the pprof endpoint at pprofURL, into base+".pprof" and
// base+".allocs.pprof", and calls report with what each is ("CPU", "allocation"),
// its file and its error. The returned function waits for both.
func FetchProfiles(ctx context.Context, pprofURL, base string, delay time.Duration, seconds int,
	report func(what, path string, err error)) (wait func()) {
	var wg sync.WaitGroup
	for _, p := range []struct{ what, url, path string }{
		{"CPU", fmt.Sprintf("%sprofile?seconds=%d", pprofURL, seconds), base + ".pprof"},
		{"allocation", fmt.Sprintf("%sallocs?seconds=%d", pprofURL, seconds), base + ".allocs.pprof"},
	} {
		wg.Go(func() {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
			report(p.what, p.path, fetchProfile(ctx, p.url, p.path))
		})
	}
	return wg.Wait
}

func fetchProfile(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
