package benchkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ErrFailed is what a benchmark's run returns when its report, already written,
// lists failures.
var ErrFailed = errors.New("failures listed in the report")

// Main runs a benchmark until it ends or SIGINT/SIGTERM, and returns the exit
// status: 0, or 1 with the reason on stderr (nothing more for ErrFailed: the
// report ends with the failures and the JSON line).
func Main(name string, stderr io.Writer, run func(context.Context) error) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrFailed):
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "%s: interrupted\n", name)
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
	}
	return 1
}

// WriteReportEnd ends a report: the failures, if any, then summary as one JSON
// object on the very last line.
func WriteReportEnd(w io.Writer, failures []string, summary any) {
	if len(failures) > 0 {
		fmt.Fprintf(w, "FAILURES (%d):\n", len(failures))
		for _, m := range failures {
			fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(m, "\n", "\n    "))
		}
	}
	js, err := json.Marshal(summary)
	if err != nil {
		js = fmt.Appendf(nil, `{"failures":[%q]}`, err.Error())
	}
	fmt.Fprintf(w, "%s\n", js)
}

// Bench is what every benchmark run keeps the same way: progress lines on Log, the
// failures that make its exit status 1, the directory of the binaries it starts, and
// the wait for a quiet machine before a measurement.
type Bench struct {
	Log        io.Writer     // progress lines, each stamped with the time of day
	BinDir     string        // where `make build` put the binaries (-bin; default bin)
	QuietCores float64       // WaitQuiet waits for other processes to use fewer cores than this (-quiet-cores)
	QuietWait  time.Duration // and gives up after this long; 0: WaitQuiet does not wait (-quiet-wait)
	Failures   []string      // what broke, in order; any makes the exit status 1
}

// Bin is the absolute path of the binary name in BinDir.
func (b *Bench) Bin(name string) string {
	p, err := filepath.Abs(filepath.Join(b.BinDir, name))
	if err != nil {
		return filepath.Join(b.BinDir, name)
	}
	return p
}

// Progress writes a progress line.
func (b *Bench) Progress(format string, args ...any) {
	fmt.Fprintf(b.Log, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// Fail records a failure and says so in a progress line.
func (b *Bench) Fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.Failures = append(b.Failures, msg)
	b.Progress("FAILED: %s", msg)
}

// Err is ErrFailed when a failure was recorded, nil otherwise: what run returns once
// the report is written.
func (b *Bench) Err() error {
	if len(b.Failures) > 0 {
		return ErrFailed
	}
	return nil
}

// WaitQuiet waits, within QuietWait, until the processes other than ours use fewer
// than QuietCores (see the function WaitQuiet); when they still do not, it says so
// and the measurement goes ahead.
func (b *Bench) WaitQuiet(ctx context.Context, ours ...CPUClock) error {
	if b.QuietWait <= 0 {
		return nil
	}
	others, quiet, err := WaitQuiet(ctx, b.QuietCores, b.QuietWait, ours...)
	if err != nil {
		return err
	}
	if !quiet {
		b.Progress("other processes still use %.2f cores after %v: measuring anyway", others, b.QuietWait)
	}
	return nil
}
