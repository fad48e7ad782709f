// Package l4 is the L4 tier: the DPDK load distributor (l4d) that receives packets for
// the VIPs, keeps a per-core connection table, picks an L7 node by consistent hashing
// and tunnels the client's packet to it untouched. Its datapath is being built; see
// DESIGN.md for the plan.
package l4
