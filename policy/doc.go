// Package policy takes the per-connection and per-request decision of an L7 node: who
// the client is (the packet's source, a PROXY header's, or a trusted proxy's header:
// package clientip) and whether a blacklist refuses it (package blacklist), with a 403
// or by closing. It imports no tier, so l7d, l4d and the control plane share it;
// routing policies are in package route.
package policy
