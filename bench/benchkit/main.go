package benchkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
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
