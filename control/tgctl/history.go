package tgctl

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// revisionAnswer is one revision of GET /v1/revisions.
type revisionAnswer struct {
	Revision int64     `json:"revision"`
	Time     time.Time `json:"time"`
	Who      string    `json:"who"`
	Changes  []struct {
		Op   string `json:"op"`
		Kind string `json:"kind"`
		Name string `json:"name"`
	} `json:"changes"`
}

type revisionsAnswer struct {
	Revisions []revisionAnswer `json:"revisions"`
}

func parseRevision(s string) (int64, error) {
	r, err := strconv.ParseInt(s, 10, 64)
	if err != nil || r <= 0 {
		return 0, usagef("revision %q: want a positive number", s)
	}
	return r, nil
}

// revisionCompletion offers the newest revisions, each with who made it and what
// it changed.
func (o *options) revisionCompletion(maxArgs int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) >= maxArgs {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var ans revisionsAnswer
		if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/revisions?limit=20", what: "listing the revisions"}, &ans); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		out := make([]string, 0, len(ans.Revisions))
		for _, r := range ans.Revisions {
			var ch []string
			for _, c := range r.Changes {
				ch = append(ch, c.Op+" "+c.Kind+"/"+c.Name)
			}
			out = append(out, strconv.FormatInt(r.Revision, 10)+"\t"+r.Who+": "+strings.Join(ch, ", "))
		}
		return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveKeepOrder
	}
}

func (o *options) revisionsCommand() *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "revisions",
		Short: "List the configuration's revisions, newest first: when, who and what changed",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit <= 0 {
				return usagef("--limit %d: want a positive number", limit)
			}
			var ans revisionsAnswer
			if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/revisions?limit=" + strconv.Itoa(limit), what: "listing the revisions"}, &ans); err != nil {
				return err
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				row(t, "REVISION", "TIME", "WHO", "CHANGES")
				for _, r := range ans.Revisions {
					var ch []string
					for _, c := range r.Changes {
						ch = append(ch, c.Op+" "+c.Kind+"/"+c.Name)
					}
					row(t, r.Revision, r.Time.Local().Format(time.DateTime), orDash(r.Who), orDash(strings.Join(ch, ", ")))
				}
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 20, "the number of revisions")
	return cmd
}

func (o *options) diffRevisionsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "diff-revisions <from> [to]",
		Short: "Show what changed between two revisions (to: now by default)",
		Long: `Show what changed between two revisions of the configuration, as a unified diff of
each object's YAML; to is the current revision by default. Exit 0 whether or not
there are differences.`,
		Args:              rangeArgs(1, 2, "one or two revisions"),
		ValidArgsFunction: o.revisionCompletion(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, err := parseRevision(args[0])
			if err != nil {
				return err
			}
			path := "/v1/diff?from=" + strconv.FormatInt(from, 10)
			if len(args) == 2 {
				to, err := parseRevision(args[1])
				if err != nil {
					return err
				}
				path += "&to=" + strconv.FormatInt(to, 10)
			}
			var ans diffAnswer
			if _, err := o.call(cmd.Context(), request{method: "GET", path: path, what: "reading the diff"}, &ans); err != nil {
				return err
			}
			if o.output != FormatTable {
				return o.printer(cmd).data(ans, nil)
			}
			to := "now"
			if ans.To > 0 {
				to = "revision " + strconv.FormatInt(ans.To, 10)
			}
			for _, c := range ans.Changes {
				if err := writeObjectDiff(cmd.OutOrStdout(), c, "revision "+strconv.FormatInt(from, 10), to); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// currentRevision is the newest revision of the configuration.
func (o *options) currentRevision(ctx context.Context) (int64, error) {
	var ans revisionsAnswer
	if _, err := o.call(ctx, request{method: "GET", path: "/v1/revisions?limit=1", what: "reading the current revision"}, &ans); err != nil {
		return 0, err
	}
	if len(ans.Revisions) == 0 {
		return 0, fmt.Errorf("reading the current revision: the configuration has no revision yet")
	}
	return ans.Revisions[0].Revision, nil
}

// rollbackAnswer is POST /v1/rollback.
type rollbackAnswer struct {
	Revision int64        `json:"revision"`
	To       int64        `json:"to"`
	DryRun   bool         `json:"dry_run,omitempty"`
	Changes  []diffChange `json:"changes"`
}

func (o *options) rollbackCommand() *cobra.Command {
	var expect int64
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "rollback <revision>",
		Short: "Make the configuration what it was at a revision, as a new change set",
		Long: `Make every object what it was at a revision: one change set that puts back the
objects of then and deletes those made since, committed as a new revision. It
carries the current revision (read just before, or --expect-revision's): if the
configuration moved on meanwhile, nothing is changed (exit 3). A revision older
than the store's history (compacted) cannot be rolled back to. --dry-run checks
the rollback and shows what it would change, storing nothing.`,
		Args:              exactArgs(1, "a revision"),
		ValidArgsFunction: o.revisionCompletion(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rev, err := parseRevision(args[0])
			if err != nil {
				return err
			}
			cur := expect
			if cur == 0 {
				if cur, err = o.currentRevision(cmd.Context()); err != nil {
					return err
				}
			}
			var ans rollbackAnswer
			if _, err := o.call(cmd.Context(), request{method: "POST", path: "/v1/rollback",
				body: map[string]any{"revision": rev, "expect_revision": cur, "dry_run": dryRun}, what: "rolling back to revision " + args[0]}, &ans); err != nil {
				return err
			}
			if dryRun && o.output == FormatTable {
				for _, c := range ans.Changes {
					if err := writeObjectDiff(cmd.OutOrStdout(), c, "now", "at revision "+args[0]); err != nil {
						return err
					}
				}
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				switch {
				case len(ans.Changes) == 0:
					fmt.Fprintf(t, "nothing to change: the objects are revision %d's\n", rev)
				case dryRun:
					fmt.Fprintf(t, "a rollback to revision %d would change %d object(s) (dry run: nothing stored)\n", rev, len(ans.Changes))
				default:
					fmt.Fprintf(t, "rolled back to revision %d at revision %d: %d object(s) changed\n", rev, ans.Revision, len(ans.Changes))
				}
			})
		},
	}
	cmd.Flags().Int64Var(&expect, "expect-revision", 0, "the current `revision` (default: read just before)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "check the rollback and show its changes, storing nothing")
	return cmd
}

// rolloutAnswer is GET /v1/rollouts/{revision}.
type rolloutAnswer struct {
	Revision int64 `json:"revision"`
	Nodes    []struct {
		Node            string `json:"node"`
		Role            string `json:"role"`
		State           string `json:"state"`
		AppliedRevision int64  `json:"applied_revision"`
		RefusedRevision int64  `json:"refused_revision,omitempty"`
		Error           string `json:"error,omitempty"`
	} `json:"nodes"`
	Applied int `json:"applied"`
	Refused int `json:"refused"`
	Pending int `json:"pending"`
	Lost    int `json:"lost"`
}

func (o *options) rolloutCommand() *cobra.Command {
	group := &cobra.Command{
		Use:   "rollout",
		Short: "Follow a revision to the nodes",
		Args:  noArgs,
		RunE:  groupRun,
	}
	var wait time.Duration
	var interval time.Duration
	status := &cobra.Command{
		Use:   "status [revision]",
		Short: "Which nodes applied a revision, which refused it and why, which have not answered",
		Long: `Which nodes applied a revision (the newest by default), which refused it and why,
which have not answered yet (pending) and which stopped reporting (lost).

Without --wait it prints the state once. With --wait it polls until no node is
pending, or the time is up. Exit 0 when no node is pending and none refused, 1
when a node refused the revision or (with --wait) some are still pending when the
time is up.`,
		Args:              rangeArgs(0, 1, "an optional revision"),
		ValidArgsFunction: o.revisionCompletion(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rev int64
			var err error
			if len(args) == 1 {
				rev, err = parseRevision(args[0])
			} else {
				rev, err = o.currentRevision(cmd.Context())
			}
			if err != nil {
				return err
			}
			if interval <= 0 {
				return usagef("--interval %v: want a positive duration", interval)
			}
			deadline := time.Now().Add(wait)
			var ans rolloutAnswer
			for {
				ans = rolloutAnswer{}
				if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/rollouts/" + strconv.FormatInt(rev, 10), what: "reading the rollout of revision " + strconv.FormatInt(rev, 10)}, &ans); err != nil {
					return err
				}
				if wait <= 0 || ans.Pending == 0 || !time.Now().Add(interval).Before(deadline) {
					break
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(interval):
				}
			}
			if err := o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				fmt.Fprintf(t, "revision %d: %d applied, %d refused, %d pending, %d lost\n", ans.Revision, ans.Applied, ans.Refused, ans.Pending, ans.Lost)
				if len(ans.Nodes) > 0 {
					row(t, "NODE", "ROLE", "STATE", "APPLIED", "ERROR")
				}
				for _, n := range ans.Nodes {
					row(t, n.Node, orDash(n.Role), n.State, n.AppliedRevision, orDash(n.Error))
				}
			}); err != nil {
				return err
			}
			switch {
			case ans.Refused > 0:
				return &exitError{code: ExitError, msg: fmt.Sprintf("revision %d: refused by %d node(s)", ans.Revision, ans.Refused)}
			case wait > 0 && ans.Pending > 0:
				return &exitError{code: ExitError, msg: fmt.Sprintf("revision %d: %d node(s) still pending after %v", ans.Revision, ans.Pending, wait)}
			}
			return nil
		},
	}
	status.Flags().DurationVar(&wait, "wait", 0, "poll until no node is pending, at most this `long`")
	status.Flags().DurationVar(&interval, "interval", time.Second, "time between polls with --wait")
	group.AddCommand(status)
	return group
}

// nodesAnswer is GET /v1/nodes.
type nodesAnswer struct {
	Revision int64 `json:"revision"`
	Nodes    []struct {
		Node            string    `json:"node"`
		Role            string    `json:"role"`
		Address         string    `json:"address"`
		AppliedRevision int64     `json:"applied_revision"`
		Lag             int64     `json:"lag"`
		State           string    `json:"state"`
		Error           string    `json:"error,omitempty"`
		Started         time.Time `json:"started"`
		UptimeSeconds   float64   `json:"uptime_seconds"`
		Updated         time.Time `json:"updated"`
		Certificates    []struct {
			Name    string `json:"name"`
			Version int    `json:"version"`
			SHA256  string `json:"sha256"`
		} `json:"certificates"`
	} `json:"nodes"`
}

func (o *options) nodesCommand() *cobra.Command {
	forget := &cobra.Command{
		Use:   "forget <node>",
		Short: "Forget a lost node, so that it is no longer listed (admin)",
		Long: `Forget a lost node: one taken out of the cluster, no longer listed as lost. A node
that reports is not forgotten (an error, exit 1).`,
		Args: exactArgs(1, "a node's name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := o.call(cmd.Context(), request{method: "DELETE", path: "/v1/nodes/" + pathEscape(args[0]), what: "forgetting node " + args[0]}, nil); err != nil {
				return err
			}
			return o.printer(cmd).data(map[string]string{"node": args[0], "op": "forget"}, func(t *tabwriter.Writer) {
				fmt.Fprintf(t, "node %s forgotten\n", args[0])
			})
		},
	}
	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "The nodes: role, address, applied revision and lag, state, uptime, certificates",
		Long: `Every node that reports to the control plane: its role, address, the revision it
applied and how far behind the newest it is (lag), its state (ok, refused: it
refused the newest snapshot and serves the one before, lost: it stopped reporting
and its lease ran out), its uptime, and the certificates it serves (name, version
and the leaf's SHA-256; -o json or yaml show the whole fingerprint).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ans nodesAnswer
			if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/nodes", what: "listing the nodes"}, &ans); err != nil {
				return err
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				row(t, "NODE", "ROLE", "ADDRESS", "APPLIED", "LAG", "STATE", "UPTIME", "CERTIFICATES")
				for _, n := range ans.Nodes {
					var certs []string
					for _, c := range n.Certificates {
						fp := c.SHA256
						if len(fp) > 12 {
							fp = fp[:12]
						}
						certs = append(certs, fmt.Sprintf("%s@%d:%s", c.Name, c.Version, fp))
					}
					uptime := "-"
					if n.UptimeSeconds > 0 {
						uptime = (time.Duration(n.UptimeSeconds) * time.Second).String()
					}
					row(t, n.Node, orDash(n.Role), orDash(n.Address), n.AppliedRevision, n.Lag, orDash(n.State), uptime, orDash(strings.Join(certs, " ")))
				}
			})
		},
	}
	nodes.AddCommand(forget)
	return nodes
}
