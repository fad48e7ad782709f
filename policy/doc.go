// Package policy holds what l7d decides per connection and per request: the real
// client IP, IP blacklists and HTTP routing policies. Its subpackages are being built;
// see DESIGN.md for the plan.
package policy
