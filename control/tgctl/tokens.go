package tgctl

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// Roles are the API tokens' roles (control/api.Roles).
var Roles = []string{"admin", "cert-operator", "policy-operator", "risk-engine", "viewer"}

func (o *options) tokenCommand() *cobra.Command {
	group := &cobra.Command{
		Use:   "token",
		Short: "API tokens (admin only): create, list, delete",
		Args:  noArgs,
		RunE:  groupRun,
	}
	var role string
	create := &cobra.Command{
		Use:   "create <name> --role <role>",
		Short: "Create an API token; its secret is printed once",
		Long: `Create an API token with a role: admin (everything, tokens included),
policy-operator (listeners, routing, pools, L4 objects), cert-operator
(certificates and bindings), risk-engine (blacklists) or viewer (read only). Only
its hash is stored: the token printed now cannot be shown again.`,
		Args: exactArgs(1, "a token name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if role == "" {
				return usagef("token create: --role is required (one of %v)", Roles)
			}
			var ans struct {
				Name  string `json:"name"`
				Role  string `json:"role"`
				Token string `json:"token"`
			}
			if _, err := o.call(cmd.Context(), request{method: "POST", path: "/v1/tokens",
				body: map[string]string{"name": args[0], "role": role}, what: "creating token " + args[0]}, &ans); err != nil {
				return err
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				fmt.Fprintln(t, ans.Token)
			})
		},
	}
	create.Flags().StringVar(&role, "role", "", "the token's `role`")
	_ = create.RegisterFlagCompletionFunc("role", cobra.FixedCompletions(Roles, cobra.ShellCompDirectiveNoFileComp))

	list := &cobra.Command{
		Use:   "list",
		Short: "The API tokens: names, roles and when they were made (never their secrets)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ans struct {
				Tokens []struct {
					Name    string    `json:"name"`
					Role    string    `json:"role"`
					Created time.Time `json:"created"`
				} `json:"tokens"`
			}
			if _, err := o.call(cmd.Context(), request{method: "GET", path: "/v1/tokens", what: "listing the tokens"}, &ans); err != nil {
				return err
			}
			return o.printer(cmd).data(ans, func(t *tabwriter.Writer) {
				row(t, "NAME", "ROLE", "CREATED")
				for _, tok := range ans.Tokens {
					row(t, tok.Name, tok.Role, tok.Created.Local().Format(time.DateTime))
				}
			})
		},
	}

	del := &cobra.Command{
		Use:   "delete <name>",
		Short: "Delete an API token",
		Args:  exactArgs(1, "a token name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := o.call(cmd.Context(), request{method: "DELETE", path: "/v1/tokens/" + pathEscape(args[0]), what: "deleting token " + args[0]}, nil); err != nil {
				return err
			}
			return o.printer(cmd).data(map[string]string{"name": args[0], "op": "delete"}, func(t *tabwriter.Writer) {
				fmt.Fprintf(t, "token %s deleted\n", args[0])
			})
		},
	}
	group.AddCommand(create, list, del)
	return group
}
