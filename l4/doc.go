// Package l4 is the L4 tier: l4d, the load distributor that receives packets for the
// VIPs, keeps a per-core connection table, picks an L7 node by consistent hashing and
// tunnels the client's packet to it untouched (GRE or IPIP), so the L7 node sees the
// client's real address. Replies come back through it.
//
// The tier is split so that every decision about a packet is pure Go over byte slices,
// tested, fuzzed and benchmarked without DPDK:
//
//   - packet: parsing and building of Ethernet, ARP, IPv4/IPv6, TCP, UDP, ICMP/ICMPv6
//     and neighbour discovery; GRE/IPIP encapsulation; checksums; MSS clamping.
//   - sched: weighted Maglev, smooth weighted round robin, weighted least connections.
//   - conntrack: the per-core connection table (fixed memory, 40-byte entries,
//     timeouts by TCP state, O(1) eviction of the oldest half-open entry when full).
//   - port: the burst I/O interface workers use, and an in-memory port.
//   - dpdk: the thin cgo binding to DPDK 22.11 (one cgo call per burst).
//   - datapath: the workers (run-to-completion, one RX queue and one table shard
//     each, no locks) and the control goroutine (configuration, ARP/ND, health
//     checks) that publishes immutable snapshots the workers read.
//   - sessionsync: session sync between the LDs of a cluster (authenticated UDP
//     datagrams of long-lived connections), so a flow ECMP moves to another LD
//     keeps its L7 node.
//   - l4d: the daemon: YAML configuration, DPDK start-up, admin API, metrics.
//
// The L7 end of the tunnel is l7/tunnel. What both ends must read alike, the tunnel
// format and its rules, the checksum and the QUIC connection-ID layout that carries an
// L7 node's server ID (so QUIC flows keep their node when the client's address
// changes), is package wire, outside both tiers.
package l4
