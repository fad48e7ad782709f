package daemon

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Command is the command line of a daemon whose configuration is one file:
// "run -config FILE" (until SIGINT or SIGTERM) and "check -config FILE".
type Command struct {
	// Name of the program, in messages.
	Name string
	// Usage is printed for help and for a wrong command.
	Usage string
	// DefaultConfig is the -config default.
	DefaultConfig string
	// New makes the daemon of the configuration file at path, logging to stderr.
	New func(path string, stderr io.Writer) Runner
}

// Runner is a daemon a Command runs.
type Runner interface {
	// Run serves until ctx is done.
	Run(ctx context.Context) error
	// Check validates the configuration, writing a summary to stdout.
	Check(stdout io.Writer) error
}

// Main runs c with args (without the program name) and returns the exit status: 0
// done, 1 the command failed, 2 a usage error.
func (c *Command) Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, c.Usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run", "check":
		fs := flag.NewFlagSet(c.Name+" "+args[0], flag.ContinueOnError)
		fs.SetOutput(stderr)
		path := fs.String("config", c.DefaultConfig, "configuration `file`")
		if err = fs.Parse(args[1:]); err != nil {
			return 2
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "%s %s: unexpected arguments %q\n", c.Name, args[0], fs.Args())
			return 2
		}
		d := c.New(*path, stderr)
		if args[0] == "check" {
			err = d.Check(stdout)
		} else {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			err = d.Run(ctx)
			stop()
		}
	case "help", "-h", "--help":
		fmt.Fprint(stdout, c.Usage)
		return 0
	default:
		fmt.Fprintf(stderr, "%s: unknown command %q\n%s", c.Name, args[0], c.Usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", c.Name, err)
		return 1
	}
	return 0
}
