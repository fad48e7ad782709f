// Package blacklist holds the IP blacklists a risk engine pushes to l7d, one global
// and one per listener, and answers "is this client address blocked?" in well under
// a microsecond without locks. Lists hold IPv4 and IPv6 addresses and CIDR ranges,
// each optionally expiring, up to MaxEntries; they are replaced whole or changed by
// deltas, and each update is built aside and swapped in atomically.
//
// # Model
//
// A Set is a set of addresses, not a list of rules: overlapping and adjacent entries
// merge when it is built, an address covered by several entries expires with the
// latest of them (never beats any time), and removing a prefix removes every address
// in it. Entries are normalized on input: host bits of a CIDR are masked, a /32 or
// /128 is a single address, zones are dropped, IPv4-mapped IPv6 addresses and
// prefixes (::ffff:a.b.c.d) are IPv4, and lookups unmap the same way. Expiry has a
// resolution of one second: an entry expiring at T matches while the clock's Unix
// second is below T (rounded up). Expired entries stop matching at once and are
// dropped from memory by the next build (a Replace, an Apply that rebuilds, or the
// fold of a large list's overlay).
//
// # Lookup structure
//
// Each family keeps four sorted tables: single addresses and ranges, permanent or
// expiring. A table of n keys is indexed by n/16 to n/8 buckets (at most 2^18) over
// the bits that follow the keys' common prefix, each bucket recording where its keys
// start; a lookup reads one index entry and binary-searches a handful of keys. When the bucket
// fixes an IPv4 key's upper half, only the lower 16 bits are stored, so IPv4
// single addresses cost about 2.5 bytes each with the index (nginx's radix tree,
// Envoy's LC-trie and HAProxy's ebtrees spend several times that), and IPv6 ones
// 16.5. Range tables add the end address (4 or 16 bytes) and expiring ones a 4-byte
// expiry. The clock is read only when an expiring entry matches, so a lookup that
// misses, or hits a permanent entry, costs no time call and no clock goroutine is
// needed. The tables hold no pointers, so the garbage collector never scans them,
// however many entries they hold.
//
// Compared with a fixed 2^16-bucket index on the top 16 bits, the index here is
// sized to the table and placed after the common prefix, so a small list does not
// pay 256 KiB, a list confined to one /8 still spreads over its buckets, and a 10M
// list gets buckets of a few dozen keys; storing 16-bit suffixes halves the
// memory of the 4-byte array. Expiring entries live in their own tables so that
// permanent ones carry no expiry field.
//
// # Deltas on large lists
//
// A delta on a list of over 65,536 entries does not rebuild its tables: the new Set
// shares them and carries an overlay, a small Set answering for the address
// windows the deltas touched (widened to the whole entries they meet), consulted
// before the tables. A 10k delta on a 10M list is so in force in some 10 to 30 ms
// of a core (the overlay is made anew each time, so the more it holds, the longer)
// where a rebuild takes over a second. An IPv4 lookup first reads a bit of a
// 128 KiB filter of the windows (one per 4096 addresses) and searches the windows
// only when it is set. Once the overlay holds more than 1/64 of the tables (at
// least 4,096 windows and entries), the List folds it into new tables in the
// background and swaps them in, with the deltas applied meanwhile applied again on
// top; a delta that would take an overlay past a quarter of the tables rebuilds
// them at once. Len, Stats, All and WriteBinary give what a rebuild would give,
// expired entries aside.
//
// # Updates beside lookups
//
// Building a Set works on arrays several times its size (the entries collected,
// sorted and merged; for a delta, the Set in force taken apart). They are kept off
// the Go heap, in anonymous mappings handed back when the build returns (a
// Builder's when it is Reset or collected) and kept for the next build, whose
// pages are then in memory already (up to 256 MiB, unmapped after 30s unused). So
// an update allocates on the heap only the tables of the Set it makes, about 2.5
// bytes per IPv4 address where it allocated some 55 before. Heap growth is what
// starts a collection, and a collection's mark workers take the processors of the
// goroutines serving lookups for milliseconds at a time (bench-policy's update
// table shows the longest lookup beside each kind of update, the collections that
// ran meanwhile, and the same beside a busy goroutine that allocates nothing).
//
// # Text format
//
// One entry per line; '#' starts a comment that runs to the end of the line; blank
// lines are skipped; CRLF and a UTF-8 byte order mark are accepted:
//
//	# risk engine push 2026-05-01
//	203.0.113.7
//	198.51.100.0/24                          # a range
//	2001:db8::1 expires=2026-12-01T00:00:00Z  # RFC 3339, or Unix seconds
//	2001:db8:1::/48 ttl=3600s                # a Go duration or plain seconds
//
// An entry is an address or a CIDR, then at most one of expires=<time> and
// ttl=<duration>, counted from when the upload is read. A delta (ParseTextDelta)
// has the same lines prefixed by '+' to add, or '-' to remove (with no expiry):
//
//	+203.0.113.9 ttl=600
//	-198.51.100.0/24
//
// Every bad line is reported with its number, the first MaxReportedErrors of them
// in full, and the whole upload is then rejected: the list in force stays.
//
// # Binary format (version 1)
//
// For bulk pushes. Integers are big-endian; uvarint is encoding/binary's unsigned
// varint. The input may be gzip-compressed (Read and ReadBinary recognise the gzip
// magic).
//
//	header   8 bytes  magic 89 54 47 42 4c 0d 0a 1a ("\x89TGBL\r\n\x1a")
//	         2 bytes  version, 1
//	         2 bytes  flags, 0
//	sections, eight, in this order, each a uvarint record count then its records:
//	  1 IPv4 addresses   uvarint: the first address; then the gap to the previous
//	                     address minus one (addresses strictly increase)
//	  2 IPv4 ranges      uvarint start, coded as in 1 against the previous range's
//	                     end; uvarint end-start
//	  3 IPv6 addresses   16 bytes each
//	  4 IPv6 ranges      16-byte start, 16-byte end
//	  5-8                as 1-4, for expiring entries: each record followed by a
//	                     4-byte expiry in Unix seconds
//	trailer  4 bytes  CRC-32C (Castagnoli) of everything before it
//
// A reader takes the input as a stream, never holding it whole: it checks the magic,
// version and flags, every section's count against the entries allowed before
// reading its records (which are collected as they come, so a count larger than the
// records present costs nothing), every record, that no bytes follow the last
// section, and the checksum, which is the error reported when it does not match
// whatever else is wrong; it reports a *BinaryError, and keeps nothing unless all is
// good. It does not require its input to be merged or ordered beyond what the coding
// needs, so a producer may write overlapping ranges; WriteBinary writes a Set's
// merged tables.
// A million random IPv4 addresses take about 2.3 bytes each, before gzip.
//
// # Uploads
//
// What a risk engine pushes is read by an Uploader within UploadLimits: the size
// as sent, the size after decompression (binary and text each have theirs) and the
// entries, each with a default sized for 10M IPv4 entries; an upload over one is
// refused with a *LimitError naming it, and counted. Uploads are read one at a
// time; one that waits longer than UploadLimits.Wait is refused with ErrBusy.
// Files and state files, which the operator wrote, are read by Read and ReadBinary,
// bounded only by MaxInputBytes after decompression and MaxEntries.
//
// # Persistence
//
// A Store keeps Lists in step with their configured files (ListConfig) and with what
// is pushed to them: with a state directory, every push is written to
// <dir>/blacklist-<list>.bin in the binary format, atomically and synced, before it is
// in force, and a list with such a file is loaded from it instead of from its files
// until Store.Drop removes it. Store.Prepare reads what a new configuration needs
// (only what changed) without changing anything; Store.Commit swaps it in.
package blacklist
