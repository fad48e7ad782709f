// Package tgctl is tgctl, the command line of the control plane: get, apply, diff
// and delete the cluster configuration's objects, follow revisions and rollouts to
// the nodes, upload certificates, push blacklists and see which version each node
// enforces, manage API tokens and watch the handshake figures
// live (top, from controld's /ui figures, control/ui), all through controld's /v1
// API (control/api). cmd/tgctl is its main; Run runs it in-process, as the tests do.
//
// It speaks to the API over HTTP(S) only and shares no code with the server, so
// the binary does not carry the store. Output is a table, JSON or YAML (-o), and
// the exit codes are stable for scripts (ExitConflict for a 412, ExitInvalid for
// a 422 with each refused field printed on its own line, …).
package tgctl
