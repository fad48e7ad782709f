// Package store keeps the cluster configuration of the control plane in etcd: named
// JSON objects of several kinds, read as consistent snapshots at one revision,
// written with optimistic concurrency (the object's mod revision as its version) and
// in change sets that commit whole or not at all after a consistency check, and
// watched from a revision on without missing a change.
//
// # etcd, embedded or external
//
// By default the Store runs a single-node etcd (go.etcd.io/etcd/server/v3/embed) in
// its data directory, so one process needs nothing else. It has no network
// exposure: its client listener is a unix socket in the data directory (created
// 0700, so only its owner connects) and it listens on no peer address (a single
// member never dials one). It is given what etcd lacks by default: auto-compaction
// in revision mode keeping Config.CompactionRetention revisions (10,000), and a
// backend quota (Config.QuotaBackendBytes, 2 GiB). With Config.Endpoints the Store
// uses an external etcd cluster instead, over TLS with a client certificate, and
// several processes may share it; compaction and the quota are then that cluster's
// flags (--auto-compaction-mode=revision --auto-compaction-retention=10000
// --quota-backend-bytes=2147483648 are the embedded settings), and an etcd user
// with its password file (Config.Username, Config.PasswordFile) when the cluster
// has authentication on. Config.ListenClientURL has the embedded etcd serve a
// loopback http URL as well, for the nodes on the same machine, which open the
// store there as an external one (Store.ClientURLs says where).
//
// # Keys
//
// Every object is one key, /tiergate/v1/<kind>/<name>, whose value is the object's
// JSON. A kind is lower-case letters, digits and '-', starting with a letter (up to
// 63 bytes); a name is letters, digits, '.', '_', ':' and '-', starting with a
// letter or digit (up to 253 bytes), so neither holds a '/'. One more key,
// /tiergate/meta/v1/head, is rewritten by every write the Store makes: a checked
// change set is committed only if it has not changed since the snapshot the check
// saw, which is how a deletion by a concurrent writer (which leaves no key behind
// to compare) is caught. It is outside the object prefix: snapshots and watches do
// not see it. Its value records the write: who made it (ChangeSet.Who, the API
// token's name), when, and each object's op, kind and name ({"who","time",
// "changes":[{"op","kind","name"}]}), so the head key's own history is the
// history of the configuration's writes: Revisions lists them, newest first, and
// RevisionAt reads one.
//
// # Revisions and history
//
// An object's ModRevision is the etcd revision of its last change: it is the
// object's version for If-Match (Put, Delete, Change.IfRevision). Snapshot reads
// every object at one revision R; Watch from R+1 delivers every later change in
// order, one Batch per revision. etcd keeps the earlier revisions of an object
// until compaction drops them: History and GetAt read them until then, and return
// ErrCompacted past it; SnapshotAt reads every object at an earlier revision, and
// Diff compares two snapshots. RollbackChanges are the changes that make the
// objects now equal to those of an earlier snapshot, committed with
// ChangeSet.Since so that nothing written after the state they were computed
// from is undone unseen. DryRun checks a change set as Commit would and returns
// the snapshots before and after it, writing nothing. A watch that asks for
// compacted revisions gets the whole state instead (Batch.Reset) and goes on from
// there.
//
// # Sizes
//
// etcd refuses requests over 1.5 MiB. An object's value is refused over
// MaxValueBytes (1 MiB) and a change set over MaxChangeSetBytes or MaxChanges,
// with ErrTooLarge; large data (blacklists) is to be stored in chunks. Every
// snapshot holds every object, so bulk data belongs under a prefix of its own.
package store
