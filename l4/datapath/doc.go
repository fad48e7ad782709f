// Package datapath is the L4 load distributor's forwarding engine: workers that take
// bursts of frames from the ports, decide each packet's fate in pure Go and send the
// bursts on, and one control goroutine that owns everything else.
//
// # Workers
//
// Worker i polls RX queue i of each port and transmits on TX queue i, run to
// completion, and owns a shard of the connection table (conntrack), so the packet
// path takes no lock. A burst is parsed first and the table lines of its flows are
// loaded in two tight passes before any lookup, so that the cache misses of the whole
// burst overlap. What a worker reads of the configuration is an immutable snapshot
// that the control goroutine swaps in atomically; a worker picks it up at its next
// burst.
//
// # Packets
//
//   - Client → VIP (TCP or UDP): the rule is found by (VIP, protocol, port); the flow
//     (client address, client port, rule) by the table. A miss schedules a member
//     (Maglev on the flow hash by default, or WRR or WLC per worker) and inserts an
//     entry: half-open for a SYN, established for any other TCP packet (so flows
//     survive an LD restart or an ECMP change: Maglev gives the same member while the
//     pool is the same), UDP for UDP. A reset never creates an entry. The packet is
//     tunnelled untouched (GRE or IPIP, over IPv4 or IPv6) to the member, except the
//     MSS of a SYN, clamped so that full segments fit the internal MTU once
//     encapsulated.
//   - When the table is full, the oldest half-open entry is evicted (TGW's LRU
//     half-open queue); if there is none, the packet is dropped as table_full.
//   - A flow whose member failed its health check is rescheduled; a drained or
//     removed member keeps its flows until they end.
//   - QUIC rules: Handshake and short-header packets carry a connection ID the member
//     issued (in wire's layout) and go to that member whatever the client's address; Initial
//     and 0-RTT packets, whose connection ID the client chose, go by the table.
//   - ICMP and ICMPv6 errors about a flow (fragmentation needed, packet too big,
//     unreachable) go to the flow's member, found from the quoted header.
//   - Fragments: every fragment of a datagram, the first included, goes by a hash of
//     the address pair and makes no entry, so all of them reach the same member.
//   - Member → LD (GRE or IPIP to the LD's internal address, from a member): the inner
//     packet must come from a VIP; its TTL is decremented and it leaves through the
//     external port to the gateway, or to the client itself when it is on link.
//   - ARP and neighbour discovery go to the control goroutine; echo requests to the
//     LD's addresses and to VIPs are answered in place.
//   - Every packet is counted once, by direction and result: forwarded, local, or the
//     reason it was dropped (tiergate_l4_packets_total).
//
// # Control
//
// The control goroutine applies configurations (validated, atomically), gives rules
// and members IDs that stay stable across changes, resolves next hops with ARP and
// ND (retried, aged; static neighbours skip it), runs the health checks, answers ARP
// and ND for the VIPs and the LD's addresses, and publishes a snapshot after each
// change. Its frames are sent by worker 0 between bursts, so a port needs only one TX
// queue per worker.
package datapath
