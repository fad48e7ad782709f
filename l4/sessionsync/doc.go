// Package sessionsync keeps the connection tables of a cluster's load distributors
// (LDs) in step, so that when an LD fails and ECMP moves its flows to the others, a
// long-lived connection keeps its L7 node. It holds the wire format (authenticated
// UDP datagrams of connection entries, up to the path MTU) and the Syncer, which
// sends this LD's long connections to its peers and hands theirs to the datapath.
//
// As TGW does it: only connections that have lived SyncAfter (3 s) are sent, since
// short ones are not worth it; entries are batched into datagrams up to the MTU or a
// flush interval; a full sync every FullSyncEvery (4 min) re-sends every live long
// connection, paced (FullSyncRate) so that it never competes with forwarding, and
// repairs lost datagrams; state changes (fin, close) and deletions of sent entries
// go at once. Every datagram carries the cluster ID, a per-sender sequence (starting
// at the sender's start time in nanoseconds, so a restarted LD's are higher) and an
// HMAC-SHA256 with the cluster's shared key: datagrams of another cluster, forged
// ones, replays (a 64-datagram window per peer) and datagrams from addresses that are
// not peers are dropped and counted (tiergate_l4_sync_dropped_total{reason}). As the
// sequence comes from the clock, an LD restarted with its clock set back is refused as
// replaying until its sequence passes the one its peers last accepted: keep the LDs'
// clocks synchronised (NTP), as for everything else in a cluster.
//
// Warm-up: a starting LD asks each peer for a full sync (MsgFullSyncRequest, once a
// second until answered); a peer answers with a full sync followed by
// MsgFullSyncDone. Ready, the announce gate, opens when every peer has answered and
// the workers have installed what came before each answer (Datapath.SyncInstalled),
// or WarmupTimeout has passed, so an LD that joins does not announce its VIPs before
// its tables hold the flows ECMP will move to it.
//
// A connection the SYN proxy opened (l4/synproxy) carries its translation with it
// (the sequence and timestamp deltas, the window shift), so the LD that takes it over
// goes on translating its packets; without that its client and its L7 node would no
// longer agree on a sequence number.
//
// The datapath side (which worker emits and installs, and how a received entry
// reaches the worker that sees the flow's packets) is in l4/datapath's sync.go.
package sessionsync
