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
//     entry: half-open for a SYN; for any other TCP packet, and for UDP, an
//     unconfirmed one (so flows survive an LD restart or an ECMP change: Maglev gives
//     the same member while the pool is the same), which keeps a short timeout until
//     the member's reply confirms it. A reset never creates an entry. The packet is
//     tunnelled untouched (GRE or IPIP, over IPv4 or IPv6; GRE with the tunnel key
//     when one is configured) to the member, except the MSS of a SYN, clamped so that
//     full segments fit the internal MTU once encapsulated.
//   - Blacklists (Distributor.SetBlacklists, policy/blacklist Lists): a packet to a
//     VIP from a listed source is dropped (blacklisted, and a packet hit of the list)
//     and makes no entry, so a listed client never costs a member a handshake. A TCP
//     or UDP packet is looked up when it would make a new flow and when it is routed
//     by its QUIC connection ID; fragments and ICMP every time. Packets of flows in
//     the table are not looked up, so the established-flow rate does not depend on
//     the lists: when a list changes (its Set is swapped), each worker sweeps its
//     table a few dozen entries per loop and removes the flows of clients now
//     listed, whose next packets are then new flows, dropped. A lookup reads the
//     Set in force without a lock.
//   - A packet that does not fit the tunnel is dropped (too_big); when it may not be
//     fragmented (IPv4 DF, IPv6) the LD answers it, as a router does, with
//     fragmentation needed or packet too big from its external address, carrying
//     the largest size that fits, within a per-worker rate (Config.ICMP).
//   - When the table is full, the oldest unconfirmed entry is evicted, else the oldest
//     half-open one (TGW's LRU half-open queue); if there is neither, the packet is
//     dropped as table_full.
//   - A flow whose member failed its health check is rescheduled; a drained or
//     removed member keeps its flows until they end.
//   - QUIC rules: Handshake and short-header packets carry a connection ID the member
//     issued (in wire's layout) and go to that member whatever the client's address (an
//     entry for the address is kept, so the member's replies to it pass); Initial
//     and 0-RTT packets, whose connection ID the client chose, go by the table.
//   - IPv6 packets from or to an IPv4-mapped address (::ffff:a.b.c.d) are dropped
//     (v4mapped): as 16 bytes they would pass for the IPv4 address.
//   - ICMP and ICMPv6 errors about a flow (fragmentation needed, packet too big,
//     unreachable) go to the flow's member, found from the quoted header.
//   - Fragments: every fragment of a datagram, the first included, goes by a hash of
//     the address pair and makes no entry, so all of them reach the same member.
//   - Member → LD (GRE or IPIP to the LD's internal address, from a member): only on
//     the internal port and to the internal address (else return_wrong_port), from a
//     member's configured address (return_not_member), with the tunnel key when one is
//     configured (return_bad_key), from a VIP, and for a flow in the worker's table: a
//     TCP or UDP reply, or an ICMP error about the client's packet (return_no_flow).
//     A reply confirms an unconfirmed flow. The inner packet's TTL is decremented and
//     it leaves through the external port to the gateway, or to the client itself
//     when it is on link. So the LD sends VIP-sourced packets only into flows it
//     forwarded. With more than one worker, a member's reply must reach the worker
//     that took the client's packets: the ports must hash a tunnel packet by its inner
//     flow, symmetrically (net_af_packet's fanout does).
//   - ARP and neighbour discovery go to the control goroutine; echo requests to the
//     LD's addresses and to VIPs are answered in place.
//   - Every packet is counted once, by direction and result: forwarded, local, or the
//     reason it was dropped (tiergate_l4_packets_total).
//
// # Tracing
//
// With Config.Trace (trace.go, l4/trace), probe packets marked as the operator
// configures (a DSCP value, the probe servers' source prefixes, a TCP option kind;
// every criterion set must match) are traced, as TGW's trace and drop points: each
// worker records, in a ring of its own (Config.Trace.Records, 1024 by default; written
// without a lock, read by Distributor.Trace under per-record sequence numbers), a
// trace point for a marked packet tunnelled to a member, replied to the client or
// answered locally (LD ID, worker, time, direction, member), and a drop point for one
// dropped, whatever the reason (the hook is in count, where every packet is counted,
// and in the move to tx_full), with a sample of its first bytes. Whether a packet is
// marked is decided once, in handle, and only when tracing is on: with it off, a
// packet pays a predictable branch on the snapshot's trace pointer and one on the
// worker's mark flag where it is counted. The marker
// stays on the inner packet, which is tunnelled untouched, so the L7 node sees it; a
// member's reply is traced when its inner packet is marked (its destination a probe
// server, or its DSCP set by the L7 node).
//
// # SYN proxy
//
// A rule with synproxy on (or auto, while a worker's table passes synproxy.auto_on
// half-open: a SYN flood) has the LD answer each SYN itself with a SYN cookie
// (l4/synproxy: as Linux makes them, MSS, window scale and SACK kept, keyed SipHash
// under a rotated secret) and keep nothing, so a spoofed flood costs the members
// nothing and the table nothing. An ACK whose cookie checks creates the connection
// and sends its member a SYN in the client's name with the client's options; the
// member's SYN-ACK, which comes back through the tunnel, is answered with the ACK
// that completes its handshake and not passed on. From then on the LD translates
// every packet of the connection: sequence numbers and SACK blocks, timestamps, and
// windows when the member's window scale is not the one the LD advertised. The
// deltas live in a side array of the connection table, allocated only when the proxy
// is configured, and travel with the entry in session sync. Bad cookies are dropped
// (synproxy_bad_cookie); the client's first packet before its member answered (its
// request, right behind its ACK) is held and sent after the member's handshake, more
// are dropped (synproxy_wait) and sent again by the client (synproxy.go).
//
// # Overload and rule limits
//
// A rule's static limits (RuleConfig.Limits: new connections per second, concurrent
// connections, each worker enforcing 1/W of the LD's figure, the latter counted per
// rule by its connection table) and, past the load watermark, its overload quota
// (Config.Overload, overload.go, l4/overload) are checked when a packet would make a
// new connection: a SYN or a UDP datagram of a new flow, after the blacklists and, for
// a proxied rule, at the ACK whose cookie checks; a packet of a flow in the table, or a
// TCP packet without SYN that makes an entry (a connection picked up mid-way), is
// never refused (drops rule_limit and overload_quota). The load is the largest of the
// busiest worker's busy share (a loop that found work counts as busy until the next,
// on the clock the loop reads anyway), the fullest table's fill and the forwarded
// packets per second over capacity_pps; the control goroutine measures it every
// interval and publishes quotas, computed by weighted max-min fairness from the rules'
// weights or recent shares, as one pointer the workers load once a burst, each setting
// its token buckets to its share. With nothing in force a new connection and an
// established packet each pay one predictable branch; packet quotas
// (Overload.Packets) cost a token bucket per packet while protecting
// (BenchmarkOverloadCheck).
//
// # Session sync
//
// With EnableSync, each worker sends the connections of its table that have lived
// the sync delay, their state changes and deletions, and its whole table on a full
// sync, through rings that l4/sessionsync drains, and installs its peers' entries
// from a ring of its own, so no table is touched by two goroutines; with several
// workers a received entry goes to every worker, since the port, not the LD,
// chooses the worker a flow's packets reach (sync.go).
//
// # Control
//
// The control goroutine applies configurations (validated, atomically), gives rules
// and members IDs that stay stable across changes, resolves next hops with ARP and
// ND (retried, aged; static neighbours skip it), runs the health checks, answers ARP
// and ND for the VIPs and the LD's addresses, and publishes a snapshot after each
// change. The neighbour table holds at most Config.MaxNeighbours entries: the
// gateways' and members' are pinned, and an on-link destination beyond the limit
// evicts the entry the workers used least recently. Its frames are sent by worker 0 between bursts, so a port needs only one TX
// queue per worker.
package datapath
