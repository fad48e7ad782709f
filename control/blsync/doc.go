// Package blsync carries blacklists from controld to every node through the
// control plane's store (control/store's etcd): a Writer on controld's side
// stores whole lists and deltas, a Follower on each node (l7d, l4d) keeps its
// policy/blacklist Lists in step and reports the versions it enforces.
//
// # Store layout
//
// Lists are kept outside the objects' prefix (store.Prefix), so configuration
// snapshots and the agents' watches never hold them:
//
//	/tiergate/blacklists/v1/<name>/manifest              JSON, Manifest
//	/tiergate/blacklists/v1/<name>/chunks/<sha256>       one chunk of the base
//	/tiergate/blacklists/v1/<name>/deltas/<%020d version> JSON, DeltaRecord
//
// The manifest is small: {name, version, base:{version, entries, bytes,
// chunks:[{sha256, entries, bytes}]}, deltas:{from, to, bytes}, entries,
// updated, who}. A list's version goes up by one with each accepted write (a
// replace or a delta); a compaction keeps it.
//
// A base is the whole list in address order cut into chunks of the
// policy/blacklist binary format (magic, sections, CRC-32C), each under
// MaxChunkBytes (1 MiB, within etcd's 1.5 MiB request limit) and named by the
// SHA-256 of its bytes. A chunk is cut where its estimated encoding passes 900
// KiB, so a list written again unchanged, or changed in a few places, reuses the
// chunks it shares with the base before and writes only the others. A base has at
// most MaxChunks (120) chunks: the manifest's transaction compares every one.
//
// A delta is one JSON record of additions ({"p": prefix, "x": expiry in Unix
// seconds, "r": reason}) and removals (prefixes), applied removals first.
//
// # Writing
//
// Writer.Replace writes the chunks the store does not hold (each in a transaction
// of its own, as soon as it is encoded, so that the nodes receive the first while
// the others are encoded), then the manifest in a transaction that requires
// the manifest to be the one read and every chunk it names to exist, and that
// deletes the deltas the new base makes useless; so no manifest ever names a
// missing chunk, and two writers of one list cannot interleave (the second reads
// again and retries). The chunks no manifest names are deleted after, on the
// condition that the manifest is still the one just written. Writer.Delta writes
// the delta and the manifest in one transaction. A delta whose record would pass
// MaxDeltaBytes is written as a new base. Past WriterConfig.CompactDeltas (256)
// deltas or CompactBytes (16 MiB) of them, the list is compacted in the
// background: its base and deltas are written as a new base at the same version,
// and the deltas go.
//
// A replace is refused with store.ErrNoSpace when the store's space in use plus
// the new chunks would pass WriterConfig.QuotaShare (80%) of its quota (the
// chunks it wrote before it passed are deleted): at the
// quota etcd refuses every write, the configuration's too. Chunks deleted stay in
// etcd's history until its compaction (the embedded store keeps 10,000
// revisions): a replace is a write per new chunk plus one.
//
// A 10M-entry IPv4 list (random addresses, a tenth expiring) is 24 chunks of 21
// MiB in all, and takes 23.5 MiB of the store's database; writing it takes about
// 3s, reading and building it 3s (TestMeasure10M).
//
// # Following
//
// A Follower reads every manifest, then watches the lists' prefix from that
// revision. For a new manifest it fetches only what changed: the deltas after the
// version in force when the manifest still holds them (a node behind by many
// deltas folds them into one and applies that), else the base and every delta
// after it. Chunks and deltas the watch already delivered are not fetched again;
// others are read at the manifest's revision, so a replace deleting them
// meanwhile does not matter. Every chunk's SHA-256 and size are checked against
// the manifest, and its binary format and checksum by policy/blacklist: a chunk
// that fails is refused, the error kept (Follower.Errors) and logged, the list in
// force stays, and the list is tried again every 5s. The new list is built aside
// and swapped in (blacklist.List.Replace or Apply); entries expire on the node
// with no store write. Each list put in force is written to FollowerConfig.Dir
// (<name>.bl, <name>.json with its version and SHA-256) by a goroutine of its
// own, at most every 5s (the latest version; at the follower's end too), and
// loaded from there at start, so a node started while the store is out of reach
// enforces its last lists. Follower.Versions is what the node enforces,
// for control/agent's Config.Blacklists.
package blsync
