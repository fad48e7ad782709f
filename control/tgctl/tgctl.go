package tgctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// DefaultAPI is the API's URL unless --api, TIERGATE_API or the config file says
// otherwise: controld's default listen address (controld.DefaultListen).
const DefaultAPI = "http://127.0.0.1:7443"

// Environment variables tgctl reads.
const (
	EnvAPI   = "TIERGATE_API"
	EnvToken = "TIERGATE_TOKEN"
)

// FileConfig is tgctl's config file, YAML, by default
// $XDG_CONFIG_HOME/tiergate/tgctl.yaml (~/.config/tiergate/tgctl.yaml). A flag or an
// environment variable overrides what it says.
type FileConfig struct {
	// API is controld's URL, http://host:port or https://host:port. Default
	// DefaultAPI.
	API string `yaml:"api"`
	// Token is the API token, "<name>.<64 hex digits>". Default none.
	Token string `yaml:"token"`
	// CAFile is the PEM file of the CA the API's certificate chains to, for an https
	// API; a relative path is from the config file's folder. Default: the system's
	// roots.
	CAFile string `yaml:"ca_file"`
}

// Env is what a run of tgctl reads and writes besides its arguments.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Getenv reads the environment; nil reads none.
	Getenv func(string) string
}

// Main runs tgctl with args (without the program's name) and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, Env{Stdin: os.Stdin, Stdout: stdout, Stderr: stderr, Getenv: os.Getenv})
}

// Run runs tgctl with args and returns its exit code (ExitOK, ExitConflict, …).
func Run(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if env.Stdin == nil {
		env.Stdin = strings.NewReader("")
	}
	o := &options{env: env}
	root := o.rootCommand()
	root.SetArgs(args)
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	err := root.ExecuteContext(ctx)
	if err != nil {
		if msg := err.Error(); msg != "" {
			fmt.Fprintf(env.Stderr, "tgctl: %s\n", msg)
		}
		var us *UsageError
		if errors.As(err, &us) {
			fmt.Fprintln(env.Stderr, "Run 'tgctl --help' for usage.")
		}
	}
	return ExitCode(err)
}

// options are the global flags and what they make.
type options struct {
	env        Env
	api        string
	token      string
	configFile string
	caFile     string
	output     string
	timeout    time.Duration

	flags *pflag.FlagSet
	ready bool // setup ran
	cl    *client
}

const rootLong = `tgctl is the command line of Tiergate's control plane: it reads and changes the
cluster configuration through controld's /v1 API.

The API and the token come from --api and --token, else TIERGATE_API and
TIERGATE_TOKEN, else the config file (--config, default
~/.config/tiergate/tgctl.yaml, with the keys api, token and ca_file), else
` + DefaultAPI + ` and no token.

Exit codes:
  0  done
  1  an error not listed below
  2  bad arguments or flags
  3  conflict: an object changed since it was read (412)
  4  invalid: the change is refused, each field named (422, certificate checks)
  5  not found (404)
  6  not authorized: no token, a bad token, or a role that may not (401, 403)
  7  the API could not be reached
tgctl diff exits 0 with no differences, 1 with differences, and >1 on an error (8
for what is 1 elsewhere).`

func (o *options) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "tgctl",
		Short:         "The command line of Tiergate's control plane (controld)",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          noArgs,
		RunE:          groupRun,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return o.setup()
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &UsageError{err} })
	f := root.PersistentFlags()
	f.StringVar(&o.api, "api", "", "controld's URL (env "+EnvAPI+"; default "+DefaultAPI+")")
	f.StringVar(&o.token, "token", "", "API token (env "+EnvToken+"; on the command line it shows in ps: prefer the environment or the config file)")
	f.StringVar(&o.configFile, "config", "", "config file (default ~/.config/tiergate/tgctl.yaml)")
	f.StringVar(&o.caFile, "ca-file", "", "PEM CA of an https API's certificate (default the system's roots)")
	f.StringVarP(&o.output, "output", "o", FormatTable, "output format: table, json or yaml")
	f.DurationVar(&o.timeout, "request-timeout", 30*time.Second, "time limit of each API request")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{FormatTable, FormatJSON, FormatYAML}, cobra.ShellCompDirectiveNoFileComp))
	o.flags = f

	root.AddCommand(
		o.getCommand(), o.deleteCommand(), o.applyCommand(), o.diffCommand(),
		o.revisionsCommand(), o.diffRevisionsCommand(), o.rollbackCommand(), o.rolloutCommand(),
		o.nodesCommand(), o.certCommand(), o.tokenCommand(), o.topCommand(),
		o.blacklistCommand(),
	)
	return root
}

// setup settles the global options before a command runs (and before a
// completion asks the API).
func (o *options) setup() error {
	if o.ready {
		return nil
	}
	switch o.output {
	case FormatTable, FormatJSON, FormatYAML:
	default:
		return usagef("-o %q: want table, json or yaml", o.output)
	}
	var fc FileConfig
	path, explicit := o.configFile, o.configFile != ""
	if !explicit {
		path = defaultConfigPath(o.env.Getenv)
	}
	if path != "" {
		data, err := os.ReadFile(path)
		switch {
		case err == nil:
			dec := yaml.NewDecoder(bytes.NewReader(data))
			dec.KnownFields(true)
			if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("reading the config file %s: %w", path, err)
			}
			if fc.CAFile != "" && !filepath.IsAbs(fc.CAFile) {
				fc.CAFile = filepath.Join(filepath.Dir(path), fc.CAFile)
			}
			if fc.Token != "" {
				if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
					fmt.Fprintf(o.env.Stderr, "tgctl: warning: %s holds a token and is readable by others (mode %v)\n", path, st.Mode().Perm())
				}
			}
		case explicit || !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("reading the config file: %w", err)
		}
	}
	pick := func(flag, env, file, def string) string {
		if o.flags.Changed(flag) {
			return map[string]string{"api": o.api, "token": o.token, "ca-file": o.caFile}[flag]
		}
		if env != "" {
			if v := o.env.Getenv(env); v != "" {
				return v
			}
		}
		if file != "" {
			return file
		}
		return def
	}
	o.api = pick("api", EnvAPI, fc.API, DefaultAPI)
	o.token = strings.TrimSpace(pick("token", EnvToken, fc.Token, ""))
	o.caFile = pick("ca-file", "", fc.CAFile, "")
	if o.timeout <= 0 {
		return usagef("--request-timeout %v: want a positive duration", o.timeout)
	}
	o.ready = true
	return nil
}

// defaultConfigPath is $XDG_CONFIG_HOME/tiergate/tgctl.yaml or
// $HOME/.config/tiergate/tgctl.yaml, "" when neither is set.
func defaultConfigPath(getenv func(string) string) string {
	if x := getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "tiergate", "tgctl.yaml")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "tiergate", "tgctl.yaml")
	}
	return ""
}

// client returns the API client of the options.
func (o *options) client() (*client, error) {
	if o.cl != nil {
		return o.cl, nil
	}
	if err := o.setup(); err != nil {
		return nil, err
	}
	c, err := newClient(o.api, o.token, o.caFile, o.timeout)
	if err != nil {
		return nil, err
	}
	if c.clear() && c.token != "" {
		fmt.Fprintf(o.env.Stderr, "tgctl: warning: %s is plain http to another host: the token crosses the network in clear\n", o.api)
	}
	o.cl = c
	return c, nil
}

// call is client().do.
func (o *options) call(ctx context.Context, r request, out any) (map[string][]string, error) {
	c, err := o.client()
	if err != nil {
		return nil, err
	}
	return c.do(ctx, r, out)
}

func (o *options) printer(cmd *cobra.Command) *printer {
	return &printer{w: cmd.OutOrStdout(), format: o.output}
}

// noArgs, exactArgs and rangeArgs check the arguments, a usage error otherwise.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
		}
		return usagef("%s takes no arguments, not %q", cmdName(cmd), args[0])
	}
	return nil
}

// cmdName is the command's path without the program's name: "cert upload".
func cmdName(cmd *cobra.Command) string {
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
}

func exactArgs(n int, names string) cobra.PositionalArgs {
	return rangeArgs(n, n, names)
}

func rangeArgs(lo, hi int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usagef("%s takes %s, not %d arguments", cmdName(cmd), names, len(args))
		}
		return nil
	}
}

// groupRun is the run of a command that only groups others: its help.
func groupRun(cmd *cobra.Command, _ []string) error { return cmd.Help() }
