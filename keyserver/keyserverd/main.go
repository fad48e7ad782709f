package keyserverd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"

	"github.com/tiergate/tiergate/internal/daemon"
	"github.com/tiergate/tiergate/keyserver/backend"
	"github.com/tiergate/tiergate/keyserver/hsm"
	"github.com/tiergate/tiergate/keyserver/softkey"
)

const usage = `usage: keyserverd <command> [flags]

commands:
  run     -config FILE                      serve until SIGINT/SIGTERM; SIGHUP or POST /reload reloads
  check   -config FILE                      validate the configuration, the TLS files and the keys, then exit
  import  -config FILE -label L -key FILE   store a PEM private key in the first backend
  keys    -config FILE                      list the keys the backends offer
`

// DefaultConfig is the configuration file used without -config.
const DefaultConfig = "/etc/tiergate/keyserverd.yaml"

// Main runs keyserverd with args (without the program name) and returns the exit
// status: 0 done, 1 the command failed, 2 a usage error. SIGINT and SIGTERM stop
// `run` gracefully.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		var err error
		switch args[0] {
		case "import":
			err = cmdImport(args[1:], stdout, stderr)
		case "keys":
			err = cmdKeys(args[1:], stdout, stderr)
		default:
			cmd := daemon.Command{
				Name: "keyserverd", Usage: usage, DefaultConfig: DefaultConfig,
				New: func(path string, stderr io.Writer) daemon.Runner { return &Daemon{Path: path, Stderr: stderr} },
			}
			return cmd.Main(args, stdout, stderr)
		}
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 2
			}
			fmt.Fprintf(stderr, "keyserverd: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprint(stderr, usage)
	return 2
}

func parseFlags(name string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (*FileConfig, error) {
	fs := flag.NewFlagSet("keyserverd "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", DefaultConfig, "configuration `file`")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: unexpected argument %q", name, fs.Arg(0))
	}
	return loadToolConfig(*path)
}

// loadToolConfig reads a configuration for import and keys, which serve no client:
// a file without client rules is taken as it is, not refused.
func loadToolConfig(path string) (*FileConfig, error) {
	return daemon.ReadConfig(path, func(c *FileConfig) error {
		if len(c.Server.Clients) == 0 {
			c.Server.AllowAllClients = true
		}
		return c.validate()
	})
}

// openBackends opens the configured backends, PKCS#11 first. With allKeys the token's
// key selection is ignored: an import must not fail because the configuration already
// names the key being imported.
func openBackends(cfg *FileConfig, log *slog.Logger, allKeys bool) ([]backend.Backend, error) {
	var out []backend.Backend
	if cfg.PKCS11 != nil {
		c := *cfg.PKCS11
		c.Logger = log
		if allKeys {
			c.Keys = nil
		}
		b, err := hsm.New(c)
		if err != nil {
			return nil, fmt.Errorf("opening PKCS#11 backend: %w", err)
		}
		out = append(out, b)
	}
	if cfg.Software != nil {
		b, err := softkey.New(*cfg.Software)
		if err != nil {
			closeAll(out)
			return nil, fmt.Errorf("opening software backend: %w", err)
		}
		out = append(out, b)
	}
	return out, nil
}

func closeAll(bs []backend.Backend) {
	for _, b := range bs {
		b.Close()
	}
}

func cmdImport(args []string, stdout, stderr io.Writer) error {
	var label, keyPath string
	cfg, err := parseFlags("import", args, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&label, "label", "", "`label` of the key in the token (required)")
		fs.StringVar(&keyPath, "key", "", "PEM private key `file` (required)")
	})
	if err != nil {
		return err
	}
	if label == "" || keyPath == "" {
		return errors.New("import: -label and -key are required")
	}
	pemKey, err := os.ReadFile(keyPath)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	priv, err := softkey.ParsePEM(pemKey)
	if err != nil {
		return fmt.Errorf("import: %s: %w", keyPath, err)
	}
	backends, err := openBackends(cfg, daemon.NewLogger(cfg.LogLevel, stderr), true)
	if err != nil {
		return err
	}
	defer closeAll(backends)
	k, err := backends[0].Import(label, priv)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	fmt.Fprintf(stdout, "%s\t%s\t%s\t%s\n", k.ID, k.Type, backends[0].Name(), k.Label)
	return nil
}

func cmdKeys(args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags("keys", args, stderr, nil)
	if err != nil {
		return err
	}
	backends, err := openBackends(cfg, daemon.NewLogger(cfg.LogLevel, stderr), false)
	if err != nil {
		return err
	}
	defer closeAll(backends)
	return listKeys(stdout, backends)
}

// listKeys writes a table of the backends' keys.
func listKeys(w io.Writer, backends []backend.Backend) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY ID\tTYPE\tBACKEND\tLABEL")
	for _, b := range backends {
		keys, err := b.Keys()
		if err != nil {
			return fmt.Errorf("keys of %s: %w", b.Name(), err)
		}
		for _, k := range keys {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Type, b.Name(), k.Label)
		}
	}
	return tw.Flush()
}
