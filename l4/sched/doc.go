// Package sched picks the L7 member that a new flow goes to: weighted Maglev consistent
// hashing (the default), nginx's smooth weighted round robin and IPVS-style weighted least
// connections. Everything here runs on the per-core packet path, so lookups and picks do
// not allocate, lock or call through interfaces; a Maglev table is immutable and shared by
// all cores, while WRR and WLC keep per-core state and belong to one goroutine each.
package sched
