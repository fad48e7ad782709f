package tgctl

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// certificate is a certificate version as the API answers it (model.Certificate).
type certificate struct {
	Name     string    `json:"name"`
	Version  int       `json:"version"`
	Chain    string    `json:"chain,omitempty"`
	KeyID    string    `json:"key_id"`
	KeyType  string    `json:"key_type"`
	SANs     []string  `json:"sans"`
	NotAfter time.Time `json:"not_after"`
	// DaysLeft is the API's count of whole days until NotAfter (negative once
	// past), in lists.
	DaysLeft *int `json:"days_left,omitempty"`
}

// days is the days left the API said, or counted from now.
func (c certificate) days(now time.Time) int {
	if c.DaysLeft != nil {
		return *c.DaysLeft
	}
	return daysLeft(c.NotAfter, now)
}

// daysLeft is the whole days until t, negative once past.
func daysLeft(t, now time.Time) int {
	d := t.Sub(now)
	if d < 0 {
		return -int((-d).Hours()/24) - 1
	}
	return int(d.Hours() / 24)
}

func certRows(t *tabwriter.Writer, certs []certificate, now time.Time) {
	row(t, "NAME", "VERSION", "KEY TYPE", "KEY ID", "NOT AFTER", "DAYS LEFT", "SANS")
	for _, c := range certs {
		kid := c.KeyID
		if len(kid) > 16 {
			kid = kid[:16]
		}
		row(t, c.Name, c.Version, orDash(c.KeyType), orDash(kid), c.NotAfter.UTC().Format(time.DateOnly), c.days(now), orDash(strings.Join(c.SANs, ",")))
	}
}

// uploadAnswer is POST /v1/certificates/{name}/versions.
type uploadAnswer struct {
	Certificate certificate `json:"certificate"`
	Revision    int64       `json:"revision"`
	DryRun      bool        `json:"dry_run,omitempty"`
	Reordered   bool        `json:"reordered"`
	Notes       []string    `json:"notes"`
	Keyservers  []struct {
		Address   string `json:"address"`
		Verified  bool   `json:"verified"`
		Reachable bool   `json:"reachable"`
		Error     string `json:"error,omitempty"`
	} `json:"keyservers"`
}

func (o *options) certCommand() *cobra.Command {
	group := &cobra.Command{
		Use:   "cert",
		Short: "Certificates: upload, list, versions, rollback",
		Args:  noArgs,
		RunE:  groupRun,
	}

	var name, certFile, keyFile string
	var dryRun bool
	upload := &cobra.Command{
		Use:   "upload --name <name> --cert <chain.pem> --key <key.pem>",
		Short: "Upload a new version of a certificate with its private key",
		Long: `Upload a certificate chain with its private key as a new version of a certificate.
controld checks the chain (leaf first, each certificate signed by the next, the key
matching, validity, names, key type; a chain in the wrong order is reordered and
the answer says so), imports the key into every keyserver and has each sign a fresh
nonce; only then is the chain stored, with the key's ID and never the key. A
refused chain or key exits 4 with the field named; a keyserver that fails stores
nothing and is named. --dry-run checks everything and stores nothing.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" || certFile == "" || keyFile == "" {
				return usagef("cert upload: --name, --cert and --key are required")
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			if c.clear() {
				return fmt.Errorf("cert upload: %s is plain http to another host, and the private key would cross the network in clear: give the API as https://", o.api)
			}
			chain, err := os.ReadFile(certFile)
			if err != nil {
				return fmt.Errorf("reading the chain: %w", err)
			}
			key, err := os.ReadFile(keyFile)
			if err != nil {
				return fmt.Errorf("reading the key: %w", err)
			}
			var ans uploadAnswer
			if _, err := o.call(cmd.Context(), request{method: "POST", path: "/v1/certificates/" + pathEscape(name) + "/versions",
				body: map[string]any{"chain": string(chain), "key": string(key), "dry_run": dryRun},
				what: "uploading certificate " + name}, &ans); err != nil {
				return err
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				c := ans.Certificate
				if dryRun {
					fmt.Fprintf(t, "certificate %s version %d checked (dry run: nothing stored)\n", c.Name, c.Version)
				} else {
					fmt.Fprintf(t, "certificate %s version %d stored at revision %d\n", c.Name, c.Version, ans.Revision)
				}
				fmt.Fprintf(t, "key %s %s, names %s, not after %s\n", c.KeyType, c.KeyID, strings.Join(c.SANs, ","), c.NotAfter.UTC().Format(time.RFC3339))
				if ans.Reordered {
					fmt.Fprintln(t, "the chain was given out of order and was reordered")
				}
				for _, n := range ans.Notes {
					fmt.Fprintf(t, "note: %s\n", n)
				}
				for _, k := range ans.Keyservers {
					switch {
					case k.Verified:
						fmt.Fprintf(t, "keyserver %s: key imported, a fresh signature verified\n", k.Address)
					case k.Reachable:
						fmt.Fprintf(t, "keyserver %s: reachable\n", k.Address)
					default:
						fmt.Fprintf(t, "keyserver %s: %s\n", k.Address, orDash(k.Error))
					}
				}
			})
		},
	}
	upload.Flags().StringVar(&name, "name", "", "the certificate's `name`")
	upload.Flags().StringVar(&certFile, "cert", "", "the PEM certificate chain `file`, leaf first")
	upload.Flags().StringVar(&keyFile, "key", "", "the PEM private key `file`")
	upload.Flags().BoolVar(&dryRun, "dry-run", false, "check everything, store nothing")
	_ = upload.MarkFlagFilename("cert", "pem", "crt")
	_ = upload.MarkFlagFilename("key", "pem", "key")

	list := &cobra.Command{
		Use:   "list",
		Short: "The certificates: names, SANs, key type, key ID, not-after and days left",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ans struct {
				Revision int64 `json:"revision"`
				Items    []struct {
					Name     string      `json:"name"`
					Revision int64       `json:"revision"`
					Object   certificate `json:"object"`
					DaysLeft *int        `json:"days_left"`
				} `json:"items"`
			}
			if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/certificates", what: "listing the certificates"}, &ans); err != nil {
				return err
			}
			certs := make([]certificate, 0, len(ans.Items))
			for _, it := range ans.Items {
				c := it.Object
				c.Chain = ""
				if c.DaysLeft == nil {
					c.DaysLeft = it.DaysLeft
				}
				certs = append(certs, c)
			}
			return o.printer(cmd).data(certs, func(t *tabwriter.Writer) { certRows(t, certs, time.Now()) })
		},
	}

	versions := &cobra.Command{
		Use:               "versions <name>",
		Short:             "Every stored version of a certificate",
		Args:              exactArgs(1, "a certificate's name"),
		ValidArgsFunction: o.certNameCompletion,
		RunE: func(cmd *cobra.Command, args []string) error {
			var ans struct {
				Name     string `json:"name"`
				Current  int    `json:"current"`
				Revision int64  `json:"revision"`
				Versions []struct {
					certificate
					Uploaded   time.Time `json:"uploaded"`
					UploadedBy string    `json:"uploaded_by"`
					Keyservers []string  `json:"keyservers"`
					Current    bool      `json:"current"`
				} `json:"versions"`
			}
			if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/certificates/" + pathEscape(args[0]) + "/versions", what: "listing the versions of certificate " + args[0]}, &ans); err != nil {
				return err
			}
			for i := range ans.Versions {
				ans.Versions[i].Chain = ""
			}
			now := time.Now()
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				row(t, "VERSION", "CURRENT", "KEY TYPE", "KEY ID", "NOT AFTER", "DAYS LEFT", "UPLOADED", "BY", "SANS")
				for _, v := range ans.Versions {
					cur := ""
					if v.Current {
						cur = "*"
					}
					kid := v.KeyID
					if len(kid) > 16 {
						kid = kid[:16]
					}
					row(t, v.Version, cur, orDash(v.KeyType), orDash(kid), v.NotAfter.UTC().Format(time.DateOnly), v.days(now),
						v.Uploaded.Local().Format(time.DateTime), orDash(v.UploadedBy), orDash(strings.Join(v.SANs, ",")))
				}
			})
		},
	}

	rollback := &cobra.Command{
		Use:   "rollback <name> <version>",
		Short: "Make an earlier version of a certificate the current one",
		Long: `Make an earlier version of a certificate the current one (its chain and key ID).
The request carries the certificate's revision read just before (If-Match): a
certificate changed meanwhile is not rolled back (exit 3).`,
		Args:              exactArgs(2, "a certificate's name and a version"),
		ValidArgsFunction: o.certNameCompletion,
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := strconv.Atoi(args[1])
			if err != nil || v < 1 {
				return usagef("version %q: want a positive number", args[1])
			}
			_, rev, err := o.getObject(cmd.Context(), "certificates", args[0])
			if err != nil {
				return err
			}
			if rev == 0 {
				return &APIError{What: "reading certificates/" + args[0], Status: http.StatusNotFound, Code: "not_found", Message: "no such certificate"}
			}
			var ans uploadAnswer
			if _, err := o.call(cmd.Context(), request{method: "POST", path: "/v1/certificates/" + pathEscape(args[0]) + "/rollback",
				body: map[string]int{"version": v}, header: map[string]string{"If-Match": etag(rev)},
				what: "rolling certificate " + args[0] + " back to version " + args[1]}, &ans); err != nil {
				return err
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				fmt.Fprintf(t, "certificate %s is version %d at revision %d\n", args[0], v, ans.Revision)
			})
		},
	}
	group.AddCommand(upload, list, versions, rollback)
	return group
}

func (o *options) certNameCompletion(cmd *cobra.Command, args []string, s string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return o.kindCompletion(cmd, []string{"certificates"}, s)
}
