package tgctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// listAnswer is GET /v1/{kind}.
type listAnswer struct {
	Revision int64 `json:"revision"`
	Items    []struct {
		Name     string          `json:"name"`
		Revision int64           `json:"revision"`
		Object   json.RawMessage `json:"object"`
	} `json:"items"`
}

// committed is the answer of a write.
type committed struct {
	Revision int64 `json:"revision"`
}

func (o *options) kindCompletion(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		return Kinds, cobra.ShellCompDirectiveNoFileComp
	case 1:
		kind, err := canonicalKind(args[0])
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var list listAnswer
		if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/" + kind, what: "listing " + kind}, &list); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names := make([]string, 0, len(list.Items))
		for _, it := range list.Items {
			names = append(names, it.Name)
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
	return nil, cobra.ShellCompDirectiveNoFileComp
}

func (o *options) getCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get <kind> [name]",
		Short: "List the objects of a kind, or show one",
		Long: `List the objects of a kind (` + strings.Join(Kinds, ", ") + `), or show one.

The table shows each object's name and revision (its ETag, what If-Match sends).
With -o json or -o yaml the objects are printed as apply takes them, each with its
kind field: a list as a JSON array or a YAML stream, one object as itself; edit and
give them back to tgctl apply -f.`,
		Example: `  tgctl get pools
  tgctl get routing web -o yaml > web.yaml`,
		Args:              rangeArgs(1, 2, "a kind and an optional name"),
		ValidArgsFunction: o.kindCompletion,
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := canonicalKind(args[0])
			if err != nil {
				return &UsageError{err}
			}
			p := o.printer(cmd)
			if len(args) == 2 {
				obj, rev, err := o.getObject(cmd.Context(), kind, args[1])
				if err != nil {
					return err
				}
				if obj == nil {
					return &APIError{What: "reading " + kind + "/" + args[1], Status: http.StatusNotFound, Code: "not_found", Message: "no such object"}
				}
				doc, err := withKind(kind, obj)
				if err != nil {
					return err
				}
				return p.data(doc, func(t *tabwriter.Writer) {
					row(t, "NAME", "REVISION")
					row(t, args[1], rev)
				})
			}
			var list listAnswer
			if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/" + kind, what: "listing " + kind}, &list); err != nil {
				return err
			}
			docs := make([][]byte, 0, len(list.Items))
			for _, it := range list.Items {
				d, err := withKind(kind, it.Object)
				if err != nil {
					return err
				}
				docs = append(docs, d)
			}
			switch o.output {
			case FormatYAML:
				return yamlDocs(cmd.OutOrStdout(), docs)
			case FormatJSON:
				arr := make([]json.RawMessage, len(docs))
				for i, d := range docs {
					arr[i] = d
				}
				return p.json(arr)
			}
			return p.data(nil, func(t *tabwriter.Writer) {
				row(t, "NAME", "REVISION")
				for _, it := range list.Items {
					row(t, it.Name, it.Revision)
				}
			})
		},
	}
}

// getObject reads one object and its revision; nil and 0 when there is none.
func (o *options) getObject(ctx context.Context, kind, name string) (json.RawMessage, int64, error) {
	var obj json.RawMessage
	hdr, err := o.call(ctx, request{method: "GET", path: "/v1/" + kind + "/" + pathEscape(name), what: "reading " + kind + "/" + name}, &obj)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Code == "not_found" {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	rev, err := revisionOf(http.Header(hdr).Get("ETag"))
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s/%s: %w", kind, name, err)
	}
	return obj, rev, nil
}

func (o *options) deleteCommand() *cobra.Command {
	var ifMatch int64
	cmd := &cobra.Command{
		Use:   "delete <kind> <name>",
		Short: "Delete an object",
		Long: `Delete an object. The delete carries If-Match with the object's revision: the one
read just before, or --if-match's, so an object changed since is not deleted (exit 3).
An object something else names is not deleted either (exit 4, the field named).`,
		Args:              exactArgs(2, "a kind and a name"),
		ValidArgsFunction: o.kindCompletion,
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := canonicalKind(args[0])
			if err != nil {
				return &UsageError{err}
			}
			name := args[1]
			rev := ifMatch
			if rev == 0 {
				obj, r, err := o.getObject(cmd.Context(), kind, name)
				if err != nil {
					return err
				}
				if obj == nil {
					return &APIError{What: "reading " + kind + "/" + name, Status: http.StatusNotFound, Code: "not_found", Message: "no such object"}
				}
				rev = r
			}
			var c committed
			if _, err := o.call(cmd.Context(), request{method: "DELETE", path: "/v1/" + kind + "/" + pathEscape(name),
				header: map[string]string{"If-Match": etag(rev)}, what: "deleting " + kind + "/" + name}, &c); err != nil {
				return err
			}
			return o.printer(cmd).data(map[string]any{"kind": kind, "name": name, "op": "delete", "revision": c.Revision}, func(t *tabwriter.Writer) {
				fmt.Fprintf(t, "%s/%s deleted at revision %d\n", kind, name, c.Revision)
			})
		},
	}
	cmd.Flags().Int64Var(&ifMatch, "if-match", 0, "the object's `revision` to delete (default: the one read just before)")
	return cmd
}

// planned is one object of an apply file against what the store holds.
type planned struct {
	Document
	before   json.RawMessage // nil: absent
	revision int64           // its revision, 0 when absent
}

func (p planned) op() string {
	switch {
	case p.before == nil:
		return "create"
	case sameJSON(p.before, p.Object):
		return "unchanged"
	}
	return "update"
}

// readFile reads -f's file, "-" standard input.
func (o *options) readFile(name string) ([]Document, error) {
	if name == "" {
		return nil, usagef("-f: a file is required (- for standard input)")
	}
	var data []byte
	var err error
	if name == "-" {
		data, err = io.ReadAll(io.LimitReader(o.env.Stdin, 64<<20))
		name = "<stdin>"
	} else {
		data, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	docs, err := ParseDocuments(name, data)
	if err != nil {
		return nil, &UsageError{err}
	}
	return docs, nil
}

// plan reads the current object of each document (none with createOnly).
func (o *options) plan(ctx context.Context, docs []Document, createOnly bool) ([]planned, error) {
	out := make([]planned, 0, len(docs))
	for _, d := range docs {
		p := planned{Document: d}
		if !createOnly {
			obj, rev, err := o.getObject(ctx, d.Kind, d.Name)
			if err != nil {
				return nil, err
			}
			p.before, p.revision = obj, rev
		}
		out = append(out, p)
	}
	return out, nil
}

// MaxChanges is the most objects one change set holds (control/store.MaxChanges).
const MaxChanges = 100

// changeRequest is one write of POST /v1/changesets.
type changeRequest struct {
	Kind       string          `json:"kind"`
	Name       string          `json:"name"`
	Delete     bool            `json:"delete,omitempty"`
	Object     json.RawMessage `json:"object,omitempty"`
	IfRevision *int64          `json:"if_revision"`
}

type changeSetRequest struct {
	Changes []changeRequest `json:"changes"`
}

// changeSet is the change set of the planned objects that change.
func changeSet(plan []planned) changeSetRequest {
	var cs changeSetRequest
	for _, p := range plan {
		if p.op() == "unchanged" {
			continue
		}
		rev := p.revision
		cs.Changes = append(cs.Changes, changeRequest{Kind: p.Kind, Name: p.Name, Object: p.Object, IfRevision: &rev})
	}
	return cs
}

const documentsHelp = `The file is YAML (JSON is YAML too), "-" for standard input, and holds one or
more documents separated by "---". Each document is an object as controld stores
it with a kind field beside its own fields, or a list of such objects:

  kind: pools            # one of ` + "listeners, routing, pools, cert-bindings, l4-rules, l4-pools, l4-bgp" + `
  name: app              # the object's name: it is stored under it
  members:
    - addr: 198.18.1.1:80
  ---
  kind: routing
  name: web
  vhosts:
    - names: ["*"]
      routes:
        - action: {pool: app}

This is what tgctl get <kind> [name] -o yaml prints. Certificates are stored by
tgctl cert upload, not by apply.`

func (o *options) applyCommand() *cobra.Command {
	var file string
	var createOnly bool
	cmd := &cobra.Command{
		Use:   "apply -f <file>",
		Short: "Create or replace the objects of a file, all in one change set",
		Long: `Create or replace the objects of a file, all of them in ONE change set: controld
commits every object or none.

Each object is read just before, and its write carries the revision read (for a
new object: that it does not exist), so a change made meanwhile by someone else
makes the whole apply fail with a conflict (exit 3) rather than be overwritten.
An object equal to the stored one is left out. --create-only reads nothing and
creates every object, failing (exit 3) if one exists. The whole configuration the
change set makes is checked before it is committed: a refused field, or a name
that does not resolve (a route naming a missing pool), fails it (exit 4) with each
field on a line.

` + documentsHelp,
		Example: `  tgctl apply -f web.yaml
  tgctl get routing web -o yaml | sed s/app/api/ | tgctl apply -f -`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			docs, err := o.readFile(file)
			if err != nil {
				return err
			}
			plan, err := o.plan(cmd.Context(), docs, createOnly)
			if err != nil {
				return err
			}
			cs := changeSet(plan)
			if len(cs.Changes) > MaxChanges {
				return fmt.Errorf("applying %s: %d objects change, and a change set holds at most %d: split the file", file, len(cs.Changes), MaxChanges)
			}
			var c committed
			if len(cs.Changes) > 0 {
				if _, err := o.call(cmd.Context(), request{method: "POST", path: "/v1/changesets", body: cs, what: "applying " + file}, &c); err != nil {
					return err
				}
			}
			type result struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
				Op   string `json:"op"`
			}
			res := struct {
				Revision int64    `json:"revision,omitempty"`
				Objects  []result `json:"objects"`
			}{Revision: c.Revision}
			for _, p := range plan {
				res.Objects = append(res.Objects, result{p.Kind, p.Name, p.op()})
			}
			return o.printer(cmd).data(res, func(t *tabwriter.Writer) {
				for _, r := range res.Objects {
					word := map[string]string{"create": "created", "update": "configured", "unchanged": "unchanged"}[r.Op]
					fmt.Fprintf(t, "%s/%s %s\n", r.Kind, r.Name, word)
				}
				if c.Revision > 0 {
					fmt.Fprintf(t, "applied at revision %d\n", c.Revision)
				} else {
					fmt.Fprintln(t, "no changes")
				}
			})
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "the `file` of objects (- for standard input)")
	cmd.Flags().BoolVar(&createOnly, "create-only", false, "create every object; fail if one exists")
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	return cmd
}

// diffAnswer is the answer of a dry run and of GET /v1/diff.
type diffAnswer struct {
	DryRun   bool         `json:"dry_run,omitempty"`
	From     int64        `json:"from,omitempty"`
	To       int64        `json:"to,omitempty"`
	Revision int64        `json:"revision,omitempty"`
	Changes  []diffChange `json:"changes"`
}

type diffChange struct {
	Op     string          `json:"op"`
	Kind   string          `json:"kind"`
	Name   string          `json:"name"`
	Before json.RawMessage `json:"before,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
}

// present reports whether a JSON value is there (not absent, not null).
func present(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s != "" && s != "null"
}

func (o *options) diffCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "diff -f <file>",
		Short: "Show what apply -f would change, checked by controld, storing nothing",
		Long: `Show what tgctl apply -f would change: a unified diff of each object's YAML, as
stored and as the file has it. controld checks the change set as apply's would be
(POST /v1/changesets?dry_run=true) and stores nothing, so a file apply would have
refused fails here too (exit 4, each field named).

Exit codes (as kubectl diff): 0 no differences, 1 differences, >1 an error: 2
usage, 3 conflict, 4 invalid, 5 not found, 6 not authorized, 7 unreachable, 8 any
other error.

` + documentsHelp,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			differ, err := o.runDiff(cmd, file)
			if err != nil {
				if ExitCode(err) == ExitError {
					return &exitError{code: ExitDiffFailed, msg: err.Error()}
				}
				return err
			}
			if differ {
				return &exitError{code: ExitError}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "the `file` of objects (- for standard input)")
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	return cmd
}

// runDiff prints the differences of file and reports whether there were any.
func (o *options) runDiff(cmd *cobra.Command, file string) (bool, error) {
	docs, err := o.readFile(file)
	if err != nil {
		return false, err
	}
	plan, err := o.plan(cmd.Context(), docs, false)
	if err != nil {
		return false, err
	}
	cs := changeSet(plan)
	var ans diffAnswer
	if len(cs.Changes) > 0 {
		if err := o.requireDryRun(cmd.Context()); err != nil {
			return false, err
		}
		if _, err := o.call(cmd.Context(), request{method: "POST", path: "/v1/changesets?dry_run=true", body: cs, what: "checking " + file}, &ans); err != nil {
			return false, err
		}
		if !ans.DryRun {
			return false, fmt.Errorf("checking %s: controld answered without dry_run: true; it may have committed the change set (revision %d)", file, ans.Revision)
		}
	}
	// What the file changes, as read just before; the dry run's answer where it has
	// the object.
	changes := make([]diffChange, 0, len(cs.Changes))
	for _, p := range plan {
		if p.op() == "unchanged" {
			continue
		}
		c := diffChange{Op: "put", Kind: p.Kind, Name: p.Name, Before: p.before, After: p.Object}
		for _, a := range ans.Changes {
			if a.Kind == p.Kind && a.Name == p.Name && present(a.After) {
				c.Before, c.After = a.Before, a.After
				if a.Op != "" {
					c.Op = a.Op
				}
			}
		}
		changes = append(changes, c)
	}
	ans.Changes = changes
	if o.output != FormatTable {
		return len(changes) > 0, o.printer(cmd).data(ans, nil)
	}
	revs := map[string]int64{}
	for _, p := range plan {
		revs[p.Kind+"/"+p.Name] = p.revision
	}
	for _, c := range changes {
		from := "absent"
		if r := revs[c.Kind+"/"+c.Name]; r > 0 {
			from = "revision " + strconv.FormatInt(r, 10)
		}
		if err := writeObjectDiff(cmd.OutOrStdout(), c, from, "as in "+file); err != nil {
			return false, err
		}
	}
	return len(changes) > 0, nil
}

// writeObjectDiff writes a unified diff of c's before and after as YAML.
func writeObjectDiff(w io.Writer, c diffChange, fromLabel, toLabel string) error {
	text := func(v json.RawMessage) (string, error) {
		if !present(v) {
			return "", nil
		}
		d, err := withKind(c.Kind, v)
		if err != nil {
			return "", err
		}
		y, err := jsonToYAML(d)
		return string(y), err
	}
	before, err := text(c.Before)
	if err != nil {
		return err
	}
	after, err := text(c.After)
	if err != nil {
		return err
	}
	id := c.Kind + "/" + c.Name
	_, err = io.WriteString(w, unifiedDiff(id+" ("+fromLabel+")", id+" ("+toLabel+")", before, after))
	return err
}

// requireDryRun checks in the API's OpenAPI document that POST /v1/changesets takes
// dry_run, so that a controld from before dry runs, which would commit the change
// set, is never sent one.
func (o *options) requireDryRun(ctx context.Context) error {
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name string `json:"name"`
				In   string `json:"in"`
			} `json:"parameters"`
		} `json:"paths"`
	}
	if _, err := o.call(ctx, request{method: "GET", path: "/v1/openapi.json", what: "reading the API's document"}, &doc); err != nil {
		return err
	}
	for _, p := range doc.Paths["/v1/changesets"]["post"].Parameters {
		if p.Name == "dry_run" && p.In == "query" {
			return nil
		}
	}
	return errors.New("this controld does not take dry runs of change sets (POST /v1/changesets has no dry_run in its /v1/openapi.json): nothing was sent")
}
