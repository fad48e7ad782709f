package tgctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// The API's answers of the blacklist routes (control/api's PushResult,
// BlacklistInfo and Operation), as tgctl reads them.
type pushResult struct {
	List      string `json:"list"`
	Version   int64  `json:"version,omitempty"`
	Entries   int    `json:"entries"`
	Added     int    `json:"added,omitempty"`
	Removed   int    `json:"removed,omitempty"`
	Operation string `json:"operation"`
	State     string `json:"state"`
}

type blacklistInfo struct {
	Name        string    `json:"name"`
	Version     int64     `json:"version"`
	Entries     int64     `json:"entries"`
	BaseVersion int64     `json:"base_version"`
	Chunks      int       `json:"chunks"`
	Bytes       int64     `json:"bytes"`
	Deltas      int64     `json:"deltas"`
	DeltaBytes  int64     `json:"delta_bytes"`
	Updated     time.Time `json:"updated"`
	Who         string    `json:"who,omitempty"`
	Nodes       []struct {
		Node    string `json:"node"`
		Role    string `json:"role"`
		Version int64  `json:"version"`
		State   string `json:"state"`
		Hits    uint64 `json:"hits"`
	} `json:"nodes,omitempty"`
	Applied    int    `json:"applied"`
	NodesTotal int    `json:"nodes_total"`
	Hits       uint64 `json:"hits"`
}

type blOperation struct {
	ID      string    `json:"id"`
	List    string    `json:"list"`
	Kind    string    `json:"kind"`
	Who     string    `json:"who"`
	Entries int       `json:"entries"`
	Created time.Time `json:"created"`
	Version int64     `json:"version,omitempty"`
	Error   string    `json:"error,omitempty"`
	Stored  bool      `json:"stored"`
	State   string    `json:"state"`
	Message string    `json:"message"`
	Applied int       `json:"applied"`
	Nodes   int       `json:"nodes"`
}

// States of an operation (control/api's OpPending, OpFailed).
const (
	opPending = "pending"
	opFailed  = "failed"
)

// blacklistCommand is tgctl blacklist: pushes to the control plane's blacklists
// and what the nodes enforce.
func (o *options) blacklistCommand() *cobra.Command {
	bl := &cobra.Command{
		Use:     "blacklist",
		Aliases: []string{"blacklists", "bl"},
		Short:   "Push and see the blacklists every node enforces",
		Long: `The blacklists controld keeps and every l7d and l4d enforces (admin or risk-engine
tokens push; any token reads):

  tgctl blacklist add --ip 198.51.100.7 -d 4h -R scanner   one address (or --cidr)
  tgctl blacklist remove --ip 198.51.100.7
  tgctl blacklist push global -f list.txt                  a whole list: text, the
                                                           binary format, gzip, or
                                                           NDJSON (.ndjson, .jsonl)
  tgctl blacklist show global                              size, version, each node's
                                                           version and hits
  tgctl blacklist list
  tgctl blacklist operation <id> --wait 1m                 where a push stands

add and remove change the list named by --list (default global).`,
		Args: noArgs,
		RunE: groupRun,
	}
	bl.AddCommand(o.blacklistEntryCommand(false), o.blacklistEntryCommand(true), o.blacklistPushCommand(),
		o.blacklistShowCommand(), o.blacklistListCommand(), o.blacklistOperationCommand())
	return bl
}

// blacklistEntryCommand is blacklist add, or remove.
func (o *options) blacklistEntryCommand(remove bool) *cobra.Command {
	var ip, cidr, reason, list, key string
	var dur time.Duration
	var expires string
	cmd := &cobra.Command{
		Use:   "add --ip <address> | --cidr <prefix> [-d <duration> | --expires <time>] [-R <reason>]",
		Short: "Add an address or a CIDR to a blacklist, with an expiry and a reason",
		Args:  noArgs,
	}
	if remove {
		cmd.Use, cmd.Short = "remove --ip <address> | --cidr <prefix>", "Remove an address or a CIDR from a blacklist"
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		line := map[string]any{}
		switch {
		case (ip == "") == (cidr == ""):
			return usagef("%s: give one of --ip and --cidr", cmdName(cmd))
		case ip != "":
			if _, err := netip.ParseAddr(ip); err != nil {
				return usagef("--ip %q: %v", ip, err)
			}
			line["ip"] = ip
		default:
			if _, err := netip.ParsePrefix(cidr); err != nil {
				return usagef("--cidr %q: %v", cidr, err)
			}
			line["cidr"] = cidr
		}
		if remove {
			line["op"] = "remove"
		} else {
			if dur < 0 {
				return usagef("-d %v: want a positive duration", dur)
			}
			if dur > 0 && expires != "" {
				return usagef("give -d or --expires, not both")
			}
			if dur > 0 {
				line["duration"] = dur.String()
			}
			if expires != "" {
				if _, err := time.Parse(time.RFC3339, expires); err != nil {
					return usagef("--expires %q: want RFC 3339 (2026-12-01T00:00:00Z)", expires)
				}
				line["expires"] = expires
			}
			if reason != "" {
				line["reason"] = reason
			}
		}
		body, err := json.Marshal(line)
		if err != nil {
			return err
		}
		var ans pushResult
		what := "adding to blacklist " + list
		if remove {
			what = "removing from blacklist " + list
		}
		if err := o.send(cmd.Context(), "POST", "/v1/blacklists/"+pathEscape(list)+"/delta", "application/x-ndjson", key, bytes.NewReader(body), what, &ans); err != nil {
			return err
		}
		return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
			verb := "added to"
			if remove {
				verb = "removed from"
			}
			fmt.Fprintf(t, "%s%s %s blacklist %s: version %d (operation %s)\n", ip, cidr, verb, ans.List, ans.Version, ans.Operation)
		})
	}
	f := cmd.Flags()
	f.StringVar(&ip, "ip", "", "an IPv4 or IPv6 `address`")
	f.StringVar(&cidr, "cidr", "", "a CIDR `prefix` (198.51.100.0/24)")
	f.StringVar(&list, "list", "global", "the blacklist's `name`")
	f.StringVar(&key, "idempotency-key", "", "an Idempotency-Key: the same push sent again with it is answered as the first, not made twice")
	if !remove {
		f.DurationVarP(&dur, "duration", "d", 0, "expire after this `long` (4h); default never")
		f.StringVar(&expires, "expires", "", "expire at this `time` (RFC 3339)")
		f.StringVarP(&reason, "reason", "R", "", "why (recorded with the entry)")
	}
	return cmd
}

// formats of blacklist push, and the Content-Type each is sent with.
var pushTypes = map[string]string{"auto": "", "text": "text/plain", "binary": "application/octet-stream", "ndjson": "application/x-ndjson"}

func (o *options) blacklistPushCommand() *cobra.Command {
	var file, format, key string
	var wait, interval time.Duration
	cmd := &cobra.Command{
		Use:   "push <name> -f <file>",
		Short: "Replace a whole blacklist with a file's entries",
		Long: `Replace a whole blacklist with the entries of a file ("-" for standard input): the
text format (an address or CIDR a line, expires= or ttl=), the policy/blacklist
binary format, either gzip-compressed, or NDJSON ({"ip"|"cidr", "expires"|
"duration", "reason"} a line; by the .ndjson or .jsonl extension, or --format
ndjson). Bad lines are refused, each by its number, and nothing changes (exit 4).
A large list is stored after the answer: the operation it gives is polled with
--wait until every node applied it (exit 1 if it failed or is still pending).`,
		Args:              exactArgs(1, "a blacklist's name"),
		ValidArgsFunction: o.blacklistCompletion,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			ct, ok := pushTypes[format]
			if !ok {
				return usagef("--format %q: want auto, text, binary or ndjson", format)
			}
			if file == "" {
				return usagef("%s: -f <file> is required", cmdName(cmd))
			}
			if ct == "" {
				ct = "application/octet-stream" // controld tells text, binary and gzip apart
				switch strings.ToLower(filepath.Ext(strings.TrimSuffix(file, ".gz"))) {
				case ".ndjson", ".jsonl":
					ct = "application/x-ndjson"
				}
			}
			var in io.Reader = o.env.Stdin
			if file != "-" {
				fh, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("reading the list: %w", err)
				}
				defer fh.Close()
				in = fh
			}
			var ans pushResult
			if err := o.send(cmd.Context(), "PUT", "/v1/blacklists/"+pathEscape(name), ct, key, in, "pushing blacklist "+name, &ans); err != nil {
				return err
			}
			if wait > 0 {
				return o.waitOperation(cmd, ans.Operation, wait, interval)
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				if ans.State == opPending {
					fmt.Fprintf(t, "blacklist %s: %d entries accepted, being stored: tgctl blacklist operation %s --wait 1m\n", ans.List, ans.Entries, ans.Operation)
					return
				}
				fmt.Fprintf(t, "blacklist %s: %d entries, version %d (operation %s)\n", ans.List, ans.Entries, ans.Version, ans.Operation)
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the list's `file` (- for standard input)")
	f.StringVar(&format, "format", "auto", "the file's format: auto (by extension and content), text, binary or ndjson")
	f.StringVar(&key, "idempotency-key", "", "an Idempotency-Key: the same push sent again with it is answered as the first, not made twice")
	f.DurationVar(&wait, "wait", 0, "poll the push's operation until every node applied it, at most this `long`")
	f.DurationVar(&interval, "interval", time.Second, "time between polls with --wait")
	return cmd
}

func (o *options) blacklistOperationCommand() *cobra.Command {
	var wait, interval time.Duration
	cmd := &cobra.Command{
		Use:   "operation <id>",
		Short: "Where a push stands: pending, applied on N of M nodes, or failed and why",
		Long: `Where a push stands: pending (being stored, or stored and not yet applied by every
node), applied (every node that enforces blacklists applied it), or failed and
why. With --wait it polls until applied or failed; exit 1 when it failed or is
still pending when the time is up.`,
		Args: exactArgs(1, "an operation's ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.waitOperation(cmd, args[0], wait, interval)
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "poll until applied or failed, at most this `long`")
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between polls with --wait")
	return cmd
}

// waitOperation prints an operation, polled until it is applied or failed when
// wait is above 0.
func (o *options) waitOperation(cmd *cobra.Command, id string, wait, interval time.Duration) error {
	if interval <= 0 {
		return usagef("--interval %v: want a positive duration", interval)
	}
	deadline := time.Now().Add(wait)
	var op blOperation
	for {
		if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/operations/" + pathEscape(id), what: "reading operation " + id}, &op); err != nil {
			return err
		}
		if wait <= 0 || op.State != opPending || !time.Now().Add(interval).Before(deadline) {
			break
		}
		select {
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		case <-time.After(interval):
		}
	}
	if err := o.printer(cmd).data(op, func(t *tabwriter.Writer) {
		fmt.Fprintf(t, "operation %s (%s of blacklist %s, %d entries, by %s): %s\n", op.ID, op.Kind, op.List, op.Entries, orDash(op.Who), op.Message)
	}); err != nil {
		return err
	}
	switch {
	case op.State == opFailed:
		return &exitError{code: ExitError, msg: fmt.Sprintf("operation %s failed: %s", op.ID, op.Error)}
	case wait > 0 && op.State == opPending:
		return &exitError{code: ExitError, msg: fmt.Sprintf("operation %s still pending after %v: %s", op.ID, wait, op.Message)}
	}
	return nil
}

func (o *options) blacklistShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "show <name>",
		Short:             "A blacklist: size, version, and the version each node enforces and its hits",
		Args:              exactArgs(1, "a blacklist's name"),
		ValidArgsFunction: o.blacklistCompletion,
		RunE: func(cmd *cobra.Command, args []string) error {
			var b blacklistInfo
			if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/blacklists/" + pathEscape(args[0]), what: "reading blacklist " + args[0]}, &b); err != nil {
				return err
			}
			return o.printer(cmd).data(b, func(t *tabwriter.Writer) {
				row(t, "NAME", "VERSION", "ENTRIES", "CHUNKS", "BYTES", "DELTAS", "UPDATED", "BY", "APPLIED", "HITS")
				row(t, b.Name, b.Version, b.Entries, b.Chunks, b.Bytes, b.Deltas, b.Updated.Format(time.RFC3339), orDash(b.Who), fmt.Sprintf("%d/%d", b.Applied, b.NodesTotal), b.Hits)
				if len(b.Nodes) > 0 {
					fmt.Fprintln(t)
					row(t, "NODE", "ROLE", "VERSION", "STATE", "HITS")
					for _, n := range b.Nodes {
						row(t, n.Node, orDash(n.Role), n.Version, n.State, n.Hits)
					}
				}
			})
		},
	}
}

func (o *options) blacklistListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "Every blacklist: version, size, last write",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ans struct {
				Lists []blacklistInfo `json:"lists"`
			}
			if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/blacklists", what: "listing the blacklists"}, &ans); err != nil {
				return err
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				row(t, "NAME", "VERSION", "ENTRIES", "CHUNKS", "DELTAS", "UPDATED", "BY")
				for _, b := range ans.Lists {
					row(t, b.Name, b.Version, b.Entries, b.Chunks, b.Deltas, b.Updated.Format(time.RFC3339), orDash(b.Who))
				}
			})
		},
	}
}

// send calls the API with a body that is not JSON (a list, NDJSON lines), with
// an Idempotency-Key when key is set, and decodes its answer as client.do does.
// A list can be large: the request has no time limit but ctx's.
func (o *options) send(ctx context.Context, method, path, contentType, key string, body io.Reader, what string, out any) error {
	c, err := o.client()
	if err != nil {
		return err
	}
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	hc := *c.hc
	hc.Timeout = 0
	resp, err := hc.Do(req)
	if err != nil {
		if unreachable(err) {
			return &UnreachableError{API: c.base.String(), Err: err}
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return &UnreachableError{API: c.base.String(), Err: fmt.Errorf("reading the answer: %w", err)}
	}
	if resp.StatusCode >= 400 {
		ae := &APIError{What: what}
		if json.Unmarshal(data, ae) != nil || ae.Code == "" {
			ae = &APIError{What: what, Code: "http", Message: strings.TrimSpace(string(data))}
		}
		ae.Status = resp.StatusCode
		return ae
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s: the API's answer: %w", what, err)
	}
	return nil
}

// blacklistCompletion completes a blacklist's name, with its version and size.
func (o *options) blacklistCompletion(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var ans struct {
		Lists []blacklistInfo `json:"lists"`
	}
	if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/blacklists", what: "listing the blacklists"}, &ans); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	var out []string
	for _, b := range ans.Lists {
		if strings.HasPrefix(b.Name, prefix) {
			out = append(out, fmt.Sprintf("%s\tversion %d, %d entries", b.Name, b.Version, b.Entries))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
