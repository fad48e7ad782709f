// Package agent is the node agent the daemons link (l7d, l4d, keyserverd): it
// keeps a node's configuration in step with the cluster configuration in the
// store (control/store), applies it through the daemon's own prepare/commit
// path, and reports what it applied.
//
// # What it does
//
// Run reads a consistent snapshot of every object at one revision R
// (store.Snapshot), decodes it into the model, checks it as a whole (each object's
// Validate, then Snapshot.Consistent: model.Checker, which does not decode and
// validate again an object unchanged since the snapshot before) and gives it to
// Config.Apply. It then watches from R+1 (store.Watch, whose etcd watch requires a
// leader and which re-lists the whole state after compaction, Batch.Reset), and
// for each new revision checks and applies the whole snapshot at that revision,
// never a partial one. The watch only records the changes; the applying takes the
// latest state whenever it is free, so revisions that arrive while one is being
// applied are applied together, as the latest of them. A snapshot that does not
// decode, validate or hold together is not given to Apply, and one Apply refuses is
// not in force: either way the configuration applied before stays in force and the
// agent reports a NACK. A snapshot Apply refused is tried again, 1s later, then 2s,
// doubling to 30s, until Apply takes it or a newer revision comes (Apply may have
// failed for a while only: a keyserver out of reach); one that did not check is not.
//
// The agent reports its state under a lease of StatusTTL (10s), kept alive, at
// /tiergate/nodes/v1/<node> (StatusKey), as JSON (Status):
//
//	{"node":"l7-a","role":"l7d","applied_revision":42,"updated":"..."}         an ACK
//	{"node":"l7-a","role":"l7d","applied_revision":42,"refused_revision":43,
//	 "error":"routing/web.vhosts[0].routes[0].action.pool: ...","updated":"..."} a NACK
//
// The status also carries the node's address (Config.Address), where its metrics
// are (Config.Metrics, which controld's dashboard scrapes), when the agent
// started, and the certificates it serves (Config.Certificates: name, version and
// the SHA-256 of the leaf), taken at each write; Agent.Report writes them again
// when they changed outside an Apply.
//
// The key goes away when the agent stops (the lease is revoked) or when it
// stops keeping the lease alive for StatusTTL (a crash, a partition): a node
// whose key is gone is lost. Each write of the status also writes it, under no
// lease, as the node's seen record /tiergate/seen/v1/<node> (SeenKey), which
// stays: controld shows a node with a seen record and no status as lost. The
// status keys and seen records are outside the object prefix
// (store.Prefix), so snapshots and watches do not see them.
//
// # A node's control section
//
// NodeConfig is the control section every daemon's own file embeds (node,
// etcd_endpoints, ca_file, cert_file, key_file, username, password_file,
// cache_file, dial_timeout), with Validate naming fields by path, and
// NodeConfig.Open the function for Config.Open: a client of the store's etcd at
// etcd_endpoints (TLS, client certificate, etcd user and password file as
// given). controld's embedded etcd serves nodes on its machine at a loopback URL
// with -etcd-listen; an external cluster is reached at its own URLs.
//
// # Outages
//
// Each snapshot applied is kept in Config.CacheFile with its revision, written
// atomically (internal/daemon's PrepareFile and Commit) once Apply took it, by a
// goroutine of its own so that applying never waits for the disk (a burst of
// revisions is written once, as its latest; the last is written before Run
// returns).
// When the store cannot be reached at start, the cached snapshot is checked and
// applied, so a node restarted during an outage serves its last configuration,
// and the agent keeps trying the store with a backoff that doubles from 100ms to
// 10s. Through an outage later on, nothing is undone: the configuration in force
// stays, the watch is started again, and when the store is back the agent reads
// the whole state once more and applies it if it changed.
//
// # Nodes watch etcd directly
//
// Nodes watch etcd themselves, each under a read-only etcd role of its own, as
// APISIX's data plane does, rather than a watch stream that controld would
// serve. controld then stays a stateless API over the store: a node keeps
// getting changes while every controld is down, and there is no second fan-out
// layer to size, secure and keep consistent with etcd's revisions.
//
// A thousand watching nodes are within what etcd handles. Each node holds one
// client connection, and the etcd client multiplexes every watch of a client
// over one gRPC stream; each agent has exactly one watch, on one key range (the
// object prefix), so a thousand nodes are a thousand connections, a thousand
// streams and a thousand watchings. etcd's published watch benchmark ("Watch
// Memory Usage Benchmark") aims at O(10k) clients, O(100k) watch streams and
// O(10M) watchings per cluster, at about 10 KiB per connection, 10 KiB per
// stream and under 1 KiB per watching: a thousand nodes are some 20 MiB of the
// server's memory and a tenth of the clients it is built for. A configuration
// write is one event of a few KiB sent to a thousand streams.
// The reads are one full snapshot per node at start, after compaction or after an
// outage, spread by the backoff's jitter: configuration is a few MiB at most.
// The test TestManyAgents runs 50 agents in one process against the embedded
// store and logs how long a write takes to reach all of them.
//
// # A node cannot write another node's configuration
//
// With etcd authentication on, each node gets a user and a role of its own
// (GrantNode sets the role up): read on the object prefix /tiergate/v1/ and on
// the store's head key /tiergate/meta/v1/head (which a snapshot reads), and
// read-write on its own status key /tiergate/nodes/v1/<node> and seen record
// /tiergate/seen/v1/<node> only. etcd checks
// the role on every request, so a node's credentials can neither change the
// cluster configuration nor write another node's status; only controld's user
// writes the configuration.
package agent
